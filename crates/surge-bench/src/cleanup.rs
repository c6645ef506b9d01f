//! Nothing left behind: every benchmark directory and worker process is registered here while
//! it exists, and a Ctrl-C (or SIGTERM/SIGHUP) handler kills the workers, removes the
//! directories through their backend and exits with status 130. On the normal and error paths
//! [`RunDir`]'s `Drop` does the removal. Workers ignore SIGINT (the terminal sends it to the
//! whole process group) so that the parent alone decides, and die with the parent
//! (PR_SET_PDEATHSIG) if it is killed outright.

use crate::backend::Backend;
use crate::BenchError;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};

#[derive(Default)]
struct Registry {
    pids: Vec<u32>,
    dirs: Vec<(Arc<dyn Backend>, PathBuf)>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    dirs: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic while holding the lock must not stop the cleanup.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Installs the interrupt handler once per process.
pub fn install_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = ctrlc::set_handler(on_interrupt) {
            tracing::warn!(
                "cannot install the Ctrl-C handler, an interrupted run may leave files: {e}"
            );
        }
    });
}

fn on_interrupt() {
    let reg = registry();
    for &pid in &reg.pids {
        // SAFETY: plain syscalls on a pid we spawned and have not reaped.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    for &pid in &reg.pids {
        let mut status = 0;
        // SAFETY: as above; reaping makes sure the process no longer creates files.
        unsafe {
            libc::waitpid(pid as libc::pid_t, &mut status, 0);
        }
    }
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprint!("\r\x1b[K");
    }
    for (backend, dir) in &reg.dirs {
        match backend.remove_tree(dir) {
            Ok(()) => eprintln!("surge bench: interrupted; removed {}", dir.display()),
            Err(e) => eprintln!(
                "surge bench: interrupted; could not remove {}: {e}",
                dir.display()
            ),
        }
    }
    std::process::exit(130);
}

pub fn register_pid(pid: u32) {
    registry().pids.push(pid);
}

pub fn unregister_pid(pid: u32) {
    registry().pids.retain(|&p| p != pid);
}

/// A directory a run creates and owns: removed (with everything in it) when dropped, unless
/// `keep` is set, and on interrupt.
pub struct RunDir {
    backend: Arc<dyn Backend>,
    path: PathBuf,
    keep: bool,
}

impl RunDir {
    /// Creates the directory; this is also the check that the target is writable.
    pub fn create(
        backend: Arc<dyn Backend>,
        path: PathBuf,
        keep: bool,
    ) -> Result<RunDir, BenchError> {
        backend.mkdir(&path).map_err(|e| {
            let parent = path.parent().unwrap_or(&path).display().to_string();
            let why = match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => "it is not writable by this user",
                Some(libc::EROFS) => "it is on a read-only file system",
                Some(libc::ENOSPC) | Some(libc::EDQUOT) => "it has no space (or inodes) left",
                _ => "the benchmark directory cannot be created there",
            };
            BenchError::Setup(format!("cannot write to {parent}: {why} ({e})"))
        })?;
        if !keep {
            registry().dirs.push((backend.clone(), path.clone()));
        }
        Ok(RunDir {
            backend,
            path,
            keep,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Err(e) = self.backend.remove_tree(&self.path) {
            eprintln!("surge bench: could not remove {}: {e}", self.path.display());
        }
        registry().dirs.retain(|(_, p)| p != &self.path);
    }
}

/// In a worker: ignore SIGINT/SIGTERM-by-terminal and die with the parent.
pub fn worker_signals(parent_pid: u32) {
    // SAFETY: setting dispositions and the parent-death signal are plain syscalls.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        #[cfg(target_os = "linux")]
        {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // The parent may have died before prctl: then we were re-parented.
            if libc::getppid() as u32 != parent_pid {
                libc::_exit(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PosixBackend;

    #[test]
    fn run_dir_is_removed_on_drop_unless_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let b: Arc<dyn Backend> = Arc::new(PosixBackend);
        let p = tmp.path().join("run");
        {
            let d = RunDir::create(b.clone(), p.clone(), false).unwrap();
            std::fs::write(d.path().join("f"), b"x").unwrap();
            assert!(registry().dirs.iter().any(|(_, x)| x == &p));
        }
        assert!(!p.exists());
        assert!(!registry().dirs.iter().any(|(_, x)| x == &p));
        {
            let _d = RunDir::create(b.clone(), p.clone(), true).unwrap();
        }
        assert!(p.exists());
    }

    #[test]
    fn unwritable_target_is_a_clear_error() {
        let b: Arc<dyn Backend> = Arc::new(PosixBackend);
        let e = RunDir::create(b, PathBuf::from("/proc/surge-bench-test"), false)
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("cannot write to /proc"), "{e}");
    }
}
