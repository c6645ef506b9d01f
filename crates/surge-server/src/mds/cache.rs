//! A cache namespace's bookkeeping in memory: the lazy fills in progress (who copies which
//! file from the PFS into the tier) and the use of its files (which the mounts have open,
//! and the order of last use, which eviction takes files in). The metadata service
//! ([`super::Namespace`]) keeps it under one lock (the eviction reads all of it at once);
//! the files' state itself is in the store.

use std::collections::HashMap;
use std::time::{Duration, Instant};
use surge_core::Ino;

/// A fill claim not renewed for this long is void (its holder died or hung): another session
/// may fill the file.
pub(super) const FILL_CLAIM: Duration = Duration::from_secs(20);

#[derive(Default)]
pub(super) struct Cache {
    /// Lazy fills in progress (see [`surge_proto::FillStep::Claim`]): file -> (session, when
    /// claimed or renewed).
    pub(super) fills: HashMap<Ino, (u32, Instant)>,
    /// Which files the mounts have open, and when files were last used.
    pub(super) uses: Uses,
}

impl Cache {
    /// The session other than `session` whose claim to fill `ino` stands, if any.
    pub(super) fn claimed_by_other(&self, ino: Ino, session: u32, now: Instant) -> Option<u32> {
        self.fills
            .get(&ino)
            .filter(|&&(holder, at)| holder != session && now.duration_since(at) < FILL_CLAIM)
            .map(|&(holder, _)| holder)
    }

    /// Forgets the claims that lapsed.
    pub(super) fn forget_lapsed_claims(&mut self, now: Instant) {
        self.fills
            .retain(|_, (_, at)| now.duration_since(*at) < FILL_CLAIM);
    }

    /// Of the clean files `clean` (inode, size), those that may be evicted now, in the order
    /// to take them: none open on a mount, none being filled; least recently used first,
    /// files unused since this service started before all others, older inodes first.
    pub(super) fn evictable(
        &mut self,
        mut clean: Vec<(Ino, u64)>,
        now: Instant,
    ) -> Vec<(Ino, u64)> {
        self.forget_lapsed_claims(now);
        let (fills, uses) = (&self.fills, &mut self.uses);
        clean.retain(|(ino, _)| !fills.contains_key(ino) && !uses.is_open(*ino, now));
        clean.sort_by_key(|(ino, _)| (uses.last.get(ino).copied().unwrap_or(0), *ino));
        clean
    }

    /// `ino` was evicted for `session`, which now holds its fill claim (it removes the
    /// object, then releases the claim).
    pub(super) fn evicted(&mut self, ino: Ino, session: u32, now: Instant) {
        self.fills.insert(ino, (session, now));
        self.uses.last.remove(&ino);
    }
}

/// What a cache namespace's metadata server knows of the use of its files, in memory: the
/// opens the mounts report (`CacheOpen`, files they create, `CacheUse` every second) and the
/// order of last use, which eviction takes files in (least recently used first). A use is an
/// open, a close or a copy into the tier; reads and writes between an open and its close are
/// not seen here (the file is open then, and never evicted).
#[derive(Default)]
pub(super) struct Uses {
    /// File -> session -> when its open was last reported.
    pub(super) open: HashMap<Ino, HashMap<u32, Instant>>,
    /// File -> tick of its last use (files not used since this service started have none).
    pub(super) last: HashMap<Ino, u64>,
    tick: u64,
}

impl Uses {
    pub(super) fn used(&mut self, ino: Ino) {
        self.tick += 1;
        self.last.insert(ino, self.tick);
    }

    pub(super) fn opened(&mut self, session: u32, ino: Ino, now: Instant) {
        self.open.entry(ino).or_default().insert(session, now);
        self.used(ino);
    }

    pub(super) fn closed(&mut self, session: u32, ino: Ino) {
        if let Some(s) = self.open.get_mut(&ino) {
            s.remove(&session);
            if s.is_empty() {
                self.open.remove(&ino);
            }
        }
        self.used(ino);
    }

    /// Whether a session has `ino` open (reported within `CACHE_OPEN_TTL`).
    pub(super) fn is_open(&mut self, ino: Ino, now: Instant) -> bool {
        let Some(s) = self.open.get_mut(&ino) else {
            return false;
        };
        s.retain(|_, at| now.duration_since(*at) < surge_proto::CACHE_OPEN_TTL);
        if s.is_empty() {
            self.open.remove(&ino);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_takes_the_least_recently_used_and_never_an_open_or_filling_file() {
        let mut c = Cache::default();
        let now = Instant::now();
        // 1 and 2 used in that order, 3 never since the start, 4 open, 5 being filled.
        c.uses.used(1);
        c.uses.used(2);
        c.uses.opened(9, 4, now);
        c.fills.insert(5, (9, now));
        let clean = vec![(1, 10), (2, 10), (3, 10), (4, 10), (5, 10)];
        let order: Vec<Ino> = c
            .evictable(clean.clone(), now)
            .iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(order, [3, 1, 2]);
        // Used again, 1 goes to the back; closed, 4 may go; the claim on 5 lapses.
        c.uses.used(1);
        c.uses.closed(9, 4);
        let later = now + FILL_CLAIM + Duration::from_secs(1);
        let order: Vec<Ino> = c.evictable(clean, later).iter().map(|e| e.0).collect();
        assert_eq!(order, [3, 5, 2, 1, 4]);
    }

    #[test]
    fn an_open_not_renewed_within_its_ttl_lapses() {
        let mut u = Uses::default();
        let now = Instant::now();
        u.opened(1, 7, now);
        u.opened(2, 7, now);
        assert!(u.is_open(7, now));
        u.closed(1, 7);
        assert!(u.is_open(7, now), "still open on session 2");
        assert!(!u.is_open(7, now + surge_proto::CACHE_OPEN_TTL));
        assert!(u.open.is_empty());
    }

    #[test]
    fn a_claim_bars_other_sessions_until_it_lapses_and_an_eviction_takes_one() {
        let mut c = Cache::default();
        let now = Instant::now();
        c.evicted(7, 1, now);
        assert_eq!(c.claimed_by_other(7, 2, now), Some(1));
        assert_eq!(c.claimed_by_other(7, 1, now), None, "its own");
        let later = now + FILL_CLAIM;
        assert_eq!(c.claimed_by_other(7, 2, later), None);
        c.forget_lapsed_claims(later);
        assert!(c.fills.is_empty());
    }
}
