//! Calibrated peaks for the manager (issue 18 item 1): `surge pool calibrate` measures each
//! server of a pool through the data path (an instance of one fragment placed on it, mounted
//! here with FUSE, measured by `surge bench calibrate`) and then 2, 4, ... and all of them at
//! once (one fragment on each: the pool's curve), and registers the results with the manager,
//! which sizes `#SURGE jobdw` performance targets from them. `--peaks-file` registers a file measured
//! elsewhere instead.
//!
//! The embedded default (`surge run` with no manager) keeps its peaks in its state directory
//! (`embedded-peaks.json`, per fast-tier directory and server count) and registers them when it
//! starts; it measures them only the first time a job asks for performance targets, and then
//! only server 0 (every server shares the same directory on the same host) and the pool's
//! curve.

use crate::embedded::EmbeddedOptions;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use surge_api::v1 as api;
use surge_client::mount::{self, MountOptions};
use surge_client::InstanceClient;
use surge_core::peaks::Peaks;
use surge_core::NamespaceId;
use surge_manager::cli::{connect, status_err, CalibrateArgs};

/// How hard `surge bench calibrate` works on each instance.
#[derive(Clone, Debug)]
pub struct Spec {
    pub deadline: f64,
    pub max_procs: Option<u32>,
    /// At most this much data in the bandwidth sweep (also at most half the instance).
    pub bw_aggregate: u64,
    /// At most this much in the IOPS sweep (also at most a quarter of the instance).
    pub iops_aggregate: u64,
    pub md_files: u64,
}

impl Spec {
    pub fn from_args(a: &CalibrateArgs) -> Spec {
        Spec {
            deadline: a.deadline,
            max_procs: a.max_procs,
            bw_aggregate: 2 << 30,
            iops_aggregate: 512 << 20,
            md_files: 32768,
        }
    }

    /// The embedded default's first measurement: seconds, not minutes (a job waits for it).
    pub fn embedded() -> Spec {
        Spec {
            deadline: 0.5,
            max_procs: Some(4),
            bw_aggregate: 512 << 20,
            iops_aggregate: 64 << 20,
            md_files: 8192,
        }
    }
}

/// `surge bench calibrate` of an instance of `fragments` fragments in `pool`, on `server`
/// only when given (else one per server), mounted under `mount_dir`. The instance is destroyed
/// afterwards, whatever happened.
#[allow(clippy::too_many_arguments)]
pub async fn measure(
    c: &mut surge_api::Client,
    rt: &tokio::runtime::Handle,
    pool: &str,
    server: Option<&str>,
    fragments: u64,
    granularity: u64,
    spec: &Spec,
    mount_dir: &Path,
) -> anyhow::Result<Peaks> {
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let capacity = fragments.max(1).saturating_mul(granularity);
    let what = match server {
        Some(s) => format!("server {s}"),
        None => format!("{fragments} server(s) of pool '{pool}' at once"),
    };
    let inst = c
        .create_instance(api::CreateInstanceRequest {
            capacity,
            access_mode: "striped".into(),
            pool: pool.into(),
            nodes: 1,
            owner_uid: uid,
            owner_gid: gid,
            server: server.unwrap_or_default().into(),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("cannot allocate an instance on {what}: {}", e.message()))?
        .into_inner();
    let r = measure_instance(c, rt, &inst, spec, mount_dir).await;
    if let Err(e) = c
        .destroy_instance(api::DestroyInstanceRequest {
            id: inst.id,
            hurry: true,
            ..Default::default()
        })
        .await
    {
        tracing::warn!(
            "cannot destroy calibration instance {}: {}",
            inst.id,
            e.message()
        );
    }
    r.with_context(|| format!("calibrating {what}"))
}

async fn measure_instance(
    c: &mut surge_api::Client,
    rt: &tokio::runtime::Handle,
    inst: &api::Instance,
    spec: &Spec,
    mount_dir: &Path,
) -> anyhow::Result<Peaks> {
    let cap = c
        .get_capability(api::GetCapabilityRequest {
            instance: inst.id,
            all_namespaces: true,
            ..Default::default()
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let desc: surge_proto::InstanceDescriptor = serde_json::from_str(&cap.descriptor_json)
        .with_context(|| format!("instance {}: bad descriptor from the manager", inst.id))?;
    let token = surge_auth::Token::from_text(&cap.token)?;
    let dir = mount_dir.join(format!("instance-{}", inst.id));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let client = InstanceClient::new(desc, NamespaceId(0), token)?;
    let m = mount::mount(client, rt.clone(), &dir, &MountOptions::default())?;
    let surge = std::env::current_exe().context("cannot find the surge executable")?;
    // Half the instance at most for the bandwidth sweep, in whole 8 MiB transfers, and no
    // more processes than it has transfers.
    const T: u64 = 8 << 20;
    let bw = (spec.bw_aggregate.min(inst.capacity / 2) / T).max(1) * T;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let max_procs = spec
        .max_procs
        .unwrap_or((4 * cpus).min(64))
        .min((bw / T) as u32)
        .max(1);
    let mut cmd = std::process::Command::new(surge);
    cmd.args(["bench", "calibrate"])
        .arg(&dir)
        .arg("--json")
        .args(["--deadline", &spec.deadline.to_string()])
        .args(["--max-procs", &max_procs.to_string()])
        .args(["--bw-aggregate", &bw.to_string()])
        .args([
            "--iops-aggregate",
            &spec
                .iops_aggregate
                .min(inst.capacity / 4)
                .max(1 << 20)
                .to_string(),
        ])
        // `surge bench md` counts a 4 KiB block per (empty) file against the free space.
        .args([
            "--md-files",
            &spec
                .md_files
                .min(inst.capacity / 2 / 4096)
                .max(u64::from(max_procs))
                .to_string(),
        ]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .context("the calibration thread failed")?
        .context("cannot run surge bench calibrate");
    let unmounted = m
        .unmount_within(std::time::Duration::from_secs(3))
        .map(|notes| {
            for n in notes {
                eprintln!("surge: calibration mount: {n}");
            }
        });
    let _ = std::fs::remove_dir(&dir);
    let out = out?;
    unmounted?;
    anyhow::ensure!(
        out.status.success(),
        "surge bench calibrate failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("unreadable surge bench calibrate output")?;
    serde_json::from_value(report["peaks"].clone())
        .context("surge bench calibrate's output has no peaks")
}

/// Registers `peaks` for `server`, or as `pool`'s aggregate over `aggregate` servers.
pub async fn register(
    c: &mut surge_api::Client,
    pool: &str,
    server: Option<&str>,
    aggregate: u32,
    peaks: &Peaks,
    source: &str,
) -> anyhow::Result<api::RegisteredPeaks> {
    Ok(c.register_peaks(api::RegisterPeaksRequest {
        server: server.unwrap_or_default().into(),
        pool: pool.into(),
        peaks_json: serde_json::to_string(peaks)?,
        source: source.into(),
        pool_aggregate: server.is_none(),
        servers: aggregate,
    })
    .await
    .map_err(status_err)?
    .into_inner())
}

/// The pool's granularity and the ids of its servers that are up (the default pool when
/// `pool` is empty, as the manager picks it).
async fn pool_servers(
    c: &mut surge_api::Client,
    pool: &str,
) -> anyhow::Result<(String, u64, Vec<String>)> {
    let pools = c
        .list_pools(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .pools;
    let p = if pool.is_empty() {
        pools.iter().find(|p| p.name == "default").or(pools.first())
    } else {
        pools.iter().find(|p| p.name == pool)
    }
    .with_context(|| format!("pool '{pool}' does not exist"))?;
    let servers = c
        .list_servers(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .servers
        .into_iter()
        .filter(|s| s.pool == p.name && s.state == "up")
        .map(|s| s.id)
        .collect();
    Ok((p.name.clone(), p.granularity, servers))
}

fn host() -> String {
    surge_core::sys::hostname()
}

/// `surge pool calibrate`. `embedded`: the options of the embedded default when no manager
/// was given (its cache is written too).
pub fn run(
    manager: &str,
    a: CalibrateArgs,
    embedded: Option<EmbeddedOptions>,
) -> anyhow::Result<ExitCode> {
    let rt = surge_manager::cli::runtime()?;
    let handle = rt.handle().clone();
    rt.block_on(async move {
        let mut c = connect(manager).await?;
        // The embedded default's servers register in the background as they start.
        let (pool, g, up) = match (&embedded, a.pool.is_empty()) {
            (Some(opts), true) => wait_servers(&mut c, opts.servers).await?,
            _ => pool_servers(&mut c, &a.pool).await?,
        };
        for s in &a.servers {
            anyhow::ensure!(
                up.contains(s),
                "no server '{s}' is up in pool '{pool}' (its servers up: {})",
                up.join(", ")
            );
        }
        let targets: Vec<String> = if a.servers.is_empty() {
            up.clone()
        } else {
            a.servers.clone()
        };
        anyhow::ensure!(!up.is_empty(), "pool '{pool}' has no server up to calibrate");
        let mut done: Vec<api::RegisteredPeaks> = Vec::new();
        let say = |m: String| {
            if !a.json {
                eprintln!("surge pool calibrate: {m}");
            }
        };
        if let Some(f) = &a.peaks_file {
            let p = Peaks::load(f)?;
            let source = format!("file {}", f.display());
            if a.aggregate {
                done.push(register(&mut c, &pool, None, up.len() as u32, &p, &source).await?);
                say(format!(
                    "registered {} as pool {pool}'s aggregate over {} server(s)",
                    f.display(),
                    up.len()
                ));
            } else {
                for s in &targets {
                    done.push(register(&mut c, &pool, Some(s), 1, &p, &source).await?);
                    say(format!("registered {} for server {s}", f.display()));
                }
            }
        } else {
            let mount_dir = a.mount_dir.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("surge-calibrate-{}", std::process::id()))
            });
            std::fs::create_dir_all(&mount_dir)
                .with_context(|| format!("cannot create {}", mount_dir.display()))?;
            let spec = Spec::from_args(&a);
            let mut measured = Vec::new();
            for s in &targets {
                let t = Instant::now();
                say(format!("server {s}: one fragment, measuring ..."));
                let p = measure(&mut c, &handle, &pool, Some(s), 1, g, &spec, &mount_dir).await?;
                let source = format!(
                    "{}{}: one fragment",
                    surge_manager::targets::MEASURED_SOURCE,
                    host()
                );
                done.push(register(&mut c, &pool, Some(s), 1, &p, &source).await?);
                say(format!(
                    "server {s}: {} ({:.0} s)",
                    summary(&p),
                    t.elapsed().as_secs_f64()
                ));
                measured.push((s.clone(), p));
            }
            let mut curve = Vec::new();
            if !a.no_aggregate {
                for n in curve_points(up.len()) {
                    let t = Instant::now();
                    say(format!("{n} server(s) at once, measuring ..."));
                    let p = measure(&mut c, &handle, &pool, None, n, g, &spec, &mount_dir).await?;
                    let source = format!(
                        "surge pool calibrate on {}: one fragment on each of {n} server(s)",
                        host()
                    );
                    done.push(register(&mut c, &pool, None, n as u32, &p, &source).await?);
                    say(format!(
                        "{n} at once: {} ({:.0} s)",
                        summary(&p),
                        t.elapsed().as_secs_f64()
                    ));
                    curve.push((n as u32, p));
                }
            }
            let _ = std::fs::remove_dir(&mount_dir);
            if let Some(opts) = &embedded {
                let mut cache = EmbeddedPeaks::load(&opts.state_dir)
                    .filter(|x| x.matches(opts))
                    .unwrap_or_else(|| EmbeddedPeaks::new(opts));
                cache.servers.retain(|(id, _)| !measured.iter().any(|(m, _)| m == id));
                cache.servers.extend(measured);
                if !curve.is_empty() {
                    cache.curve = curve;
                }
                cache.save(&opts.state_dir)?;
            }
        }
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "registered": done.iter().map(surge_manager::views::peaks_json).collect::<Vec<_>>()
                }))?
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The numbers of servers the pool's curve is measured at: 2, 4, 8, ... below `n`, and `n`
/// (nothing for a pool of one server: its own peaks are the pool's).
pub fn curve_points(n: usize) -> Vec<u64> {
    let mut v = Vec::new();
    let mut k = 2;
    while k < n {
        v.push(k as u64);
        k *= 2;
    }
    if n >= 2 {
        v.push(n as u64);
    }
    v
}

/// One line of what peaks say.
pub fn summary(p: &Peaks) -> String {
    let gib = |b: f64| b / (1u64 << 30) as f64;
    format!(
        "read {:.2} GiB/s, write {:.2} GiB/s, {:.0} read / {:.0} write IOPS ({:.0} with fsync), \
         {:.0} metadata ops/s",
        gib(p.read_bw),
        gib(p.write_bw),
        p.read_iops,
        p.write_iops,
        p.write_iops_fsync,
        p.metadata_ops
    )
}

/// The embedded default's peaks, kept in its state directory: per server id (ids are stable
/// for a fast-tier directory) and the pool's curve (servers measured together, by how many),
/// valid for one fast-tier directory and one number of servers.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct EmbeddedPeaks {
    /// `surge.embedded-peaks/1`.
    pub schema: String,
    pub fast_dir: PathBuf,
    pub servers_count: usize,
    pub servers: Vec<(String, Peaks)>,
    pub curve: Vec<(u32, Peaks)>,
}

const EMBEDDED_SCHEMA: &str = "surge.embedded-peaks/1";

impl EmbeddedPeaks {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("embedded-peaks.json")
    }

    fn new(opts: &EmbeddedOptions) -> EmbeddedPeaks {
        EmbeddedPeaks {
            schema: EMBEDDED_SCHEMA.into(),
            fast_dir: opts.fast_dir.clone(),
            servers_count: opts.servers,
            servers: Vec::new(),
            curve: Vec::new(),
        }
    }

    pub fn load(state_dir: &Path) -> Option<EmbeddedPeaks> {
        let text = std::fs::read_to_string(Self::path(state_dir)).ok()?;
        serde_json::from_str::<EmbeddedPeaks>(&text)
            .ok()
            .filter(|p| p.schema == EMBEDDED_SCHEMA)
    }

    pub fn matches(&self, opts: &EmbeddedOptions) -> bool {
        self.fast_dir == opts.fast_dir && self.servers_count == opts.servers
    }

    fn save(&self, state_dir: &Path) -> anyhow::Result<()> {
        let p = Self::path(state_dir);
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &p).with_context(|| format!("cannot write {}", p.display()))
    }

    fn covers(&self, ids: &[String]) -> bool {
        let points = curve_points(ids.len());
        points
            .iter()
            .all(|n| self.curve.iter().any(|(k, _)| u64::from(*k) == *n))
            && ids
                .iter()
                .all(|id| self.servers.iter().any(|(s, _)| s == id))
    }
}

/// Waits (10 s at most) until `n` servers are up in the default pool (the embedded servers
/// register themselves in the background): the pool, its granularity, the servers up.
pub(crate) async fn wait_servers(
    c: &mut surge_api::Client,
    n: usize,
) -> anyhow::Result<(String, u64, Vec<String>)> {
    let start = Instant::now();
    loop {
        let (pool, g, up) = pool_servers(c, "").await?;
        if up.len() >= n || start.elapsed() > Duration::from_secs(10) {
            return Ok((pool, g, up));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The embedded default's start: registers the peaks it keeps, if they are for this fast-tier
/// directory and number of servers. Returns whether every server and the pool have peaks now.
pub async fn register_embedded(
    c: &mut surge_api::Client,
    opts: &EmbeddedOptions,
) -> anyhow::Result<bool> {
    let Some(cache) = EmbeddedPeaks::load(&opts.state_dir).filter(|x| x.matches(opts)) else {
        return Ok(false);
    };
    let (pool, _, up) = wait_servers(c, opts.servers).await?;
    if !cache.covers(&up) {
        return Ok(false);
    }
    let path = EmbeddedPeaks::path(&opts.state_dir);
    for (id, p) in cache.servers.iter().filter(|(id, _)| up.contains(id)) {
        // Measured through the data path (by `surge pool calibrate` or the embedded
        // default's first measurement): servers of this host count at its median.
        let source = format!(
            "{}{}: embedded default, kept in {}",
            surge_manager::targets::MEASURED_SOURCE,
            host(),
            path.display()
        );
        register(c, &pool, Some(id), 1, p, &source).await?;
    }
    for (n, p) in &cache.curve {
        let source = format!(
            "embedded default, {n} servers at once, kept in {}",
            path.display()
        );
        register(c, &pool, None, *n, p, &source).await?;
    }
    Ok(true)
}

/// The embedded default, for a job that asks for performance targets: makes sure every
/// server and the pool have peaks, measuring them (server 0 and all at once, [`Spec::embedded`])
/// the first time for this fast-tier directory. Returns a line saying what was done, or
/// `None` when the peaks were there.
pub async fn ensure_embedded(
    c: &mut surge_api::Client,
    rt: &tokio::runtime::Handle,
    opts: &EmbeddedOptions,
) -> anyhow::Result<Option<String>> {
    let (pool, g, up) = wait_servers(c, opts.servers).await?;
    let have = c
        .list_peaks(api::ListPeaksRequest { pool: pool.clone() })
        .await
        .map_err(status_err)?
        .into_inner();
    let all = up.iter().all(|id| {
        have.servers
            .iter()
            .any(|s| &s.server == id && !s.peaks_json.is_empty())
    }) && curve_points(up.len())
        .iter()
        .all(|n| have.pools.iter().any(|p| u64::from(p.servers) == *n));
    if all {
        return Ok(None);
    }
    if register_embedded(c, opts).await? {
        return Ok(Some(format!(
            "peaks of this fast tier registered from {}",
            EmbeddedPeaks::path(&opts.state_dir).display()
        )));
    }
    let first = up.first().context("the embedded pool has no server up")?;
    let mount_dir = std::env::temp_dir().join(format!("surge-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&mount_dir)
        .with_context(|| format!("cannot create {}", mount_dir.display()))?;
    let spec = Spec::embedded();
    let one = measure(c, rt, &pool, Some(first), 1, g, &spec, &mount_dir).await?;
    let mut curve = Vec::new();
    for n in curve_points(up.len()) {
        let p = measure(c, rt, &pool, None, n, g, &spec, &mount_dir).await?;
        curve.push((n as u32, p));
    }
    let _ = std::fs::remove_dir(&mount_dir);
    let mut cache = EmbeddedPeaks::new(opts);
    cache.servers = up.iter().map(|id| (id.clone(), one.clone())).collect();
    let said = curve
        .iter()
        .map(|(n, p)| {
            format!(
                "{n} at once {:.2} GiB/s",
                surge_manager::targets::bandwidth_of(p) / (1u64 << 30) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    cache.curve = curve;
    cache.save(&opts.state_dir)?;
    register_embedded(c, opts).await?;
    Ok(Some(format!(
        "no peaks for {} yet: measured server {first} ({}) and the pool ({said}), kept in {}",
        opts.fast_dir.display(),
        summary(&one),
        EmbeddedPeaks::path(&opts.state_dir).display()
    )))
}
