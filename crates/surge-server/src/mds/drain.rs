//! Who drains a cache namespace's journal: the drainer's hold (one drainer at a time keeps
//! the PFS in the journal's order; see [`surge_proto::Request::DrainHold`]) and the
//! connections that carry drain requests, per session (the hold of a session that has none
//! left ends: its drainer died). The metadata service ([`super::Namespace`]) keeps it under
//! one lock and records the hold in the store, so a restart keeps it until it lapses.

use crate::meta::Ops;
use rusqlite::Connection;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use surge_core::{InstanceId, NamespaceId};
use tracing::info;

#[derive(Default)]
pub(super) struct Drain {
    /// The session that drains the journal.
    pub(super) hold: Option<Hold>,
    /// Open connections that carried drain requests, per session.
    conns: HashMap<u32, u32>,
}

impl Drain {
    pub(super) fn new(hold: Option<Hold>) -> Drain {
        Drain {
            hold,
            conns: HashMap::new(),
        }
    }

    /// A connection of `session` carries drain requests (once per connection).
    pub(super) fn connection_opened(&mut self, session: u32) {
        *self.conns.entry(session).or_default() += 1;
    }

    /// A connection of `session` that carried drain requests closed. True when it was the
    /// session's last and the session held the hold: the hold is given back (the caller
    /// says so and clears the store's copy).
    pub(super) fn connection_closed(&mut self, session: u32) -> bool {
        let Some(n) = self.conns.get_mut(&session) else {
            return false;
        };
        *n = n.saturating_sub(1);
        if *n > 0 {
            return false;
        }
        self.conns.remove(&session);
        if self.hold.is_some_and(|h| h.session == session) {
            self.hold = None;
            return true;
        }
        false
    }
}

/// A cache namespace's drainer hold, in memory (the store keeps `session` and a wall-clock
/// time, see [`crate::meta::Ops::set_drain_hold`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Hold {
    pub(super) session: u32,
    /// When the holder last renewed the hold.
    pub(super) at: Instant,
    /// When the store's copy was last written (renewals write it only every
    /// [`RECORD_HOLD_EVERY`]).
    pub(super) recorded: Instant,
    /// Read from the store at start (held before a restart) and not renewed since: others
    /// are told to ask again, not that it is busy.
    pub(super) inherited: bool,
}

impl Hold {
    /// Held by another session than `session`, and not lapsed.
    pub(super) fn bars(&self, session: u32) -> bool {
        self.session != session && self.at.elapsed() < surge_proto::DRAIN_HOLD
    }
}

/// A renewal of the drainer hold by its holder writes the store only when the store's copy
/// is this old: a restarted server then still finds it renewed at most this long plus one
/// renewal period (3 s) before, and keeps it the whole `DRAIN_HOLD_AFTER_RESTART`
/// (15 - 6 - 3 = 6 s of slack). The drainer renews every 3 s; this halves the writes.
pub(super) const RECORD_HOLD_EVERY: Duration = Duration::from_secs(5);

/// Milliseconds since the epoch (what a recorded drainer hold is dated by: an `Instant` does
/// not outlive the process).
pub(super) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The drainer hold a store recorded before this service started, while it has not lapsed
/// (see `Namespace::drain_hold`).
pub(super) fn held_before(
    conn: &Connection,
    instance: InstanceId,
    ns: NamespaceId,
) -> Option<Hold> {
    let (session, at_ms) = (Ops { tx: conn }).drain_hold().ok()??;
    let age = Duration::from_millis(wall_ms().saturating_sub(at_ms));
    if age >= surge_proto::DRAIN_HOLD {
        return None;
    }
    // It lapses within DRAIN_HOLD_AFTER_RESTART unless renewed: dated as renewed that long
    // before it lapses.
    let left = (surge_proto::DRAIN_HOLD - age).min(surge_proto::DRAIN_HOLD_AFTER_RESTART);
    let age = surge_proto::DRAIN_HOLD - left;
    info!(
        "namespace {instance}/{}: drainer session {session:#x} held the journal before this \
         start: the hold stands for {:.1} s more unless that drainer renews it",
        ns.0,
        left.as_secs_f64()
    );
    let now = Instant::now();
    Some(Hold {
        session,
        // A clock too young to go back `age` (a host just booted): dated as renewed now, the
        // whole DRAIN_HOLD, rather than forgotten.
        at: now.checked_sub(age).unwrap_or(now),
        recorded: now,
        inherited: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(session: u32) -> Hold {
        let now = Instant::now();
        Hold {
            session,
            at: now,
            recorded: now,
            inherited: false,
        }
    }

    #[test]
    fn the_hold_goes_with_the_holders_last_drain_connection() {
        let mut d = Drain::new(Some(hold(1)));
        d.connection_opened(1);
        d.connection_opened(1);
        d.connection_opened(2);
        assert!(!d.connection_closed(1), "one connection of the holder left");
        assert!(!d.connection_closed(2), "not the holder");
        assert!(d.hold.is_some());
        assert!(d.connection_closed(1));
        assert!(d.hold.is_none());
        assert!(
            !d.connection_closed(1),
            "a close never opened counts nothing"
        );
    }

    #[test]
    fn a_hold_bars_other_sessions_until_it_lapses() {
        let h = hold(1);
        assert!(h.bars(2));
        assert!(!h.bars(1));
        let old = Hold {
            at: Instant::now()
                .checked_sub(surge_proto::DRAIN_HOLD)
                .unwrap_or_else(Instant::now),
            ..h
        };
        // On a host booted less than DRAIN_HOLD ago the clock cannot go back that far.
        if old.at.elapsed() >= surge_proto::DRAIN_HOLD {
            assert!(!old.bars(2));
        }
    }
}
