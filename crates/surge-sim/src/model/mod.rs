//! The storage-system model: processes running kernels on compute nodes, the I/O-forwarding
//! protocol on the I/O nodes with Liu's burst-buffer write-behind (§III-C), and file servers
//! with LUNs, driven by the engine in [`crate::engine`].
//!
//! Data moves in *pieces*: a request is cut at stripe boundaries and at the forwarder's
//! transfer size, and each piece walks a route of FIFO resources ([`topology`]). Two flows that
//! share a link therefore interleave piece by piece (packetized FIFO): each gets about half the
//! link, and the finishing times are exact sums of piece service times (tests pin both).
//!
//! Write protocol, per request (Fig. 2 of the paper):
//! 1. the CN sends the request header to its ION (control latency only);
//! 2. the ION reserves burst-buffer space for the whole request; if granted the request is
//!    *absorbed* (CN -> ION -> SSD) and acknowledged once every piece is on the SSD, and the
//!    pieces are queued for the drain to the file servers; if not (or with no burst buffer),
//!    the original *direct* path is used (CN -> ION -> network -> server -> LUN) and the ION
//!    acknowledges when the servers have;
//! 3. the ION pulls a piece from the CN only when its forwarding buffer has room, so a direct
//!    write advances at the pace of the storage, not of the tree.
//!
//! `commit` waits until the process's data in the burst buffer has been drained (and starts the
//! drain under the lazy policy). Reads are served by the ION's SSD when the stripe still has
//! data there that the drain has not finished, else by the file servers.

pub mod stats;
pub mod topology;

use crate::engine::{mix64, secs, EventQueue, Rng, SimTime};
use crate::kernel::{AppSpec, Op, MAX_REPEAT_DEPTH};
use crate::report::{AppReport, EngineStats, Report, SystemSummary, Totals};
use crate::system::{DrainPolicy, System};
use stats::{union_length, Phase, Series};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use thiserror::Error;
use topology::{Class, Route, Topology};

#[derive(Debug, Error)]
pub enum SimError {
    #[error("{origin}: application '{app}' needs {needed} compute nodes from node {first}, but the system has {nodes}")]
    TooBig {
        origin: String,
        app: String,
        needed: u64,
        first: u32,
        nodes: u32,
    },
    #[error("{origin}: application '{app}' (nodes {first}-{last}) overlaps '{other}' (nodes {ofirst}-{olast}); give one of them another 'at NODE'")]
    Overlap {
        origin: String,
        app: String,
        first: u32,
        last: u32,
        other: String,
        ofirst: u32,
        olast: u32,
    },
    #[error("no application to simulate")]
    NoApps,
    #[error("{origin}: application '{app}' {what}")]
    Limit {
        origin: String,
        app: String,
        what: String,
    },
    #[error("{count} processes in all: at most {max} are supported")]
    TooManyProcesses { count: u64, max: u64 },
}

/// Where an application runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub first_node: u32,
    pub nodes: u32,
    pub per_node: u32,
    pub processes: u32,
}

/// Places applications on compute nodes: an explicit `at NODE` is honoured, the others take
/// the next free node at an I/O-node boundary (a partition is a whole number of psets on BG/P).
pub fn place(sys: &System, apps: &[AppSpec]) -> Result<Vec<Placement>, SimError> {
    let npi = sys.compute.nodes_per_ion;
    let mut out: Vec<Placement> = Vec::new();
    let mut next_free: u64 = 0;
    for a in apps {
        let per_node = a.per_node.unwrap_or(sys.compute.processes_per_node);
        let processes = a.resolve_processes(sys.compute.processes_per_node);
        let needed = u64::from(processes).div_ceil(u64::from(per_node));
        let first = match a.first_node {
            Some(f) => u64::from(f),
            None => next_free.div_ceil(u64::from(npi)) * u64::from(npi),
        };
        if first + needed > u64::from(sys.compute.nodes) {
            return Err(SimError::TooBig {
                origin: a.origin.clone(),
                app: a.name.clone(),
                needed,
                first: first.min(u64::from(u32::MAX)) as u32,
                nodes: sys.compute.nodes,
            });
        }
        let p = Placement {
            first_node: first as u32,
            nodes: needed as u32,
            per_node,
            processes,
        };
        for (j, q) in out.iter().enumerate() {
            let (a0, a1) = (p.first_node, p.first_node + p.nodes - 1);
            let (b0, b1) = (q.first_node, q.first_node + q.nodes - 1);
            if a0 <= b1 && b0 <= a1 {
                return Err(SimError::Overlap {
                    origin: a.origin.clone(),
                    app: a.name.clone(),
                    first: a0,
                    last: a1,
                    other: apps[j].name.clone(),
                    ofirst: b0,
                    olast: b1,
                });
            }
        }
        next_free = next_free.max(first + needed);
        out.push(p);
    }
    Ok(out)
}

/// Largest number of I/O phases (write/read statements run, loops multiplied out) per
/// application: the simulator keeps one small record per phase.
pub const MAX_IO_PHASES: u64 = 1_000_000;

/// Refuses programs whose byte counts or durations would overflow the model's integers, or
/// whose phase records would not fit in memory, before anything runs.
fn check_limits(a: &AppSpec, p: &Placement) -> Result<(), SimError> {
    let limit = |what: String| SimError::Limit {
        origin: a.origin.clone(),
        app: a.name.clone(),
        what,
    };
    let t = a.totals();
    let procs = u64::from(p.processes);
    // Offsets never exceed what all processes write or read in total (strided regions round
    // each phase up to whole requests, at most doubling it).
    for (bytes, verb) in [(t.write_bytes, "writes"), (t.read_bytes, "reads")] {
        match bytes.checked_mul(procs) {
            Some(total) if total < 1 << 61 => {}
            _ => {
                return Err(limit(format!(
                    "{verb} more than 2 EiB in total ({} per process x {procs} processes)",
                    surge_core::format_bytes(bytes)
                )))
            }
        }
    }
    // Jitter stretches compute by at most 11x (1000%); time must stay below 2^63 ns.
    if t.compute_ns >= 1 << 59 {
        return Err(limit("computes for more than 18 years per process".into()));
    }
    if t.io_phases > MAX_IO_PHASES {
        return Err(limit(format!(
            "runs {} write/read statements per process; at most {MAX_IO_PHASES} are supported",
            t.io_phases
        )));
    }
    Ok(())
}

/// How to run.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    /// Width of a time-series bin.
    pub sample: SimTime,
    /// Stop at this simulated time even if work remains.
    pub until: Option<SimTime>,
    /// Stop when every application has finished, without waiting for the drain.
    pub stop_when_apps_done: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            seed: 1,
            sample: 10 * crate::engine::NS_PER_S,
            until: None,
            stop_when_apps_done: false,
        }
    }
}

/// Progress of a running simulation, for a live line on a terminal.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub now: SimTime,
    pub events: u64,
    pub wall_s: f64,
}

/// A finished run: the summary and the time series.
pub struct Outcome {
    pub report: Report,
    pub series: Series,
}

/// Runs the simulation of `apps` on `sys`.
pub fn simulate(
    sys: &System,
    apps: &[AppSpec],
    opts: &SimOptions,
    progress: Option<&mut dyn FnMut(Progress)>,
) -> Result<Outcome, SimError> {
    if apps.is_empty() {
        return Err(SimError::NoApps);
    }
    let placements = place(sys, apps)?;
    let total: u64 = placements.iter().map(|p| u64::from(p.processes)).sum();
    if total > u64::from(u32::MAX / 2) {
        return Err(SimError::TooManyProcesses {
            count: total,
            max: u64::from(u32::MAX / 2),
        });
    }
    for (a, p) in apps.iter().zip(&placements) {
        check_limits(a, p)?;
    }
    let mut sim = Sim::new(sys, apps, &placements, opts);
    let wall = std::time::Instant::now();
    let stopped_by = sim.run(opts, progress, wall);
    let wall_s = wall.elapsed().as_secs_f64();
    Ok(sim.finish(sys, apps, &placements, opts, stopped_by, wall_s))
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    /// A process resumes its program (start, end of compute, barrier release, commit done).
    Proc(u32),
    /// A process's request header reaches its I/O node.
    ReqAtIon(u32),
    /// A commit reaches the process's I/O node.
    CommitAtIon(u32),
    /// A piece arrives at the next resource of its route.
    Hop(u32),
    /// A piece has finished its route (and, for storage writes, the server's acknowledgement
    /// has reached the ION).
    PieceEnd(u32),
    /// The ION's acknowledgement of a process's request reaches the process.
    ReqDone(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Absorb,
    Direct,
    Drain,
    ReadPfs,
    ReadBb,
}

#[derive(Clone, Copy, Debug)]
struct Piece {
    route: Route,
    hop: u8,
    kind: Kind,
    app: u16,
    file: u16,
    bytes: u32,
    /// The process whose data this is.
    owner: u32,
    ion: u32,
    file_key: u64,
    offset: u64,
}

/// A vector with a free list: ids stay small and memory is reused.
struct Slab<T> {
    items: Vec<T>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
    fn insert(&mut self, t: T) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.items[id as usize] = t;
                id
            }
            None => {
                self.items.push(t);
                (self.items.len() - 1) as u32
            }
        }
    }
    fn remove(&mut self, id: u32) {
        self.free.push(id);
    }
}

/// A stateless hasher for the residency map (keys are already well mixed by `mix64`), so the
/// map costs no SipHash and no random state.
#[derive(Default)]
struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix64(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = mix64(self.0 ^ x);
    }
}
type ResidentMap = HashMap<(u64, u64), u32, BuildHasherDefault<KeyHasher>>;

#[derive(Clone, Copy, Debug)]
struct Dirty {
    proc: u32,
    app: u16,
    file: u16,
    bytes: u32,
    file_key: u64,
    offset: u64,
}

struct IonState {
    /// Forwarding-buffer bytes free (may dip below zero for one oversize piece).
    credits: i64,
    in_flight: u32,
    /// Processes whose request still has data to move, in arrival order.
    admit: VecDeque<u32>,
    /// Burst-buffer bytes reserved or holding data not yet drained.
    bb_used: u64,
    dirty: VecDeque<Dirty>,
    draining: u32,
    forced: bool,
    resident: ResidentMap,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commit {
    None,
    All,
    File(u16),
}

/// One application process. Kept small and flat (no heap pointers): the hottest state of
/// the simulation, touched by every request and every piece.
struct Proc {
    app: u16,
    in_op: bool,
    commit: Commit,
    /// The outstanding request (a process has at most one): a write or a read, and whether the
    /// ION absorbed it into the burst buffer.
    req_write: bool,
    req_absorbed: bool,
    req_file: u16,
    depth: u8,
    rank: u32,
    cn: u32,
    ion: u32,
    pc: u32,
    /// Index of the current I/O phase (the k-th write/read statement this process runs).
    phase: u32,
    req_pending: u32,
    /// Counters of the open `repeat` blocks, innermost last.
    loops: [u32; MAX_REPEAT_DEPTH],
    /// Bytes of the current write/read statement already requested.
    issued: u64,
    /// Offset where the current statement's region of the file starts.
    op_base: u64,
    /// Next byte of the outstanding request to move, and its end.
    req_next: u64,
    req_end: u64,
    /// Bytes in the burst buffer not yet drained.
    dirty: u64,
    commit_start: SimTime,
}

struct AppState {
    first_pid: u32,
    processes: u32,
    shared: Vec<bool>,
    /// Next free region of each file, `[2f]` writes and `[2f + 1]` reads: every process runs
    /// the same program, so the k-th phase starts at the same place for all of them.
    cursor: Vec<u64>,
    /// Dirty bytes per (process, file), kept only when the program has `commit FILE`.
    dirty_file: Vec<u64>,
    files: usize,
    barrier_waiting: u32,
    finished: u32,
    end: Option<SimTime>,
    phases: Vec<Phase>,
    absorbed: u64,
    direct: u64,
    overflow: u64,
    read_bb: u64,
    read_pfs: u64,
    commits: u64,
    commit_wait_total: SimTime,
    commit_wait_max: SimTime,
}

/// Why the run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Completed,
    Until,
    AppsDone,
}

struct Sim {
    topo: Topology,
    q: EventQueue<Ev>,
    rng: Rng,
    programs: Vec<Vec<Op>>,
    apps: Vec<AppState>,
    procs: Vec<Proc>,
    pieces: Slab<Piece>,
    ions: Vec<IonState>,
    series: Series,
    bb_enabled: bool,
    bb_capacity: u64,
    drain_depth: u32,
    drain_lazy: bool,
    watermark: u64,
    barrier_latency: SimTime,
    track_residency: bool,
    bb_total_used: u64,
    bb_peak: u64,
    drained: u64,
    last_drain: Option<SimTime>,
    apps_done: usize,
}

impl Sim {
    fn new(sys: &System, specs: &[AppSpec], placements: &[Placement], opts: &SimOptions) -> Sim {
        let topo = Topology::new(sys, opts.seed);
        let mut procs = Vec::new();
        let mut apps = Vec::new();
        for (a, (spec, pl)) in specs.iter().zip(placements).enumerate() {
            let nfiles = spec.files.len();
            let per_file_commit = spec
                .ops
                .iter()
                .any(|o| matches!(o, Op::Commit { file: Some(_) }));
            apps.push(AppState {
                first_pid: procs.len() as u32,
                processes: pl.processes,
                shared: spec.files.iter().map(|f| f.shared).collect(),
                cursor: vec![0; 2 * nfiles],
                dirty_file: if per_file_commit {
                    vec![0; pl.processes as usize * nfiles]
                } else {
                    Vec::new()
                },
                files: nfiles,
                barrier_waiting: 0,
                finished: 0,
                end: None,
                phases: Vec::new(),
                absorbed: 0,
                direct: 0,
                overflow: 0,
                read_bb: 0,
                read_pfs: 0,
                commits: 0,
                commit_wait_total: 0,
                commit_wait_max: 0,
            });
            for rank in 0..pl.processes {
                let cn = pl.first_node + rank / pl.per_node;
                procs.push(Proc {
                    app: a as u16,
                    in_op: false,
                    commit: Commit::None,
                    req_write: false,
                    req_absorbed: false,
                    req_file: 0,
                    depth: 0,
                    rank,
                    cn,
                    ion: topo.ion_of(cn),
                    pc: 0,
                    phase: 0,
                    req_pending: 0,
                    loops: [0; MAX_REPEAT_DEPTH],
                    issued: 0,
                    op_base: 0,
                    req_next: 0,
                    req_end: 0,
                    dirty: 0,
                    commit_start: 0,
                });
            }
        }
        let bb = &sys.burst_buffer;
        let forward = i64::try_from(sys.ion.forward_buffer.0).unwrap_or(i64::MAX);
        let ions = (0..topo.ions())
            .map(|_| IonState {
                credits: forward,
                in_flight: 0,
                admit: VecDeque::new(),
                bb_used: 0,
                dirty: VecDeque::new(),
                draining: 0,
                forced: false,
                resident: ResidentMap::default(),
            })
            .collect();
        let track_residency = bb.enabled
            && specs
                .iter()
                .any(|s| s.ops.iter().any(|o| matches!(o, Op::Read { .. })));
        Sim {
            topo,
            q: EventQueue::new(),
            rng: Rng::new(opts.seed),
            programs: specs.iter().map(|s| s.ops.clone()).collect(),
            apps,
            procs,
            pieces: Slab::new(),
            ions,
            series: Series::new(opts.sample, specs.len()),
            bb_enabled: bb.enabled,
            bb_capacity: bb.capacity.0,
            drain_depth: bb.drain_depth.max(1),
            drain_lazy: bb.drain == DrainPolicy::Lazy,
            watermark: (bb.capacity.0 as f64 * bb.high_watermark) as u64,
            barrier_latency: sys.compute.barrier_latency.0,
            track_residency,
            bb_total_used: 0,
            bb_peak: 0,
            drained: 0,
            last_drain: None,
            apps_done: 0,
        }
    }

    fn run(
        &mut self,
        opts: &SimOptions,
        mut progress: Option<&mut dyn FnMut(Progress)>,
        wall: std::time::Instant,
    ) -> Stop {
        for pid in 0..self.procs.len() as u32 {
            self.q.schedule(0, Ev::Proc(pid));
        }
        let until = opts.until.unwrap_or(SimTime::MAX);
        const REPORT_EVERY: u64 = 1 << 20;
        let mut next_report = REPORT_EVERY;
        loop {
            match self.q.peek_time() {
                None => return Stop::Completed,
                Some(t) if t > until => return Stop::Until,
                Some(_) => {}
            }
            let Some((now, ev)) = self.q.pop() else {
                return Stop::Completed;
            };
            match ev {
                Ev::Proc(pid) => self.run_proc(pid, now),
                Ev::ReqAtIon(rid) => self.req_at_ion(rid, now),
                Ev::CommitAtIon(pid) => self.commit_at_ion(pid, now),
                Ev::Hop(id) => self.hop(id, now),
                Ev::PieceEnd(id) => self.piece_end(id, now),
                Ev::ReqDone(pid) => self.run_proc(pid, now),
            }
            if opts.stop_when_apps_done && self.apps_done == self.apps.len() {
                return Stop::AppsDone;
            }
            if self.q.processed() >= next_report {
                next_report += REPORT_EVERY;
                if let Some(cb) = progress.as_mut() {
                    cb(Progress {
                        now,
                        events: self.q.processed(),
                        wall_s: wall.elapsed().as_secs_f64(),
                    });
                }
            }
        }
    }

    /// Interprets a process's program until it blocks (compute, request, barrier, commit).
    fn run_proc(&mut self, pid: u32, now: SimTime) {
        loop {
            let p = &mut self.procs[pid as usize];
            let a = p.app as usize;
            let Some(&op) = self.programs[a].get(p.pc as usize) else {
                let app = &mut self.apps[a];
                app.finished += 1;
                if app.finished == app.processes {
                    app.end = Some(now);
                    self.apps_done += 1;
                }
                return;
            };
            if p.in_op {
                let (write, file, size, request, strided) = match op {
                    Op::Write {
                        file,
                        size,
                        request,
                        strided,
                    } => (true, file, size, request, strided),
                    Op::Read {
                        file,
                        size,
                        request,
                        strided,
                    } => (false, file, size, request, strided),
                    _ => unreachable!("in_op is only set on write/read statements"),
                };
                let app = &mut self.apps[a];
                if p.issued >= size {
                    let ph = &mut app.phases[p.phase as usize];
                    ph.end = ph.end.max(now);
                    ph.bytes += size;
                    ph.done += 1;
                    p.in_op = false;
                    p.pc += 1;
                    p.phase += 1;
                    continue;
                }
                let shared = app.shared[file as usize];
                let j = p.issued / request;
                let len = request.min(size - p.issued);
                let rank = u64::from(p.rank);
                let offset = match (shared, strided) {
                    (false, _) => p.op_base + p.issued,
                    (true, false) => p.op_base + rank * size + p.issued,
                    (true, true) => p.op_base + (j * u64::from(app.processes) + rank) * request,
                };
                p.issued += len;
                p.req_write = write;
                p.req_absorbed = false;
                p.req_file = file;
                p.req_next = offset;
                p.req_end = offset + len;
                p.req_pending = 0;
                self.q
                    .schedule(now + self.topo.lat_cn_ion, Ev::ReqAtIon(pid));
                return;
            }
            match op {
                Op::Compute { ns, jitter } => {
                    p.pc += 1;
                    let d = if jitter > 0.0 {
                        (ns as f64 * (1.0 + jitter * self.rng.next_f64())).round() as SimTime
                    } else {
                        ns
                    };
                    self.q.schedule(now + d, Ev::Proc(pid));
                    return;
                }
                Op::Write {
                    file,
                    size,
                    request,
                    strided,
                }
                | Op::Read {
                    file,
                    size,
                    request,
                    strided,
                } => {
                    let write = matches!(op, Op::Write { .. });
                    p.in_op = true;
                    p.issued = 0;
                    let app = &mut self.apps[a];
                    let k = p.phase as usize;
                    if k == app.phases.len() {
                        // The first process to reach this phase lays out its region.
                        let slot = 2 * file as usize + usize::from(!write);
                        let nprocs = u64::from(app.processes);
                        let region = match (app.shared[file as usize], strided) {
                            (false, _) => size,
                            (true, false) => size * nprocs,
                            (true, true) => size.div_ceil(request) * request * nprocs,
                        };
                        let base = app.cursor[slot];
                        app.cursor[slot] += region;
                        app.phases.push(Phase {
                            write,
                            base,
                            start: now,
                            end: now,
                            bytes: 0,
                            done: 0,
                        });
                    } else {
                        app.phases[k].start = app.phases[k].start.min(now);
                    }
                    p.op_base = app.phases[k].base;
                }
                Op::Barrier => {
                    p.pc += 1;
                    let app = &mut self.apps[a];
                    app.barrier_waiting += 1;
                    if app.barrier_waiting == app.processes {
                        app.barrier_waiting = 0;
                        let at = now + self.barrier_latency;
                        for q in app.first_pid..app.first_pid + app.processes {
                            self.q.schedule(at, Ev::Proc(q));
                        }
                    }
                    return;
                }
                Op::Commit { file } => {
                    p.pc += 1;
                    p.commit = file.map_or(Commit::All, Commit::File);
                    p.commit_start = now;
                    self.q
                        .schedule(now + self.topo.lat_cn_ion, Ev::CommitAtIon(pid));
                    return;
                }
                Op::Repeat { count, end } => {
                    if count == 0 {
                        p.pc = end + 1;
                    } else {
                        // The parser bounds nesting by MAX_REPEAT_DEPTH.
                        p.loops[p.depth as usize] = count;
                        p.depth += 1;
                        p.pc += 1;
                    }
                }
                Op::EndRepeat { start } => {
                    let top = p.depth as usize - 1;
                    p.loops[top] -= 1;
                    if p.loops[top] == 0 {
                        p.depth -= 1;
                        p.pc += 1;
                    } else {
                        p.pc = start + 1;
                    }
                }
            }
        }
    }

    fn req_at_ion(&mut self, pid: u32, now: SimTime) {
        let p = &mut self.procs[pid as usize];
        let ion = p.ion as usize;
        if p.req_write {
            let len = p.req_end - p.req_next;
            let app = &mut self.apps[p.app as usize];
            let st = &mut self.ions[ion];
            if self.bb_enabled && st.bb_used.saturating_add(len) <= self.bb_capacity {
                st.bb_used += len;
                p.req_absorbed = true;
                app.absorbed += len;
                self.bb_total_used += len;
                self.bb_peak = self.bb_peak.max(self.bb_total_used);
                self.series.occupancy(now, self.bb_total_used);
            } else {
                app.direct += len;
                if self.bb_enabled {
                    app.overflow += len;
                }
            }
        }
        self.ions[ion].admit.push_back(pid);
        self.admit(ion, now);
    }

    /// Moves pieces of waiting requests while the forwarding buffer has room, requests in
    /// arrival order and each request's pieces in file order; several requests are in flight
    /// at once as long as there is room. (Taking one piece of each request in turn would
    /// march all ranks through the same stripe index together and hit a fraction of the
    /// servers at a time, a hot spot of the model rather than of the storage.)
    fn admit(&mut self, ion: usize, now: SimTime) {
        let stripe = self.topo.stripe;
        let transfer = self.topo.transfer;
        loop {
            let st = &mut self.ions[ion];
            let Some(&pid) = st.admit.front() else {
                return;
            };
            let p = &mut self.procs[pid as usize];
            let stripe_end = (p.req_next / stripe + 1) * stripe;
            let len = transfer
                .min(stripe_end - p.req_next)
                .min(p.req_end - p.req_next);
            if st.credits < len as i64 && st.in_flight > 0 {
                return;
            }
            st.credits -= len as i64;
            st.in_flight += 1;
            let offset = p.req_next;
            p.req_next += len;
            p.req_pending += 1;
            if p.req_next == p.req_end {
                st.admit.pop_front();
            }
            let app = p.app;
            let file = p.req_file;
            let shared = self.apps[app as usize].shared[file as usize];
            let file_key = file_key(app as usize, file, (!shared).then_some(p.rank));
            let (kind, delay) = if p.req_write {
                let kind = if p.req_absorbed {
                    Kind::Absorb
                } else {
                    Kind::Direct
                };
                // The grant travels back to the CN before the data moves.
                (kind, self.topo.lat_cn_ion)
            } else if self.track_residency && st.resident.contains_key(&(file_key, offset / stripe))
            {
                (Kind::ReadBb, 0)
            } else {
                // The ION asks the file server for the data.
                (Kind::ReadPfs, self.topo.lat_ion_fs)
            };
            let cn = p.cn;
            self.new_piece(
                Piece {
                    route: Route {
                        hops: [0; topology::MAX_HOPS],
                        len: 0,
                    },
                    hop: 0,
                    kind,
                    app,
                    file,
                    bytes: len as u32,
                    owner: pid,
                    ion: ion as u32,
                    file_key,
                    offset,
                },
                cn,
                now + delay,
            );
        }
    }

    fn new_piece(&mut self, mut pc: Piece, cn: u32, at: SimTime) {
        let topo = &self.topo;
        let ion = pc.ion;
        let home = || topo.home(pc.file_key, pc.offset / topo.stripe);
        pc.route = match pc.kind {
            Kind::Absorb => topo.route_absorb(cn, ion),
            Kind::Direct => topo.route_direct(cn, ion, home()),
            Kind::Drain => topo.route_drain(ion, home()),
            Kind::ReadPfs => topo.route_read_pfs(cn, ion, home()),
            Kind::ReadBb => topo.route_read_bb(cn, ion),
        };
        let empty = pc.route.len == 0;
        let end_delay = self.end_delay(pc.kind);
        let id = self.pieces.insert(pc);
        if empty {
            self.q.schedule(at + end_delay, Ev::PieceEnd(id));
        } else {
            self.q.schedule(at, Ev::Hop(id));
        }
    }

    fn end_delay(&self, kind: Kind) -> SimTime {
        match kind {
            // The file server's acknowledgement travels back to the ION.
            Kind::Direct | Kind::Drain => self.topo.lat_ion_fs,
            _ => 0,
        }
    }

    fn hop(&mut self, id: u32, now: SimTime) {
        let pc = &mut self.pieces.items[id as usize];
        let h = pc.route.hops[pc.hop as usize];
        let read = h & topology::READ != 0;
        let res = &mut self.topo.res[(h & !topology::READ) as usize];
        let bytes = u64::from(pc.bytes);
        let busy_before = res.busy;
        let depart = res.serve(now, bytes, read);
        match res.class {
            Class::CnOut => self.series.cn(depart, pc.app as usize, bytes, false),
            Class::Lun => self
                .series
                .storage(depart, bytes, read, res.busy - busy_before),
            Class::Bb => self.series.bb(depart, bytes, read),
            _ => {}
        }
        let arrive = depart + res.latency;
        pc.hop += 1;
        if pc.hop < pc.route.len {
            self.q.schedule(arrive, Ev::Hop(id));
        } else {
            let kind = pc.kind;
            let at = arrive + self.end_delay(kind);
            self.q.schedule(at, Ev::PieceEnd(id));
        }
    }

    fn piece_end(&mut self, id: u32, now: SimTime) {
        let pc = self.pieces.items[id as usize];
        self.pieces.remove(id);
        let bytes = u64::from(pc.bytes);
        let ion = pc.ion as usize;
        match pc.kind {
            Kind::Drain => {
                self.drain_done(&pc, now);
                return;
            }
            Kind::Absorb => {
                let st = &mut self.ions[ion];
                st.dirty.push_back(Dirty {
                    proc: pc.owner,
                    app: pc.app,
                    file: pc.file,
                    bytes: pc.bytes,
                    file_key: pc.file_key,
                    offset: pc.offset,
                });
                if self.track_residency {
                    *st.resident
                        .entry((pc.file_key, pc.offset / self.topo.stripe))
                        .or_insert(0) += 1;
                }
                self.procs[pc.owner as usize].dirty += bytes;
                self.add_dirty_file(&pc, bytes as i64);
            }
            Kind::ReadPfs | Kind::ReadBb => {
                self.series.cn(now, pc.app as usize, bytes, true);
                let app = &mut self.apps[pc.app as usize];
                if pc.kind == Kind::ReadBb {
                    app.read_bb += bytes;
                } else {
                    app.read_pfs += bytes;
                }
            }
            Kind::Direct => {}
        }
        // The forwarding buffer space is free again.
        let st = &mut self.ions[ion];
        st.credits += bytes as i64;
        st.in_flight -= 1;
        let p = &mut self.procs[pc.owner as usize];
        p.req_pending -= 1;
        if p.req_pending == 0 && p.req_next == p.req_end {
            // Reads complete when the data is at the CN; writes when the ION's ack is.
            let at = if p.req_write {
                now + self.topo.lat_cn_ion
            } else {
                now
            };
            self.q.schedule(at, Ev::ReqDone(pc.owner));
        }
        if pc.kind == Kind::Absorb {
            self.pump_drain(ion, now);
        }
        self.admit(ion, now);
    }

    /// Per-file dirty bytes, for `commit FILE` (only kept by programs that use it).
    fn add_dirty_file(&mut self, pc: &Piece, delta: i64) {
        let app = &mut self.apps[pc.app as usize];
        if app.dirty_file.is_empty() {
            return;
        }
        let local = (pc.owner - app.first_pid) as usize;
        let slot = &mut app.dirty_file[local * app.files + pc.file as usize];
        *slot = slot.wrapping_add_signed(delta);
    }

    fn drain_done(&mut self, pc: &Piece, now: SimTime) {
        let bytes = u64::from(pc.bytes);
        let ion = pc.ion as usize;
        let st = &mut self.ions[ion];
        st.draining -= 1;
        st.bb_used -= bytes;
        if self.track_residency {
            let key = (pc.file_key, pc.offset / self.topo.stripe);
            if let Some(n) = st.resident.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    st.resident.remove(&key);
                }
            }
        }
        self.bb_total_used -= bytes;
        self.series.occupancy(now, self.bb_total_used);
        self.drained += bytes;
        self.last_drain = Some(now);
        let pid = pc.owner;
        self.procs[pid as usize].dirty -= bytes;
        self.add_dirty_file(pc, -(bytes as i64));
        if self.procs[pid as usize].commit != Commit::None && self.commit_satisfied(pid) {
            self.finish_commit(pid, now + self.topo.lat_cn_ion);
        }
        self.pump_drain(ion, now);
    }

    fn pump_drain(&mut self, ion: usize, now: SimTime) {
        loop {
            let st = &mut self.ions[ion];
            if st.draining >= self.drain_depth {
                return;
            }
            if self.drain_lazy && !st.forced && st.bb_used <= self.watermark {
                return;
            }
            let Some(d) = st.dirty.pop_front() else {
                st.forced = false;
                return;
            };
            st.draining += 1;
            self.new_piece(
                Piece {
                    route: Route {
                        hops: [0; topology::MAX_HOPS],
                        len: 0,
                    },
                    hop: 0,
                    kind: Kind::Drain,
                    app: d.app,
                    file: d.file,
                    bytes: d.bytes,
                    owner: d.proc,
                    ion: ion as u32,
                    file_key: d.file_key,
                    offset: d.offset,
                },
                0,
                now,
            );
        }
    }

    fn commit_satisfied(&self, pid: u32) -> bool {
        let p = &self.procs[pid as usize];
        match p.commit {
            Commit::None | Commit::All => p.dirty == 0,
            Commit::File(f) => {
                let app = &self.apps[p.app as usize];
                let local = (pid - app.first_pid) as usize;
                app.dirty_file[local * app.files + f as usize] == 0
            }
        }
    }

    fn commit_at_ion(&mut self, pid: u32, now: SimTime) {
        if self.commit_satisfied(pid) {
            self.finish_commit(pid, now + self.topo.lat_cn_ion);
        } else if self.drain_lazy {
            let ion = self.procs[pid as usize].ion as usize;
            self.ions[ion].forced = true;
            self.pump_drain(ion, now);
        }
    }

    fn finish_commit(&mut self, pid: u32, at: SimTime) {
        let p = &mut self.procs[pid as usize];
        p.commit = Commit::None;
        let wait = at - p.commit_start;
        let app = &mut self.apps[p.app as usize];
        app.commits += 1;
        app.commit_wait_total += wait;
        app.commit_wait_max = app.commit_wait_max.max(wait);
        self.q.schedule(at, Ev::Proc(pid));
    }

    fn finish(
        mut self,
        sys: &System,
        specs: &[AppSpec],
        placements: &[Placement],
        opts: &SimOptions,
        stopped_by: Stop,
        wall_s: f64,
    ) -> Outcome {
        let end = self.q.now();
        // A run that finished early still covers the requested window, so plots of several
        // runs share an axis and a quiet tail shows as zeros.
        self.series.close(end.max(opts.until.unwrap_or(0)).max(1));
        let gib = (1u64 << 30) as f64;
        let mut apps = Vec::new();
        let mut written = 0;
        for ((spec, pl), st) in specs.iter().zip(placements).zip(&self.apps) {
            let spans = |write: bool| -> Vec<(SimTime, SimTime)> {
                st.phases
                    .iter()
                    .filter(|p| p.write == write && p.done > 0)
                    .map(|p| (p.start, p.end))
                    .collect()
            };
            let all: Vec<(SimTime, SimTime)> = st
                .phases
                .iter()
                .filter(|p| p.done > 0)
                .map(|p| (p.start, p.end))
                .collect();
            let write_time = union_length(spans(true));
            let read_time = union_length(spans(false));
            let write_bytes: u64 = st.phases.iter().filter(|p| p.write).map(|p| p.bytes).sum();
            let read_bytes: u64 = st.phases.iter().filter(|p| !p.write).map(|p| p.bytes).sum();
            written += write_bytes;
            let rate = |bytes: u64, t: SimTime| {
                if t > 0 {
                    bytes as f64 / gib / secs(t)
                } else {
                    0.0
                }
            };
            let first_ion = self.topo.ion_of(pl.first_node);
            let last_ion = self.topo.ion_of(pl.first_node + pl.nodes - 1);
            apps.push(AppReport {
                name: spec.name.clone(),
                origin: spec.origin.clone(),
                processes: pl.processes,
                per_node: pl.per_node,
                first_node: pl.first_node,
                nodes: pl.nodes,
                ions: last_ion - first_ion + 1,
                finished: st.end.is_some(),
                runtime_s: st.end.map(secs),
                write_bytes,
                read_bytes,
                io_time_s: secs(union_length(all)),
                write_time_s: secs(write_time),
                read_time_s: secs(read_time),
                perceived_write_gib_s: rate(write_bytes, write_time),
                perceived_read_gib_s: rate(read_bytes, read_time),
                io_phases: st.phases.len() as u64,
                bb_absorbed_bytes: st.absorbed,
                direct_write_bytes: st.direct,
                bb_overflow_bytes: st.overflow,
                read_from_bb_bytes: st.read_bb,
                read_from_pfs_bytes: st.read_pfs,
                commits: st.commits,
                commit_wait_max_s: secs(st.commit_wait_max),
                commit_wait_mean_s: if st.commits > 0 {
                    secs(st.commit_wait_total) / st.commits as f64
                } else {
                    0.0
                },
            });
        }
        let luns = self.topo.lun_range();
        let lun_busy: u64 = self.topo.res[luns.clone()].iter().map(|r| r.busy).sum();
        let (pfs_written, pfs_read) = self.series.bins.iter().fold((0, 0), |(w, r), b| {
            (w + b.storage_write_bytes, r + b.storage_read_bytes)
        });
        let absorbed: u64 = self.apps.iter().map(|a| a.absorbed).sum();
        let events = self.q.processed();
        Outcome {
            report: Report {
                schema: crate::report::SCHEMA.to_string(),
                system: SystemSummary::of(sys),
                apps,
                totals: Totals {
                    simulated_s: secs(end),
                    stopped_by: match stopped_by {
                        Stop::Completed => "completed",
                        Stop::Until => "until",
                        Stop::AppsDone => "apps_done",
                    }
                    .to_string(),
                    apps_written_bytes: written,
                    pfs_written_bytes: pfs_written,
                    pfs_read_bytes: pfs_read,
                    bb_absorbed_bytes: absorbed,
                    bb_drained_bytes: self.drained,
                    bb_left_bytes: self.bb_total_used,
                    bb_peak_occupancy_bytes: self.bb_peak,
                    last_drain_s: self.last_drain.map(secs),
                    lun_utilization: if end > 0 {
                        lun_busy as f64 / (end as f64 * luns.len() as f64)
                    } else {
                        0.0
                    },
                },
                engine: EngineStats {
                    seed: opts.seed,
                    events,
                    wall_s,
                    events_per_s: if wall_s > 0.0 {
                        events as f64 / wall_s
                    } else {
                        0.0
                    },
                    peak_queue: self.q.peak_len() as u64,
                    processes: self.procs.len() as u64,
                },
            },
            series: self.series,
        }
    }
}

/// A file's identity: the application, the file, and the rank for per-process files.
fn file_key(app: usize, file: u16, rank: Option<u32>) -> u64 {
    ((app as u64) << 48) | (u64::from(file) << 40) | rank.map_or(0, |r| u64::from(r) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_state_stays_small() {
        // Every request and piece touches a process and a piece; at 131,072 processes their
        // size decides how much of the run misses the cache (docs/SIM.md, Performance).
        assert!(
            std::mem::size_of::<Proc>() <= 128,
            "{}",
            std::mem::size_of::<Proc>()
        );
        assert!(
            std::mem::size_of::<Piece>() <= 96,
            "{}",
            std::mem::size_of::<Piece>()
        );
        assert_eq!(std::mem::size_of::<Ev>(), 8);
    }
}
