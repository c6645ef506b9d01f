//! Flags and output of `surge profile` and `surge advise`. The binary calls [`run_profile`] and
//! [`run_advise`]; everything they do is in the library modules.

use crate::advise::{advise, AdviseRequest, Coupling};
use crate::import::{self, Format};
use crate::model::Profile;
use crate::report;
use crate::run::{profile_command, RunRequest};
use crate::tables::{summarize, Summary};
use anyhow::Context;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use surge_core::peaks::Peaks;

/// Record the I/O of a command and say whether it is bandwidth-, IOPS- or metadata-bound.
#[derive(clap::Args, Debug)]
#[command(
    long_about = "Runs a command (a workflow stage) under Surge's interposition library, which counts \
every open, read, write, stat, sync, unlink, rename, mkdir and readdir call and every stdio call of \
the command, its threads and its child processes, per file, with the time each took. It then prints \
Daley's tables for the stage (Table 1: resources; Table 2: performance, and with --peaks the percent \
of the calibrated peaks and the pipelines that saturate them; Table 3: data movement) and a verdict: \
bandwidth-bound, IOPS-bound or metadata-bound, with the numbers that decided it.\n\n\
Instead of running a command, --from reads what you already have: an strace -f -T -tt log, a \
Darshan log (binary, through darshan-parser or PyDarshan, or darshan-parser text output), or a \
profile saved earlier with -o.\n\n\
The exit code is the command's (128+N if a signal N killed it); the profile is produced either way, \
even if the command crashed.",
    after_help = "Examples:\n  \
surge profile --stage camp-builddb --data-path ./run -o camp.json -- python3 builddb.py run/db\n  \
surge profile --peaks bb-peaks.json --html report.html -- ./swarp resample in/ out/\n  \
strace -f -T -tt -o trace.txt ./job.sh && surge profile --from trace.txt\n  \
surge profile --from job.darshan --json > job-profile.json\n\n\
The JSON schema and how the verdict is decided: docs/PROFILE.md"
)]
pub struct ProfileArgs {
    /// Name of the workflow stage (default: the command's or the file's base name).
    #[arg(long, value_name = "NAME")]
    pub stage: Option<String>,

    /// A directory holding the user's scientific data (repeatable): Table 3's "user I/O" is
    /// the I/O to files under these prefixes; `surge advise` stages only these.
    #[arg(long = "data-path", value_name = "PREFIX")]
    pub data_paths: Vec<PathBuf>,

    /// Calibrated peaks from `surge bench calibrate`: adds % of peak and pipelines to saturate.
    #[arg(long, value_name = "PEAKS.json")]
    pub peaks: Option<PathBuf>,

    /// Read this file instead of running a command (strace log, Darshan log or saved profile).
    #[arg(long, value_name = "FILE", conflicts_with = "command")]
    pub from: Option<PathBuf>,

    /// Format of --from (default: detected from the content).
    #[arg(long, value_enum, default_value = "auto", requires = "from")]
    pub format: Format,

    /// Save the profile (JSON, schema surge.profile/1) here, for `surge advise`.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Print the profile and its tables as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Write a self-contained HTML report (tables, I/O over time, transfer sizes).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,

    /// Keep the raw per-process record files in this directory (default: a temporary one).
    #[arg(long, value_name = "DIR")]
    pub records: Option<PathBuf>,

    /// Run the stage N times and keep the run with the median I/O time (robust to runs
    /// disturbed by other load; Daley repeated every run three times). Only for stages that
    /// can run again.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,

    /// The command to profile, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Turn a profile into an allocation: fragments, access mode, placement, staging, #DW lines.
#[derive(clap::Args, Debug)]
#[command(
    long_about = "Reads a profile (from `surge profile -o`, or an strace or Darshan log) and the \
calibrated peaks of one fragment (`surge bench calibrate`), and advises an allocation for running \
--pipelines copies of the stage: how many fragments capacity needs and how many performance needs \
(Daley §5.2: performance usually wins), the access mode (private when metadata-bound, §4.3), which \
small shared files to keep on the PFS (ExPBB's hybrid rule), what to stage in and out, a persistent \
instance for the software environment, and the #DW lines to paste into the job script.\n\n\
Every line printed under \"Job script lines\" parses with Surge's directive parser and runs under \
`surge run` as printed (the body of the job, which runs the stage on $DW_JOB_STRIPED or \
$DW_JOB_PRIVATE, is yours). With --env-list, the software environment the stage read (Python \
packages, shared libraries) is written to that list file and a setup job to run once is printed: \
it creates a persistent instance and stages the list into it; the job then attaches it.",
    after_help = "Examples:\n  \
surge advise camp.json --peaks bb-peaks.json --pipelines 64\n  \
surge advise swarp.json --peaks bb-peaks.json --pipelines 16 --coupling loose --json\n  \
surge advise camp.json --peaks bb-peaks.json --granularity 256MiB --env-list camp-env.list"
)]
pub struct AdviseArgs {
    /// The profile (surge profile -o), or an strace / Darshan log.
    #[arg(value_name = "PROFILE")]
    pub profile: PathBuf,

    /// Calibrated peaks of one fragment (surge bench calibrate).
    #[arg(long, value_name = "PEAKS.json")]
    pub peaks: PathBuf,

    /// How many copies of the stage (workflow pipelines) will run at once.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub pipelines: u64,

    /// Pipelines sharing one compute node (for private mode's per-node metadata service).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub pipelines_per_node: u64,

    /// Fragment size of the pool (DataWarp on Cori: 200GiB; `surge run`'s embedded pool reads
    /// the same SURGE_GRANULARITY, default there 256MiB).
    #[arg(long, env = "SURGE_GRANULARITY", default_value = "200GiB", value_parser = parse_size_arg, value_name = "SIZE")]
    pub granularity: u64,

    /// Files below this size that several processes share are candidates for the PFS.
    #[arg(long, default_value = "1MiB", value_parser = parse_size_arg, value_name = "SIZE")]
    pub small_file: u64,

    /// tight: all pipelines do I/O at once (Daley's estimate, conservative); loose: their I/O
    /// does not overlap (one pipeline's demand averaged over its run).
    #[arg(long, value_enum, default_value = "tight")]
    pub coupling: Coupling,

    /// Write the software-environment files the stage read to this stage list (type=list)
    /// and print the setup job that stages it into a persistent instance.
    #[arg(long, value_name = "FILE")]
    pub env_list: Option<PathBuf>,

    /// Print the advice as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    surge_core::parse_size(s).map_err(|e| e.to_string())
}

/// A profile with its derived tables, as `--json` and `-o` write it.
#[derive(Serialize)]
struct ProfileReport<'a> {
    #[serde(flatten)]
    profile: &'a Profile,
    summary: &'a Summary,
}

fn absolute(p: &Path) -> String {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    // Lexical clean-up only: the directory may not exist yet when the stage creates it.
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out.display().to_string()
}

fn load_peaks(p: &Path) -> anyhow::Result<Peaks> {
    Ok(Peaks::load(p)?)
}

fn write_file(path: &Path, text: &str, what: &str) -> anyhow::Result<()> {
    std::fs::write(path, text)
        .with_context(|| format!("cannot write the {what} to {}", path.display()))
}

pub fn run_profile(args: ProfileArgs) -> anyhow::Result<ExitCode> {
    let peaks = args.peaks.as_deref().map(load_peaks).transpose()?;
    let data_paths: Vec<String> = args.data_paths.iter().map(|p| absolute(p)).collect();
    let stem = |p: &str| {
        Path::new(p)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "stage".into())
    };
    let mut exit = ExitCode::SUCCESS;
    let mut profile = match &args.from {
        Some(from) => {
            let stage = args
                .stage
                .clone()
                .unwrap_or_else(|| stem(&from.display().to_string()));
            let mut p = import::load(from, args.format, &stage)?;
            if args.stage.is_some() {
                p.stage = stage;
            }
            if !data_paths.is_empty() {
                p.data_paths = data_paths;
            }
            p
        }
        None => {
            if args.command.is_empty() {
                anyhow::bail!(
                    "nothing to profile: give a command after `--` (surge profile -- ./job.sh) or a \
                     log with --from"
                );
            }
            let stage = args.stage.clone().unwrap_or_else(|| stem(&args.command[0]));
            let interactive = std::io::stderr().is_terminal();
            let mut runs: Vec<Profile> = Vec::new();
            for i in 0..args.repeat {
                if interactive && !args.json {
                    eprintln!(
                        "surge profile: running {} (stage {stage}{})",
                        args.command.join(" "),
                        if args.repeat > 1 {
                            format!(", run {} of {}", i + 1, args.repeat)
                        } else {
                            String::new()
                        }
                    );
                }
                let records_dir = match (&args.records, args.repeat) {
                    (Some(d), 1) => Some(d.clone()),
                    (Some(d), _) => Some(d.join(format!("run{}", i + 1))),
                    (None, _) => None,
                };
                runs.push(profile_command(&RunRequest {
                    stage: stage.clone(),
                    command: args.command.clone(),
                    data_paths: data_paths.clone(),
                    records_dir,
                    stdout_to_stderr: args.json,
                })?);
            }
            let io_time = |p: &Profile| {
                let t = p.storage_totals();
                (t.data_time_ns() + t.meta_time_ns) as f64 / 1e9
            };
            let times: Vec<String> = runs.iter().map(|p| format!("{:.3}", io_time(p))).collect();
            // The median run: robust to a run disturbed by other load in either direction,
            // and, unlike the fastest run, not biased towards runs where the largest kind of
            // I/O happened to be quick.
            let mut order: Vec<usize> = (0..runs.len()).collect();
            order.sort_by(|&a, &b| io_time(&runs[a]).total_cmp(&io_time(&runs[b])));
            let median = order[(order.len() - 1) / 2];
            let mut p = runs.swap_remove(median);
            if args.repeat > 1 {
                p.caveats.push(format!(
                    "median of {} runs by I/O time (run {}); I/O seconds per run: {}",
                    args.repeat,
                    median + 1,
                    times.join(", ")
                ));
            }
            if interactive && !args.json {
                eprintln!(
                    "surge profile: {} process(es), {} file(s) recorded",
                    p.processes.len(),
                    p.files.len()
                );
            }
            exit = match (p.source.exit_code, p.source.signal) {
                (Some(0), _) => ExitCode::SUCCESS,
                (Some(c), _) => ExitCode::from(c.clamp(1, 255) as u8),
                (None, Some(s)) => ExitCode::from((128 + s).clamp(1, 255) as u8),
                _ => ExitCode::FAILURE,
            };
            p
        }
    };
    profile.caveats.dedup();
    let summary = summarize(&profile, peaks.as_ref());
    let report = ProfileReport {
        profile: &profile,
        summary: &summary,
    };
    if let Some(out) = &args.output {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the profile")?;
        write_file(out, &json, "profile")?;
    }
    if let Some(html) = &args.html {
        write_file(
            html,
            &report::html::render(&profile, &summary),
            "HTML report",
        )?;
    }
    if args.json {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the profile")?;
        println!("{json}");
    } else {
        let color = std::io::stdout().is_terminal();
        print!("{}", report::text::render(&profile, &summary, color));
        if let Some(out) = &args.output {
            println!(
                "\nprofile saved to {} (surge advise {} --peaks PEAKS)",
                out.display(),
                out.display()
            );
        }
    }
    Ok(exit)
}

pub fn run_advise(args: AdviseArgs) -> anyhow::Result<ExitCode> {
    let peaks = load_peaks(&args.peaks)?;
    let stage = Path::new(&args.profile)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stage".into());
    let profile = import::load(&args.profile, Format::Auto, &stage)?;
    if args.pipelines == 0 {
        anyhow::bail!("--pipelines must be at least 1");
    }
    let a = advise(
        &profile,
        &peaks,
        &AdviseRequest {
            pipelines: args.pipelines,
            pipelines_per_node: args.pipelines_per_node.max(1),
            granularity_bytes: args.granularity,
            small_file_bytes: args.small_file,
            coupling: args.coupling,
            env_list: args.env_list.as_deref().map(absolute),
        },
    );
    if let Some(list) = &args.env_list {
        if !a.software_environment.is_empty() {
            write_file(
                list,
                &crate::advise::env_list_text(&a),
                "software-environment list",
            )?;
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&a).context("cannot encode the advice")?
        );
    } else {
        print!("{}", crate::advise::render(&a));
    }
    Ok(ExitCode::SUCCESS)
}
