//! `surge manager` (the daemon) and the commands that talk to it: `surge pool`,
//! `surge instance ls`, `surge session ls`, `surge persistent`, `surge server register`.
//! Views in the spirit of DataWarp's `dwstat`, each with `--json` (the HTTP API's format).

use crate::core::{spawn_liveness, Core};
use crate::service::Service;
use crate::stage::Stages;
use crate::store::etcd::{EtcdStore, EtcdTls, LeaderInfo};
use crate::store::Store;
use crate::views;
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use surge_api::v1 as api;
use surge_api::v1::manager_server::ManagerServer;
use surge_core::format_bytes;
use tracing::{info, warn};

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Run the control plane: pools, servers and their liveness, instances, sessions and stage
/// tasks, with state in SQLite. Serves the gRPC API (for `surge` commands and servers) and a
/// read-only JSON API (`GET /v1/pools`, `/v1/servers`, `/v1/instances`, `/v1/sessions`,
/// `/v1/stages`).
///
/// Example:
///   surge manager --state /var/lib/surge/manager.db --listen 0.0.0.0:7060 --http 0.0.0.0:7061
///   surge server --device /nvme/bb --listen 0.0.0.0:7070 &
///   surge server register bb01:7070 --manager mgr:7060
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ManagerArgs {
    /// State database (created if missing; keep it on a durable disk). Not used with --etcd.
    #[arg(long, value_name = "FILE", default_value = "surge-manager.db")]
    pub state: PathBuf,
    /// Keep the state in etcd instead (comma-separated client URLs of its members, e.g.
    /// http://e1:2379,http://e2:2379,http://e3:2379): several managers may then run on it;
    /// one leads and serves, the others wait (not listening) and take over within seconds
    /// when it dies (docs/OPERATIONS.md).
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// The key prefix of this cluster's state in etcd.
    #[arg(long, value_name = "PREFIX", default_value = "/surge/")]
    pub etcd_prefix: String,
    /// The CA that signed the etcd members' certificates, for `https://` endpoints in --etcd
    /// (docs/SECURITY.md, "The manager's etcd"): only members it signed are trusted. Default:
    /// the site CA ($SURGE_TLS_CA, else ca.crt in $SURGE_TLS_DIR, else /etc/surge/tls).
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// The manager's client certificate for etcd members started with --client-cert-auth
    /// (`surge cert client NAME`). Default: client.crt in the certificate directory, when
    /// there is one.
    #[arg(long, value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    /// Its key (PEM). Default: client.key beside --etcd-cert.
    #[arg(long, value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
    /// This manager's name in the leader record (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// gRPC address (port 0 picks a free port; see --ready-file).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7060")]
    pub listen: String,
    /// Also serve the JSON read API here.
    #[arg(long, value_name = "HOST:PORT")]
    pub http: Option<String>,
    /// Name of the default pool (created if missing).
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// Granularity of the default pool when it is created (fragment size).
    #[arg(long, value_parser = surge_core::sys::size_arg, default_value = "1GiB")]
    pub granularity: u64,
    /// Seconds between liveness checks of the servers (a server that misses 3 in a row,
    /// each waited for at most 2 s, is marked down: within 9 s by default).
    #[arg(long, default_value_t = 1.0)]
    pub liveness_interval: f64,
    /// Seconds between comparisons of each server's fragments with the manager's records:
    /// fragments of instances the manager does not know (a creation cut by a crash, a lost
    /// state) are removed and what they held is logged and counted in /metrics.
    #[arg(long, default_value_t = 30.0)]
    pub gc_interval: f64,
    /// Once listening, write {"grpc", "http", "pid"} as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// The cluster key shared with the servers (0600; default $SURGE_KEY_FILE, else
    /// /etc/surge/surge.key): the manager signs capabilities with it.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Connections the gRPC API keeps open at most (and at most what the descriptor limit
    /// leaves); past it, new ones are closed at once.
    #[arg(long, default_value_t = 60000, env = "SURGE_MANAGER_MAX_CONNECTIONS")]
    pub grpc_max_connections: usize,
    /// gRPC connections one peer address may hold (agents, movers, servers and commands each
    /// hold one or a few; a host running many commands at once needs more).
    #[arg(long, default_value_t = 4096, env = "SURGE_MANAGER_MAX_PER_ADDRESS")]
    pub grpc_max_per_address: usize,
    /// Connections the HTTP API (dashboard, /v1, /metrics) keeps open at most.
    #[arg(long, default_value_t = 4096)]
    pub http_max_connections: usize,
    /// HTTP connections one peer address may hold (a connection must send its request within
    /// 10 s).
    #[arg(long, default_value_t = 64)]
    pub http_max_per_address: usize,
    /// Days an ended session (and its stage tasks) is kept before it is forgotten; 0: for
    /// ever. A session whose job instance was kept (a failed stage-out) stays while it does.
    #[arg(long, default_value_t = 30.0)]
    pub retention_days: f64,
    /// Members of this group (gid) administer Surge like root and the manager's own user:
    /// register servers, create pools, see and act on every user's instances and sessions.
    #[arg(long, value_name = "GID")]
    pub admin_group: Option<u32>,
    /// The munged socket that checks callers' MUNGE credentials (default $SURGE_MUNGE_SOCKET,
    /// else the system's /run/munge/munge.socket.2).
    #[arg(long, value_name = "PATH")]
    pub munge_socket: Option<PathBuf>,
    /// Where compute-node agents (`surge agent`) mount job instances on their hosts:
    /// DIR/<session>/job and DIR/<session>/persistent/<name> (what `surge bb paths` exports
    /// as $DW_JOB_STRIPED, ...).
    #[arg(long, value_name = "DIR", default_value = "/run/surge/jobs")]
    pub mount_root: String,
    /// Seconds between checks for sessions whose `surge run` died (they are ended; a job
    /// instance whose stage-out failed is kept). Also done at start.
    #[arg(long, default_value_t = 30.0)]
    pub reconcile_interval: f64,
    /// Where stage tasks run: on data movers (`surge mover` on hosts that mount the PFS) when
    /// one is alive, else here (auto); always here (local); only on movers (movers).
    #[arg(long, value_enum, default_value = "auto")]
    pub stage_on: crate::stage::StageOn,
    /// TLS 1.3 on the gRPC and HTTP listeners (docs/SECURITY.md, "On the wire"): MUNGE
    /// credentials, capabilities and job names never cross the network in clear. auto: with a
    /// certificate (--tls-cert), peers on other hosts must speak TLS, loopback peers may; without
    /// one, clear text. on: a certificate is required and every peer must speak TLS. off: clear
    /// text only (a private fabric). Clients use TLS when they have the site CA.
    #[arg(
        long,
        value_name = "auto|on|off",
        env = "SURGE_TLS",
        default_value = "auto"
    )]
    pub tls: surge_proto::tls::Mode,
    /// This manager's certificate (PEM, signed by the site CA; `surge cert server NAME...`
    /// with the names clients use for it). Default: server.crt in $SURGE_TLS_DIR, else
    /// /etc/surge/tls.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM). Default: server.key beside the certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl ManagerArgs {
    /// The TLS the flags ask for: `None` when the listeners speak clear text only.
    pub fn server_tls(&self) -> anyhow::Result<Option<Arc<surge_proto::tls::ServerTls>>> {
        let (cert, key) = (self.tls_cert.as_deref(), self.tls_key.as_deref());
        surge_proto::tls::server_from_flags(self.tls, cert, key, |why| {
            info!("gRPC and HTTP: {why}")
        })
        .map_err(anyhow::Error::msg)
    }
}

impl ManagerArgs {
    /// TLS to etcd: `Some` when --etcd lists `https://` members (then the CA is required and
    /// a client certificate used when there is one), `None` for `http://` ones. Mixing the
    /// two, or TLS options for clear members, is refused: one member in clear would carry
    /// everything the others protect.
    pub fn etcd_tls(&self) -> anyhow::Result<Option<EtcdTls>> {
        let https = self
            .etcd
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https == 0 {
            anyhow::ensure!(
                self.etcd_ca.is_none() && self.etcd_cert.is_none() && self.etcd_key.is_none(),
                "--etcd-ca, --etcd-cert and --etcd-key are for https:// etcd members; --etcd \
                 lists {}",
                self.etcd.join(",")
            );
            for e in &self.etcd {
                let host = e.strip_prefix("http://").unwrap_or(e);
                let host = surge_proto::tls::host_of(host.split('/').next().unwrap_or(host));
                if !surge_proto::tls::is_loopback(host) {
                    warn!(
                        "etcd member {e} is reached in clear text: the manager's state and \
                         leader record cross the network readable (give https:// members; \
                         docs/SECURITY.md)"
                    );
                }
            }
            return Ok(None);
        }
        anyhow::ensure!(
            https == self.etcd.len(),
            "--etcd mixes https:// and clear members ({}): give every member as https://",
            self.etcd.join(",")
        );
        use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        let certs = |path: &std::path::Path, what: &str| -> anyhow::Result<String> {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the {what} {}", path.display()))?;
            let n = CertificateDer::pem_slice_iter(text.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("the {what} {}", path.display()))?
                .len();
            anyhow::ensure!(n > 0, "the {what} {} holds no certificate", path.display());
            Ok(text)
        };
        let ca_path = self
            .etcd_ca
            .clone()
            .unwrap_or_else(surge_proto::tls::default_ca);
        let ca = certs(&ca_path, "etcd CA certificate (--etcd-ca)")?;
        let cert_path = match &self.etcd_cert {
            Some(p) => Some(p.clone()),
            None => Some(surge_proto::tls::cert_dir().join(surge_auth::cert::CLIENT_CERT))
                .filter(|p| p.exists()),
        };
        let identity = match cert_path {
            None => {
                anyhow::ensure!(
                    self.etcd_key.is_none(),
                    "--etcd-key needs --etcd-cert (no client.crt in {})",
                    surge_proto::tls::cert_dir().display()
                );
                None
            }
            Some(cert_path) => {
                let cert = certs(&cert_path, "etcd client certificate (--etcd-cert)")?;
                let key_path = self
                    .etcd_key
                    .clone()
                    .unwrap_or_else(|| cert_path.with_file_name(surge_auth::cert::CLIENT_KEY));
                let key = std::fs::read_to_string(&key_path).with_context(|| {
                    format!("cannot read the etcd client key {}", key_path.display())
                })?;
                PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .with_context(|| format!("the etcd client key {}", key_path.display()))?;
                info!(
                    "etcd over TLS: members verified with {}, this manager presents {}",
                    ca_path.display(),
                    cert_path.display()
                );
                Some((cert, key))
            }
        };
        if identity.is_none() {
            info!(
                "etcd over TLS: members verified with {}; no client certificate (members \
                 started with --client-cert-auth will refuse this manager: --etcd-cert)",
                ca_path.display()
            );
        }
        Ok(Some(EtcdTls { ca, identity }))
    }
}

pub fn run_manager(args: ManagerArgs) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    rt.block_on(async move {
        // A certificate that cannot be used stops the start here, before any campaign.
        let tls = args.server_tls()?;
        if let Some(t) = &tls {
            info!(
                "TLS on gRPC and HTTP ({}; clear text {})",
                t.mode,
                match t.mode {
                    surge_proto::tls::Mode::On => "refused",
                    _ => "from loopback only",
                }
            );
        }
        if let Some(parent) = args.state.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let key_file = args
            .key_file
            .clone()
            .unwrap_or_else(surge_auth::Key::default_path);
        let key = surge_auth::Key::load(&key_file)?;
        let munge_socket = args
            .munge_socket
            .clone()
            .unwrap_or_else(surge_auth::munge::socket);
        anyhow::ensure!(
            surge_auth::munge::answers(&munge_socket),
            "no munged answers at {}: the manager takes who its callers are from MUNGE (start \
             munged, or name its socket with --munge-socket)",
            munge_socket.display()
        );
        let (store, leading) = if args.etcd.is_empty() {
            let store = Store::sqlite(&args.state)
                .with_context(|| format!("cannot open manager state {}", args.state.display()))?;
            (store, None)
        } else {
            let tls = args.etcd_tls()?;
            let etcd = EtcdStore::connect(&args.etcd, &args.etcd_prefix, tls.as_ref()).await?;
            let me = LeaderInfo {
                name: args.name.clone().unwrap_or_else(surge_core::sys::hostname),
                pid: std::process::id(),
                grpc: vec![args.listen.clone()],
                http: args.http.clone(),
                since: crate::store::now(),
            };
            info!(
                "state in etcd at {} (prefix {}): campaigning as {}",
                args.etcd.join(","),
                args.etcd_prefix,
                me.name
            );
            let leadership = etcd.campaign(&me).await?;
            (Store::Etcd(Box::new(etcd)), Some((leadership, me)))
        };
        let mut core = Core::open(store, &args.pool, args.granularity, key, args.admin_group)
            .await
            .context("cannot open the manager's state")?;
        core.gc_every = Duration::from_secs_f64(args.gc_interval.max(0.1));
        let core = Arc::new(core);
        let stages = Arc::new(Stages::with(core.clone(), args.stage_on));
        stages.watch_sessions();
        stages.resume().await?;
        // Connections the listeners may hold: what the descriptor limit leaves after a
        // reserve for servers, etcd, munged and files.
        surge_core::sys::raise_nofile_limit().ok();
        let budget = crate::listen::descriptor_budget(1024);
        let grpc = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let grpc_addr = grpc.local_addr()?;
        let mut http_addr = None;
        if let Some(h) = &args.http {
            let l = tokio::net::TcpListener::bind(h)
                .await
                .with_context(|| format!("cannot listen on {h}"))?;
            http_addr = Some(l.local_addr()?);
            let router = crate::http::router(core.clone(), stages.clone(), munge_socket.clone());
            let gate = crate::listen::Gate::new(
                "HTTP API",
                crate::listen::Limits {
                    global: args.http_max_connections.min(budget / 4),
                    per_addr: args.http_max_per_address,
                },
            );
            tokio::spawn(crate::listen::serve_http(l, router, gate, tls.clone()));
        }
        // Instances of setups a crash interrupted, and failed creations: destroyed on their
        // servers now, and again until they are.
        crate::core::spawn_orphan_collection(
            core.clone(),
            Duration::from_secs_f64(args.liveness_interval.max(0.1)),
        );
        if let Some((mut leadership, mut me)) = leading {
            // The addresses clients reach this leader at, now that they are bound.
            me.grpc = vec![grpc_addr.to_string()];
            me.http = http_addr.map(|a| a.to_string());
            if let Store::Etcd(e) = &core.store {
                e.announce(&me, &leadership).await?;
            }
            tokio::spawn(async move {
                while leadership.lost.changed().await.is_ok() {
                    if *leadership.lost.borrow() {
                        break;
                    }
                }
                // A manager that may no longer lead must not serve another request: a
                // standby may already lead. Its writes are fenced anyway; exiting makes it
                // visible (and systemd restarts it as a standby).
                tracing::error!("leadership lost: exiting so a standby serves");
                std::process::exit(3);
            });
        }
        crate::core::spawn_retention(core.clone(), args.retention_days);
        spawn_liveness(
            core.clone(),
            Duration::from_secs_f64(args.liveness_interval.max(0.1)),
        );
        // Sessions of `surge run`s that died: at start, then every --reconcile-interval.
        crate::core::spawn_reconcile(
            core.clone(),
            Duration::from_secs_f64(args.reconcile_interval.max(0.1)),
        );
        info!(
            "surge manager listening on {grpc_addr} (gRPC){}; state {}",
            http_addr
                .map(|a| format!(" and {a} (HTTP)"))
                .unwrap_or_default(),
            args.state.display()
        );
        if let Some(f) = &args.ready_file {
            let text = serde_json::json!({
                "grpc": grpc_addr.to_string(),
                "http": http_addr.map(|a| a.to_string()),
                "pid": std::process::id(),
            });
            std::fs::write(f, text.to_string())
                .with_context(|| format!("cannot write {}", f.display()))?;
        }
        let svc = Service {
            core,
            stages,
            http: http_addr.map(|a| a.to_string()),
            agents: Arc::new(crate::agents::Agents::default()),
            mount_root: args.mount_root.trim_end_matches('/').to_string(),
        };
        // Small replies must leave at once (TCP_NODELAY: without it each phase waited ~40 ms
        // for Nagle's algorithm and the peer's delayed ACK, issue 30), and no peer holds more
        // than its share of the connections (issue 31).
        let incoming = crate::listen::incoming(
            grpc,
            crate::listen::Gate::new(
                "gRPC API",
                crate::listen::Limits {
                    global: args.grpc_max_connections.min(budget),
                    per_addr: args.grpc_max_per_address,
                },
            ),
            tls,
        );
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            info!("shutting down");
        };
        tonic::transport::Server::builder()
            // A peer that stops answering (its host died, a half-open connection) is dropped.
            .http2_keepalive_interval(Some(Duration::from_secs(20)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .tcp_keepalive(Some(Duration::from_secs(60)))
            .add_service(ManagerServer::with_interceptor(
                svc,
                crate::service::authenticate(munge_socket),
            ))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .context("gRPC server failed")?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Where the manager is: `--manager` or `$SURGE_MANAGER`.
#[derive(clap::Args, Debug, Clone)]
pub struct ManagerAddr {
    /// The manager's gRPC address (host:port); default $SURGE_MANAGER. With neither, `pool`,
    /// `instance ls`, `session` and `persistent` use the embedded default's (the running `surge
    /// run`'s, else one started for the command over the state `surge run` keeps).
    #[arg(
        long = "manager",
        env = "SURGE_MANAGER",
        value_name = "HOST:PORT",
        global = true
    )]
    pub manager: Option<String>,
}

impl ManagerAddr {
    pub fn get(&self) -> anyhow::Result<&str> {
        self.manager.as_deref().context(
            "no manager given: pass --manager HOST:PORT or set SURGE_MANAGER (inside a job started \
             by `surge run`, it is set)",
        )
    }
}

/// A client of the manager at `addr` whose calls carry MUNGE credentials.
pub async fn connect(addr: &str) -> anyhow::Result<surge_api::Client> {
    Ok(surge_api::connect(addr).await?)
}

pub use surge_api::status_err;

fn print_json(v: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Pools of burst-buffer servers (`dwstat pools`).
#[derive(clap::Args, Debug)]
pub struct PoolArgs {
    #[command(flatten)]
    pub addr: ManagerAddr,
    #[command(subcommand)]
    pub command: PoolCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum PoolCommand {
    /// List pools with their granularity, servers and free capacity.
    Ls {
        /// Print the pools as JSON (the format of the manager's `/v1/pools`).
        #[arg(long)]
        json: bool,
    },
    /// Show the calibrated peaks the manager keeps for each server (and for the pool's
    /// servers measured all at once): what `#SURGE jobdw` performance targets are sized from.
    Peaks {
        /// Only this pool's servers (default: every pool).
        #[arg(long)]
        pool: Option<String>,
        /// Print {"servers": [...], "pools": [...]} as JSON (the HTTP API's `/v1/peaks`).
        #[arg(long)]
        json: bool,
    },
    /// Measure the peaks of a pool's servers through the data path and register them with the
    /// manager (administrators): for each server, an instance of one fragment on it, mounted
    /// here and measured by `surge bench calibrate`; then one fragment on every server at once
    /// (the pool's aggregate). With --peaks-file, register a file measured elsewhere instead.
    Calibrate(Box<CalibrateArgs>),
    /// Create a pool (or change its granularity).
    Create {
        /// The pool's name (what `#DW jobdw pool=NAME` asks for).
        name: String,
        /// Fragment size, e.g. 200GiB.
        #[arg(long, value_parser = surge_core::sys::size_arg)]
        granularity: u64,
    },
}

/// `surge pool calibrate`'s options (run by `surge_run::calibrate`, which mounts instances).
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
surge pool calibrate                                # every server of the default pool, then all at once\n  \
surge pool calibrate --pool fast --server bb07-1a2b  # one server again (after a disk change)\n  \
surge bench calibrate /nvme/bb -o bb07.json && surge pool calibrate --server bb07-1a2b --peaks-file bb07.json\n\n\
What is kept and how it is used: docs/peaks.md")]
pub struct CalibrateArgs {
    /// The pool (default: the manager's default pool).
    #[arg(long, default_value = "")]
    pub pool: String,
    /// Only this server (by id, as `surge pool peaks` lists them); repeatable. Default: every
    /// server of the pool that is up.
    #[arg(long = "server", value_name = "ID")]
    pub servers: Vec<String>,
    /// Do not measure the pool's servers all at once (the aggregate caps what the servers'
    /// own peaks add up to; measured from this one host, it is what one client node gets).
    #[arg(long)]
    pub no_aggregate: bool,
    /// Register this peaks file (`surge bench calibrate -o`) instead of measuring: for each
    /// --server (default every server of the pool), or as the pool's aggregate with --aggregate.
    #[arg(long, value_name = "PEAKS.json")]
    pub peaks_file: Option<PathBuf>,
    /// With --peaks-file: the file is the pool's aggregate (all its servers at once).
    #[arg(long, requires = "peaks_file")]
    pub aggregate: bool,
    /// Stonewall of each benchmark phase, seconds (`surge bench calibrate --deadline`).
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    pub deadline: f64,
    /// Largest process count tried (`surge bench calibrate --max-procs`; default 4 x CPUs, at
    /// most 64).
    #[arg(long, value_name = "N")]
    pub max_procs: Option<u32>,
    /// Where to mount the calibration instances (default: a directory under /tmp).
    #[arg(long, value_name = "DIR")]
    pub mount_dir: Option<PathBuf>,
    /// Print what was registered as JSON (the format of `surge pool peaks --json`).
    #[arg(long)]
    pub json: bool,
}

/// When something happened, as a reader wants it ("3m ago").
pub fn ago(t: i64) -> String {
    format!("{} ago", age(t))
}

fn print_peaks(list: &api::PeaksList) {
    let gib = |b: f64| format!("{:.2}", b / (1u64 << 30) as f64);
    let k = |o: f64| {
        if o >= 1000.0 {
            format!("{:.1}k", o / 1000.0)
        } else {
            format!("{o:.0}")
        }
    };
    println!(
        "{:<22} {:<8} {:<5} {:<21} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  source",
        "server",
        "pool",
        "state",
        "measured",
        "rd GiB/s",
        "wr GiB/s",
        "rd IOPS",
        "wr IOPS",
        "fsync/s",
        "md op/s"
    );
    let row = |name: &str, p: &api::RegisteredPeaks, state: &str| {
        match serde_json::from_str::<surge_core::peaks::Peaks>(&p.peaks_json) {
            Ok(pk) => println!(
                "{:<22} {:<8} {:<5} {:<21} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  {} ({})",
                name,
                p.pool,
                state,
                pk.measured_at,
                gib(pk.read_bw),
                gib(pk.write_bw),
                k(pk.read_iops),
                k(pk.write_iops),
                if pk.write_iops_fsync > 0.0 {
                    k(pk.write_iops_fsync)
                } else {
                    "-".into()
                },
                k(pk.metadata_ops),
                p.source,
                ago(p.registered)
            ),
            Err(_) => println!(
                "{:<22} {:<8} {:<5} no calibrated peaks: `surge pool calibrate --pool {} --server {}` measures them",
                name, p.pool, state, p.pool, p.server
            ),
        }
    };
    for p in &list.servers {
        row(&p.server, p, &p.state);
    }
    for p in &list.pools {
        row(&format!("({} servers at once)", p.servers), p, "-");
    }
    if list.servers.is_empty() {
        println!("(no servers registered)");
    }
}

pub fn run_pool(args: PoolArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async move {
        let mut c = connect(args.addr.get()?).await?;
        match args.command {
            PoolCommand::Ls { json } => {
                let pools = c
                    .list_pools(api::Empty {})
                    .await
                    .map_err(status_err)?
                    .into_inner()
                    .pools;
                if json {
                    return print_json(&serde_json::Value::Array(
                        pools.iter().map(views::pool_json).collect(),
                    ))
                    .map(|_| ExitCode::SUCCESS);
                }
                println!(
                    "{:<16} {:>12} {:>8} {:>4} {:>12} {:>12}",
                    "pool", "granularity", "servers", "up", "capacity", "free"
                );
                for p in pools {
                    println!(
                        "{:<16} {:>12} {:>8} {:>4} {:>12} {:>12}",
                        p.name,
                        format_bytes(p.granularity),
                        p.servers,
                        p.servers_up,
                        format_bytes(p.capacity),
                        format_bytes(p.free)
                    );
                }
                // What limits one user short of the pool (issue 31: one user took all of it).
                let quotas = c
                    .list_quotas(api::Empty {})
                    .await
                    .map_err(status_err)?
                    .into_inner()
                    .quotas;
                if quotas.is_empty() {
                    println!("no quotas: a user may take the whole pool (`surge quota set`)");
                }
                for q in &quotas {
                    let lim = |n: u64, f: &dyn Fn(u64) -> String| {
                        if n == 0 {
                            "no limit".to_string()
                        } else {
                            f(n)
                        }
                    };
                    let who = match q.kind.as_str() {
                        "default" => "every user without their own".to_string(),
                        k => format!("{k} {}", q.id),
                    };
                    println!(
                        "quota of {who}: capacity {} (held {}), instances {} (held {}), \
                         sessions {} (held {}), stage tasks {} (held {})",
                        lim(q.capacity, &|n| format_bytes(n)),
                        format_bytes(q.used_capacity),
                        lim(q.instances.into(), &|n| n.to_string()),
                        q.used_instances,
                        lim(q.sessions.into(), &|n| n.to_string()),
                        q.used_sessions,
                        lim(q.stage_tasks.into(), &|n| n.to_string()),
                        q.used_stage_tasks,
                    );
                }
            }
            PoolCommand::Peaks { pool, json } => {
                let list = c
                    .list_peaks(api::ListPeaksRequest {
                        pool: pool.unwrap_or_default(),
                    })
                    .await
                    .map_err(status_err)?
                    .into_inner();
                if json {
                    print_json(&serde_json::json!({
                        "servers": list.servers.iter().map(views::peaks_json).collect::<Vec<_>>(),
                        "pools": list.pools.iter().map(views::peaks_json).collect::<Vec<_>>(),
                    }))?;
                } else {
                    print_peaks(&list);
                }
            }
            PoolCommand::Calibrate(_) => anyhow::bail!(
                "surge pool calibrate is run by the surge binary (surge_run::calibrate)"
            ),
            PoolCommand::Create { name, granularity } => {
                let p = c
                    .create_pool(api::CreatePoolRequest { name, granularity })
                    .await
                    .map_err(status_err)?
                    .into_inner();
                println!(
                    "pool {} (granularity {})",
                    p.name,
                    format_bytes(p.granularity)
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Sessions: jobs and the instances they use (`dwstat sessions`).
#[derive(clap::Args, Debug)]
pub struct SessionArgs {
    #[command(flatten)]
    pub addr: ManagerAddr,
    #[command(subcommand)]
    pub command: SessionCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum SessionCommand {
    /// List sessions: those being set up or active; with --all, the newest of the history
    /// too, a page at a time (the history can be millions: --limit, --before).
    Ls {
        /// Include ended sessions (the newest --limit of them).
        #[arg(long, short)]
        all: bool,
        /// With --all: sessions shown at most (the newest first).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// With --all: only sessions with ids below this one (the next page of a listing).
        #[arg(long, default_value_t = 0)]
        before: u64,
        /// Print the sessions as JSON (the format of the manager's `/v1/sessions`).
        #[arg(long)]
        json: bool,
    },
    /// End a session by hand (a job whose `surge run` or scheduler is gone): its deferred
    /// stage-outs are cancelled and its job instance destroyed. Yours only, unless you
    /// administer the manager.
    End {
        /// The session's id (`surge session ls`).
        id: u64,
        /// Keep the job instance (e.g. to copy its files out by hand) instead of destroying it.
        #[arg(long)]
        keep_instance: bool,
    },
}

fn age(t: i64) -> String {
    let s = (crate::store::now() - t).max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

pub fn run_session(args: SessionArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async move {
        let mut c = connect(args.addr.get()?).await?;
        let (all, limit, before, json) = match args.command {
            SessionCommand::Ls {
                all,
                limit,
                before,
                json,
            } => (all, limit, before, json),
            SessionCommand::End { id, keep_instance } => {
                let before = c
                    .get_session(api::GetSessionRequest { id })
                    .await
                    .map_err(status_err)?
                    .into_inner();
                if before.state != "active" {
                    println!("session {id} ({}) is already {}", before.job, before.state);
                    return Ok(ExitCode::SUCCESS);
                }
                let s = c
                    .end_session(api::EndSessionRequest {
                        id,
                        keep_job_instance: keep_instance,
                        state: String::new(),
                    })
                    .await
                    .map_err(status_err)?
                    .into_inner();
                println!(
                    "session {} ({}) {}{}",
                    s.id,
                    s.job,
                    s.state,
                    if keep_instance && s.job_instance != 0 {
                        format!("; job instance {} kept", s.job_instance)
                    } else {
                        String::new()
                    }
                );
                return Ok(ExitCode::SUCCESS);
            }
        };
        // Open sessions: every page (there are as many as jobs running). With --all: the
        // newest `limit` of the history below `before`.
        let mut sessions = Vec::new();
        let mut cursor = if all { before } else { 0 };
        let more = loop {
            let want = if all {
                limit.saturating_sub(sessions.len() as u32).max(1)
            } else {
                0
            };
            let page = c
                .list_sessions_page(api::ListSessionsRequest {
                    before: cursor,
                    limit: want,
                    open_only: !all,
                })
                .await
                .map_err(status_err)?
                .into_inner();
            sessions.extend(page.sessions);
            cursor = page.next_before;
            if cursor == 0 || (all && sessions.len() as u32 >= limit) {
                break cursor;
            }
        };
        sessions.sort_by_key(|s| s.id);
        if json {
            print_json(&serde_json::Value::Array(
                sessions.iter().map(views::session_json).collect(),
            ))?;
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:>6} {:<24} {:<18} {:<16} {:>6} {:>12} {:<12} {:<}",
            "id", "job", "state", "phase", "age", "job inst", "persistent", "hosts"
        );
        for s in sessions {
            println!(
                "{:>6} {:<24} {:<18} {:<16} {:>6} {:>12} {:<12} {}{}",
                s.id,
                s.job,
                s.state,
                if s.phase.is_empty() { "-" } else { &s.phase },
                age(s.created),
                if s.job_instance == 0 {
                    "-".to_string()
                } else {
                    s.job_instance.to_string()
                },
                format!("{:?}", s.persistent),
                if s.hosts.is_empty() {
                    "-".to_string()
                } else {
                    s.hosts.join(",")
                },
                if s.mount { " (mounted)" } else { "" }
            );
            if let Ok(p) = serde_json::from_str::<crate::targets::Promise>(&s.promise_json) {
                println!(
                    "{:>6} promised {} for {}",
                    "",
                    crate::targets::describe(&p.offer),
                    p.why
                        .iter()
                        .map(|w| w.split(':').next().unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        if more != 0 {
            println!("(older sessions: surge session ls --all --before {more})");
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub async fn list_instances(manager: &str, json: bool) -> anyhow::Result<()> {
    let mut c = connect(manager).await?;
    let instances = c
        .list_instances(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .instances;
    if json {
        return print_json(&serde_json::Value::Array(
            instances.iter().map(views::instance_json).collect(),
        ));
    }
    println!(
        "{:>12} {:<20} {:<10} {:<8} {:>10} {:>10} {:>5} {:>5} {:<}",
        "id", "name", "kind", "mode", "capacity", "used", "frags", "nodes", "sessions"
    );
    for i in instances {
        println!(
            "{:>12} {:<20} {:<10} {:<8} {:>10} {:>10} {:>5} {:>5} {:?}",
            i.id,
            i.name,
            i.kind,
            i.access_mode,
            format_bytes(i.capacity),
            format_bytes(i.used),
            i.fragments,
            i.nodes,
            i.sessions
        );
    }
    Ok(())
}

/// Persistent instances: created and destroyed explicitly, outlive jobs, attached with
/// `#DW persistentdw name=X`.
#[derive(clap::Args, Debug)]
pub struct PersistentArgs {
    #[command(flatten)]
    pub addr: ManagerAddr,
    #[command(subcommand)]
    pub command: PersistentCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum PersistentCommand {
    /// Create a persistent instance (like `#BB create_persistent`).
    Create {
        /// The instance's name, unique: jobs attach it with `#DW persistentdw name=NAME` and
        /// find it in $DW_PERSISTENT_STRIPED_NAME.
        name: String,
        /// Its size, e.g. 200GiB (rounded up to whole fragments of the pool's granularity).
        #[arg(long, value_parser = surge_core::sys::size_arg)]
        capacity: u64,
        /// How compute nodes share it (persistent instances are striped: one tree for all).
        #[arg(long, default_value = "striped", value_parser = ["striped"])]
        access_mode: String,
        /// The pool to allocate from (default: the manager's default pool).
        #[arg(long, default_value = "")]
        pool: String,
        /// Let members of your group use it too (attach it, stage into and out of it, mount
        /// it); by default only you and administrators may.
        #[arg(long)]
        share_with_group: bool,
        /// Print the created instance as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List persistent instances.
    Ls {
        /// Print the instances as JSON (the format of the manager's `/v1/instances`).
        #[arg(long)]
        json: bool,
    },
    /// Destroy a persistent instance and its data (refused while a job uses it).
    Destroy {
        /// The instance's name (as in `surge persistent ls`).
        name: String,
        /// Do not wait for pending stage-outs; a cache instance is destroyed even with changes
        /// not yet drained to its PFS directory (they are lost).
        #[arg(long)]
        hurry: bool,
    },
}

pub fn run_persistent(args: PersistentArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async move {
        let mut c = connect(args.addr.get()?).await?;
        match args.command {
            PersistentCommand::Create {
                name,
                capacity,
                access_mode,
                pool,
                share_with_group,
                json,
            } => {
                // SAFETY: getuid/getgid have no preconditions.
                let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
                let i = c
                    .create_instance(api::CreateInstanceRequest {
                        capacity,
                        access_mode,
                        pool,
                        persistent_name: name,
                        nodes: 1,
                        owner_uid: uid,
                        owner_gid: gid,
                        stripe_size: 0,
                        share_with_group,
                        ..Default::default()
                    })
                    .await
                    .map_err(status_err)?
                    .into_inner();
                if json {
                    print_json(&views::instance_json(&i))?;
                } else {
                    println!(
                        "persistent instance {} (id {}): {} in {} fragments",
                        i.name,
                        i.id,
                        format_bytes(i.capacity),
                        i.fragments
                    );
                }
            }
            PersistentCommand::Ls { json } => {
                let instances: Vec<_> = c
                    .list_instances(api::Empty {})
                    .await
                    .map_err(status_err)?
                    .into_inner()
                    .instances
                    .into_iter()
                    .filter(|i| i.kind == "persistent")
                    .collect();
                if json {
                    print_json(&serde_json::Value::Array(
                        instances.iter().map(views::instance_json).collect(),
                    ))?;
                } else {
                    println!(
                        "{:<20} {:>12} {:>10} {:>10} {:>6} {:<}",
                        "name", "id", "capacity", "used", "age", "sessions"
                    );
                    for i in instances {
                        println!(
                            "{:<20} {:>12} {:>10} {:>10} {:>6} {:?}",
                            i.name,
                            i.id,
                            format_bytes(i.capacity),
                            format_bytes(i.used),
                            age(i.created),
                            i.sessions
                        );
                    }
                }
            }
            PersistentCommand::Destroy { name, hurry } => {
                c.destroy_instance(api::DestroyInstanceRequest {
                    id: 0,
                    persistent_name: name.clone(),
                    hurry,
                })
                .await
                .map_err(status_err)?;
                println!("destroyed persistent instance {name}");
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub async fn register_server(manager: &str, addr: &str, pool: &str) -> anyhow::Result<api::Server> {
    let mut c = connect(manager).await?;
    Ok(c.register_server(api::RegisterServerRequest {
        addr: addr.to_string(),
        pool: pool.to_string(),
    })
    .await
    .map_err(status_err)?
    .into_inner())
}

/// Register a running server with the manager, into a pool (a server started with
/// `surge server --manager` does this itself).
#[derive(clap::Args, Debug)]
pub struct RegisterArgs {
    /// The server's address as the manager can reach it (host:port).
    pub addr: String,
    #[command(flatten)]
    pub manager: ManagerAddr,
    /// Pool to register into.
    #[arg(long, default_value = "default")]
    pub pool: String,
}

pub fn run_register(args: RegisterArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async move {
        let s = register_server(args.manager.get()?, &args.addr, &args.pool).await?;
        println!(
            "server {} registered in pool {} ({})",
            s.id,
            s.pool,
            format_bytes(s.capacity)
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// Registers a server that just started, retrying until the manager answers (it may start
/// later). Runs on its own thread so the server serves meanwhile.
pub fn register_in_background(manager: String, addr: String, pool: String) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        let mut delay = Duration::from_millis(100);
        loop {
            match rt.block_on(register_server(&manager, &addr, &pool)) {
                Ok(s) => {
                    info!(
                        "registered with manager {manager} as {} in pool {}",
                        s.id, s.pool
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!("cannot register with manager {manager} yet: {e:#}");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    });
}

/// Print the URL of the manager's web dashboard, with a view token that shows you your own
/// sessions, instances and stage tasks (administrators: everyone's) for 12 hours. Open it in a
/// browser; keep it to yourself (it reads as you). Scripts can send the token themselves:
/// `curl -H "Authorization: Bearer $(surge dashboard --json | jq -r .token)" http://.../v1/sessions`.
#[derive(clap::Args, Debug)]
pub struct DashboardArgs {
    #[command(flatten)]
    pub addr: ManagerAddr,
    /// Print {"url", "token", "expires"} as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `http(s)://host:port/#token=...` for a manager reached at `grpc` whose HTTP API is bound to
/// `http` (a wildcard address is replaced by the host `grpc` names).
pub fn dashboard_url(grpc: &str, http: &str, token: &str) -> String {
    let grpc_host = grpc
        .trim_start_matches("http://")
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(grpc);
    let (host, port) = http.rsplit_once(':').unwrap_or((http, "80"));
    let host = match host {
        "0.0.0.0" | "[::]" | "" => grpc_host,
        h => h,
    };
    // HTTPS where this host would speak TLS to it (it has the site CA, and the manager is on
    // another host or SURGE_TLS=on): the manager then requires it.
    let tls = surge_proto::tls::client()
        .ok()
        .flatten()
        .is_some_and(|t| t.applies(surge_proto::tls::host_of(&format!("{host}:{port}"))));
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{host}:{port}/#token={token}")
}

pub fn run_dashboard(args: DashboardArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async move {
        let addr = args.addr.get()?;
        let mut c = connect(addr).await?;
        let v = c
            .get_view_token(api::Empty {})
            .await
            .map_err(status_err)?
            .into_inner();
        anyhow::ensure!(
            !v.http.is_empty(),
            "the manager at {addr} serves no HTTP API (start it with --http HOST:PORT)"
        );
        let url = dashboard_url(addr, &v.http, &v.token);
        if args.json {
            print_json(&serde_json::json!({
                "url": url,
                "token": v.token,
                "expires": v.expires,
            }))?;
        } else {
            println!("{url}");
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod dashboard_tests {
    #[test]
    fn the_dashboard_url_names_a_host_the_caller_can_reach() {
        assert_eq!(
            super::dashboard_url("bb1:7060", "0.0.0.0:7061", "ab"),
            "http://bb1:7061/#token=ab"
        );
        assert_eq!(
            super::dashboard_url("bb1:7060", "10.0.0.5:7061", "ab"),
            "http://10.0.0.5:7061/#token=ab"
        );
    }
}

/// The cluster key: 32 random bytes the manager and its servers share to sign and check the
/// capabilities clients present to servers. Create it once at install, as the service user
/// (root), and copy it to every burst-buffer node with the same owner and mode 0600 (e.g.
/// `install -m 0600 surge.key /etc/surge/`). Anyone who can read it can read every instance.
#[derive(clap::Args, Debug)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum KeyCommand {
    /// Create a new key file (0600, its directory 0700); an existing file is never overwritten.
    Create {
        /// Where (default $SURGE_KEY_FILE, else /etc/surge/surge.key).
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
    },
    /// Check that a key file exists, loads, and is readable by its owner only.
    Check {
        /// Which (default $SURGE_KEY_FILE, else /etc/surge/surge.key).
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
    },
}

/// Certificates for TLS on the data protocol (docs/SECURITY.md, "Certificates"). Once, at
/// install: `surge cert ca` makes the site CA (or bring the site's own: --ca-cert/--ca-key);
/// then `surge cert server NAME...` per burst-buffer host, with every name and address
/// clients reach it by; copy its server.crt and server.key to that host's /etc/surge/tls/
/// (the key 0600, owned by the server's user), and ca.crt to every host. Servers with a
/// certificate speak TLS to other hosts; clients with ca.crt verify it.
///
///   surge cert ca
///   surge cert server bb1 10.0.0.11 --out /tmp/bb1
///   scp /tmp/bb1/server.* bb1:/etc/surge/tls/
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CertArgs {
    #[command(subcommand)]
    pub command: CertCommand,
}

/// Where a signed certificate goes, and the CA that signs it.
#[derive(clap::Args, Debug)]
pub struct Signing {
    /// Where to write it (default: the certificate directory, for this host).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The CA's certificate (default ca.crt in $SURGE_TLS_DIR, else /etc/surge/tls): the
    /// site's own CA works as well.
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// The CA's key (default ca.key beside --ca-cert).
    #[arg(long, value_name = "FILE")]
    ca_key: Option<PathBuf>,
    /// Days it is valid.
    #[arg(long, default_value_t = 825)]
    days: u32,
}

impl Signing {
    /// Signs a certificate for `names` as `role`, written as `cert_name` and `key_name` in
    /// --out; their paths.
    fn sign(
        self,
        names: &[String],
        role: surge_auth::cert::Role,
        (cert_name, key_name): (&str, &str),
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        use surge_auth::cert;
        let ca_cert = self
            .ca_cert
            .unwrap_or_else(|| cert::default_dir().join(cert::CA_CERT));
        let ca_key = self
            .ca_key
            .unwrap_or_else(|| ca_cert.with_file_name(cert::CA_KEY));
        let out = self.out.unwrap_or_else(cert::default_dir);
        let (c, k) = (out.join(cert_name), out.join(key_name));
        cert::create_signed(&ca_cert, &ca_key, names, role, self.days, &c, &k)?;
        Ok((c, k))
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum CertCommand {
    /// Make the site CA: ca.crt (0644) and ca.key (0600) in --dir; never overwrites.
    Ca {
        /// Where (default $SURGE_TLS_DIR, else /etc/surge/tls).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The CA's name.
        #[arg(long, default_value = "Surge site CA")]
        name: String,
        /// Days it is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Make a server's certificate (server.crt, server.key 0600 in --out), signed by the CA.
    Server {
        /// The host names and IP addresses clients connect to it by (as in its --advertise
        /// and --listen addresses).
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        signing: Signing,
        /// Also valid as a client certificate (serverAuth and clientAuth): for an etcd member,
        /// which dials its peers and its own gateway with the certificate it serves with
        /// (docs/SECURITY.md, "The manager's etcd").
        #[arg(long)]
        peer: bool,
    },
    /// Make a client certificate (client.crt, client.key 0600 in --out), signed by the CA:
    /// the manager's, for an etcd that asks its clients for one (--client-cert-auth);
    /// `surge manager --etcd-cert` takes it.
    Client {
        /// The client's name (its certificate's common name; etcd's user name when etcd's
        /// authentication is on).
        name: String,
        #[command(flatten)]
        signing: Signing,
    },
}

pub fn run_cert(args: CertArgs) -> anyhow::Result<ExitCode> {
    use surge_auth::cert;
    match args.command {
        CertCommand::Ca { dir, name, days } => {
            let dir = dir.unwrap_or_else(cert::default_dir);
            let (c, k) = cert::create_ca(&dir, &name, days)?;
            println!(
                "created {} and {} (0600): copy the certificate to every host; keep the key \
                 where certificates are made",
                c.display(),
                k.display()
            );
        }
        CertCommand::Server {
            names,
            signing,
            peer,
        } => {
            let role = if peer {
                cert::Role::Peer
            } else {
                cert::Role::Server
            };
            let (c, k) = signing.sign(&names, role, (cert::SERVER_CERT, cert::SERVER_KEY))?;
            println!(
                "created {} and {} (0600) for {}: install them in /etc/surge/tls/ of that host, \
                 the key owned by the server's user",
                c.display(),
                k.display(),
                names.join(", ")
            );
        }
        CertCommand::Client { name, signing } => {
            let names = [name];
            let (c, k) = signing.sign(
                &names,
                cert::Role::Client,
                (cert::CLIENT_CERT, cert::CLIENT_KEY),
            )?;
            println!(
                "created {} and {} (0600) for client {}: install them on the manager's host \
                 (surge manager --etcd-cert, --etcd-key), the key owned by the manager's user",
                c.display(),
                k.display(),
                names[0]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_key(args: KeyArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        KeyCommand::Create { key_file } => {
            let p = key_file.unwrap_or_else(surge_auth::Key::default_path);
            surge_auth::Key::create(&p)?;
            println!(
                "created {} (0600): copy it to every server node",
                p.display()
            );
        }
        KeyCommand::Check { key_file } => {
            let p = key_file.unwrap_or_else(surge_auth::Key::default_path);
            surge_auth::Key::load(&p)?;
            println!("{}: a valid key, readable by its owner only", p.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
