//! `surge stage worker`: one stage task, run as the task's owner.
//!
//! The manager starts a worker per task with the owner's uid, gid and supplementary groups
//! (docs/SECURITY.md: the manager never opens a user's path with its own rights), so a
//! stage-in reads only what the owner may read and a stage-out writes only where the owner may
//! write. The worker reads its [`Task`] as one JSON document on stdin and writes [`Event`]s as
//! JSON lines on stdout: the plan (or why planning failed), progress every 200 ms, and the
//! report. SIGTERM (the task terminated) stops it at its next chunk, files not finished
//! removed, as an interrupted `surge stage copy`.

use crate::{Direction, Progress, ProgressSnapshot, StageItem, StageOptions, StageReport};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use surge_client::InstanceClient;
use surge_core::NamespaceId;

/// What a worker copies.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Task {
    pub desc: surge_proto::InstanceDescriptor,
    pub ns: u32,
    /// A capability for the instance's servers (`surge_auth::Token` as text), for the owner.
    pub token: String,
    pub direction: Direction,
    pub items: Vec<StageItem>,
    pub opts: StageOptions,
    /// A cache instance's fill or drain instead of a copy (`items` is empty then).
    #[serde(default)]
    pub cache: Option<crate::cache_task::CacheWork>,
    /// The instance is persistent: a cache's drain keeps the fill names the next job reads
    /// lazily filled files by (a job instance's go after its drain).
    #[serde(default)]
    pub persistent: bool,
}

/// What a worker says, one JSON line each.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// Planned: this many files and bytes to copy.
    Planned {
        files: u64,
        bytes: u64,
    },
    Progress(ProgressSnapshot),
    /// The copy ended (failed files, if any, in the report).
    Done(StageReport),
    /// Terminated (SIGTERM) before or while copying.
    Cancelled,
    /// Planning or the copy failed as a whole (missing source, no space, ...).
    Failed(String),
}

fn say(e: &Event) {
    let mut out = std::io::stdout().lock();
    if let Ok(line) = serde_json::to_string(e) {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Runs the task on stdin (the `surge stage worker` command).
pub fn run() -> anyhow::Result<ExitCode> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read the task on stdin")?;
    let task: Task = serde_json::from_str(&text).context("the task on stdin is not valid")?;
    // A parent that takes its signals with a signal thread (`surge run`, `surge mover`) blocks
    // them, and an exec'd child inherits the mask: SIGTERM (a copy terminated, a cache's
    // drain told to finish) would stay pending for ever. Unblocked before the runtime's
    // threads exist. A copy terminated once its last file landed reports itself done
    // (`execute`), so terminating never leaves files behind a task said to be gone.
    // SAFETY: an empty set, initialised by sigemptyset, and a null old set.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let ok = rt.block_on(work(task));
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn work(task: Task) -> bool {
    if let Some(cw) = task.cache {
        let client = match surge_auth::Token::from_text(&task.token)
            .map_err(|e| e.to_string())
            .and_then(|token| {
                InstanceClient::new(task.desc.clone(), NamespaceId(task.ns), token)
                    .map_err(|e| format!("instance {}: {e}", task.desc.instance))
            }) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                say(&Event::Failed(e));
                return false;
            }
        };
        let Some(pfs) = task.desc.cache_pfs.clone() else {
            say(&Event::Failed(format!(
                "instance {} is not a type=cache instance: nothing to {}",
                task.desc.instance,
                cw.as_str()
            )));
            return false;
        };
        return crate::cache_task::run(cw, client, pfs.into(), task.persistent, say).await;
    }
    let progress = Arc::new(Progress::new());
    {
        // SIGTERM: stop at the next chunk.
        let p = progress.clone();
        tokio::spawn(async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                term.recv().await;
                p.cancel();
            }
        });
    }
    let planning = async {
        let token = surge_auth::Token::from_text(&task.token).map_err(|e| e.to_string())?;
        let client = InstanceClient::new(task.desc.clone(), NamespaceId(task.ns), token)
            .map(Arc::new)
            .map_err(|e| format!("instance {}: {e}", task.desc.instance))?;
        let plan = crate::plan(&client, task.direction, &task.items)
            .await
            .map_err(|e| e.to_string())?;
        if task.direction == Direction::In {
            crate::check_fits(&client, &plan)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok::<_, String>((client, plan))
    };
    let (client, plan) = match planning.await {
        Ok(x) => x,
        Err(e) => {
            say(&Event::Failed(e));
            return false;
        }
    };
    if progress.is_cancelled() {
        say(&Event::Cancelled);
        return false;
    }
    say(&Event::Planned {
        files: plan.files,
        bytes: plan.bytes,
    });
    let ticker = {
        let p = progress.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                say(&Event::Progress(p.snapshot()));
            }
        })
    };
    let result = crate::execute(client, &plan, &task.opts, progress.clone()).await;
    ticker.abort();
    say(&Event::Progress(progress.snapshot()));
    match result {
        // Every file made before the termination came: the copy is whole, and is reported
        // as done (reporting it terminated would leave files behind a task said to be gone).
        Ok(report) if report.ok() && report.files >= plan.files => {
            say(&Event::Done(report));
            true
        }
        _ if progress.is_cancelled() => {
            say(&Event::Cancelled);
            false
        }
        Ok(report) => {
            let ok = report.ok();
            say(&Event::Done(report));
            ok
        }
        Err(e) => {
            say(&Event::Failed(e.to_string()));
            false
        }
    }
}

/// Starts `exe stage worker` for `task` as `uid`/`gid` with supplementary `groups` (dropping
/// root's rights before exec; a caller that is not root can only start its own user's), the
/// task written to its stdin; its events come on its stdout. What the manager does for a task
/// it runs itself and what a data mover (`surge mover`) does for one it is given.
pub fn spawn(
    exe: &std::path::Path,
    task: &Task,
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
) -> Result<tokio::process::Child, String> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut cmd = tokio::process::Command::new(exe);
    // A clean environment (the manager's is root's: HOME=/root, its keys, its sockets) and
    // only three descriptors, all pipes of this task: the owner can read what the worker
    // holds (it runs as them), so it holds nothing of the manager's (issue 31).
    cmd.args(["stage", "worker"])
        .current_dir("/")
        .env_clear()
        .envs(owner_env(uid))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if uid != me {
        if me != 0 {
            return Err(format!(
                "running as uid {me}, cannot copy as uid {uid} (run as root to serve other \
                 users' jobs)"
            ));
        }
        // SAFETY: between fork and exec only async-signal-safe system calls run, on data
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // Dies with its parent (set after the uid change, which clears it): a worker
                // outliving a killed manager would copy beside the task the next leader starts.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                close_inherited();
                Ok(())
            });
        }
    } else {
        // SAFETY: as above.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                close_inherited();
                Ok(())
            });
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {} stage worker: {e}", exe.display()))?;
    let text = serde_json::to_vec(task).map_err(|e| e.to_string())?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| "the stage worker has no stdin".to_string())?;
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&text).await;
    });
    if let Some(stderr) = child.stderr.take() {
        let pid = child.id().unwrap_or(0);
        tokio::spawn(log_stderr(pid, stderr));
    }
    Ok(child)
}

/// Marks every descriptor above stderr close-on-exec (in the child, before exec): whatever
/// the manager inherited or opened without it (a parent's pipe, a log) does not reach a
/// process its owner can read the descriptors of (pidfd_getfd, /proc).
///
/// # Safety
/// Async-signal-safe (one system call); called between fork and exec only.
unsafe fn close_inherited() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes flags of this process's descriptors.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// The environment a worker of `uid` gets: a fixed PATH, the owner's name and home, a
/// locale; nothing of its parent's.
fn owner_env(uid: u32) -> Vec<(String, String)> {
    let name = surge_auth_name(uid);
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), home_of(uid).unwrap_or_else(|| "/".into())),
        ("USER".into(), name.clone()),
        ("LOGNAME".into(), name),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    // Where the site CA is and whether to use TLS (a mode and paths to public certificates,
    // nothing secret): the worker is a client of the servers like any other.
    for k in ["SURGE_TLS", "SURGE_TLS_CA", "SURGE_TLS_DIR"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.into(), v));
        }
    }
    env
}

fn surge_auth_name(uid: u32) -> String {
    passwd_field(uid, |pw| pw.pw_name).unwrap_or_else(|| format!("uid{uid}"))
}

fn home_of(uid: u32) -> Option<String> {
    passwd_field(uid, |pw| pw.pw_dir)
}

fn passwd_field(uid: u32, f: impl Fn(&libc::passwd) -> *mut libc::c_char) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: getpwuid_r writes into `pw` and `buf` (of the given length) and sets `out` to
    // &pw or null; the field is read while `buf` lives.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out);
        if rc != 0 || out.is_null() {
            return None;
        }
        let p = f(&pw);
        if p.is_null() {
            return None;
        }
        Some(std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

/// Lines of a worker's output this long at most (an event, a log line): a worker that runs
/// as a user is theirs to write into, so nothing it writes may grow its reader without bound.
pub const MAX_LINE: usize = 1 << 20;

/// Log lines of one worker kept (the rest are counted).
const MAX_LOG_LINES: usize = 200;

/// Logs what a worker writes on stderr, bounded: lines cut, at most [`MAX_LOG_LINES`].
async fn log_stderr(pid: u32, stderr: tokio::process::ChildStderr) {
    let mut lines = Lines::new(stderr);
    let (mut n, mut dropped) = (0usize, 0u64);
    loop {
        match lines.next_line().await {
            Ok(Some(l)) if n < MAX_LOG_LINES => {
                n += 1;
                tracing::warn!(
                    "stage worker {pid}: {}",
                    surge_core::limits::bounded(&l, 1024)
                );
            }
            Ok(Some(_)) => dropped += 1,
            Ok(None) => break,
            Err(_) => dropped += 1,
        }
    }
    if dropped > 0 {
        tracing::warn!("stage worker {pid}: {dropped} more line(s) not logged");
    }
}

/// Lines of a worker's output, each at most [`MAX_LINE`] bytes: a longer one is an error
/// (its bytes are skipped up to its end, never kept).
pub struct Lines<R> {
    reader: tokio::io::BufReader<R>,
}

impl<R: tokio::io::AsyncRead + Unpin> Lines<R> {
    pub fn new(r: R) -> Lines<R> {
        Lines {
            reader: tokio::io::BufReader::new(r),
        }
    }

    /// The next line without its newline; `None` at the end.
    pub async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        use tokio::io::AsyncBufReadExt;
        let mut line = Vec::new();
        let mut too_long = false;
        loop {
            let buf = self.reader.fill_buf().await?;
            if buf.is_empty() {
                if line.is_empty() && !too_long {
                    return Ok(None);
                }
                break;
            }
            let (take, end) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (buf.len(), false),
            };
            if !too_long && line.len() + take <= MAX_LINE {
                line.extend_from_slice(&buf[..take]);
            } else {
                too_long = true;
                line.clear();
            }
            self.reader.consume(take + usize::from(end));
            if end {
                break;
            }
        }
        if too_long {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line longer than {MAX_LINE} bytes"),
            ));
        }
        Ok(Some(String::from_utf8_lossy(&line).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_line_past_the_bound_is_an_error_and_the_next_one_reads() {
        let mut input = vec![b'x'; MAX_LINE + 10];
        input.extend_from_slice(b"\n{\"ok\":1}\nlast");
        let mut l = Lines::new(&input[..]);
        let e = l.next_line().await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(l.next_line().await.unwrap().as_deref(), Some("{\"ok\":1}"));
        assert_eq!(l.next_line().await.unwrap().as_deref(), Some("last"));
        assert_eq!(l.next_line().await.unwrap(), None);
    }

    #[test]
    fn a_worker_gets_none_of_its_parents_environment() {
        let env = owner_env(0);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "HOME", "USER", "LOGNAME", "LANG"]);
        assert!(env.iter().any(|(k, v)| k == "HOME" && v == "/root"));
    }
}
