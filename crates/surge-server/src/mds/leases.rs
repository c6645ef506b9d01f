//! Directory leases of one namespace, in memory (see [`surge_proto::Request::LeaseDir`]): who
//! holds which directory, which were recalled, and whether a holder still answers. The
//! metadata service ([`super::Namespace`]) keeps them under its `Leases` lock and decides
//! when to recall; this is the bookkeeping, testable without a store.

use std::collections::HashMap;
use std::time::{Duration, Instant};
use surge_core::Ino;

/// A session's leases last while it waits for recalls, or did so this recently.
pub(super) const LEASE_IDLE: Duration = Duration::from_secs(3);
/// A holder that was asked to give a lease back and did not within this is not waited for.
pub(super) const RECALL_LIMIT: Duration = Duration::from_secs(10);
/// Longest `WaitRecall`.
pub(super) const MAX_RECALL_WAIT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(super) struct Leases {
    /// Directory -> holding session.
    pub(super) held: HashMap<Ino, u32>,
    /// Session -> directories it was asked to give back, and since when.
    pub(super) recalled: HashMap<u32, HashMap<Ino, Instant>>,
    /// Session -> recall waits in progress.
    pub(super) waiting: HashMap<u32, usize>,
    /// Session -> when its last recall wait ended (or its lease was granted).
    pub(super) seen: HashMap<u32, Instant>,
}

/// A lease a recall took away from its holder without waiting (for the caller to say so).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Dropped {
    /// The holder no longer waits for recalls: all its leases went.
    Gone { holder: u32 },
    /// The holder did not give `dir` back within [`RECALL_LIMIT`].
    Unanswered { holder: u32, dir: Ino },
}

impl Leases {
    /// Whether `session` still answers recalls: it waits for them now, or did within
    /// [`LEASE_IDLE`].
    pub(super) fn alive(&self, session: u32, now: Instant) -> bool {
        self.waiting.get(&session).is_some_and(|&n| n > 0)
            || self
                .seen
                .get(&session)
                .is_some_and(|&t| now.duration_since(t) < LEASE_IDLE)
    }

    /// Forgets every lease of `session`.
    pub(super) fn drop_session(&mut self, session: u32) {
        self.held.retain(|_, s| *s != session);
        self.recalled.remove(&session);
        self.seen.remove(&session);
    }

    /// Gives `dir` to `session` unless another session holds it.
    pub(super) fn grant(&mut self, dir: Ino, session: u32, now: Instant) -> bool {
        if self.held.get(&dir).is_some_and(|&h| h != session) {
            return false;
        }
        self.held.insert(dir, session);
        // The session is about to wait for recalls; until then this counts as seeing it.
        self.seen.insert(session, now);
        true
    }

    /// Asks the holders of `blocked` (directory, holder) to give them back: marks them
    /// recalled (from the first time asked), and drops at once those of holders that no longer
    /// answer or that were asked more than [`RECALL_LIMIT`] ago. Returns what was dropped.
    pub(super) fn recall(&mut self, blocked: &[(Ino, u32)], now: Instant) -> Vec<Dropped> {
        let mut dropped = Vec::new();
        for &(dir, holder) in blocked {
            if self.held.get(&dir) != Some(&holder) {
                continue;
            }
            if !self.alive(holder, now) {
                self.drop_session(holder);
                dropped.push(Dropped::Gone { holder });
                continue;
            }
            let since = *self
                .recalled
                .entry(holder)
                .or_default()
                .entry(dir)
                .or_insert(now);
            if now.duration_since(since) > RECALL_LIMIT {
                self.held.remove(&dir);
                if let Some(r) = self.recalled.get_mut(&holder) {
                    r.remove(&dir);
                }
                dropped.push(Dropped::Unanswered { holder, dir });
            }
        }
        dropped
    }

    /// The directories `session` was asked to give back and still holds.
    pub(super) fn pending(&self, session: u32) -> Vec<Ino> {
        self.recalled
            .get(&session)
            .map(|r| {
                r.keys()
                    .copied()
                    .filter(|d| self.held.get(d) == Some(&session))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A recall wait of `session` begins.
    pub(super) fn wait_begins(&mut self, session: u32) {
        *self.waiting.entry(session).or_default() += 1;
    }

    /// A recall wait of `session` ended at `now`.
    pub(super) fn wait_ends(&mut self, session: u32, now: Instant) {
        if let Some(n) = self.waiting.get_mut(&session) {
            *n = n.saturating_sub(1);
        }
        self.seen.insert(session, now);
    }

    /// `session` gives `dirs` back.
    pub(super) fn release(&mut self, session: u32, dirs: &[Ino]) {
        for d in dirs {
            if self.held.get(d) == Some(&session) {
                self.held.remove(d);
            }
            if let Some(r) = self.recalled.get_mut(&session) {
                r.remove(d);
            }
        }
    }

    /// The connection `session` waited for recalls on closed: unless it waits on another, its
    /// leases go. `None` when it still waits elsewhere, else whether it held any.
    pub(super) fn connection_closed(&mut self, session: u32) -> Option<bool> {
        if self.waiting.get(&session).is_some_and(|&n| n > 0) {
            return None;
        }
        let held = self.held.values().any(|&s| s == session);
        self.drop_session(session);
        self.waiting.remove(&session);
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_one_sessions_and_goes_back_when_released() {
        let mut l = Leases::default();
        let now = Instant::now();
        assert!(l.grant(10, 1, now));
        assert!(l.grant(10, 1, now), "its holder again");
        assert!(!l.grant(10, 2, now), "another session");
        l.release(2, &[10]);
        assert_eq!(l.held.get(&10), Some(&1), "only its holder gives it back");
        l.release(1, &[10]);
        assert!(l.grant(10, 2, now));
    }

    #[test]
    fn a_recall_marks_the_lease_and_the_holder_sees_it_pending() {
        let mut l = Leases::default();
        let now = Instant::now();
        l.grant(10, 1, now);
        l.grant(11, 1, now);
        assert!(l.pending(1).is_empty());
        assert!(
            l.recall(&[(10, 1)], now).is_empty(),
            "a live holder is waited for"
        );
        assert_eq!(l.pending(1), vec![10]);
        l.release(1, &[10]);
        assert!(l.pending(1).is_empty());
        assert_eq!(l.held.get(&11), Some(&1));
    }

    #[test]
    fn a_holder_that_stopped_answering_loses_every_lease_at_once() {
        let mut l = Leases::default();
        let then = Instant::now();
        l.grant(10, 1, then);
        l.grant(11, 1, then);
        let later = then + LEASE_IDLE * 2;
        assert_eq!(
            l.recall(&[(10, 1)], later),
            vec![Dropped::Gone { holder: 1 }]
        );
        assert!(l.held.is_empty());
        // One that waits for recalls answers, however long ago it was seen.
        l.grant(10, 2, then);
        l.wait_begins(2);
        assert!(l.recall(&[(10, 2)], later).is_empty());
    }

    #[test]
    fn a_recall_not_answered_within_the_limit_drops_that_lease_only() {
        let mut l = Leases::default();
        let t0 = Instant::now();
        l.grant(10, 1, t0);
        l.grant(11, 1, t0);
        l.wait_begins(1);
        assert!(l.recall(&[(10, 1)], t0).is_empty());
        let late = t0 + RECALL_LIMIT + Duration::from_secs(1);
        assert_eq!(
            l.recall(&[(10, 1)], late),
            vec![Dropped::Unanswered { holder: 1, dir: 10 }]
        );
        assert_eq!(l.held.get(&10), None);
        assert_eq!(l.held.get(&11), Some(&1));
    }

    #[test]
    fn a_closed_connection_drops_the_leases_unless_the_session_waits_elsewhere() {
        let mut l = Leases::default();
        let now = Instant::now();
        l.grant(10, 1, now);
        l.wait_begins(1);
        assert_eq!(l.connection_closed(1), None);
        assert_eq!(l.held.get(&10), Some(&1));
        l.wait_ends(1, now);
        assert_eq!(l.connection_closed(1), Some(true));
        assert!(l.held.is_empty());
        assert_eq!(l.connection_closed(1), Some(false));
    }
}
