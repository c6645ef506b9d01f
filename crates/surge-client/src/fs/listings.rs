//! What this node knows of directories without asking the metadata server.
//!
//! - [`Listings`]: the names of directories this node made and alone changed since (each change
//!   it made there returned the directory's change counter one above the last it saw). A lookup
//!   of a name not in such a listing is answered "no such entry" without a round trip: the
//!   kernel's question before every create. In a shared namespace only while this node holds
//!   the directory's lease (another node looking there has it recalled first, which drops the
//!   listing), so no name another node adds is missed.
//! - [`FreshDirs`]: directory attributes returned with this node's own changes, which the
//!   kernel asks for right after the change (to check search permission on the next path walk).

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use surge_core::Ino;
use surge_proto::{Attr, FileKind};

/// Bounds on the listings: directories, and names in one (beyond: forgotten).
const MAX_LISTINGS: usize = 1024;
pub(super) const MAX_LISTED_NAMES: usize = 1 << 20;
/// Bound on [`FreshDirs`] (cleared when reached; entries are taken at once in practice).
const MAX_FRESH_DIRS: usize = 4096;

pub(super) struct Listing {
    /// Every name, with its inode and kind.
    pub names: HashMap<Vec<u8>, (Ino, FileKind)>,
    /// When the metadata server last confirmed the listing (a change here answered with the
    /// next counter).
    pub at: Instant,
    /// The directory's attributes after the last change made here (`dir.change` is the
    /// counter this node expects).
    pub dir: Attr,
    /// In a shared namespace, creates are made behind only in a directory this node holds
    /// the lease of (see `Fs::leased`); one try per listing.
    pub lease: LeaseState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LeaseState {
    Untried,
    Held,
    /// Refused, being asked for, or given back.
    No,
}

pub(super) struct Listings {
    map: Mutex<HashMap<Ino, Listing>>,
    /// The mount's entry TTL: how long a listing is kept after this node's last change (zero:
    /// listings are not kept).
    ttl: Duration,
}

/// The listings, locked (see [`Listings::lock`]).
pub(super) struct Locked<'a> {
    map: MutexGuard<'a, HashMap<Ino, Listing>>,
    ttl: Duration,
}

impl Locked<'_> {
    /// The listing of `dir`, if this node may still answer from it.
    pub fn live(&mut self, dir: Ino) -> Option<&mut Listing> {
        let ttl = self.ttl;
        self.map.get_mut(&dir).filter(|l| l.at.elapsed() < ttl)
    }

    pub fn get(&mut self, dir: Ino) -> Option<&mut Listing> {
        self.map.get_mut(&dir)
    }

    pub fn remove(&mut self, dir: Ino) {
        self.map.remove(&dir);
    }

    /// Keeps only the listings `f` says to keep.
    pub fn retain(&mut self, mut f: impl FnMut(&Listing) -> bool) {
        self.map.retain(|_, l| f(l));
    }
}

impl Listings {
    pub fn new(ttl: Duration) -> Listings {
        Listings {
            map: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn lock(&self) -> Locked<'_> {
        Locked {
            map: self.map.lock(),
            ttl: self.ttl,
        }
    }

    /// `dir` was just made here: it is empty.
    pub fn made(&self, dir: &Attr) {
        if self.ttl.is_zero() {
            return;
        }
        let mut l = self.map.lock();
        if l.len() >= MAX_LISTINGS {
            l.clear();
        }
        l.insert(
            dir.ino,
            Listing {
                names: HashMap::new(),
                at: Instant::now(),
                dir: dir.clone(),
                lease: LeaseState::Untried,
            },
        );
    }

    /// This node added (`entry`: its inode and kind) or removed (`None`) `name` in a
    /// directory, which is now `dir`.
    pub fn changed(&self, dir: &Attr, name: &[u8], entry: Option<(Ino, FileKind)>) {
        let mut listings = self.map.lock();
        let Some(l) = listings.get_mut(&dir.ino) else {
            return;
        };
        if dir.change != l.dir.change.wrapping_add(1) || l.names.len() >= MAX_LISTED_NAMES {
            // Somebody else changed it too (or it grew too big to keep).
            listings.remove(&dir.ino);
            return;
        }
        match entry {
            Some(e) => {
                l.names.insert(name.to_vec(), e);
            }
            None => {
                l.names.remove(name);
            }
        }
        l.at = Instant::now();
        l.dir = dir.clone();
    }

    pub fn drop_dir(&self, ino: Ino) {
        self.map.lock().remove(&ino);
    }

    /// Attributes of a directory came from the metadata server: a counter other than the one
    /// this node expects means another node changed it.
    pub fn seen(&self, a: &Attr) {
        if a.kind != FileKind::Dir {
            return;
        }
        let mut listings = self.map.lock();
        match listings.get_mut(&a.ino) {
            Some(l) if l.dir.change != a.change => {
                listings.remove(&a.ino);
            }
            // Its default layout is not an entry change (the counter stays): what files made
            // here behind take is the default seen last.
            Some(l) => l.dir.layout = a.layout,
            None => {}
        }
    }

    /// True when `name` is known not to be in `parent`: listed here, and (unless
    /// `without_lease`, a private namespace) its lease held.
    pub fn known_absent(&self, parent: Ino, name: &[u8], without_lease: bool) -> bool {
        self.lock().live(parent).is_some_and(|l| {
            (without_lease || l.lease == LeaseState::Held) && !l.names.contains_key(name)
        })
    }

    /// True when `parent` is listed here.
    pub fn listed(&self, parent: Ino) -> bool {
        self.lock().live(parent).is_some()
    }

    /// A batch sent at `sent` made a change of `parent` and the server answered with counter
    /// `change` (`None`: it failed); `expected` is what this node expected.
    pub fn confirm(&self, parent: Ino, change: Option<u64>, expected: u64, sent: Instant) {
        let mut l = self.map.lock();
        match change {
            // The directory is as this node expected it when the batch went out.
            Some(c) if c == expected => {
                if let Some(x) = l.get_mut(&parent) {
                    x.at = x.at.max(sent);
                }
            }
            _ => {
                l.remove(&parent);
            }
        }
    }
}

/// Directory attributes returned with this node's own changes in them (create, unlink,
/// rmdir), and when: the change invalidates the kernel's copy and the kernel asks for them
/// right after (to check search permission on the next path walk). Answered from here, once
/// each, while younger than the attribute TTL, so the kernel's question costs no round trip.
pub(super) struct FreshDirs {
    map: Mutex<HashMap<Ino, (Attr, Instant)>>,
    /// The mount's attribute TTL (zero: never answer from here).
    ttl: Duration,
}

impl FreshDirs {
    pub fn new(ttl: Duration) -> FreshDirs {
        FreshDirs {
            map: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    pub fn note(&self, a: Attr) {
        if self.ttl.is_zero() {
            return;
        }
        let mut dirs = self.map.lock();
        if dirs.len() >= MAX_FRESH_DIRS {
            dirs.clear();
        }
        dirs.insert(a.ino, (a, Instant::now()));
    }

    pub fn forget(&self, ino: Ino) {
        self.map.lock().remove(&ino);
    }

    pub fn clear(&self) {
        self.map.lock().clear();
    }

    pub fn take(&self, ino: Ino) -> Option<Attr> {
        let (a, at) = self.map.lock().remove(&ino)?;
        (at.elapsed() < self.ttl).then_some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_proto::Timestamp;

    fn dir(ino: Ino, change: u64) -> Attr {
        Attr {
            ino,
            kind: FileKind::Dir,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            change,
            rdev: 0,
            through: 0,
            layout: Default::default(),
            btime: Timestamp::default(),
            flags: 0,
        }
    }

    #[test]
    fn a_listing_lives_while_each_change_is_the_next_counter() {
        let l = Listings::new(Duration::from_secs(10));
        l.made(&dir(2, 0));
        assert!(l.known_absent(2, b"a", true));
        assert!(
            !l.known_absent(2, b"a", false),
            "shared: only under a lease"
        );
        l.changed(&dir(2, 1), b"a", Some((3, FileKind::File)));
        assert!(!l.known_absent(2, b"a", true), "a is there now");
        assert!(l.known_absent(2, b"b", true));
        // Somebody else changed the directory in between: counter 3, not 2.
        l.changed(&dir(2, 3), b"b", Some((4, FileKind::File)));
        assert!(!l.listed(2), "the listing is dropped");
    }

    #[test]
    fn attributes_with_another_counter_drop_the_listing() {
        let l = Listings::new(Duration::from_secs(10));
        l.made(&dir(2, 5));
        l.seen(&dir(2, 5));
        assert!(l.listed(2));
        l.seen(&dir(2, 6));
        assert!(!l.listed(2));
    }

    #[test]
    fn a_zero_ttl_keeps_nothing() {
        let l = Listings::new(Duration::ZERO);
        l.made(&dir(2, 0));
        assert!(!l.listed(2));
        let f = FreshDirs::new(Duration::ZERO);
        f.note(dir(2, 0));
        assert!(f.take(2).is_none());
    }

    #[test]
    fn fresh_directory_attributes_answer_once() {
        let f = FreshDirs::new(Duration::from_secs(10));
        f.note(dir(2, 1));
        assert_eq!(f.take(2).map(|a| a.change), Some(1));
        assert!(f.take(2).is_none());
    }
}
