//! Executing a plan: directories first (level by level, parents before children), then files
//! and symlinks (`workers` in flight, the largest first; a file larger than `chunk_size` is cut
//! into chunks that are read and written in parallel at their offsets), then the attributes of
//! directories (whose mtimes the copies inside them changed).
//!
//! Every file and symlink is made under a temporary name (see [`crate::names`]) and renamed
//! onto its final name only once its data, size and attributes are complete. A file that fails
//! is removed and reported; the others go on. The work runs in tasks of a `JoinSet`, so dropping
//! the future of [`execute`] aborts everything in flight, leaving at most temporaries behind.
//!
//! Blocks of zeros ([`pfs::HOLE_BLOCK`]) are not written: the destination gets a hole there (it
//! reads back as zeros), so sparse files stay sparse; on the way in, a chunk of zeros is not
//! written to the instance either.

use crate::names::{is_temp_name, temp_name};
use crate::ns::{self, file_name, ROOT};
use crate::plan::{DirEntryPlan, FileEntry, LinkEntry, Meta, Source};
use crate::{pfs, Direction, Plan, Progress, StageError, StageFailure, StageOptions, StageReport};
use parking_lot::Mutex;
use pfs::is_zero;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use surge_client::{ClientError, InstanceClient};
use surge_core::Ino;
use surge_proto::{KeepOpen, NewNode, SetAttr, TimeSet};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use xxhash_rust::xxh3::xxh3_64;

/// Most bytes held in chunk buffers at once (bounds the chunks in flight).
const MAX_BUFFERED: u64 = 256 << 20;
const MIN_CHUNK: u64 = 64 << 10;
const MAX_CHUNK: u64 = 64 << 20;

/// Checks that a stage-in fits in the instance's free capacity; fails before anything is
/// copied when it does not. A stage-out always passes.
pub async fn check_fits(client: &InstanceClient, plan: &Plan) -> Result<(), StageError> {
    if plan.direction != Direction::In {
        return Ok(());
    }
    let u = client.usage().await.map_err(|e| StageError::Instance {
        path: "/".into(),
        source: e,
    })?;
    let free = u.capacity.saturating_sub(u.used);
    let needed = plan.space_needed();
    if needed > free {
        return Err(StageError::NoSpace {
            instance: client.instance().0,
            bytes: plan.bytes,
            needed,
            free,
            capacity: u.capacity,
        });
    }
    Ok(())
}

/// Alignment of direct I/O on the PFS.
const DIRECT_ALIGN: usize = 4096;

/// Reusable chunk buffers (a fresh 8 MiB buffer costs 2048 page faults). Each holds a chunk
/// plus [`DIRECT_ALIGN`] bytes, so that an aligned window of a chunk's size fits in it (see
/// [`aligned`]).
struct BufPool {
    size: usize,
    free: Mutex<Vec<Vec<u8>>>,
}

/// The page-aligned window of `len` bytes in a pool buffer (for `O_DIRECT` writes).
fn aligned(buf: &[u8], len: usize) -> std::ops::Range<usize> {
    let off = (DIRECT_ALIGN - buf.as_ptr() as usize % DIRECT_ALIGN) % DIRECT_ALIGN;
    off..off + len
}

impl BufPool {
    fn get(&self) -> Vec<u8> {
        self.free
            .lock()
            .pop()
            .unwrap_or_else(|| vec![0u8; self.size])
    }

    fn put(&self, b: Vec<u8>) {
        if b.len() == self.size {
            self.free.lock().push(b);
        }
    }
}

/// Shared by every task of one stage.
struct Ctx {
    client: Arc<InstanceClient>,
    opts: StageOptions,
    chunk: u64,
    progress: Arc<Progress>,
    /// Data operations (a chunk, or a small file) in flight.
    data: Arc<Semaphore>,
    buffers: BufPool,
    failures: Mutex<(Vec<StageFailure>, u64)>,
    files: AtomicU64,
    bytes: AtomicU64,
    symlinks: AtomicU64,
    dirs: AtomicU64,
    stale: AtomicU64,
    /// The layout of the files staged in (see [`staged_in_layout`]).
    layout: surge_core::FileLayout,
    /// Directories staged into, and whether they have a default layout of their own.
    dir_defaults: Mutex<std::collections::HashMap<Ino, bool>>,
}

/// The layout of files staged into `client`'s instance where no directory default says
/// otherwise. When every fragment is on this host and this process is root (the embedded
/// default run as root: the job's mount here reads with kernel passthrough), each file is one
/// stripe, spread over the fragments as the instance's rule spreads first stripes, so the
/// job reads it at the fast tier's speed. Otherwise nothing is chosen: the instance's rule
/// (every fragment) or the directory's default.
async fn staged_in_layout(client: &InstanceClient) -> surge_core::FileLayout {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && client.local_fragments().await.len() as u32 == client.fragments() {
        surge_core::FileLayout {
            stripe_size: 0,
            stripe_count: 1,
            start: surge_core::layout::START_ANY,
        }
    } else {
        surge_core::FileLayout::default()
    }
}

impl Ctx {
    /// The layout a file staged into directory `parent` asks for: the stage's choice, unless
    /// the directory has a default of its own (which then applies).
    async fn layout_in(&self, parent: Ino) -> surge_core::FileLayout {
        if self.layout.is_unset() {
            return self.layout;
        }
        if let Some(own) = self.dir_defaults.lock().get(&parent).copied() {
            return if own {
                surge_core::FileLayout::default()
            } else {
                self.layout
            };
        }
        let own = matches!(self.client.getattr(parent).await, Ok(p) if !p.layout.is_unset());
        self.dir_defaults.lock().insert(parent, own);
        if own {
            surge_core::FileLayout::default()
        } else {
            self.layout
        }
    }

    fn fail(&self, path: &str, dest: &Path, error: String) {
        self.progress.file_failed();
        let mut f = self.failures.lock();
        let (list, more) = &mut *f;
        crate::push_failure(
            list,
            more,
            StageFailure {
                path: path.to_string(),
                destination: dest.display().to_string(),
                error,
            },
        );
    }

    /// Owner of a copy on the instance.
    fn owner_in(&self, meta: Option<&Meta>) -> (u32, u32) {
        match (self.opts.preserve_owner, meta) {
            (true, Some(m)) => (m.uid, m.gid),
            _ => self.opts.owner.unwrap_or_else(|| {
                // SAFETY: geteuid/getegid have no preconditions.
                unsafe { (libc::geteuid(), libc::getegid()) }
            }),
        }
    }

    /// Owner to give a copy on the PFS (`None`: leave it to the process).
    fn owner_out(&self, meta: &Meta) -> Option<(u32, u32)> {
        if self.opts.preserve_owner {
            Some((meta.uid, meta.gid))
        } else {
            self.opts.owner
        }
    }

    fn cancelled(&self) -> Result<(), String> {
        if self.progress.is_cancelled() {
            Err("cancelled".into())
        } else {
            Ok(())
        }
    }
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("internal error: {e}"))?
}

/// Copies what `plan` lists. Per-file problems are collected in the report (`failures`);
/// an error is returned only when the stage cannot run at all (a stage-in that does not fit)
/// or was cancelled through [`Progress::cancel`].
pub async fn execute(
    client: Arc<InstanceClient>,
    plan: &Plan,
    opts: &StageOptions,
    progress: Arc<Progress>,
) -> Result<StageReport, StageError> {
    let start = Instant::now();
    progress.begin(plan);
    let r = run(client, plan, opts, progress.clone(), start).await;
    progress.end();
    r
}

async fn run(
    client: Arc<InstanceClient>,
    plan: &Plan,
    opts: &StageOptions,
    progress: Arc<Progress>,
    start: Instant,
) -> Result<StageReport, StageError> {
    check_fits(&client, plan).await?;
    let workers = opts.workers.clamp(1, 4096);
    let chunk = opts.chunk_size.clamp(MIN_CHUNK, MAX_CHUNK);
    let data_slots = workers.min((MAX_BUFFERED / chunk).max(2) as usize);
    let layout = match plan.direction {
        Direction::In => staged_in_layout(&client).await,
        Direction::Out => surge_core::FileLayout::default(),
    };
    let ctx = Arc::new(Ctx {
        layout,
        dir_defaults: Mutex::new(std::collections::HashMap::new()),
        client,
        opts: StageOptions {
            workers,
            chunk_size: chunk,
            ..opts.clone()
        },
        chunk,
        progress,
        data: Arc::new(Semaphore::new(data_slots)),
        buffers: BufPool {
            size: chunk as usize + DIRECT_ALIGN,
            free: Mutex::new(Vec::new()),
        },
        failures: Mutex::new((Vec::new(), 0)),
        files: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        symlinks: AtomicU64::new(0),
        dirs: AtomicU64::new(0),
        stale: AtomicU64::new(0),
    });

    let dirs = match plan.direction {
        Direction::In => make_dirs_in(&ctx, &plan.dir_list).await,
        Direction::Out => {
            let c = ctx.clone();
            let list = plan.dir_list.clone();
            blocking(move || Ok(make_dirs_out(&c, &list)))
                .await
                .unwrap_or_default()
        }
    };
    let parents: Arc<HashMap<PathBuf, Ino>> = Arc::new(
        dirs.iter()
            .filter_map(|d| d.ino.map(|i| (d.plan.dest.clone(), i)))
            .collect(),
    );

    copy_entries(&ctx, plan, &parents).await;

    // A termination that came once every file had landed does not undo the copy: its files
    // are whole and in place, so the stage finishes (directories' attributes, the sync) and
    // reports itself done, never "cancelled" with its files left behind.
    let landed = ctx.files.load(Ordering::Relaxed) >= plan.files
        && ctx.symlinks.load(Ordering::Relaxed) >= plan.symlinks
        && ctx.failures.lock().0.is_empty();
    if ctx.progress.is_cancelled() && !landed {
        return Err(StageError::Cancelled);
    }
    {
        match plan.direction {
            Direction::In => finish_dirs_in(&ctx, &dirs).await,
            Direction::Out => {
                let c = ctx.clone();
                let _ = blocking(move || {
                    finish_dirs_out(&c, &dirs);
                    Ok(())
                })
                .await;
                if ctx.opts.sync {
                    sync_out(&ctx, plan).await;
                }
            }
        }
    }
    let (failures, failures_more) = std::mem::take(&mut *ctx.failures.lock());
    Ok(StageReport {
        files: ctx.files.load(Ordering::Relaxed),
        bytes: ctx.bytes.load(Ordering::Relaxed),
        dirs: ctx.dirs.load(Ordering::Relaxed),
        symlinks: ctx.symlinks.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
        checksummed: ctx.opts.checksum && failures.is_empty(),
        failures,
        failures_more,
        skipped: plan.skipped.clone(),
        stale_temps_removed: ctx.stale.load(Ordering::Relaxed),
    })
}

/// A destination directory after the first phase.
struct MadeDir {
    plan: DirEntryPlan,
    /// Its inode (stage-in), or `Some(0)` for a PFS directory that is there; `None` if it
    /// could not be made.
    ino: Option<Ino>,
    created: bool,
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

// --- directories, stage-in ---

/// Runs `f` on every item in tasks of a `JoinSet` (so that dropping the caller aborts them),
/// at most `limit` at once; results in completion order.
pub(crate) async fn run_bounded<T, R, F, Fut>(items: Vec<T>, limit: usize, f: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limit.max(1)));
    let mut set = JoinSet::new();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let fut = f(item);
        set.spawn(async move {
            let _permit = permit;
            fut.await
        });
        while let Some(r) = set.try_join_next() {
            match r {
                Ok(v) => out.push(v),
                Err(e) => note_panic(Err(e)),
            }
        }
    }
    while let Some(r) = set.join_next().await {
        match r {
            Ok(v) => out.push(v),
            Err(e) => note_panic(Err(e)),
        }
    }
    out
}

async fn make_dirs_in(ctx: &Arc<Ctx>, list: &[DirEntryPlan]) -> Vec<MadeDir> {
    let mut levels: BTreeMap<usize, Vec<DirEntryPlan>> = BTreeMap::new();
    for d in list {
        levels.entry(depth(&d.dest)).or_default().push(d.clone());
    }
    let mut known: HashMap<PathBuf, Ino> = HashMap::from([(PathBuf::from("/"), ROOT)]);
    let mut out = Vec::with_capacity(list.len());
    for (_, level) in levels {
        let snapshot = Arc::new(known.clone());
        let made = run_bounded(level, ctx.opts.workers, |d| {
            let (ctx, known) = (ctx.clone(), snapshot.clone());
            async move {
                match make_dir_in(&ctx, &known, &d).await {
                    Ok((ino, created)) => MadeDir {
                        plan: d,
                        ino: Some(ino),
                        created,
                    },
                    Err(e) => {
                        ctx.fail(&d.source, &d.dest, e);
                        MadeDir {
                            plan: d,
                            ino: None,
                            created: false,
                        }
                    }
                }
            }
        })
        .await;
        for m in &made {
            if let Some(ino) = m.ino {
                known.insert(m.plan.dest.clone(), ino);
            }
        }
        out.extend(made);
    }
    out
}

/// Creates (or finds) one directory: (inode, created by us).
async fn make_dir_in(
    ctx: &Ctx,
    known: &HashMap<PathBuf, Ino>,
    d: &DirEntryPlan,
) -> Result<(Ino, bool), String> {
    if let Some(&ino) = known.get(&d.dest) {
        // The root.
        remove_stale_in(ctx, ino, &d.dest).await?;
        return Ok((ino, false));
    }
    let parent_path = d.dest.parent().unwrap_or(Path::new("/"));
    let parent = match known.get(parent_path) {
        Some(&p) => p,
        None => mkdir_p_in(ctx, parent_path).await?,
    };
    let perm = d.meta.map_or(0o755, |m| m.perm | 0o700);
    let (uid, gid) = ctx.owner_in(d.meta.as_ref());
    let name = file_name(&d.dest);
    match ctx
        .client
        .create(parent, name, NewNode::Dir, perm, uid, gid)
        .await
    {
        Ok(a) => Ok((a.ino, true)),
        Err(e) if ns::is_errno(&e, libc::EEXIST) => {
            let a = ctx
                .client
                .lookup(parent, name)
                .await
                .map_err(|e| format!("cannot look up {}: {e}", d.dest.display()))?;
            if a.kind != surge_proto::FileKind::Dir {
                return Err(format!(
                    "{} exists in the instance and is not a directory",
                    d.dest.display()
                ));
            }
            remove_stale_in(ctx, a.ino, &d.dest).await?;
            Ok((a.ino, false))
        }
        Err(e) => Err(format!("cannot create directory {}: {e}", d.dest.display())),
    }
}

/// `mkdir -p` of a path not in the plan (the parents of an item's destination).
async fn mkdir_p_in(ctx: &Ctx, path: &Path) -> Result<Ino, String> {
    let (uid, gid) = ctx.owner_in(None);
    let mut ino = ROOT;
    let mut at = PathBuf::from("/");
    for c in path.components() {
        let std::path::Component::Normal(n) = c else {
            continue;
        };
        at.push(n);
        let name = n.as_bytes();
        ino = match ctx.client.lookup(ino, name).await {
            Ok(a) if a.kind == surge_proto::FileKind::Dir => a.ino,
            Ok(_) => return Err(format!("{} is not a directory", at.display())),
            Err(e) if ns::is_errno(&e, libc::ENOENT) => {
                match ctx
                    .client
                    .create(ino, name, NewNode::Dir, 0o755, uid, gid)
                    .await
                {
                    Ok(a) => a.ino,
                    // Made meanwhile by a sibling task.
                    Err(e) if ns::is_errno(&e, libc::EEXIST) => {
                        ctx.client
                            .lookup(ino, name)
                            .await
                            .map_err(|e| format!("cannot look up {}: {e}", at.display()))?
                            .ino
                    }
                    Err(e) => return Err(format!("cannot create {}: {e}", at.display())),
                }
            }
            Err(e) => return Err(format!("cannot look up {}: {e}", at.display())),
        };
    }
    Ok(ino)
}

/// Removes the temporaries an interrupted stage left in an existing directory.
async fn remove_stale_in(ctx: &Ctx, dir: Ino, path: &Path) -> Result<(), String> {
    let entries = ns::list_dir(&ctx.client, dir, false)
        .await
        .map_err(|e| format!("cannot list {}: {e}", path.display()))?;
    for e in entries.iter().filter(|e| is_temp_name(&e.name)) {
        match ns::remove(&ctx.client, dir, &e.name).await {
            Ok(()) => {
                ctx.stale.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) if ns::is_errno(&err, libc::ENOENT) => {}
            Err(err) => {
                return Err(format!(
                    "cannot remove the stale temporary {}: {err}",
                    path.join(OsStr::from_bytes(&e.name)).display()
                ))
            }
        }
    }
    Ok(())
}

async fn finish_dirs_in(ctx: &Arc<Ctx>, dirs: &[MadeDir]) {
    let todo: Vec<(Ino, Meta, DirEntryPlan)> = dirs
        .iter()
        .filter_map(|d| Some((d.ino?, d.plan.meta?, d)))
        .filter_map(|(ino, meta, d)| {
            // An item's destination that existed already (the instance root, say) keeps its
            // attributes; everything the stage made, or found inside a tree, gets the
            // source's.
            if d.plan.top && !d.created {
                ctx.dirs.fetch_add(1, Ordering::Relaxed);
                None
            } else {
                Some((ino, meta, d.plan.clone()))
            }
        })
        .collect();
    run_bounded(todo, ctx.opts.workers, |(ino, meta, d)| {
        let ctx = ctx.clone();
        async move {
            let owner = ctx.owner_in(Some(&meta));
            let set = SetAttr {
                perm: Some(meta.perm),
                uid: Some(owner.0),
                gid: Some(owner.1),
                size: None,
                atime: Some(TimeSet::At(meta.atime)),
                mtime: Some(TimeSet::At(meta.mtime)),
                flags: None,
            };
            match ctx.client.setattr(ino, set, 0).await {
                Ok(_) => {
                    ctx.dirs.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => ctx.fail(
                    &d.source,
                    &d.dest,
                    format!("cannot set the attributes of the directory: {e}"),
                ),
            }
        }
    })
    .await;
}

// --- directories, stage-out ---

fn make_dirs_out(ctx: &Ctx, list: &[DirEntryPlan]) -> Vec<MadeDir> {
    // The plan lists parents before children.
    let mut out = Vec::with_capacity(list.len());
    for d in list {
        let r = (|| -> Result<bool, String> {
            match std::fs::symlink_metadata(&d.dest) {
                Ok(md) if md.is_dir() => {
                    let n = pfs::remove_stale_temps(&d.dest).map_err(|e| {
                        format!(
                            "cannot remove stale temporaries in {}: {e}",
                            d.dest.display()
                        )
                    })?;
                    ctx.stale.fetch_add(n, Ordering::Relaxed);
                    Ok(false)
                }
                Ok(_) => Err(format!(
                    "{} exists and is not a directory",
                    d.dest.display()
                )),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if let Some(parent) = d.dest.parent() {
                        crate::pfs::check_links(parent)
                            .map_err(|e| format!("cannot create {}: {e}", d.dest.display()))?;
                        std::fs::create_dir_all(parent)
                            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                    }
                    match std::fs::DirBuilder::new().mode(0o700).create(&d.dest) {
                        Ok(()) => Ok(true),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                        Err(e) => Err(format!("cannot create {}: {e}", d.dest.display())),
                    }
                }
                Err(e) => Err(format!("cannot stat {}: {e}", d.dest.display())),
            }
        })();
        match r {
            Ok(created) => out.push(MadeDir {
                plan: d.clone(),
                ino: Some(0),
                created,
            }),
            Err(e) => {
                ctx.fail(&d.source, &d.dest, e);
                out.push(MadeDir {
                    plan: d.clone(),
                    ino: None,
                    created: false,
                });
            }
        }
    }
    out
}

fn finish_dirs_out(ctx: &Ctx, dirs: &[MadeDir]) {
    // Children first: a parent made read-only must not lock us out of its children.
    for d in dirs.iter().rev() {
        let (Some(_), Some(meta)) = (d.ino, d.plan.meta) else {
            continue;
        };
        if d.plan.top && !d.created {
            ctx.dirs.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        match pfs::finish_dir(&d.plan.dest, &meta, ctx.owner_out(&meta)) {
            Ok(()) => {
                ctx.dirs.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => ctx.fail(
                &d.plan.source,
                &d.plan.dest,
                format!("cannot set the attributes of the directory: {e}"),
            ),
        }
    }
}

async fn sync_out(ctx: &Ctx, plan: &Plan) {
    let mut roots: Vec<PathBuf> = plan
        .dir_list
        .iter()
        .filter(|d| d.top)
        .map(|d| d.dest.clone())
        .collect();
    roots.dedup();
    let r = blocking(move || {
        // One syncfs per file system is enough; distinct tops are few.
        for r in &roots {
            pfs::syncfs(r).map_err(|e| format!("cannot flush {}: {e}", r.display()))?;
        }
        Ok(())
    })
    .await;
    if let Err(e) = r {
        ctx.fail("", Path::new(""), e);
    }
}

// --- files and symlinks ---

enum Work {
    File(FileEntry),
    Link(LinkEntry),
}

async fn copy_entries(ctx: &Arc<Ctx>, plan: &Plan, parents: &Arc<HashMap<PathBuf, Ino>>) {
    let mut work: Vec<Work> = Vec::with_capacity(plan.file_list.len() + plan.link_list.len());
    let mut files = plan.file_list.clone();
    // Largest first: a big file started last would finish alone.
    files.sort_by_key(|f| std::cmp::Reverse(f.size));
    work.extend(files.into_iter().map(Work::File));
    work.extend(plan.link_list.iter().cloned().map(Work::Link));

    let slots = Arc::new(Semaphore::new(ctx.opts.workers));
    let mut set = JoinSet::new();
    for w in work {
        if ctx.progress.is_cancelled() {
            break;
        }
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let ctx = ctx.clone();
        let parents = parents.clone();
        let direction = plan.direction;
        set.spawn(async move {
            let _permit = permit;
            copy_one(&ctx, &parents, direction, w).await;
        });
        while let Some(r) = set.try_join_next() {
            note_panic(r);
        }
    }
    while let Some(r) = set.join_next().await {
        note_panic(r);
    }
}

/// A copy task that panicked is a bug; it must not pass silently.
fn note_panic(r: Result<(), tokio::task::JoinError>) {
    if let Err(e) = r {
        if e.is_panic() {
            tracing::error!("a copy task panicked: {e}");
        }
    }
}

async fn copy_one(ctx: &Ctx, parents: &HashMap<PathBuf, Ino>, direction: Direction, w: Work) {
    let (source, dest, is_link) = match &w {
        Work::File(f) => (f.source_name.clone(), f.dest.clone(), false),
        Work::Link(l) => (l.source_name.clone(), l.dest.clone(), true),
    };
    let r = async {
        ctx.cancelled()?;
        match direction {
            Direction::In => {
                let parent_path = dest.parent().unwrap_or(Path::new("/"));
                let parent = *parents.get(parent_path).ok_or_else(|| {
                    format!(
                        "its directory {} could not be created",
                        parent_path.display()
                    )
                })?;
                match &w {
                    Work::File(f) => file_in(ctx, parent, f).await,
                    Work::Link(l) => link_in(ctx, parent, l).await,
                }
            }
            Direction::Out => match &w {
                Work::File(f) => file_out(ctx, f).await,
                Work::Link(l) => link_out(ctx, l).await,
            },
        }
    }
    .await;
    match r {
        Ok(size) => {
            ctx.progress.file_done();
            if is_link {
                ctx.symlinks.fetch_add(1, Ordering::Relaxed);
            } else {
                ctx.files.fetch_add(1, Ordering::Relaxed);
                ctx.bytes.fetch_add(size, Ordering::Relaxed);
            }
        }
        Err(e) => ctx.fail(&source, &dest, e),
    }
}

// --- stage-in of one file ---

/// Creates a new file (or symlink) under a fresh temporary name in `parent`.
async fn create_temp_in(
    ctx: &Ctx,
    parent: Ino,
    name: &[u8],
    node: NewNode,
    perm: u16,
    owner: (u32, u32),
) -> Result<(Ino, Vec<u8>), String> {
    let mut last = String::new();
    for _ in 0..4 {
        let tmp = temp_name(name);
        let layout = ctx.layout_in(parent).await;
        match ctx
            .client
            .create_in(
                parent,
                &tmp,
                node.clone(),
                perm,
                0,
                owner.0,
                owner.1,
                layout,
            )
            .await
        {
            Ok((a, ..)) => return Ok((a.ino, tmp)),
            Err(e) if ns::is_errno(&e, libc::EEXIST) => last = e.to_string(),
            Err(e) => return Err(format!("cannot create {}: {e}", show(&tmp))),
        }
    }
    Err(format!("cannot find a free temporary name: {last}"))
}

/// Size and times onto the temporary, then the final name (replacing an older copy).
async fn finalize_in(
    ctx: &Ctx,
    parent: Ino,
    ino: Ino,
    tmp: &[u8],
    name: &[u8],
    size: Option<u64>,
    meta: &Meta,
) -> Result<(), String> {
    let set = SetAttr {
        size,
        atime: Some(TimeSet::At(meta.atime)),
        mtime: Some(TimeSet::At(meta.mtime)),
        ..SetAttr::default()
    };
    ctx.client
        .setattr(ino, set, 0)
        .await
        .map_err(|e| format!("cannot set size and times: {e}"))?;
    let replaced = ctx
        .client
        .rename(parent, tmp, parent, name, 0, KeepOpen::Only(vec![]))
        .await
        .map_err(|e| format!("cannot rename {} onto {}: {e}", show(tmp), show(name)))?;
    if let Some(u) = replaced {
        ns::drop_unlinked(&ctx.client, u).await;
    }
    Ok(())
}

fn write_err(offset: u64, e: ClientError) -> String {
    format!("write at offset {offset} failed: {e}")
}

/// Writes `buf[..len]` at `offset` unless it is all zeros (the hole reads back as zeros), and
/// gives the buffer back.
///
/// The write runs in a task of its own that finishes even if the caller is dropped: a request
/// abandoned half-way through sending its payload would leave a broken frame on a connection
/// other files share. An aborted stage thus lets the writes already started land (in
/// temporaries) and starts no new one.
async fn put_in(
    client: &Arc<InstanceClient>,
    ino: Ino,
    offset: u64,
    buf: Vec<u8>,
    len: usize,
) -> (Vec<u8>, Result<(), String>) {
    if len == 0 || is_zero(&buf[..len]) {
        return (buf, Ok(()));
    }
    let client = client.clone();
    let task = tokio::spawn(async move {
        let r = client.write(ino, offset, &buf[..len]).await;
        (buf, r)
    });
    let (buf, r) = match task.await {
        Ok(v) => v,
        Err(e) => return (Vec::new(), Err(format!("internal error: {e}"))),
    };
    let r = match r {
        Ok(n) if n == len as u64 => Ok(()),
        Ok(n) => Err(format!(
            "short write at offset {offset}: {n} of {len} bytes (is the instance full?)"
        )),
        Err(e) => Err(write_err(offset, e)),
    };
    (buf, r)
}

async fn file_in(ctx: &Ctx, parent: Ino, f: &FileEntry) -> Result<u64, String> {
    let Source::Pfs(src) = &f.source else {
        return Err("internal error: a stage-in source must be on the PFS".into());
    };
    let name = file_name(&f.dest);
    // A small file is read whole and written within one data slot.
    let slot = if f.size <= ctx.chunk {
        Some(ctx.data.acquire().await.map_err(|e| e.to_string())?)
    } else {
        None
    };
    let chunk = ctx.chunk;
    let src = src.clone();
    let (file, md, data) = blocking(move || {
        let mut file =
            File::open(&src).map_err(|e| format!("cannot open {}: {e}", src.display()))?;
        let md = file
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", src.display()))?;
        let mut data = None;
        if md.len() <= chunk {
            let mut buf = Vec::with_capacity(md.len() as usize);
            file.read_to_end(&mut buf)
                .map_err(|e| format!("cannot read {}: {e}", src.display()))?;
            data = Some(buf);
        }
        Ok((file, md, data))
    })
    .await?;
    // Attributes as of the bytes read, not as of the plan.
    let meta = pfs::meta_of(&md);
    match data {
        Some(data) => {
            let r = small_file_in(ctx, parent, name, meta, data).await;
            drop(slot);
            r
        }
        None => {
            drop(slot);
            large_file_in(ctx, parent, name, Arc::new(file), md.len(), meta).await
        }
    }
}

async fn small_file_in(
    ctx: &Ctx,
    parent: Ino,
    name: &[u8],
    meta: Meta,
    data: Vec<u8>,
) -> Result<u64, String> {
    let size = data.len() as u64;
    // The size is recorded before any byte is written (see `NewNode::SizedFile`).
    let (ino, tmp) = create_temp_in(
        ctx,
        parent,
        name,
        NewNode::SizedFile { size },
        meta.perm,
        ctx.owner_in(Some(&meta)),
    )
    .await?;
    let r = async {
        let (data, w) = put_in(&ctx.client, ino, 0, data, size as usize).await;
        w?;
        ctx.progress.add_bytes(size);
        if ctx.opts.checksum && size > 0 {
            let back = ctx
                .client
                .read(ino, 0, size)
                .await
                .map_err(|e| format!("cannot read the copy back: {e}"))?;
            if xxh3_64(&back) != xxh3_64(&data) {
                return Err("checksum mismatch: the copy differs from the source".to_string());
            }
        }
        finalize_in(ctx, parent, ino, &tmp, name, Some(size), &meta).await
    }
    .await;
    if let Err(e) = r {
        let _ = ns::remove(&ctx.client, parent, &tmp).await;
        return Err(e);
    }
    Ok(size)
}

async fn large_file_in(
    ctx: &Ctx,
    parent: Ino,
    name: &[u8],
    file: Arc<File>,
    size: u64,
    meta: Meta,
) -> Result<u64, String> {
    let (ino, tmp) = create_temp_in(
        ctx,
        parent,
        name,
        NewNode::SizedFile { size },
        meta.perm,
        ctx.owner_in(Some(&meta)),
    )
    .await?;
    let r = async {
        let sums = run_chunks(ctx, size, |offset, len, permit| {
            let file = file.clone();
            let client = ctx.client.clone();
            let buf = ctx.buffers.get();
            let progress = ctx.progress.clone();
            let checksum = ctx.opts.checksum;
            async move {
                let _permit = permit;
                let (buf, read) = tokio::task::spawn_blocking(move || {
                    let mut buf = buf;
                    let r = file.read_exact_at(&mut buf[..len], offset);
                    (buf, r)
                })
                .await
                .map_err(|e| format!("internal error: {e}"))?;
                if let Err(e) = read {
                    let msg = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        format!(
                            "the source shrank below {} bytes while copying",
                            offset + len as u64
                        )
                    } else {
                        format!("cannot read the source at offset {offset}: {e}")
                    };
                    return Ok((buf, Err(msg)));
                }
                let sum = checksum.then(|| xxh3_64(&buf[..len]));
                let (buf, w) = put_in(&client, ino, offset, buf, len).await;
                if w.is_ok() {
                    progress.add_bytes(len as u64);
                }
                let r = w.map(|()| sum);
                Ok((buf, r))
            }
        })
        .await?;
        if let Some(sums) = sums {
            verify_in(ctx, ino, size, &sums).await?;
        }
        finalize_in(ctx, parent, ino, &tmp, name, Some(size), &meta).await
    }
    .await;
    if let Err(e) = r {
        let _ = ns::remove(&ctx.client, parent, &tmp).await;
        return Err(e);
    }
    Ok(size)
}

/// Compares a file in the instance with the xxh3 of each chunk of its source.
async fn verify_in(ctx: &Ctx, ino: Ino, size: u64, sums: &[u64]) -> Result<(), String> {
    let mut buf = ctx.buffers.get();
    let r = async {
        for (i, want) in sums.iter().enumerate() {
            let offset = i as u64 * ctx.chunk;
            let len = (size - offset).min(ctx.chunk) as usize;
            ctx.client
                .read_into(ino, offset, &mut buf[..len])
                .await
                .map_err(|e| format!("cannot read the copy back at offset {offset}: {e}"))?;
            if xxh3_64(&buf[..len]) != *want {
                return Err(format!(
                    "checksum mismatch: the copy differs from the source in the {len} bytes at offset {offset}"
                ));
            }
        }
        Ok(())
    }
    .await;
    ctx.buffers.put(buf);
    r
}

/// What a chunk task gives back: its buffer (to reuse) and the chunk's checksum (when asked)
/// or why it failed; the outer error is an internal one (a task that could not run).
type ChunkResult = Result<(Vec<u8>, Result<Option<u64>, String>), String>;

/// Runs one task per chunk of a `size`-byte file, at most as many at once as the data slots
/// allow, and returns the per-chunk checksums (when asked). The first failure stops the
/// rest (the `JoinSet` aborts them when dropped).
async fn run_chunks<F, Fut>(
    ctx: &Ctx,
    size: u64,
    mut chunk_task: F,
) -> Result<Option<Vec<u64>>, String>
where
    F: FnMut(u64, usize, OwnedSemaphorePermit) -> Fut,
    Fut: std::future::Future<Output = ChunkResult> + Send + 'static,
{
    let n = size.div_ceil(ctx.chunk) as usize;
    let mut sums = vec![0u64; if ctx.opts.checksum { n } else { 0 }];
    let mut set: JoinSet<(usize, ChunkResult)> = JoinSet::new();
    let collect = |r: Result<(usize, ChunkResult), tokio::task::JoinError>,
                   sums: &mut Vec<u64>|
     -> Result<(), String> {
        let (i, r) = r.map_err(|e| format!("internal error: {e}"))?;
        let (buf, r) = r?;
        ctx.buffers.put(buf);
        if let Some(s) = r? {
            sums[i] = s;
        }
        Ok(())
    };
    for i in 0..n {
        ctx.cancelled()?;
        let permit = ctx
            .data
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let offset = i as u64 * ctx.chunk;
        let len = (size - offset).min(ctx.chunk) as usize;
        let fut = chunk_task(offset, len, permit);
        set.spawn(async move { (i, fut.await) });
        while let Some(r) = set.try_join_next() {
            collect(r, &mut sums)?;
        }
    }
    while let Some(r) = set.join_next().await {
        collect(r, &mut sums)?;
    }
    ctx.cancelled()?;
    Ok(ctx.opts.checksum.then_some(sums))
}

async fn link_in(ctx: &Ctx, parent: Ino, l: &LinkEntry) -> Result<u64, String> {
    let name = file_name(&l.dest);
    let (ino, tmp) = create_temp_in(
        ctx,
        parent,
        name,
        NewNode::Symlink {
            target: l.target.clone(),
        },
        0o777,
        ctx.owner_in(Some(&l.meta)),
    )
    .await?;
    if let Err(e) = finalize_in(ctx, parent, ino, &tmp, name, None, &l.meta).await {
        let _ = ns::remove(&ctx.client, parent, &tmp).await;
        return Err(e);
    }
    Ok(0)
}

// --- stage-out of one file ---

async fn file_out(ctx: &Ctx, f: &FileEntry) -> Result<u64, String> {
    let Source::Instance(ino) = f.source else {
        return Err("internal error: a stage-out source must be in the instance".into());
    };
    let size = f.size;
    let meta = f.meta;
    let owner = ctx.owner_out(&meta);
    let dest = f.dest.clone();
    if size <= ctx.chunk {
        let _slot = ctx.data.acquire().await.map_err(|e| e.to_string())?;
        let data = if size == 0 {
            Vec::new()
        } else {
            ctx.client
                .read(ino, 0, size)
                .await
                .map_err(|e| format!("cannot read the source: {e}"))?
        };
        ctx.progress.add_bytes(size);
        let checksum = ctx.opts.checksum;
        return blocking(move || {
            let (file, tmp) = pfs::create_temp(&dest)
                .map_err(|e| format!("cannot create a temporary for {}: {e}", dest.display()))?;
            let r = (|| {
                // Blocks of zeros are not written: the length makes them holes.
                file.set_len(size)
                    .and_then(|()| pfs::write_data_at(&file, &data, 0))
                    .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
                if checksum {
                    let mut back = vec![0u8; data.len()];
                    file.read_exact_at(&mut back, 0)
                        .map_err(|e| format!("cannot read the copy back: {e}"))?;
                    if xxh3_64(&back) != xxh3_64(&data) {
                        return Err("checksum mismatch: the copy differs from the source".into());
                    }
                }
                finish_out(&file, &tmp, &dest, &meta, owner)
            })();
            if r.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            r.map(|()| size)
        })
        .await;
    }

    let d = dest.clone();
    let (file, tmp, direct) = blocking(move || {
        let (file, tmp) = pfs::create_temp(&d)
            .map_err(|e| format!("cannot create a temporary for {}: {e}", d.display()))?;
        // Chunks of zeros are skipped: the file's length makes them holes.
        if let Err(e) = file.set_len(size) {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("cannot size {}: {e}", tmp.display()));
        }
        let direct = pfs::open_direct(&tmp).map(Arc::new);
        Ok((Arc::new(file), tmp, direct))
    })
    .await?;
    let r = async {
        let sums = run_chunks(ctx, size, |offset, len, permit| {
            let file = file.clone();
            let direct = direct.clone();
            let client = ctx.client.clone();
            let mut buf = ctx.buffers.get();
            let progress = ctx.progress.clone();
            let checksum = ctx.opts.checksum;
            async move {
                let _permit = permit;
                let win = aligned(&buf, len);
                if let Err(e) = client.read_into(ino, offset, &mut buf[win.clone()]).await {
                    return Ok((buf, Err(format!("cannot read the source at offset {offset}: {e}"))));
                }
                let sum = checksum.then(|| xxh3_64(&buf[win.clone()]));
                if is_zero(&buf[win.clone()]) {
                    progress.add_bytes(len as u64);
                    return Ok((buf, Ok(sum)));
                }
                let (buf, w) = tokio::task::spawn_blocking(move || {
                    let data = &buf[win];
                    let runs = pfs::data_runs(data, offset);
                    let dense = matches!(runs.as_slice(), [r] if r.len() == data.len());
                    let r = match direct {
                        // Blocks of zeros within the chunk stay holes.
                        _ if !dense => pfs::write_data_at(&file, data, offset),
                        Some(d) if offset % DIRECT_ALIGN as u64 == 0 && len % DIRECT_ALIGN == 0 => {
                            match d.write_all_at(data, offset) {
                                // Accepted at open, refused for this write: go buffered.
                                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                                    pfs::write_all_at(&file, data, offset)
                                }
                                r => r,
                            }
                        }
                        _ => pfs::write_all_at(&file, data, offset),
                    };
                    (buf, r)
                })
                .await
                .map_err(|e| format!("internal error: {e}"))?;
                progress.add_bytes(len as u64);
                Ok((buf, w.map(|()| sum).map_err(|e| format!("cannot write at offset {offset}: {e}"))))
            }
        })
        .await?;
        let chunk = ctx.chunk;
        let (file2, tmp2, dest2) = (file.clone(), tmp.clone(), dest.clone());
        blocking(move || {
            if let Some(sums) = sums {
                let mut buf = vec![0u8; chunk as usize];
                for (i, want) in sums.iter().enumerate() {
                    let offset = i as u64 * chunk;
                    let len = (size - offset).min(chunk) as usize;
                    file2
                        .read_exact_at(&mut buf[..len], offset)
                        .map_err(|e| format!("cannot read the copy back: {e}"))?;
                    if xxh3_64(&buf[..len]) != *want {
                        return Err(format!(
                            "checksum mismatch: the copy differs from the source in the {len} bytes at offset {offset}"
                        ));
                    }
                }
            }
            finish_out(&file2, &tmp2, &dest2, &meta, owner)
        })
        .await
    }
    .await;
    if r.is_err() {
        let t = tmp.clone();
        let _ = blocking(move || {
            let _ = std::fs::remove_file(&t);
            Ok(())
        })
        .await;
    }
    r.map(|()| size)
}

/// Attributes onto a complete temporary, then the final name.
fn finish_out(
    file: &File,
    tmp: &Path,
    dest: &Path,
    meta: &Meta,
    owner: Option<(u32, u32)>,
) -> Result<(), String> {
    pfs::finish_file(file, meta, owner)
        .map_err(|e| format!("cannot set the attributes of {}: {e}", tmp.display()))?;
    std::fs::rename(tmp, dest).map_err(|e| {
        format!(
            "cannot rename {} onto {}: {e}",
            tmp.display(),
            dest.display()
        )
    })
}

async fn link_out(ctx: &Ctx, l: &LinkEntry) -> Result<u64, String> {
    let dest = l.dest.clone();
    let target = l.target.clone();
    let meta = l.meta;
    let owner = ctx.owner_out(&meta);
    blocking(move || {
        let dir = dest.parent().unwrap_or(Path::new("/"));
        let name = dest.file_name().map(|n| n.as_bytes()).unwrap_or(b"");
        let tmp = dir.join(OsStr::from_bytes(&temp_name(name)));
        std::os::unix::fs::symlink(OsStr::from_bytes(&target), &tmp)
            .map_err(|e| format!("cannot create symlink {}: {e}", tmp.display()))?;
        let r = pfs::finish_symlink(&tmp, &meta, owner)
            .map_err(|e| format!("cannot set the attributes of {}: {e}", tmp.display()))
            .and_then(|()| {
                std::fs::rename(&tmp, &dest).map_err(|e| {
                    format!(
                        "cannot rename {} onto {}: {e}",
                        tmp.display(),
                        dest.display()
                    )
                })
            });
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r.map(|()| 0)
    })
    .await
}
