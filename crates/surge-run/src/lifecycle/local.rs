//! The emulated compute nodes of `surge run`: each node's mounts are FUSE mounts served by this
//! process, under the run's private directory (`<run dir>/node-<k>/job`,
//! `<run dir>/node-<k>/persistent/<name>`), each of the namespace that node would mount on a
//! cluster.

use super::{capability, mount_dir, namespace_on, var_of, Mounts};
use crate::embedded::user_name;
use crate::nodes::MountInfo;
use anyhow::Context;
use std::path::{Path, PathBuf};
use surge_api::v1 as api;
use surge_client::mount::{self, MountOptions, Mounted};

/// The emulated nodes of one run and their mounts; dropping it unmounts what is still mounted
/// and removes the run directory.
pub struct LocalNodes {
    /// `$TMPDIR/surge-<user>/session-<id>-<pid>`: private to the user.
    pub run_dir: PathBuf,
    nodes: u32,
    /// Node, what it mounts, the mount.
    mounted: Vec<(u32, MountInfo, Mounted)>,
    /// The manager the mounts ask where a server that moved is now.
    manager: Option<String>,
}

impl LocalNodes {
    /// `nodes` emulated nodes of session `session`, with a fresh run directory.
    pub fn new(session: u64, nodes: u32) -> anyhow::Result<LocalNodes> {
        Ok(LocalNodes {
            run_dir: make_run_dir(session)?,
            nodes: nodes.max(1),
            mounted: Vec::new(),
            manager: None,
        })
    }

    /// The mounts find a server that came back on another address through `manager`.
    pub fn resolving_through(mut self, manager: &str) -> LocalNodes {
        self.manager = Some(manager.to_string());
        self
    }

    /// What node `node` mounts.
    pub fn mounts_of(&self, node: u32) -> Vec<MountInfo> {
        self.mounted
            .iter()
            .filter(|(n, _, _)| *n == node)
            .map(|(_, i, _)| i.clone())
            .collect()
    }

    /// How the mounts move the job's bytes, for the report: a user without the passthrough
    /// helper learns why the mount is slow.
    fn passthrough(&self) -> String {
        match self.mounted.first().map(|(_, _, m)| m.passthrough) {
            Some(mount::Passthrough::Off) if !mount::is_root() => format!(
                "; no kernel passthrough (not root, no passthrough helper at {}: every byte \
                 through this process)",
                surge_client::lend::socket_path().display()
            ),
            Some(p) => format!("; {}", p.describe()),
            None => String::new(),
        }
    }

    /// Unmounts everything, each within [`UNMOUNT_WAIT`] twice at most (a busy mount is
    /// detached, a session held by another mount namespace aborted: said on stderr); how many
    /// there were, or an error naming the mounts left behind.
    fn unmount_all(&mut self) -> anyhow::Result<usize> {
        let n = self.mounted.len();
        let mut left = Vec::new();
        for (_, _, m) in self.mounted.drain(..) {
            match m.unmount_within(UNMOUNT_WAIT) {
                Ok(notes) => {
                    for note in notes {
                        eprintln!("surge run: {note}");
                    }
                }
                Err(e) => {
                    eprintln!("surge run: {e:#}");
                    left.push(format!("{e:#}"));
                }
            }
        }
        anyhow::ensure!(
            left.is_empty(),
            "{} mount(s) could not be unmounted: {}",
            left.len(),
            left.join("; ")
        );
        Ok(n)
    }
}

/// How long an unmount waits for a busy mount point's users before detaching it, and for the
/// FUSE session to end before aborting its connection: the job has ended, so what still uses
/// the mount is outside it (a background process that outlived it, a copy of the mount in a
/// mount namespace made during the job), and `surge run` must not wait for it.
const UNMOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Drop for LocalNodes {
    fn drop(&mut self) {
        let _ = self.unmount_all();
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

impl Mounts for LocalNodes {
    fn nodes(&self) -> u32 {
        self.nodes
    }

    fn path(&self, s: &api::Session, i: &api::Instance, node: u32) -> PathBuf {
        mount_dir(&self.run_dir.join(format!("node-{node}")), s, i)
    }

    fn hosts(&self) -> (Vec<String>, bool) {
        (Vec::new(), false)
    }

    async fn mount(
        &mut self,
        m: &mut surge_api::Client,
        s: &api::Session,
    ) -> anyhow::Result<Option<String>> {
        if s.instances.is_empty() {
            return Ok(None);
        }
        let rt = tokio::runtime::Handle::current();
        let opts = MountOptions::default();
        for i in &s.instances {
            // One capability for every namespace: each node mounts its own.
            let (desc, token) = capability(m, i, 0, true).await?;
            for node in 0..self.nodes {
                let ns = namespace_on(i, node);
                let dir = self.path(s, i, node);
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let client = surge_client::InstanceClient::with_options(
                    desc.clone(),
                    surge_core::NamespaceId(ns),
                    token.clone(),
                    surge_client::ClientOptions::default()
                        .resolving_through(self.manager.as_deref()),
                )?;
                let mounted = mount::mount(client, rt.clone(), &dir, &opts)?;
                let info = MountInfo {
                    path: dir,
                    instance: i.id,
                    ns,
                    var: var_of(s, i).env_name(),
                };
                self.mounted.push((node, info, mounted));
            }
        }
        Ok(Some(format!(
            "{} instance(s) on {} node(s) under {}{}",
            s.instances.len(),
            self.nodes,
            self.run_dir.display(),
            self.passthrough()
        )))
    }

    async fn unmount(
        &mut self,
        _m: &mut surge_api::Client,
        _s: &api::Session,
        _hurry: bool,
    ) -> anyhow::Result<Option<String>> {
        // The kernel has sent every close by the time an unmount returns: all sizes are
        // committed.
        Ok(match self.unmount_all()? {
            0 => None,
            n => Some(format!("{n} mount(s)")),
        })
    }
}

/// The job's private run directory, `$TMPDIR/surge-<user>/session-<id>-<pid>`: the job's PATH
/// starts with its `bin/`, so nobody else may be able to write in it or in its parent. A
/// `surge-<user>` another user made first (or a link of that name) is not used: the run goes
/// to a fresh directory beside it, and says so (issue 31).
fn make_run_dir(session: u64) -> anyhow::Result<PathBuf> {
    use surge_core::private_dir;
    let runs = std::env::temp_dir().join(format!("surge-{}", user_name()));
    let runs = match private_dir::ensure_all(&runs) {
        Ok(()) => {
            clean_stale_runs(&runs);
            runs
        }
        Err(e) if e.is_squatted() => {
            let fresh = private_dir::fresh(&runs)?;
            eprintln!(
                "surge run: warning: not using {}: {e}; using {}",
                runs.display(),
                fresh.display()
            );
            fresh
        }
        Err(e) => return Err(e.into()),
    };
    let run_dir = runs.join(format!("session-{session}-{}", std::process::id()));
    // A directory left by an earlier process of the same pid is ours (the parent is private).
    if std::fs::symlink_metadata(&run_dir).is_ok() {
        std::fs::remove_dir_all(&run_dir)
            .with_context(|| format!("cannot remove the stale {}", run_dir.display()))?;
    }
    private_dir::ensure(&run_dir)?;
    Ok(run_dir)
}

/// Removes what `surge run`s killed before their cleanup left under `runs`
/// (`session-<id>-<pid>` of a pid that is gone): their mounts, dead since their FUSE daemon
/// died ("transport endpoint is not connected"), are detached first.
fn clean_stale_runs(runs: &Path) {
    let Ok(rd) = std::fs::read_dir(runs) else {
        return;
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix("session-")
            .and_then(|r| r.rsplit('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            remove_stale_run(&e.path(), pid, &mountinfo);
        }
    }
}

fn remove_stale_run(dir: &Path, pid: i32, mountinfo: &str) {
    let mut mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| Path::new(mp).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mp in mounts {
        if mount::is_root() {
            if let Ok(c) = std::ffi::CString::new(mp) {
                // SAFETY: c is a valid NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        } else {
            let _ = std::process::Command::new("fusermount3")
                .args(["-u", "-z", mp])
                .status();
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => eprintln!(
            "surge run: removed {} left by a surge run (pid {pid}) that was killed",
            dir.display()
        ),
        Err(e) => eprintln!("surge run: cannot remove {}: {e}", dir.display()),
    }
}
