//! Performance-target allocation (DESIGN §6, Daley §5.3): from `#SURGE jobdw bandwidth=...
//! iops=... metadata=... capacity=...` and the calibrated peaks the manager keeps for each
//! server of a pool, which servers get the instance's fragments and its metadata services,
//! what that promises and why, or a refusal with the best the pool can offer.
//!
//! The model: a server's data bandwidth and IOPS are its calibrated peaks (those of a
//! one-fragment instance on it, the lower of read and write so the promise holds either way),
//! shared by all the fragments it holds; an instance's are the sum over its distinct servers,
//! capped by what the pool gave when that many of its servers were measured at once (the
//! pool's curve: one fragment on each of 2, 4, ... and all servers; on one host the servers
//! share its memory and cores, and a one-fragment file is opened with FUSE passthrough, so the
//! curve can even fall). Metadata does not add up with fragments: a striped
//! namespace has one metadata service, a private one one per compute node; each is placed on
//! the calibrated server with the highest metadata peak not already given one. Pure
//! arithmetic: the caller gives the servers, their free fragments and their peaks.

use serde::{Deserialize, Serialize};
use surge_core::directives::{AccessMode, Targets};
use surge_core::peaks::Peaks;

/// A server of the pool as the sizing sees it.
#[derive(Clone, Debug)]
pub struct ServerView<'a> {
    pub id: &'a str,
    /// Whole fragments it can still take.
    pub free_fragments: u64,
    /// Bytes already promised to fragments (the less used is taken first among equals).
    pub reserved: u64,
    pub peaks: Option<&'a Peaks>,
    /// Its peaks were measured through the data path by `surge pool calibrate` (not a file an
    /// administrator registered): those of one host count at most at the host's median.
    pub measured: bool,
}

/// A point of the pool's curve: some of its servers measured at once.
#[derive(Clone, Debug)]
pub struct Aggregate<'a> {
    pub peaks: &'a Peaks,
    /// How many servers that measurement spanned (one fragment on each).
    pub servers: u32,
}

/// The cap on `k` servers together: the curve's point at the fewest servers not below `k`,
/// else its largest; none for one server (its own peaks say it) unless measured so.
fn cap_at(curve: &[Offer], k: usize) -> Option<&Offer> {
    let k = k as u64;
    curve
        .iter()
        .filter(|c| c.fragments >= k && (k > 1 || c.fragments == 1))
        .min_by_key(|c| c.fragments)
        .or_else(|| curve.iter().filter(|_| k > 1).max_by_key(|c| c.fragments))
}

/// What is asked.
#[derive(Clone, Debug)]
pub struct Ask {
    pub targets: Targets,
    /// Capacity asked for (0: only targets).
    pub capacity: u64,
    pub mode: AccessMode,
    pub nodes: u32,
    pub granularity: u64,
}

/// What an allocation gives (rates per second for the whole instance).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    pub fragments: u64,
    pub capacity: u64,
    /// Bytes per second.
    pub bandwidth: f64,
    pub iops: f64,
    pub metadata: f64,
    /// Processes at which its bandwidth was measured (a curve's point; 0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub procs: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One server's part of a promise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Share {
    pub server: String,
    pub fragments: u64,
    /// Its calibrated bandwidth (bytes/s) and IOPS, the lower of read and write.
    pub bandwidth: f64,
    pub iops: f64,
    /// Its metadata peak when it serves one of the instance's namespaces, else 0.
    pub metadata: f64,
    /// Processes at which its write bandwidth peaked (to measure the promise with).
    pub procs: u32,
}

/// What the manager promised for an instance, and why: kept with the instance (its
/// `promise_json`), shown with its session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Promise {
    pub asked: Asked,
    pub offer: Offer,
    /// One line per target: what decided it.
    pub why: Vec<String>,
    pub servers: Vec<Share>,
    /// The server of each namespace (namespace i on entry i).
    pub metadata_servers: Vec<String>,
    /// Where the peaks came from: "registered" (the manager's) or "given" (with the request).
    pub peaks: String,
    /// The point of the pool's curve that capped the sum, if any (`fragments` = the servers
    /// it spanned).
    #[serde(default)]
    pub aggregate: Option<Offer>,
    /// I/O processes at which the promised bandwidth was measured (the curve's point when it
    /// capped the promise, else the sum over the servers): what to measure it with.
    #[serde(default)]
    pub procs: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Asked {
    pub bandwidth: Option<u64>,
    pub iops: Option<u64>,
    pub metadata: Option<u64>,
    pub capacity: u64,
    pub access_mode: String,
    pub nodes: u32,
}

/// The allocation chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub promise: Promise,
    pub fragments: u64,
    /// Indexes (into the servers given) that take the fragments: at least one each, in
    /// this order, before any takes a second.
    pub servers: Vec<usize>,
    /// Index of each namespace's metadata server (namespace i on `metadata[i]`).
    pub metadata: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TargetError {
    #[error(
        "pool '{pool}' has no calibrated peaks to size performance targets from: an \
         administrator measures them with `surge pool calibrate --pool {pool}` (docs/peaks.md), \
         or give peaks with the job (`surge run --peaks FILE`)"
    )]
    NoPeaks { pool: String },
    #[error("{}; the best this pool offers is {}", reasons.join("; "), describe(best))]
    Unmet { reasons: Vec<String>, best: Offer },
    #[error("{0}")]
    Invalid(String),
}

fn both(a: f64, b: f64) -> f64 {
    match (a > 0.0, b > 0.0) {
        (true, true) => a.min(b),
        (true, false) => a,
        (false, true) => b,
        (false, false) => 0.0,
    }
}

/// A server's bandwidth (bytes/s) for a promise: the lower of its read and write peaks.
pub fn bandwidth_of(p: &Peaks) -> f64 {
    both(p.read_bw, p.write_bw)
}

/// A server's IOPS for a promise: the lower of its read and write IOPS (no fsync).
pub fn iops_of(p: &Peaks) -> f64 {
    both(p.read_iops, p.write_iops)
}

pub fn gib_s(b: f64) -> String {
    format!("{:.2} GiB/s", b / (1u64 << 30) as f64)
}

pub fn ops(o: f64) -> String {
    if o >= 1000.0 {
        format!("{:.1}k/s", o / 1000.0)
    } else {
        format!("{o:.0}/s")
    }
}

pub fn describe(o: &Offer) -> String {
    format!(
        "{} fragment(s), {}, {} bandwidth, {} IOPS, {} metadata",
        o.fragments,
        surge_core::format_bytes(o.capacity),
        gib_s(o.bandwidth),
        ops(o.iops),
        ops(o.metadata)
    )
}

/// The offer of `fragments` fragments over `chosen` (data) with namespaces on `md`.
fn offer_of(
    servers: &[ServerView<'_>],
    chosen: &[usize],
    md: &[usize],
    fragments: u64,
    g: u64,
    curve: &[Offer],
) -> Offer {
    let cap = cap_at(curve, chosen.len());
    let peaks = |i: usize| servers[i].peaks;
    let mut bw: f64 = chosen
        .iter()
        .filter_map(|&i| peaks(i))
        .map(bandwidth_of)
        .sum();
    let mut io: f64 = chosen.iter().filter_map(|&i| peaks(i)).map(iops_of).sum();
    if let Some(c) = cap {
        if c.bandwidth > 0.0 {
            bw = bw.min(c.bandwidth);
        }
        if c.iops > 0.0 {
            io = io.min(c.iops);
        }
    }
    let mut distinct = md.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    Offer {
        fragments,
        capacity: fragments.saturating_mul(g),
        bandwidth: bw,
        iops: io,
        metadata: distinct
            .iter()
            .filter_map(|&i| peaks(i))
            .map(|p| p.metadata_ops)
            .sum(),
        procs: 0,
    }
}

/// How `surge pool calibrate` names peaks it measured through the data path (the start of
/// their source).
pub const MEASURED_SOURCE: &str = "surge pool calibrate on ";

/// The middle value (the mean of the two middle ones for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each server's peaks with its bandwidth and IOPS no higher than the median of the calibrated
/// servers on its host. Servers of one host were measured one after the other on the same
/// memory and devices: their spread is the measurement's noise (four identical servers of
/// the embedded default: 3.6-5.1 GiB/s of writes), and taking the fastest first would promise
/// its luckiest run. A host whose servers own different devices is promised its median too
/// (cautious: the promise should hold). Peaks an administrator registered from a file are
/// taken as given.
fn host_medians(servers: &[ServerView<'_>]) -> Vec<Option<Peaks>> {
    let mut by_host: std::collections::HashMap<&str, Vec<&Peaks>> = Default::default();
    for p in servers
        .iter()
        .filter(|s| s.measured)
        .filter_map(|s| s.peaks)
    {
        by_host.entry(p.host.as_str()).or_default().push(p);
    }
    servers
        .iter()
        .map(|s| {
            let p = s.peaks?;
            let mut q = p.clone();
            let same = by_host.get(p.host.as_str()).filter(|_| s.measured);
            if let Some(same) = same.filter(|v| v.len() > 1) {
                let m = |f: fn(&Peaks) -> f64| median(same.iter().map(|x| f(x)).collect());
                q.read_bw = q.read_bw.min(m(|x| x.read_bw));
                q.write_bw = q.write_bw.min(m(|x| x.write_bw));
                q.read_iops = q.read_iops.min(m(|x| x.read_iops));
                q.write_iops = q.write_iops.min(m(|x| x.write_iops));
            }
            Some(q)
        })
        .collect()
}

/// Sizes an allocation: `servers` are the pool's servers that are up; `curve` the pool's
/// servers measured together, if they were; `pool` names the pool in errors. Servers sharing
/// a host count at most at their host's median (see `host_medians`).
pub fn plan(
    ask: &Ask,
    servers: &[ServerView<'_>],
    curve: &[Aggregate<'_>],
    pool: &str,
    peaks_source: &str,
) -> Result<Plan, TargetError> {
    let adjusted = host_medians(servers);
    let views: Vec<ServerView<'_>> = servers
        .iter()
        .zip(&adjusted)
        .map(|(s, p)| ServerView {
            peaks: p.as_ref(),
            ..s.clone()
        })
        .collect();
    let capped = servers
        .iter()
        .zip(&adjusted)
        .any(|(s, p)| match (s.peaks, p) {
            (Some(a), Some(b)) => a.write_bw != b.write_bw || a.read_bw != b.read_bw,
            _ => false,
        });
    let mut plan = plan_views(ask, &views, curve, pool, peaks_source)?;
    if capped {
        plan.promise.why.push(
            "servers sharing a host count at most at the median of their measurements (their \
             spread is the measurement's noise)"
                .into(),
        );
    }
    Ok(plan)
}

fn plan_views(
    ask: &Ask,
    servers: &[ServerView<'_>],
    curve: &[Aggregate<'_>],
    pool: &str,
    peaks_source: &str,
) -> Result<Plan, TargetError> {
    let t = &ask.targets;
    if ask.mode == AccessMode::Ldbalance {
        return Err(TargetError::Invalid(
            "performance targets are for striped or private instances, not access_mode=ldbalance"
                .into(),
        ));
    }
    let g = ask.granularity.max(1);
    if !servers.iter().any(|s| s.peaks.is_some()) {
        return Err(TargetError::NoPeaks { pool: pool.into() });
    }
    let eligible: Vec<usize> = (0..servers.len())
        .filter(|&i| servers[i].peaks.is_some() && servers[i].free_fragments > 0)
        .collect();
    let uncalibrated: Vec<&str> = servers
        .iter()
        .filter(|s| s.peaks.is_none())
        .map(|s| s.id)
        .collect();
    let curve: Vec<Offer> = curve
        .iter()
        .map(|a| Offer {
            fragments: u64::from(a.servers),
            capacity: 0,
            bandwidth: bandwidth_of(a.peaks),
            iops: iops_of(a.peaks),
            metadata: 0.0,
            procs: a.peaks.procs_at_peak.write_bw,
        })
        .collect();
    let p = |i: usize| -> &Peaks {
        match servers[i].peaks {
            Some(p) => p,
            None => no_peaks(),
        }
    };
    // The order servers are taken in for data: the fastest for what is asked first, then
    // the least used.
    let mut order = eligible.clone();
    order.sort_by(|&a, &b| {
        let key = |i: usize| {
            if t.bandwidth.is_some() {
                bandwidth_of(p(i))
            } else if t.iops.is_some() {
                iops_of(p(i))
            } else {
                0.0
            }
        };
        key(b)
            .total_cmp(&key(a))
            .then(servers[a].reserved.cmp(&servers[b].reserved))
            .then(servers[a].id.cmp(servers[b].id))
    });
    // Metadata services: the highest metadata peaks, one per server: first of all when a
    // metadata rate is asked, else among the servers the data goes to.
    let namespaces = match ask.mode {
        AccessMode::Striped | AccessMode::Ldbalance => 1,
        AccessMode::Private => ask.nodes.max(1) as usize,
    };
    let md_among = |among: &[usize]| -> Vec<usize> {
        let mut v = among.to_vec();
        v.sort_by(|&a, &b| {
            p(b).metadata_ops
                .total_cmp(&p(a).metadata_ops)
                .then(servers[a].reserved.cmp(&servers[b].reserved))
                .then(servers[a].id.cmp(servers[b].id))
        });
        v.truncate(namespaces.min(v.len()));
        v
    };
    let mut chosen: Vec<usize> = if t.metadata.is_some() {
        md_among(&eligible)
    } else {
        Vec::new()
    };
    let met = |chosen: &[usize]| {
        let o = offer_of(servers, chosen, &[], chosen.len() as u64, g, &curve);
        !chosen.is_empty()
            && t.bandwidth.is_none_or(|b| o.bandwidth >= b as f64)
            && t.iops.is_none_or(|x| o.iops >= x as f64)
    };
    for &i in &order {
        if met(&chosen) {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    let for_capacity = ask.capacity.div_ceil(g);
    let fragments = for_capacity.max(chosen.len() as u64).max(1);
    // More fragments than servers so far: spread them over more servers (more bandwidth).
    for &i in &order {
        if chosen.len() as u64 >= fragments {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    let md_servers = if t.metadata.is_some() {
        md_among(&eligible)
    } else {
        md_among(&chosen)
    };
    let metadata: Vec<usize> = if md_servers.is_empty() {
        Vec::new()
    } else {
        (0..namespaces)
            .map(|n| md_servers[n % md_servers.len()])
            .collect()
    };
    let free: u64 = chosen.iter().map(|&i| servers[i].free_fragments).sum();
    let offer = offer_of(servers, &chosen, &metadata, fragments, g, &curve);

    let mut reasons = Vec::new();
    let mut why = Vec::new();
    if ask.capacity > 0 {
        why.push(format!(
            "capacity {} asked: {for_capacity} fragment(s) of {}",
            surge_core::format_bytes(ask.capacity),
            surge_core::format_bytes(g)
        ));
    }
    let list = |f: &dyn Fn(&Peaks) -> f64, show: &dyn Fn(f64) -> String| {
        chosen
            .iter()
            .map(|&i| format!("{} {}", servers[i].id, show(f(p(i)))))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (name, asked, got, of, show) in [
        (
            "bandwidth",
            t.bandwidth,
            offer.bandwidth,
            &bandwidth_of as &dyn Fn(&Peaks) -> f64,
            &gib_s as &dyn Fn(f64) -> String,
        ),
        ("iops", t.iops, offer.iops, &iops_of, &ops),
    ] {
        let Some(asked) = asked else { continue };
        let summed: f64 = chosen.iter().map(|&i| of(p(i))).sum();
        let capped = match cap_at(&curve, chosen.len()) {
            Some(c) if got < summed => format!(
                " ({} of the pool's servers measured at once gave {}, not the sum of their own \
                 peaks)",
                c.fragments,
                show(if name == "bandwidth" {
                    c.bandwidth
                } else {
                    c.iops
                })
            ),
            _ => String::new(),
        };
        if got >= asked as f64 {
            why.push(format!(
                "{name} {} asked: {} server(s) give {} ({}){capped}",
                show(asked as f64),
                chosen.len(),
                show(got),
                list(of, show)
            ));
        } else {
            reasons.push(format!(
                "{name}={} is more than the {} of {} calibrated server(s) with free space{capped}",
                show(asked as f64),
                show(got),
                chosen.len()
            ));
        }
    }
    let md_names = || {
        md_servers
            .iter()
            .map(|&i| format!("{} {}", servers[i].id, ops(p(i).metadata_ops)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(asked) = t.metadata {
        let got = offer.metadata;
        if got >= asked as f64 {
            why.push(match ask.mode {
                AccessMode::Private => format!(
                    "metadata {} asked: {} namespace(s) (one per node) on {} metadata \
                     server(s) give {} ({})",
                    ops(asked as f64),
                    namespaces,
                    md_servers.len(),
                    ops(got),
                    md_names()
                ),
                _ => format!(
                    "metadata {} asked: the namespace's metadata service on {} gives {}",
                    ops(asked as f64),
                    md_names(),
                    ops(got)
                ),
            });
        } else {
            reasons.push(match ask.mode {
                AccessMode::Private if namespaces < eligible.len() => format!(
                    "metadata={} exceeds the {} of {} compute node(s)' metadata services ({}); \
                     run on more nodes or lower the target",
                    ops(asked as f64),
                    ops(got),
                    namespaces,
                    md_names()
                ),
                AccessMode::Private => format!(
                    "metadata={} exceeds the {} the pool's {} calibrated server(s) give as \
                     metadata services",
                    ops(asked as f64),
                    ops(got),
                    md_servers.len()
                ),
                _ => format!(
                    "metadata={} exceeds the {} of one striped namespace's metadata service (the \
                     fastest: {}; fragments do not add metadata services): use \
                     access_mode=private (one service per compute node) or a lower target",
                    ops(asked as f64),
                    ops(got),
                    md_names()
                ),
            });
        }
    }
    if free < fragments {
        reasons.push(format!(
            "{fragments} fragment(s) of {} are needed but the pool's calibrated servers have {} \
             free",
            surge_core::format_bytes(g),
            eligible
                .iter()
                .map(|&i| servers[i].free_fragments)
                .sum::<u64>()
        ));
    }
    if !uncalibrated.is_empty() {
        why.push(format!(
            "not used: {} server(s) without calibrated peaks ({})",
            uncalibrated.len(),
            uncalibrated.join(", ")
        ));
    }
    if !reasons.is_empty() {
        // The best offer: over every number of servers (the pool's curve may fall as servers
        // are added), the one that meets most targets, then gives most of the first asked.
        let all_free: u64 = eligible.iter().map(|&i| servers[i].free_fragments).sum();
        let mut seq: Vec<usize> = Vec::new();
        for &i in md_servers.iter().chain(&order) {
            if !seq.contains(&i) {
                seq.push(i);
            }
        }
        let mut best: Option<(usize, f64, Offer)> = None;
        for l in 1..=seq.len() {
            // As the plan would: the capacity's fragments spread over as many servers.
            let prefix = &seq[..l.max((for_capacity as usize).min(seq.len()))];
            let n = all_free.min(for_capacity.max(prefix.len() as u64).max(1));
            let o = offer_of(servers, prefix, &metadata, n, g, &curve);
            let score = [
                t.bandwidth.is_none_or(|b| o.bandwidth >= b as f64),
                t.iops.is_none_or(|x| o.iops >= x as f64),
                t.metadata.is_none_or(|m| o.metadata >= m as f64),
            ]
            .iter()
            .filter(|m| **m)
            .count();
            let first = if t.bandwidth.is_some() {
                o.bandwidth
            } else if t.iops.is_some() {
                o.iops
            } else {
                o.metadata
            };
            if best
                .as_ref()
                .is_none_or(|(s, f, _)| (score, first) > (*s, *f))
            {
                best = Some((score, first, o));
            }
        }
        return Err(TargetError::Unmet {
            reasons,
            best: best.map(|b| b.2).unwrap_or_default(),
        });
    }
    // Fragments per server as placement will make them: one each, then round-robin.
    let mut per = vec![0u64; chosen.len()];
    for k in 0..fragments as usize {
        per[k % chosen.len()] += 1;
    }
    let promise = Promise {
        asked: Asked {
            bandwidth: t.bandwidth,
            iops: t.iops,
            metadata: t.metadata,
            capacity: ask.capacity,
            access_mode: ask.mode.as_str().into(),
            nodes: ask.nodes.max(1),
        },
        offer,
        why,
        servers: chosen
            .iter()
            .zip(&per)
            .map(|(&i, &n)| Share {
                server: servers[i].id.into(),
                fragments: n,
                bandwidth: bandwidth_of(p(i)),
                iops: iops_of(p(i)),
                metadata: if md_servers.contains(&i) {
                    p(i).metadata_ops
                } else {
                    0.0
                },
                procs: p(i).procs_at_peak.write_bw.max(1),
            })
            .collect(),
        metadata_servers: metadata.iter().map(|&i| servers[i].id.into()).collect(),
        peaks: peaks_source.into(),
        aggregate: cap_at(&curve, chosen.len())
            .filter(|c| {
                c.bandwidth < chosen.iter().map(|&i| bandwidth_of(p(i))).sum::<f64>()
                    || c.iops < chosen.iter().map(|&i| iops_of(p(i))).sum::<f64>()
            })
            .cloned(),
        procs: 0,
    };
    let promise = Promise {
        procs: match &promise.aggregate {
            Some(c) if c.procs > 0 => c.procs,
            _ => promise.servers.iter().map(|s| s.procs).sum(),
        },
        ..promise
    };
    Ok(Plan {
        promise,
        fragments,
        servers: chosen,
        metadata,
    })
}

/// What a server without calibrated peaks contributes: nothing (`plan` takes only servers
/// with peaks, so this stands in where the types cannot tell).
fn no_peaks() -> &'static Peaks {
    static NONE: std::sync::OnceLock<Peaks> = std::sync::OnceLock::new();
    NONE.get_or_init(|| Peaks {
        schema: surge_core::peaks::PEAKS_SCHEMA.into(),
        path: String::new(),
        host: String::new(),
        measured_at: String::new(),
        read_bw: 0.0,
        write_bw: 0.0,
        read_iops: 0.0,
        write_iops: 0.0,
        write_iops_fsync: 0.0,
        metadata_ops: 0.0,
        procs_at_peak: Default::default(),
        metadata_detail: Default::default(),
    })
}

/// Checks peaks before the manager keeps them: the schema, and rates that are numbers, not
/// negative, and not all zero.
pub fn check_peaks(p: &Peaks) -> Result<(), String> {
    if p.schema != surge_core::peaks::PEAKS_SCHEMA {
        return Err(format!(
            "peaks have schema '{}', expected '{}'",
            p.schema,
            surge_core::peaks::PEAKS_SCHEMA
        ));
    }
    let rates = [
        ("read_bw", p.read_bw),
        ("write_bw", p.write_bw),
        ("read_iops", p.read_iops),
        ("write_iops", p.write_iops),
        ("write_iops_fsync", p.write_iops_fsync),
        ("metadata_ops", p.metadata_ops),
    ];
    if let Some((name, v)) = rates.iter().find(|(_, v)| !v.is_finite() || *v < 0.0) {
        return Err(format!(
            "peaks field {name} is {v}: rates are numbers of at least 0"
        ));
    }
    if rates.iter().all(|(_, v)| *v == 0.0) {
        return Err("peaks with every rate 0 promise nothing: calibrate again".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_core::peaks::{MetadataDetail, ProcsAtPeak, PEAKS_SCHEMA};

    const GIB: u64 = 1 << 30;
    const G: u64 = 200 * GIB;

    /// Daley's Cori fragment: 6 GiB/s, 90K IOPS, 25K metadata operations per second, scaled.
    fn peaks(bw_gib: f64, md: f64) -> Peaks {
        Peaks {
            schema: PEAKS_SCHEMA.into(),
            path: "/bb".into(),
            host: "h".into(),
            measured_at: "2026-01-01T00:00:00Z".into(),
            read_bw: (bw_gib + 0.5) * GIB as f64,
            write_bw: bw_gib * GIB as f64,
            read_iops: 95_000.0,
            write_iops: 90_000.0,
            write_iops_fsync: 9_000.0,
            metadata_ops: md,
            procs_at_peak: ProcsAtPeak::default(),
            metadata_detail: MetadataDetail::default(),
        }
    }

    fn t(bw: Option<u64>, iops: Option<u64>, md: Option<u64>) -> Targets {
        Targets {
            bandwidth: bw,
            iops,
            metadata: md,
        }
    }

    fn ask(targets: Targets, capacity: u64, mode: AccessMode, nodes: u32) -> Ask {
        Ask {
            targets,
            capacity,
            mode,
            nodes,
            granularity: G,
        }
    }

    fn views<'a>(ids: &'a [&'a str], p: &'a [Option<Peaks>], free: u64) -> Vec<ServerView<'a>> {
        ids.iter()
            .zip(p)
            .map(|(id, p)| ServerView {
                id,
                free_fragments: free,
                reserved: 0,
                peaks: p.as_ref(),
                measured: true,
            })
            .collect()
    }

    const IDS: [&str; 4] = ["s0", "s1", "s2", "s3"];

    fn cori4() -> Vec<Option<Peaks>> {
        (0..4).map(|_| Some(peaks(6.0, 25_000.0))).collect()
    }

    #[test]
    fn bandwidth_takes_servers_until_their_lower_peaks_add_up() {
        let p = cori4();
        let s = views(&IDS, &p, 10);
        let plan = plan(
            &ask(t(Some(15 * GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap();
        // 15 / 6 GiB/s (the write peak, lower than the read one) = 2.5: 3 servers, 18 GiB/s.
        assert_eq!(plan.fragments, 3);
        assert_eq!(plan.servers.len(), 3);
        assert_eq!(plan.promise.offer.bandwidth, 18.0 * GIB as f64);
        assert_eq!(plan.promise.offer.capacity, 3 * G);
        assert!(plan.promise.why[0].contains("3 server(s) give 18.00 GiB/s"));
    }

    #[test]
    fn fragments_on_one_server_share_its_bandwidth() {
        let p = cori4();
        let s = views(&IDS[..2], &p[..2], 10);
        // 4 fragments for the capacity, on 2 servers: the bandwidth of 2 servers.
        let plan = plan(
            &ask(t(Some(6 * GIB), None, None), 4 * G, AccessMode::Striped, 1),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.fragments, 4);
        assert_eq!(plan.promise.offer.bandwidth, 12.0 * GIB as f64);
        assert_eq!(
            plan.promise
                .servers
                .iter()
                .map(|x| x.fragments)
                .sum::<u64>(),
            4
        );
        // Asking for 3 servers' worth from 2 is refused, with the best the 2 give.
        let e = super::plan(
            &ask(t(Some(15 * GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap_err();
        let TargetError::Unmet { best, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(best.bandwidth, 12.0 * GIB as f64);
        assert!(e.to_string().contains("the best this pool offers"), "{e}");
    }

    fn on(host: &str, mut p: Peaks) -> Peaks {
        p.host = host.into();
        p
    }

    #[test]
    fn the_fastest_servers_are_taken_first() {
        let p = vec![
            Some(on("a", peaks(1.0, 25_000.0))),
            Some(on("b", peaks(8.0, 25_000.0))),
            Some(on("c", peaks(2.0, 25_000.0))),
        ];
        let s = views(&IDS[..3], &p, 10);
        let plan = plan(
            &ask(t(Some(8 * GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.servers, vec![1]);
    }

    #[test]
    fn servers_of_one_host_are_promised_its_median() {
        // Four servers of one host measured 3.6, 4.0, 4.6 and 5.1 GiB/s of writes (the
        // embedded default's spread): one fragment is promised the median, 4.3, not 5.1; a
        // server of another host keeps its own.
        let p = vec![
            Some(on("h", peaks(3.6, 25_000.0))),
            Some(on("h", peaks(5.1, 25_000.0))),
            Some(on("h", peaks(4.0, 25_000.0))),
            Some(on("h", peaks(4.6, 25_000.0))),
        ];
        let s = views(&IDS, &p, 10);
        let first = plan(
            &ask(t(Some(GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(first.fragments, 1);
        let bw = first.promise.offer.bandwidth / GIB as f64;
        assert!((bw - 4.3).abs() < 1e-9, "promised {bw} GiB/s");
        assert!(
            first.promise.why.iter().any(|w| w.contains("median")),
            "{:?}",
            first.promise.why
        );
        let p2 = vec![
            Some(on("h", peaks(3.6, 25_000.0))),
            Some(on("g", peaks(5.1, 25_000.0))),
        ];
        let s = views(&IDS[..2], &p2, 10);
        let plan = plan(
            &ask(t(Some(GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.promise.offer.bandwidth, 5.1 * GIB as f64);
        assert!(!plan.promise.why.iter().any(|w| w.contains("median")));
    }

    #[test]
    fn the_pool_aggregate_caps_the_sum() {
        let p = cori4();
        let s = views(&IDS, &p, 10);
        let agg = peaks(10.0, 25_000.0);
        let cap = || {
            [Aggregate {
                peaks: &agg,
                servers: 4,
            }]
        };
        // 10 GiB/s together: 2 servers promise 10, not 12.
        let plan = plan(
            &ask(t(Some(9 * GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &cap(),
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.fragments, 2);
        assert_eq!(plan.promise.offer.bandwidth, 10.0 * GIB as f64);
        assert!(
            plan.promise.why[0].contains("measured at once"),
            "{:?}",
            plan.promise.why
        );
        // 11 GiB/s: more than the 4 servers together give: refused up front.
        let e = super::plan(
            &ask(t(Some(11 * GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &cap(),
            "default",
            "registered",
        )
        .unwrap_err();
        assert!(e.to_string().contains("10.00 GiB/s"), "{e}");
    }

    #[test]
    fn a_falling_curve_keeps_the_fewest_servers_that_meet_the_target() {
        // One host: one server alone 3 GiB/s, 2 at once 1.2, 4 at once 1.4 (each fragment
        // through the daemon; the lone one by passthrough).
        let p: Vec<Option<Peaks>> = (0..4).map(|_| Some(peaks(3.0, 25_000.0))).collect();
        let s = views(&IDS, &p, 10);
        let (two, four) = (peaks(1.2, 1.0), peaks(1.4, 1.0));
        let curve = [
            Aggregate {
                peaks: &two,
                servers: 2,
            },
            Aggregate {
                peaks: &four,
                servers: 4,
            },
        ];
        let plan = super::plan(
            &ask(t(Some(2 * GIB), None, None), 0, AccessMode::Striped, 1),
            &s,
            &curve,
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.fragments, 1);
        assert_eq!(plan.promise.offer.bandwidth, 3.0 * GIB as f64);
        // 2 GiB/s but also 4 fragments of capacity: 4 servers give 1.4: refused, and the best
        // offer named is one server's 3 GiB/s (with the capacity it can hold).
        let e = super::plan(
            &ask(t(Some(2 * GIB), None, None), 4 * G, AccessMode::Striped, 1),
            &s,
            &curve,
            "default",
            "registered",
        )
        .unwrap_err();
        let TargetError::Unmet { best, reasons } = &e else {
            panic!("{e}")
        };
        assert!(reasons[0].contains("1.40 GiB/s"), "{e}");
        assert_eq!(best.bandwidth, 1.4 * GIB as f64, "{e}");
    }

    #[test]
    fn metadata_goes_to_the_fastest_metadata_server_and_private_adds_services() {
        let p = vec![
            Some(peaks(6.0, 20_000.0)),
            Some(peaks(6.0, 30_000.0)),
            Some(peaks(6.0, 25_000.0)),
        ];
        let s = views(&IDS[..3], &p, 10);
        let plan = plan(
            &ask(t(None, None, Some(28_000)), 0, AccessMode::Striped, 4),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.metadata, vec![1]);
        assert_eq!(plan.servers, vec![1]);
        let e = super::plan(
            &ask(t(None, None, Some(50_000)), 0, AccessMode::Striped, 4),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap_err();
        assert!(e.to_string().contains("access_mode=private"), "{e}");
        let plan = super::plan(
            &ask(t(None, None, Some(50_000)), 0, AccessMode::Private, 2),
            &s,
            &[],
            "default",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.metadata, vec![1, 2]);
        assert_eq!(plan.promise.offer.metadata, 55_000.0);
    }

    #[test]
    fn no_peaks_says_how_to_calibrate_and_uncalibrated_servers_are_not_used() {
        let none = vec![None, None];
        let e = plan(
            &ask(t(Some(GIB), None, None), 0, AccessMode::Striped, 1),
            &views(&IDS[..2], &none, 10),
            &[],
            "fast",
            "registered",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("surge pool calibrate --pool fast"),
            "{e}"
        );
        let some = vec![None, Some(peaks(6.0, 25_000.0))];
        let plan = plan(
            &ask(t(Some(GIB), None, None), 0, AccessMode::Striped, 1),
            &views(&IDS[..2], &some, 10),
            &[],
            "fast",
            "registered",
        )
        .unwrap();
        assert_eq!(plan.servers, vec![1]);
        assert!(plan
            .promise
            .why
            .iter()
            .any(|w| w.contains("not used: 1 server")));
    }

    #[test]
    fn capacity_beyond_the_free_space_is_refused() {
        let p = cori4();
        let e = plan(
            &ask(t(Some(GIB), None, None), 9 * G, AccessMode::Striped, 1),
            &views(&IDS, &p, 2),
            &[],
            "default",
            "registered",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains(
                "9 fragment(s) of 200 GiB are needed but the pool's calibrated servers have 8 free"
            ),
            "{e}"
        );
    }

    #[test]
    fn bad_peaks_are_refused_with_the_field_named() {
        let mut p = peaks(1.0, 1.0);
        p.write_bw = f64::NAN;
        assert!(check_peaks(&p).unwrap_err().contains("write_bw"));
        p.write_bw = -1.0;
        assert!(check_peaks(&p).unwrap_err().contains("write_bw"));
        p.schema = "x".into();
        assert!(check_peaks(&p).unwrap_err().contains("schema 'x'"));
    }
}
