//! What this node knows of directories without asking the metadata server.
//!
//! - [`Listings`]: the names of directories this node made and alone changed since (each change
//!   it made there returned the directory's change counter one above the last it saw). A lookup
//!   of a name not in such a listing is answered "no such entry" without a round trip: the
//!   kernel's question before every create. In a shared namespace only while this node holds
//!   the directory's lease (another node looking there has it recalled first, which drops the
//!   listing), so no name another node adds is missed.
//! - A directory listed by a `readdir` from its start to its end, every page read at one change
//!   counter, is listed the same way (see [`Listings::gathered`]): `rm -rf` of a tree this node
//!   did not just make unlinks its files behind. In a shared namespace such a listing is used
//!   only under the directory's lease, asked for when it is first used.
//! - [`FreshDirs`]: directory attributes returned with this node's own changes, which the
//!   kernel asks for right after the change (to check search permission on the next path walk).

use crate::instance::DirPage;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use surge_core::Ino;
use surge_proto::{Attr, FileKind};

/// Bounds on the listings: directories, and names in one (beyond: forgotten).
const MAX_LISTINGS: usize = 1024;
pub(super) const MAX_LISTED_NAMES: usize = 1 << 20;
/// Bound on a listing gathered from a `readdir` (a bigger directory is not listed that way),
/// and on the directories being gathered at once.
const MAX_GATHERED_NAMES: usize = 1 << 16;
const MAX_GATHERING: usize = 256;
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
    /// Gathered from a `readdir` (see [`Listings::gathered`]), not made here.
    pub read: bool,
}

/// A `readdir` of a directory from its start, page by page (see [`Listings::gathered`]).
struct Gather {
    /// The change counter of the pages so far (`None` before the first).
    change: Option<u64>,
    /// The cursor the next page starts after.
    next: u64,
    names: HashMap<Vec<u8>, (Ino, FileKind)>,
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
    /// Directories being read from their start (locked after `map` when both are).
    gathering: Mutex<HashMap<Ino, Gather>>,
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

    /// True when `dir`'s listing may serve a change made behind: made here, or (`read`)
    /// gathered from a `readdir` in a private namespace (`private`) or under the lease.
    pub fn trusted(l: &Listing, private: bool) -> bool {
        !l.read || private || l.lease == LeaseState::Held
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
            gathering: Mutex::new(HashMap::new()),
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
        insert(&mut self.map.lock(), dir, HashMap::new(), false);
    }

    /// A `readdir` of `dir` from its start is about to ask for its first page: what this
    /// node changes there from now on spoils what the pages gather (see [`gathered`]).
    ///
    /// [`gathered`]: Self::gathered
    pub fn gather_begin(&self, dir: Ino) {
        if self.ttl.is_zero() {
            return;
        }
        let _map = self.map.lock();
        let mut g = self.gathering.lock();
        if g.len() >= MAX_GATHERING {
            g.clear();
        }
        g.insert(
            dir,
            Gather {
                change: None,
                next: 0,
                names: HashMap::new(),
            },
        );
    }

    /// A page of `dir` after cursor `after` came from the metadata server: `entries`, `done`
    /// when it was the last, `attr` the directory as the page was read. Pages that follow
    /// each other from the start, all read at one change counter, with no change made by
    /// this node in between (each spoils the gathering: [`changed`](Self::changed),
    /// [`drop_dir`](Self::drop_dir), ...), are every name the directory has at that counter:
    /// it is listed from them, as if made here (unless it is listed already).
    /// A directory with a default ACL is not listed (see `Fs::make`).
    pub fn gathered(&self, dir: Ino, after: u64, page: &DirPage) {
        let (entries, done, attr) = (&page.entries, page.done, &page.dir);
        let mut map = self.map.lock();
        let mut gathering = self.gathering.lock();
        let Some(g) = gathering.get_mut(&dir) else {
            return;
        };
        // A page may start before the last one's end: the kernel takes what fits in its
        // buffer and asks again after the last entry it took (read at the same counter, the
        // entries again are the same).
        if page.default_acl
            || after > g.next
            || g.change.is_some_and(|c| c != attr.change)
            || g.names.len() + entries.len() > MAX_GATHERED_NAMES
        {
            gathering.remove(&dir);
            return;
        }
        g.change = Some(attr.change);
        for e in entries {
            g.names.insert(e.name.clone(), (e.ino, e.kind));
        }
        if let Some(last) = entries.last() {
            g.next = g.next.max(last.cursor);
        }
        if !done {
            return;
        }
        let Some(g) = gathering.remove(&dir) else {
            return;
        };
        if map.get(&dir).is_some_and(|l| l.at.elapsed() < self.ttl) {
            return;
        }
        insert(&mut map, attr, g.names, true);
    }

    /// This node changed `dir` (or dropped its listing): a gathering of its pages is spoilt.
    fn spoil(&self, dir: Ino) {
        self.gathering.lock().remove(&dir);
    }

    /// This node added (`entry`: its inode and kind) or removed (`None`) `name` in a
    /// directory, which is now `dir`.
    pub fn changed(&self, dir: &Attr, name: &[u8], entry: Option<(Ino, FileKind)>) {
        let mut listings = self.map.lock();
        self.spoil(dir.ino);
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
        let mut map = self.map.lock();
        self.spoil(ino);
        map.remove(&ino);
    }

    /// Attributes of a directory came from the metadata server: a counter other than the one
    /// this node expects means another node changed it.
    pub fn seen(&self, a: &Attr) {
        if a.kind != FileKind::Dir {
            return;
        }
        let mut listings = self.map.lock();
        {
            let mut gathering = self.gathering.lock();
            if gathering
                .get(&a.ino)
                .is_some_and(|g| g.change.is_some_and(|c| c != a.change))
            {
                gathering.remove(&a.ino);
            }
        }
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

    /// True when `parent`'s live listing was gathered from a `readdir` and its lease not
    /// asked for yet.
    pub fn read_untried(&self, parent: Ino) -> bool {
        self.lock()
            .live(parent)
            .is_some_and(|l| l.read && l.lease == LeaseState::Untried)
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
                self.spoil(parent);
                l.remove(&parent);
            }
        }
    }
}

/// Lists directory `dir` with `names` as of now (`read`: gathered from a `readdir`), the
/// listings bounded by [`MAX_LISTINGS`] (all forgotten when full).
fn insert(
    map: &mut HashMap<Ino, Listing>,
    dir: &Attr,
    names: HashMap<Vec<u8>, (Ino, FileKind)>,
    read: bool,
) {
    if map.len() >= MAX_LISTINGS {
        map.clear();
    }
    map.insert(
        dir.ino,
        Listing {
            names,
            at: Instant::now(),
            dir: dir.clone(),
            lease: LeaseState::Untried,
            read,
        },
    );
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

    fn page(names: &[(&str, u64)], after: u64, done: bool, change: u64) -> DirPage {
        DirPage {
            entries: names
                .iter()
                .enumerate()
                .map(|(i, (n, ino))| surge_proto::DirEntry {
                    cursor: after + 1 + i as u64,
                    name: n.as_bytes().to_vec(),
                    ino: *ino,
                    kind: FileKind::File,
                    attr: None,
                })
                .collect(),
            done,
            dir: dir(2, change),
            default_acl: false,
        }
    }

    #[test]
    fn pages_read_at_one_counter_from_the_start_list_the_directory() {
        let l = Listings::new(Duration::from_secs(10));
        l.gather_begin(2);
        l.gathered(2, 0, &page(&[("a", 3), ("b", 4)], 0, false, 7));
        assert!(!l.listed(2), "not before the last page");
        l.gathered(2, 2, &page(&[("c", 5)], 2, true, 7));
        assert!(l.listed(2));
        assert!(l.known_absent(2, b"d", true));
        assert!(!l.known_absent(2, b"c", true));
        assert!(
            !l.known_absent(2, b"d", false),
            "shared: only under the lease"
        );
        let mut locked = l.lock();
        let x = locked.live(2).unwrap();
        assert!(x.read && x.names.len() == 3 && x.dir.change == 7);
        assert!(!Locked::trusted(x, false) && Locked::trusted(x, true));
        drop(locked);
        // The kernel took only part of a page and asks again after the last entry it took.
        let l = Listings::new(Duration::from_secs(10));
        l.gather_begin(2);
        l.gathered(2, 0, &page(&[("a", 3), ("b", 4), ("c", 5)], 0, false, 7));
        l.gathered(2, 1, &page(&[("b", 4), ("c", 5), ("d", 6)], 1, true, 7));
        assert_eq!(l.lock().live(2).map(|x| x.names.len()), Some(4));
    }

    #[test]
    fn a_gathering_is_spoilt_by_a_change_another_counter_a_gap_or_a_default_acl() {
        let l = Listings::new(Duration::from_secs(10));
        // Another counter on the second page (another node changed the directory).
        l.gather_begin(2);
        l.gathered(2, 0, &page(&[("a", 3)], 0, false, 7));
        l.gathered(2, 1, &page(&[("b", 4)], 1, true, 8));
        assert!(!l.listed(2));
        // This node changed it between its pages.
        l.gather_begin(2);
        l.gathered(2, 0, &page(&[("a", 3)], 0, false, 8));
        l.changed(&dir(2, 9), b"z", Some((9, FileKind::File)));
        l.gathered(2, 1, &page(&[("b", 4)], 1, true, 9));
        assert!(!l.listed(2));
        // ... or dropped it while the page was on its way.
        l.gather_begin(2);
        l.drop_dir(2);
        l.gathered(2, 0, &page(&[("a", 3)], 0, true, 9));
        assert!(!l.listed(2));
        // A page that leaves a gap after the last one.
        l.gather_begin(2);
        l.gathered(2, 0, &page(&[("a", 3)], 0, false, 9));
        l.gathered(2, 5, &page(&[("b", 4)], 5, true, 9));
        assert!(!l.listed(2));
        // No page from the start.
        l.gathered(2, 0, &page(&[("a", 3)], 0, true, 9));
        assert!(!l.listed(2));
        // A default ACL: what is made there is the metadata server's to make.
        l.gather_begin(2);
        let mut p = page(&[("a", 3)], 0, true, 9);
        p.default_acl = true;
        l.gathered(2, 0, &p);
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
