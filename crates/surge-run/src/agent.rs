//! `surge agent`: the compute-node agent (root, one per compute host; the role DVS played for
//! DataWarp). It mounts job instances on its host when the manager wants them there (a job's
//! `pre_run`) and unmounts them when it no longer does (`post_run`, `teardown`, a session
//! ended by hand or by reconciliation).
//!
//! It pulls: it reports its mounts (and the ones it failed to make) and gets back the wanted
//! ones; the manager holds the answer (a long poll, at most `--interval`) until they differ, so
//! a job's pre_run is answered within milliseconds. Nothing is kept across restarts: at start, mounts left under
//! the mount root by an agent that died (their FUSE daemon is gone: "transport endpoint is not
//! connected") are detached, and the wanted ones are made again.

use anyhow::Context;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;
use surge_api::v1 as api;
use surge_client::mount::{self, MountOptions, Mounted};
use surge_client::{ClientOptions, InstanceClient};
use surge_core::NamespaceId;
use surge_manager::cli::{connect, status_err};
use surge_proto::InstanceDescriptor;
use tracing::{info, warn};

/// Run the compute-node agent: mount job instances on this host when the manager asks.
///
/// Runs as root (FUSE mounts other users use need it). The mounts are made at the paths the
/// manager names (its --mount-root, default /run/surge/jobs/<session>/job), owned by the
/// job's user, and answered by this process: keep it running (a supervisor restarts it; on
/// restart it cleans up and remounts what is still wanted).
///
/// Example:
///   surge agent --manager mgr:7060 --host "$(hostname)"
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct AgentArgs {
    /// The manager (default $SURGE_MANAGER).
    #[arg(long, env = "SURGE_MANAGER", value_name = "HOST:PORT")]
    pub manager: String,
    /// This host's name as the workload manager calls it (Slurm's node name); default: the
    /// host name.
    #[arg(long)]
    pub host: Option<String>,
    /// Longest wait between syncs with the manager (it answers at once when a job wants
    /// mounts here; this bounds how stale the manager's view of this host gets).
    #[arg(long, default_value_t = 5.0)]
    pub interval: f64,
    /// FUSE threads per mount.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// How long a job's request waits for a server (seconds) before its call fails with EIO
    /// (a stopped server, a cut link); 0: for ever, like an NFS "hard" mount.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = surge_core::sys::secs_arg)]
    pub deadline: Duration,
}

type Key = (u64, u64);

struct Held {
    mounted: Mounted,
    spec: api::AgentMount,
}

pub fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        mount::is_root(),
        "surge agent must run as root: it makes FUSE mounts for the jobs' users"
    );
    let host = match &args.host {
        Some(h) => h.clone(),
        None => {
            let h = surge_core::sys::hostname();
            anyhow::ensure!(!h.is_empty(), "cannot read the host name: give --host");
            h
        }
    };
    let stop = surge_core::sys::stop_on_signals();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut held: HashMap<Key, Held> = HashMap::new();
    let mut failed: HashMap<Key, api::AgentMount> = HashMap::new();
    let mut cleaned = false;
    let mut last_error: Option<String> = None;
    // Report at once after a change (the scheduler waits for it), else wait for one.
    let mut report_now = true;
    info!(%host, manager = %args.manager, "agent started");
    // One connection, kept across syncs (made again only when it fails): a sync is one
    // request on it, not a new TCP connection each time (issue 30).
    let mut conn: Option<surge_api::Client> = None;
    while !stop.load(Ordering::SeqCst) {
        let mounts: Vec<api::AgentMount> = held.values().map(|h| report(&h.spec)).collect();
        let reply = rt.block_on(async {
            let mut m = match conn.take() {
                Some(m) => m,
                None => connect(&args.manager).await?,
            };
            let r = m
                .agent_sync(api::AgentSyncRequest {
                    host: host.clone(),
                    mounts,
                    failed: failed.values().cloned().collect(),
                    wait_ms: if report_now {
                        0
                    } else {
                        (args.interval.max(0.05) * 1000.0) as u32
                    },
                })
                .await
                .map_err(status_err)?;
            conn = Some(m);
            anyhow::Ok(r.into_inner())
        });
        let reply = match reply {
            Ok(r) => {
                if last_error.take().is_some() {
                    info!("manager {} answers again", args.manager);
                }
                r
            }
            Err(e) => {
                let msg = format!("{e:#}");
                if last_error.as_deref() != Some(&msg) {
                    warn!("cannot sync with the manager {}: {msg}", args.manager);
                    last_error = Some(msg);
                }
                std::thread::sleep(Duration::from_secs_f64(args.interval.clamp(0.1, 1.0)));
                continue;
            }
        };
        report_now = false;
        if !cleaned {
            cleanup_stale(Path::new(&reply.mount_root));
            cleaned = true;
        }
        let wanted: HashMap<Key, api::AgentMount> = reply
            .mounts
            .into_iter()
            .map(|m| ((m.session, m.instance), m))
            .collect();
        // Unmount what is no longer wanted (or died).
        let gone: Vec<Key> = held
            .iter()
            .filter(|(k, h)| !wanted.contains_key(k) || h.mounted.is_finished())
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            report_now = true;
            if let Some(h) = held.remove(&k) {
                let path = h.mounted.mountpoint.clone();
                unmount_bounded(h.mounted);
                remove_dirs(&path, Path::new(&reply.mount_root));
            }
        }
        failed.retain(|k, _| wanted.contains_key(k));
        // Mount what is wanted and not there (a failure is reported, and retried each sync).
        for (k, spec) in wanted {
            if held.contains_key(&k) {
                continue;
            }
            report_now = true;
            match mount_one(
                &spec,
                rt.handle().clone(),
                args.threads,
                args.deadline,
                &args.manager,
            ) {
                Ok(mounted) => {
                    info!(
                        "mounted instance {} (session {}, namespace {}) at {} for uid {}",
                        spec.instance, spec.session, spec.namespace, spec.path, spec.owner_uid
                    );
                    failed.remove(&k);
                    held.insert(k, Held { mounted, spec });
                }
                Err(e) => {
                    let error = format!("{e:#}");
                    if failed.get(&k).map(|f| &f.error) != Some(&error) {
                        warn!("cannot mount {}: {error}", spec.path);
                    }
                    let mut f = report(&spec);
                    f.error = error;
                    failed.insert(k, f);
                }
            }
        }
        // A mount that keeps failing is retried once a second, not in a tight loop.
        if !failed.is_empty() {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    info!("stopping: unmounting {} mount(s)", held.len());
    for (_, h) in held.drain() {
        unmount_bounded(h.mounted);
    }
    Ok(ExitCode::SUCCESS)
}

/// How long the agent waits for a busy mount before it detaches it, and for a FUSE session
/// still held after its unmount before it aborts its connection.
const UNMOUNT_WAIT: Duration = Duration::from_secs(3);

/// Unmounts `mounted` within a bound (see `Mounted::unmount_within`): a mount a process of
/// the job left busy, or copied into another mount namespace (`unshare -m`, a container, a
/// service with `PrivateTmp`), must not hold up this host's other jobs, whose mounts and
/// unmounts wait in the same loop. Says what it did beyond a plain unmount.
fn unmount_bounded(mounted: Mounted) {
    let path = mounted.mountpoint.clone();
    match mounted.unmount_within(UNMOUNT_WAIT) {
        Ok(notes) if notes.is_empty() => info!("unmounted {}", path.display()),
        Ok(notes) => {
            for n in notes {
                warn!("{n}");
            }
            info!("unmounted {}", path.display());
        }
        Err(e) => {
            warn!("{e:#}; detaching it");
            detach(&path);
        }
    }
}

/// What the agent tells the manager about a mount (no secrets back).
fn report(spec: &api::AgentMount) -> api::AgentMount {
    api::AgentMount {
        descriptor_json: String::new(),
        token: String::new(),
        ..spec.clone()
    }
}

fn mount_one(
    spec: &api::AgentMount,
    rt: tokio::runtime::Handle,
    threads: usize,
    deadline: Duration,
    manager: &str,
) -> anyhow::Result<Mounted> {
    let desc: InstanceDescriptor =
        serde_json::from_str(&spec.descriptor_json).context("bad instance descriptor")?;
    let token = surge_auth::Token::from_text(&spec.token)?;
    let path = PathBuf::from(&spec.path);
    anyhow::ensure!(
        path.is_absolute(),
        "mount path {} is not absolute",
        spec.path
    );
    // A mount point left by a dead agent answers ENOTCONN: detach it first.
    if std::fs::metadata(&path).is_err() && std::fs::symlink_metadata(&path).is_ok() {
        detach(&path);
    }
    std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let client = InstanceClient::with_options(
        desc,
        NamespaceId(spec.namespace),
        token,
        ClientOptions {
            deadline: (!deadline.is_zero()).then_some(deadline),
            ..ClientOptions::default()
        }
        .resolving_through(Some(manager)),
    )?;
    let opts = MountOptions {
        threads: threads.max(1),
        allow_other: true,
        ..MountOptions::default()
    };
    mount::mount(client, rt, &path, &opts)
}

fn detach(path: &Path) {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            warn!("cannot detach {}: {e}", path.display());
        }
    }
}

/// Removes the mount point and its empty parents up to (not including) `root`.
fn remove_dirs(path: &Path, root: &Path) {
    let mut p = Some(path);
    while let Some(d) = p {
        if d == root || !d.starts_with(root) || std::fs::remove_dir(d).is_err() {
            break;
        }
        p = d.parent();
    }
}

/// Detaches every FUSE mount under `root` (left by an agent that died) and removes the empty
/// directories.
fn cleanup_stale(root: &Path) {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut stale: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        // id parent major:minor root mountpoint options ... - fstype source super
        let f: Vec<&str> = line.split(' ').collect();
        let Some(mp) = f.get(4) else { continue };
        let mp = PathBuf::from(unescape(mp));
        let fstype = line.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        if mp.starts_with(root) && mp != root && fstype.is_some_and(|t| t.starts_with("fuse")) {
            stale.push(mp);
        }
    }
    // Deepest first.
    stale.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in stale {
        warn!("detaching {} (left by a previous agent)", p.display());
        detach(&p);
        remove_dirs(&p, root);
    }
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let _ = remove_tree_of_empty_dirs(&e.path());
        }
    }
}

fn remove_tree_of_empty_dirs(p: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(p)?.is_dir() {
        for e in std::fs::read_dir(p)? {
            remove_tree_of_empty_dirs(&e?.path())?;
        }
        std::fs::remove_dir(p)?;
    }
    Ok(())
}

/// `/proc/self/mountinfo` escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&surge_client::mount::unescape_mountinfo(s)).into_owned()
}
