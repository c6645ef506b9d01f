//! The order in which a session's requests were dispatched.
//!
//! The kernel numbers requests (`unique`, in steps of two) in the order it queues them, and
//! several threads (or io_uring queues) take them: a request queued after another may reach
//! its handler first. Some answers depend on an earlier request's effect even so: the kernel
//! sends `FUSE_RELEASE` (the last close of an open file, which releases its OFD and flock
//! locks) after `close(2)` has returned, and a `F_OFD_GETLK` made right after that close must
//! not see the lock. A handler can wait here until every request numbered before its own has
//! been dispatched (its handler returned), so that what those did synchronously is done.

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The kernel's step between two requests' numbers (`FUSE_REQ_ID_STEP`); an odd number is an
/// interrupt (`FUSE_INT_REQ_BIT`), which carries the number of the request it interrupts.
const STEP: u64 = 2;

/// How many requests may be dispatched ahead of one not seen: past this, the missing one is
/// taken as never coming (see [`DispatchOrder::wait_before`]).
const MAX_AHEAD: usize = 4096;

/// Which requests of a session have been dispatched.
#[derive(Debug, Default)]
pub struct DispatchOrder {
    state: Mutex<State>,
    moved: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// The lowest number not dispatched yet: all below it were (0: none seen).
    next: u64,
    /// Numbers at or above `next` dispatched already.
    ahead: BTreeSet<u64>,
}

impl State {
    /// Moves `next` past the numbers dispatched; whether it moved.
    fn advance(&mut self) -> bool {
        let from = self.next;
        while self.ahead.remove(&self.next) {
            self.next += STEP;
        }
        self.next != from
    }

    /// Takes the numbers missing below the first dispatched ahead (and below `upto`) as never
    /// coming.
    fn skip_gap(&mut self, upto: u64) {
        let to = self.ahead.first().copied().unwrap_or(upto).min(upto);
        if to > self.next {
            self.next = to;
        }
        self.advance();
    }
}

impl DispatchOrder {
    /// Request `unique` was dispatched: its handler returned.
    pub(crate) fn dispatched(&self, unique: u64) {
        if unique % STEP != 0 {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.next == 0 {
            s.next = unique;
        }
        if unique < s.next {
            return;
        }
        s.ahead.insert(unique);
        let mut moved = s.advance();
        if s.ahead.len() > MAX_AHEAD {
            let upto = unique;
            s.skip_gap(upto);
            moved = true;
        }
        drop(s);
        if moved {
            self.moved.notify_all();
        }
    }

    /// Waits until every request numbered below `unique` has been dispatched, for at most
    /// `timeout`: a number may never come (a request the kernel dropped before any thread
    /// read it, when its caller was killed), and is then taken as dispatched. Whether the wait
    /// ended in order (false: timed out).
    pub fn wait_before(&self, unique: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if s.next == 0 || s.next >= unique {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                s.skip_gap(unique);
                drop(s);
                self.moved.notify_all();
                return false;
            }
            s = self
                .moved
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_for_the_requests_numbered_before_and_not_after() {
        let o = Arc::new(DispatchOrder::default());
        o.dispatched(10);
        // 12 and 16 are out, 14 not yet: 16 waits for 14; 14 does not wait for 16.
        o.dispatched(12);
        assert!(o.wait_before(14, Duration::ZERO));
        o.dispatched(16);
        let waiter = {
            let o = o.clone();
            std::thread::spawn(move || o.wait_before(18, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "18 waits for 14");
        o.dispatched(14);
        assert!(waiter.join().unwrap(), "14 came: 18 is in order");
        // Interrupts (odd numbers) are not requests of their own.
        o.dispatched(19);
        assert!(!o.wait_before(20, Duration::ZERO), "19 is not 18");
        o.dispatched(18);
        assert!(o.wait_before(20, Duration::ZERO));
    }

    #[test]
    fn a_number_that_never_comes_is_skipped_after_the_timeout() {
        let o = DispatchOrder::default();
        o.dispatched(2);
        o.dispatched(6);
        let t = Instant::now();
        assert!(!o.wait_before(8, Duration::from_millis(30)), "4 never came");
        assert!(t.elapsed() >= Duration::from_millis(30));
        // Skipped: no one waits for it again.
        assert!(o.wait_before(8, Duration::ZERO));
        o.dispatched(8);
        assert!(o.wait_before(10, Duration::ZERO));
    }

    #[test]
    fn a_gap_is_given_up_once_many_requests_passed_it() {
        let o = DispatchOrder::default();
        o.dispatched(2);
        for u in (6..).step_by(2).take(MAX_AHEAD + 1) {
            o.dispatched(u);
        }
        let s = o.state.lock().unwrap();
        assert!(s.ahead.is_empty(), "{} still ahead", s.ahead.len());
        assert_eq!(s.next, 6 + 2 * (MAX_AHEAD as u64 + 1));
    }
}
