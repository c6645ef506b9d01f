//! `mount.fuse.surge`: the helper mount(8) runs for `mount -t fuse.surge SPEC DIR -o OPTIONS`
//! and for fstab lines of type `fuse.surge`. It starts `surge mount` in the background (its own
//! session, its log in a file), returns once the mount is up, and fails with the mount's own
//! words when it does not come up. `-o remount,...` changes the kernel flags of a mount that is
//! there (`ro`/`rw`, `exec`, ...) without restarting it. The mount table shows the type as
//! `fuse` (as for any FUSE file system root mounts without fusermount, and as xfstests
//! expects), so a remount names the type: `mount -t fuse.surge -o remount,ro SPEC DIR`.
//!
//! The `surge` binary is this helper when it is called by that name (a symlink, which `make
//! install` makes in /sbin).
//!
//! SPEC is the name the mount table shows (what `findmnt`, `df` and xfstests' `TEST_DEV` see).
//! It also says which instance to mount, unless options do:
//!
//! - `NAME`: the persistent instance NAME, from the manager (`manager=HOST:PORT`, else
//!   `$SURGE_MANAGER`); a number: the instance with that id, from the manager.
//! - `server=ADDR,instance=ID` (no manager; the capability is made with the cluster key,
//!   `key_file=FILE`, else `$SURGE_KEY_FILE`, else /etc/surge/surge.key), or
//!   `descriptor=FILE`: that instance, SPEC only its name.
//!
//! Other Surge options: `ns=N`, `attr_ttl=SECS`, `entry_ttl=SECS`, `layout=LAYOUT`,
//! `no_passthrough`, `threads=N`, `deadline=SECS`, `hard`, `log=FILE` (default
//! /run/surge/mounts/<DIR>.log). Kernel flags (`ro`, `dev`, `suid`, `noexec`, ...) and the
//! access-time rules (`relatime`, the default; `noatime`; `strictatime`; `nodiratime`) go to
//! the mount; mount(8)'s own (`defaults`, `noauto`, `_netdev`, `x-*`, ...) and what every
//! Surge mount is anyway (`allow_other`, `default_permissions`) are accepted and ignored.
//!
//! fstab:
//! ```text
//! scratch1  /mnt/bb  fuse.surge  manager=mgr1:7070,_netdev  0 0
//! ```

use anyhow::Context;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use tracing::info;

/// The names this binary answers to as a mount helper.
pub const NAMES: &[&str] = &["mount.fuse.surge", "mount.surge"];

/// How long the helper waits for the mount to come up (its first request to the metadata
/// server included) before it gives up and stops it.
pub const MOUNT_WAIT: Duration = Duration::from_secs(60);

/// What mount(8) passed.
#[derive(Debug, Default, PartialEq)]
pub struct HelperArgs {
    pub spec: String,
    pub dir: PathBuf,
    /// The `-o` options, in order (several `-o` are joined).
    pub options: Vec<String>,
    /// `-f`: do everything but mount.
    pub fake: bool,
}

/// Parses `mount.fuse.surge SPEC DIR [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE]` (mount(8)'s
/// helper convention; options may also come first).
pub fn parse_args(argv: &[OsString]) -> anyhow::Result<HelperArgs> {
    let mut out = HelperArgs::default();
    let mut positional = Vec::new();
    let mut it = argv.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => {
                let v = it.next().context("-o needs a value")?;
                out.options.extend(split_options(&v));
            }
            "-t" | "-N" => {
                it.next().with_context(|| format!("{a} needs a value"))?;
            }
            s if s.starts_with("-o") => out.options.extend(split_options(&s[2..])),
            s if s.starts_with('-') && s.len() > 1 => {
                for c in s[1..].chars() {
                    match c {
                        'f' => out.fake = true,
                        's' | 'n' | 'v' | 'w' | 'r' => {
                            if c == 'r' {
                                out.options.push("ro".into());
                            }
                            if c == 'w' {
                                out.options.push("rw".into());
                            }
                        }
                        other => anyhow::bail!("unknown flag -{other}"),
                    }
                }
            }
            _ => positional.push(a),
        }
    }
    let [spec, dir] = <[String; 2]>::try_from(positional).map_err(|p| {
        anyhow::anyhow!(
            "usage: mount.fuse.surge SPEC DIR [-o OPTIONS] (got {} arguments: {p:?})",
            p.len()
        )
    })?;
    out.spec = spec;
    out.dir = PathBuf::from(dir);
    Ok(out)
}

fn split_options(s: &str) -> impl Iterator<Item = String> + '_ {
    s.split(',').filter(|o| !o.is_empty()).map(str::to_string)
}

/// mount(8)'s own options and what every Surge mount is anyway: accepted, no effect.
fn ignored(name: &str) -> bool {
    matches!(
        name,
        "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "_netdev"
            | "nofail"
            | "comment"
            | "allow_other"
            | "allow_root"
            | "default_permissions"
            | "loud"
            | "silent"
            | "helper"
            | "subtype"
            | "fsname"
    ) || name.starts_with("x-")
}

/// What the options ask for: the `surge mount` arguments, the kernel flags, and the log.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Arguments of `surge mount` before the mount point.
    pub mount_args: Vec<String>,
    /// Kernel flags (`ro`, `dev`, ...), as `surge mount -o` takes them.
    pub flags: Vec<String>,
    pub remount: bool,
    pub log: Option<PathBuf>,
    /// Environment of the mount (`SURGE_KEY_FILE`, `SURGE_MANAGER`).
    pub env: Vec<(String, String)>,
}

/// Turns SPEC and the options into a [`Plan`]; an unknown option is an error (a typo in fstab
/// must not mount something else than meant).
pub fn plan(args: &HelperArgs) -> anyhow::Result<Plan> {
    let mut p = Plan::default();
    let (mut server, mut instance, mut descriptor, mut manager) = (None, None, None, None);
    for o in &args.options {
        let (name, value) = match o.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (o.as_str(), None),
        };
        let need = || value.with_context(|| format!("option {name} needs a value ({name}=...)"));
        match name {
            "remount" => p.remount = true,
            "server" => server = Some(need()?.to_string()),
            "instance" => instance = Some(need()?.to_string()),
            "descriptor" => descriptor = Some(need()?.to_string()),
            "manager" => manager = Some(need()?.to_string()),
            "key_file" | "keyfile" => p.env.push(("SURGE_KEY_FILE".into(), need()?.into())),
            "log" => p.log = Some(PathBuf::from(need()?)),
            "ns" | "attr_ttl" | "entry_ttl" | "layout" | "threads" | "deadline" | "read_ahead"
            | "fuse_transport" => {
                p.mount_args.push(format!("--{}", name.replace('_', "-")));
                p.mount_args.push(need()?.to_string());
            }
            "no_passthrough" | "hard" | "async_metadata" => {
                p.mount_args.push(format!("--{}", name.replace('_', "-")))
            }
            "source" => {
                // libfuse's way to give the source apart from the shown name: the same as SPEC.
                let v = need()?;
                if v.chars().all(|c| c.is_ascii_digit()) {
                    instance = Some(v.to_string());
                } else {
                    p.mount_args.extend(["--persistent".into(), v.to_string()]);
                }
            }
            n if crate::mount::kernel_flag(n).is_some()
                || crate::mount::atime_flag(n).is_some() =>
            {
                p.flags.push(n.to_string())
            }
            n if ignored(n) => {}
            other => anyhow::bail!(
                "unknown option '{other}' (see `man mount.fuse.surge`, or the module doc of \
                 surge-client's mount_helper.rs)"
            ),
        }
    }
    if p.remount {
        return Ok(p);
    }
    let has_source = p.mount_args.iter().any(|a| a == "--persistent") || instance.is_some();
    match (descriptor, server) {
        (Some(d), None) => p.mount_args.extend(["--descriptor".into(), d]),
        (Some(_), Some(_)) => anyhow::bail!("give descriptor= or server=, not both"),
        (None, Some(s)) => {
            let i = instance.take().context("server= needs instance=ID")?;
            p.mount_args
                .extend(["--server".into(), s, "--instance".into(), i]);
        }
        (None, None) => {
            if let Some(m) = manager {
                p.env.push(("SURGE_MANAGER".into(), m));
            }
            if let Some(i) = instance.take() {
                p.mount_args.extend(["--instance".into(), i]);
            } else if !has_source {
                if args.spec.chars().all(|c| c.is_ascii_digit()) {
                    p.mount_args
                        .extend(["--instance".into(), args.spec.clone()]);
                } else {
                    p.mount_args
                        .extend(["--persistent".into(), args.spec.clone()]);
                }
            }
        }
    }
    p.mount_args.extend(["--fsname".into(), args.spec.clone()]);
    Ok(p)
}

/// Where the log of a mount goes by default: /run/surge/mounts/<DIR with / as _>.log.
fn default_log(dir: &Path) -> PathBuf {
    let name: String = dir
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| if c == '/' { '_' } else { c })
        .collect();
    Path::new("/run/surge/mounts").join(format!("{name}.log"))
}

/// Runs the helper; `argv` without the program name.
pub fn run(argv: &[OsString]) -> anyhow::Result<ExitCode> {
    let args = parse_args(argv)?;
    let plan = plan(&args)?;
    if args.fake {
        return Ok(ExitCode::SUCCESS);
    }
    if plan.remount {
        return remount(&args.dir, &plan.flags).map(|()| ExitCode::SUCCESS);
    }
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("mount point {}", args.dir.display()))?;
    let log = plan.log.clone().unwrap_or_else(|| default_log(&dir));
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot make {} for the mount's log", parent.display()))?;
    }
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot open the mount's log {}", log.display()))?;
    let ready = log.with_extension(format!("ready.{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let exe = std::env::current_exe().context("cannot find the surge binary")?;
    let mut cmd = Command::new(&exe);
    cmd.arg("mount")
        .args(&plan.mount_args)
        .arg("--ready-file")
        .arg(&ready);
    if !plan.flags.is_empty() {
        cmd.arg("--options").arg(plan.flags.join(","));
    }
    cmd.arg(&dir)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(logf);
    // SAFETY: setsid is async-signal-safe; the mount outlives mount(8) in a session of its own.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    info!("mount.fuse.surge: {:?}", cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    let start = Instant::now();
    loop {
        if ready.exists() {
            let _ = std::fs::remove_file(&ready);
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(status) = child.try_wait().context("waiting for surge mount")? {
            anyhow::bail!(
                "surge mount of {} on {} ended ({status}) before mounting; its log {}:\n{}",
                args.spec,
                dir.display(),
                log.display(),
                log_tail(&log)
            );
        }
        if start.elapsed() > MOUNT_WAIT {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "surge mount of {} on {} was not up after {MOUNT_WAIT:?}: stopped it; its log \
                 {}:\n{}",
                args.spec,
                dir.display(),
                log.display(),
                log_tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last lines of a log, for an error.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// `-o remount,FLAGS`: the kernel flags of the mount at `dir` change (MS_REMOUNT); those the
/// options do not name stay as they are; the FUSE session goes on.
fn remount(dir: &Path, flags: &[String]) -> anyhow::Result<()> {
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{} has a NUL byte", dir.display()))?;
    // SAFETY: an all-zero statvfs is valid; statvfs fills it from a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c_dir.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot read the flags of {}", dir.display()));
    }
    // The mount's flags now (these ST_* bits have their MS_* values; ST_RELATIME has not),
    // then the options in order. The mount's own access-time rule stays as it was mounted.
    const KEPT: libc::c_ulong = libc::MS_RDONLY
        | libc::MS_NOSUID
        | libc::MS_NODEV
        | libc::MS_NOEXEC
        | libc::MS_SYNCHRONOUS
        | libc::MS_NOATIME
        | libc::MS_NODIRATIME;
    const _: () =
        assert!(libc::ST_NOEXEC == libc::MS_NOEXEC && libc::ST_NOATIME == libc::MS_NOATIME);
    let mut ms = st.f_flag & KEPT;
    for f in flags {
        let (set, clear) = match f.as_str() {
            "ro" => (libc::MS_RDONLY, 0),
            "rw" => (0, libc::MS_RDONLY),
            "nosuid" => (libc::MS_NOSUID, 0),
            "suid" => (0, libc::MS_NOSUID),
            "nodev" => (libc::MS_NODEV, 0),
            "dev" => (0, libc::MS_NODEV),
            "noexec" => (libc::MS_NOEXEC, 0),
            "exec" => (0, libc::MS_NOEXEC),
            "sync" => (libc::MS_SYNCHRONOUS, 0),
            "async" => (0, libc::MS_SYNCHRONOUS),
            "dirsync" => (libc::MS_DIRSYNC, 0),
            _ => (0, 0),
        };
        ms = (ms | set) & !clear;
    }
    // SAFETY: a valid NUL-terminated path; null source, type and data are allowed for a
    // remount.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c_dir.as_ptr(),
            std::ptr::null(),
            ms | libc::MS_REMOUNT,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot remount {}", dir.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> HelperArgs {
        let v: Vec<OsString> = v.iter().map(OsString::from).collect();
        parse_args(&v).expect("parse")
    }

    #[test]
    fn a_persistent_instance_by_name_through_the_manager() {
        let a = args(&["scratch1", "/mnt/bb", "-o", "rw,manager=m:7070,_netdev"]);
        let p = plan(&a).expect("plan");
        assert_eq!(
            p.mount_args,
            ["--persistent", "scratch1", "--fsname", "scratch1"]
        );
        assert_eq!(p.flags, ["rw"]);
        assert_eq!(p.env, [("SURGE_MANAGER".into(), "m:7070".into())]);
    }

    #[test]
    fn a_server_and_an_instance_with_spec_only_the_shown_name() {
        let a = args(&[
            "surge_test",
            "/mnt/t",
            "-oserver=unix:/s.sock,instance=7,key_file=/k",
            "-o",
            "layout=stripe_count=all,ro",
        ]);
        let p = plan(&a).expect("plan");
        assert_eq!(
            p.mount_args,
            [
                "--layout",
                "stripe_count=all",
                "--server",
                "unix:/s.sock",
                "--instance",
                "7",
                "--fsname",
                "surge_test"
            ]
        );
        assert_eq!(p.flags, ["ro"]);
        assert_eq!(p.env, [("SURGE_KEY_FILE".into(), "/k".into())]);
    }

    #[test]
    fn an_unknown_option_is_refused() {
        let a = args(&["x", "/mnt", "-o", "stripe=4"]);
        assert!(plan(&a).is_err());
        assert!(parse_args(&[OsString::from("only-one")]).is_err());
    }

    #[test]
    fn remount_changes_flags_only() {
        let a = args(&["x", "/mnt", "-o", "remount,ro"]);
        let p = plan(&a).expect("plan");
        assert!(p.remount);
        assert_eq!(p.flags, ["ro"]);
        assert!(p.mount_args.is_empty());
    }
}
