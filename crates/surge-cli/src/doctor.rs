//! `surge doctor`: checks a host for the part it plays (manager, BB server, compute-node agent,
//! data mover, or a client that runs `surge run`/`surge mount`) and says, check by check, what
//! is wrong and what to type to fix it; `lctl`/`scontrol ping`-style, for the admin who just
//! installed the package. The daemons' settings come from the configuration file (and flags
//! after `--`), parsed by the daemons' own flag parser, so the doctor checks exactly what the
//! unit would run with.
//!
//! Boundaries: it reads and connects; it never changes the host, starts or stops anything.

use crate::accounts;
use crate::config::{self, Daemon, SurgeConfig};
use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Check a host for its role: FUSE, the passthrough helper, MUNGE, key files and their modes
/// and owners, the manager reachable (and this server or agent known to it), the clock, ports.
///
/// Each check prints OK, WARN or FAIL with what to fix; the exit status is 1 when any check
/// FAILs. The role's settings come from the configuration file (--config, default
/// /etc/surge/surge.toml when it exists) and from the daemon's flags given after `--`, as
/// its unit would run it.
///
/// Examples:
///   surge doctor --role server
///   surge doctor --role agent --json
///   surge doctor --role manager -- --listen 0.0.0.0:7060 --key-file /etc/surge/surge.key
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DoctorArgs {
    /// What this host is: manager, server (a BB node), agent (a compute node), mover (a data
    /// mover), or client (a login or compute node where users run surge).
    #[arg(long, value_enum)]
    pub role: Role,
    /// The user the role's daemon runs as (key files and devices must be its own). Default:
    /// the running daemon's user, else the unit's `User=` (surge-server: surge), else root.
    #[arg(long = "as", value_name = "USER")]
    pub as_user: Option<String>,
    /// Print the checks as JSON: {"role", "config", "checks": [{"check", "status", "detail",
    /// "fix"}], "failed", "warnings"}.
    #[arg(long)]
    pub json: bool,
    /// The daemon's own flags (after `--`), added to the configuration file's.
    #[arg(last = true, value_name = "DAEMON-FLAGS")]
    pub daemon_flags: Vec<OsString>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Manager,
    Server,
    Agent,
    Mover,
    Client,
}

impl Role {
    fn daemon(self) -> Option<Daemon> {
        match self {
            Role::Manager => Some(Daemon::Manager),
            Role::Server => Some(Daemon::Server),
            Role::Agent => Some(Daemon::Agent),
            Role::Mover => Some(Daemon::Mover),
            Role::Client => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Role::Manager => "manager",
            Role::Server => "server",
            Role::Agent => "agent",
            Role::Mover => "mover",
            Role::Client => "client",
        }
    }

    /// The unit that runs it, and the user the unit names when it names none here.
    fn unit(self) -> Option<(&'static str, &'static str)> {
        match self {
            Role::Manager => Some(("surge-manager.service", "root")),
            Role::Server => Some(("surge-server.service", "surge")),
            Role::Agent => Some(("surge-agent.service", "root")),
            Role::Mover => Some(("surge-mover.service", "root")),
            Role::Client => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check's verdict.
#[derive(Debug)]
struct Check {
    name: &'static str,
    status: Status,
    detail: String,
    fix: Option<String>,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn ok(&mut self, name: &'static str, detail: impl Into<String>) {
        self.push(name, Status::Ok, detail, None::<String>);
    }
    fn warn(&mut self, name: &'static str, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(name, Status::Warn, detail, Some(fix));
    }
    fn fail(&mut self, name: &'static str, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(name, Status::Fail, detail, Some(fix));
    }
    fn push(
        &mut self,
        name: &'static str,
        status: Status,
        detail: impl Into<String>,
        fix: Option<impl Into<String>>,
    ) {
        self.checks.push(Check {
            name,
            status,
            detail: detail.into(),
            fix: fix.map(Into::into),
        });
    }
    fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }
}

/// What the role runs with, as its daemon's flag parser reads it.
enum Settings {
    Manager(surge_manager::cli::ManagerArgs),
    Server(surge_server::cli::ServerArgs),
    Agent(surge_run::agent::AgentArgs),
    Mover(surge_run::mover::MoverArgs),
    Client,
    /// The command line did not parse (reported as the config check's failure).
    Unknown,
}

pub fn run(args: DoctorArgs, config_flag: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let mut r = Report::default();
    // The configuration file: the one given, else the installed one when it exists.
    let config_path = match config_flag {
        Some(p) => Some(p),
        None => Some(PathBuf::from(config::DEFAULT_PATH)).filter(|p| p.exists()),
    };
    let cfg = check_config(&mut r, args.role, config_path.as_deref());
    let settings = settings(&mut r, &args, config_path.as_deref(), cfg.as_ref());
    let user = daemon_user(&mut r, &args, &settings);
    let munge_socket = munge_socket(args.role, &settings, cfg.as_ref());

    match args.role {
        Role::Agent | Role::Mover => check_root(&mut r, args.role),
        _ => {}
    }
    if matches!(args.role, Role::Agent | Role::Client) {
        check_fuse(&mut r, args.role);
    }
    if args.role == Role::Client {
        check_helper(&mut r);
    }
    check_munge(&mut r, &munge_socket);
    let key_file = key_file(&settings);
    match args.role {
        Role::Manager | Role::Server => check_key(&mut r, &key_file, user.as_ref(), true),
        // Elsewhere the key has no business being readable by users.
        _ => check_key(&mut r, &key_file, None, false),
    }
    match &settings {
        Settings::Manager(m) => {
            check_state_dir(&mut r, &m.state, user.as_ref());
            check_admin_group(&mut r, m.admin_group);
            check_port(&mut r, "port", &m.listen, "manager");
            if let Some(h) = &m.http {
                check_port(&mut r, "port", h, "manager");
            }
        }
        Settings::Server(s) => {
            check_devices(&mut r, &s.devices, s.capacity, user.as_ref());
            check_port(&mut r, "port", &s.listen, "server");
            if let Some(m) = &s.metrics {
                check_port(&mut r, "port", m, "server");
            }
        }
        _ => {}
    }
    let manager = manager_addr(args.role, &settings, cfg.as_ref());
    let skew = match &manager {
        Some(addr) => check_manager(&mut r, args.role, addr, &munge_socket, &settings),
        None => {
            if args.role == Role::Client {
                r.warn(
                    "manager",
                    "no manager configured ([cluster] manager in the configuration file, or \
                     $SURGE_MANAGER): `surge run` uses its embedded default on this host",
                    "set `manager = \"HOST:7060\"` under [cluster] in /etc/surge/surge.toml",
                );
            }
            None
        }
    };
    check_clock(&mut r, skew);
    print(&r, &args, config_path.as_deref())
}

fn print(r: &Report, args: &DoctorArgs, config_path: Option<&Path>) -> anyhow::Result<ExitCode> {
    let failed = r.count(Status::Fail);
    let warnings = r.count(Status::Warn);
    if args.json {
        let checks: Vec<serde_json::Value> = r
            .checks
            .iter()
            .map(|c| {
                serde_json::json!({
                    "check": c.name,
                    "status": c.status.word().to_lowercase(),
                    "detail": c.detail,
                    "fix": c.fix,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "role": args.role.name(),
                "config": config_path,
                "checks": checks,
                "failed": failed,
                "warnings": warnings,
            }))?
        );
    } else {
        println!(
            "surge doctor: {} on {} ({})",
            args.role.name(),
            surge_core::sys::hostname(),
            config_path.map_or("no configuration file".to_string(), |p| p
                .display()
                .to_string())
        );
        for c in &r.checks {
            println!("{:<5} {:<10} {}", c.status.word(), c.name, c.detail);
            if let Some(f) = c.fix.as_ref().filter(|_| c.status != Status::Ok) {
                println!("{:<16} fix: {f}", "");
            }
        }
        println!(
            "{} checks: {} failed, {} warnings",
            r.checks.len(),
            failed,
            warnings
        );
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn check_config(r: &mut Report, role: Role, path: Option<&Path>) -> Option<SurgeConfig> {
    let Some(path) = path else {
        if role.daemon().is_some() {
            r.warn(
                "config",
                format!(
                    "no configuration file ({} does not exist): checking the daemon's defaults \
                     and the flags after --",
                    config::DEFAULT_PATH
                ),
                "install the package's example: cp /usr/share/doc/surge/surge.toml \
                 /etc/surge/surge.toml, and edit it",
            );
        }
        return None;
    };
    match SurgeConfig::load(path) {
        Ok(c) => {
            match role.daemon() {
                Some(d) if !c.has_section(d) => r.warn(
                    "config",
                    format!("{}: no [{}] section", path.display(), d.section()),
                    format!(
                        "add the [{}] section (see /usr/share/doc/surge/surge.toml)",
                        d.section()
                    ),
                ),
                _ => r.ok("config", format!("{} reads", path.display())),
            }
            Some(c)
        }
        Err(e) => {
            r.fail(
                "config",
                format!("{e:#}"),
                format!(
                    "correct {} (`surge config check` says what each section gives)",
                    path.display()
                ),
            );
            None
        }
    }
}

/// The role's settings through its daemon's parser: the file's settings and the flags after
/// `--`, as `surge <daemon> --config FILE FLAGS...` would run.
fn settings(
    r: &mut Report,
    args: &DoctorArgs,
    config_path: Option<&Path>,
    cfg: Option<&SurgeConfig>,
) -> Settings {
    use clap::Parser;
    let Some(d) = args.role.daemon() else {
        return Settings::Client;
    };
    let mut argv: Vec<OsString> = vec!["surge".into(), d.subcommand().into()];
    // A file that did not read is already a failure; its flags are left out.
    if let (Some(p), Some(_)) = (config_path, cfg) {
        argv.push("--config".into());
        argv.push(p.into());
    }
    argv.extend(args.daemon_flags.iter().cloned());
    let parsed = config::expand(argv).and_then(|e| {
        crate::Cli::try_parse_from(&e.args).map_err(|err| anyhow::anyhow!("{}", err.render()))
    });
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            r.fail(
                "flags",
                format!(
                    "`surge {}` would not start: {}",
                    d.subcommand(),
                    first_line(&format!("{e:#}"))
                ),
                format!(
                    "give the missing or wrong setting in [{}] of the configuration file",
                    d.section()
                ),
            );
            return Settings::Unknown;
        }
    };
    match cli.command {
        crate::Command::Manager(m) => Settings::Manager(m),
        crate::Command::Server(crate::ServerCmd { run, sub: None }) => Settings::Server(run),
        crate::Command::Agent(a) => Settings::Agent(a),
        crate::Command::Mover(m) => Settings::Mover(m),
        _ => Settings::Unknown,
    }
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s).trim()
}

/// Who the role's daemon runs as: --as, the running daemon's user, the unit's `User=`, root.
fn daemon_user(r: &mut Report, args: &DoctorArgs, s: &Settings) -> Option<accounts::User> {
    let (unit, unit_default) = args.role.unit()?;
    let missing = |r: &mut Report, name: &str, detail: String, fix: &str| {
        r.fail("user", detail, fix);
        // The checks below still say what this user must own.
        Some(accounts::User {
            name: name.to_string(),
            uid: u32::MAX,
            gid: u32::MAX,
        })
    };
    if let Some(name) = &args.as_user {
        return match accounts::user_by_name(name) {
            Some(u) => Some(u),
            None => missing(
                r,
                name,
                format!("no user '{name}' on this host (--as)"),
                "create it, or name another with --as",
            ),
        };
    }
    let listen = match s {
        Settings::Manager(m) => Some(m.listen.as_str()),
        Settings::Server(s) => Some(s.listen.as_str()),
        _ => None,
    };
    if let Some(p) = listen.and_then(|l| listener_of(l).ok().flatten()) {
        if let Some(u) = accounts::user_by_uid(p.uid) {
            return Some(u);
        }
    }
    let name = unit_user(unit).unwrap_or_else(|| unit_default.to_string());
    match accounts::user_by_name(&name) {
        Some(u) => Some(u),
        None => missing(
            r,
            &name,
            format!("{unit} runs as '{name}', which does not exist on this host"),
            "reinstall the package (its post-install creates the service user) or: \
             adduser --system --group --home /var/lib/surge surge",
        ),
    }
}

/// `User=` of an installed unit.
fn unit_user(unit: &str) -> Option<String> {
    [
        "/etc/systemd/system",
        "/lib/systemd/system",
        "/usr/lib/systemd/system",
    ]
    .iter()
    .map(|d| Path::new(d).join(unit))
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|text| {
        text.lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("User="))
            .map(|u| u.trim().to_string())
    })
}

fn check_root(r: &mut Report, role: Role) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        r.ok("root", "running as root, as the daemon must");
    } else {
        let why = match role {
            Role::Agent => "the agent mounts jobs' instances for their users (allow_other)",
            _ => "a mover runs each stage task as the job's owner (setuid)",
        };
        r.fail(
            "root",
            format!("not root: {why}; the other checks may be incomplete"),
            "run surge doctor (and the daemon) as root",
        );
    }
}

fn check_fuse(r: &mut Report, role: Role) {
    match std::fs::metadata("/dev/fuse") {
        Ok(md) if md.file_type().is_char_device() && md.rdev() == libc::makedev(10, 229) => {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/fuse")
            {
                Ok(_) => r.ok("fuse", "/dev/fuse opens"),
                Err(e) => r.fail(
                    "fuse",
                    format!("/dev/fuse does not open: {e}"),
                    "chmod 0666 /dev/fuse (the fuse3 package's udev rule does it)",
                ),
            }
        }
        Ok(_) => r.fail(
            "fuse",
            "/dev/fuse is not the FUSE device (character 10:229)",
            "rm /dev/fuse && mknod -m 0666 /dev/fuse c 10 229",
        ),
        Err(e) => r.fail(
            "fuse",
            format!("/dev/fuse: {e}"),
            "modprobe fuse (in a container: give it /dev/fuse, e.g. --device /dev/fuse)",
        ),
    }
    let found = ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join("fusermount3"))
        .find(|p| p.is_file());
    match found {
        Some(p) => {
            let setuid = std::fs::metadata(&p).is_ok_and(|m| m.mode() & 0o4000 != 0);
            if role == Role::Client && !setuid {
                r.fail(
                    "fusermount",
                    format!("{} is not setuid root: users cannot mount", p.display()),
                    format!("chmod u+s {}", p.display()),
                );
            } else {
                r.ok("fusermount", format!("{}", p.display()));
            }
        }
        None => r.fail(
            "fusermount",
            "no fusermount3 (mounts are unmounted with it, and users mount with it)",
            "apt install fuse3",
        ),
    }
}

fn check_helper(r: &mut Report) {
    let socket = std::env::var_os(surge_client::lend::SOCKET_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(surge_client::lend::DEFAULT_SOCKET));
    match std::os::unix::net::UnixStream::connect(&socket) {
        Ok(_) => r.ok(
            "helper",
            format!("the passthrough helper answers at {}", socket.display()),
        ),
        Err(e) => r.warn(
            "helper",
            format!(
                "no passthrough helper at {} ({e}): users' mounts move every byte through \
                 their own process (0.15-0.26 of the fast tier's speed)",
                socket.display()
            ),
            "systemctl enable --now surge-passthrough-helper",
        ),
    }
}

fn munge_socket(role: Role, s: &Settings, cfg: Option<&SurgeConfig>) -> PathBuf {
    if let Settings::Manager(m) = s {
        if let Some(p) = &m.munge_socket {
            return p.clone();
        }
    }
    let from_file = cfg
        .and_then(|c| c.cluster.munge_socket.clone())
        .filter(|_| std::env::var_os(surge_auth::munge::SOCKET_ENV).is_none());
    match (role, from_file) {
        (_, Some(p)) => p,
        (Role::Manager, None) => surge_auth::munge::socket(),
        _ => surge_api::munge_socket(),
    }
}

fn check_munge(r: &mut Report, socket: &Path) {
    if surge_auth::munge::answers(socket) {
        r.ok("munge", format!("munged answers at {}", socket.display()));
    } else {
        let why = if socket.exists() {
            "the socket exists but munged does not answer"
        } else {
            "no socket"
        };
        r.fail(
            "munge",
            format!("{}: {why}: the manager takes every caller's identity from MUNGE", socket.display()),
            "systemctl enable --now munge (with the cluster's /etc/munge/munge.key, the same on every node)",
        );
    }
}

fn key_file(s: &Settings) -> PathBuf {
    let given = match s {
        Settings::Manager(m) => m.key_file.clone(),
        Settings::Server(s) => s.key_file.clone(),
        _ => None,
    };
    given.unwrap_or_else(surge_auth::Key::default_path)
}

/// The cluster key: the manager and servers need it theirs alone; elsewhere nobody but root
/// should read it.
fn check_key(r: &mut Report, path: &Path, user: Option<&accounts::User>, needed: bool) {
    let md = match std::fs::metadata(path) {
        Ok(md) => md,
        Err(e) if needed => {
            r.fail(
                "key",
                format!("{}: {e}", path.display()),
                format!(
                    "on one host: surge key create --key-file {p}; copy it to the manager and \
                     every BB server: install -m 0600 -o {o} surge.key {p}",
                    p = path.display(),
                    o = user.map_or("root", |u| u.name.as_str())
                ),
            );
            return;
        }
        Err(_) => {
            r.ok("key", format!("no cluster key here ({})", path.display()));
            return;
        }
    };
    let mode = md.permissions().mode() & 0o777;
    let mut faults = Vec::new();
    let mut fixes = Vec::new();
    if !md.is_file() {
        faults.push("not a regular file".to_string());
    }
    if mode & 0o077 != 0 {
        faults.push(format!(
            "mode {mode:04o}: other users can {} it",
            if mode & 0o044 != 0 { "read" } else { "reach" }
        ));
        fixes.push(format!("chmod 600 {}", path.display()));
    }
    if let Some(u) = user.filter(|u| u.uid != 0 && md.uid() != u.uid) {
        faults.push(format!(
            "owned by {}, but the daemon runs as {}",
            accounts::describe_uid(md.uid()),
            u.name
        ));
        fixes.push(format!("chown {}: {}", u.name, path.display()));
    }
    // `surge key create` makes a missing directory 0700 (root's): a server running as the
    // service user could then not reach the key inside.
    if let (Some(u), Some(dir)) = (user.filter(|u| u.uid != 0), path.parent()) {
        if let Ok(dm) = std::fs::metadata(dir) {
            let m = dm.permissions().mode();
            let reach = (dm.uid() == u.uid && m & 0o100 != 0)
                || (dm.gid() == u.gid && m & 0o010 != 0)
                || m & 0o001 != 0;
            if !reach {
                faults.push(format!(
                    "its directory {} is {:04o}: {} cannot reach it",
                    dir.display(),
                    m & 0o777,
                    u.name
                ));
                fixes.push(format!("chmod 755 {}", dir.display()));
            }
        }
    }
    if needed && md.is_file() && md.len() != 32 {
        faults.push(format!("{} bytes, not a cluster key (32 bytes)", md.len()));
        fixes.push(format!(
            "copy the cluster's key from the manager's host (`surge key check --key-file {}` compares)",
            path.display()
        ));
    }
    if faults.is_empty() {
        r.ok(
            "key",
            format!(
                "{} ({mode:04o}, {})",
                path.display(),
                accounts::describe_uid(md.uid())
            ),
        );
    } else {
        r.fail(
            "key",
            format!("{}: {}", path.display(), faults.join("; ")),
            fixes.join(" && "),
        );
    }
}

fn check_state_dir(r: &mut Report, state: &Path, user: Option<&accounts::User>) {
    let dir = state
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match std::fs::metadata(dir) {
        Ok(md) if md.is_dir() => {
            let mode = md.permissions().mode() & 0o777;
            let owner_ok = user.is_none_or(|u| u.uid == 0 || md.uid() == u.uid);
            if mode & 0o002 != 0 {
                r.fail(
                    "state",
                    format!(
                        "{}: mode {mode:04o}: anyone may replace the manager's database",
                        dir.display()
                    ),
                    format!("chmod o-w {}", dir.display()),
                );
            } else if !owner_ok {
                r.fail(
                    "state",
                    format!(
                        "{}: owned by {}, the manager runs as {}",
                        dir.display(),
                        accounts::describe_uid(md.uid()),
                        user.map_or("?", |u| u.name.as_str())
                    ),
                    format!(
                        "chown {} {}",
                        user.map_or("root", |u| u.name.as_str()),
                        dir.display()
                    ),
                );
            } else {
                r.ok(
                    "state",
                    format!(
                        "{} ({})",
                        state.display(),
                        if state.exists() {
                            "exists"
                        } else {
                            "made at first start"
                        }
                    ),
                );
            }
        }
        _ => r.fail(
            "state",
            format!(
                "{}: no such directory (the manager's state database lives there)",
                dir.display()
            ),
            format!("install -d -m 0750 {}", dir.display()),
        ),
    }
}

/// The users who must administer the manager (register servers, act for jobs' owners) as
/// this host's group database says: the service user (the package's servers run as it) and
/// SlurmUser, when they exist here.
const ADMINS: [(&str, &str); 2] = [
    (
        "surge",
        "servers running as surge (the package's surge-server) cannot register",
    ),
    (
        "slurm",
        "Slurm's hooks (as SlurmUser) cannot act for jobs' owners",
    ),
];

fn check_admin_group(r: &mut Report, gid: Option<u32>) {
    let Some(g) = gid else {
        r.warn(
            "admin",
            "no admin group: servers that run as the service user cannot register, and Slurm's \
             hooks cannot act for jobs' owners",
            "admin_group = \"surge\" under [manager] in /etc/surge/surge.toml (usermod -aG surge slurm)",
        );
        return;
    };
    let Some(name) = accounts::group_name(g) else {
        r.warn(
            "admin",
            format!("admin group gid {g} is not in this host's group database"),
            "admin_group = \"surge\" under [manager] (the service group, with SlurmUser in it)",
        );
        return;
    };
    let mut outside = Vec::new();
    for (user, why) in ADMINS {
        if let Some(u) = accounts::user_by_name(user) {
            if !surge_auth::groups_of(u.uid, u.gid).contains(&g) {
                outside.push((user, why));
            }
        }
    }
    if outside.is_empty() {
        r.ok("admin", format!("admin group {name} (gid {g})"));
        return;
    }
    for (user, why) in outside {
        r.warn(
            "admin",
            format!("{user} is not in the admin group {name}: {why}"),
            format!("usermod -aG {name} {user} (on this host), then restart surge-manager"),
        );
    }
}

fn check_devices(
    r: &mut Report,
    devices: &[PathBuf],
    capacity: Option<u64>,
    user: Option<&accounts::User>,
) {
    let who = user.map_or("root", |u| u.name.as_str());
    let mut free_total = 0u64;
    let mut all_ok = true;
    for d in devices {
        let md = match std::fs::metadata(d) {
            Ok(md) if md.is_dir() => md,
            Ok(_) => {
                all_ok = false;
                r.fail(
                    "device",
                    format!("{}: not a directory", d.display()),
                    "name a directory of the fast tier in [server] devices",
                );
                continue;
            }
            Err(e) => {
                all_ok = false;
                r.fail(
                    "device",
                    format!("{}: {e} (is the fast tier mounted?)", d.display()),
                    format!(
                        "mount the device, then: install -d -o {who} -m 0700 {}",
                        d.display()
                    ),
                );
                continue;
            }
        };
        let mode = md.permissions().mode() & 0o777;
        if let Some(u) = user.filter(|u| u.uid != 0 && md.uid() != u.uid) {
            all_ok = false;
            r.fail(
                "device",
                format!(
                    "{}: owned by {}, the server runs as {}",
                    d.display(),
                    accounts::describe_uid(md.uid()),
                    u.name
                ),
                format!("chown -R {}: {}", u.name, d.display()),
            );
        } else if mode & 0o077 != 0 {
            all_ok = false;
            r.fail(
                "device",
                format!(
                    "{}: mode {mode:04o}: users could read the instances' data",
                    d.display()
                ),
                format!("chmod 700 {}", d.display()),
            );
        } else {
            let free = surge_core::sys::free_space(d).unwrap_or(0);
            free_total += free;
            r.ok(
                "device",
                format!(
                    "{} ({mode:04o}, {} free)",
                    d.display(),
                    surge_core::format_bytes(free)
                ),
            );
        }
    }
    if let Some(c) = capacity.filter(|_| all_ok) {
        if c > free_total {
            r.warn(
                "capacity",
                format!(
                    "capacity {} but {} free on the devices: instances may fill them",
                    surge_core::format_bytes(c),
                    surge_core::format_bytes(free_total)
                ),
                "lower capacity under [server], or free the devices",
            );
        }
    }
}

/// A process listening on a TCP port.
struct Listener {
    pid: u32,
    uid: u32,
    cmdline: Vec<String>,
}

/// The process listening on `addr`'s port (any address), if one is.
fn listener_of(addr: &str) -> anyhow::Result<Option<Listener>> {
    let port = port_of(addr)?;
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let p = f[1]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if p == Some(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return Ok(None);
    }
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        let owns = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
        });
        if owns {
            let cmdline = std::fs::read(e.path().join("cmdline"))
                .unwrap_or_default()
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let uid = std::fs::metadata(e.path()).map(|m| m.uid()).unwrap_or(0);
            return Ok(Some(Listener { pid, uid, cmdline }));
        }
    }
    Ok(None)
}

fn port_of(addr: &str) -> anyhow::Result<u16> {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .ok_or_else(|| anyhow::anyhow!("'{addr}' is not HOST:PORT"))
}

/// A port the role's daemon listens on: free (the daemon is not running) or bound by that
/// daemon; bound by anything else, or an address of another host, is a fault.
fn check_port(r: &mut Report, name: &'static str, addr: &str, sub: &str) {
    let sa: Option<SocketAddr> = addr.to_socket_addrs().ok().and_then(|mut a| a.next());
    let Some(sa) = sa else {
        r.fail(
            name,
            format!("{addr}: not an address"),
            "give HOST:PORT (listen, http, metrics)",
        );
        return;
    };
    if sa.port() == 0 {
        r.ok(name, format!("{addr}: a free port is picked at start"));
        return;
    }
    match std::net::TcpListener::bind(sa) {
        Ok(_) => r.ok(name, format!("{addr} is free (surge {sub} is not running)")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => match listener_of(addr) {
            Ok(Some(l)) if is_surge(&l.cmdline, sub) => r.ok(
                name,
                format!("{addr} is bound by surge {sub} (pid {}, {})", l.pid, accounts::describe_uid(l.uid)),
            ),
            Ok(Some(l)) => r.fail(
                name,
                format!("{addr} is bound by another program: pid {} `{}`", l.pid, l.cmdline.join(" ")),
                "stop it, or give surge another port in the configuration file",
            ),
            _ => r.fail(
                name,
                format!("{addr} is in use by a process this user cannot see"),
                "run surge doctor as root to name it; stop it or give surge another port",
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => r.fail(
            name,
            format!("{addr}: not an address of this host"),
            "listen on an address of this host (or 0.0.0.0) and give the name others reach it by as advertise",
        ),
        Err(e) => r.fail(name, format!("{addr}: cannot bind: {e}"), "see the error"),
    }
}

fn is_surge(cmdline: &[String], sub: &str) -> bool {
    let exe_is_surge = cmdline
        .first()
        .is_some_and(|a| Path::new(a).file_name().is_some_and(|n| n == "surge"));
    exe_is_surge && cmdline.iter().skip(1).any(|a| a == sub)
}

fn manager_addr(role: Role, s: &Settings, cfg: Option<&SurgeConfig>) -> Option<String> {
    match s {
        Settings::Manager(m) => Some(local_addr(&m.listen)),
        Settings::Server(s) => s.manager.clone(),
        Settings::Agent(a) => Some(a.manager.clone()),
        Settings::Mover(m) => Some(m.manager.clone()),
        Settings::Client => std::env::var("SURGE_MANAGER")
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| cfg.and_then(|c| c.cluster.manager.clone())),
        Settings::Unknown => match role {
            Role::Manager => None,
            _ => cfg.and_then(|c| c.cluster.manager.clone()),
        },
    }
}

/// A listening address as a client on this host reaches it (a wildcard means loopback).
fn local_addr(listen: &str) -> String {
    match listen.rsplit_once(':') {
        Some(("0.0.0.0", p)) => format!("127.0.0.1:{p}"),
        Some(("[::]", p)) => format!("[::1]:{p}"),
        _ => listen.to_string(),
    }
}

/// How long the doctor waits for the manager's answer (a live manager answers in
/// milliseconds; the connection itself has 5 s).
const MANAGER_WAIT: Duration = Duration::from_secs(5);

/// Reaches the manager with a MUNGE credential; for a server or agent, also finds this host
/// in its lists. Returns the clock's skew against the manager's (seconds) when it said.
fn check_manager(
    r: &mut Report,
    role: Role,
    addr: &str,
    munge: &Path,
    s: &Settings,
) -> Option<f64> {
    let rt = match surge_manager::cli::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            r.fail("manager", format!("no runtime: {e:#}"), "see the error");
            return None;
        }
    };
    rt.block_on(async {
        let call = async {
            let mut m = surge_api::connect_with(addr, munge.to_path_buf()).await?;
            let sent = std::time::SystemTime::now();
            let pools = m.list_pools(surge_api::v1::Empty {}).await?;
            let skew = date_skew(pools.metadata(), sent);
            anyhow::Ok((m, pools.into_inner().pools, skew))
        };
        let (mut m, pools, skew) = match tokio::time::timeout(MANAGER_WAIT, call).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let fix = match role {
                    Role::Manager => "systemctl start surge-manager; journalctl -u surge-manager says why it stopped",
                    _ => "start the manager (systemctl start surge-manager on its host), check [cluster] manager and the network (firewall, port)",
                };
                r.fail("manager", format!("{addr}: {}", error_text(&e)), fix);
                return None;
            }
            Err(_) => {
                r.fail("manager", format!("{addr}: no answer within {} s (something listens there, but does not answer as a manager)", MANAGER_WAIT.as_secs()), "check that the manager runs there (systemctl status surge-manager) and the network between this host and it");
                return None;
            }
        };
        let summary: Vec<String> = pools
            .iter()
            .map(|p| format!("{} ({}/{} servers up)", p.name, p.servers_up, p.servers))
            .collect();
        r.ok("manager", format!("{addr} answers; pools: {}", summary.join(", ")));
        if role == Role::Manager && pools.iter().all(|p| p.servers_up == 0) {
            r.warn(
                "servers",
                "no server is up in any pool: jobs cannot get an instance",
                "start surge-server on the BB nodes (surge doctor --role server there)",
            );
        }
        match s {
            Settings::Server(srv) => check_registered(r, &mut m, srv).await,
            Settings::Agent(a) => check_agent_known(r, &mut m, a).await,
            _ => {}
        }
        skew
    })
}

fn error_text(e: &anyhow::Error) -> String {
    match e.downcast_ref::<tonic::Status>() {
        Some(s) => format!("refused: {}", s.message()),
        None => format!("{e:#}"),
    }
}

/// Seconds the manager's clock (its `date` header) is ahead of ours.
fn date_skew(md: &tonic::metadata::MetadataMap, sent: std::time::SystemTime) -> Option<f64> {
    let date = md.get("date")?.to_str().ok()?;
    let theirs = httpdate::parse_http_date(date).ok()?;
    let now = std::time::SystemTime::now();
    let mid = sent + now.duration_since(sent).unwrap_or_default() / 2;
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    // The header has whole seconds: half a second of rounding either way.
    Some(secs(theirs) + 0.5 - secs(mid))
}

async fn check_registered(
    r: &mut Report,
    m: &mut surge_api::Client,
    s: &surge_server::cli::ServerArgs,
) {
    let id = s.id.clone().or_else(|| {
        let f = s.devices.first()?.join("surge-server.json");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).ok()?).ok()?;
        v["id"].as_str().map(str::to_string)
    });
    let Some(id) = id else {
        r.warn(
            "registered",
            "this server has not started yet (no id in its first device)",
            "systemctl start surge-server",
        );
        return;
    };
    match m.list_servers(surge_api::v1::Empty {}).await {
        Ok(list) => {
            let list = list.into_inner().servers;
            match list.iter().find(|x| x.id == id) {
                Some(x) if x.state == "up" => r.ok(
                    "registered",
                    format!("server {id} is up in pool {} at {}", x.pool, x.addrs.join(", ")),
                ),
                Some(x) => r.fail(
                    "registered",
                    format!("server {id} is {} in pool {} (the manager cannot reach {})", x.state, x.pool, x.addrs.join(", ")),
                    "start surge-server; check that the manager reaches the advertised address (advertise under [server])",
                ),
                None => r.fail(
                    "registered",
                    format!("the manager does not know server {id}"),
                    "give [cluster] manager (or [server] manager) and restart surge-server; \
                     journalctl -u surge-server says why registration fails (\"may not register \
                     a server\": the server's user must be in the manager's admin_group, with \
                     the same uid and gid on every node)",
                ),
            }
        }
        Err(e) => r.fail(
            "registered",
            format!("cannot list servers: {}", e.message()),
            "see the error",
        ),
    }
}

async fn check_agent_known(
    r: &mut Report,
    m: &mut surge_api::Client,
    a: &surge_run::agent::AgentArgs,
) {
    let host = a.host.clone().unwrap_or_else(surge_core::sys::hostname);
    match m.list_agents(surge_api::v1::Empty {}).await {
        Ok(list) => match list.into_inner().agents.iter().find(|x| x.host == host) {
            Some(x) if x.alive => r.ok("agent", format!("the manager hears the agent of {host}")),
            Some(_) => r.fail(
                "agent",
                format!("the manager has not heard the agent of {host} lately"),
                "systemctl restart surge-agent; journalctl -u surge-agent",
            ),
            None => r.fail(
                "agent",
                format!(
                    "the manager knows no agent called {host} (the name Slurm gives this node?)"
                ),
                "systemctl start surge-agent; set host under [agent] to the node's Slurm name",
            ),
        },
        Err(e) => r.fail(
            "agent",
            format!("cannot list agents: {}", e.message()),
            "run surge doctor as root",
        ),
    }
}

/// The kernel's word on the clock (synchronized by NTP or not) and the skew against the
/// manager: MUNGE credentials live 300 s, and the manager refuses those from a clock off by
/// more.
fn check_clock(r: &mut Report, skew: Option<f64>) {
    // SAFETY: timex is plain data; adjtimex with modes 0 only reads.
    let state = unsafe {
        let mut tx: libc::timex = std::mem::zeroed();
        libc::adjtimex(&mut tx)
    };
    let synced = state != libc::TIME_ERROR;
    match skew {
        Some(s) if s.abs() > 60.0 => r.fail(
            "clock",
            format!("{s:+.0} s from the manager's clock: MUNGE credentials will be refused beyond 300 s"),
            "synchronize every node's clock (systemctl enable --now systemd-timesyncd, or chrony)",
        ),
        Some(s) if synced => r.ok("clock", format!("synchronized; {s:+.1} s from the manager's")),
        Some(s) => r.warn(
            "clock",
            format!("not synchronized by NTP ({s:+.1} s from the manager's for now)"),
            "systemctl enable --now systemd-timesyncd (or chrony)",
        ),
        None if synced => r.ok("clock", "synchronized (NTP)"),
        None => r.warn(
            "clock",
            "not synchronized by NTP: clocks that drift apart break MUNGE (300 s)",
            "systemctl enable --now systemd-timesyncd (or chrony)",
        ),
    }
}
