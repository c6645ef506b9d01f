//! The control plane's bounds, stated once (TigerBeetle's `constants.zig` is the model): what no
//! request, name or history may exceed, so that nothing a caller sends makes the manager
//! allocate without limit (issues 30 and 31). The data path's bounds live beside its frames
//! (`surge_proto::frame`).

/// Compute nodes one job (or one private instance) may name: a private or ldbalance instance
/// has one namespace per node, each a metadata service. Larger than any machine Surge targets
/// (10,000-node centres), small enough that a vector per node is harmless.
pub const MAX_JOB_NODES: u32 = 1 << 17;

/// Fragments one instance may have: 2^20 of the smallest sensible granularity (1 MiB) is a
/// TiB; of a DataWarp-like 200 GiB, 200 PiB.
pub const MAX_INSTANCE_FRAGMENTS: u64 = 1 << 20;

/// Bytes of a job's name as the manager keeps it (longer names are cut, with a mark).
pub const MAX_JOB_NAME: usize = 256;

/// Bytes of a workload manager's job id (`slurm:1234`).
pub const MAX_EXTERNAL_ID: usize = 128;

/// Hosts one session may list.
pub const MAX_SESSION_HOSTS: usize = MAX_JOB_NODES as usize;

/// Persistent instances one session may attach.
pub const MAX_ATTACHED: usize = 64;

const _: () = assert!(MAX_JOB_NODES as u64 <= MAX_INSTANCE_FRAGMENTS);
const _: () = assert!(MAX_EXTERNAL_ID <= MAX_JOB_NAME);

/// `s` cut to at most `max` bytes at a character boundary, with "…" added when cut.
pub fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mark = "…";
    let mut end = max.saturating_sub(mark.len());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_is_cut_at_a_char_boundary() {
        assert_eq!(bounded("job", 8), "job");
        let cut = bounded(&"é".repeat(100), 11);
        assert!(cut.len() <= 11, "{cut}");
        assert!(cut.ends_with('…'));
        assert_eq!(
            bounded(&"x".repeat(4 << 20), MAX_JOB_NAME).len(),
            MAX_JOB_NAME
        );
    }
}
