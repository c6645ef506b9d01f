//! The lock service of one namespace: fcntl (POSIX and OFD) and flock locks of every node,
//! kept by the namespace's metadata server in memory (Lustre's LDLM flock locks and NFS's NLM
//! are the anchors: the server that owns the namespace decides, clients ask).
//!
//! A lock belongs to a (client session, kernel lock owner) pair. Blocking waits are the
//! client's: it tries again when a lock of the namespace is released (the lock keeper's long
//! poll, [`LockTable::keep`], tells it) or after a short while, so no server thread waits for
//! a lock and a waiter interrupted by a signal simply stops trying. Deadlocks between POSIX
//! lock owners (on any nodes) are found here from the waiting tries: each records whom it
//! waits for, for [`LOCK_WAIT_TTL`]. A session's locks go when its last lock-keeper
//! connection closes (its mount died or went), as NLM's go with a client's reboot.
//!
//! No request here touches the store: a restarted server knows no locks until the mounts that
//! held them reclaim them. A namespace opened again (a restart) starts in a grace period
//! ([`LOCK_GRACE`], NLM's): only reclaims ([`LockOp::Reclaim`], sent by a mount's keeper when
//! its connection was made again) are granted; other lock requests see a conflicting lock of
//! session 0 and wait (or get EAGAIN) until it ends.
//!
//! [`LockOp::Reclaim`]: surge_proto::LockOp::Reclaim

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use surge_core::Ino;
use surge_proto::{
    ErrorCode, ErrorReply, LockHeld, LockKind, LockOwner, LockRange, LOCK_GRACE, LOCK_WAIT_TTL,
    MAX_LOCK_KEEP_WAIT,
};
use tracing::info;

/// Locks one namespace may hold at most (a bound on the server's memory; a lock past it is
/// refused `NoSpace`, as the kernel's ENOLCK).
pub const MAX_LOCKS: usize = 1 << 20;

/// A lock owner across the namespace: its client session and its owner there.
type Who = (u32, LockOwner);

#[derive(Clone, Copy, Debug)]
struct Held {
    who: Who,
    shared: bool,
    start: u64,
    end: u64,
    pid: u32,
}

#[derive(Default)]
struct State {
    by_ino: HashMap<Ino, Vec<Held>>,
    count: usize,
    /// Waiting owner -> the owners in its way, and when it last tried.
    waiting: HashMap<Who, (Vec<Who>, Instant)>,
    /// Open lock-keeper connections per session.
    keepers: HashMap<u32, u32>,
    /// How many times something was released (the keepers' long polls return on a change).
    released: u64,
    /// The end of the grace period of a restarted service: until then only reclaims are
    /// granted.
    grace_until: Option<Instant>,
}

#[derive(Default)]
pub struct LockTable {
    state: Mutex<State>,
    change: Condvar,
}

/// `end` as the table keeps it: the kernel says "to the end of the file" with `i64::MAX`.
fn end_of(r: &LockRange) -> u64 {
    if r.end >= i64::MAX as u64 {
        u64::MAX
    } else {
        r.end
    }
}

fn conflicts(h: &Held, who: Who, shared: bool, start: u64, end: u64) -> bool {
    h.who.1.flock == who.1.flock
        && h.who != who
        && h.start <= end
        && start <= h.end
        && !(h.shared && shared)
}

fn reply(h: &Held) -> LockHeld {
    LockHeld {
        kind: if h.shared {
            LockKind::Read
        } else {
            LockKind::Write
        },
        start: h.start,
        end: if h.end == u64::MAX {
            i64::MAX as u64
        } else {
            h.end
        },
        pid: h.pid,
        session: h.who.0,
    }
}

impl State {
    /// Removes `who`'s locks in `start..=end` of `locks` (splitting those that straddle);
    /// whether anything was removed.
    fn carve(locks: &mut Vec<Held>, who: Who, start: u64, end: u64) -> (bool, isize) {
        let mut out = Vec::with_capacity(locks.len() + 1);
        let mut removed = false;
        let before = locks.len() as isize;
        for h in locks.drain(..) {
            if h.who != who || h.end < start || end < h.start {
                out.push(h);
                continue;
            }
            removed = true;
            if h.start < start {
                out.push(Held {
                    end: start - 1,
                    ..h
                });
            }
            if end < h.end {
                out.push(Held {
                    start: end + 1,
                    ..h
                });
            }
        }
        let delta = out.len() as isize - before;
        *locks = out;
        (removed, delta)
    }

    /// Whether `from`'s waits lead (through owners that wait) to `target`.
    fn waits_for(&self, from: &[Who], target: Who, now: Instant) -> bool {
        let mut seen = HashSet::new();
        let mut stack: Vec<Who> = from.to_vec();
        while let Some(w) = stack.pop() {
            if w == target {
                return true;
            }
            if !seen.insert(w) {
                continue;
            }
            if let Some((next, at)) = self.waiting.get(&w) {
                if now.duration_since(*at) < LOCK_WAIT_TTL {
                    stack.extend(next.iter().copied());
                }
            }
        }
        false
    }

    fn drop_session(&mut self, session: u32) -> usize {
        let mut n = 0;
        self.by_ino.retain(|_, locks| {
            let before = locks.len();
            locks.retain(|h| h.who.0 != session);
            n += before - locks.len();
            !locks.is_empty()
        });
        self.count -= n;
        self.waiting.retain(|w, _| w.0 != session);
        n
    }
}

/// The lock a request sees in the way during the grace period: all of its range, exclusive,
/// of no session.
fn grace_holder(r: &LockRange) -> LockHeld {
    LockHeld {
        kind: LockKind::Write,
        start: r.start,
        end: r.end,
        pid: 0,
        session: 0,
    }
}

/// The grace period of this server's restarted namespaces, in ms (`surge server
/// --lock-grace`).
static GRACE_MS: AtomicU64 = AtomicU64::new(LOCK_GRACE.as_millis() as u64);

/// Sets the grace period of the namespaces this server opens again.
pub fn set_grace(d: Duration) {
    GRACE_MS.store(d.as_millis() as u64, Ordering::Relaxed);
}

/// The grace period of a restarted namespace ([`LOCK_GRACE`] unless set).
pub fn grace_period() -> Duration {
    Duration::from_millis(GRACE_MS.load(Ordering::Relaxed))
}

impl LockTable {
    /// A table for a namespace opened again (its server restarted): for `grace`, only locks
    /// held before are granted (reclaims).
    pub fn restarted(grace: Duration) -> LockTable {
        let t = LockTable::default();
        t.state.lock().grace_until = Some(Instant::now() + grace);
        t
    }

    /// True while the grace period of a restart lasts.
    fn in_grace(s: &mut State) -> bool {
        match s.grace_until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                s.grace_until = None;
                false
            }
            None => false,
        }
    }

    /// `F_GETLK`.
    pub fn test(&self, session: u32, owner: LockOwner, r: &LockRange) -> Option<LockHeld> {
        let mut s = self.state.lock();
        if Self::in_grace(&mut s) {
            return Some(grace_holder(r));
        }
        let shared = r.kind == LockKind::Read;
        s.by_ino
            .get(&r.ino)?
            .iter()
            .find(|h| conflicts(h, (session, owner), shared, r.start, end_of(r)))
            .map(reply)
    }

    /// `F_SETLK`, or one try of `F_SETLKW` (`waiting`); `reclaim`: a lock held before a
    /// restart, asked for again (granted during the grace period).
    pub fn set(
        &self,
        session: u32,
        owner: LockOwner,
        r: &LockRange,
        pid: u32,
        waiting: bool,
        reclaim: bool,
    ) -> Result<Option<LockHeld>, ErrorReply> {
        if session == 0 {
            return Err(ErrorReply::new(
                ErrorCode::Invalid,
                "locks need a client session (frame header)",
            ));
        }
        let (start, end) = (r.start, end_of(r));
        if start > end {
            return Err(ErrorReply::new(
                ErrorCode::Invalid,
                format!("lock range {start}..={end} is empty"),
            ));
        }
        let who = (session, owner);
        let mut s = self.state.lock();
        if r.kind == LockKind::Unlock {
            s.waiting.remove(&who);
            let mut released = false;
            let mut delta = 0;
            if let Some(locks) = s.by_ino.get_mut(&r.ino) {
                (released, delta) = State::carve(locks, who, start, end);
                if locks.is_empty() {
                    s.by_ino.remove(&r.ino);
                }
            }
            s.count = s.count.saturating_add_signed(delta);
            if released {
                s.released += 1;
                self.change.notify_all();
            }
            return Ok(None);
        }
        if !reclaim && Self::in_grace(&mut s) {
            return Ok(Some(grace_holder(r)));
        }
        if s.keepers.get(&session).copied().unwrap_or(0) == 0 {
            return Err(ErrorReply::new(
                ErrorCode::Invalid,
                format!(
                    "session {session:#x} has no lock-keeper connection: its locks would \
                     outlive it"
                ),
            ));
        }
        let shared = r.kind == LockKind::Read;
        let now = Instant::now();
        let in_way: Vec<Held> = s
            .by_ino
            .get(&r.ino)
            .map(|l| {
                l.iter()
                    .filter(|h| conflicts(h, who, shared, start, end))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        if let Some(first) = in_way.first() {
            if waiting && !owner.flock {
                let blockers: Vec<Who> = in_way.iter().map(|h| h.who).collect();
                if s.waits_for(&blockers, who, now) {
                    s.waiting.remove(&who);
                    return Err(ErrorReply::new(
                        ErrorCode::Deadlock,
                        format!(
                            "lock of inode {} {start}..={end}: its holders wait for this owner",
                            r.ino
                        ),
                    ));
                }
                s.waiting.insert(who, (blockers, now));
            }
            return Ok(Some(reply(first)));
        }
        s.waiting.remove(&who);
        if s.count >= MAX_LOCKS {
            return Err(ErrorReply::new(
                ErrorCode::NoSpace,
                format!("the namespace holds {MAX_LOCKS} locks, the most it keeps"),
            ));
        }
        let locks = s.by_ino.entry(r.ino).or_default();
        let (replaced, delta) = State::carve(locks, who, start, end);
        locks.push(Held {
            who,
            shared,
            start,
            end,
            pid,
        });
        s.count = s.count.saturating_add_signed(delta + 1);
        if replaced {
            // A downgrade (or a smaller lock) may let waiters through.
            s.released += 1;
            self.change.notify_all();
        }
        Ok(None)
    }

    /// Every lock of kernel owner `owner` of `session` on `ino` goes (a close).
    pub fn release(&self, session: u32, ino: Ino, owner: u64) {
        let mut s = self.state.lock();
        let Some(locks) = s.by_ino.get_mut(&ino) else {
            return;
        };
        let before = locks.len();
        locks.retain(|h| !(h.who.0 == session && h.who.1.owner == owner));
        let n = before - locks.len();
        if locks.is_empty() {
            s.by_ino.remove(&ino);
        }
        if n > 0 {
            s.count -= n;
            s.released += 1;
            self.change.notify_all();
        }
    }

    /// A connection of `session` carried a `Keep`: the session's locks live while it is open.
    pub fn keeper_opened(&self, session: u32) {
        *self.state.lock().keepers.entry(session).or_default() += 1;
    }

    /// A lock-keeper connection of `session` closed: with its last, its locks go.
    pub fn keeper_closed(&self, session: u32, namespace: &str) {
        let mut s = self.state.lock();
        let left = match s.keepers.get_mut(&session) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if left > 0 {
            return;
        }
        s.keepers.remove(&session);
        let n = s.drop_session(session);
        if n > 0 {
            info!(
                "namespace {namespace}: session {session:#x} lost its lock-keeper connection; \
                 its {n} lock(s) are released"
            );
            s.released += 1;
            self.change.notify_all();
        }
    }

    /// Waits up to `wait_ms` for a release after the `after`-th; the count now.
    pub fn keep(&self, after: u64, wait_ms: u32) -> u64 {
        let deadline =
            Instant::now() + Duration::from_millis(u64::from(wait_ms)).min(MAX_LOCK_KEEP_WAIT);
        let mut s = self.state.lock();
        while s.released == after {
            if self.change.wait_until(&mut s, deadline).timed_out() {
                break;
            }
        }
        s.released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(kind: LockKind, start: u64, end: u64) -> LockRange {
        LockRange {
            ino: 5,
            kind,
            start,
            end,
        }
    }

    fn posix(owner: u64) -> LockOwner {
        LockOwner {
            owner,
            flock: false,
        }
    }

    #[test]
    fn a_restarted_table_grants_only_reclaims_until_its_grace_period_ends() {
        let grace = Duration::from_millis(300);
        let t = LockTable::restarted(grace);
        let started = Instant::now();
        t.keeper_opened(1);
        t.keeper_opened(2);
        let w = range(LockKind::Write, 0, 99);
        // A new lock waits out the grace period, whoever asks; F_GETLK says so too.
        let g = t.set(2, posix(8), &w, 11, false, false).unwrap();
        assert_eq!(g.map(|h| (h.session, h.start, h.end)), Some((0, 0, 99)));
        assert_eq!(t.test(2, posix(8), &w).map(|h| h.session), Some(0));
        // The holder before the restart takes its lock back.
        assert_eq!(t.set(1, posix(7), &w, 10, false, true).unwrap(), None);
        // An unlock is never held back.
        let tail = range(LockKind::Unlock, 90, 99);
        assert_eq!(t.set(1, posix(7), &tail, 10, false, false).unwrap(), None);
        while started.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(20));
        }
        // After it, the reclaimed lock holds and the rest of the file is free.
        let c = t.set(2, posix(8), &w, 11, false, false).unwrap();
        assert_eq!(c.map(|h| (h.session, h.start, h.end)), Some((1, 0, 89)));
        let free = range(LockKind::Write, 90, 99);
        assert_eq!(t.set(2, posix(8), &free, 11, false, false).unwrap(), None);
        // A reclaim of a lock someone else took meanwhile is refused like any conflict.
        let lost = t.set(1, posix(7), &free, 10, false, true).unwrap();
        assert_eq!(lost.map(|h| h.session), Some(2));
    }

    #[test]
    fn a_new_table_has_no_grace_period() {
        let t = LockTable::default();
        t.keeper_opened(1);
        let w = range(LockKind::Write, 0, 9);
        assert_eq!(t.set(1, posix(7), &w, 10, false, false).unwrap(), None);
    }

    #[test]
    fn owners_on_two_sessions_exclude_each_other_and_split_ranges() {
        let t = LockTable::default();
        t.keeper_opened(1);
        t.keeper_opened(2);
        let w = range(LockKind::Write, 0, 99);
        assert_eq!(t.set(1, posix(7), &w, 10, false, false).unwrap(), None);
        // The same owner number on another node is another owner.
        assert!(t.set(2, posix(7), &w, 11, false, false).unwrap().is_some());
        // Shared locks share; unlock of the middle splits the writer's lock.
        let mid = range(LockKind::Unlock, 40, 59);
        assert_eq!(t.set(1, posix(7), &mid, 10, false, false).unwrap(), None);
        assert_eq!(
            t.set(
                2,
                posix(8),
                &range(LockKind::Write, 40, 59),
                11,
                false,
                false
            )
            .unwrap(),
            None
        );
        let c = t.test(2, posix(9), &range(LockKind::Read, 0, 200)).unwrap();
        assert_eq!((c.start, c.end, c.session), (0, 39, 1));
        // flock and POSIX locks do not meet.
        let fl = LockOwner {
            owner: 3,
            flock: true,
        };
        assert_eq!(
            t.set(2, fl, &range(LockKind::Write, 0, u64::MAX), 1, false, false)
                .unwrap(),
            None
        );
        // Session 1 goes: its locks with it.
        t.keeper_closed(1, "t");
        assert_eq!(t.test(2, posix(9), &range(LockKind::Write, 0, 39)), None);
    }

    #[test]
    fn a_waiting_lock_that_closes_a_cycle_is_a_deadlock() {
        let t = LockTable::default();
        t.keeper_opened(1);
        t.keeper_opened(2);
        t.set(1, posix(1), &range(LockKind::Write, 0, 0), 1, false, false)
            .unwrap();
        t.set(2, posix(2), &range(LockKind::Write, 1, 1), 2, false, false)
            .unwrap();
        // 1 waits for 2's byte; 2 then asking for 1's byte would wait for ever.
        assert!(t
            .set(1, posix(1), &range(LockKind::Write, 1, 1), 1, true, false)
            .unwrap()
            .is_some());
        let e = t
            .set(2, posix(2), &range(LockKind::Write, 0, 0), 2, true, false)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Deadlock);
    }
}
