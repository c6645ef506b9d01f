//! The flags of `surge tune` and the glue between the library modules.

use crate::history::{self, History, Key};
use crate::report::{self, TuneReport};
use crate::runner::Runner;
use crate::search::{Budget, Search, Verdict};
use crate::space::{self, SpaceRequest, StripeCount};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use surge_core::directives::parse_script;

/// Tune a job's burst-buffer request by running it: fragments, access mode, hybrid
/// placement, MPI-IO hints, layout.
#[derive(clap::Args, Debug)]
#[command(
    long_about = "Runs the job script under `surge run` again and again, each time with another \
burst-buffer configuration, and writes the fastest as a job script that runs as is (ExPBB's \
auto-tuner, seed 001, with a smarter search and a memory).\n\n\
What is searched: the number of fragments (capacity = fragments x granularity, doubling from \
what the stage-in needs; 0 = the PFS only, no burst buffer), the access mode (striped or \
private), hybrid placement (a staged path left on the PFS: its stage directive is dropped and a \
symlink put in its place), for MPI jobs (mpirun, mpiexec or srun in the script) MPI-IO hints \
written to a ROMIO hints file named by ROMIO_HINTS, and the layout of the files the job makes: \
the mount's choice (nothing set; as root, one stripe on a fragment of the node's own host), or \
a stripe count and stripe size set on the instance's root by a `surge layout set` line before \
the job's commands.\n\n\
How: the job as written, the PFS only and a seed chosen from `surge profile`'s verdict \
(--profile) are run first; then each dimension in turn, keeping the best value (coordinate \
descent, in the order the verdict suggests); then the best few are run again and halved until \
one is left (the median decides). The objective is stage in + job + stage out, from `surge run \
--report`.\n\n\
Every run is recorded in a SQLite history keyed by the job script, its stage-in inputs and the \
pool; the next call on the same job starts from those runs and needs far fewer new ones \
(usually none).",
    after_help = "Examples:\n  \
surge tune job.sh --runs 20\n  \
surge tune job.sh --profile stage.json --minutes 30 --out job.tuned.sh --html tune.html\n  \
surge tune mpi-job.sh --hint romio_cb_write=enable,disable --hint cb_nodes=1,2,4\n  \
surge tune job.sh --stripe-counts 1,all --stripe-sizes 1MiB,4MiB,16MiB\n  \
surge tune job.sh --exhaustive --fresh      # every configuration once, for comparison\n\n\
The search, the history and the outputs: docs/TUNE.md"
)]
pub struct TuneArgs {
    /// The job script (#DW jobdw and stage directives; run by `surge run`).
    pub script: PathBuf,
    /// Arguments for the script.
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
    /// Budget: at most this many new runs.
    #[arg(long, default_value_t = 24, value_name = "N")]
    pub runs: u64,
    /// Budget: stop starting new runs after this many minutes.
    #[arg(long, value_name = "MIN")]
    pub minutes: Option<f64>,
    /// `surge profile -o` output of the job: its verdict seeds the search.
    #[arg(long, value_name = "PROFILE.json")]
    pub profile: Option<PathBuf>,
    /// Pool granularity (fragment size); `surge run`'s embedded pool reads the same variable.
    #[arg(long, env = "SURGE_GRANULARITY", default_value = "256MiB", value_parser = surge_core::sys::size_arg)]
    pub granularity: u64,
    /// Largest fragment count tried.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_fragments: u64,
    /// Fragment counts to try instead of the doubling (e.g. 1,2,3,4).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub fragments: Option<Vec<u64>>,
    /// Access modes to try.
    #[arg(long, value_delimiter = ',', default_value = "striped,private", value_parser = ["striped", "private"])]
    pub modes: Vec<String>,
    /// Do not try running on the PFS only (and do not report the comparison).
    #[arg(long)]
    pub no_pfs_only: bool,
    /// How many staged inputs (the smallest first) may be tried left on the PFS.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub hybrid_candidates: usize,
    /// An MPI-IO hint to search: KEY=V1,V2,... (unset is always tried). Repeatable; replaces
    /// the defaults (romio_cb_write=enable,disable and cb_nodes=1,2 for MPI jobs).
    #[arg(long = "hint", value_name = "KEY=V1,V2")]
    pub hints: Vec<String>,
    /// Search MPI-IO hints even if the script does not look like an MPI job.
    #[arg(long)]
    pub mpi: bool,
    /// Do not search MPI-IO hints.
    #[arg(long, conflicts_with = "mpi")]
    pub no_hints: bool,
    /// Stripe counts to try as the default layout of the instance's root (`surge layout set
    /// --stripe-count`): numbers of fragments and/or `all`. The mount's choice (no layout set,
    /// the job as written) is always tried; a count at or above a configuration's fragments
    /// is `all` there.
    #[arg(long, value_delimiter = ',', default_value = "1,all", value_name = "LIST", value_parser = StripeCount::parse)]
    pub stripe_counts: Vec<StripeCount>,
    /// Stripe sizes to try with each stripe count other than 1 (multiples of 4 KiB, e.g.
    /// 1MiB,8MiB; 8 MiB is the instance's when none is set).
    #[arg(long, value_delimiter = ',', default_value = "1MiB,8MiB", value_name = "LIST", value_parser = space::parse_stripe_size)]
    pub stripe_sizes: Vec<u64>,
    /// Do not search layouts: every run keeps the mount's choice.
    #[arg(long, conflicts_with_all = ["stripe_counts", "stripe_sizes"])]
    pub no_layouts: bool,
    /// Compute nodes to emulate (`surge run --nodes`).
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// Run every configuration once instead of searching (ExPBB's nested loops).
    #[arg(long)]
    pub exhaustive: bool,
    /// The history database (default $SURGE_TUNE_DB or ~/.local/share/surge/tune.db).
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Ignore earlier runs in the history (new runs are still recorded).
    #[arg(long)]
    pub fresh: bool,
    /// Where to write the tuned job script (default: JOB.tuned.sh beside the job).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Where to write the HTML report (default: JOB.tune.html beside the job).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Directory for the variants, their reports and logs (default: a temporary one, removed
    /// at the end unless --keep).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Keep the variants and logs.
    #[arg(long)]
    pub keep: bool,
    /// PFS directory standing in for the job instance in PFS-only runs (default:
    /// .surge-tune-pfs in the current directory, removed after each run).
    #[arg(long, value_name = "DIR")]
    pub pfs_dir: Option<PathBuf>,
    /// Print the result as JSON (schema surge.tune/1) instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_hint(s: &str) -> anyhow::Result<(String, Vec<String>)> {
    let (k, v) = s.split_once('=').with_context(|| {
        format!("--hint {s}: expected KEY=V1,V2 (e.g. --hint romio_cb_write=enable,disable)")
    })?;
    let vals: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .collect();
    anyhow::ensure!(
        !k.is_empty() && !vals.is_empty() && !k.contains(char::is_whitespace),
        "--hint {s}: expected KEY=V1,V2 with a key without spaces and at least one value"
    );
    anyhow::ensure!(
        vals.iter()
            .all(|v| !v.contains(char::is_whitespace) && !v.contains('\'')),
        "--hint {s}: a hint value has no spaces or quotes"
    );
    Ok((k.to_string(), vals))
}

/// Whether the script body launches MPI ranks.
pub fn looks_like_mpi(text: &str) -> bool {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split(|c: char| c.is_whitespace() || c == ';' || c == '/'))
        .any(|w| matches!(w, "mpirun" | "mpiexec" | "srun") || w == "mpiio")
}

use surge_bench::mpiio::ompi_romio;

fn walk(p: &Path, acc: &mut (u64, u64, i64)) {
    walk_but(p, &[], acc)
}

/// [`walk`] without the paths in `skip` (and what is under them).
fn walk_but(p: &Path, skip: &[PathBuf], acc: &mut (u64, u64, i64)) {
    use std::os::unix::fs::MetadataExt;
    if skip.iter().any(|s| s == p) {
        return;
    }
    let Ok(md) = std::fs::symlink_metadata(p) else {
        return;
    };
    acc.0 += 1;
    acc.2 = acc.2.max(md.mtime());
    if md.is_dir() {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                walk_but(&e.path(), skip, acc);
            }
        }
    } else {
        acc.1 += md.len();
    }
}

fn size_of(p: &Path) -> u64 {
    let mut acc = (0, 0, 0);
    walk(p, &mut acc);
    acc.1
}

fn absolute_in(cwd: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

/// The pool part of the history's key: the manager (`manager`, else `$SURGE_MANAGER`), or the
/// embedded servers as the environment configures them.
fn pool_key(granularity: u64, nodes: u32, manager: Option<&str>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let manager = manager
        .map(str::to_string)
        .or_else(|| std::env::var("SURGE_MANAGER").ok())
        .filter(|m| !m.is_empty());
    match manager {
        Some(m) => format!("manager={m} granularity={granularity} nodes={nodes} host={host}"),
        None => format!(
            "embedded servers={} capacity={} fast={} granularity={granularity} nodes={nodes} host={host}",
            env("SURGE_SERVERS"),
            env("SURGE_SERVER_CAPACITY"),
            env("SURGE_FAST_DIR")
        ),
    }
}

/// The job part of the history's key: the script's text and its arguments.
fn job_key(text: &str, args: &[String]) -> String {
    history::hash_hex(format!("{text}\0{}", args.join("\0")).as_bytes())
}

/// The inputs part of the history's key (each stage-in source's path, file count, bytes and
/// newest modification time, less what the job's stage-outs write there: its results are not
/// its inputs), and the bytes staged into the job instance.
fn inputs_of(d: &surge_core::directives::Directives, cwd: &Path) -> (String, u64) {
    let outputs: Vec<PathBuf> = d
        .stage_out
        .iter()
        .map(|s| absolute_in(cwd, &s.destination))
        .collect();
    let mut inputs = Vec::new();
    let mut stage_in_bytes = 0;
    for s in &d.stage_in {
        let p = absolute_in(cwd, &s.source);
        let mut acc = (0, 0, 0);
        walk_but(&p, &outputs, &mut acc);
        if matches!(
            s.instance,
            surge_core::directives::DwVariable::JobStriped
                | surge_core::directives::DwVariable::JobPrivate
        ) {
            stage_in_bytes += acc.1;
        }
        inputs.push(format!("{} {} {} {}", p.display(), acc.0, acc.1, acc.2));
    }
    (
        history::hash_hex(inputs.join("\n").as_bytes()),
        stage_in_bytes,
    )
}

/// A `surge run` of a job script as it is written, to remember in the tune history.
pub struct RunAsWritten<'a> {
    pub script: &'a Path,
    /// The script's text as it ran, and its arguments.
    pub text: &'a str,
    pub args: &'a [String],
    pub nodes: u32,
    pub granularity: u64,
    /// The manager it ran against (`None`: the embedded default or `$SURGE_MANAGER`).
    pub manager: Option<&'a str>,
    /// `surge run --report`'s JSON (phases, exit code) and its start.
    pub report: &'a serde_json::Value,
    pub started_at: &'a str,
}

/// Records `r` in the history at `db` as the job as written, under the keys `surge tune` of
/// the same script, inputs and pool computes (so a later tune starts from it instead of
/// running it again; the closed loop of DESIGN §6). Run before the stage-in sources change:
/// the inputs are part of the key. Returns the configuration it was recorded as; a job
/// `surge tune` cannot tune (no `#DW jobdw`) is an error.
pub fn record_as_written(r: &RunAsWritten<'_>, db: &Path) -> anyhow::Result<String> {
    let name = r.script.display().to_string();
    let d = parse_script(&name, r.text).map_err(|e| {
        anyhow::anyhow!(
            "{name}: {}",
            e.0.first().map(|x| x.to_string()).unwrap_or_default()
        )
    })?;
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let (inputs, stage_in_bytes) = inputs_of(&d, &cwd);
    let space = space::build(
        &d,
        &SpaceRequest {
            granularity: r.granularity,
            max_fragments: 1,
            fragments: None,
            stage_in_bytes,
            modes: Vec::new(),
            pfs_only: false,
            hybrid_candidates: 0,
            hints: Vec::new(),
            stripe_counts: Vec::new(),
            stripe_sizes: Vec::new(),
        },
        |p| Some(size_of(&absolute_in(&cwd, p))),
    )
    .with_context(|| format!("{name}: not a job surge tune can tune"))?;
    let key = Key {
        job: job_key(r.text, r.args),
        inputs,
        pool: pool_key(r.granularity, r.nodes, r.manager),
    };
    let phases: Vec<(String, f64)> = r.report["phases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or("?").to_string(),
                        p["seconds"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let exit_code = r.report["exit_code"].as_i64().map(|c| c as i32);
    let ok = exit_code == Some(0);
    let run = history::Run {
        config: space.default.clone(),
        ok,
        seconds: ok.then(|| crate::runner::objective(&phases)),
        exit_code,
        phases,
        started_at: r.started_at.to_string(),
        new: true,
    };
    History::open(db)?.record(&key, &name, &run)?;
    Ok(space.default.key())
}

fn verdict_of(profile: &Path) -> anyhow::Result<Option<Verdict>> {
    let text = std::fs::read_to_string(profile)
        .with_context(|| format!("cannot read the profile {}", profile.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a surge profile (JSON)", profile.display()))?;
    let label = v["summary"]["verdict"]["bound"].as_str().with_context(|| {
        format!(
            "{}: no summary.verdict.bound (write it with `surge profile -o FILE`)",
            profile.display()
        )
    })?;
    Ok(Verdict::from_label(label))
}

fn beside(script: &Path, suffix: &str) -> PathBuf {
    let stem = script
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".into());
    script.with_file_name(format!("{stem}.{suffix}"))
}

pub fn run(args: TuneArgs) -> anyhow::Result<ExitCode> {
    let script_name = args.script.display().to_string();
    let text = std::fs::read_to_string(&args.script)
        .with_context(|| format!("cannot read job script {script_name}"))?;
    let directives = match parse_script(&script_name, &text) {
        Ok(d) => d,
        Err(errs) => {
            for e in &errs.0 {
                eprintln!("{e}");
            }
            anyhow::bail!(
                "{} error(s) in {script_name}: fix them first (surge run would refuse the job too)",
                errs.0.len()
            );
        }
    };
    anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let verdict = args
        .profile
        .as_deref()
        .map(verdict_of)
        .transpose()?
        .flatten();

    // The space.
    let (inputs_key, stage_in_bytes) = inputs_of(&directives, &cwd);
    let mpi = args.mpi || (!args.no_hints && looks_like_mpi(&text));
    let hints = if args.no_hints || !mpi {
        Vec::new()
    } else if args.hints.is_empty() {
        vec![
            (
                "romio_cb_write".to_string(),
                vec!["enable".to_string(), "disable".to_string()],
            ),
            (
                "cb_nodes".to_string(),
                vec!["1".to_string(), "2".to_string()],
            ),
        ]
    } else {
        args.hints
            .iter()
            .map(|h| parse_hint(h))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let space = space::build(
        &directives,
        &SpaceRequest {
            granularity: args.granularity,
            max_fragments: args.max_fragments,
            fragments: args.fragments.clone(),
            stage_in_bytes,
            modes: args.modes.clone(),
            pfs_only: !args.no_pfs_only,
            hybrid_candidates: args.hybrid_candidates,
            hints,
            stripe_counts: if args.no_layouts {
                Vec::new()
            } else {
                args.stripe_counts.clone()
            },
            stripe_sizes: args.stripe_sizes.clone(),
        },
        |p| Some(size_of(&absolute_in(&cwd, p))),
    )
    .with_context(|| format!("{script_name}: cannot tune this job"))?;

    // The history.
    let key = Key {
        job: job_key(&text, &args.args),
        inputs: inputs_key,
        pool: pool_key(args.granularity, args.nodes, None),
    };
    let db = args.history.clone().unwrap_or_else(history::default_path);
    let hist = History::open(&db)?;
    let earlier = if args.fresh {
        Vec::new()
    } else {
        hist.runs(&key)?
    };
    if !args.quiet && !args.json {
        eprintln!(
            "surge tune: {script_name}: {} configurations in {} dimension(s); {} earlier run(s) \
             of this job, inputs and pool in {}",
            space.all().len(),
            space.dimensions.len(),
            earlier.len(),
            db.display()
        );
    }

    // Where the variants go.
    let (workdir, _tmp) = match &args.workdir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile_dir()?;
            (t.clone(), Some(RemoveOnDrop(t, !args.keep)))
        }
    };
    let pfs_dir = args
        .pfs_dir
        .clone()
        .unwrap_or_else(|| cwd.join(".surge-tune-pfs"));
    let surge = std::env::current_exe().context("cannot find the surge executable")?;
    let runner = Runner {
        surge,
        script_name: script_name.clone(),
        script_text: text.clone(),
        granularity: args.granularity,
        cwd: cwd.clone(),
        pfs_dir: pfs_dir.clone(),
        ompi_romio: if mpi { ompi_romio() } else { None },
        workdir: workdir.clone(),
        nodes: args.nodes,
        args: args.args.clone(),
        history: &hist,
        key: key.clone(),
        budget_runs: Some(args.runs),
        quiet: args.quiet || args.json,
        count: 0,
        best: None,
    };
    let budget = Budget {
        runs: Some(args.runs),
        deadline: args
            .minutes
            .map(|m| Instant::now() + Duration::from_secs_f64((m * 60.0).max(0.0))),
    };
    let search = Search::new(&space, runner, earlier, budget);
    let outcome = if args.exhaustive {
        search.exhaustive()?
    } else {
        search.run(verdict)?
    };
    let tried = report::tried(&outcome.runs);
    let best_config = outcome
        .best
        .clone()
        .context("no configuration ran successfully: see the logs (--keep --workdir DIR)")?;
    let as_written = report::find(&tried, &space.default);
    let pfs_config = space.normalize(crate::space::Setting::Fragments(0).apply(&space.default));
    let pfs_only = (!args.no_pfs_only)
        .then(|| report::find(&tried, &pfs_config))
        .filter(|t| t.runs > 0);
    let best = report::find(&tried, &best_config);
    let speedup_vs_as_written = report::speedup(&as_written, &best);
    let speedup_vs_pfs_only = pfs_only.as_ref().and_then(|p| report::speedup(p, &best));

    // The tuned script.
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| beside(&args.script, "tuned.sh"));
    let html_path = args
        .html
        .clone()
        .unwrap_or_else(|| beside(&args.script, "tune.html"));
    let mut banner = vec![format!(
        "tuned {} from {script_name}: {}",
        humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
        best.key
    )];
    if let (Some(b), Some(a)) = (best.median_s, as_written.median_s) {
        banner.push(format!(
            "measured {b:.3} s (stage in + job + stage out) vs {a:.3} s as written"
        ));
    }
    let romio = if mpi && !best_config.hints.is_empty() {
        ompi_romio()
    } else {
        None
    };
    let tuned = crate::script::render(
        &text,
        &best_config,
        &crate::script::RenderContext {
            name: &script_name,
            granularity: args.granularity,
            cwd: &cwd,
            pfs_dir: &pfs_dir,
            ompi_romio: romio.as_deref(),
            banner: &banner,
        },
    )?;
    std::fs::write(&out, &tuned).with_context(|| format!("cannot write {}", out.display()))?;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&args.script)
        .map(|m| m.permissions().mode())
        .unwrap_or(0o644);
    let _ = std::fs::set_permissions(&out, std::fs::Permissions::from_mode(mode));

    let mut notes = space.notes.clone();
    if best_config.pfs_only() {
        notes.push(
            "the PFS alone was fastest: for this job and pool the burst buffer costs more \
             (staging) than it saves"
                .into(),
        );
    }
    if args.keep || args.workdir.is_some() {
        notes.push(format!("variants and logs kept in {}", workdir.display()));
    }
    let rep = TuneReport {
        schema: "surge.tune/1".into(),
        script: script_name,
        tuned_script: out.display().to_string(),
        html: html_path.display().to_string(),
        history: db.display().to_string(),
        search: if args.exhaustive {
            "exhaustive (every configuration once)".into()
        } else {
            format!(
                "coordinate descent seeded by {}, then successive halving",
                match verdict {
                    Some(v) => format!("the profile's verdict ({v:?})"),
                    None => "the job as written (no --profile)".into(),
                }
            )
        },
        space_size: space.all().len() as u64,
        new_runs: outcome.new_runs,
        reused_runs: outcome.reused_runs,
        budget_exhausted: outcome.budget_exhausted,
        as_written,
        pfs_only,
        best,
        speedup_vs_as_written,
        speedup_vs_pfs_only,
        tried,
        runs: outcome.runs.into_iter().map(report::RunRow::from).collect(),
        trace: outcome.trace,
        notes,
    };
    std::fs::write(&html_path, report::html(&rep))
        .with_context(|| format!("cannot write {}", html_path.display()))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rep).context("cannot encode the result")?
        );
    } else {
        print!("{}", report::text(&rep));
    }
    Ok(ExitCode::SUCCESS)
}

struct RemoveOnDrop(PathBuf, bool);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("surge-tune-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("cannot create {}", base.display()))?;
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpi_jobs_are_recognised_by_their_launcher() {
        assert!(looks_like_mpi("#!/bin/sh\nmpirun -np 2 ./x\n"));
        assert!(looks_like_mpi("srun ./x"));
        assert!(looks_like_mpi(
            "surge bench io --backend mpiio $DW_JOB_STRIPED"
        ));
        assert!(!looks_like_mpi(
            "#!/bin/sh\n# mpirun in a comment\n./serial\n"
        ));
    }

    #[test]
    fn hints_are_checked() {
        assert_eq!(
            parse_hint("cb_nodes=1,2").unwrap(),
            (
                "cb_nodes".to_string(),
                vec!["1".to_string(), "2".to_string()]
            )
        );
        assert!(parse_hint("cb_nodes").is_err());
        assert!(parse_hint("cb_nodes=").is_err());
        assert!(parse_hint("a=b c").is_err());
    }

    #[derive(clap::Parser, Debug)]
    struct Cmd {
        #[command(flatten)]
        tune: TuneArgs,
    }

    fn parse(args: &[&str]) -> Result<TuneArgs, clap::Error> {
        use clap::Parser;
        Cmd::try_parse_from(std::iter::once("tune").chain(args.iter().copied())).map(|c| c.tune)
    }

    #[test]
    fn layout_flags_default_to_one_and_all_stripes_of_1_and_8_mib() {
        let a = parse(&["job.sh"]).unwrap();
        assert_eq!(
            a.stripe_counts,
            vec![StripeCount::Count(1), StripeCount::All]
        );
        assert_eq!(a.stripe_sizes, vec![1 << 20, 8 << 20]);
        assert!(!a.no_layouts);
        let a = parse(&[
            "job.sh",
            "--stripe-counts",
            "2,all",
            "--stripe-sizes",
            "64KiB",
        ])
        .unwrap();
        assert_eq!(
            a.stripe_counts,
            vec![StripeCount::Count(2), StripeCount::All]
        );
        assert_eq!(a.stripe_sizes, vec![64 << 10]);
        assert!(parse(&["job.sh", "--no-layouts"]).unwrap().no_layouts);
    }

    #[test]
    fn bad_layout_flags_are_refused_naming_the_value() {
        let e = parse(&["job.sh", "--stripe-counts", "1,0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'0'") && e.contains("--stripe-counts"), "{e}");
        let e = parse(&["job.sh", "--stripe-sizes", "1MiB,5000"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'5000'"), "{e}");
        assert!(parse(&["job.sh", "--no-layouts", "--stripe-counts", "1"]).is_err());
    }
}
