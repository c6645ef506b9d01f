//! One monotonic clock shared by all worker processes of a run. CLOCK_MONOTONIC is system-wide
//! on Linux, so start and end stamps taken in different processes on one host compare directly;
//! that is how a phase's time is "first start to last finish" across processes, as in IOR.

/// Nanoseconds on CLOCK_MONOTONIC (a vDSO call: tens of nanoseconds, cheap enough per operation).
#[inline]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-parameter; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Seconds between two [`mono_ns`] stamps.
pub fn secs(start_ns: u64, end_ns: u64) -> f64 {
    end_ns.saturating_sub(start_ns) as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_moves_forward() {
        let a = mono_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = mono_ns();
        assert!(secs(a, b) >= 0.002, "{a} {b}");
        assert_eq!(secs(b, a), 0.0);
    }
}
