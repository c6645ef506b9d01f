//! The locks of a namespace's metadata service ([`crate::mds::Namespace`]), one per concern,
//! and the one order they are taken in, said once here and checked at every acquisition in
//! debug builds (every test): a thread holding a lock may take only a lock of a later
//! [`Level`]. A change that takes them the other way panics in the first test that runs it,
//! naming both locks, instead of deadlocking one day under load.
//!
//! The order (what may be held while what is taken):
//! - [`Level::Store`], the SQLite store: held for a whole request; under it a request may
//!   take any of the others (leases checked before a change, fill claims and opens noted,
//!   the drainer's hold recorded).
//! - [`Level::Drain`], the drainer's hold and the connections that carry drain requests.
//! - [`Level::Leases`], directory leases (with their condition variable: a recall waits on it).
//! - [`Level::Cache`], a cache namespace's bookkeeping: fill claims, open files, last uses.
//!
//! (The namespace's lock service, [`crate::locks::LockTable`], has its own lock and takes
//! none of these.)

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

/// A lock's place in the order: a lock may be taken while only locks of earlier levels are
/// held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Store = 1,
    Drain = 2,
    Leases = 3,
    Cache = 4,
}

thread_local! {
    /// The levels this thread holds, in the order taken (debug builds).
    static HELD: RefCell<Vec<Level>> = const { RefCell::new(Vec::new()) };
}

/// A mutex with its level.
pub struct Ordered<T> {
    level: Level,
    inner: Mutex<T>,
}

impl<T> Ordered<T> {
    pub const fn new(level: Level, value: T) -> Ordered<T> {
        Ordered {
            level,
            inner: Mutex::new(value),
        }
    }

    /// Takes the lock. In debug builds, panics when this thread holds a lock of this level
    /// or a later one (the order above).
    pub fn lock(&self) -> Guard<'_, T> {
        if cfg!(debug_assertions) {
            HELD.with(|h| {
                let mut h = h.borrow_mut();
                if let Some(&last) = h.iter().max() {
                    assert!(
                        last < self.level,
                        "lock order (crates/surge-server/src/lockorder.rs): {:?} taken while \
                         {last:?} is held (held: {h:?})",
                        self.level
                    );
                }
                h.push(self.level);
            });
        }
        Guard {
            level: self.level,
            inner: self.inner.lock(),
        }
    }
}

/// A held [`Ordered`] lock.
pub struct Guard<'a, T> {
    level: Level,
    inner: MutexGuard<'a, T>,
}

impl<T> Guard<'_, T> {
    /// Waits on `cv` (which must be signalled under this lock) until notified or `deadline`;
    /// true when the deadline passed. The lock is given up while waiting, as with any
    /// condition variable; this thread takes no other lock meanwhile.
    pub fn wait_until(&mut self, cv: &Condvar, deadline: Instant) -> bool {
        cv.wait_until(&mut self.inner, deadline).timed_out()
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        if cfg!(debug_assertions) {
            HELD.with(|h| {
                let mut h = h.borrow_mut();
                if let Some(i) = h.iter().rposition(|&l| l == self.level) {
                    h.remove(i);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_order_are_fine_and_released_ones_are_forgotten() {
        let store = Ordered::new(Level::Store, 0);
        let cache = Ordered::new(Level::Cache, 0);
        let leases = Ordered::new(Level::Leases, 0);
        {
            let _s = store.lock();
            let _l = leases.lock();
            let _c = cache.lock();
        }
        // Each alone, any order, once the others are given back.
        drop(cache.lock());
        drop(store.lock());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "Store taken while Cache is held")]
    fn a_lock_taken_against_the_order_panics_in_debug_builds() {
        let store = Ordered::new(Level::Store, 0);
        let cache = Ordered::new(Level::Cache, 0);
        let _c = cache.lock();
        let _s = store.lock();
    }

    #[test]
    fn the_levels_are_one_order() {
        let all = [Level::Store, Level::Drain, Level::Leases, Level::Cache];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
    }
}
