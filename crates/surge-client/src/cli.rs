//! `surge mount` and `surge instance`: bring an instance up by hand over running servers and
//! mount it. (The manager does the same through the same functions.)

use crate::admin::{self, InstancePlan};
use crate::fuse::CacheTimes;
use crate::instance::{ClientOptions, InstanceClient};
use crate::mount::{self, MountOptions};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use surge_core::{format_bytes, InstanceId, NamespaceId};
use surge_proto::InstanceDescriptor;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Where an instance's descriptor, and the capability to use it, come from.
#[derive(clap::Args, Debug, Clone)]
pub struct InstanceSource {
    /// The manager (host:port; default $SURGE_MANAGER): it gives the instance's descriptor and
    /// a capability for its servers to whoever may use it (checked with MUNGE). Without a
    /// manager the capability is made with the cluster key, which only root and the service
    /// user can read.
    #[arg(long, value_name = "HOST:PORT", env = "SURGE_MANAGER")]
    pub manager: Option<String>,

    /// Any server holding a piece of the instance (host:port or unix:/path), when there is no
    /// manager.
    #[arg(long, value_name = "ADDR")]
    pub server: Option<String>,

    /// The instance id.
    #[arg(long, value_name = "ID")]
    pub instance: Option<u64>,

    /// A persistent instance by name (with a manager).
    #[arg(long, value_name = "NAME", conflicts_with = "instance")]
    pub persistent: Option<String>,

    /// Read the instance descriptor from this JSON file instead (as printed by
    /// `surge instance create --json`).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["server", "instance", "manager"])]
    pub descriptor: Option<PathBuf>,

    /// The cluster key, to make a capability without a manager (default $SURGE_KEY_FILE, else
    /// /etc/surge/surge.key).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

impl InstanceSource {
    /// The descriptor and a capability for namespace `ns` (or every namespace).
    pub async fn resolve(
        &self,
        ns: Option<u32>,
    ) -> anyhow::Result<(InstanceDescriptor, surge_auth::Token)> {
        if let Some(f) = &self.descriptor {
            let text = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
            let desc: InstanceDescriptor = serde_json::from_slice(&text)
                .with_context(|| format!("{} is not an instance descriptor", f.display()))?;
            let token = crate::auth::for_instance(self.key_file.as_deref(), desc.instance.0, ns)?;
            return Ok((desc, token));
        }
        if let (Some(m), None) = (&self.manager, &self.server) {
            let persistent = self.persistent.clone().unwrap_or_default();
            anyhow::ensure!(
                self.instance.is_some() || !persistent.is_empty(),
                "give --instance ID or --persistent NAME"
            );
            return crate::auth::from_manager(m, self.instance.unwrap_or(0), &persistent, ns)
                .await
                .with_context(|| format!("manager {m}"));
        }
        match (&self.server, self.instance) {
            (Some(s), Some(i)) => {
                let token = crate::auth::for_instance(self.key_file.as_deref(), i, ns)?;
                let desc = admin::describe(s, InstanceId(i), &token)
                    .await
                    .with_context(|| format!("cannot describe instance {i} from {s}"))?;
                Ok((desc, token))
            }
            _ => anyhow::bail!(
                "give --manager (or SURGE_MANAGER) and --instance, --server and --instance, or \
                 --descriptor"
            ),
        }
    }
}

/// Mount an instance's namespace as a POSIX directory (FUSE).
///
/// Runs in the foreground until the directory is unmounted (`umount DIR` or
/// `fusermount3 -u DIR`) or the process gets SIGINT/SIGTERM, which unmounts it.
///
/// Example:
///   surge mount --server 127.0.0.1:7001 --instance 42 /mnt/bb
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct MountArgs {
    #[command(flatten)]
    pub source: InstanceSource,

    /// Namespace to mount: 0 for a striped instance; the compute node's index for a private one.
    #[arg(long, default_value_t = 0)]
    pub ns: u32,

    /// Directory to mount on (must exist).
    pub mountpoint: PathBuf,

    /// How long the kernel may cache attributes (seconds). 0 asks the metadata server on every
    /// stat; longer is faster but a stat of a file another node changed shows it later (an
    /// open always sees the latest close).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = surge_core::sys::secs_arg)]
    pub attr_ttl: Duration,

    /// How long the kernel may cache names (seconds). A cached name whose file was removed or
    /// replaced on another node is looked up again when used. Also how long this mount keeps
    /// the names of a directory it made after its last change there, to answer lookups of
    /// absent names and create and unlink files there without waiting for the metadata
    /// server (in a shared namespace while it holds the directory's lease, which the server
    /// recalls before another node looks there). 0 turns both off.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = surge_core::sys::secs_arg)]
    pub entry_ttl: Duration,

    /// Threads reading requests from the kernel.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,

    /// Never use kernel FUSE passthrough (by default it is used on Linux >= 6.9 for files of
    /// one stripe on a fragment whose server runs on this host: as root, or through the
    /// passthrough helper `surge passthrough-helper` when one runs on this host).
    #[arg(long)]
    pub no_passthrough: bool,

    /// The layout of files made through this mount where no directory default says
    /// otherwise (`surge layout set DIR` sets those). `auto`: one stripe on a fragment of this
    /// host when the kernel can read and write it directly (passthrough), else the instance's
    /// rule (every fragment, DataWarp's striping). Or a layout, e.g. `stripe_count=all` (always
    /// stripe over every fragment), `stripe_count=1`, `stripe_size=1MiB stripe_count=4`.
    #[arg(long, value_name = "LAYOUT", default_value = "auto", value_parser = layout_arg)]
    pub layout: LayoutArg,

    /// Hand metadata requests to the async runtime like data requests, instead of answering
    /// them on the FUSE threads (slower: one more thread wake-up each way; for comparison).
    #[arg(long)]
    pub async_metadata: bool,

    /// How long a request waits for a server (seconds): past it the application's call fails
    /// with EIO and the mount logs why (a stopped, hung or unreachable server). Changes the
    /// mount made behind the application are still sent once the server answers again.
    /// 0: no deadline (as --hard).
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = surge_core::sys::secs_arg)]
    pub deadline: Duration,

    /// Wait for servers for ever, like an NFS "hard" mount: an application's call blocks
    /// until the server answers (instead of failing after --deadline).
    #[arg(long)]
    pub hard: bool,

    /// The kernel's read-ahead window for sequential reads through this mount (root only;
    /// a FUSE mount gets 128 KiB otherwise). Reads of striped files and of other hosts'
    /// stripes go through this process: a larger window keeps more of them in flight.
    /// 0: the kernel's default.
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = read_ahead_arg)]
    pub read_ahead: u64,

    /// How the kernel hands requests to this mount: `dev-fuse` (the default) or `io-uring`
    /// (FUSE over io_uring, one queue per CPU, where the kernel offers it: Linux >= 6.14 with
    /// /sys/module/fuse/parameters/enable_uring set to Y; /dev/fuse otherwise). io_uring is
    /// opt-in until a soft mount's deadline holds on it (a lookup answered ENOENT instead of
    /// EIO while a server was stopped, bounds.rs). The mount's log line says which it got.
    #[arg(long, value_name = "TRANSPORT", env = "SURGE_FUSE_TRANSPORT", default_value = "dev-fuse", value_parser = mount::parse_transport)]
    pub fuse_transport: fuser::TransportChoice,

    /// Kernel mount flags, comma-separated as mount(8) takes them: ro, rw, dev, nodev, suid,
    /// nosuid, exec, noexec, sync, async, dirsync, and the access-time rule: relatime (the
    /// default, as Linux mounts: the first read after a change moves a file's atime), noatime
    /// (never: no round trip for it) or strictatime (every open for reading); listings move
    /// directories' atimes by the same rule unless nodiratime is given. The mount is
    /// `nosuid,nodev` unless told otherwise (`suid` and `dev` only for root).
    #[arg(short = 'o', long, value_name = "FLAGS", value_parser = flags_arg)]
    pub options: Option<FlagsArg>,

    /// The source the mount table shows (`/proc/mounts`, `findmnt`, `df`); default
    /// `surge:INSTANCE/NS`. `mount.fuse.surge` gives the name mount(8) was given.
    #[arg(long, value_name = "NAME")]
    pub fsname: Option<String>,

    /// Once mounted, write {"mountpoint", "pid"} as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,

    /// Write the requests this mount sent to its servers, per operation, as JSON to this file
    /// ({"dumps": N, "requests": {"Lookup": n, ...}, "fuse": {...}, "failures": {"lookup":
    /// {"ENOENT": n}, ...}}) on SIGUSR1 and at unmount: what a cache saves, counted, and the
    /// operations answered with an error.
    #[arg(long, value_name = "FILE")]
    pub stats_file: Option<PathBuf>,
}

/// Writes the mount's request counts to `path` (the `dumps`-th time).
fn write_stats(path: &std::path::Path, mounted: &MountedView, dumps: u64) {
    let text = serde_json::json!({
        "dumps": dumps,
        "requests": mounted.0.counts().snapshot(),
        "fuse": mount::fuse_stats_json(&mounted.1, &mounted.2),
        "failures": mounted.3.failures().snapshot(),
    });
    let tmp = path.with_extension("tmp");
    let r = std::fs::write(&tmp, text.to_string()).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        tracing::warn!("cannot write {}: {e}", path.display());
    }
}

/// What `--stats-file` reports of a mount, kept past its unmount.
type MountedView = (
    std::sync::Arc<InstanceClient>,
    fuser::TransportInfo,
    std::sync::Arc<fuser::TransportStats>,
    std::sync::Arc<crate::fs::Fs>,
);

/// `--options`: kernel mount flags, and the access-time rule if one is named.
#[derive(Clone, Debug)]
pub struct FlagsArg(
    pub Vec<fuser::MountOption>,
    pub Option<crate::fs::Atime>,
    pub Option<bool>,
);

fn flags_arg(s: &str) -> Result<FlagsArg, String> {
    Ok(FlagsArg(
        mount::parse_flags(s)?,
        mount::parse_atime(s),
        mount::parse_diratime(s),
    ))
}

/// `--layout`: `auto` or a layout.
#[derive(Clone, Copy, Debug)]
pub struct LayoutArg(pub Option<surge_core::FileLayout>);

fn layout_arg(s: &str) -> Result<LayoutArg, String> {
    if s == "auto" {
        return Ok(LayoutArg(None));
    }
    surge_core::FileLayout::parse(s)
        .map(|l| LayoutArg(Some(l)))
        .map_err(|e| e.to_string())
}

pub fn run_mount(args: MountArgs) -> anyhow::Result<ExitCode> {
    let sigs = surge_core::sys::block_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGUSR1]);
    let rt = runtime()?;
    let (desc, token) = rt.block_on(args.source.resolve(Some(args.ns)))?;
    let deadline = (!args.hard && !args.deadline.is_zero()).then_some(args.deadline);
    let client = InstanceClient::with_options(
        desc,
        NamespaceId(args.ns),
        token,
        ClientOptions {
            deadline,
            ..ClientOptions::default()
        }
        .resolving_through(args.source.manager.as_deref()),
    )?;
    if let Some(l) = args.layout.0 {
        l.check(client.fragments())
            .with_context(|| format!("--layout {l}"))?;
    }
    // Fail early with a clear message if the metadata server is not reachable.
    rt.block_on(client.getattr(1))
        .with_context(|| format!("cannot reach the metadata server of namespace {}", args.ns))?;
    let opts = MountOptions {
        ttl: CacheTimes {
            entry: args.entry_ttl,
            attr: args.attr_ttl,
        },
        threads: args.threads,
        passthrough: !args.no_passthrough && mount::is_root(),
        lend: !args.no_passthrough && !mount::is_root(),
        inline_metadata: !args.async_metadata,
        default_layout: args.layout.0,
        read_ahead: (args.read_ahead > 0).then_some(args.read_ahead),
        transport: args.fuse_transport,
        fsname: args.fsname.clone(),
        flags: args.options.clone().map(|f| f.0).unwrap_or_default(),
        atime: args
            .options
            .as_ref()
            .and_then(|f| f.1)
            .unwrap_or(crate::fs::Atime::Relative),
        diratime: args.options.as_ref().and_then(|f| f.2).unwrap_or(true),
        ..MountOptions::default()
    };
    let mut mounted = mount::mount(client, rt.handle().clone(), &args.mountpoint, &opts)?;
    if let Some(f) = &args.ready_file {
        let text = serde_json::json!({
            "mountpoint": args.mountpoint.display().to_string(),
            "pid": std::process::id(),
        });
        std::fs::write(f, text.to_string())
            .with_context(|| format!("cannot write {}", f.display()))?;
    }
    // Wait for a signal or for someone else to unmount.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        if tx.send(surge_core::sys::wait_signal(&sigs)).is_err() {
            break;
        }
    });
    let view: MountedView = (
        mounted.client.clone(),
        mounted.transport.clone(),
        mounted.fuse_stats.clone(),
        mounted.fs.clone(),
    );
    let mut dumps = 0;
    loop {
        if let Ok(sig) = rx.recv_timeout(Duration::from_millis(200)) {
            if sig == libc::SIGUSR1 {
                if let Some(f) = &args.stats_file {
                    dumps += 1;
                    write_stats(f, &view, dumps);
                }
                continue;
            }
            tracing::info!("signal {sig}: unmounting {}", args.mountpoint.display());
            // Bounded: a busy mount is detached, a session held by a copy of the mount in
            // another namespace has its connection aborted (each after 3 s), said here.
            for note in mounted.unmount_within(Duration::from_secs(3))? {
                tracing::warn!("{note}");
            }
            if let Some(f) = &args.stats_file {
                write_stats(f, &view, dumps + 1);
            }
            break;
        }
        if mounted.is_finished() {
            mounted.join()?;
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Create, show or destroy instances on running servers by hand.
#[derive(clap::Args, Debug)]
pub struct InstanceArgs {
    #[command(subcommand)]
    pub command: InstanceCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum InstanceCommand {
    /// Create an instance: one fragment per server (capacity split evenly), metadata on the
    /// first server (private mode: namespace i on server i mod n).
    ///
    /// Example:
    ///   surge instance create --servers 127.0.0.1:7001,127.0.0.1:7002 --capacity 2GiB
    #[command(verbatim_doc_comment)]
    Create {
        /// Servers to place fragments on, comma-separated (host:port or unix:/path).
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<String>,
        /// Total capacity, e.g. 10GiB (split evenly over the servers, rounded up).
        #[arg(long, value_parser = surge_core::sys::size_arg)]
        capacity: u64,
        /// Stripe size.
        #[arg(long, value_parser = surge_core::sys::size_arg, default_value = "8MiB")]
        stripe_size: u64,
        /// `striped` (one namespace shared by all nodes) or `private` (one per node).
        #[arg(long, default_value = "striped", value_parser = ["striped", "private"])]
        access_mode: String,
        /// Compute nodes, i.e. namespaces in private mode.
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Instance id (default: random).
        #[arg(long)]
        id: Option<u64>,
        /// A name for the instance.
        #[arg(long)]
        name: Option<String>,
        /// Owner of the root directory as UID:GID (default: the caller).
        #[arg(long, value_name = "UID:GID")]
        owner: Option<String>,
        /// Print the descriptor as JSON (usable with `surge mount --descriptor`).
        #[arg(long)]
        json: bool,
        /// A write-behind cache of this PFS directory (type=cache): every change is journaled
        /// for `surge stage drain`.
        #[arg(long, value_name = "DIR")]
        cache_pfs: Option<PathBuf>,
        /// With --cache-pfs: an fsync returns once the file is on the PFS (the drain copied
        /// it), not once it is on the fast tier.
        #[arg(long, requires = "cache_pfs")]
        cache_fsync_pfs: bool,
        /// With --cache-pfs: the dirty-data high-water mark at which writers wait for the
        /// drain: a percentage of the capacity (80%), a size (400GiB) or off (the default).
        #[arg(long, requires = "cache_pfs", value_name = "MARK", value_parser = surge_core::directives::parse_dirty_high)]
        cache_dirty_high: Option<surge_core::directives::DirtyHigh>,
        /// With --cache-pfs: files of one stripe on a fragment of the mount's host are read
        /// and written by kernel passthrough when the tier has room at their open (they cannot
        /// fall back to the PFS mid-write: the tier may go past its capacity until they close).
        #[arg(long, requires = "cache_pfs")]
        cache_passthrough: bool,
        /// The cluster key (default $SURGE_KEY_FILE, else /etc/surge/surge.key): creating
        /// instances on servers by hand is for administrators (users ask the manager).
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
    },
    /// Show an instance's descriptor.
    Show {
        #[command(flatten)]
        source: InstanceSource,
        /// Print the descriptor as JSON instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Destroy an instance and everything in it.
    Destroy {
        #[command(flatten)]
        source: InstanceSource,
    },
}

fn print_descriptor(d: &InstanceDescriptor) {
    println!(
        "instance {} ({}): {} {}, stripe {}, {} fragments",
        d.instance,
        d.name,
        format_bytes(d.capacity),
        d.access_mode,
        format_bytes(d.stripe_size),
        d.fragments.len()
    );
    for f in &d.fragments {
        println!(
            "  fragment {:>3}  {:>10}  on {} ({})",
            f.index,
            format_bytes(f.capacity),
            f.server.id,
            f.server.addrs.join(", ")
        );
    }
    for n in &d.namespaces {
        println!("  namespace {:>2}  metadata on {}", n.ns.0, n.server.id);
    }
}

fn parse_owner(s: &str) -> anyhow::Result<(u32, u32)> {
    let (u, g) = s
        .split_once(':')
        .with_context(|| format!("--owner '{s}': expected UID:GID"))?;
    Ok((
        u.parse()
            .with_context(|| format!("--owner '{s}': bad uid"))?,
        g.parse()
            .with_context(|| format!("--owner '{s}': bad gid"))?,
    ))
}

/// Show what servers hold: fragments, namespaces, capacity and use (asks the servers directly,
/// with an administrator's capability made with the cluster key).
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Server addresses (host:port or unix:/path).
    #[arg(required = true)]
    pub servers: Vec<String>,
    /// Print each server's status as JSON.
    #[arg(long)]
    pub json: bool,
    /// The cluster key (default $SURGE_KEY_FILE, else /etc/surge/surge.key).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

pub fn run_status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let StatusArgs {
        servers,
        json,
        key_file,
    } = args;
    let token = crate::auth::admin(key_file.as_deref())?;
    runtime()?.block_on(async move {
        let mut all = Vec::new();
        for s in &servers {
            all.push(
                admin::status(s, &token)
                    .await
                    .with_context(|| format!("server {s}"))?,
            );
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&all)?);
        } else {
            for st in &all {
                println!(
                    "server {} ({}): {} of {} reserved, {} used",
                    st.id,
                    st.addrs.join(", "),
                    format_bytes(st.reserved),
                    format_bytes(st.capacity),
                    format_bytes(st.used)
                );
                for f in &st.fragments {
                    println!(
                        "  instance {:>12} fragment {:>3}  {:>10} used of {:>10}  {}",
                        f.instance,
                        f.index,
                        format_bytes(f.used),
                        format_bytes(f.capacity),
                        f.device
                    );
                }
                for (i, n) in &st.namespaces {
                    println!("  instance {i:>12} namespace {:>2}  (metadata server)", n.0);
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn run_instance(args: InstanceArgs) -> anyhow::Result<ExitCode> {
    run_instance_command(args.command)
}

pub fn run_instance_command(command: InstanceCommand) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    rt.block_on(async move {
        match command {
            InstanceCommand::Create {
                servers,
                capacity,
                stripe_size,
                access_mode,
                nodes,
                id,
                name,
                owner,
                json,
                cache_pfs,
                cache_fsync_pfs,
                cache_dirty_high,
                cache_passthrough,
                key_file,
            } => {
                let token = crate::auth::admin(key_file.as_deref())?;
                anyhow::ensure!(capacity > 0, "--capacity must be positive");
                anyhow::ensure!(stripe_size >= 4096, "--stripe-size must be at least 4KiB");
                anyhow::ensure!(nodes >= 1, "--nodes must be at least 1");
                let mut refs = Vec::new();
                for s in &servers {
                    refs.push(
                        admin::server_ref(s, &token)
                            .await
                            .with_context(|| format!("server {s}"))?,
                    );
                }
                let per = capacity.div_ceil(refs.len() as u64);
                let namespaces = if access_mode == "private" { nodes } else { 1 };
                let (uid, gid) = match owner {
                    Some(o) => parse_owner(&o)?,
                    // SAFETY: getuid/getgid have no preconditions.
                    None => unsafe { (libc::getuid(), libc::getgid()) },
                };
                let instance = InstanceId(id.unwrap_or_else(|| {
                    let b: [u8; 6] = surge_core::sys::random_bytes();
                    b.iter().fold(0u64, |a, x| (a << 8) | u64::from(*x)).max(1)
                }));
                let plan = InstancePlan {
                    instance,
                    name: name.unwrap_or_else(|| format!("instance-{instance}")),
                    access_mode,
                    stripe_size,
                    fragments: refs.iter().map(|r| (r.clone(), per)).collect(),
                    namespaces: (0..namespaces)
                        .map(|i| refs[i as usize % refs.len()].clone())
                        .collect(),
                    root_uid: uid,
                    root_gid: gid,
                    root_perm: 0o755,
                    cache_pfs: cache_pfs.map(|p| p.display().to_string()),
                    cache_fsync_pfs,
                    cache_dirty_high,
                    cache_passthrough,
                    generation: surge_auth::token::new_generation(),
                };
                let desc = admin::create_instance(&plan, &token).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&desc)?);
                } else {
                    print_descriptor(&desc);
                }
            }
            InstanceCommand::Show { source, json } => {
                let (desc, _) = source.resolve(None).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&desc)?);
                } else {
                    print_descriptor(&desc);
                }
            }
            InstanceCommand::Destroy { source } => {
                // With a manager: it checks that the caller owns the instance (MUNGE), destroys
                // it on the servers and forgets it, so its capacity is free again. Without
                // one (servers run by hand): the cluster key's administrator only.
                if let Some(m) = &source.manager {
                    let mut c = surge_api::connect(m).await?;
                    c.destroy_instance(surge_api::v1::DestroyInstanceRequest {
                        id: source.instance.unwrap_or(0),
                        persistent_name: source.persistent.clone().unwrap_or_default(),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| anyhow::Error::new(surge_api::ManagerStatus(e)))?;
                    println!(
                        "destroyed instance {}",
                        source
                            .persistent
                            .clone()
                            .or(source.instance.map(|i| i.to_string()))
                            .unwrap_or_default()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                let (desc, _) = source.resolve(None).await?;
                let token = crate::auth::admin(source.key_file.as_deref())?;
                admin::destroy_instance(&desc, &token).await?;
                println!("destroyed instance {}", desc.instance);
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Layouts of files and directories on a Surge mount (Lustre's `lfs getstripe` / `lfs
/// setstripe`): how a file's bytes lie over the instance's fragments.
///
/// A file's layout is chosen when it is made and may change only while it is empty; a
/// directory's is the default of the files and directories made in it afterwards. Without
/// one, a mount that can use kernel passthrough makes each new file one stripe on a fragment
/// of its own host (read and written by the kernel at the fast tier's speed); other mounts
/// stripe it over every fragment (DataWarp's default). Stripe over every fragment for large
/// files shared by many nodes, one stripe for many files written by one process each.
///
/// Examples:
///   surge layout get $DW_JOB_STRIPED/ckpt.h5
///   surge layout set $DW_JOB_STRIPED/ckpts --stripe-count all     # shared checkpoints
///   surge layout set $DW_JOB_STRIPED/logs --stripe-count 1        # file per process
///   surge layout set $DW_JOB_STRIPED/out.dat --stripe-size 1MiB --stripe-count 4
///   surge layout unset $DW_JOB_STRIPED/ckpts                      # back to the mount's choice
/// The same through the attribute `user.surge.layout` (getfattr/setfattr, or an
/// application's fsetxattr before its first write):
///   setfattr -n user.surge.layout -v "stripe_count=1" $DW_JOB_STRIPED/logs
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct LayoutArgs {
    #[command(subcommand)]
    pub command: LayoutCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum LayoutCommand {
    /// Print the layout of files (stripe size, count, first fragment) or directories
    /// (their default; "none" when they have none).
    Get {
        /// Files or directories on a Surge mount.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// One JSON object per path ({"path", "kind", "stripe_size", "stripe_count", "start",
        /// "fragments"}; a directory's values are its default, 0 for "the instance's").
        #[arg(long)]
        json: bool,
    },
    /// Set the layout of empty files, or the default of directories.
    Set {
        /// Empty files (made if missing) or directories on a Surge mount.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Bytes per stripe (a multiple of 4 KiB; e.g. 1MiB, 8MiB); the instance's if not given.
        #[arg(long, value_name = "SIZE", value_parser = surge_core::sys::size_arg)]
        stripe_size: Option<u64>,
        /// Fragments the stripes go to: a number, or `all` for every fragment of the instance.
        #[arg(long, value_name = "N|all")]
        stripe_count: Option<String>,
        /// The fragment holding the first stripe (default: chosen per file).
        #[arg(long, value_name = "K")]
        start: Option<u32>,
    },
    /// Remove the default layout of directories (files made there get the mount's choice).
    Unset {
        /// Directories on a Surge mount.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

const LAYOUT_XATTR: &str = "user.surge.layout";

fn xattr_call(path: &std::path::Path, what: &str, rc: isize) -> anyhow::Result<usize> {
    if rc >= 0 {
        return Ok(rc as usize);
    }
    let e = std::io::Error::last_os_error();
    let hint = match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => " (not on a Surge mount?)",
        Some(libc::EBUSY) => " (a file's layout is set before its first write)",
        Some(libc::EINVAL) => {
            " (the mount refused the layout: a stripe count above the instance's fragments, \
             which `surge layout get` of a file shows, or a stripe size that is not a \
             multiple of 4 KiB)"
        }
        _ => "",
    };
    anyhow::bail!("{what} {}: {e}{hint}", path.display())
}

fn cpath(path: &std::path::Path) -> anyhow::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{}: a path with a NUL byte", path.display()))
}

/// `user.surge.layout` of `path`; `None` for a directory without a default.
fn get_layout_text(path: &std::path::Path) -> anyhow::Result<Option<String>> {
    let c = cpath(path)?;
    let mut buf = [0u8; 512];
    // SAFETY: NUL-terminated path and name, a buffer writable for its length.
    let rc = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"user.surge.layout".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODATA) {
        return Ok(None);
    }
    let n = xattr_call(path, "cannot read the layout of", rc)?;
    Ok(Some(String::from_utf8_lossy(&buf[..n]).into_owned()))
}

fn set_layout_text(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let c = cpath(path)?;
    // SAFETY: NUL-terminated path and name, a value readable for its length.
    let rc = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.surge.layout".as_ptr(),
            text.as_ptr().cast(),
            text.len(),
            0,
        )
    };
    xattr_call(path, &format!("cannot set layout '{text}' on"), rc as isize).map(|_| ())
}

pub fn run_layout(args: LayoutArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        LayoutCommand::Get { paths, json } => {
            for p in paths {
                let md = std::fs::metadata(&p)
                    .with_context(|| format!("cannot stat {}", p.display()))?;
                let text = get_layout_text(&p)?;
                let kind = if md.is_dir() { "directory" } else { "file" };
                if json {
                    let l = text
                        .as_deref()
                        .map(surge_core::FileLayout::parse)
                        .transpose()
                        .with_context(|| format!("{}: {LAYOUT_XATTR}", p.display()))?
                        .unwrap_or_default();
                    let fragments = text.as_deref().and_then(|t| {
                        t.split_whitespace()
                            .find_map(|kv| kv.strip_prefix("fragments="))
                            .and_then(|v| v.parse::<u32>().ok())
                    });
                    let count = match l.stripe_count {
                        surge_core::layout::STRIPE_ALL => serde_json::json!("all"),
                        n => serde_json::json!(n),
                    };
                    let start = (l.start != surge_core::layout::START_ANY && l.stripe_count != 0)
                        .then_some(l.start);
                    println!(
                        "{}",
                        serde_json::json!({
                            "path": p.display().to_string(),
                            "kind": kind,
                            "stripe_size": l.stripe_size,
                            "stripe_count": count,
                            "start": start,
                            "fragments": fragments,
                            "default": md.is_dir() && text.is_some(),
                        })
                    );
                } else {
                    let shown = match (&text, md.is_dir()) {
                        (Some(t), _) => t.clone(),
                        (None, true) => "none (files made here get the mount's choice)".to_string(),
                        (None, false) => "none".to_string(),
                    };
                    println!("{}: {kind} {shown}", p.display());
                }
            }
        }
        LayoutCommand::Set {
            paths,
            stripe_size,
            stripe_count,
            start,
        } => {
            let mut parts = Vec::new();
            if let Some(s) = stripe_size {
                parts.push(format!("stripe_size={s}"));
            }
            if let Some(c) = &stripe_count {
                parts.push(format!("stripe_count={c}"));
            }
            if let Some(s) = start {
                parts.push(format!("start={s}"));
            }
            anyhow::ensure!(
                !parts.is_empty(),
                "give --stripe-size, --stripe-count or --start (see surge layout set --help)"
            );
            let text = parts.join(" ");
            // Checked here, so a mistake is named before any file is touched.
            surge_core::FileLayout::parse(&text)?;
            for p in paths {
                if !p.exists() {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&p)
                        .with_context(|| format!("cannot make {}", p.display()))?;
                }
                set_layout_text(&p, &text)?;
            }
        }
        LayoutCommand::Unset { paths } => {
            for p in paths {
                let c = cpath(&p)?;
                // SAFETY: NUL-terminated path and name.
                let rc = unsafe { libc::removexattr(c.as_ptr(), c"user.surge.layout".as_ptr()) };
                xattr_call(&p, "cannot remove the default layout of", rc as isize)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_ahead_arg(s: &str) -> Result<u64, String> {
    let v = surge_core::parse_size(s).map_err(|e| format!("'{s}': {e}"))?;
    if v > 1 << 30 {
        return Err(format!("'{s}': at most 1GiB"));
    }
    Ok(v)
}
