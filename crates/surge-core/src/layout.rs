//! How a file's bytes map onto an instance's fragments (DESIGN §3).
//!
//! A file is cut into `stripe_size` stripes placed round-robin over `stripe_count` of the
//! instance's `fragments`, the consecutive ones from fragment `start` on (wrapping): the file's
//! stripe `k` sits on fragment `(start + k % stripe_count) % fragments` at object offset
//! `(k / stripe_count) * stripe_size`. On a fragment, all of one file's stripes live in one
//! object at packed offsets. With one stripe per file (stripe count 1) the object *is* the
//! file, byte for byte, which is what makes kernel passthrough possible.
//!
//! Each file's layout is chosen when it is made and kept by the metadata server with its other
//! attributes ([`FileLayout`]): Lustre's `lfs setstripe` per file or per directory (a
//! directory's layout is the default of what is made in it). A file made without one, and
//! every file made before layouts existed, has the instance's rule: every fragment, the
//! instance's stripe size, the first stripe on a fragment chosen by hashing the file id (so
//! small files spread).

use crate::ids::FileId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Name of a file's object inside a fragment directory (shared by the server, which stores it,
/// and by a client on the same host, which opens it for kernel passthrough).
pub fn object_name(file: FileId) -> String {
    format!("{}-{}", file.ns.0, file.ino)
}

/// DataWarp's stripe size, and Surge's default.
pub const DEFAULT_STRIPE_SIZE: u64 = 8 << 20;

/// Smallest stripe size a layout may ask for (one page: objects are written in pages).
pub const MIN_STRIPE_SIZE: u64 = 4 << 10;
/// Largest stripe size a layout may ask for.
pub const MAX_STRIPE_SIZE: u64 = 4 << 30;

/// A `stripe_count` asking for every fragment of the instance (Lustre's `-c -1`), whatever
/// their number.
pub const STRIPE_ALL: u32 = u32::MAX;

/// A file's `start` when no fragment was asked for: its first stripe goes where the instance's
/// rule puts it (by hashing the file id).
pub const START_ANY: u32 = u32::MAX;

/// The layout a file or directory records (its attribute `user.surge.layout`; Lustre's
/// `lfs setstripe`). Zeros mean "not chosen": `stripe_size` 0 is the instance's stripe size,
/// `stripe_count` 0 is the mount's choice for a new file (one stripe on a fragment of its own
/// host when it can use it directly, see `surge-client`'s passthrough; every fragment
/// otherwise), [`STRIPE_ALL`] every fragment. For a file, `start` is the fragment holding its
/// first stripe when `stripe_count` is set, or [`START_ANY`] (where the instance's rule puts
/// it, by hashing the file id; so is every file with `stripe_count` 0). For a directory it is
/// the default of files and directories made in it, `start` unused (each file's start is
/// chosen when it is made). All zero: nothing chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileLayout {
    pub stripe_size: u64,
    pub stripe_count: u32,
    pub start: u32,
}

/// A layout that cannot be used, with the value at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot read layout {0:?}: {1}")]
    Parse(String, String),
    #[error("stripe size {0} is not a multiple of 4 KiB between 4 KiB and 4 GiB")]
    StripeSize(u64),
    #[error("stripe count {count} is more than the instance's {fragments} fragments")]
    StripeCount { count: u32, fragments: u32 },
    #[error("start fragment {start} is not one of the instance's {fragments} fragments")]
    Start { start: u32, fragments: u32 },
}

impl FileLayout {
    /// Nothing chosen: the instance's rule.
    pub fn is_unset(&self) -> bool {
        *self == FileLayout::default()
    }

    /// What a file made in a directory with this default records: its stripe size and count,
    /// its start left to the instance's rule.
    pub fn for_child_file(&self) -> FileLayout {
        FileLayout {
            stripe_size: self.stripe_size,
            stripe_count: self.stripe_count,
            start: if self.stripe_count == 0 { 0 } else { START_ANY },
        }
    }

    /// What a directory's default becomes when it is set (its `start` means nothing).
    pub fn as_default(&self) -> FileLayout {
        FileLayout { start: 0, ..*self }
    }

    /// Checks the values a user or a peer asks for against an instance of `fragments`
    /// fragments (`start` only matters for files with a stripe count).
    pub fn check(&self, fragments: u32) -> Result<(), LayoutError> {
        if self.stripe_size != 0
            && (!self.stripe_size.is_multiple_of(MIN_STRIPE_SIZE)
                || !(MIN_STRIPE_SIZE..=MAX_STRIPE_SIZE).contains(&self.stripe_size))
        {
            return Err(LayoutError::StripeSize(self.stripe_size));
        }
        if self.stripe_count != STRIPE_ALL && self.stripe_count > fragments {
            return Err(LayoutError::StripeCount {
                count: self.stripe_count,
                fragments,
            });
        }
        if self.stripe_count != 0 && self.start != START_ANY && self.start >= fragments {
            return Err(LayoutError::Start {
                start: self.start,
                fragments,
            });
        }
        Ok(())
    }

    /// Parses what `surge layout set` and `setfattr -n user.surge.layout -v ...` give:
    /// space- or comma-separated `stripe_size=SIZE` (units as everywhere: `1MiB`, `8M`),
    /// `stripe_count=N` (`-1` or `all`: every fragment) and, for a file, `start=K`. Keys not
    /// given stay at zero (the instance's). Lustre's short names `size`, `count` are taken too.
    pub fn parse(text: &str) -> Result<FileLayout, LayoutError> {
        let bad = |why: String| LayoutError::Parse(text.to_string(), why);
        let mut l = FileLayout::default();
        let mut any = false;
        let mut start_given = false;
        for item in text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("'{item}' is not KEY=VALUE")))?;
            match k {
                "stripe_size" | "size" => {
                    l.stripe_size =
                        crate::units::parse_size(v).map_err(|e| bad(format!("stripe_size: {e}")))?
                }
                "stripe_count" | "count" => {
                    l.stripe_count = match v {
                        "-1" | "all" => STRIPE_ALL,
                        "0" | "default" => 0,
                        n => n.parse().map_err(|_| {
                            bad(format!(
                                "stripe_count '{n}' is not a number (or -1 for all)"
                            ))
                        })?,
                    }
                }
                "start" => {
                    start_given = true;
                    l.start = match v {
                        "any" | "-1" => START_ANY,
                        n => n
                            .parse()
                            .map_err(|_| bad(format!("start '{n}' is not a fragment number")))?,
                    }
                }
                // What `get` prints beside the layout: read back as it was given.
                "fragments" => {}
                other => {
                    return Err(bad(format!(
                        "unknown key '{other}' (stripe_size, stripe_count, start)"
                    )))
                }
            }
            any = true;
        }
        if !any {
            return Err(bad("empty (give stripe_size=..., stripe_count=...)".into()));
        }
        if l.stripe_count == 0 {
            l.start = 0;
        } else if !start_given {
            l.start = START_ANY;
        }
        Ok(l)
    }
}

impl fmt::Display for FileLayout {
    /// The form [`FileLayout::parse`] reads: `stripe_size=8388608 stripe_count=4 start=1`
    /// (zeros: not chosen; `stripe_count=all`: every fragment).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stripe_size={} stripe_count=", self.stripe_size)?;
        match self.stripe_count {
            STRIPE_ALL => write!(f, "all")?,
            n => write!(f, "{n}")?,
        }
        if self.stripe_count != 0 && self.start != START_ANY {
            write!(f, " start={}", self.start)?;
        }
        Ok(())
    }
}

/// The layout of one file, resolved against its instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub stripe_size: u64,
    /// Fragments the file's stripes go to (1..=fragments).
    pub stripe_count: u32,
    /// Fragment index (0..fragments) holding stripe 0.
    pub start: u32,
    /// The instance's fragments.
    pub fragments: u32,
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
    /// The instance's rule for `file` in an instance with `fragments` fragments: every
    /// fragment, first stripe on a fragment chosen by hashing the file id.
    ///
    /// # Panics
    /// If `stripe_size` or `fragments` is zero; instances are validated when created.
    pub fn for_file(file: FileId, stripe_size: u64, fragments: u32) -> Layout {
        assert!(stripe_size > 0 && fragments > 0, "empty layout");
        let start = (file.placement_hash() % u64::from(fragments)) as u32;
        Layout {
            stripe_size,
            stripe_count: fragments,
            start,
            fragments,
        }
    }

    /// The layout of `file` as recorded (`recorded`, zeros for the instance's) in an instance
    /// of `fragments` fragments and stripe size `stripe_size`. A recorded layout that does not
    /// fit the instance (a damaged store) falls back to the instance's rule for the values at
    /// fault rather than address a fragment that does not exist.
    pub fn resolve(recorded: FileLayout, file: FileId, stripe_size: u64, fragments: u32) -> Layout {
        let mut l = Layout::for_file(file, stripe_size, fragments);
        if recorded.stripe_size != 0 && recorded.check(fragments).is_ok() {
            l.stripe_size = recorded.stripe_size;
        }
        let count = match recorded.stripe_count {
            0 => None,
            STRIPE_ALL => Some(fragments),
            c => Some(c).filter(|c| *c <= fragments),
        };
        if let Some(c) = count {
            l.stripe_count = c;
            if recorded.start < fragments {
                l.start = recorded.start;
            }
        }
        l
    }

    /// Whether the file's bytes all lie in one object (on fragment `start`), byte for byte.
    pub fn single_object(&self) -> bool {
        self.stripe_count == 1
    }

    /// Fragment index holding the file's stripe `k`.
    pub fn fragment_of_stripe(&self, k: u64) -> u32 {
        ((u64::from(self.start) + k % u64::from(self.stripe_count)) % u64::from(self.fragments))
            as u32
    }

    /// The fragments holding the file's stripes, in stripe order.
    pub fn fragments_used(&self) -> impl Iterator<Item = u32> + '_ {
        (0..u64::from(self.stripe_count)).map(|k| self.fragment_of_stripe(k))
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

    /// The index of the first of the file's stripes that lives on `fragment` (its stripes
    /// there are this one and every `stripe_count`-th after it); `None`: the file has no
    /// stripe there.
    fn first_stripe_on(&self, fragment: u32) -> Option<u64> {
        let n = u64::from(self.fragments);
        let first = (u64::from(fragment) % n + n - u64::from(self.start) % n) % n;
        (first < u64::from(self.stripe_count)).then_some(first)
    }

    /// Where in `fragment`'s object the first byte of the file at or after `file_offset` that
    /// this fragment holds lies (the objects pack their stripes in file order, so everything
    /// the fragment holds from there on follows it in the object); `None` when the file has
    /// no stripe on `fragment`.
    pub fn object_offset_from(&self, fragment: u32, file_offset: u64) -> Option<u64> {
        let first = self.first_stripe_on(fragment)?;
        let ss = self.stripe_size;
        let count = u64::from(self.stripe_count);
        let k = file_offset / ss;
        let here = k % count;
        if here == first {
            return Some((k / count) * ss + file_offset % ss);
        }
        // The next stripe of the file on this fragment starts its part from there.
        let next = k - here + first + if first < here { count } else { 0 };
        Some((next / count) * ss)
    }

    /// The file offset of byte `object_offset` of `fragment`'s object (the inverse of
    /// [`pieces`](Self::pieces)); `None` when the file has no stripe on `fragment`.
    pub fn file_offset_of(&self, fragment: u32, object_offset: u64) -> Option<u64> {
        let first = self.first_stripe_on(fragment)?;
        let ss = self.stripe_size;
        let k = (object_offset / ss) * u64::from(self.stripe_count) + first;
        Some(k.saturating_mul(ss).saturating_add(object_offset % ss))
    }

    /// Length of the object on fragment `fragment` when the file is `file_size` bytes long: what
    /// a truncate leaves on each fragment.
    pub fn object_len(&self, fragment: u32, file_size: u64) -> u64 {
        let ss = self.stripe_size;
        let count = u64::from(self.stripe_count);
        let n = u64::from(self.fragments);
        // Index of the first stripe that lives on this fragment (none: the file has nothing
        // there).
        let first = (u64::from(fragment) % n + n - u64::from(self.start) % n) % n;
        if first >= count {
            return 0;
        }
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
            fragments: count,
        }
    }

    fn fid(ino: u64) -> FileId {
        FileId {
            ns: NamespaceId(0),
            ino,
        }
    }

    #[test]
    fn fewer_stripes_than_fragments_use_consecutive_fragments_from_start() {
        let l = Layout {
            stripe_size: 10,
            stripe_count: 2,
            start: 3,
            fragments: 4,
        };
        let frags: Vec<u32> = l.pieces(0, 45).iter().map(|p| p.fragment).collect();
        assert_eq!(frags, vec![3, 0, 3, 0, 3]);
        assert_eq!(l.fragments_used().collect::<Vec<_>>(), vec![3, 0]);
        assert_eq!(l.object_len(1, 45), 0);
        assert_eq!(l.object_len(2, 45), 0);
        assert_eq!(l.object_len(3, 45), 25);
        assert_eq!(l.object_len(0, 45), 20);
    }

    #[test]
    fn one_stripe_is_the_file_byte_for_byte_on_its_fragment() {
        let l = Layout::resolve(
            FileLayout {
                stripe_size: 0,
                stripe_count: 1,
                start: 5,
            },
            fid(7),
            DEFAULT_STRIPE_SIZE,
            8,
        );
        assert!(l.single_object());
        assert_eq!(
            l.pieces(3 << 20, 20 << 20),
            vec![Piece {
                fragment: 5,
                object_offset: 3 << 20,
                buf_offset: 0,
                len: 20 << 20
            }]
        );
        assert_eq!(l.object_len(5, 99 << 20), 99 << 20);
        assert_eq!(l.object_len(4, 99 << 20), 0);
    }

    #[test]
    fn an_unset_layout_resolves_to_the_instance_rule() {
        for ino in 1..50 {
            assert_eq!(
                Layout::resolve(FileLayout::default(), fid(ino), 1 << 20, 6),
                Layout::for_file(fid(ino), 1 << 20, 6)
            );
        }
        // A damaged record never addresses a fragment the instance does not have.
        let l = Layout::resolve(
            FileLayout {
                stripe_size: 3,
                stripe_count: 9,
                start: 40,
            },
            fid(1),
            1 << 20,
            6,
        );
        assert_eq!((l.stripe_size, l.stripe_count), (1 << 20, 6));
    }

    #[test]
    fn layouts_read_back_what_they_print_and_name_the_value_at_fault() {
        assert_eq!(
            FileLayout::parse("stripe_count=1").unwrap().start,
            START_ANY,
            "no start given: the instance's rule spreads the files"
        );
        let l = FileLayout::parse("stripe_size=1MiB, stripe_count=2 start=1").unwrap();
        assert_eq!(
            l,
            FileLayout {
                stripe_size: 1 << 20,
                stripe_count: 2,
                start: 1
            }
        );
        assert_eq!(FileLayout::parse(&l.to_string()).unwrap(), l);
        assert_eq!(
            FileLayout::parse("count=-1").unwrap().stripe_count,
            STRIPE_ALL
        );
        assert_eq!(
            FileLayout::parse("count=all").unwrap().to_string(),
            "stripe_size=0 stripe_count=all"
        );
        assert_eq!(FileLayout::parse("count=0").unwrap(), FileLayout::default());
        let all = FileLayout::parse("count=all").unwrap();
        assert_eq!(
            Layout::resolve(all.for_child_file(), fid(3), 1 << 20, 6),
            Layout::for_file(fid(3), 1 << 20, 6)
        );
        assert_eq!(FileLayout::parse("size=64K").unwrap().stripe_size, 64 << 10);
        let e = FileLayout::parse("stripe_cuont=2").unwrap_err().to_string();
        assert!(e.contains("stripe_cuont"), "{e}");
        let e = FileLayout::parse("stripe_count=two")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'two'"), "{e}");
        assert!(FileLayout::parse("").is_err());
        let big = FileLayout {
            stripe_count: 5,
            ..Default::default()
        };
        assert_eq!(
            big.check(4),
            Err(LayoutError::StripeCount {
                count: 5,
                fragments: 4
            })
        );
        let odd = FileLayout {
            stripe_size: 1000,
            ..Default::default()
        };
        assert!(odd.check(4).unwrap_err().to_string().contains("1000"));
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
        fn pieces_match_bytewise_definition(ss in 1u64..20, count in 1u32..5, extra in 0u32..3,
                                            start_seed in 0u32..8,
                                            offset in 0u64..200, len in 0u64..200) {
            let n = count + extra;
            let l = Layout { fragments: n, start: start_seed % n, ..layout(ss, count, 0) };
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
        fn object_len_matches_bytewise(ss in 1u64..20, count in 1u32..5, extra in 0u32..3,
                                       start_seed in 0u32..8, size in 0u64..300) {
            let n = count + extra;
            let l = Layout { fragments: n, start: start_seed % n, ..layout(ss, count, 0) };
            let mut ends = vec![0u64; n as usize];
            for b in 0..size {
                let k = b / ss;
                let f = l.fragment_of_stripe(k) as usize;
                ends[f] = ends[f].max((k / u64::from(count)) * ss + b % ss + 1);
            }
            for f in 0..n {
                prop_assert_eq!(l.object_len(f, size), ends[f as usize], "fragment {}", f);
            }
        }

        /// object_offset_from is where the fragment's first byte at or after the offset lies
        /// in its object, and file_offset_of maps every object byte back to its file byte.
        #[test]
        fn object_and_file_offsets_match_bytewise(ss in 1u64..20, count in 1u32..5,
                                                  extra in 0u32..3, start_seed in 0u32..8,
                                                  offset in 0u64..300) {
            let n = count + extra;
            let l = Layout { fragments: n, start: start_seed % n, ..layout(ss, count, 0) };
            for f in 0..n {
                let mut expect = None;
                for b in offset..offset + ss * u64::from(count) + 1 {
                    let k = b / ss;
                    if l.fragment_of_stripe(k) == f {
                        expect = Some((k / u64::from(count)) * ss + b % ss);
                        break;
                    }
                }
                prop_assert_eq!(l.object_offset_from(f, offset), expect, "fragment {}", f);
            }
            for p in l.pieces(offset, 100) {
                for i in 0..p.len {
                    prop_assert_eq!(l.file_offset_of(p.fragment, p.object_offset + i),
                                    Some(offset + p.buf_offset + i));
                }
            }
        }
    }
}
