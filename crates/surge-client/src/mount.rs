//! Mounting an instance namespace with FUSE and keeping it mounted until it is unmounted
//! (`umount`, `fusermount3 -u`) or the process is told to stop.

use crate::fs::{Atime, Fs};
use crate::fuse::{CacheTimes, FuseAdapter};
use crate::instance::InstanceClient;
use anyhow::Context;
use fuser::{
    MountOption, Session, SessionACL, TransportChoice, TransportInfo, TransportKind, TransportStats,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long the kernel caches names and attributes of an immutable (ldbalance) namespace.
pub const IMMUTABLE_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

#[derive(Clone, Debug)]
pub struct MountOptions {
    pub ttl: CacheTimes,
    /// Threads reading requests from the kernel (each with its own cloned /dev/fuse fd).
    pub threads: usize,
    /// Let users other than the mounter use the mount (needs root or `user_allow_other`).
    pub allow_other: bool,
    /// Use kernel FUSE passthrough for files whose data is in one object on this host (one
    /// stripe on a fragment whose server runs here). Needs root and Linux >= 6.9.
    pub passthrough: bool,
    /// When not root: ask the passthrough helper (`surge passthrough-helper`, root, at
    /// `$SURGE_PASSTHROUGH_SOCKET`, default /run/surge/passthrough.sock) to register backing
    /// files, which gives this mount passthrough as if it were root. No helper: no passthrough.
    pub lend: bool,
    /// Answer metadata requests on the FUSE threads instead of handing them to the runtime.
    pub inline_metadata: bool,
    /// The layout of new files where no directory default says otherwise; `None`: one
    /// stripe on a fragment of this host when passthrough can serve it, the instance's rule
    /// otherwise (see `Fs::new_file_layout`).
    pub default_layout: Option<surge_core::FileLayout>,
    /// The kernel's read-ahead window for this mount, in bytes (`read_ahead_kb` of its
    /// backing device info); `None`: the kernel's default (128 KiB). Only root may set it.
    pub read_ahead: Option<u64>,
    /// How the kernel hands requests to this mount: FUSE over io_uring where the kernel offers
    /// it, else `/dev/fuse` (`Auto`); or `/dev/fuse` only. Default: `$SURGE_FUSE_TRANSPORT`.
    pub transport: TransportChoice,
    /// The source the mount table shows (`/proc/mounts`, `findmnt`); `None`:
    /// `surge:INSTANCE/NS`. mount(8) and fstab name the mount by it (`mount.fuse.surge`).
    pub fsname: Option<String>,
    /// Kernel mount flags beyond the defaults (`nosuid,nodev`): see [`kernel_flag`].
    pub flags: Vec<MountOption>,
    /// When reads move atimes (`relatime` unless told otherwise, as Linux mounts; `ro`
    /// mounts never).
    pub atime: Atime,
    /// Whether listings move directories' atimes by that rule (`diratime`, the default) or
    /// never (`nodiratime`).
    pub diratime: bool,
}

/// A kernel mount flag by its mount(8) name (`ro`, `dev`, `suid`, `exec`, `sync`, ...);
/// `None` for any other name. FUSE mounts are `nosuid,nodev` unless `suid`/`dev` is given
/// (root only: the kernel then honours set-user-ID bits and device nodes of this mount).
pub fn kernel_flag(name: &str) -> Option<MountOption> {
    Some(match name {
        "ro" => MountOption::RO,
        "rw" => MountOption::RW,
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        _ => return None,
    })
}

/// The access-time rule a mount(8) flag names (`noatime`, `relatime`, `strictatime`, ...);
/// `Some(None)` for the other access-time flags (`nodiratime` and `diratime`, read by
/// [`parse_diratime`]; `lazytime`, which changes nothing here); `None` for any other name.
pub fn atime_flag(name: &str) -> Option<Option<Atime>> {
    Some(match name {
        "noatime" => Some(Atime::No),
        "relatime" | "atime" => Some(Atime::Relative),
        "strictatime" | "norelatime" => Some(Atime::Strict),
        "nodiratime" | "diratime" | "lazytime" | "nolazytime" => None,
        _ => return None,
    })
}

/// The access-time rule of `--options` (the last flag naming one wins); `None`: not named.
pub fn parse_atime(s: &str) -> Option<Atime> {
    s.split(',').filter_map(atime_flag).flatten().last()
}

/// Whether `--options` lets listings move directories' atimes (the last of `diratime` and
/// `nodiratime` wins); `None`: neither named.
pub fn parse_diratime(s: &str) -> Option<bool> {
    s.rsplit(',').find_map(|n| match n {
        "diratime" => Some(true),
        "nodiratime" => Some(false),
        _ => None,
    })
}

/// `--options`: comma-separated kernel mount flags, the last of two opposites winning (as
/// mount(8) reads `rw,ro`). Access-time flags are accepted and left to [`parse_atime`].
pub fn parse_flags(s: &str) -> Result<Vec<MountOption>, String> {
    let mut out: Vec<MountOption> = Vec::new();
    for name in s.split(',').filter(|n| !n.is_empty()) {
        if atime_flag(name).is_some() {
            continue;
        }
        let f = kernel_flag(name).ok_or_else(|| {
            format!(
                "unknown mount flag '{name}' (ro, rw, dev, nodev, suid, nosuid, exec, noexec, \
                 sync, async, dirsync, noatime, relatime, strictatime)"
            )
        })?;
        let opposite = |o: &MountOption| {
            matches!(
                (o, &f),
                (MountOption::RO, MountOption::RW)
                    | (MountOption::RW, MountOption::RO)
                    | (MountOption::Dev, MountOption::NoDev)
                    | (MountOption::NoDev, MountOption::Dev)
                    | (MountOption::Suid, MountOption::NoSuid)
                    | (MountOption::NoSuid, MountOption::Suid)
                    | (MountOption::Exec, MountOption::NoExec)
                    | (MountOption::NoExec, MountOption::Exec)
                    | (MountOption::Sync, MountOption::Async)
                    | (MountOption::Async, MountOption::Sync)
            )
        };
        out.retain(|o| !opposite(o) && *o != f);
        out.push(f);
    }
    Ok(out)
}

/// The environment variable that picks the FUSE transport of every mount of this process
/// (`dev-fuse`, the default: /dev/fuse only; `io-uring`: io_uring where the kernel offers it),
/// for A/B measurements.
pub const TRANSPORT_ENV: &str = "SURGE_FUSE_TRANSPORT";

/// Parses a transport name (`--fuse-transport`, `$SURGE_FUSE_TRANSPORT`).
pub fn parse_transport(s: &str) -> Result<TransportChoice, String> {
    match s {
        "auto" | "io_uring" | "io-uring" | "uring" => Ok(TransportChoice::Auto),
        "dev-fuse" | "dev_fuse" | "classic" => Ok(TransportChoice::DevFuse),
        other => Err(format!(
            "unknown FUSE transport '{other}' (io-uring: io_uring where the kernel offers it; \
             dev-fuse: /dev/fuse only)"
        )),
    }
}

/// The transport `$SURGE_FUSE_TRANSPORT` asks for (`DevFuse` when unset or not understood).
pub fn transport_from_env() -> TransportChoice {
    match std::env::var(TRANSPORT_ENV) {
        Ok(v) if !v.is_empty() => parse_transport(&v).unwrap_or_else(|e| {
            warn!("${TRANSPORT_ENV}: {e}; using dev-fuse");
            TransportChoice::DevFuse
        }),
        _ => TransportChoice::DevFuse,
    }
}

/// The read-ahead a mount asks for by default: a sequential read of data that goes through
/// this process (striped files, remote stripes) keeps this much in flight instead of 128 KiB.
pub const READ_AHEAD: u64 = 16 << 20;

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            ttl: CacheTimes::default(),
            threads: 2,
            allow_other: is_root(),
            passthrough: is_root(),
            lend: !is_root(),
            inline_metadata: true,
            default_layout: None,
            read_ahead: Some(READ_AHEAD),
            transport: transport_from_env(),
            fsname: None,
            flags: Vec::new(),
            atime: Atime::Relative,
            diratime: true,
        }
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a mount uses kernel passthrough, and by whose privilege.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passthrough {
    /// The mount is root.
    Root,
    /// `surge passthrough-helper` registers the backing files.
    Helper,
    /// Not used: every byte through this process (no privilege, a cache instance, or
    /// `--no-passthrough`).
    Off,
}

impl Passthrough {
    /// For a job's output: what the user gets, and what to do about it.
    pub fn describe(self) -> &'static str {
        match self {
            Passthrough::Root => "kernel passthrough",
            Passthrough::Helper => "kernel passthrough by the passthrough helper",
            Passthrough::Off => "no kernel passthrough",
        }
    }
}

/// A mounted file system; dropping it does not unmount (call [`Mounted::unmount`]).
pub struct Mounted {
    pub mountpoint: PathBuf,
    /// The instance client the mount sends its requests with (its request counts).
    pub client: Arc<InstanceClient>,
    /// The file system the mount serves (its failed operations, see [`Fs::failures`]).
    pub fs: Arc<Fs>,
    /// How the kernel reads and writes this mount's local one-stripe files.
    pub passthrough: Passthrough,
    /// How the kernel hands requests to this mount, and why.
    pub transport: TransportInfo,
    /// Requests served per transport path.
    pub fuse_stats: Arc<TransportStats>,
    unmounter: fuser::SessionUnmounter,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// The socket of the interposition library (see [`crate::preload`]); stops when dropped.
    _preload: Option<crate::preload::PreloadSocket>,
    /// The runtime the mount's requests run on (for its last one, [`Mounted::goodbye`]).
    rt: tokio::runtime::Handle,
}

impl Mounted {
    /// Unmounts and waits for the session to end.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        self.unmounter
            .unmount()
            .with_context(|| format!("cannot unmount {}", self.mountpoint.display()))?;
        self.join()?;
        self.goodbye();
        Ok(())
    }

    /// After a clean end of the FUSE session (every file closed, every write committed): tells
    /// the metadata server this mount is done, so it does not take the files it opened for
    /// writing as left by a crash (`Request::Goodbye`). Waits up to 2 s; a server that does
    /// not answer only makes the next opener of those files measure their objects.
    fn goodbye(&self) {
        let client = self.client.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        self.rt.spawn(async move {
            let _ = tx.send(client.goodbye().await);
        });
        match rx.recv_timeout(Duration::from_secs(2)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("goodbye to the metadata server: {e}"),
            Err(_) => tracing::debug!("goodbye to the metadata server: no answer within 2 s"),
        }
    }

    /// Unmounts, bounded: a mount point still busy after `wait` (a process outside the job
    /// with its working directory or a file in it) is detached (a lazy unmount), and a FUSE
    /// session still running `wait` after that (the mount copied into another mount namespace
    /// during the job: `unshare -m`, a container, a service with `PrivateTmp`; or a detached
    /// mount still in use) has its connection aborted, so what is pending is committed and the
    /// session ends. Returns what was done beyond a plain unmount, for the caller to say; an
    /// error when the mount is still in this process's mount table.
    pub fn unmount_within(mut self, wait: Duration) -> anyhow::Result<Vec<String>> {
        use crate::unmount;
        // As /proc/self/mountinfo spells it (the mount point itself is not looked up: that
        // would be a request to this very mount).
        let path = match (self.mountpoint.parent(), self.mountpoint.file_name()) {
            (Some(dir), Some(name)) => dir
                .canonicalize()
                .map_or_else(|_| self.mountpoint.clone(), |d| d.join(name)),
            _ => self.mountpoint.clone(),
        };
        let dev = unmount::mounted_dev(&path);
        let mut notes = Vec::new();
        if let Err(first) = self.unmounter.unmount() {
            // Busy: its users may be on their way out; then it is detached.
            let start = Instant::now();
            while unmount::mounted_dev(&path).is_some() && start.elapsed() < wait {
                std::thread::sleep(Duration::from_millis(100));
                let _ = unmount::umount(&path, false);
            }
            if unmount::mounted_dev(&path).is_some() {
                let who = unmount::holders(&path, 5);
                let who = if who.is_empty() {
                    String::from("by no process this one can see")
                } else {
                    format!("by {}", who.join(", "))
                };
                unmount::umount(&path, true).with_context(|| {
                    format!(
                        "cannot detach {} (busy {who} after {wait:?}: {first})",
                        path.display()
                    )
                })?;
                notes.push(format!(
                    "{} was still in use {who} after {wait:?} ({first}): detached it (lazy \
                     unmount)",
                    path.display()
                ));
            }
        }
        if !self.join_within(wait)? {
            let held = format!(
                "the FUSE session of {} was still held {wait:?} after its unmount (a copy of \
                 the mount in another mount namespace, or a process still using the detached \
                 mount)",
                path.display()
            );
            match dev.map(unmount::connection_id) {
                Some(id) => match unmount::abort_connection(id) {
                    Ok(()) => notes.push(format!(
                        "{held}: aborted its connection (/sys/fs/fuse/connections/{id}/abort); \
                         those processes get ENOTCONN"
                    )),
                    Err(e) => notes.push(format!(
                        "{held}: cannot abort its connection ({e}); it ends when this process \
                         exits"
                    )),
                },
                None => notes.push(format!(
                    "{held}: its connection is unknown; it ends when this process exits"
                )),
            }
            if !self.join_within(wait)? {
                notes.push(format!(
                    "the FUSE session of {} did not end; it ends when this process exits",
                    path.display()
                ));
            }
        }
        anyhow::ensure!(
            unmount::mounted_dev(&path).is_none(),
            "{} is still mounted after its unmount",
            path.display()
        );
        if self.is_finished() {
            self.goodbye();
        }
        Ok(notes)
    }

    /// Waits up to `wait` for the FUSE session to end; false when it has not.
    fn join_within(&mut self, wait: Duration) -> anyhow::Result<bool> {
        let start = Instant::now();
        while !self.is_finished() {
            if start.elapsed() >= wait {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.join()?;
        Ok(true)
    }

    /// Waits until the file system is unmounted by someone else.
    pub fn join(&mut self) -> anyhow::Result<()> {
        if let Some(t) = self.thread.take() {
            let r = t.join();
            info!(
                "unmounted {}: {}",
                self.mountpoint.display(),
                fuse_counts(&self.fuse_stats)
            );
            match r {
                Ok(r) => r.with_context(|| {
                    format!("FUSE session of {} failed", self.mountpoint.display())
                })?,
                Err(_) => anyhow::bail!(
                    "FUSE session thread of {} panicked",
                    self.mountpoint.display()
                ),
            }
        }
        Ok(())
    }

    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

/// Mounts `client`'s namespace at `mountpoint`. The FUSE handshake has completed when this
/// returns, so the mount is usable at once.
pub fn mount(
    client: InstanceClient,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    opts: &MountOptions,
) -> anyhow::Result<Mounted> {
    let md = std::fs::metadata(mountpoint)
        .with_context(|| format!("mount point {} does not exist", mountpoint.display()))?;
    anyhow::ensure!(
        md.is_dir(),
        "mount point {} is not a directory",
        mountpoint.display()
    );
    let desc = &client.desc;
    let fsname = opts
        .fsname
        .clone()
        .unwrap_or_else(|| format!("surge:{}/{}", desc.instance, client.ns.0));
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname),
        MountOption::Subtype("surge".into()),
        MountOption::DefaultPermissions,
    ];
    if opts.atime == Atime::No {
        config.mount_options.push(MountOption::NoAtime);
    }
    config.mount_options.extend(opts.flags.iter().cloned());
    // A load-balanced replica is immutable once staged in: mounted read-only, with names and
    // attributes cached by the kernel for an hour (pages are kept across opens as the
    // attributes do not change), so a software environment's start-up storm of lookups, stats
    // and opens is answered by the kernel after the first node process has walked it.
    let mut opts = opts.clone();
    if desc.access_mode == "ldbalance" {
        config.mount_options.retain(|o| *o != MountOption::RW);
        config.mount_options.push(MountOption::RO);
        opts.ttl = CacheTimes {
            entry: IMMUTABLE_TTL,
            attr: IMMUTABLE_TTL,
        };
    }
    let opts = &opts;
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    config.transport = opts.transport;

    let client = Arc::new(client);
    let mut fs = Fs::new(client.clone(), opts.ttl.attr, opts.ttl.entry);
    fs.set_default_layout(opts.default_layout);
    let read_only = config.mount_options.iter().rev().find_map(|o| match o {
        MountOption::RO => Some(true),
        MountOption::RW => Some(false),
        _ => None,
    });
    fs.set_atime(if read_only == Some(true) {
        Atime::No
    } else {
        opts.atime
    });
    fs.set_diratime(opts.diratime);
    let fs = Arc::new(fs);
    if client.desc.cache_pfs.is_some() {
        // A cache namespace: commit files being written every second (see
        // `Fs::commit_dirty`) and report what is open (see `Fs::report_use`); stops when
        // the file system goes.
        let weak = Arc::downgrade(&fs);
        rt.spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(fs) = weak.upgrade() else { break };
                fs.commit_dirty().await;
                fs.report_use().await;
            }
        });
    }
    if opts.passthrough {
        // What the kernel writes into passthrough files counts while they are open (see
        // `Fs::account_passthrough`); stops when the file system goes.
        let weak = Arc::downgrade(&fs);
        rt.spawn(async move {
            let mut tick = tokio::time::interval(crate::fs::PASSTHROUGH_ACCOUNTING);
            loop {
                tick.tick().await;
                let Some(fs) = weak.upgrade() else { break };
                if fs.passthrough_on() {
                    fs.account_passthrough().await;
                }
            }
        });
    }
    let notifier = Arc::new(OnceLock::new());
    let fs_handle = fs.clone();
    let rt_preload = rt.clone();
    let rt_goodbye = rt.clone();
    let mut adapter = FuseAdapter::new(
        fs,
        rt,
        opts.ttl,
        notifier.clone(),
        opts.passthrough,
        opts.inline_metadata,
    );
    if client.desc.access_mode == "ldbalance" {
        adapter = adapter.with_negative_cache(IMMUTABLE_TTL);
    }
    let lender = adapter.lender();
    let order = adapter.dispatch_order();
    // The helper takes the session's descriptor, which exists only once the kernel's
    // handshake (where passthrough is asked for) is over: ask for it when a helper is there.
    let socket = crate::lend::socket_path();
    let lend = opts.lend && !opts.passthrough && socket.exists();
    if lend {
        adapter = adapter.with_lender();
    }
    let mut session = Session::new(adapter, mountpoint, &config).with_context(|| {
        format!(
            "cannot mount on {} (is /dev/fuse available?)",
            mountpoint.display()
        )
    })?;
    let _ = notifier.set(session.notifier());
    let transport = session.transport();
    let fuse_stats = session.transport_stats();
    let _ = order.set(fuse_stats.clone());
    if let Some(bytes) = opts.read_ahead {
        match set_read_ahead(mountpoint, bytes) {
            Ok(()) => debug!("read-ahead of {}: {bytes} bytes", mountpoint.display()),
            Err(e) if is_root() => warn!("{e:#}: the kernel's default read-ahead stays"),
            Err(e) => debug!("{e:#} (only root may; the kernel's default stays)"),
        }
    }
    if lend {
        use std::os::fd::AsFd;
        match crate::lend::Lender::connect(&socket, session.as_fd()) {
            Ok(l) => {
                info!(
                    "the passthrough helper at {} registers this mount's backing files",
                    socket.display()
                );
                let _ = lender.set(Arc::new(l));
            }
            Err(e) => {
                fs_handle.disable_passthrough();
                warn!(
                    "the passthrough helper at {} did not take this mount ({e}): every byte \
                     goes through this process",
                    socket.display()
                )
            }
        }
    } else if opts.lend && !opts.passthrough {
        debug!("no passthrough helper at {}", socket.display());
    }
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || session.run())?;
    info!(
        "mounted on {} (FUSE transport: {transport})",
        mountpoint.display()
    );
    // Only files open by passthrough are handed to the interposition library: without
    // passthrough there is nothing to serve.
    let preload = if fs_handle.passthrough_on()
        && std::env::var(crate::preload::ENV).map_or(true, |v| v != "0")
    {
        let acting_for = client.acting_for().map(|c| c.uid);
        match crate::preload::serve(fs_handle.clone(), rt_preload, mountpoint, acting_for) {
            Ok(p) => Some(p),
            Err(e) => {
                warn!("no preload socket: {e}");
                None
            }
        }
    } else {
        None
    };
    let passthrough = match (fs_handle.passthrough_on(), lender.get().is_some()) {
        (false, _) => Passthrough::Off,
        (true, true) => Passthrough::Helper,
        (true, false) => Passthrough::Root,
    };
    Ok(Mounted {
        mountpoint: mountpoint.to_path_buf(),
        client,
        fs: fs_handle,
        passthrough,
        transport,
        fuse_stats,
        unmounter,
        thread: Some(thread),
        _preload: preload,
        rt: rt_goodbye,
    })
}

/// The requests a mount served per path, for its log.
pub fn fuse_counts(s: &TransportStats) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    format!(
        "{} requests over io_uring ({} replies written straight into the ring), {} over /dev/fuse",
        s.uring_requests.load(Relaxed),
        s.uring_direct_replies.load(Relaxed),
        s.dev_fuse_requests.load(Relaxed)
    )
}

/// The transport as JSON, for `--stats-file`.
pub fn fuse_stats_json(t: &TransportInfo, s: &TransportStats) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let (kind, queues, depth) = match t.kind {
        TransportKind::IoUring { queues, depth } => ("io_uring", queues, depth),
        TransportKind::DevFuse => ("dev_fuse", 0, 0),
    };
    serde_json::json!({
        "transport": kind,
        "queues": queues,
        "depth": depth,
        "reason": t.reason,
        "uring_requests": s.uring_requests.load(Relaxed),
        "uring_direct_replies": s.uring_direct_replies.load(Relaxed),
        "dev_fuse_requests": s.dev_fuse_requests.load(Relaxed),
    })
}

/// Sets the kernel's read-ahead window of the FUSE mount at `mountpoint` (a FUSE mount gets
/// 128 KiB, which the daemon may only lower in its handshake): `read_ahead_kb` of the mount's
/// backing device info, found through `/proc/self/mountinfo` (a `stat` of the mount point
/// would be a request to this very mount, whose session is not running yet).
fn set_read_ahead(mountpoint: &Path, bytes: u64) -> anyhow::Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let want = mountpoint
        .canonicalize()
        .unwrap_or_else(|_| mountpoint.to_path_buf());
    let dev = info
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let point = f.nth(1)?;
            (unescape_mountinfo(point) == want.as_os_str().as_encoded_bytes()).then_some(dev)
        })
        .next_back()
        .with_context(|| format!("{} is not in /proc/self/mountinfo", mountpoint.display()))?;
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    std::fs::write(&path, format!("{}", bytes.div_ceil(1024))).with_context(|| {
        format!(
            "cannot set the read-ahead of {} in {path}",
            mountpoint.display()
        )
    })
}

/// A path as `/proc/self/mountinfo` writes it, with its octal escapes undone (space, tab,
/// newline and backslash are written `\040`, `\011`, `\012`, `\134`).
pub fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/run/a\040b"), b"/run/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y"), br"/x\y");
        assert_eq!(unescape_mountinfo(r"/end\011"), b"/end\t");
        assert_eq!(unescape_mountinfo(r"/short\04"), br"/short\04");
        assert_eq!(unescape_mountinfo("/plain"), b"/plain");
    }
}
