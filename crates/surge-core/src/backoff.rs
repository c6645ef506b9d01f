//! How a caller tries again: the pauses between tries, and when to stop. One schedule for
//! every "the manager does not answer, try again" loop (`surge run`'s phases, `surge bb`, the
//! data mover's reports, the load generator, the client's connect), so they differ only in
//! their numbers.
//!
//! ```
//! use std::time::Duration;
//! use surge_core::backoff::Backoff;
//! let mut pauses = Backoff::new(Duration::from_secs(10), Duration::from_secs(1))
//!     .doubling_to(Duration::from_secs(4));
//! assert_eq!(pauses.next(), Some(Duration::from_secs(1)));
//! assert_eq!(pauses.next(), Some(Duration::from_secs(2)));
//! assert_eq!(pauses.next(), Some(Duration::from_secs(4)));
//! assert_eq!(pauses.next(), Some(Duration::from_secs(4)));
//! ```

use std::time::{Duration, Instant};

/// The pauses before each next try (an iterator): `first`, then doubling up to a cap when
/// asked ([`Backoff::doubling_to`]); it ends when the pause would take the caller past `total`
/// from the moment it was made, so the caller gives up with its last error then.
#[derive(Debug, Clone)]
pub struct Backoff {
    until: Instant,
    pause: Duration,
    max: Duration,
}

impl Backoff {
    /// Tries for `total` from now, `every` apart.
    pub fn new(total: Duration, every: Duration) -> Backoff {
        Backoff {
            until: Instant::now() + total,
            pause: every,
            max: every,
        }
    }

    /// Each pause twice the one before, up to `max`.
    pub fn doubling_to(mut self, max: Duration) -> Backoff {
        self.max = max.max(self.pause);
        self
    }

    /// The pause the next try would wait, without taking it (to say it before waiting).
    pub fn peek(&self) -> Option<Duration> {
        (Instant::now() + self.pause <= self.until).then_some(self.pause)
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let p = self.peek()?;
        if self.max > self.pause {
            self.pause = (self.pause * 2).min(self.max);
        }
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_stop_where_the_time_would_run_out() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(30));
        // 30 ms pauses fit while now + 30 ms is within 100 ms of the start; nothing sleeps
        // here, so all of them do until the clock is consulted past the end.
        let n = b.take(10).count();
        assert_eq!(n, 10, "the schedule is by the clock, not a count");
        let mut late = Backoff::new(Duration::from_millis(10), Duration::from_millis(30));
        assert_eq!(
            late.next(),
            None,
            "a pause longer than the time left is not taken"
        );
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(20));
        assert_eq!(b.next(), Some(Duration::from_millis(20)));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.next(), None, "40 ms gone, 20 more would pass the 50 ms");
    }

    #[test]
    fn doubling_stops_at_its_cap() {
        let b = Backoff::new(Duration::from_secs(60), Duration::from_millis(100))
            .doubling_to(Duration::from_millis(500));
        let got: Vec<u128> = b.take(5).map(|d| d.as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 500, 500]);
        let flat = Backoff::new(Duration::from_secs(60), Duration::from_millis(100))
            .doubling_to(Duration::from_millis(10));
        let got: Vec<u128> = flat.take(3).map(|d| d.as_millis()).collect();
        assert_eq!(
            got,
            [100, 100, 100],
            "a cap below the first pause keeps it flat"
        );
    }
}
