//! Text output in IOR's and mdtest's words, so a reader who knows them needs no manual: the
//! exact parameters, one line per phase per repetition, then min/max/mean/stddev over
//! repetitions and latency percentiles.

use crate::result::PhaseSummary;
use crate::run::Report;
use crate::workers::Job;
use std::fmt::Write;
use surge_core::format_bytes;

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The parameter lines of a report (also used by sweep and calibrate headers).
pub fn params_text(job: &Job) -> String {
    match job {
        Job::Io(p) => format!(
            "  api=POSIX  access={}  ordering={}  procs={}  repetitions={}\n  \
             transfer={}  block={}  segments={}  aggregate={}\n  \
             fsync-per-write={}  fsync={}  direct={}  reorder(-C)={}  drop-cache={}  verify={}  deadline={}\n",
            if p.shared_file { "single-shared-file" } else { "file-per-process" },
            if p.random { "random" } else { "sequential" },
            p.procs,
            p.repetitions,
            format_bytes(p.transfer),
            format_bytes(p.block),
            p.segments,
            format_bytes(p.aggregate_bytes()),
            yes(p.fsync_per_write),
            yes(p.fsync),
            yes(p.direct),
            yes(p.reorder && p.procs > 1),
            yes(p.drop_cache),
            yes(p.verify),
            p.deadline_s.map(|d| format!("{d}s")).unwrap_or_else(|| "none".into()),
        ),
        Job::Md(p) => format!(
            "  files/proc={}  procs={}  total files={}  directory={}  repetitions={}\n  \
             write-bytes={}  read-bytes={}  deadline={}\n",
            p.files,
            p.procs,
            p.total_files(),
            if p.shared_dir { "shared" } else { "unique per process" },
            p.repetitions,
            p.write_bytes,
            p.read_bytes,
            p.deadline_s.map(|d| format!("{d}s")).unwrap_or_else(|| "none".into()),
        ),
    }
}

fn latency_table(out: &mut String, summary: &[PhaseSummary]) {
    let _ = writeln!(
        out,
        "\n{:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "Latency(us)", "min", "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    for s in summary {
        let l = &s.latency;
        let _ = writeln!(
            out,
            "{:<12} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>9.1}",
            s.phase.name(),
            l.min_us,
            l.p50_us,
            l.p90_us,
            l.p99_us,
            l.p999_us,
            l.max_us,
            l.mean_us
        );
    }
}

/// The whole human-readable report.
pub fn report_text(r: &Report) -> String {
    let mut out = String::new();
    let kind = match r.params {
        Job::Io(_) => "io",
        Job::Md(_) => "md",
    };
    let _ = writeln!(
        out,
        "surge bench {kind}: {} ({}, {} backend) on {}, {}",
        r.path, r.fs_type, r.backend, r.host, r.started_at
    );
    let api = if r.backend == "mpiio" {
        "api=MPIIO"
    } else {
        "api=POSIX"
    };
    out += &params_text(&r.params).replacen("api=POSIX", api, 1);
    match &r.params {
        Job::Io(_) => {
            let _ = writeln!(
                out,
                "\n{:<8} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>5}",
                "access", "bw(MiB/s)", "IOPS", "time(s)", "open(s)", "wr/rd(s)", "close(s)", "iter"
            );
            for p in &r.results {
                let _ = writeln!(
                    out,
                    "{:<8} {:>11.2} {:>11.1} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>5}{}",
                    p.phase.name(),
                    p.mib_per_s,
                    p.ops_per_s,
                    p.time_s,
                    p.open_s,
                    p.io_s,
                    p.close_s,
                    p.repetition,
                    if p.stonewalled { "  (stonewalled)" } else { "" }
                );
            }
            let _ = writeln!(
                out,
                "\n{:<8} {:>10} {:>10} {:>10} {:>8} {:>11} {:>11} {:>11} {:>9}",
                "Summary",
                "Max(MiB)",
                "Min(MiB)",
                "Mean(MiB)",
                "StdDev",
                "Max(OPs)",
                "Min(OPs)",
                "Mean(OPs)",
                "StdDev"
            );
            for s in &r.summary {
                let _ = writeln!(
                    out,
                    "{:<8} {:>10.2} {:>10.2} {:>10.2} {:>8.2} {:>11.1} {:>11.1} {:>11.1} {:>9.1}",
                    s.phase.name(),
                    s.mib_per_s.max,
                    s.mib_per_s.min,
                    s.mib_per_s.mean,
                    s.mib_per_s.stddev,
                    s.ops_per_s.max,
                    s.ops_per_s.min,
                    s.ops_per_s.mean,
                    s.ops_per_s.stddev
                );
            }
        }
        Job::Md(_) => {
            let _ = writeln!(
                out,
                "\n{:<12} {:>12} {:>12} {:>12} {:>10} {:>9}",
                "Operation", "Max(ops/s)", "Min(ops/s)", "Mean(ops/s)", "StdDev", "Mean(s)"
            );
            for s in &r.summary {
                let _ = writeln!(
                    out,
                    "{:<12} {:>12.1} {:>12.1} {:>12.1} {:>10.1} {:>9.4}{}",
                    s.phase.name(),
                    s.ops_per_s.max,
                    s.ops_per_s.min,
                    s.ops_per_s.mean,
                    s.ops_per_s.stddev,
                    s.time_s.mean,
                    if s.stonewalled { "  (stonewalled)" } else { "" }
                );
            }
        }
    }
    latency_table(&mut out, &r.summary);
    for s in &r.summary {
        if s.verify_errors > 0 {
            let _ = writeln!(
                out,
                "\nVERIFY FAILED: {} {} transfers did not hold the data written for them",
                s.verify_errors,
                s.phase.name()
            );
        }
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}
