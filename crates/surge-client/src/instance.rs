//! The native API of one namespace of an instance: metadata calls to its metadata server and
//! striped reads and writes to its fragments. The FUSE core ([`crate::fs`]) and the staging
//! engine both stand on this; it has no notion of open files or of the kernel.

use crate::conn::ServerPool;
use crate::error::{ClientError, Result};
use futures::future::join_all;
use std::collections::HashMap;
use std::sync::Arc;
use surge_core::{FileId, FileLayout, Ino, InstanceId, Layout, NamespaceId, Piece};
use surge_proto::{
    AllocMode, Attr, BatchDone, BatchOp, DirEntry, ErrorReply, FileKind, InstanceDescriptor,
    KeepOpen, LockHeld, LockOp, LockOwner, LockRange, NewNode, Request, Response, ServerRef,
    SetAttr, TimeSet, Unlinked,
};

/// Largest piece sent in one request (a one-fragment instance merges a whole write into one
/// piece; the protocol caps payloads).
const MAX_PIECE: u64 = 8 << 20;
// What a server takes in one request bounds it.
const _: () = assert!(MAX_PIECE <= surge_proto::frame::MAX_IO as u64);

/// A random client session number, never 0.
fn new_session() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    loop {
        // RandomState is seeded from the operating system's randomness.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let v = h.finish() as u32;
        if v != 0 {
            return v;
        }
    }
}
/// Connections kept per server.
const CONNECTIONS_PER_SERVER: usize = 4;
/// Layouts of files remembered per client, per generation (see [`Layouts`]).
const LAYOUTS_KEPT: usize = 1 << 19;

/// The layouts of files a client has seen, in two generations: when the newer one is full it
/// becomes the older and the oldest is dropped, so a layout is forgotten only after
/// [`LAYOUTS_KEPT`] others were seen since it was last used (never while its file is still
/// in a mount's queue of creates sent behind, which the metadata server does not know yet).
#[derive(Default)]
struct Layouts {
    new: HashMap<Ino, FileLayout>,
    old: HashMap<Ino, FileLayout>,
}

impl Layouts {
    fn get(&mut self, ino: Ino) -> Option<FileLayout> {
        if let Some(l) = self.new.get(&ino) {
            return Some(*l);
        }
        let l = self.old.remove(&ino)?;
        self.insert(ino, l);
        Some(l)
    }

    fn insert(&mut self, ino: Ino, l: FileLayout) {
        if self.new.len() >= LAYOUTS_KEPT && !self.new.contains_key(&ino) {
            self.old = std::mem::take(&mut self.new);
        }
        self.new.insert(ino, l);
    }

    fn remove(&mut self, ino: Ino) -> Option<FileLayout> {
        let a = self.new.remove(&ino);
        let b = self.old.remove(&ino);
        a.or(b)
    }
}

/// How an [`InstanceClient`] waits for its servers.
#[derive(Clone)]
pub struct ClientOptions {
    /// How long a request waits for its reply (and a mount's request for the changes queued
    /// before it); `None`: forever (NFS's "hard"). Default [`crate::conn::DEFAULT_DEADLINE`].
    pub deadline: Option<std::time::Duration>,
    /// Where the servers' addresses are asked again when none of a server's answers (the
    /// manager); `None`: the descriptor's addresses only.
    pub resolve: Option<Arc<dyn crate::conn::Resolve>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: Some(crate::conn::DEFAULT_DEADLINE),
            resolve: None,
        }
    }
}

impl ClientOptions {
    /// Servers that moved are found through the manager at `manager` (when there is one).
    pub fn resolving_through(mut self, manager: Option<&str>) -> ClientOptions {
        self.resolve = manager.map(|m| {
            Arc::new(crate::conn::ManagerResolver {
                manager: m.to_string(),
            }) as Arc<dyn crate::conn::Resolve>
        });
        self
    }
}

/// Capacity and use of an instance, and its inode count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub capacity: u64,
    pub used: u64,
    pub inodes: u64,
}

/// Most objects of local fragments a client keeps open for reading.
const LOCAL_READS_OPEN: usize = 256;

/// Objects of fragments on this host a client reads itself: a read then costs a `pread` of
/// the object instead of a round trip to its server (another process: a copy through a
/// socket and a thread wake-up each way). Writes still go to the servers, which check space.
#[derive(Default)]
struct LocalReads {
    open: HashMap<(u32, Ino), Arc<std::fs::File>>,
    /// Fragments whose objects this client may not open (another user's server).
    refused: std::collections::HashSet<u32>,
}

pub struct InstanceClient {
    pub desc: InstanceDescriptor,
    pub ns: NamespaceId,
    /// This client's session (random, not 0): what the metadata server grants directory
    /// leases to (see [`Request::LeaseDir`]).
    pub session: u32,
    mds: Arc<ServerPool>,
    /// Indexed by the fragment's position in the layout (0..fragments).
    frags: Vec<Arc<ServerPool>>,
    /// Each fragment's directory, once a server on this host told it (passthrough).
    local_dirs: Vec<std::sync::OnceLock<std::path::PathBuf>>,
    /// Fragments whose server is known not to be on this host.
    remote: Vec<std::sync::atomic::AtomicBool>,
    /// Whether this process owns each local fragment's directory (runs as its server's user).
    local_owner: Vec<std::sync::OnceLock<bool>>,
    /// The layouts of files this client has seen (a file's layout is fixed once it holds
    /// data; an empty file's may change, which this client sees at its next `getattr`, as
    /// close-to-open has every open do).
    layouts: parking_lot::Mutex<Layouts>,
    /// Objects of fragments on this host, open for reading here (see [`Self::read_into`]).
    local_reads: parking_lot::Mutex<LocalReads>,
    /// Requests sent, per operation.
    counts: RequestCounts,
    /// The user this client's capability acts for (from its claims, unchecked: see
    /// [`surge_auth::Token::claims_unchecked`]).
    acting_for: Option<surge_auth::Caller>,
}

/// How many requests of each operation a client sent: what tests of caching count (e.g. "a
/// create in a listed directory sends no `Lookup`"), by the operation's name
/// ([`Request::name`]).
pub struct RequestCounts {
    by_opcode: [std::sync::atomic::AtomicU64; 64],
    names: [std::sync::OnceLock<&'static str>; 64],
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            by_opcode: std::array::from_fn(|_| std::sync::atomic::AtomicU64::new(0)),
            names: std::array::from_fn(|_| std::sync::OnceLock::new()),
        }
    }
}

impl RequestCounts {
    fn note(&self, req: &Request) {
        let op = usize::from(req.opcode());
        if let (Some(c), Some(n)) = (self.by_opcode.get(op), self.names.get(op)) {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            n.get_or_init(|| req.name());
        }
    }

    /// Requests of operation `name` (e.g. `"Lookup"`) sent so far.
    pub fn get(&self, name: &str) -> u64 {
        self.snapshot().get(name).copied().unwrap_or(0)
    }

    /// Every operation sent so far, with its count.
    pub fn snapshot(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.by_opcode
            .iter()
            .zip(&self.names)
            .filter_map(|(c, n)| Some((*n.get()?, c.load(std::sync::atomic::Ordering::Relaxed))))
            .collect()
    }
}

/// One request without payload to one server, and the reply expected. On a thread running
/// requests inline (a FUSE thread, see [`crate::blocking`]) it is sent from that thread on its
/// own connection; otherwise through the async pool.
macro_rules! expect {
    ($self:ident, $pool:expr, $req:expr, $pat:pat => $out:expr) => {{
        let req = $req;
        $self.counts.note(&req);
        let resp = if crate::blocking::is_inline() {
            crate::blocking::call(&$pool, &req)?
        } else {
            $pool.call(&req, &[]).await?.0
        };
        match resp {
            $pat => Ok($out),
            other => Err($self.unexpected(&$pool.server, &req, other)),
        }
    }};
}

/// Defines a metadata request as an `async fn` (answered through [`expect!`], so also from a
/// FUSE thread inline, see [`crate::blocking`]).
macro_rules! metadata_call {
    ($(#[$m:meta])* $name:ident ($this:ident $(, $arg:ident : $ty:ty)*) -> $out:ty, $req:expr, $pat:pat => $val:expr) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        pub async fn $name(&self $(, $arg: $ty)*) -> Result<$out> {
            let $this = self;
            expect!($this, $this.mds, $req, $pat => $val)
        }
    };
}

/// One page of a directory listing (see [`InstanceClient::readdir`]).
#[derive(Debug)]
pub struct DirPage {
    pub entries: Vec<DirEntry>,
    /// The last page.
    pub done: bool,
    /// The directory's attributes as the page was read (its change counter tells whether
    /// it changed between pages).
    pub dir: Attr,
    /// The directory has a default ACL.
    pub default_acl: bool,
}

impl InstanceClient {
    /// Connects to namespace `ns` of an instance described by `desc`, presenting capability
    /// `token` to its servers.
    pub fn new(
        desc: InstanceDescriptor,
        ns: NamespaceId,
        token: surge_auth::Token,
    ) -> Result<InstanceClient> {
        Self::with_options(desc, ns, token, ClientOptions::default())
    }

    /// [`new`](Self::new) with `opts`.
    pub fn with_options(
        desc: InstanceDescriptor,
        ns: NamespaceId,
        token: surge_auth::Token,
        opts: ClientOptions,
    ) -> Result<InstanceClient> {
        let session = new_session();
        let acting_for = token
            .claims_unchecked()
            .filter(|c| c.rights == surge_auth::Rights::Instance)
            .map(|c| c.caller);
        let token = Arc::new(token);
        let mut pools: HashMap<String, Arc<ServerPool>> = HashMap::new();
        let mut pool_for = |s: &ServerRef| -> Result<Arc<ServerPool>> {
            if let Some(p) = pools.get(&s.id) {
                return Ok(p.clone());
            }
            let p = Arc::new(
                ServerPool::new(s.clone(), CONNECTIONS_PER_SERVER)?
                    .with_session(session)
                    .with_token(token.clone())
                    .with_deadline(opts.deadline)
                    .with_resolver(opts.resolve.clone()),
            );
            pools.insert(s.id.clone(), p.clone());
            Ok(p)
        };
        let nsref = desc.namespace(ns).ok_or_else(|| {
            ClientError::local(
                libc::ENOENT,
                format!("instance {} has no namespace {}", desc.instance, ns.0),
            )
        })?;
        let mds = pool_for(&nsref.server)?;
        let mut fragments = desc.fragments.clone();
        fragments.sort_by_key(|f| f.index);
        if fragments.is_empty()
            || fragments
                .iter()
                .enumerate()
                .any(|(i, f)| f.index as usize != i)
        {
            return Err(ClientError::local(
                libc::EINVAL,
                format!(
                    "instance {}: fragments are not numbered 0..n",
                    desc.instance
                ),
            ));
        }
        let frags = fragments
            .iter()
            .map(|f| pool_for(&f.server))
            .collect::<Result<Vec<_>>>()?;
        Ok(InstanceClient {
            desc,
            ns,
            session,
            mds,
            local_dirs: (0..frags.len())
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            remote: (0..frags.len())
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            local_owner: (0..frags.len())
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            frags,
            layouts: parking_lot::Mutex::new(Layouts::default()),
            local_reads: parking_lot::Mutex::new(LocalReads::default()),
            counts: RequestCounts::default(),
            acting_for,
        })
    }

    /// The user this client's capability acts for (`None`: an administrator's capability, or
    /// one that does not parse). What a root mount opens the job's PFS files as.
    pub fn acting_for(&self) -> Option<&surge_auth::Caller> {
        self.acting_for.as_ref()
    }

    /// Asks any server holding a piece of `instance` for its descriptor and connects.
    pub async fn connect(
        server: &str,
        instance: InstanceId,
        ns: NamespaceId,
        token: surge_auth::Token,
    ) -> Result<InstanceClient> {
        let desc = crate::admin::describe(server, instance, &token).await?;
        Self::new(desc, ns, token)
    }

    pub fn instance(&self) -> InstanceId {
        self.desc.instance
    }

    /// How long a request waits for its reply (`None`: forever).
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.mds.deadline()
    }

    /// The client session its requests act for (what the servers know this mount by).
    pub fn session(&self) -> u32 {
        self.mds.session()
    }

    /// The requests this client sent so far, per operation.
    pub fn counts(&self) -> &RequestCounts {
        &self.counts
    }

    pub fn fragments(&self) -> u32 {
        self.frags.len() as u32
    }

    pub fn file_id(&self, ino: Ino) -> FileId {
        FileId { ns: self.ns, ino }
    }

    /// The layout of file `ino` as recorded (`recorded`), resolved against this instance.
    pub fn resolve_layout(&self, ino: Ino, recorded: FileLayout) -> Layout {
        Layout::resolve(
            recorded,
            self.file_id(ino),
            self.desc.stripe_size,
            self.fragments(),
        )
    }

    /// Remembers the layout of a file from its attributes: what its reads and writes use.
    pub fn note_layout(&self, a: &Attr) {
        if a.kind == FileKind::File {
            self.layouts.lock().insert(a.ino, a.layout);
        }
    }

    /// The layout of file `ino`: as seen last, else from its attributes.
    pub async fn layout_of(&self, ino: Ino) -> Result<Layout> {
        let seen = self.layouts.lock().get(ino);
        let recorded = match seen {
            Some(l) => l,
            None => {
                let a = self.getattr(ino).await?;
                self.note_layout(&a);
                a.layout
            }
        };
        Ok(self.resolve_layout(ino, recorded))
    }

    /// Sets the layout of `ino` (an empty file's, or a directory's default; see
    /// [`Request::SetLayout`]). A stripe count larger than the instance's fragments is refused
    /// here, naming both.
    pub async fn set_layout(&self, ino: Ino, layout: FileLayout) -> Result<Attr> {
        layout
            .check(self.fragments())
            .map_err(|e| ClientError::local(libc::EINVAL, e.to_string()))?;
        let a = self.set_layout_meta(ino, layout).await?;
        self.note_layout(&a);
        Ok(a)
    }

    metadata_call!(set_layout_meta(this, ino: Ino, layout: FileLayout) -> Attr,
        Request::SetLayout { instance: this.instance(), ns: this.ns, ino, layout },
        Response::Attr(a) => a);

    fn unexpected(&self, server: &ServerRef, req: &Request, resp: Response) -> ClientError {
        ClientError::Protocol {
            server: server.id.clone(),
            request: req.name(),
            reply: format!("{resp:?}"),
        }
    }

    // --- metadata ---

    metadata_call!(lookup(this, parent: Ino, name: &[u8]) -> Attr,
        Request::Lookup { instance: this.instance(), ns: this.ns, parent, name: name.to_vec() },
        Response::Attr(a) => a);

    metadata_call!(getattr(this, ino: Ino) -> Attr,
        Request::GetAttr { instance: this.instance(), ns: this.ns, ino },
        Response::Attr(a) => a);

    metadata_call!(
        /// A read of file `ino` on a mount that keeps access times (see
        /// [`surge_proto::atime_due`]): the attributes after.
        accessed(this, ino: Ino, strict: bool) -> Attr,
        Request::Accessed { instance: this.instance(), ns: this.ns, ino, strict },
        Response::Attr(a) => a);

    metadata_call!(
        /// File `ino` is about to hold allocated bytes past its end (see
        /// [`surge_proto::FL_EOFBLOCKS`]): the attributes after.
        allocated_past_end(this, ino: Ino) -> Attr,
        Request::AllocatedPastEnd { instance: this.instance(), ns: this.ns, ino },
        Response::Attr(a) => a);

    metadata_call!(
        /// Sets attributes in the metadata store only; [`setattr`](Self::setattr) also cuts
        /// the objects on a shrinking truncate.
        setattr_meta(this, ino: Ino, set: SetAttr) -> Attr,
        Request::SetAttr { instance: this.instance(), ns: this.ns, ino, set },
        Response::Attr(a) => a);

    /// Changes attributes. A size change truncates the objects on the fragments first
    /// (`old_size` tells which fragments can hold bytes past the new end).
    pub async fn setattr(&self, ino: Ino, set: SetAttr, old_size: u64) -> Result<Attr> {
        if let Some(size) = set.size {
            if size < old_size {
                self.truncate_objects(ino, old_size, size).await?;
            }
        }
        self.setattr_meta(ino, set).await
    }

    metadata_call!(
        /// Creates a node with `layout` (unset: the parent directory's default) and the
        /// permission bits `perm` less `umask` (or masked by the parent's default ACL); returns
        /// its attributes, its parent directory's after the change, and whether it took the
        /// parent's default ACL.
        create_in(this, parent: Ino, name: &[u8], node: NewNode, perm: u16, umask: u16, uid: u32, gid: u32, layout: FileLayout) -> (Attr, Attr, bool),
        Request::Create { instance: this.instance(), ns: this.ns, parent, name: name.to_vec(), node, perm, umask, uid, gid, layout },
        Response::Created { attr, parent, inherited } => { this.note_layout(&attr); (attr, parent, inherited) });

    /// Creates a node with its parent directory's default layout; returns its attributes.
    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        node: NewNode,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        Ok(self
            .create_in(parent, name, node, perm, 0, uid, gid, FileLayout::default())
            .await?
            .0)
    }

    metadata_call!(
        /// Makes an unnamed regular file (`O_TMPFILE`) as a create in `dir` would.
        tmpfile(this, dir: Ino, perm: u16, umask: u16, uid: u32, gid: u32, layout: FileLayout) -> Attr,
        Request::Tmpfile { instance: this.instance(), ns: this.ns, dir, perm, umask, uid, gid, layout },
        Response::Attr(a) => { this.note_layout(&a); a });

    metadata_call!(link(this, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Attr,
        Request::Link { instance: this.instance(), ns: this.ns, ino, new_parent, new_name: new_name.to_vec() },
        Response::Attr(a) => a);

    metadata_call!(
        /// Removes a name; returns what became of its inode and the parent's attributes after.
        unlink_in(this, parent: Ino, name: &[u8], keep: KeepOpen) -> (Unlinked, Attr),
        Request::Unlink { instance: this.instance(), ns: this.ns, parent, name: name.to_vec(), keep },
        Response::Removed { unlinked, parent } => (unlinked, parent));

    /// Removes a name; returns what became of its inode.
    pub async fn unlink(&self, parent: Ino, name: &[u8], keep: KeepOpen) -> Result<Unlinked> {
        Ok(self.unlink_in(parent, name, keep).await?.0)
    }

    /// Changes made behind the application (see [`Request::NamespaceBatch`]): one result per
    /// change. Sent through the async pool and waited for without a deadline: a batch that
    /// timed out may still be made by a server that was only stopped, and sending it again
    /// would make each change twice (no application waits on it: requests that wait for the
    /// queue have the deadline). A server that died closes the connection; one whose host
    /// vanished is found out by TCP keepalive.
    pub async fn namespace_batch(
        &self,
        ops: Vec<BatchOp>,
    ) -> Result<Vec<std::result::Result<BatchDone, ErrorReply>>> {
        let req = Request::NamespaceBatch {
            instance: self.instance(),
            ns: self.ns,
            ops,
        };
        self.counts.note(&req);
        match self.mds.call_within(&req, &[], None).await?.0 {
            Response::BatchDone(r) => Ok(r),
            other => Err(self.unexpected(&self.mds.server, &req, other)),
        }
    }

    metadata_call!(
        /// Reserves `count` inode numbers for creates made behind the application; returns
        /// the first.
        alloc_inodes(this, count: u32) -> Ino,
        Request::AllocInodes { instance: this.instance(), ns: this.ns, count },
        Response::Inodes { first, .. } => first);

    metadata_call!(
        /// Asks for the lease of directory `ino`, last seen with change counter `change`.
        lease_dir(this, ino: Ino, change: u64) -> bool,
        Request::LeaseDir { instance: this.instance(), ns: this.ns, ino, change },
        Response::Lease { granted } => granted);

    metadata_call!(
        /// Gives leases back.
        release_leases(this, inos: Vec<Ino>) -> (),
        Request::ReleaseLeases { instance: this.instance(), ns: this.ns, inos },
        Response::Ok => ());

    metadata_call!(
        /// The value of extended attribute `name` of `ino`.
        get_xattr(this, ino: Ino, name: &[u8]) -> Vec<u8>,
        Request::GetXattr { instance: this.instance(), ns: this.ns, ino, name: name.to_vec() },
        Response::Xattr(v) => v);

    metadata_call!(
        /// The names of `ino`'s extended attributes.
        list_xattr(this, ino: Ino) -> Vec<Vec<u8>>,
        Request::ListXattr { instance: this.instance(), ns: this.ns, ino },
        Response::XattrNames(v) => v);

    metadata_call!(
        /// Sets extended attribute `name` of `ino` (`flags`: `XATTR_CREATE`, `XATTR_REPLACE`).
        set_xattr(this, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Attr,
        Request::SetXattr { instance: this.instance(), ns: this.ns, ino, name: name.to_vec(), value: value.to_vec(), flags },
        Response::Attr(a) => a);

    metadata_call!(
        /// Removes extended attribute `name` of `ino`.
        remove_xattr(this, ino: Ino, name: &[u8]) -> Attr,
        Request::RemoveXattr { instance: this.instance(), ns: this.ns, ino, name: name.to_vec() },
        Response::Attr(a) => a);

    metadata_call!(
        /// A cache namespace's drain journal: up to `max` entries after `after`, and how many
        /// are pending in all.
        /// Also the files among them a mount has open (the drain holds back only these).
        drain_poll(this, after: u64, max: u32) -> (Vec<surge_proto::DrainEntry>, u64, Vec<Ino>),
        Request::DrainPoll { instance: this.instance(), ns: this.ns, after, max },
        Response::DrainBatch { entries, pending, open, .. } => (entries, pending, open));

    metadata_call!(
        /// Cache namespaces: file `ino` is written through to the PFS from now on; the
        /// sequence number of its `DrainOp::Through` journal entry.
        cache_through(this, ino: Ino) -> u64,
        Request::CacheThrough { instance: this.instance(), ns: this.ns, ino },
        Response::Through { seq } => seq);

    metadata_call!(
        /// Cache namespaces: one step of the lazy fill of file `ino`
        /// (`surge_proto::FillStep`); the file's `through` after it.
        cache_fill(this, ino: Ino, step: surge_proto::FillStep) -> u64,
        Request::CacheFill { instance: this.instance(), ns: this.ns, ino, step },
        Response::Fill { through } => through);

    metadata_call!(
        /// How far a cache namespace's drain got: the oldest pending journal entry (0: none),
        /// the newest entry ever journaled, and how many are pending. Takes nothing.
        drain_progress(this) -> surge_proto::DrainProgress,
        Request::DrainPoll { instance: this.instance(), ns: this.ns, after: 0, max: 0 },
        Response::DrainBatch { pending, oldest, newest, oldest_entry, .. } => surge_proto::DrainProgress { oldest, newest, pending, oldest_entry });

    metadata_call!(
        /// The journal's entries up to `upto` reached the PFS; `linked`: files whose copy
        /// among them got its fill name (see `Request::DrainAck`).
        drain_ack(this, upto: u64, linked: Vec<Ino>) -> (),
        Request::DrainAck { instance: this.instance(), ns: this.ns, upto, linked },
        Response::Ok => ());

    metadata_call!(
        /// Cache namespaces: takes or renews the hold that makes this session the journal's
        /// only drainer, or gives it back (`release`); `Busy` while another session holds it
        /// (see `Request::DrainHold`).
        drain_hold(this, release: bool) -> (),
        Request::DrainHold { instance: this.instance(), ns: this.ns, release },
        Response::Ok => ());

    metadata_call!(
        /// Cache namespaces: the attributes of `ino`, which this session opens (the metadata
        /// server then does not evict it).
        cache_open(this, ino: Ino) -> Attr,
        Request::CacheOpen { instance: this.instance(), ns: this.ns, ino },
        Response::Attr(a) => { this.note_layout(&a); a });

    metadata_call!(
        /// Cache namespaces: this session's files `open` (renewed) and `closed` since its last
        /// report; with `count`, the namespace's dirty bytes and those of files open nowhere
        /// (zeros otherwise); the oldest pending journal entry.
        cache_use(this, open: Vec<Ino>, closed: Vec<Ino>, count: bool) -> (u64, u64, u64),
        Request::CacheUse { instance: this.instance(), ns: this.ns, open, closed, count },
        Response::CacheState { dirty, dirty_closed, oldest } => (dirty, dirty_closed, oldest));

    metadata_call!(
        /// Cache namespaces: evicts clean files (not `ino`) holding `want` bytes, least
        /// recently used first; this session holds their fill claims (see
        /// `Request::CacheEvict`).
        cache_evict(this, ino: Ino, want: u64) -> Vec<Attr>,
        Request::CacheEvict { instance: this.instance(), ns: this.ns, ino, want },
        Response::Evicted(files) => files);

    /// A connection to the metadata server of its own, for [`wait_recall`](Self::wait_recall).
    pub async fn recall_connection(&self) -> Result<Arc<crate::conn::Connection>> {
        self.mds.dedicated().await
    }

    /// Waits up to `wait_ms` for the metadata server to recall leases of this session, on
    /// `conn` (from [`recall_connection`](Self::recall_connection)); returns the directories,
    /// and the unlinked files a mount that went left open whose objects this one is to remove
    /// (the metadata server forgot them).
    pub async fn wait_recall(
        &self,
        conn: &crate::conn::Connection,
        wait_ms: u32,
    ) -> Result<(Vec<Ino>, Vec<surge_proto::Unlinked>)> {
        let req = Request::WaitRecall {
            instance: self.instance(),
            ns: self.ns,
            wait_ms,
        };
        self.counts.note(&req);
        match conn.call(&req, &[]).await? {
            (Response::Recall { dirs, reap }, _) => Ok((dirs, reap)),
            (Response::Error(e), _) => Err(ClientError::Remote {
                server: self.mds.server.id.clone(),
                error: e,
            }),
            (other, _) => Err(self.unexpected(&self.mds.server, &req, other)),
        }
    }

    metadata_call!(
        /// `F_GETLK` at the namespace's lock service: the first conflicting lock of another
        /// owner, if any (see `Request::Lock`).
        lock_test(this, owner: LockOwner, range: LockRange) -> Option<LockHeld>,
        Request::Lock { instance: this.instance(), ns: this.ns, op: LockOp::Test { owner, range } },
        Response::Lock(held) => held);

    metadata_call!(
        /// `F_SETLK`, or one try of `F_SETLKW` (`waiting`): `None` when done, else the lock
        /// in the way (see `Request::Lock`).
        lock_set(this, owner: LockOwner, range: LockRange, pid: u32, waiting: bool) -> Option<LockHeld>,
        Request::Lock { instance: this.instance(), ns: this.ns, op: LockOp::Set { owner, range, pid, waiting } },
        Response::Lock(held) => held);

    metadata_call!(
        /// Asks again for a lock this session held before its lock-keeper connection broke
        /// (a restarted metadata server grants it during its grace period): `None` when
        /// granted, else the lock in the way (the lock is lost).
        lock_reclaim(this, owner: LockOwner, range: LockRange, pid: u32) -> Option<LockHeld>,
        Request::Lock { instance: this.instance(), ns: this.ns, op: LockOp::Reclaim { owner, range, pid } },
        Response::Lock(held) => held);

    metadata_call!(
        /// Releases every lock of kernel owner `owner` on `ino` (a close).
        lock_release(this, ino: Ino, owner: u64) -> (),
        Request::Lock { instance: this.instance(), ns: this.ns, op: LockOp::Release { ino, owner } },
        Response::Ok => ());

    metadata_call!(
        /// `O_APPEND`: reserves `len` bytes at the end of `ino` at the metadata server; where
        /// they start, and the attributes after (see `Request::Append`).
        append(this, ino: Ino, len: u64) -> (u64, Attr),
        Request::Append { instance: this.instance(), ns: this.ns, ino, len },
        Response::Appended { offset, attr } => (offset, attr));

    metadata_call!(
        /// Tells the metadata server that this session holds `inos` open with no name (a
        /// restarted server keeps those it found so for this mount), and takes the unlinked
        /// files mounts that went left open: the server forgot them; their objects are this
        /// mount's to remove.
        claim_orphans(this, inos: Vec<Ino>) -> Vec<surge_proto::Unlinked>,
        Request::ClaimOrphans { instance: this.instance(), ns: this.ns, inos },
        Response::Recall { reap, .. } => reap);

    /// A connection to the metadata server of its own, for [`lock_keep`](Self::lock_keep):
    /// this session's locks live while it is open.
    pub async fn lock_connection(&self) -> Result<Arc<crate::conn::Connection>> {
        self.mds.dedicated().await
    }

    /// The lock keeper's long poll on `conn` (from [`lock_connection`](Self::lock_connection)):
    /// waits up to `wait_ms` for a release of a lock of the namespace after the `after`-th;
    /// returns the release count.
    pub async fn lock_keep(
        &self,
        conn: &crate::conn::Connection,
        after: u64,
        wait_ms: u32,
    ) -> Result<u64> {
        let req = Request::Lock {
            instance: self.instance(),
            ns: self.ns,
            op: LockOp::Keep { after, wait_ms },
        };
        self.counts.note(&req);
        match conn.call(&req, &[]).await? {
            (Response::LocksReleased(n), _) => Ok(n),
            (Response::Error(e), _) => Err(ClientError::Remote {
                server: self.mds.server.id.clone(),
                error: e,
            }),
            (other, _) => Err(self.unexpected(&self.mds.server, &req, other)),
        }
    }

    metadata_call!(
        /// Removes an empty directory; returns the parent's attributes after.
        rmdir(this, parent: Ino, name: &[u8]) -> Attr,
        Request::Rmdir { instance: this.instance(), ns: this.ns, parent, name: name.to_vec() },
        Response::DirChanged(a) => a);

    metadata_call!(rename(this, parent: Ino, name: &[u8], new_parent: Ino, new_name: &[u8], flags: u32, keep: KeepOpen) -> Option<Unlinked>,
        Request::Rename { instance: this.instance(), ns: this.ns, parent, name: name.to_vec(), new_parent, new_name: new_name.to_vec(), flags, keep },
        Response::Renamed { replaced } => replaced);

    metadata_call!(readlink(this, ino: Ino) -> Vec<u8>,
        Request::Readlink { instance: this.instance(), ns: this.ns, ino },
        Response::Target(t) => t);

    metadata_call!(
        /// One page of a directory listing after `after` (0 to start).
        readdir(this, ino: Ino, after: u64, max: u32, plus: bool) -> DirPage,
        Request::ReadDir { instance: this.instance(), ns: this.ns, ino, after, max, plus },
        Response::Dir { entries, done, dir, default_acl } => DirPage { entries, done, dir, default_acl });

    metadata_call!(
        /// Records written data: size = max(size, `size`), mtime. `writing`: this client
        /// still has the file open for writing after this commit (see
        /// [`Request::CommitWrite`]).
        commit_write(this, ino: Ino, size: u64, mtime: TimeSet, writing: bool) -> Attr,
        Request::CommitWrite { instance: this.instance(), ns: this.ns, ino, size, mtime, writing },
        Response::Attr(a) => a);

    metadata_call!(
        /// File `ino` opened for writing by this client (see [`Request::OpenWrite`]): its
        /// attributes, after the atime moved when `atime` is `Some(strict)`.
        open_write(this, ino: Ino, atime: Option<bool>) -> Attr,
        Request::OpenWrite { instance: this.instance(), ns: this.ns, ino, atime },
        Response::Attr(a) => a);

    metadata_call!(
        /// The objects of file `ino` (marked [`surge_proto::FL_RECOVER`]) reach byte `size`
        /// (see [`Request::Recovered`]): the attributes after.
        recovered(this, ino: Ino, size: u64) -> Attr,
        Request::Recovered { instance: this.instance(), ns: this.ns, ino, size },
        Response::Attr(a) => a);

    metadata_call!(
        /// This client is done with the namespace: every file it opened is closed (see
        /// [`Request::Goodbye`]).
        goodbye(this) -> (),
        Request::Goodbye { instance: this.instance(), ns: this.ns },
        Response::Ok => ());

    /// Polls a cache namespace's drain (every 5 ms at first, backing off to 100 ms) until
    /// every change journaled up to entry `target` reached the PFS. `check` sees each progress
    /// that is not there yet and ends the wait with its error (a time limit, a stalled drain).
    pub async fn wait_drained<E: From<ClientError>>(
        &self,
        target: u64,
        check: impl FnMut(&surge_proto::DrainProgress) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        self.wait_progress(|p| p.drained_upto(target), check).await
    }

    /// [`Self::wait_drained`] for the journal's order only: until the drain applied every entry
    /// up to `target` (`DrainProgress::applied_upto`; what a switch to writing through waits
    /// for).
    pub async fn wait_applied<E: From<ClientError>>(
        &self,
        target: u64,
        check: impl FnMut(&surge_proto::DrainProgress) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        self.wait_progress(|p| p.applied_upto(target), check).await
    }

    async fn wait_progress<E: From<ClientError>>(
        &self,
        done: impl Fn(&surge_proto::DrainProgress) -> bool,
        mut check: impl FnMut(&surge_proto::DrainProgress) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            let p = self.drain_progress().await?;
            if done(&p) {
                return Ok(());
            }
            check(&p)?;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
    }

    /// Removes an unlinked file's objects and forgets its inode.
    pub async fn purge(&self, ino: Ino, size: u64) -> Result<()> {
        self.remove_objects(ino, size).await?;
        let req = Request::Purge {
            instance: self.instance(),
            ns: self.ns,
            ino,
        };
        expect!(self, self.mds, req, Response::Ok => ())
    }

    /// What the instance has left on the server of fragment `frag` (the space its fragments
    /// there share).
    pub async fn room_at(&self, frag: u32) -> Result<u64> {
        let req = Request::FragmentUsage {
            instance: self.instance(),
            fragment: frag,
        };
        expect!(self, self.frags[frag as usize], req, Response::Usage { room, .. } => room)
    }

    /// Capacity, use (summed over fragments) and inode count.
    pub async fn usage(&self) -> Result<Usage> {
        let calls = self.frags.iter().enumerate().map(|(i, pool)| async move {
            let req = Request::FragmentUsage {
                instance: self.instance(),
                fragment: i as u32,
            };
            expect!(self, pool, req, Response::Usage { capacity, used, .. } => (capacity, used))
        });
        let mut u = Usage {
            capacity: 0,
            used: 0,
            inodes: 0,
        };
        for r in join_all(calls).await {
            let (c, used) = r?;
            u.capacity += c;
            u.used += used;
        }
        let req = Request::NamespaceStats {
            instance: self.instance(),
            ns: self.ns,
        };
        u.inodes = expect!(self, self.mds, req, Response::NamespaceStats { inodes } => inodes)?;
        Ok(u)
    }

    // --- data ---

    fn split(pieces: Vec<Piece>) -> Vec<Piece> {
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            let mut done = 0;
            while done < p.len {
                let len = (p.len - done).min(MAX_PIECE);
                out.push(Piece {
                    fragment: p.fragment,
                    object_offset: p.object_offset + done,
                    buf_offset: p.buf_offset + done,
                    len,
                });
                done += len;
            }
        }
        out
    }

    /// `O_APPEND` to `ino` when it is a file of one stripe (its object is the file): `data`
    /// is appended at the object's end by the server holding it, beside what a node's kernel
    /// appends straight into the object (passthrough), the object first extended to
    /// `at_least`; where it was written. None for a file of several stripes (whose appends
    /// the metadata server places, see [`append`](Self::append)).
    pub async fn append_object(&self, ino: Ino, at_least: u64, data: &[u8]) -> Result<Option<u64>> {
        let layout = self.layout_of(ino).await?;
        if !layout.single_object() || data.len() as u64 > MAX_PIECE {
            return Ok(None);
        }
        let fragment = layout.start;
        let req = Request::AppendObject {
            instance: self.instance(),
            fragment,
            file: self.file_id(ino),
            at_least,
        };
        self.counts.note(&req);
        let pool = &self.frags[fragment as usize];
        let (resp, _) = pool.call(&req, data).await?;
        match resp {
            Response::ObjectAppended { offset } => Ok(Some(offset)),
            other => Err(self.unexpected(&pool.server, &req, other)),
        }
    }

    /// Writes `data` at `offset` of file `ino`, all stripes in parallel. Returns the bytes
    /// written from `offset` on: short when a later stripe failed (e.g. its fragment is full),
    /// an error when the first one did.
    pub async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u64> {
        let file = self.file_id(ino);
        let pieces = Self::split(self.layout_of(ino).await?.pieces(offset, data.len() as u64));
        // One piece's request, its server and its bytes.
        let piece = |p: &Piece| {
            let req = Request::Write {
                instance: self.instance(),
                fragment: p.fragment,
                file,
                offset: p.object_offset,
            };
            self.counts.note(&req);
            let bytes = &data[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
            (req, &self.frags[p.fragment as usize], bytes)
        };
        let written = |pool: &ServerPool, req: &Request, resp| match resp {
            Response::Written { len } => Ok(len),
            other => Err(self.unexpected(&pool.server, req, other)),
        };
        // A write within one stripe, on a thread running requests inline (a small write, see
        // `FuseAdapter::write`): sent from that thread, one round trip without a wake-up of
        // the runtime each way.
        if let ([p], true) = (pieces.as_slice(), crate::blocking::is_inline()) {
            let (req, pool, bytes) = piece(p);
            let resp = crate::blocking::call_with(pool, &req, bytes)?;
            return written(pool, &req, resp);
        }
        let calls = pieces.iter().map(|p| async move {
            let (req, pool, bytes) = piece(p);
            let (resp, _) = pool.call(&req, bytes).await?;
            written(pool, &req, resp)
        });
        let results = join_all(calls).await;
        let mut done = 0;
        for (p, r) in pieces.iter().zip(results) {
            match r {
                Ok(n) if n == p.len => done += n,
                Ok(n) => {
                    done += n;
                    break;
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    /// Reads `len` bytes at `offset` of file `ino` into a new buffer; holes and bytes past the
    /// end of an object read as zeros. The caller bounds the range by the file size.
    pub async fn read(&self, ino: Ino, offset: u64, len: u64) -> Result<Vec<u8>> {
        // A read within one stripe of a fragment (a 1 MiB read of a striped file): the
        // object's bytes (this host's fragment) or the server's reply are the buffer, with no
        // zeroed buffer to copy them into.
        if let [p] = Self::split(self.layout_of(ino).await?.pieces(offset, len)).as_slice() {
            let mut data = match self.read_local_vec(p.fragment, ino, p.object_offset, p.len) {
                Some(d) => d,
                None => self.read_piece(self.file_id(ino), p).await?,
            };
            data.truncate(len as usize);
            data.resize(len as usize, 0);
            return Ok(data);
        }
        let mut buf = vec![0u8; len as usize];
        self.read_into(ino, offset, &mut buf).await?;
        Ok(buf)
    }

    /// The object a read of `len` bytes at `offset` lies in whole, and where in it, when that
    /// object is on this host and this client can open it (a read within one stripe of this
    /// host's fragment): the caller reads it into a buffer of its choosing (a FUSE reply's
    /// ring entry), with no buffer of this client in between. `None`: use [`read`](Self::read).
    pub async fn local_source(
        &self,
        ino: Ino,
        offset: u64,
        len: u64,
    ) -> Result<Option<(Arc<std::fs::File>, u64)>> {
        if let [p] = Self::split(self.layout_of(ino).await?.pieces(offset, len)).as_slice() {
            if p.len == len {
                return Ok(self
                    .local_object(p.fragment, ino)
                    .map(|f| (f, p.object_offset)));
            }
        }
        Ok(None)
    }

    /// Like [`read`](Self::read) into a caller's buffer (which must be zeroed or be fully
    /// overwritten: short object reads leave their tail untouched). Stripes on fragments of
    /// this host whose objects this client can open are read from them directly.
    pub async fn read_into(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<()> {
        let file = self.file_id(ino);
        let mut pieces = Self::split(self.layout_of(ino).await?.pieces(offset, buf.len() as u64));
        pieces.retain(|p| {
            let part = &mut buf[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
            !self.read_local(p.fragment, ino, p.object_offset, part)
        });
        let results = join_all(pieces.iter().map(|p| self.read_piece(file, p))).await;
        for (p, r) in pieces.iter().zip(results) {
            let data = r?;
            let start = p.buf_offset as usize;
            let n = data.len().min(p.len as usize);
            buf[start..start + n].copy_from_slice(&data[..n]);
            buf[start + n..start + p.len as usize].fill(0);
        }
        Ok(())
    }

    /// One piece of a read, from the fragment's server: what the object holds of it (shorter
    /// past the object's end).
    async fn read_piece(&self, file: FileId, p: &Piece) -> Result<Vec<u8>> {
        let req = Request::Read {
            instance: self.instance(),
            fragment: p.fragment,
            file,
            offset: p.object_offset,
            len: p.len as u32,
        };
        self.counts.note(&req);
        let pool = &self.frags[p.fragment as usize];
        let (resp, payload) = pool.call(&req, &[]).await?;
        match resp {
            Response::Data => Ok(payload),
            other => Err(self.unexpected(&pool.server, &req, other)),
        }
    }

    /// The directory of fragment `frag` when it is on this host and its objects may be read
    /// here directly (not in a cache instance, whose objects a switch to the PFS removes
    /// while files are open).
    fn local_read_dir(&self, frag: u32) -> Option<&std::path::PathBuf> {
        if self.desc.cache_pfs.is_some() {
            return None;
        }
        self.local_dirs.get(frag as usize).and_then(|d| d.get())
    }

    /// Reads `out` at `offset` of the object of `ino` on fragment `frag` when the fragment is
    /// on this host and its object can be opened here; what lies past the object's end reads
    /// as zeros, as from its server. False (nothing read) otherwise, or on any error: the
    /// caller asks the server, which says what is wrong. Not for cache instances, whose
    /// objects a switch to the PFS removes while files are open.
    fn read_local(&self, frag: u32, ino: Ino, offset: u64, out: &mut [u8]) -> bool {
        let Some(obj) = self.local_object(frag, ino) else {
            return false;
        };
        match surge_core::sys::read_full_at(&obj, out, offset) {
            Ok(got) => {
                out[got..].fill(0);
                true
            }
            Err(_) => false,
        }
    }

    /// Like [`read_local`](Self::read_local), `len` bytes into a new buffer that is not zeroed
    /// first (shorter past the object's end); `None` where the server must answer.
    fn read_local_vec(&self, frag: u32, ino: Ino, offset: u64, len: u64) -> Option<Vec<u8>> {
        let obj = self.local_object(frag, ino)?;
        let mut buf = Vec::new();
        surge_core::sys::read_full_at_append(&obj, &mut buf, len as usize, offset).ok()?;
        Some(buf)
    }

    /// The object of `ino` on fragment `frag`, opened here (kept open for the next reads),
    /// when the fragment is on this host and the object can be opened; `None` otherwise (the
    /// server answers; a fragment whose objects cannot be opened here is not tried again).
    fn local_object(&self, frag: u32, ino: Ino) -> Option<Arc<std::fs::File>> {
        let dir = self.local_read_dir(frag)?;
        let obj = {
            let mut r = self.local_reads.lock();
            match r.open.get(&(frag, ino)) {
                Some(f) => f.clone(),
                None if r.refused.contains(&frag) => return None,
                None => {
                    let path = dir.join(surge_core::layout::object_name(self.file_id(ino)));
                    match std::fs::File::open(&path) {
                        Ok(f) => {
                            if r.open.len() >= LOCAL_READS_OPEN {
                                // Any one: its next read opens it again.
                                if let Some(k) = r.open.keys().next().copied() {
                                    r.open.remove(&k);
                                }
                            }
                            let f = Arc::new(f);
                            r.open.insert((frag, ino), f.clone());
                            f
                        }
                        // Not made yet: the server answers (zeros) and may make it meanwhile.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                        Err(e) => {
                            tracing::debug!(
                                "fragment {frag}: its objects cannot be read here ({e}): \
                                 reads go to its server"
                            );
                            r.refused.insert(frag);
                            return None;
                        }
                    }
                }
            }
        };
        Some(obj)
    }

    /// Cuts the objects of a file shrinking from `old_size` to `new_size`.
    pub async fn truncate_objects(&self, ino: Ino, old_size: u64, new_size: u64) -> Result<()> {
        let layout = self.layout_of(ino).await?;
        let file = self.file_id(ino);
        let calls = (0..self.fragments())
            .filter(|&f| layout.object_len(f, old_size) > layout.object_len(f, new_size))
            .map(|f| async move {
                let req = Request::TruncateObject {
                    instance: self.instance(),
                    fragment: f,
                    file,
                    len: layout.object_len(f, new_size),
                };
                expect!(self, self.frags[f as usize], req, Response::Ok => ())
            });
        join_all(calls).await.into_iter().collect()
    }

    /// `fallocate(2)` on the file range `[offset, offset + len)`: one request per fragment
    /// holding part of it, for that fragment's (contiguous, stripes being packed) object range.
    pub async fn allocate_objects(
        &self,
        ino: Ino,
        offset: u64,
        len: u64,
        mode: AllocMode,
    ) -> Result<()> {
        let file = self.file_id(ino);
        let mut ranges: Vec<Option<(u64, u64)>> = vec![None; self.fragments() as usize];
        for p in self.layout_of(ino).await?.pieces(offset, len) {
            let r = &mut ranges[p.fragment as usize];
            let end = p.object_offset + p.len;
            *r = Some(r.map_or((p.object_offset, end), |(s, e)| {
                (s.min(p.object_offset), e.max(end))
            }));
        }
        let calls = ranges.into_iter().enumerate().filter_map(|(f, r)| {
            let (start, end) = r?;
            Some(async move {
                let req = Request::AllocateObject {
                    instance: self.instance(),
                    fragment: f as u32,
                    file,
                    offset: start,
                    len: end - start,
                    mode,
                };
                expect!(self, self.frags[f], req, Response::Ok => ())
            })
        });
        join_all(calls).await.into_iter().collect()
    }

    /// Removes the objects of a file of `size` bytes. A file whose layout this client never
    /// saw (and whose inode the metadata server may have forgotten already) has its objects
    /// removed from every fragment that may hold one.
    pub async fn remove_objects(&self, ino: Ino, size: u64) -> Result<()> {
        let seen = self.layouts.lock().remove(ino);
        self.local_reads.lock().open.retain(|(_, i), _| *i != ino);
        let layout = seen.map(|l| self.resolve_layout(ino, l));
        let file = self.file_id(ino);
        let calls = (0..self.fragments())
            .filter(|&f| layout.is_none_or(|l| l.object_len(f, size) > 0))
            .map(|f| async move {
                let req = Request::RemoveObject {
                    instance: self.instance(),
                    fragment: f,
                    file,
                };
                expect!(self, self.frags[f as usize], req, Response::Ok => ())
            });
        join_all(calls).await.into_iter().collect()
    }

    /// How far the objects of file `ino` reach, as a file offset: the end of the furthest byte
    /// any fragment's object holds (0 when none holds any). Every fragment of the layout is
    /// asked (a file marked [`surge_proto::FL_RECOVER`] may hold bytes past its size anywhere);
    /// objects on this host are measured here.
    pub async fn objects_reach(&self, ino: Ino) -> Result<u64> {
        let layout = self.layout_of(ino).await?;
        let file = self.file_id(ino);
        let calls = (0..self.fragments())
            .filter(|&f| layout.object_len(f, surge_proto::EXTENT_UNKNOWN) > 0)
            .map(|f| async move {
                let len = match self.local_object(f, ino).and_then(|o| o.metadata().ok()) {
                    Some(md) => md.len(),
                    None => {
                        let req = Request::ObjectLength {
                            instance: self.instance(),
                            fragment: f,
                            file,
                        };
                        expect!(self, self.frags[f as usize], req, Response::Length { len } => len)?
                    }
                };
                Ok(match len {
                    0 => 0,
                    n => layout
                        .file_offset_of(f, n - 1)
                        .map_or(0, |o| o.saturating_add(1)),
                })
            });
        let mut reach = 0u64;
        for r in join_all(calls).await {
            reach = reach.max(r?);
        }
        Ok(reach)
    }

    /// The bytes the devices allocated to the objects of file `ino`, `size` bytes long, summed
    /// over the fragments holding part of it: what `st_blocks` reports (a hole costs nothing).
    /// Objects on this host are measured here, the others by their servers.
    pub async fn allocated(&self, ino: Ino, size: u64) -> Result<u64> {
        let layout = self.layout_of(ino).await?;
        let file = self.file_id(ino);
        let calls = (0..self.fragments())
            .filter(|&f| layout.object_len(f, size) > 0)
            .map(|f| async move {
                if let Some(md) = self.local_object(f, ino).and_then(|o| o.metadata().ok()) {
                    use std::os::unix::fs::MetadataExt;
                    return Ok(md.blocks() * 512);
                }
                let req = Request::ObjectAllocated {
                    instance: self.instance(),
                    fragment: f,
                    file,
                };
                expect!(self, self.frags[f as usize], req, Response::Allocated { bytes } => bytes)
            });
        let mut total = 0u64;
        for r in join_all(calls).await {
            total = total.saturating_add(r?);
        }
        Ok(total)
    }

    /// `SEEK_DATA` (`hole` false) or `SEEK_HOLE` in file `ino`, `size` bytes long, from
    /// `offset` (below `size`): every fragment holding part of the file is asked for its next
    /// data or hole from the object offset of its first byte at or after `offset`, mapped back
    /// to a file offset; the nearest wins. `None`: no data at or after `offset` (ENXIO). A hole
    /// found is at most `size` (the end of a file is a hole).
    pub async fn seek(&self, ino: Ino, size: u64, offset: u64, hole: bool) -> Result<Option<u64>> {
        let layout = self.layout_of(ino).await?;
        let file = self.file_id(ino);
        let calls = (0..self.fragments())
            .filter(|&f| layout.object_len(f, size) > 0)
            .filter_map(|f| {
                let from = layout.object_offset_from(f, offset)?;
                Some(async move {
                    let found = match self.local_object(f, ino) {
                        Some(o) => surge_core::sys::seek_data_or_hole(&o, from, hole).map_err(
                            |e| ClientError::local(libc::EIO, format!("seek in object: {e}")),
                        )?,
                        None => {
                            let req = Request::SeekObject {
                                instance: self.instance(),
                                fragment: f,
                                file,
                                offset: from,
                                hole,
                            };
                            expect!(self, self.frags[f as usize], req, Response::Seek { offset } => offset)?
                        }
                    };
                    Ok(found.and_then(|o| layout.file_offset_of(f, o)))
                })
            });
        let mut nearest: Option<u64> = None;
        for r in join_all(calls).await {
            if let Some(o) = r? {
                nearest = Some(nearest.map_or(o, |n| n.min(o)));
            }
        }
        Ok(if hole {
            Some(nearest.map_or(size, |n| n.min(size)))
        } else {
            nearest.filter(|&o| o < size)
        })
    }

    /// Flushes the objects on the given fragments (bit i = fragment i) to stable storage.
    pub async fn sync_objects(&self, ino: Ino, fragments: u64) -> Result<()> {
        let file = self.file_id(ino);
        let calls = (0..self.fragments().min(64))
            .filter(|f| fragments & (1u64 << f) != 0)
            .map(|f| async move {
                // An object on this host that this client can open is synced here (the
                // server's writes are in the same page cache): no round trip. Its server
                // is asked when that fails.
                if let Some(obj) = self.local_object(f, ino) {
                    match obj.sync_data() {
                        Ok(()) => return Ok(()),
                        Err(e) => tracing::debug!(
                            "fragment {f}: cannot sync inode {ino}'s object here ({e}): \
                             asking its server"
                        ),
                    }
                }
                let req = Request::SyncObject {
                    instance: self.instance(),
                    fragment: f,
                    file,
                };
                expect!(self, self.frags[f as usize], req, Response::Ok => ())
            });
        join_all(calls).await.into_iter().collect()
    }

    /// For a file whose bytes lie in one object (stripe count 1) on a fragment whose server
    /// is on this host: that object, opened read-write, to hand to the kernel (FUSE
    /// passthrough). `None` when the file is striped over several objects or its fragment's
    /// server is elsewhere (remembered per fragment).
    pub async fn open_local_object(&self, ino: Ino) -> Result<Option<std::fs::File>> {
        use std::sync::atomic::Ordering;
        let layout = self.layout_of(ino).await?;
        if !layout.single_object() {
            return Ok(None);
        }
        let frag = layout.start as usize;
        if self.remote[frag].load(Ordering::Relaxed) {
            return Ok(None);
        }
        if let Some(dir) = self.local_dirs[frag].get() {
            // The fragment is known to be here: open the object directly. A missing one is
            // made here too when this process is the fragment directory's owner (the server's
            // user), else by its server, so it gets the server's ownership (a root mount must
            // not leave objects its servers' user cannot write).
            let path = dir.join(surge_core::layout::object_name(self.file_id(ino)));
            let mine = *self.local_owner[frag].get_or_init(|| {
                use std::os::unix::fs::MetadataExt;
                // SAFETY: geteuid has no preconditions.
                let me = unsafe { libc::geteuid() };
                std::fs::metadata(dir).is_ok_and(|m| m.uid() == me)
            });
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(mine)
                .truncate(false)
                // As the servers make them: private to their user (docs/SECURITY.md).
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => return Ok(Some(f)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ClientError::local(
                        e.raw_os_error().unwrap_or(libc::EIO),
                        format!("cannot open {}: {e}", path.display()),
                    ))
                }
            }
        }
        let req = Request::LocalObject {
            instance: self.instance(),
            fragment: layout.start,
            file: self.file_id(ino),
        };
        let (path, dev, obj_ino) = expect!(self, self.frags[frag], req, Response::LocalObject { path, dev, ino } => (path, dev, ino))?;
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(_) => {
                self.remote[frag].store(true, Ordering::Relaxed);
                return Ok(None);
            }
        };
        use std::os::unix::fs::MetadataExt;
        match f.metadata() {
            Ok(md) if md.dev() == dev && md.ino() == obj_ino => {
                if let Some(dir) = std::path::Path::new(&path).parent() {
                    let _ = self.local_dirs[frag].set(dir.to_path_buf());
                }
                Ok(Some(f))
            }
            // Same path, another file: the server is on another host.
            _ => {
                self.remote[frag].store(true, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    /// Tells the server an object changed without it (passthrough writes of a file in one
    /// object), for accounting.
    pub async fn object_changed(&self, ino: Ino) -> Result<()> {
        let frag = self.layout_of(ino).await?.start;
        let req = Request::ObjectChanged {
            instance: self.instance(),
            fragment: frag,
            file: self.file_id(ino),
        };
        expect!(self, self.frags[frag as usize], req, Response::Ok => ())
    }

    /// Whether fragment `frag`'s server runs on this host (its directory is the very one
    /// this host sees at its path); asked once per fragment.
    pub async fn fragment_is_local(&self, frag: u32) -> bool {
        use std::sync::atomic::Ordering;
        let i = frag as usize;
        if i >= self.frags.len() || self.remote[i].load(Ordering::Relaxed) {
            return false;
        }
        if self.local_dirs[i].get().is_some() {
            return true;
        }
        let req = Request::LocalFragment {
            instance: self.instance(),
            fragment: frag,
        };
        let r: Result<(String, u64, u64)> = async {
            expect!(self, self.frags[i], req, Response::LocalObject { path, dev, ino } => (path, dev, ino))
        }
        .await;
        use std::os::unix::fs::MetadataExt;
        match r {
            Ok((path, dev, ino)) => match std::fs::metadata(&path) {
                Ok(md) if md.dev() == dev && md.ino() == ino => {
                    let _ = self.local_dirs[i].set(path.into());
                    true
                }
                _ => {
                    self.remote[i].store(true, Ordering::Relaxed);
                    false
                }
            },
            Err(e) => {
                tracing::debug!("fragment {frag}: cannot tell whether it is local: {e}");
                false
            }
        }
    }

    /// The fragments whose servers run on this host.
    pub async fn local_fragments(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for f in 0..self.fragments() {
            if self.fragment_is_local(f).await {
                out.push(f);
            }
        }
        out
    }

    /// Bit mask of the fragments a write at `offset` of `len` bytes touches.
    pub fn fragments_touched(&self, ino: Ino, offset: u64, len: u64) -> u64 {
        if self.fragments() > 64 {
            return u64::MAX;
        }
        let Some(recorded) = self.layouts.lock().get(ino) else {
            return u64::MAX;
        };
        let layout = self.resolve_layout(ino, recorded);
        let stripes = len.div_ceil(layout.stripe_size) + 1;
        if stripes >= u64::from(self.fragments()) {
            return u64::MAX;
        }
        layout
            .pieces(offset, len)
            .iter()
            .fold(0, |m, p| m | (1u64 << p.fragment))
    }
}
