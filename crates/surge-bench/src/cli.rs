//! The `surge bench` verbs: flags (IOR's and mdtest's names where they have one), help texts,
//! and output (tables on a terminal, `--json` for scripts). The measuring is done elsewhere.

use crate::backend::{self, BACKENDS};
use crate::calibrate::{self, CalibrateSpec, DirectMode};
use crate::ior::IoParams;
use crate::mdtest::MdParams;
use crate::plot::sweep_svg;
use crate::report::{params_text, report_text};
use crate::run::{run_io, run_md, Report, RunContext};
use crate::sweep::{
    parse_procs_list, phases_of, run_sweep, table_header, table_row, to_csv, Metric, Scaling,
    SweepPoint, SweepSpec,
};
use crate::workers::{self, Job, WorkerCommand};
use anyhow::{anyhow, Context};
use clap::{Args, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn size(text: &str) -> Result<u64, String> {
    surge_core::parse_size(text).map_err(|e| e.to_string())
}

/// A `--procs` list as typed: `1,2,4,8` or `1-32`.
#[derive(Clone, Debug)]
pub struct ProcsList(pub Vec<u32>);

fn procs_list(text: &str) -> Result<ProcsList, String> {
    parse_procs_list(text).map(ProcsList)
}

/// Measure bandwidth, IOPS and metadata rates of any path (IOR- and mdtest-style).
#[derive(Args, Debug)]
#[command(
    long_about = "Measure a storage target the way IOR and mdtest do: bandwidth at large \
transfers, IOPS at small ones (optionally with fsync per write), and metadata rates (create, \
stat, open/close, remove), each with N separate processes started together behind a barrier. \
Works on any directory: a Surge mount, the PFS, a local disk, /dev/shm.\n\n\
`sweep` runs one configuration over process counts and draws the curve (Daley et al. Figures \
3-5); `calibrate` finds the peaks and writes the peaks file that `surge profile` and `surge \
advise` read.\n\n\
Every verb checks the path before writing (exists, writable, enough space) and removes its \
files when done, on error, and on Ctrl-C.",
    after_help = "Examples:\n  \
surge bench io /dev/shm --procs 4 --transfer 8MiB --block 256MiB\n  \
surge bench io /mnt/bb --transfer 4KiB --block 64MiB --random --fsync-per-write\n  \
surge bench md /mnt/bb --procs 8 --files 2000\n  \
surge bench sweep /mnt/bb --preset bandwidth --procs 1-16\n  \
surge bench calibrate /mnt/bb --out peaks.json"
)]
pub struct BenchArgs {
    // Variants are boxed so the `surge` Command enum stays small (clippy large_enum_variant).
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// IOR-style bandwidth/IOPS test: write then read, N processes, per-phase MiB/s, IOPS, latency.
    Io(Box<IoArgs>),
    /// mdtest-style metadata test: create, stat, open/close, remove; ops/s per phase.
    Md(Box<MdArgs>),
    /// Run one configuration over process counts; print the curve, write JSON, CSV and SVG.
    Sweep(Box<SweepArgs>),
    /// Find peak bandwidth, IOPS and metadata rate; write the peaks file for profile/advise.
    Calibrate(Box<CalibrateArgs>),
    /// Haider's normalised metric: targets' throughput / a baseline's (the PFS), on one grid.
    Compare(Box<CompareArgs>),
    /// Internal: one benchmark process, driven by its parent over stdin/stdout.
    #[command(hide = true)]
    Worker,
}

/// Options every verb shares.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Print the full result as JSON on stdout (no table).
    #[arg(long)]
    pub json: bool,
    /// Keep the benchmark files instead of removing them (IOR -k); the report says where.
    #[arg(long, short = 'k')]
    pub keep: bool,
    /// Storage interface to drive (IOR's -a). `posix` uses the kernel file system path;
    /// `mpiio` (io only) runs MPI ranks under mpirun doing MPI-IO, with $ROMIO_HINTS.
    #[arg(long, default_value = "posix", value_parser = clap::builder::PossibleValuesParser::new(BACKENDS.iter().copied().chain(["mpiio"])))]
    pub backend: String,
}

impl CommonArgs {
    fn context(&self) -> anyhow::Result<RunContext> {
        if self.backend == "mpiio" {
            anyhow::bail!(
                "the mpiio backend runs `surge bench io` only (md, sweep and calibrate use posix)"
            );
        }
        let backend = backend::by_name(&self.backend)
            .ok_or_else(|| anyhow!("unknown backend '{}'", self.backend))?;
        Ok(RunContext {
            backend,
            worker: WorkerCommand::current_exe()?,
            keep: self.keep,
            progress: true,
        })
    }
}

/// Data options shared by `io` and `sweep`.
#[derive(Args, Debug, Clone)]
pub struct IoOptions {
    /// One file shared by all processes (IOR default) instead of a file per process (IOR -F).
    /// Process r's block of segment s sits at offset (s*procs + r)*block.
    #[arg(long)]
    pub shared_file: bool,
    /// Random offsets (IOR -z): every transfer of the block visited once, in shuffled order.
    #[arg(long, short = 'z')]
    pub random: bool,
    /// fsync after every write (IOR -Y, Daley's fsyncPerWrite).
    #[arg(long, short = 'Y')]
    pub fsync_per_write: bool,
    /// fsync before close in the write phase, inside the timed interval (IOR -e).
    #[arg(long, short = 'e')]
    pub fsync: bool,
    /// O_DIRECT: bypass the client page cache. Transfer and block must be multiples of 4 KiB.
    /// tmpfs (/dev/shm) does not support it and is refused with an error.
    #[arg(long)]
    pub direct: bool,
    /// Read back your own data instead of the next process's (disables IOR -C reordering).
    #[arg(long)]
    pub no_reorder: bool,
    /// Drop each file from the page cache before the read phase (fsync + fadvise DONTNEED, as
    /// fio's invalidate=1), so buffered reads come from storage.
    #[arg(long)]
    pub drop_cache: bool,
    /// Check that every transfer read holds the stamp its writer put there (IOR -R).
    #[arg(long)]
    pub verify: bool,
    /// Time the write phase only (IOR -w).
    #[arg(long, conflicts_with = "read_only")]
    pub write_only: bool,
    /// Time the read phase only (IOR -r); the files are laid out first, untimed.
    #[arg(long)]
    pub read_only: bool,
    /// Repetitions (IOR -i); results show min/mean/max over them.
    #[arg(long, short = 'i', default_value_t = 1)]
    pub repetitions: u32,
    /// Stop each phase after SECS seconds (IOR -D stonewalling); rates count what was moved.
    #[arg(long, short = 'D', value_name = "SECS")]
    pub deadline: Option<f64>,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 0x5eed, hide_short_help = true)]
    pub seed: u64,
}

impl IoOptions {
    fn apply(&self, p: &mut IoParams) {
        p.shared_file = self.shared_file;
        p.random = self.random;
        p.fsync_per_write = self.fsync_per_write;
        p.fsync = self.fsync;
        p.direct = self.direct;
        p.reorder = !self.no_reorder;
        p.drop_cache = self.drop_cache;
        p.verify = self.verify;
        p.write = !self.read_only;
        p.read = !self.write_only;
        p.repetitions = self.repetitions;
        p.deadline_s = self.deadline;
        p.seed = self.seed;
    }
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
surge bench io /dev/shm --procs 2 --transfer 8MiB --block 512MiB -i 3\n  \
surge bench io /tmp --direct --random --transfer 4KiB --block 256MiB --procs 2\n  \
surge bench io /mnt/bb --shared-file --segments 4 --verify --json\n  \
surge bench io /mnt/bb --backend mpiio --procs 4 --shared-file --collective -t 1MiB -b 16MiB\n  \
ROMIO_HINTS=hints OMPI_MCA_io=romio321 surge bench io /mnt/bb --backend mpiio -n 4 --shared-file -c")]
pub struct IoArgs {
    /// Directory to benchmark in (a subdirectory is created and removed).
    pub path: PathBuf,
    /// Bytes per I/O call (IOR -t), e.g. 8MiB, 4KiB.
    #[arg(long, short = 't', default_value = "8MiB", value_parser = size)]
    pub transfer: u64,
    /// Bytes per process per segment (IOR -b); a multiple of --transfer.
    #[arg(long, short = 'b', default_value = "64MiB", value_parser = size)]
    pub block: u64,
    /// Blocks per process (IOR -s).
    #[arg(long, short = 's', default_value_t = 1)]
    pub segments: u64,
    /// Separate processes started together behind a barrier (IOR's MPI ranks).
    #[arg(long, short = 'n', default_value_t = 1)]
    pub procs: u32,
    /// With --backend mpiio: collective I/O (MPI_File_write_at_all, IOR -c) instead of
    /// independent.
    #[arg(long, short = 'c')]
    pub collective: bool,
    #[command(flatten)]
    pub io: IoOptions,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MdPhaseArg {
    Stat,
    OpenClose,
    Remove,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
surge bench md /dev/shm --procs 4 --files 5000\n  \
surge bench md /mnt/bb --shared-dir --procs 8 --files 1000 --json")]
pub struct MdArgs {
    /// Directory to benchmark in (a subdirectory is created and removed).
    pub path: PathBuf,
    /// Files per process (mdtest -n).
    #[arg(long, short = 'f', default_value_t = 1000)]
    pub files: u64,
    /// Separate processes started together behind a barrier.
    #[arg(long, short = 'n', default_value_t = 1)]
    pub procs: u32,
    /// All processes create in one shared directory (default: one directory per process, mdtest -u).
    #[arg(long)]
    pub shared_dir: bool,
    /// Bytes written into each file at create (mdtest -w).
    #[arg(long, default_value = "0", value_parser = size)]
    pub write_bytes: u64,
    /// Bytes read in the open-close phase (mdtest -e); at most --write-bytes.
    #[arg(long, default_value = "0", value_parser = size)]
    pub read_bytes: u64,
    /// Phases after create (create always runs). Files not removed by a phase are removed after.
    #[arg(long, value_delimiter = ',', default_value = "stat,open-close,remove")]
    pub phases: Vec<MdPhaseArg>,
    /// Repetitions; results show min/mean/max over them.
    #[arg(long, short = 'i', default_value_t = 1)]
    pub repetitions: u32,
    /// Stop the create phase after SECS seconds (mdtest -W); later phases use what was created.
    #[arg(long, short = 'D', value_name = "SECS")]
    pub deadline: Option<f64>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Daley Figure 3: sequential 8 MiB transfers, write and read, file per process.
    Bandwidth,
    /// Daley Figure 4: 4 KiB transfers, write and read.
    Iops,
    /// Daley Figure 4's synchronized curve: 4 KiB writes with fsync after each.
    IopsFsync,
    /// Daley Figure 5: mdtest create, stat, open/close, remove.
    Metadata,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Strong scaling (the default, as Daley): the aggregate size or file \
count stays fixed and is divided among the processes. Weak scaling: give --block or \
--files-per-proc instead.\n\nExamples:\n  \
surge bench sweep /dev/shm --preset bandwidth --procs 1,2,4,8\n  \
surge bench sweep /mnt/bb --preset iops --random --procs 1-32 --aggregate 1GiB\n  \
surge bench sweep /mnt/bb --preset metadata --procs 1-32 --files 65536 --out md-curve"
)]
pub struct SweepArgs {
    /// Directory to benchmark in.
    pub path: PathBuf,
    /// Process counts: a list (1,2,4,8) or a range of powers of two (1-32).
    #[arg(long, short = 'n', value_parser = procs_list)]
    pub procs: ProcsList,
    /// The configuration to sweep.
    #[arg(long, value_enum, default_value = "bandwidth")]
    pub preset: Preset,
    /// Transfer size (default 8MiB for bandwidth, 4KiB for IOPS presets).
    #[arg(long, short = 't', value_parser = size)]
    pub transfer: Option<u64>,
    /// Total bytes over all processes (strong scaling); default 1GiB (bandwidth), 256MiB (IOPS).
    #[arg(long, value_parser = size, conflicts_with = "block")]
    pub aggregate: Option<u64>,
    /// Bytes per process (weak scaling) instead of a fixed aggregate.
    #[arg(long, short = 'b', value_parser = size)]
    pub block: Option<u64>,
    /// Total files over all processes for the metadata preset (strong scaling).
    #[arg(long, default_value_t = 16384, conflicts_with = "files_per_proc")]
    pub files: u64,
    /// Files per process for the metadata preset (weak scaling).
    #[arg(long)]
    pub files_per_proc: Option<u64>,
    /// Metadata preset: all processes in one directory.
    #[arg(long)]
    pub shared_dir: bool,
    /// Output files: PREFIX.json, PREFIX.csv, PREFIX.svg (default surge-sweep-<preset>).
    #[arg(long, value_name = "PREFIX")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub io: IoOptions,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "The peaks file schema (surge.peaks/1) is documented in docs/peaks.md.\n\n\
Examples:\n  \
surge bench calibrate /dev/shm --out shm-peaks.json\n  \
surge bench calibrate /mnt/bb --max-procs 32 --deadline 5 --out peaks.json --curves bb"
)]
pub struct CalibrateArgs {
    /// Directory to calibrate.
    pub path: PathBuf,
    /// Write the peaks file here (the JSON that surge profile and surge advise read).
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Also write each curve as PREFIX-{bandwidth,iops,iops-fsync,metadata}.{json,csv,svg}.
    #[arg(long, value_name = "PREFIX")]
    pub curves: Option<PathBuf>,
    /// Largest process count to try (default: 4 x CPUs, at most 64).
    #[arg(long)]
    pub max_procs: Option<u32>,
    /// Aggregate size of the bandwidth sweep (8 MiB sequential).
    #[arg(long, default_value = "2GiB", value_parser = size)]
    pub bw_aggregate: u64,
    /// Aggregate size of the IOPS sweep (4 KiB random).
    #[arg(long, default_value = "512MiB", value_parser = size)]
    pub iops_aggregate: u64,
    /// Total files of the metadata sweep.
    #[arg(long, default_value_t = 32768)]
    pub md_files: u64,
    /// Stonewall: each phase stops after SECS seconds.
    #[arg(long, short = 'D', default_value_t = 3.0, value_name = "SECS")]
    pub deadline: f64,
    /// O_DIRECT for data sweeps: auto uses it where the file system supports it.
    #[arg(long, value_enum, default_value = "auto")]
    pub direct: DirectMode,
    /// A curve has flattened when two more process counts gain less than this fraction.
    #[arg(long, default_value_t = 0.05)]
    pub flat_gain: f64,
    /// Repetitions per point.
    #[arg(long, short = 'i', default_value_t = 1)]
    pub repetitions: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Entry point of `surge bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Io(a) => cmd_io(*a),
        BenchCommand::Md(a) => cmd_md(*a),
        BenchCommand::Sweep(a) => cmd_sweep(*a),
        BenchCommand::Calibrate(a) => cmd_calibrate(*a),
        BenchCommand::Compare(a) => cmd_compare(*a),
        BenchCommand::Worker => {
            workers::worker_main()?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn finish_report(r: &Report, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        print_json(r)?;
    } else {
        print!("{}", report_text(r));
    }
    let bad: u64 = r.summary.iter().map(|s| s.verify_errors).sum();
    if bad > 0 {
        eprintln!("surge: error: verification failed for {bad} transfers");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_io(a: IoArgs) -> anyhow::Result<ExitCode> {
    let mut p = IoParams {
        transfer: a.transfer,
        block: a.block,
        segments: a.segments,
        procs: a.procs,
        ..IoParams::default()
    };
    a.io.apply(&mut p);
    if a.common.backend == "mpiio" {
        let r = crate::mpiio::run_io_mpiio(&a.path, &p, a.collective, a.common.keep)?;
        return finish_report(&r, a.common.json);
    }
    anyhow::ensure!(
        !a.collective,
        "--collective is MPI-IO's collective I/O: use it with --backend mpiio"
    );
    let ctx = a.common.context()?;
    let r = run_io(&ctx, &a.path, &p)?;
    finish_report(&r, a.common.json)
}

fn cmd_md(a: MdArgs) -> anyhow::Result<ExitCode> {
    let p = MdParams {
        files: a.files,
        procs: a.procs,
        shared_dir: a.shared_dir,
        write_bytes: a.write_bytes,
        read_bytes: a.read_bytes,
        stat: a.phases.contains(&MdPhaseArg::Stat),
        open_close: a.phases.contains(&MdPhaseArg::OpenClose),
        remove: a.phases.contains(&MdPhaseArg::Remove),
        repetitions: a.repetitions,
        deadline_s: a.deadline,
    };
    let ctx = a.common.context()?;
    let r = run_md(&ctx, &a.path, &p)?;
    finish_report(&r, a.common.json)
}

/// Builds the sweep's configuration from a preset and the overrides.
fn sweep_spec(a: &SweepArgs) -> anyhow::Result<SweepSpec> {
    let procs = a.procs.0.clone();
    if procs.is_empty() {
        return Err(anyhow!(
            "give the process counts with --procs, e.g. --procs 1,2,4,8"
        ));
    }
    let (title, template, scaling, metric) = match a.preset {
        Preset::Metadata => {
            let t = MdParams {
                files: a.files_per_proc.unwrap_or(1),
                shared_dir: a.shared_dir,
                repetitions: a.io.repetitions,
                deadline_s: a.io.deadline,
                ..MdParams::default()
            };
            let scaling = match a.files_per_proc {
                Some(_) => Scaling::Weak,
                None => Scaling::Strong { total: a.files },
            };
            (
                "MDTest operation throughput",
                Job::Md(t),
                scaling,
                Metric::MetadataOps,
            )
        }
        preset => {
            let (title, transfer, total, metric) = match preset {
                Preset::Bandwidth => ("IOR bandwidth", 8 << 20, 1 << 30, Metric::Bandwidth),
                _ => ("IOR IOPS", 4096, 256 << 20, Metric::Iops),
            };
            let mut t = IoParams {
                transfer: a.transfer.unwrap_or(transfer),
                procs: 1,
                ..IoParams::default()
            };
            a.io.apply(&mut t);
            if preset == Preset::IopsFsync {
                t.fsync_per_write = true;
                t.read = false;
                t.write = true;
            }
            let scaling = match a.block {
                Some(b) => {
                    t.block = b;
                    Scaling::Weak
                }
                None => Scaling::Strong {
                    total: a.aggregate.unwrap_or(total),
                },
            };
            let title = format!(
                "{title} at {} transfers{}",
                surge_core::format_bytes(t.transfer),
                if t.fsync_per_write {
                    " with fsync per write"
                } else {
                    ""
                }
            );
            return Ok(SweepSpec {
                title,
                procs,
                template: Job::Io(t),
                scaling,
                metric,
            });
        }
    };
    Ok(SweepSpec {
        title: title.to_string(),
        procs,
        template,
        scaling,
        metric,
    })
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn with_ext(prefix: &Path, ext: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!(".{ext}"));
    PathBuf::from(s)
}

/// Writes PREFIX.json, PREFIX.csv and PREFIX.svg; returns their paths.
fn write_sweep_files(prefix: &Path, r: &crate::sweep::SweepResult) -> anyhow::Result<Vec<PathBuf>> {
    let files = vec![
        (
            with_ext(prefix, "json"),
            serde_json::to_string_pretty(r)? + "\n",
        ),
        (with_ext(prefix, "csv"), to_csv(r)),
        (with_ext(prefix, "svg"), sweep_svg(r)),
    ];
    for (p, text) in &files {
        write_file(p, text)?;
    }
    Ok(files.into_iter().map(|(p, _)| p).collect())
}

fn cmd_sweep(a: SweepArgs) -> anyhow::Result<ExitCode> {
    let spec = sweep_spec(&a)?;
    let ctx = a.common.context()?;
    let json = a.common.json;
    if !json {
        println!("surge bench sweep: {} on {}", spec.title, a.path.display());
        let first = crate::sweep::point_params(&spec, spec.procs[0])?;
        print!("{}", params_text(&first));
        match spec.scaling {
            Scaling::Strong { total } => println!(
                "  strong scaling: {} in total, divided among the processes",
                match spec.template {
                    Job::Io(_) => surge_core::format_bytes(total),
                    Job::Md(_) => format!("{total} files"),
                }
            ),
            Scaling::Weak => println!("  weak scaling: fixed work per process"),
        }
        println!();
    }
    let mut header_done = false;
    let mut on_point = |p: &SweepPoint| {
        if json {
            return;
        }
        let phases = phases_of(std::slice::from_ref(p));
        if !header_done {
            println!("{}", table_header(spec.metric, &phases));
            header_done = true;
        }
        println!("{}", table_row(spec.metric, &phases, p));
    };
    let result = run_sweep(&ctx, &a.path, &spec, &mut on_point)?;
    let preset = format!("{:?}", a.preset).to_lowercase();
    let prefix = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("surge-sweep-{preset}")));
    let written = write_sweep_files(&prefix, &result)?;
    if json {
        print_json(&result)?;
    } else {
        for n in &result.notes {
            println!("note: {n}");
        }
        println!(
            "\nwrote {}",
            written
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn default_max_procs() -> u32 {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    (4 * cpus).clamp(4, 64)
}

fn cmd_calibrate(a: CalibrateArgs) -> anyhow::Result<ExitCode> {
    let spec = CalibrateSpec {
        max_procs: a.max_procs.unwrap_or_else(default_max_procs),
        bw_total: a.bw_aggregate,
        iops_total: a.iops_aggregate,
        md_files: a.md_files,
        deadline_s: a.deadline,
        direct: a.direct,
        flat_gain: a.flat_gain,
        repetitions: a.repetitions,
    };
    let ctx = a.common.context()?;
    let json = a.common.json;
    if !json {
        println!(
            "surge bench calibrate: {} (up to {} processes, {}s per phase, flat below +{:.0}%)",
            a.path.display(),
            spec.max_procs,
            spec.deadline_s,
            spec.flat_gain * 100.0
        );
    }
    let mut current = String::new();
    let mut on_point = |title: &str, p: &SweepPoint| {
        if json {
            return;
        }
        if current != title {
            println!("\n{title}");
            current = title.to_string();
        }
        let cells: Vec<String> = p
            .phases
            .iter()
            .map(|x| {
                if x.phase.is_data() && title.starts_with("Bandwidth") {
                    format!("{} {:.1} MiB/s", x.phase.name(), x.mib_per_s.mean)
                } else {
                    format!("{} {:.0}/s", x.phase.name(), x.ops_per_s.mean)
                }
            })
            .collect();
        println!("  procs {:>3}: {}", p.procs, cells.join("  "));
    };
    let report = calibrate::calibrate(&ctx, &a.path, &spec, &mut on_point)?;
    if let Some(out) = &a.out {
        calibrate::write_peaks(out, &report.peaks)?;
    }
    let mut curve_files = Vec::new();
    if let Some(prefix) = &a.curves {
        let mut curves = vec![
            ("bandwidth", &report.bandwidth),
            ("iops", &report.iops),
            ("metadata", &report.metadata),
        ];
        if let Some(f) = &report.iops_fsync {
            curves.push(("iops-fsync", f));
        }
        for (name, s) in curves {
            let mut p = prefix.as_os_str().to_owned();
            p.push(format!("-{name}"));
            curve_files.extend(write_sweep_files(Path::new(&p), s)?);
        }
    }
    if json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let pk = &report.peaks;
    let gib = (1u64 << 30) as f64;
    println!(
        "\nPeaks of {} ({}):",
        pk.path,
        if report.direct {
            "O_DIRECT"
        } else {
            "buffered"
        }
    );
    println!(
        "  read bandwidth   {:>10.2} GiB/s  at {} procs",
        pk.read_bw / gib,
        pk.procs_at_peak.read_bw
    );
    println!(
        "  write bandwidth  {:>10.2} GiB/s  at {} procs",
        pk.write_bw / gib,
        pk.procs_at_peak.write_bw
    );
    println!(
        "  read IOPS        {:>10.0}        at {} procs",
        pk.read_iops, pk.procs_at_peak.read_iops
    );
    println!(
        "  write IOPS       {:>10.0}        at {} procs",
        pk.write_iops, pk.procs_at_peak.write_iops
    );
    println!(
        "  write IOPS fsync {:>10.0}        at {} procs (an fsync after every write)",
        pk.write_iops_fsync, pk.procs_at_peak.write_iops_fsync
    );
    println!(
        "  metadata ops/s   {:>10.0}        at {} procs (create {:.0}, stat {:.0}, open-close {:.0}, remove {:.0})",
        pk.metadata_ops,
        pk.procs_at_peak.metadata_ops,
        pk.metadata_detail.create,
        pk.metadata_detail.stat,
        pk.metadata_detail.open_close,
        pk.metadata_detail.remove
    );
    for n in &report.notes {
        println!("note: {n}");
    }
    match &a.out {
        Some(out) => println!("\nwrote {}", out.display()),
        None => println!("\n(not saved: add --out peaks.json to write the peaks file)"),
    }
    if !curve_files.is_empty() {
        println!(
            "wrote {}",
            curve_files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn sizes_list(text: &str) -> Result<SizesList, String> {
    text.split(',')
        .map(|t| size(t.trim()))
        .collect::<Result<Vec<u64>, String>>()
        .map(SizesList)
}

/// A list of sizes as typed: `4KiB,1MiB,8MiB`.
#[derive(Clone, Debug)]
pub struct SizesList(pub Vec<u64>);

/// Haider et al.'s normalised metric (seed 004, §III): the same IOR grid (process counts x
/// transfer sizes, write then read, file per process, fsync before close and the page cache
/// dropped before reading) on each TARGET and on the BASELINE directory of the same system
/// (the PFS), and each target's throughput divided by the baseline's at each point. Above 1:
/// the target's architecture (device, interconnect, file system) beats the baseline's for
/// that kind of I/O; the trend over processes and transfer sizes is what the paper reads.
/// At each point the sides run one after the other, their order rotating from point to point.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
surge bench compare --baseline pfs=/pfs/scratch/me local=$DW_JOB_STRIPED/local pooled=$DW_JOB_STRIPED/pooled\n  \
surge bench compare --baseline /pfs/x /mnt/bb --procs 1,2,4 --transfers 4KiB,64KiB,1MiB,8MiB --json\n\n\
Placements on a Surge instance are layouts: `surge layout set DIR --stripe-count 1` (local: each \
file on one fragment, on the writer's host where it has one), `--stripe-count all` (pooled: \
every file over every fragment). bench/haider.sh runs both against the slow PFS.")]
pub struct CompareArgs {
    /// Targets to compare with the baseline: NAME=DIR or DIR.
    #[arg(required = true, value_parser = crate::compare::parse_side)]
    pub targets: Vec<crate::compare::Side>,
    /// The baseline (Haider's "disk": the PFS of the same system): NAME=DIR or DIR.
    #[arg(long, value_parser = crate::compare::parse_side)]
    pub baseline: crate::compare::Side,
    /// Process counts: a list (1,2,4) or a range of powers of two (1-8).
    #[arg(long, short = 'n', default_value = "1,2,4", value_parser = procs_list)]
    pub procs: ProcsList,
    /// Transfer sizes.
    #[arg(long, short = 't', default_value = "4KiB,64KiB,1MiB,8MiB", value_parser = sizes_list)]
    pub transfers: SizesList,
    /// Bytes over all processes at each point (divided among them).
    #[arg(long, default_value = "256MiB", value_parser = size)]
    pub aggregate: u64,
    /// Stop each phase after SECS seconds (IOR -D stonewalling).
    #[arg(long, short = 'D', value_name = "SECS", default_value_t = 5.0)]
    pub deadline: f64,
    /// Measure buffered I/O as it comes (no fsync before close, no cache drop before reads).
    #[arg(long)]
    pub buffered: bool,
    /// Print the result as JSON on stdout (no table).
    #[arg(long)]
    pub json: bool,
}

fn cmd_compare(a: CompareArgs) -> anyhow::Result<ExitCode> {
    let ctx = RunContext {
        backend: backend::by_name("posix").ok_or_else(|| anyhow!("no posix backend"))?,
        worker: WorkerCommand::current_exe()?,
        keep: false,
        progress: !a.json,
    };
    let spec = crate::compare::CompareSpec {
        baseline: a.baseline,
        targets: a.targets,
        procs: a.procs.0,
        transfers: a.transfers.0,
        aggregate: a.aggregate,
        fsync: !a.buffered,
        drop_cache: !a.buffered,
        deadline_s: (a.deadline > 0.0).then_some(a.deadline),
    };
    let total = spec.procs.len() * spec.transfers.len();
    let mut done = 0usize;
    let json = a.json;
    let r = crate::compare::compare(&ctx, &spec, &mut |p| {
        if p.phase == "read" {
            done += 1;
            if !json {
                eprintln!(
                    "surge bench compare: {done}/{total} points ({} processes, {} transfers)",
                    p.procs,
                    surge_core::format_bytes(p.transfer)
                );
            }
        }
    })?;
    if json {
        print_json(&r)?;
    } else {
        print!("{}", crate::compare::report_text(&r));
    }
    Ok(ExitCode::SUCCESS)
}
