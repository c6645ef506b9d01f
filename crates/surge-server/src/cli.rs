//! `surge server` flags and the process's main loop.

use crate::admission::{self, Admission, ConnLimits};
use crate::conn;
use crate::registry::{write_json_atomic, Registry};
use anyhow::Context;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// Run a burst-buffer server: store fragments of instances on fast-tier directories and serve
/// their data and metadata.
///
/// Example (three servers on one machine, fast tier in /dev/shm):
///
///   surge server --device /dev/shm/bb1 --capacity 4GiB --listen 127.0.0.1:7001 &
///   surge server --device /dev/shm/bb2 --capacity 4GiB --listen 127.0.0.1:7002 &
///   surge server --device /dev/shm/bb3 --capacity 4GiB --listen 127.0.0.1:7003 &
///   surge instance create --servers 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 --capacity 6GiB
///
/// A server restarted on the same devices recovers every fragment and namespace on them.
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ServerArgs {
    /// A fast-tier directory to store fragments in (created if missing). Repeat for several
    /// devices; fragments go to the least reserved one.
    #[arg(long = "device", value_name = "DIR", required = true)]
    pub devices: Vec<PathBuf>,

    /// Capacity this server offers to fragments, e.g. 200GiB. Default: the free space of the
    /// devices at start-up.
    #[arg(long, value_name = "SIZE", value_parser = surge_core::sys::size_arg)]
    pub capacity: Option<u64>,

    /// TCP address to listen on (port 0 picks a free port; see --ready-file).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7070")]
    pub listen: String,

    /// Also listen on this Unix socket; local clients use it instead of TCP.
    #[arg(long, value_name = "PATH")]
    pub unix: Option<PathBuf>,

    /// Stable server id (default: kept in the first device, generated on first start).
    #[arg(long)]
    pub id: Option<String>,

    /// Once listening, write {"id", "addrs", "pid", "metrics"} as JSON to this file (for
    /// scripts and tests that start servers on port 0).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,

    /// The address other hosts reach this server on (HOST or HOST:PORT; the listening port when
    /// none is given): what it registers with the manager and gives clients. Needed when
    /// --listen is a wildcard (0.0.0.0 or [::]) and the server registers with a manager.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub advertise: Option<String>,

    /// Register with this manager (host:port) once listening, retrying until it answers.
    #[arg(long, value_name = "HOST:PORT")]
    pub manager: Option<String>,

    /// Pool to register in (with --manager).
    #[arg(long, default_value = "default", requires = "manager")]
    pub pool: String,

    /// The cluster key (shared with the manager; 0600, readable by the service user only):
    /// every connection must present a capability signed with it. Default: $SURGE_KEY_FILE,
    /// else /etc/surge/surge.key.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Room each namespace's metadata store keeps on its device for when the device fills
    /// before the quota (a full device then refuses data, never an acknowledged create); 0
    /// keeps none.
    #[arg(long, value_name = "SIZE", value_parser = surge_core::sys::size_arg, default_value = "16MiB")]
    pub metadata_reserve: u64,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free port; the
    /// ready file then names it as "metrics").
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Most client connections served at once (each is a thread and a file descriptor). Also
    /// bounded by the open-file limit, whose soft value is raised to the hard one at start:
    /// 256 descriptors are kept for files. Beyond it a new connection is refused with a
    /// clear error (ConnectionLimit), after the connection silent longest (no request for 1 s
    /// or more since it connected) has been closed to make room, if there is one.
    #[arg(long, value_name = "N", default_value_t = admission::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: u32,

    /// Most connections served at once from one peer: a TCP client address, or a uid on the
    /// Unix socket. A mount holds about 8 connections to each server.
    #[arg(long, value_name = "N", default_value_t = admission::DEFAULT_MAX_PER_PEER)]
    pub max_connections_per_peer: u32,

    /// Close a connection that sent no request for this long (seconds; 0: never). The client
    /// is told first (IdleClosed) and reconnects on its next request, sending again any
    /// request it sent meanwhile.
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = surge_core::sys::secs_arg)]
    pub idle_timeout: Duration,

    /// Close a connection whose frame (a request's header, message and payload; at most
    /// 16 MiB) does not arrive whole within this long of its first byte, or that does not
    /// take its reply within this long (seconds; 0: no bound).
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = surge_core::sys::secs_arg)]
    pub frame_timeout: Duration,

    /// After a restart, how long a namespace's lock service grants only the locks mounts
    /// held before (they reclaim them when they reconnect); new locks wait meanwhile
    /// (seconds; NFS's grace period). Longer than the mounts take to reconnect.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = surge_core::sys::secs_arg)]
    pub lock_grace: Duration,

    /// How long a mount that holds unlinked files open (removed while open, or made with
    /// O_TMPFILE) may stop waiting for lease recalls before it is taken as gone: then the
    /// next mount of the namespace that waits removes those files' data, which would
    /// otherwise hold the instance's space until it is destroyed (seconds). A mount cut off
    /// from its metadata server for longer loses those files' data; one killed, or whose
    /// node is lost, gives the space back after this long.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = surge_core::sys::secs_arg)]
    pub orphan_grace: Duration,

    /// TLS 1.3 on the TCP listener (docs/SECURITY.md, "On the wire"). auto: with a
    /// certificate (--tls-cert), every peer on another host must speak TLS and loopback peers
    /// may; without one, everything in clear. on: a certificate is required and every TCP
    /// peer must speak TLS. off: clear text only (a private fabric). The Unix socket is
    /// never encrypted: it does not leave the host.
    #[arg(
        long,
        value_name = "auto|on|off",
        env = "SURGE_TLS",
        default_value = "auto"
    )]
    pub tls: surge_proto::tls::Mode,

    /// This server's certificate (PEM, signed by the site CA; `surge cert server`). Default:
    /// server.crt in $SURGE_TLS_DIR, else /etc/surge/tls.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The certificate's private key (PEM). Default: server.key beside the certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl ServerArgs {
    /// The TLS the flags ask for: `None` when the TCP listener speaks clear text only.
    pub fn server_tls(&self) -> anyhow::Result<Option<Arc<surge_proto::tls::ServerTls>>> {
        let (cert, key) = (self.tls_cert.as_deref(), self.tls_key.as_deref());
        surge_proto::tls::server_from_flags(self.tls, cert, key, |why| {
            info!("the data protocol: {why}")
        })
        .map_err(anyhow::Error::msg)
    }

    /// The connection bounds the flags ask for.
    pub fn conn_limits(&self) -> ConnLimits {
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        ConnLimits {
            max_connections: self.max_connections,
            max_per_peer: self.max_connections_per_peer,
            idle_timeout: nonzero(self.idle_timeout),
            frame_timeout: nonzero(self.frame_timeout),
        }
    }
}

#[derive(Serialize)]
struct Ready {
    id: String,
    addrs: Vec<String>,
    pid: u32,
    /// Where `GET /metrics` is served, with --metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<String>,
}

/// A server running in this process (its listener threads run until the process exits).
pub struct Running {
    pub registry: Arc<Registry>,
    /// Listening addresses, Unix socket first when there is one.
    pub addrs: Vec<String>,
}

impl Running {
    /// Advertises `advertise` (see [`surge_core::addr::advertised`]) instead of the TCP
    /// address the listener is bound to, to the manager and to clients.
    pub fn advertise(&mut self, advertise: &str) -> anyhow::Result<()> {
        let adv = surge_core::addr::advertised(advertise, self.tcp_addr());
        if let Some(why) = surge_core::addr::unroutable(&adv) {
            anyhow::bail!("--advertise {advertise}: {why}");
        }
        for a in self.addrs.iter_mut().filter(|a| !a.starts_with("unix:")) {
            *a = adv.clone();
        }
        *self.registry.addrs.write() = self.addrs.clone();
        info!("advertising {adv}");
        Ok(())
    }

    /// The TCP address (`host:port`).
    pub fn tcp_addr(&self) -> &str {
        self.addrs
            .iter()
            .find(|a| !a.starts_with("unix:"))
            .map(String::as_str)
            .unwrap_or_default()
    }
}

/// Opens the devices, recovers what they hold and starts listening, with the default
/// connection bounds. Used by tests and tools that need a real server inside their own
/// process.
pub fn start(
    devices: Vec<PathBuf>,
    capacity: Option<u64>,
    listen: &str,
    unix: Option<&std::path::Path>,
    id: Option<String>,
    key: surge_auth::Key,
) -> anyhow::Result<Running> {
    start_with(
        devices,
        capacity,
        Listen {
            tcp: listen,
            unix,
            tls: None,
        },
        id,
        key,
        ConnLimits::default(),
    )
}

/// Where a server listens: a TCP address (in TLS with `tls`, see `conn::serve_socket`) and
/// optionally a Unix socket (never encrypted: it does not leave the host).
pub struct Listen<'a> {
    pub tcp: &'a str,
    pub unix: Option<&'a std::path::Path>,
    pub tls: Option<Arc<surge_proto::tls::ServerTls>>,
}

/// [`start`] with connection bounds `limits` (lowered to what the open-file limit allows,
/// whose soft value is first raised to the hard one). Used by `surge server`.
pub fn start_with(
    devices: Vec<PathBuf>,
    capacity: Option<u64>,
    listen: Listen<'_>,
    id: Option<String>,
    key: surge_auth::Key,
    limits: ConnLimits,
) -> anyhow::Result<Running> {
    let Listen {
        tcp: listen,
        unix,
        tls,
    } = listen;
    let nofile = surge_core::sys::raise_nofile_limit().context("cannot read RLIMIT_NOFILE")?;
    let admission = Admission::new(limits.within_nofile(nofile)?);
    let capacity = match capacity {
        Some(c) => c,
        None => {
            let mut total = 0;
            for d in &devices {
                std::fs::create_dir_all(d)
                    .with_context(|| format!("cannot create {}", d.display()))?;
                total += surge_core::sys::free_space(d)
                    .with_context(|| format!("statvfs {}", d.display()))?;
            }
            total
        }
    };
    let reg = Arc::new(Registry::open(devices.clone(), capacity, id, key)?);
    *reg.limits.write() = admission.limits().wire();
    let tcp = std::net::TcpListener::bind(listen)
        .with_context(|| format!("cannot listen on {listen}"))?;
    let mut addrs = vec![tcp.local_addr()?.to_string()];
    let tls_mode = tls.as_ref().map_or(surge_proto::tls::Mode::Off, |t| t.mode);
    {
        let (reg, admission) = (reg.clone(), admission.clone());
        std::thread::Builder::new()
            .name("accept-tcp".into())
            .spawn(move || conn::accept_tcp(reg, admission, tls, tcp))?;
    }
    if let Some(path) = unix {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        // A socket left by a killed server would make bind fail.
        let _ = std::fs::remove_file(path);
        let ul = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        addrs.insert(0, format!("unix:{}", path.display()));
        let reg = reg.clone();
        std::thread::Builder::new()
            .name("accept-unix".into())
            .spawn(move || conn::accept_unix(reg, admission, ul))?;
    }
    *reg.addrs.write() = addrs.clone();
    let l = reg.limits.read().clone();
    info!(
        "surge server {} listening on {} ({} capacity, devices {:?}); TLS {}; at most {} \
         connections, {} per peer, idle timeout {} ms, frame timeout {} ms (0: none)",
        reg.id,
        addrs.join(", "),
        surge_core::format_bytes(capacity),
        devices,
        match tls_mode {
            surge_proto::tls::Mode::Off => "off (clear text)",
            surge_proto::tls::Mode::Auto => "for peers on other hosts",
            surge_proto::tls::Mode::On => "on every TCP connection",
        },
        l.max_connections,
        l.max_connections_per_peer,
        l.idle_timeout_ms,
        l.frame_timeout_ms
    );
    Ok(Running {
        registry: reg,
        addrs,
    })
}

/// Runs `surge server` until SIGINT/SIGTERM. `on_ready` is called once the server listens (the
/// binary uses it to register with a manager, which this crate does not know).
pub fn run(
    args: ServerArgs,
    on_ready: impl FnOnce(&ServerArgs, &Running),
) -> anyhow::Result<ExitCode> {
    let sigs = surge_core::sys::block_signals(&[libc::SIGINT, libc::SIGTERM]);
    crate::reserve::set_size(args.metadata_reserve);
    crate::locks::set_grace(args.lock_grace);
    crate::mds::set_orphan_grace(args.orphan_grace);
    // Everything this server makes (objects, metadata stores) is its user's alone.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o077) };
    let key_file = args
        .key_file
        .clone()
        .unwrap_or_else(surge_auth::Key::default_path);
    let key = surge_auth::Key::load(&key_file)?;
    let tls = args.server_tls()?;
    let mut running = start_with(
        args.devices.clone(),
        args.capacity,
        Listen {
            tcp: &args.listen,
            unix: args.unix.as_deref(),
            tls,
        },
        args.id.clone(),
        key,
        args.conn_limits(),
    )?;
    match &args.advertise {
        Some(a) => running.advertise(a)?,
        None if args.manager.is_some() => {
            if let Some(why) = surge_core::addr::unroutable(running.tcp_addr()) {
                anyhow::bail!("cannot register with the manager: {why}");
            }
        }
        None => {}
    }
    let metrics = match &args.metrics {
        Some(m) => Some(crate::metrics::serve(running.registry.clone(), m)?.to_string()),
        None => None,
    };
    if let Some(f) = &args.ready_file {
        write_json_atomic(
            f,
            &Ready {
                id: running.registry.id.clone(),
                addrs: running.addrs.clone(),
                pid: std::process::id(),
                metrics,
            },
        )
        .with_context(|| format!("cannot write {}", f.display()))?;
    }
    on_ready(&args, &running);

    let sig = surge_core::sys::wait_signal(&sigs);
    info!("signal {sig}: shutting down");
    running.registry.shutdown();
    if let Some(path) = &args.unix {
        let _ = std::fs::remove_file(path);
    }
    Ok(ExitCode::SUCCESS)
}
