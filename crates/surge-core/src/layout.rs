//! How a file's bytes map onto an instance's fragments (DESIGN §3).
//!
//! A file is cut into `stripe_size` stripes placed round-robin over `stripe_count` fragments,
//! starting at fragment `start` (chosen by hashing the file id, so small files spread). On a
//! fragment, all of one file's stripes live in one object at packed offsets: the file's stripe `k`
//! sits on fragment `(start + k) % stripe_count` at object offset `(k / stripe_count) * stripe_size`.
//! With one fragment the object is the file, byte for byte.

use crate::ids::FileId;
use serde::{Deserialize, Serialize};

/// Name of a file's object inside a fragment directory (shared by the server, which stores it,
/// and by a client on the same host, which opens it for kernel passthrough).
pub fn object_name(file: FileId) -> String {
    format!("{}-{}", file.ns.0, file.ino)
}

/// DataWarp's stripe size, and Surge's default.
pub const DEFAULT_STRIPE_SIZE: u64 = 8 << 20;

/// The layout of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub stripe_size: u64,
    pub stripe_count: u32,
    /// Fragment index (0..stripe_count) holding stripe 0.
    pub start: u32,
}

/// One contiguous piece of an I/O request that lands in a single object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Fragment index within the instance's fragment list.
    pub fragment: u32,
    /// Offset inside that fragment's object for the file.
    pub object_offset: u64,
    /// Offset of this piece inside the caller's buffer.
    pub buf_offset: u64,
    pub len: u64,
}

impl Layout {
    /// The layout of `file` in an instance with `stripe_count` fragments.
    ///
    /// # Panics
    /// If `stripe_size` or `stripe_count` is zero; instances are validated when created.
    pub fn for_file(file: FileId, stripe_size: u64, stripe_count: u32) -> Layout {
        assert!(stripe_size > 0 && stripe_count > 0, "empty layout");
        let start = (file.placement_hash() % u64::from(stripe_count)) as u32;
        Layout {
            stripe_size,
            stripe_count,
            start,
        }
    }

    /// Fragment index holding the file's stripe `k`.
    pub fn fragment_of_stripe(&self, k: u64) -> u32 {
        ((u64::from(self.start) + k) % u64::from(self.stripe_count)) as u32
    }

    /// Splits the byte range `[offset, offset + len)` of the file into per-object pieces, in file
    /// order. Adjacent pieces that are contiguous in the same object are merged (which only
    /// happens with one fragment).
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        let ss = self.stripe_size;
        let count = u64::from(self.stripe_count);
        let mut pos = offset;
        let end = offset.saturating_add(len);
        while pos < end {
            let k = pos / ss;
            let within = pos % ss;
            let take = (ss - within).min(end - pos);
            let piece = Piece {
                fragment: self.fragment_of_stripe(k),
                object_offset: (k / count) * ss + within,
                buf_offset: pos - offset,
                len: take,
            };
            match out.last_mut() {
                Some(last)
                    if last.fragment == piece.fragment
                        && last.object_offset + last.len == piece.object_offset =>
                {
                    last.len += take
                }
                _ => out.push(piece),
            }
            pos += take;
        }
        out
    }

    /// Length of the object on fragment `fragment` when the file is `file_size` bytes long: what
    /// a truncate leaves on each fragment.
    pub fn object_len(&self, fragment: u32, file_size: u64) -> u64 {
        let ss = self.stripe_size;
        let count = u64::from(self.stripe_count);
        // Index of the first stripe that lives on this fragment.
        let first = (u64::from(fragment) + count - u64::from(self.start)) % count;
        let full = file_size / ss;
        let rem = file_size % ss;
        let complete_here = if full > first {
            (full - first).div_ceil(count)
        } else {
            0
        };
        let partial_here = rem > 0 && full % count == first;
        complete_here * ss + if partial_here { rem } else { 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NamespaceId;
    use proptest::prelude::*;

    fn layout(ss: u64, count: u32, start: u32) -> Layout {
        Layout {
            stripe_size: ss,
            stripe_count: count,
            start,
        }
    }

    #[test]
    fn one_fragment_is_identity() {
        let l = layout(8, 1, 0);
        assert_eq!(
            l.pieces(5, 30),
            vec![Piece {
                fragment: 0,
                object_offset: 5,
                buf_offset: 0,
                len: 30
            }]
        );
        assert_eq!(l.object_len(0, 37), 37);
    }

    #[test]
    fn round_robin_from_start() {
        let l = layout(10, 3, 2);
        let p = l.pieces(5, 30);
        let frags: Vec<u32> = p.iter().map(|p| p.fragment).collect();
        assert_eq!(frags, vec![2, 0, 1, 2]);
        assert_eq!(p[0].object_offset, 5);
        assert_eq!(p[1].object_offset, 0);
        assert_eq!(p[3].object_offset, 10);
        assert_eq!(p[3].len, 5);
    }

    #[test]
    fn placement_spreads_small_files() {
        let mut seen = [0u32; 4];
        for ino in 1..1000 {
            let l = Layout::for_file(
                FileId {
                    ns: NamespaceId(0),
                    ino,
                },
                DEFAULT_STRIPE_SIZE,
                4,
            );
            seen[l.start as usize] += 1;
        }
        for s in seen {
            assert!(s > 150, "start fragments unbalanced: {seen:?}");
        }
    }

    proptest! {
        /// Every byte of a range maps to exactly one (fragment, object offset), the same one the
        /// byte-at-a-time definition gives, and pieces cover the buffer in order.
        #[test]
        fn pieces_match_bytewise_definition(ss in 1u64..20, count in 1u32..5, start_seed in 0u32..5,
                                            offset in 0u64..200, len in 0u64..200) {
            let l = layout(ss, count, start_seed % count);
            let mut expect = Vec::new();
            for b in offset..offset + len {
                let k = b / ss;
                expect.push((l.fragment_of_stripe(k), (k / u64::from(count)) * ss + b % ss));
            }
            let mut got = Vec::new();
            let mut next_buf = 0;
            for p in l.pieces(offset, len) {
                prop_assert_eq!(p.buf_offset, next_buf);
                next_buf += p.len;
                for i in 0..p.len {
                    got.push((p.fragment, p.object_offset + i));
                }
            }
            prop_assert_eq!(got, expect);
        }

        /// object_len is the end of the last byte of the file stored on each fragment.
        #[test]
        fn object_len_matches_bytewise(ss in 1u64..20, count in 1u32..5, start_seed in 0u32..5,
                                       size in 0u64..300) {
            let l = layout(ss, count, start_seed % count);
            let mut ends = vec![0u64; count as usize];
            for b in 0..size {
                let k = b / ss;
                let f = l.fragment_of_stripe(k) as usize;
                ends[f] = ends[f].max((k / u64::from(count)) * ss + b % ss + 1);
            }
            for f in 0..count {
                prop_assert_eq!(l.object_len(f, size), ends[f as usize], "fragment {}", f);
            }
        }
    }
}
