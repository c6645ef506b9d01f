//! Where each transfer of an IOR-style run goes: file names, offsets and orders, as pure
//! functions of the parameters, so tests can pin them and the reader of another process's data
//! (IOR `-C`) can recompute exactly what the writer did.
//!
//! IOR's arithmetic (its `GetOffsetArraySequential`): the data of process `r` is `segments`
//! blocks of `block` bytes, each cut into `block / transfer` transfers. With a file per process,
//! segment `s` of `r` sits at `s * block` in `r`'s own file; with a shared file it sits at
//! `(s * procs + r) * block`, so segments interleave process by process. `--random` visits the
//! same transfers in a shuffled order (each exactly once, like fio's random map).

use crate::ior::IoParams;

/// A fast, well-mixed 64-bit generator step (SplitMix64); deterministic across processes.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded Fisher-Yates permutation of `0..n`.
pub fn permutation(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    let mut state = seed;
    for i in (1..v.len()).rev() {
        state = splitmix64(state);
        // Multiply-shift maps the 64-bit draw onto 0..=i without modulo bias worth noticing.
        let j = ((u128::from(state) * (i as u128 + 1)) >> 64) as usize;
        v.swap(i, j);
    }
    v
}

/// The file holding process `owner`'s data, relative to the repetition directory.
pub fn file_name(params: &IoParams, owner: u32) -> String {
    if params.shared_file {
        "data.shared".to_string()
    } else {
        format!("data.{owner:05}")
    }
}

/// Offset of the `index`-th transfer (in sequential order) of `owner`'s data.
pub fn offset(params: &IoParams, owner: u32, index: u64) -> u64 {
    let per_block = params.transfers_per_block();
    let segment = index / per_block;
    let within = (index % per_block) * params.transfer;
    if params.shared_file {
        (segment * u64::from(params.procs) + u64::from(owner)) * params.block + within
    } else {
        segment * params.block + within
    }
}

/// The process whose data `rank` reads back: the next one with `-C` reordering, so the reader is
/// never the writer (on one host the kernel page cache is shared anyway; `--drop-cache` or
/// `--direct` handle that).
pub fn read_owner(params: &IoParams, rank: u32) -> u32 {
    if params.reorder && params.procs > 1 {
        (rank + 1) % params.procs
    } else {
        rank
    }
}

/// The order in which `owner`'s transfers are issued, written and read alike.
pub enum TransferOrder {
    Sequential,
    Shuffled(Vec<u64>),
}

impl TransferOrder {
    pub fn for_owner(params: &IoParams, owner: u32) -> TransferOrder {
        if params.random {
            let seed = params.seed ^ splitmix64(u64::from(owner) + 1);
            TransferOrder::Shuffled(permutation(params.transfers_per_rank(), seed))
        } else {
            TransferOrder::Sequential
        }
    }

    /// The sequential index of the `i`-th transfer issued.
    #[inline]
    pub fn index(&self, i: u64) -> u64 {
        match self {
            TransferOrder::Sequential => i,
            TransferOrder::Shuffled(p) => p[i as usize],
        }
    }
}

/// Every offset `owner` touches, in issue order (tests and the layout report use it).
pub fn offsets_in_order(params: &IoParams, owner: u32) -> Vec<u64> {
    let order = TransferOrder::for_owner(params, owner);
    (0..params.transfers_per_rank())
        .map(|i| offset(params, owner, order.index(i)))
        .collect()
}

/// The stamp written in the first 8 bytes of every transfer: who wrote it (the next 8 bytes hold
/// the offset), so `--verify` can prove the read phase read another process's data.
pub fn stamp_word(owner: u32) -> u64 {
    0x5355_5247_0000_0000 | u64::from(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(shared: bool) -> IoParams {
        IoParams {
            transfer: 4,
            block: 12,
            segments: 2,
            procs: 3,
            shared_file: shared,
            ..IoParams::default()
        }
    }

    #[test]
    fn file_per_process_offsets_are_contiguous_in_each_file() {
        let p = params(false);
        for owner in 0..3 {
            assert_eq!(offsets_in_order(&p, owner), vec![0, 4, 8, 12, 16, 20]);
            assert_eq!(file_name(&p, owner), format!("data.0000{owner}"));
        }
    }

    #[test]
    fn shared_file_interleaves_blocks_by_segment_then_process() {
        let p = params(true);
        // Segment 0: proc 0 at 0..12, proc 1 at 12..24, proc 2 at 24..36; segment 1 from 36.
        assert_eq!(offsets_in_order(&p, 0), vec![0, 4, 8, 36, 40, 44]);
        assert_eq!(offsets_in_order(&p, 1), vec![12, 16, 20, 48, 52, 56]);
        assert_eq!(offsets_in_order(&p, 2), vec![24, 28, 32, 60, 64, 68]);
        assert_eq!(file_name(&p, 2), "data.shared");
    }

    #[test]
    fn shared_file_offsets_tile_the_file_exactly_once() {
        let p = IoParams {
            transfer: 4096,
            block: 4096 * 5,
            segments: 3,
            procs: 4,
            shared_file: true,
            random: true,
            ..IoParams::default()
        };
        let mut all: Vec<u64> = (0..4).flat_map(|o| offsets_in_order(&p, o)).collect();
        all.sort_unstable();
        let expect: Vec<u64> = (0..p.aggregate_bytes() / 4096).map(|i| i * 4096).collect();
        assert_eq!(all, expect);
    }

    #[test]
    fn random_order_visits_each_transfer_once_and_is_reproducible() {
        let p = IoParams {
            random: true,
            ..params(false)
        };
        let a = offsets_in_order(&p, 1);
        assert_eq!(
            a,
            offsets_in_order(&p, 1),
            "the reader must recompute the writer's order"
        );
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 4, 8, 12, 16, 20]);
        let big = IoParams {
            random: true,
            transfer: 1,
            block: 1000,
            segments: 1,
            procs: 1,
            ..IoParams::default()
        };
        let order = offsets_in_order(&big, 0);
        assert_ne!(order, (0..1000).collect::<Vec<_>>(), "not shuffled");
    }

    #[test]
    fn reorder_reads_the_next_process_data() {
        let mut p = params(false);
        p.reorder = true;
        assert_eq!(
            (0..3).map(|r| read_owner(&p, r)).collect::<Vec<_>>(),
            [1, 2, 0]
        );
        p.reorder = false;
        assert_eq!(
            (0..3).map(|r| read_owner(&p, r)).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        p.reorder = true;
        p.procs = 1;
        assert_eq!(read_owner(&p, 0), 0);
    }

    #[test]
    fn permutation_is_a_permutation() {
        let mut v = permutation(1000, 42);
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
        assert!(permutation(0, 1).is_empty());
    }
}
