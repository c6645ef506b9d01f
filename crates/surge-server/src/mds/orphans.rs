//! Unlinked files a client session still holds open, in memory, so that those of a mount that
//! went without closing them (killed, its node lost) do not hold the instance's space until
//! it is destroyed.
//!
//! A session that removes the last name of a file it has open (or makes an `O_TMPFILE`) keeps
//! the inode, and removes its data and purges it at its last close. The metadata service
//! ([`super::Namespace`]) records such an inode here for that session, and forgets it at the
//! session's `Purge` (or a `Link` naming it again). Whether the session is still alive is
//! read from its wait for lease recalls (`WaitRecall`, a long poll that never sits idle, which
//! a mount keeps going while it holds such a file): when its last recall connection closes
//! and no new wait comes for [`grace`] (a reconnect after a broken connection comes well
//! within it), its inodes are abandoned. The next session that waits for recalls is handed
//! them: the metadata server forgets each inode (only one with no name left) and the mount
//! removes its objects, as the holder would have at its last close.
//!
//! A session that never waited for recalls is never judged gone: its inodes stay recorded
//! (and, if it went, stay until the instance is destroyed, as before). A restarted server
//! knows none of this: the inodes it finds in its store with no name are claimed by the
//! mounts that hold them (`ClaimOrphans`, sent as their wait for recalls connects again),
//! and those nobody claimed within the grace (or the locks' grace, if longer) are handed out
//! as abandoned ones.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use surge_core::Ino;

/// Inodes recorded per session at most (a bound on the server's memory): past it, a
/// session's further inodes are not recorded.
pub(super) const MAX_HELD: usize = 1 << 16;
/// Inodes handed to one recall wait at most.
pub(super) const MAX_HANDED: usize = 256;
/// How long a session's recall connection stays closed before its inodes are abandoned, in
/// ms (`surge server --orphan-grace`).
static GRACE_MS: AtomicU64 = AtomicU64::new(30_000);

/// Sets [`grace`].
pub fn set_grace(d: Duration) {
    GRACE_MS.store(d.as_millis() as u64, Ordering::Relaxed);
}

/// How long a session's recall connection stays closed before its inodes are abandoned.
pub(super) fn grace() -> Duration {
    Duration::from_millis(GRACE_MS.load(Ordering::Relaxed))
}

/// How long a restarted server waits for mounts to claim the inodes it found with no name:
/// [`grace`], or the locks' grace if longer (mounts reconnect within it).
pub(super) fn claim_period() -> Duration {
    grace().max(crate::locks::grace_period())
}

#[derive(Default)]
pub(super) struct Orphans {
    /// Session -> the unlinked inodes it holds open.
    held: HashMap<u32, HashSet<Ino>>,
    /// Sessions whose last recall connection closed while they held inodes, and when.
    silent: HashMap<u32, Instant>,
    /// Inodes of sessions that went, for the next recall wait of another session.
    abandoned: BTreeSet<Ino>,
    /// Inodes found with no name at start (held by mounts of before the restart, or by none),
    /// not yet claimed, and until when they may be (then they are abandoned).
    unclaimed: HashSet<Ino>,
    claim_until: Option<Instant>,
}

impl Orphans {
    /// `session` keeps `ino`, unlinked, open; false when its record is full.
    pub(super) fn hold(&mut self, session: u32, ino: Ino) -> bool {
        let held = self.held.entry(session).or_default();
        if held.len() >= MAX_HELD && !held.contains(&ino) {
            return false;
        }
        held.insert(ino);
        true
    }

    /// `inos`, found with no name at start, may be claimed until `until`.
    pub(super) fn found_at_start(&mut self, inos: Vec<Ino>, until: Instant) {
        self.unclaimed.extend(inos);
        self.claim_until = Some(until);
    }

    /// `session` holds `inos` open: those found at start are its; how many.
    pub(super) fn claim(&mut self, session: u32, inos: &[Ino]) -> usize {
        let mut n = 0;
        for &ino in inos {
            if self.unclaimed.remove(&ino) {
                self.hold(session, ino);
                n += 1;
            }
        }
        n
    }

    /// `session` removed `ino`'s data and purged it, or named it again.
    pub(super) fn let_go(&mut self, session: u32, ino: Ino) {
        if let Some(h) = self.held.get_mut(&session) {
            h.remove(&ino);
            if h.is_empty() {
                self.held.remove(&session);
            }
        }
    }

    /// `session` waits for recalls (again): it is alive.
    pub(super) fn waits(&mut self, session: u32) {
        self.silent.remove(&session);
    }

    /// The last recall connection of `session` closed at `now`.
    pub(super) fn went_silent(&mut self, session: u32, now: Instant) {
        if self.held.contains_key(&session) {
            self.silent.entry(session).or_insert(now);
        }
    }

    /// For a recall wait of `session` at `now`: abandons the inodes of sessions silent for
    /// `grace`, and takes up to [`MAX_HANDED`] abandoned inodes (never `session`'s own).
    pub(super) fn take(&mut self, session: u32, now: Instant, grace: Duration) -> Vec<Ino> {
        let gone: Vec<u32> = self
            .silent
            .iter()
            .filter(|&(&s, &since)| s != session && now.duration_since(since) >= grace)
            .map(|(&s, _)| s)
            .collect();
        for s in gone {
            self.silent.remove(&s);
            if let Some(h) = self.held.remove(&s) {
                self.abandoned.extend(h);
            }
        }
        if self.claim_until.is_some_and(|t| now >= t) {
            self.claim_until = None;
            self.abandoned.extend(self.unclaimed.drain());
        }
        let taken: Vec<Ino> = self.abandoned.iter().take(MAX_HANDED).copied().collect();
        for i in &taken {
            self.abandoned.remove(i);
        }
        taken
    }

    /// Abandoned inodes whose hand-out failed: the next wait takes them.
    pub(super) fn give_back(&mut self, inos: &[Ino]) {
        self.abandoned.extend(inos.iter().copied());
    }

    /// Sessions that went with inodes (log lines).
    pub(super) fn held_by(&self, session: u32) -> usize {
        self.held.get(&session).map_or(0, HashSet::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Duration = Duration::from_secs(30);

    #[test]
    fn a_silent_sessions_inodes_are_handed_to_another_after_the_grace() {
        let mut o = Orphans::default();
        let t = Instant::now();
        assert!(o.hold(1, 10));
        assert!(o.hold(1, 11));
        o.let_go(1, 11);
        o.went_silent(1, t);
        assert!(o.take(2, t + G / 2, G).is_empty(), "within the grace");
        assert!(o.take(1, t + G, G).is_empty(), "never to itself");
        assert_eq!(o.take(2, t + G, G), vec![10]);
        assert!(o.take(2, t + G, G).is_empty(), "handed once");
        o.give_back(&[10]);
        assert_eq!(
            o.take(3, t + G, G),
            vec![10],
            "a failed hand-out comes back"
        );
    }

    #[test]
    fn a_session_that_waits_again_keeps_its_inodes() {
        let mut o = Orphans::default();
        let t = Instant::now();
        o.hold(1, 10);
        o.went_silent(1, t);
        o.waits(1);
        assert!(o.take(2, t + 2 * G, G).is_empty());
        assert_eq!(o.held_by(1), 1);
    }

    #[test]
    fn a_session_holding_nothing_is_not_recorded_silent() {
        let mut o = Orphans::default();
        let t = Instant::now();
        o.went_silent(1, t);
        o.hold(1, 10);
        assert!(
            o.take(2, t + 2 * G, G).is_empty(),
            "it held nothing when it went silent"
        );
    }

    #[test]
    fn inodes_found_at_start_are_handed_out_unless_claimed_in_time() {
        let mut o = Orphans::default();
        let t = Instant::now();
        o.found_at_start(vec![10, 11, 12], t + G);
        assert_eq!(o.claim(1, &[11, 99]), 1, "only what was found");
        assert!(
            o.take(2, t + G / 2, G).is_empty(),
            "within the claim period"
        );
        assert_eq!(o.claim(3, &[11]), 0, "claimed once");
        assert_eq!(o.take(2, t + G, G), vec![10, 12]);
        assert_eq!(o.held_by(1), 1);
        assert_eq!(o.claim(1, &[10]), 0, "too late");
    }

    #[test]
    fn hand_outs_are_bounded() {
        let mut o = Orphans::default();
        let t = Instant::now();
        for i in 0..(MAX_HANDED as u64 + 5) {
            o.hold(1, 100 + i);
        }
        o.went_silent(1, t);
        assert_eq!(o.take(2, t + G, G).len(), MAX_HANDED);
        assert_eq!(o.take(2, t + G, G).len(), 5);
    }
}
