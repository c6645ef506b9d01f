//! The configuration file of an installed site (`/etc/surge/surge.toml`, example and manual in
//! `contrib/surge.toml`): one typed section per daemon (`[manager]`, `[server]`, `[agent]`,
//! `[mover]`, `[passthrough_helper]`) and `[cluster]` for what several share (the manager's
//! address, the key file, the munged socket, the pool).
//!
//! A daemon started with `--config FILE` gets the file's settings as command-line flags,
//! inserted before clap parses the command line ([`expand_args`]): the daemons' flags stay the
//! one definition of every setting, and `surge <daemon> --help` documents every key. What wins:
//! a flag on the command line, then the environment variable the flag reads (`SURGE_MANAGER`,
//! `SURGE_KEY_FILE`, `SURGE_MUNGE_SOCKET`, `SURGE_PASSTHROUGH_SOCKET`), then the file, then the
//! flag's default. Without `--config` nothing is read: the daemons that `surge run` starts for
//! its embedded default must never pick up a site's settings.
//!
//! Values are checked when the file is read (sizes, durations, groups, enumerations; unknown
//! sections and keys), so a mistake is reported with the file, line and key, not as a flag the
//! admin never typed. In strings, `%h` is this host's short name and `%%` a `%`, so one file
//! serves every host (`advertise = "%h:7070"`).

use anyhow::Context;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where an installed site keeps the file (what the systemd units pass as `--config`).
pub const DEFAULT_PATH: &str = "/etc/surge/surge.toml";

/// Longest configuration file read (a site's file is a few KiB).
const MAX_FILE_LEN: u64 = 1 << 20;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurgeConfig {
    #[serde(default)]
    pub cluster: ClusterConfig,
    pub manager: Option<ManagerConfig>,
    pub server: Option<ServerConfig>,
    pub agent: Option<AgentConfig>,
    pub mover: Option<MoverConfig>,
    pub passthrough_helper: Option<HelperConfig>,
}

/// Settings several daemons share; a daemon's own section overrides them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The manager's gRPC address (servers register there; agents and movers poll it).
    pub manager: Option<String>,
    /// The cluster key (manager and servers).
    pub key_file: Option<PathBuf>,
    /// The munged socket (the manager's `--munge-socket`; `$SURGE_MUNGE_SOCKET` for the others).
    pub munge_socket: Option<PathBuf>,
    /// The pool: the manager's default pool and the one servers register in.
    pub pool: Option<String>,
}

/// `surge manager`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerConfig {
    pub state: Option<PathBuf>,
    /// etcd members' client URLs: the state in etcd, managers in a leader and standbys.
    pub etcd: Option<Vec<String>>,
    pub etcd_prefix: Option<String>,
    /// TLS to `https://` etcd members: the CA that signed them, the manager's client
    /// certificate and key (docs/SECURITY.md, "The manager's etcd").
    pub etcd_ca: Option<PathBuf>,
    pub etcd_cert: Option<PathBuf>,
    pub etcd_key: Option<PathBuf>,
    pub name: Option<String>,
    pub listen: Option<String>,
    pub http: Option<String>,
    pub pool: Option<String>,
    pub granularity: Option<Size>,
    pub liveness_interval: Option<Secs>,
    pub gc_interval: Option<Secs>,
    pub retention_days: Option<f64>,
    pub grpc_max_connections: Option<u64>,
    pub grpc_max_per_address: Option<u64>,
    pub http_max_connections: Option<u64>,
    pub http_max_per_address: Option<u64>,
    pub key_file: Option<PathBuf>,
    pub admin_group: Option<Group>,
    pub munge_socket: Option<PathBuf>,
    pub mount_root: Option<String>,
    pub reconcile_interval: Option<Secs>,
    pub stage_on: Option<StageOn>,
    pub tls: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// `surge server`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    pub capacity: Option<Size>,
    pub listen: Option<String>,
    pub unix: Option<PathBuf>,
    pub id: Option<String>,
    pub advertise: Option<String>,
    pub manager: Option<String>,
    pub pool: Option<String>,
    pub key_file: Option<PathBuf>,
    pub metadata_reserve: Option<Size>,
    pub metrics: Option<String>,
    pub max_connections: Option<u32>,
    pub max_connections_per_peer: Option<u32>,
    pub idle_timeout: Option<Secs>,
    pub frame_timeout: Option<Secs>,
    /// After a restart, how long only the locks held before are granted.
    pub lock_grace: Option<Secs>,
    /// How long a mount holding unlinked open files may stop waiting for recalls before
    /// another mount removes their data.
    pub orphan_grace: Option<Secs>,
    /// `auto`, `on` or `off` (docs/SECURITY.md, "On the wire").
    pub tls: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// `surge agent`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub manager: Option<String>,
    pub host: Option<String>,
    pub interval: Option<Secs>,
    pub threads: Option<u32>,
    pub deadline: Option<Secs>,
}

/// `surge mover`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoverConfig {
    pub manager: Option<String>,
    pub host: Option<String>,
    pub slots: Option<u32>,
}

/// `surge passthrough-helper`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperConfig {
    pub socket: Option<PathBuf>,
    pub group: Option<String>,
}

/// A size (`"3TiB"`, or a number of bytes), checked as the flags check it.
#[derive(Debug, Clone, PartialEq)]
pub struct Size(pub String);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Bytes(b) => b.to_string(),
            Raw::Text(t) => t,
        };
        surge_core::sys::size_arg(&text).map_err(|e| {
            D::Error::custom(format!(
                "'{text}' is not a size ({e}); write e.g. \"200GiB\" or a number of bytes"
            ))
        })?;
        Ok(Size(text))
    }
}

/// A duration in seconds (`10`, `0.5`, or `"10s"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Secs(pub f64);

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Float(f64),
            Text(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Int(i) => i.to_string(),
            Raw::Float(f) => f.to_string(),
            Raw::Text(t) => t,
        };
        surge_core::sys::secs_arg(&text)
            .map(|d| Secs(d.as_secs_f64()))
            .map_err(D::Error::custom)
    }
}

/// A group: its gid, or its name, looked up when the daemon that uses it starts (the group
/// may exist only on that daemon's host: the manager's admin group on the manager's).
#[derive(Debug, Clone, PartialEq)]
pub enum Group {
    Id(u32),
    Name(String),
}

impl<'de> Deserialize<'de> for Group {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Id(u32),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Id(g) => Ok(Group::Id(g)),
            Raw::Name(n) if n.is_empty() => Err(D::Error::custom("an empty group name")),
            Raw::Name(n) => Ok(Group::Name(n)),
        }
    }
}

impl Group {
    /// Its gid on this host.
    fn gid(&self, key: &str) -> anyhow::Result<u32> {
        match self {
            Group::Id(g) => Ok(*g),
            Group::Name(n) => crate::accounts::group_by_name(n).ok_or_else(|| {
                anyhow::anyhow!(
                    "{key} = \"{n}\": no group named '{n}' on this host (give its name as \
                     `getent group` lists it, or its gid)"
                )
            }),
        }
    }
}

/// `surge manager --stage-on`, checked against the flag's own values.
#[derive(Debug, Clone, PartialEq)]
pub struct StageOn(pub String);

impl<'de> Deserialize<'de> for StageOn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use clap::ValueEnum;
        let s = String::deserialize(d)?;
        surge_manager::stage::StageOn::from_str(&s, false).map_err(|_| {
            let names: Vec<String> = surge_manager::stage::StageOn::value_variants()
                .iter()
                .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
                .collect();
            D::Error::custom(format!("'{s}' is not one of {}", names.join(", ")))
        })?;
        Ok(StageOn(s))
    }
}

/// The daemons the file configures, by subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    Manager,
    Server,
    Agent,
    Mover,
    PassthroughHelper,
}

impl Daemon {
    pub const ALL: [Daemon; 5] = [
        Daemon::Manager,
        Daemon::Server,
        Daemon::Agent,
        Daemon::Mover,
        Daemon::PassthroughHelper,
    ];

    /// The `surge` subcommand that runs it.
    pub fn subcommand(self) -> &'static str {
        match self {
            Daemon::Manager => "manager",
            Daemon::Server => "server",
            Daemon::Agent => "agent",
            Daemon::Mover => "mover",
            Daemon::PassthroughHelper => "passthrough-helper",
        }
    }

    /// Its section of the file.
    pub fn section(self) -> &'static str {
        match self {
            Daemon::Manager => "manager",
            Daemon::Server => "server",
            Daemon::Agent => "agent",
            Daemon::Mover => "mover",
            Daemon::PassthroughHelper => "passthrough_helper",
        }
    }

    fn from_subcommand(s: &str) -> Option<Daemon> {
        Daemon::ALL.into_iter().find(|d| d.subcommand() == s)
    }
}

/// One flag a key of the file gives a daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    /// `--listen`.
    pub long: &'static str,
    /// One value, or several for a repeated flag (`--device`).
    pub values: Vec<String>,
    /// The key it comes from (`server.listen`, `cluster.manager`), for messages.
    pub key: String,
    /// The environment variable the daemon reads for this setting, which wins over the file.
    pub env: Option<&'static str>,
}

/// Collects the flags of one daemon; `%h` is expanded in every text value.
struct Flags {
    out: Vec<Flag>,
    host: String,
}

impl Flags {
    fn set(&mut self, long: &'static str, key: String, value: Option<String>) {
        self.set_env(long, key, value, None);
    }

    fn set_env(
        &mut self,
        long: &'static str,
        key: String,
        value: Option<String>,
        env: Option<&'static str>,
    ) {
        if let Some(v) = value {
            let values = vec![expand_host(&v, &self.host)];
            self.out.push(Flag {
                long,
                values,
                key,
                env,
            });
        }
    }

    /// `tls`, `tls_cert` and `tls_key` of section `s` (a server's, the manager's).
    fn tls(
        &mut self,
        s: &str,
        tls: &Option<String>,
        cert: &Option<PathBuf>,
        key_path: &Option<PathBuf>,
    ) {
        self.set_env("--tls", key(s, "tls"), tls.clone(), Some("SURGE_TLS"));
        self.set(
            "--tls-cert",
            key(s, "tls_cert"),
            cert.as_deref().map(path_text),
        );
        self.set(
            "--tls-key",
            key(s, "tls_key"),
            key_path.as_deref().map(path_text),
        );
    }

    /// The section's value, else the `[cluster]` one.
    fn shared<T: ToString>(
        &mut self,
        long: &'static str,
        section: &str,
        name: &str,
        own: Option<T>,
        cluster: Option<T>,
        env: Option<&'static str>,
    ) {
        let (key, v) = match (own, cluster) {
            (Some(v), _) => (format!("{section}.{name}"), Some(v)),
            (None, Some(v)) => (format!("cluster.{name}"), Some(v)),
            (None, None) => return,
        };
        self.set_env(long, key, v.map(|v| v.to_string()), env);
    }
}

fn path_text(p: &Path) -> String {
    p.display().to_string()
}

/// `%h` -> `host`, `%%` -> `%`; any other `%` stays.
fn expand_host(text: &str, host: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.peek() {
                Some('h') => {
                    chars.next();
                    out.push_str(host);
                    continue;
                }
                Some('%') => {
                    chars.next();
                    out.push('%');
                    continue;
                }
                _ => {}
            }
        }
        out.push(c);
    }
    out
}

fn secs(s: Option<Secs>) -> Option<String> {
    s.map(|s| s.0.to_string())
}

impl SurgeConfig {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> anyhow::Result<SurgeConfig> {
        let f = std::fs::File::open(path)
            .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
        let mut text = String::new();
        use std::io::Read;
        f.take(MAX_FILE_LEN + 1)
            .read_to_string(&mut text)
            .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
        anyhow::ensure!(
            text.len() as u64 <= MAX_FILE_LEN,
            "{}: longer than {MAX_FILE_LEN} bytes: not a configuration file",
            path.display()
        );
        SurgeConfig::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses the file's text; errors name the line, the key and what is wrong.
    pub fn parse(text: &str) -> Result<SurgeConfig, toml::de::Error> {
        toml::from_str(text)
    }

    /// True when the file has a section for `d`.
    pub fn has_section(&self, d: Daemon) -> bool {
        match d {
            Daemon::Manager => self.manager.is_some(),
            Daemon::Server => self.server.is_some(),
            Daemon::Agent => self.agent.is_some(),
            Daemon::Mover => self.mover.is_some(),
            Daemon::PassthroughHelper => self.passthrough_helper.is_some(),
        }
    }

    /// The flags the file gives daemon `d` on host `host` (for `%h`), in the file's terms.
    pub fn flags(&self, d: Daemon, host: &str) -> anyhow::Result<Vec<Flag>> {
        let mut f = Flags {
            out: Vec::new(),
            host: host.to_string(),
        };
        let c = &self.cluster;
        let key_env = Some(surge_auth::key::ENV);
        let manager_env = Some("SURGE_MANAGER");
        match d {
            Daemon::Manager => {
                let dflt = ManagerConfig::default();
                let ManagerConfig {
                    state,
                    etcd,
                    etcd_prefix,
                    etcd_ca,
                    etcd_cert,
                    etcd_key,
                    name,
                    listen,
                    http,
                    pool,
                    granularity,
                    liveness_interval,
                    gc_interval,
                    retention_days,
                    grpc_max_connections,
                    grpc_max_per_address,
                    http_max_connections,
                    http_max_per_address,
                    key_file,
                    admin_group,
                    munge_socket,
                    mount_root,
                    reconcile_interval,
                    stage_on,
                    tls,
                    tls_cert,
                    tls_key,
                } = self.manager.as_ref().unwrap_or(&dflt);
                let s = "manager";
                f.set("--state", key(s, "state"), state.as_deref().map(path_text));
                f.set("--etcd", key(s, "etcd"), etcd.as_ref().map(|v| v.join(",")));
                f.set("--etcd-prefix", key(s, "etcd_prefix"), etcd_prefix.clone());
                f.set(
                    "--etcd-ca",
                    key(s, "etcd_ca"),
                    etcd_ca.as_deref().map(path_text),
                );
                f.set(
                    "--etcd-cert",
                    key(s, "etcd_cert"),
                    etcd_cert.as_deref().map(path_text),
                );
                f.set(
                    "--etcd-key",
                    key(s, "etcd_key"),
                    etcd_key.as_deref().map(path_text),
                );
                f.set("--name", key(s, "name"), name.clone());
                f.set("--listen", key(s, "listen"), listen.clone());
                f.set("--http", key(s, "http"), http.clone());
                f.shared("--pool", s, "pool", pool.clone(), c.pool.clone(), None);
                f.set(
                    "--granularity",
                    key(s, "granularity"),
                    granularity.clone().map(|g| g.0),
                );
                f.set(
                    "--liveness-interval",
                    key(s, "liveness_interval"),
                    secs(*liveness_interval),
                );
                f.set("--gc-interval", key(s, "gc_interval"), secs(*gc_interval));
                f.set(
                    "--retention-days",
                    key(s, "retention_days"),
                    retention_days.map(|d| d.to_string()),
                );
                for (flag, name, v) in [
                    (
                        "--grpc-max-connections",
                        "grpc_max_connections",
                        grpc_max_connections,
                    ),
                    (
                        "--grpc-max-per-address",
                        "grpc_max_per_address",
                        grpc_max_per_address,
                    ),
                    (
                        "--http-max-connections",
                        "http_max_connections",
                        http_max_connections,
                    ),
                    (
                        "--http-max-per-address",
                        "http_max_per_address",
                        http_max_per_address,
                    ),
                ] {
                    f.set(flag, key(s, name), v.map(|n| n.to_string()));
                }
                f.shared(
                    "--key-file",
                    s,
                    "key_file",
                    key_file.as_deref().map(path_text),
                    c.key_file.as_deref().map(path_text),
                    key_env,
                );
                let admin = key(s, "admin_group");
                let gid = admin_group.as_ref().map(|g| g.gid(&admin)).transpose()?;
                f.set("--admin-group", admin, gid.map(|g| g.to_string()));
                f.shared(
                    "--munge-socket",
                    s,
                    "munge_socket",
                    munge_socket.as_deref().map(path_text),
                    c.munge_socket.as_deref().map(path_text),
                    Some(surge_auth::munge::SOCKET_ENV),
                );
                f.set("--mount-root", key(s, "mount_root"), mount_root.clone());
                f.set(
                    "--reconcile-interval",
                    key(s, "reconcile_interval"),
                    secs(*reconcile_interval),
                );
                f.set(
                    "--stage-on",
                    key(s, "stage_on"),
                    stage_on.clone().map(|v| v.0),
                );
                f.tls(s, tls, tls_cert, tls_key);
            }
            Daemon::Server => {
                let dflt = ServerConfig::default();
                let ServerConfig {
                    devices,
                    capacity,
                    listen,
                    unix,
                    id,
                    advertise,
                    manager,
                    pool,
                    key_file,
                    metadata_reserve,
                    metrics,
                    max_connections,
                    max_connections_per_peer,
                    idle_timeout,
                    frame_timeout,
                    lock_grace,
                    orphan_grace,
                    tls,
                    tls_cert,
                    tls_key,
                } = self.server.as_ref().unwrap_or(&dflt);
                let s = "server";
                if !devices.is_empty() {
                    f.out.push(Flag {
                        long: "--device",
                        values: devices
                            .iter()
                            .map(|p| expand_host(&path_text(p), host))
                            .collect(),
                        key: key(s, "devices"),
                        env: None,
                    });
                }
                f.set(
                    "--capacity",
                    key(s, "capacity"),
                    capacity.clone().map(|c| c.0),
                );
                f.set("--listen", key(s, "listen"), listen.clone());
                f.set("--unix", key(s, "unix"), unix.as_deref().map(path_text));
                f.set("--id", key(s, "id"), id.clone());
                f.set("--advertise", key(s, "advertise"), advertise.clone());
                // The manager's address is only a registration target for a server: no
                // SURGE_MANAGER here (the flag does not read it).
                f.shared(
                    "--manager",
                    s,
                    "manager",
                    manager.clone(),
                    c.manager.clone(),
                    None,
                );
                f.shared("--pool", s, "pool", pool.clone(), c.pool.clone(), None);
                f.shared(
                    "--key-file",
                    s,
                    "key_file",
                    key_file.as_deref().map(path_text),
                    c.key_file.as_deref().map(path_text),
                    key_env,
                );
                f.set(
                    "--metadata-reserve",
                    key(s, "metadata_reserve"),
                    metadata_reserve.clone().map(|m| m.0),
                );
                f.set("--metrics", key(s, "metrics"), metrics.clone());
                f.set(
                    "--max-connections",
                    key(s, "max_connections"),
                    max_connections.map(|n| n.to_string()),
                );
                f.set(
                    "--max-connections-per-peer",
                    key(s, "max_connections_per_peer"),
                    max_connections_per_peer.map(|n| n.to_string()),
                );
                f.set(
                    "--idle-timeout",
                    key(s, "idle_timeout"),
                    secs(*idle_timeout),
                );
                f.set(
                    "--frame-timeout",
                    key(s, "frame_timeout"),
                    secs(*frame_timeout),
                );
                f.set("--lock-grace", key(s, "lock_grace"), secs(*lock_grace));
                f.set(
                    "--orphan-grace",
                    key(s, "orphan_grace"),
                    secs(*orphan_grace),
                );
                f.tls(s, tls, tls_cert, tls_key);
            }
            Daemon::Agent => {
                let dflt = AgentConfig::default();
                let AgentConfig {
                    manager,
                    host: agent_host,
                    interval,
                    threads,
                    deadline,
                } = self.agent.as_ref().unwrap_or(&dflt);
                let s = "agent";
                f.shared(
                    "--manager",
                    s,
                    "manager",
                    manager.clone(),
                    c.manager.clone(),
                    manager_env,
                );
                f.set("--host", key(s, "host"), agent_host.clone());
                f.set("--interval", key(s, "interval"), secs(*interval));
                f.set(
                    "--threads",
                    key(s, "threads"),
                    threads.map(|n| n.to_string()),
                );
                f.set("--deadline", key(s, "deadline"), secs(*deadline));
            }
            Daemon::Mover => {
                let dflt = MoverConfig::default();
                let MoverConfig {
                    manager,
                    host: mover_host,
                    slots,
                } = self.mover.as_ref().unwrap_or(&dflt);
                let s = "mover";
                f.shared(
                    "--manager",
                    s,
                    "manager",
                    manager.clone(),
                    c.manager.clone(),
                    manager_env,
                );
                f.set("--host", key(s, "host"), mover_host.clone());
                f.set("--slots", key(s, "slots"), slots.map(|n| n.to_string()));
            }
            Daemon::PassthroughHelper => {
                let dflt = HelperConfig::default();
                let HelperConfig { socket, group } =
                    self.passthrough_helper.as_ref().unwrap_or(&dflt);
                let s = "passthrough_helper";
                f.set_env(
                    "--socket",
                    key(s, "socket"),
                    socket.as_deref().map(path_text),
                    Some(surge_client::lend::SOCKET_ENV),
                );
                f.set("--group", key(s, "group"), group.clone());
            }
        }
        Ok(f.out)
    }

    /// The environment a daemon gets from `[cluster]` for settings it has no flag for: the
    /// munged socket of the server (its registration), the agent and the mover (their calls
    /// to the manager). Not set when the environment already has it.
    pub fn env(&self, d: Daemon) -> Vec<(&'static str, String)> {
        let wants_munge = matches!(d, Daemon::Server | Daemon::Agent | Daemon::Mover);
        match (&self.cluster.munge_socket, wants_munge) {
            (Some(s), true) => vec![(surge_auth::munge::SOCKET_ENV, path_text(s))],
            _ => Vec::new(),
        }
    }
}

fn key(section: &str, name: &str) -> String {
    format!("{section}.{name}")
}

/// What the command line says before clap reads it: the subcommand (and where it is), and
/// `--config`.
#[derive(Debug, PartialEq)]
struct Scan {
    sub: Option<(usize, String)>,
    config: Option<PathBuf>,
}

/// Finds the subcommand (the first word that is not a global option or its value) and
/// `--config FILE` / `--config=FILE` anywhere before a `--`.
fn scan(args: &[OsString]) -> Scan {
    let mut sub = None;
    let mut config = None;
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if a == "--" {
            break;
        }
        if a == "--config" {
            config = args.get(i + 1).map(PathBuf::from);
            i += 2;
            continue;
        }
        if let Some(v) = a.strip_prefix("--config=") {
            config = Some(PathBuf::from(v));
        } else if sub.is_none() && !a.starts_with('-') {
            sub = Some((i, a.into_owned()));
        }
        i += 1;
    }
    Scan { sub, config }
}

/// True when the command line already gives flag `long` (`--x V` or `--x=V`).
fn given(args: &[OsString], long: &str) -> bool {
    let eq = format!("{long}=");
    args.iter()
        .map(|a| a.to_string_lossy())
        .take_while(|a| a != "--")
        .any(|a| a == long || a.starts_with(&eq))
}

/// The daemon a command line runs, if any (`surge server status` is a query, not the daemon).
fn daemon_of(args: &[OsString], scan: &Scan) -> Option<Daemon> {
    let (i, sub) = scan.sub.as_ref()?;
    let d = Daemon::from_subcommand(sub)?;
    if d == Daemon::Server {
        let next = args.get(i + 1).map(|a| a.to_string_lossy());
        if next.is_some_and(|n| matches!(n.as_ref(), "status" | "register" | "help")) {
            return None;
        }
    }
    Some(d)
}

/// What [`expand`] did: the command line to parse, and the flags and environment it took
/// from the file.
#[derive(Debug)]
pub struct Expanded {
    pub args: Vec<OsString>,
    pub daemon: Option<Daemon>,
    pub config: Option<PathBuf>,
    /// The flags inserted, in the file's terms.
    pub from_file: Vec<Flag>,
    /// Flags of the file left out because the command line or the environment gives them.
    pub overridden: Vec<(Flag, String)>,
    /// Environment variables to set for the daemon.
    pub env: Vec<(&'static str, String)>,
}

/// Inserts the settings of `--config FILE` as flags after the daemon's subcommand; returns
/// the command line unchanged for other commands or without `--config`.
pub fn expand(args: Vec<OsString>) -> anyhow::Result<Expanded> {
    let s = scan(&args);
    let daemon = daemon_of(&args, &s);
    let (Some(d), Some(path)) = (daemon, s.config.clone()) else {
        return Ok(Expanded {
            args,
            daemon,
            config: s.config,
            from_file: Vec::new(),
            overridden: Vec::new(),
            env: Vec::new(),
        });
    };
    let cfg = SurgeConfig::load(&path)?;
    let mut from_file = Vec::new();
    let mut overridden = Vec::new();
    let flags = cfg
        .flags(d, &surge_core::sys::hostname())
        .with_context(|| format!("{}", path.display()))?;
    for flag in flags {
        if given(&args, flag.long) {
            overridden.push((flag, "the command line".to_string()));
        } else if let Some(e) = flag
            .env
            .filter(|e| std::env::var_os(e).is_some_and(|v| !v.is_empty()))
        {
            overridden.push((flag, format!("${e}")));
        } else {
            from_file.push(flag);
        }
    }
    let env = cfg
        .env(d)
        .into_iter()
        .filter(|(k, _)| std::env::var_os(k).is_none())
        .collect();
    let at = s.sub.as_ref().map_or(args.len(), |(i, _)| i + 1);
    let mut out: Vec<OsString> = args[..at].to_vec();
    for f in &from_file {
        for v in &f.values {
            out.push(f.long.into());
            out.push(v.into());
        }
    }
    out.extend_from_slice(&args[at..]);
    Ok(Expanded {
        args: out,
        daemon: Some(d),
        config: Some(path),
        from_file,
        overridden,
        env,
    })
}

/// `main`'s hook: the command line with the configuration file's settings, and its
/// environment set (before any thread starts).
pub fn expand_args(args: impl Iterator<Item = OsString>) -> anyhow::Result<Vec<OsString>> {
    let e = expand(args.collect())?;
    for (k, v) in &e.env {
        // Called from main before the runtime or any other thread exists.
        std::env::set_var(k, v);
    }
    Ok(e.args)
}

/// Show what a daemon runs with, and check configuration files.
///
/// Examples:
///   surge config show manager --config /etc/surge/surge.toml
///   surge config show server --config /etc/surge/surge.toml --listen 0.0.0.0:7171
///   surge config show --json agent --config /etc/surge/surge.toml
///   surge config check --config /etc/surge/surge.toml
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum ConfigCommand {
    /// The command line a daemon runs with: the file's settings as flags (what the command
    /// line gives wins), checked by the daemon's own flag parser; nothing is started. Give the
    /// daemon's subcommand and flags as a unit's ExecStart gives them; options of `show`
    /// itself (--json) go before the subcommand.
    Show {
        /// The daemon's subcommand (manager, server, agent, mover, passthrough-helper) and
        /// flags, e.g. `manager --config /etc/surge/surge.toml`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
        /// As JSON: {"daemon", "config", "argv", "from_file": [{"key", "flag", "values"}],
        /// "overridden": [{"key", "flag", "by"}], "env": {...}}.
        #[arg(long)]
        json: bool,
    },
    /// Check a configuration file: every section parses and gives its daemon a command line
    /// its flag parser accepts. Exit status 1 if not.
    Check {
        /// The file (default: --config, else /etc/surge/surge.toml).
        file: Option<PathBuf>,
        /// As JSON: [{"daemon", "ok", "argv" or "error"}].
        #[arg(long)]
        json: bool,
    },
}

/// Runs `surge config`; `global_config` is the global `--config`.
pub fn run(
    args: ConfigArgs,
    global_config: Option<PathBuf>,
) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match args.command {
        ConfigCommand::Show { command, json } => {
            let mut argv: Vec<OsString> = vec!["surge".into()];
            argv.extend(command);
            if let Some(g) = global_config.filter(|_| scan(&argv).config.is_none()) {
                argv.push("--config".into());
                argv.push(g.into());
            }
            let e = expand(argv)?;
            anyhow::ensure!(
                e.daemon.is_some(),
                "`{}` is not a daemon the configuration file configures (one of: {})",
                e.args
                    .get(1)
                    .map(|a| a.to_string_lossy())
                    .unwrap_or_default(),
                Daemon::ALL.map(|d| d.subcommand()).join(", ")
            );
            if let Err(err) = parse(&e.args) {
                eprintln!("{err}");
                return Ok(ExitCode::from(2));
            }
            if json {
                let flags = |v: &[Flag]| -> Vec<serde_json::Value> {
                    v.iter()
                        .map(|f| serde_json::json!({"key": f.key, "flag": f.long, "values": f.values}))
                        .collect()
                };
                let over: Vec<serde_json::Value> = e
                    .overridden
                    .iter()
                    .map(|(f, by)| serde_json::json!({"key": f.key, "flag": f.long, "by": by}))
                    .collect();
                let env: serde_json::Map<String, serde_json::Value> = e
                    .env
                    .iter()
                    .map(|(k, v)| (k.to_string(), serde_json::Value::from(v.clone())))
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "daemon": e.daemon.map(|d| d.subcommand()),
                        "config": e.config,
                        "argv": e.args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
                        "from_file": flags(&e.from_file),
                        "overridden": over,
                        "env": env,
                    }))?
                );
            } else {
                println!("{}", shell_words(&e.args));
                for f in &e.from_file {
                    println!("  {} {}  <- {}", f.long, f.values.join(" "), f.key);
                }
                for (f, by) in &e.overridden {
                    println!("  ({} from {} is overridden by {by})", f.long, f.key);
                }
                for (k, v) in &e.env {
                    println!("  environment {k}={v}  <- cluster.munge_socket");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Check { file, json } => {
            let path = file
                .or(global_config)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH));
            let cfg = SurgeConfig::load(&path)?;
            let mut rows = Vec::new();
            let mut bad = 0;
            for d in Daemon::ALL.into_iter().filter(|d| cfg.has_section(*d)) {
                let argv: Vec<OsString> = vec![
                    "surge".into(),
                    d.subcommand().into(),
                    "--config".into(),
                    path.clone().into(),
                ];
                let row = match expand(argv).and_then(|e| parse(&e.args).map(|()| e.args)) {
                    Ok(a) => serde_json::json!({"daemon": d.subcommand(), "ok": true,
                        "argv": a.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()}),
                    Err(err) => {
                        bad += 1;
                        serde_json::json!({"daemon": d.subcommand(), "ok": false,
                            "error": format!("{err:#}")})
                    }
                };
                rows.push(row);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for r in &rows {
                    if r["ok"] == true {
                        println!("OK    [{}]", section_of(r));
                    } else {
                        println!(
                            "FAIL  [{}]: {}",
                            section_of(r),
                            r["error"].as_str().unwrap_or_default().trim()
                        );
                    }
                }
                if rows.is_empty() {
                    println!("{}: no daemon section ([manager], [server], [agent], [mover], [passthrough_helper])", path.display());
                }
            }
            Ok(if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn section_of(row: &serde_json::Value) -> &'static str {
    Daemon::ALL
        .into_iter()
        .find(|d| row["daemon"] == d.subcommand())
        .map_or("?", |d| d.section())
}

/// Parses a command line as `surge` would, running nothing.
fn parse(args: &[OsString]) -> anyhow::Result<()> {
    use clap::Parser;
    crate::Cli::try_parse_from(args)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("{}", e.render()))
}

/// A command line as a shell would take it back.
fn shell_words(args: &[OsString]) -> String {
    args.iter()
        .map(|a| {
            let s = a.to_string_lossy();
            if !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
            {
                s.into_owned()
            } else {
                format!("'{}'", s.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// A file that sets every key.
    const EVERY_KEY: &str = r#"
[cluster]
manager = "mgr:7060"
key_file = "/etc/surge/surge.key"
munge_socket = "/run/munge/munge.socket.2"
pool = "nvme"

[manager]
state = "/var/lib/surge/manager.db"
etcd = ["https://e1:2379", "https://e2:2379", "https://e3:2379"]
etcd_prefix = "/surge/"
etcd_ca = "/etc/surge/tls/ca.crt"
etcd_cert = "/etc/surge/tls/client.crt"
etcd_key = "/etc/surge/tls/client.key"
name = "%h"
listen = "0.0.0.0:7060"
http = "0.0.0.0:7061"
pool = "nvme"
granularity = "1GiB"
liveness_interval = 2
gc_interval = "30s"
retention_days = 30
grpc_max_connections = 60000
grpc_max_per_address = 4096
http_max_connections = 4096
http_max_per_address = 64
key_file = "/etc/surge/surge.key"
admin_group = 0
munge_socket = "/run/munge/munge.socket.2"
mount_root = "/run/surge/jobs"
reconcile_interval = "30s"
stage_on = "movers"
tls = "auto"
tls_cert = "/etc/surge/tls/manager.crt"
tls_key = "/etc/surge/tls/manager.key"

[server]
devices = ["/nvme0/surge", "/nvme1/surge"]
capacity = "3TiB"
listen = "0.0.0.0:7070"
unix = "/run/surge/server.sock"
id = "bb-%h"
advertise = "%h:7070"
manager = "mgr:7060"
pool = "nvme"
key_file = "/etc/surge/surge.key"
metadata_reserve = 16777216
metrics = "0.0.0.0:7072"
max_connections = 4096
max_connections_per_peer = 256
idle_timeout = 300
frame_timeout = 30.5
lock_grace = 10
orphan_grace = 30
tls = "auto"
tls_cert = "/etc/surge/tls/server.crt"
tls_key = "/etc/surge/tls/server.key"

[agent]
manager = "mgr:7060"
host = "%h"
interval = 5
threads = 2
deadline = 60

[mover]
manager = "mgr:7060"
host = "%h"
slots = 4

[passthrough_helper]
socket = "/run/surge/passthrough.sock"
group = "root"
"#;

    fn expanded_for(cfg: &SurgeConfig, d: Daemon) -> Vec<OsString> {
        let mut argv = os(&["surge", d.subcommand()]);
        for f in cfg.flags(d, "bb01").unwrap() {
            for v in &f.values {
                argv.push(f.long.into());
                argv.push(v.into());
            }
        }
        argv
    }

    /// Every key of every section becomes a flag the daemon's parser accepts.
    #[test]
    fn every_key_gives_a_flag_the_daemon_accepts() {
        let cfg = SurgeConfig::parse(EVERY_KEY).unwrap();
        for d in Daemon::ALL {
            let argv = expanded_for(&cfg, d);
            parse(&argv).unwrap_or_else(|e| panic!("{}: {e}", d.subcommand()));
        }
        let server = expanded_for(&cfg, Daemon::Server);
        let text: Vec<String> = server.iter().map(|a| a.to_string_lossy().into()).collect();
        let joined = text.join(" ");
        assert!(joined.contains("--advertise bb01:7070"), "{joined}");
        assert!(joined.contains("--id bb-bb01"), "{joined}");
        assert!(
            joined.contains("--device /nvme0/surge --device /nvme1/surge"),
            "{joined}"
        );
        assert!(joined.contains("--frame-timeout 30.5"), "{joined}");
    }

    /// Every flag of every daemon has its key in the file (a new flag needs one), except the
    /// ones that make no sense in a shared file.
    #[test]
    fn every_daemon_flag_has_a_key() {
        let cfg = SurgeConfig::parse(EVERY_KEY).unwrap();
        let cli = crate::Cli::command();
        for d in Daemon::ALL {
            let sub = cli
                .find_subcommand(d.subcommand())
                .unwrap_or_else(|| panic!("no subcommand {}", d.subcommand()));
            let flags = cfg.flags(d, "h").unwrap();
            let have: Vec<&str> = flags.iter().map(|f| f.long).collect();
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if matches!(
                    long,
                    "help" | "version" | "verbose" | "config" | "ready-file"
                ) {
                    continue;
                }
                let flag = format!("--{long}");
                assert!(
                    have.contains(&flag.as_str()),
                    "`surge {} {flag}` has no key in [{}] (config.rs)",
                    d.subcommand(),
                    d.section()
                );
            }
        }
    }

    #[test]
    fn the_command_line_wins_over_the_file_and_the_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("surge.toml");
        std::fs::write(
            &path,
            "[cluster]\nmanager = \"m:1\"\n[server]\ndevices = [\"/a\", \"/b\"]\nlisten = \"0.0.0.0:7070\"\ncapacity = \"1GiB\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let e = expand(os(&[
            "surge",
            "-v",
            "server",
            "--config",
            p,
            "--listen",
            "1.2.3.4:1",
            "--device=/c",
        ]))
        .unwrap();
        let args: Vec<String> = e.args.iter().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(
            args,
            [
                "surge",
                "-v",
                "server",
                "--capacity",
                "1GiB",
                "--manager",
                "m:1",
                "--config",
                p,
                "--listen",
                "1.2.3.4:1",
                "--device=/c"
            ]
        );
        let over: Vec<&str> = e.overridden.iter().map(|(f, _)| f.key.as_str()).collect();
        assert_eq!(over, ["server.devices", "server.listen"]);
        parse(&e.args).unwrap();
        // Queries of `surge server` and other commands are left alone.
        let q = os(&["surge", "server", "status", "--config", p, "x:1"]);
        assert_eq!(expand(q.clone()).unwrap().args, q);
        let q = os(&["surge", "pool", "ls", "--config", p]);
        assert_eq!(expand(q.clone()).unwrap().args, q);
        // Without --config nothing is read.
        let q = os(&["surge", "server", "--device", "/x"]);
        assert_eq!(expand(q.clone()).unwrap().args, q);
    }

    #[test]
    fn mistakes_name_the_line_and_the_key() {
        let err = |text: &str| SurgeConfig::parse(text).unwrap_err().to_string();
        let e = err("[server]\ndevices = [\"/a\"]\ncapacity = \"3XB\"\n");
        assert!(e.contains("line 3") && e.contains("3XB"), "{e}");
        let e = err("[server]\ncapcity = \"3TiB\"\n");
        assert!(e.contains("line 2") && e.contains("capcity"), "{e}");
        let e = err("[servers]\n");
        assert!(e.contains("servers"), "{e}");
        let e = err("[manager]\nstage_on = \"mover\"\n");
        assert!(
            e.contains("'mover' is not one of auto, local, movers"),
            "{e}"
        );
        // A group is looked up only for the daemon that uses it (it may exist only there).
        let cfg =
            SurgeConfig::parse("[manager]\nadmin_group = \"no-such-group-surge-test\"\n").unwrap();
        assert!(cfg.flags(Daemon::Server, "h").is_ok());
        let e = format!("{:#}", cfg.flags(Daemon::Manager, "h").unwrap_err());
        assert!(
            e.contains("manager.admin_group")
                && e.contains("no group named 'no-such-group-surge-test'"),
            "{e}"
        );
        let e = err("[agent]\ndeadline = \"soon\"\n");
        assert!(e.contains("line 2") && e.contains("soon"), "{e}");
    }

    #[test]
    fn percent_h_is_the_host() {
        assert_eq!(expand_host("%h:7070", "bb01"), "bb01:7070");
        assert_eq!(expand_host("100%% %h %x", "c1"), "100% c1 %x");
    }
}
