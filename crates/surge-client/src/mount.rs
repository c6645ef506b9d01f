//! Mounting an instance namespace with FUSE and keeping it mounted until it is unmounted
//! (`umount`, `fusermount3 -u`) or the process is told to stop.

use crate::fs::Fs;
use crate::fuse::{CacheTimes, FuseAdapter};
use crate::instance::InstanceClient;
use anyhow::Context;
use fuser::{MountOption, Session, SessionACL};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
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
}

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
    /// How the kernel reads and writes this mount's local one-stripe files.
    pub passthrough: Passthrough,
    unmounter: fuser::SessionUnmounter,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Mounted {
    /// Unmounts and waits for the session to end.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        self.unmounter
            .unmount()
            .with_context(|| format!("cannot unmount {}", self.mountpoint.display()))?;
        self.join()
    }

    /// Waits until the file system is unmounted by someone else.
    pub fn join(&mut self) -> anyhow::Result<()> {
        if let Some(t) = self.thread.take() {
            match t.join() {
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
    let fsname = format!("surge:{}/{}", desc.instance, client.ns.0);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname),
        MountOption::Subtype("surge".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    // A load-balanced replica is immutable once staged in: mounted read-only, with names and
    // attributes cached by the kernel for an hour (pages are kept across opens as the
    // attributes do not change), so a software environment's start-up storm of lookups, stats
    // and opens is answered by the kernel after the first node process has walked it.
    let mut opts = opts.clone();
    if desc.access_mode == "ldbalance" {
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

    let client = Arc::new(client);
    let mut fs = Fs::new(client.clone(), opts.ttl.attr, opts.ttl.entry);
    fs.set_default_layout(opts.default_layout);
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
    let notifier = Arc::new(OnceLock::new());
    let fs_handle = fs.clone();
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
    info!("mounted on {}", mountpoint.display());
    let passthrough = match (fs_handle.passthrough_on(), lender.get().is_some()) {
        (false, _) => Passthrough::Off,
        (true, true) => Passthrough::Helper,
        (true, false) => Passthrough::Root,
    };
    Ok(Mounted {
        mountpoint: mountpoint.to_path_buf(),
        client,
        passthrough,
        unmounter,
        thread: Some(thread),
    })
}
