//! Darshan logs. The one parser reads `darshan-parser`'s text format (tab-separated
//! `<module> <rank> <record id> <counter> <value> <file name> <mount pt> <fs type>` lines and
//! `# key: value` header lines). A binary `.darshan` log is turned into that text by
//! `darshan-parser` when it is installed, else by PyDarshan (`pip install darshan`, which
//! bundles libdarshan-util; Debian 12 packages neither darshan-util nor PyDarshan), through the
//! small script in [`PYDARSHAN_SCRIPT`].
//!
//! Mapping (POSIX and STDIO modules): Darshan's counters map one to one onto ours, except
//! that POSIX_OPENS includes fileno() and dup() calls (subtracted here), closes are not counted
//! by Darshan, and per-call times by size do not exist (the verdict then uses the mean transfer
//! size). Darshan's STATS stay 0 on glibc >= 2.33 (it wraps only `__xstat`), which is reported.

use crate::model::{Counters, FileKind, FileStats, Process, Profile, Source, SourceKind, Timeline};
use anyhow::Context;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum DarshanError {
    #[error("{file}:{line}: {what}")]
    Line {
        file: String,
        line: usize,
        what: String,
    },
    #[error("{file} holds no POSIX or STDIO records (is it darshan-parser output?)")]
    Empty { file: String },
}

/// Turns a binary log into darshan-parser text with PyDarshan.
pub const PYDARSHAN_SCRIPT: &str = r##"
import sys
import darshan
from darshan.backend import cffi_backend as b
r = darshan.DarshanReport(sys.argv[1], read_all=True)
job = r.metadata["job"]
out = sys.stdout
out.write("# darshan log version: %s\n" % job.get("log_ver", ""))
out.write("# exe: %s\n" % r.metadata.get("exe", ""))
out.write("# nprocs: %d\n" % job["nprocs"])
out.write("# start_time: %d\n" % job["start_time_sec"])
out.write("# run time: %.6f\n" % job["run_time"])
out.write("# metadata: lib_ver = %s\n" % job.get("metadata", {}).get("lib_ver", ""))
out.write("# pydarshan: %s\n" % darshan.__version__)
for mod in ("POSIX", "STDIO"):
    if mod not in r.records:
        continue
    names = b.counter_names(mod)
    fnames = b.fcounter_names(mod)
    for rec in r.records[mod].to_list():
        path = r.name_records.get(rec["id"], "<unknown>")
        for n, v in zip(names, rec["counters"]):
            out.write("%s\t%d\t%d\t%s\t%d\t%s\t-\t-\n" % (mod, rec["rank"], rec["id"], n, v, path))
        for n, v in zip(fnames, rec["fcounters"]):
            out.write("%s\t%d\t%d\t%s\t%f\t%s\t-\t-\n" % (mod, rec["rank"], rec["id"], n, v, path))
for mod, hm in getattr(r, "heatmaps", {}).items():
    try:
        width = hm._bin_width_seconds
        for op in ("read", "write"):
            sums = hm.to_df(ops=[op]).sum(axis=0).tolist()
            for i, v in enumerate(sums):
                out.write("HEATMAP\t0\t0\tHEATMAP_%s_BIN_%d\t%d\theatmap:%s\t-\t-\n" % (op.upper(), i, v, mod))
        out.write("HEATMAP\t0\t0\tHEATMAP_F_BIN_WIDTH_SECONDS\t%f\theatmap:%s\t-\t-\n" % (width, mod))
    except Exception as e:  # the heatmap is a plot aid; counters matter
        sys.stderr.write("heatmap skipped: %s\n" % e)
"##;

/// Reads a binary log through darshan-parser or PyDarshan.
pub fn load_binary(path: &Path, stage: &str) -> anyhow::Result<Profile> {
    let file = path.display().to_string();
    if let Ok(out) = Command::new("darshan-parser").arg(path).output() {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            return Ok(parse_text(&text, stage, &file, "darshan-parser")?);
        }
        anyhow::bail!(
            "darshan-parser failed on {file}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let python = std::env::var("SURGE_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", PYDARSHAN_SCRIPT])
        .arg(path)
        .output()
        .with_context(|| {
            format!("reading {file} needs darshan-parser or PyDarshan, and '{python}' cannot run")
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No module named 'darshan'") {
            anyhow::bail!(
                "reading the binary Darshan log {file} needs darshan-parser (darshan-util) or \
                 PyDarshan: `python3 -m pip install darshan`, or give darshan-parser's text output"
            );
        }
        anyhow::bail!("PyDarshan could not read {file}: {}", err.trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("# pydarshan: "))
        .unwrap_or("?")
        .to_string();
    Ok(parse_text(
        &text,
        stage,
        &file,
        &format!("PyDarshan {version}"),
    )?)
}

/// Per (rank, record id): the path and the raw counters by name.
#[derive(Default)]
struct Rec {
    path: String,
    values: HashMap<String, f64>,
}

fn hist_index(suffix: &str) -> Option<usize> {
    const N: [&str; 10] = [
        "0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M", "4M_10M", "10M_100M",
        "100M_1G", "1G_PLUS",
    ];
    N.iter().position(|n| *n == suffix)
}

fn secs_to_ns(s: f64) -> u64 {
    if s > 0.0 {
        (s * 1e9).round().max(1.0) as u64
    } else {
        0
    }
}

fn posix_counters(v: &HashMap<String, f64>) -> Counters {
    let g = |n: &str| v.get(n).copied().filter(|x| *x >= 0.0).unwrap_or(0.0);
    let u = |n: &str| g(n) as u64;
    let mut c = Counters {
        opens: u("POSIX_OPENS").saturating_sub(u("POSIX_FILENOS") + u("POSIX_DUPS")),
        reads: u("POSIX_READS"),
        writes: u("POSIX_WRITES"),
        seeks: u("POSIX_SEEKS"),
        stats: u("POSIX_STATS"),
        syncs: u("POSIX_FSYNCS") + u("POSIX_FDSYNCS"),
        renames: u("POSIX_RENAME_SOURCES"),
        bytes_read: u("POSIX_BYTES_READ"),
        bytes_written: u("POSIX_BYTES_WRITTEN"),
        read_time_ns: secs_to_ns(g("POSIX_F_READ_TIME")),
        write_time_ns: secs_to_ns(g("POSIX_F_WRITE_TIME")),
        meta_time_ns: secs_to_ns(g("POSIX_F_META_TIME")),
        first_ns: secs_to_ns(g("POSIX_F_OPEN_START_TIMESTAMP")),
        last_ns: secs_to_ns(
            g("POSIX_F_CLOSE_END_TIMESTAMP")
                .max(g("POSIX_F_READ_END_TIMESTAMP"))
                .max(g("POSIX_F_WRITE_END_TIMESTAMP")),
        ),
        first_read_ns: secs_to_ns(g("POSIX_F_READ_START_TIMESTAMP")),
        first_write_ns: secs_to_ns(g("POSIX_F_WRITE_START_TIMESTAMP")),
        ..Counters::default()
    };
    // Darshan's MAX_BYTE is the highest offset touched; ours is one past it.
    if c.bytes_read > 0 {
        c.max_byte_read = u("POSIX_MAX_BYTE_READ") + 1;
    }
    if c.bytes_written > 0 {
        c.max_byte_written = u("POSIX_MAX_BYTE_WRITTEN") + 1;
    }
    for (name, val) in v {
        if let Some(s) = name.strip_prefix("POSIX_SIZE_READ_") {
            if let Some(i) = hist_index(s) {
                c.hist_read[i] = (*val).max(0.0) as u64;
            }
        } else if let Some(s) = name.strip_prefix("POSIX_SIZE_WRITE_") {
            if let Some(i) = hist_index(s) {
                c.hist_write[i] = (*val).max(0.0) as u64;
            }
        }
    }
    c
}

/// Darshan's STDIO module counts library calls; estimate the kernel calls behind them as our
/// shim does (4 KiB buffers: large calls go direct, small ones share a buffer refill).
fn stdio_counters(v: &HashMap<String, f64>) -> Counters {
    let g = |n: &str| v.get(n).copied().filter(|x| *x >= 0.0).unwrap_or(0.0);
    let u = |n: &str| g(n) as u64;
    let est = |calls: u64, bytes: u64| {
        if calls == 0 {
            0
        } else if bytes / calls >= 4096 {
            calls
        } else {
            bytes.div_ceil(4096)
        }
    };
    let mut c = Counters {
        stdio_opens: u("STDIO_OPENS"),
        stdio_reads: u("STDIO_READS"),
        stdio_writes: u("STDIO_WRITES"),
        stdio_seeks: u("STDIO_SEEKS"),
        stdio_flushes: u("STDIO_FLUSHES"),
        stdio_bytes_read: u("STDIO_BYTES_READ"),
        stdio_bytes_written: u("STDIO_BYTES_WRITTEN"),
        read_time_ns: secs_to_ns(g("STDIO_F_READ_TIME")),
        write_time_ns: secs_to_ns(g("STDIO_F_WRITE_TIME")),
        meta_time_ns: secs_to_ns(g("STDIO_F_META_TIME")),
        first_ns: secs_to_ns(g("STDIO_F_OPEN_START_TIMESTAMP")),
        last_ns: secs_to_ns(g("STDIO_F_CLOSE_END_TIMESTAMP")),
        first_read_ns: secs_to_ns(g("STDIO_F_READ_START_TIMESTAMP")),
        first_write_ns: secs_to_ns(g("STDIO_F_WRITE_START_TIMESTAMP")),
        ..Counters::default()
    };
    c.stdio_kernel_reads_est = est(c.stdio_reads, c.stdio_bytes_read);
    c.stdio_kernel_writes_est = est(c.stdio_writes, c.stdio_bytes_written);
    if c.stdio_bytes_read > 0 {
        c.max_byte_read = u("STDIO_MAX_BYTE_READ") + 1;
    }
    if c.stdio_bytes_written > 0 {
        c.max_byte_written = u("STDIO_MAX_BYTE_WRITTEN") + 1;
    }
    c
}

/// Parses darshan-parser text output.
pub fn parse_text(
    text: &str,
    stage: &str,
    file: &str,
    detail: &str,
) -> Result<Profile, DarshanError> {
    let mut header: HashMap<String, String> = HashMap::new();
    let mut recs: BTreeMap<(String, i64, String), Rec> = BTreeMap::new();
    let mut heat: BTreeMap<(String, usize), (u64, u64)> = BTreeMap::new();
    let mut heat_width = 0.0f64;
    for (i, line) in text.lines().enumerate() {
        if let Some(h) = line.strip_prefix("# ") {
            if let Some((k, v)) = h.split_once(": ") {
                header
                    .entry(k.trim().to_string())
                    .or_insert_with(|| v.trim().to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let bad = |what: String| DarshanError::Line {
            file: file.to_string(),
            line: i + 1,
            what,
        };
        if f.len() < 6 {
            return Err(bad(format!(
                "expected 8 tab-separated fields (module, rank, record id, counter, value, file, mount, fs), found {}",
                f.len()
            )));
        }
        let module = f[0];
        let counter = f[3];
        let value: f64 = f[4].parse().map_err(|_| {
            bad(format!(
                "counter {counter} has a non-numeric value '{}'",
                f[4]
            ))
        })?;
        match module {
            "POSIX" | "STDIO" => {
                let rank: i64 = f[1]
                    .parse()
                    .map_err(|_| bad(format!("rank '{}' is not a number", f[1])))?;
                let r = recs
                    .entry((module.to_string(), rank, f[2].to_string()))
                    .or_default();
                r.path = f[5].to_string();
                r.values.insert(counter.to_string(), value);
            }
            "HEATMAP" => {
                if counter == "HEATMAP_F_BIN_WIDTH_SECONDS" {
                    heat_width = heat_width.max(value);
                } else if let Some((op, bin)) = counter
                    .strip_prefix("HEATMAP_")
                    .and_then(|s| s.split_once("_BIN_"))
                {
                    let Ok(bin) = bin.parse::<usize>() else {
                        continue;
                    };
                    let e = heat.entry((f[5].to_string(), bin)).or_default();
                    if op == "READ" {
                        e.0 += value.max(0.0) as u64;
                    } else {
                        e.1 += value.max(0.0) as u64;
                    }
                }
            }
            _ => {} // other modules (MPI-IO, LUSTRE, DXT...) are not part of Daley's tables
        }
    }
    if recs.is_empty() {
        return Err(DarshanError::Empty {
            file: file.to_string(),
        });
    }
    let source = Source {
        kind: SourceKind::Darshan,
        command: header
            .get("exe")
            .map(|e| e.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        file: Some(file.to_string()),
        exit_code: None,
        signal: None,
        detail: format!(
            "{detail}; Darshan {}",
            header.get("metadata").map(String::as_str).unwrap_or("?")
        ),
    };
    let mut p = Profile::new(stage, source);
    p.wall_time_s = header
        .get("run time")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    if let Some(start) = header.get("start_time").and_then(|v| v.parse::<i64>().ok()) {
        p.started_at = crate::run::rfc3339(start);
    }
    let nprocs: i64 = header
        .get("nprocs")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut files: BTreeMap<String, FileStats> = BTreeMap::new();
    let mut ranks_per_file: HashMap<String, std::collections::BTreeSet<i64>> = HashMap::new();
    let mut stats_seen = false;
    for ((module, rank, _id), r) in &recs {
        let c = if module == "POSIX" {
            posix_counters(&r.values)
        } else {
            stdio_counters(&r.values)
        };
        stats_seen |= c.stats > 0;
        let kind = if r.path.starts_with("<STD") {
            FileKind::CharDevice
        } else {
            FileKind::Regular
        };
        let e = files.entry(r.path.clone()).or_insert_with(|| FileStats {
            path: r.path.clone(),
            exists_after: None,
            kind,
            processes: 0,
            counters: Counters::default(),
        });
        e.counters.merge(&c);
        let ranks = ranks_per_file.entry(r.path.clone()).or_default();
        if *rank < 0 {
            // A shared record aggregates every rank.
            ranks.extend(0..nprocs);
        } else {
            ranks.insert(*rank);
        }
    }
    for f in files.values_mut() {
        f.processes = ranks_per_file.get(&f.path).map_or(1, |r| r.len() as u32);
    }
    p.files = files.into_values().collect();
    p.processes = (0..nprocs)
        .map(|rank| Process {
            pid: rank,
            ppid: -1,
            exe: header.get("exe").cloned().unwrap_or_default(),
            cmdline: header.get("exe").cloned().unwrap_or_default(),
            start_s: 0.0,
            end_s: p.wall_time_s,
            threads: 0,
            io_threads: 1,
            ..Process::default()
        })
        .collect();
    if heat_width > 0.0 {
        let n = heat.keys().map(|(_, b)| b + 1).max().unwrap_or(0);
        let mut t = Timeline {
            bin_s: heat_width,
            bytes_read: vec![0; n],
            bytes_written: vec![0; n],
            data_ops: vec![0; n],
            meta_ops: vec![0; n],
        };
        for ((_, b), (r, w)) in heat {
            t.bytes_read[b] += r;
            t.bytes_written[b] += w;
        }
        p.timeline = t;
    }
    p.caveats.push(
        "Darshan does not count close() calls nor time calls by transfer size: metadata ops \
         exclude closes, and the bandwidth/IOPS split uses the mean transfer size"
            .into(),
    );
    if !stats_seen {
        p.caveats.push(
            "Darshan counted no stat calls: Darshan 3.5 misses stat/fstatat on glibc >= 2.33 \
             (it wraps only __xstat), so metadata ops are undercounted; profile with \
             `surge profile -- CMD` to count them"
                .into(),
        );
    }
    p.caveats
        .push("Darshan records no peak memory or thread counts (Table 1 shows 0)".into());
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str =
        "# darshan log version: 3.41\n# exe: ./a.out x\n# nprocs: 2\n# run time: 1.5\n\
#<module>\t<rank>\t<record id>\t<counter>\t<value>\t<file name>\t<mount pt>\t<fs type>\n\
POSIX\t-1\t7\tPOSIX_OPENS\t4\t/d/f\t/\text4\n\
POSIX\t-1\t7\tPOSIX_FILENOS\t1\t/d/f\t/\text4\n\
POSIX\t-1\t7\tPOSIX_MMAPS\t-1\t/d/f\t/\text4\n\
POSIX\t-1\t7\tPOSIX_BYTES_READ\t100\t/d/f\t/\text4\n\
POSIX\t-1\t7\tPOSIX_MAX_BYTE_READ\t99\t/d/f\t/\text4\n\
POSIX\t-1\t7\tPOSIX_SIZE_READ_100_1K\t1\t/d/f\t/\text4\n\
POSIX\t-1\t7\tPOSIX_F_META_TIME\t0.25\t/d/f\t/\text4\n";

    #[test]
    fn shared_records_count_every_rank_and_filenos_are_not_opens() {
        let p = parse_text(SAMPLE, "s", "x.txt", "test").unwrap();
        assert_eq!(p.processes.len(), 2);
        let f = &p.files[0];
        assert_eq!(f.processes, 2);
        assert_eq!(f.counters.opens, 3);
        assert_eq!(f.counters.max_byte_read, 100);
        assert_eq!(f.counters.hist_read[1], 1);
        assert_eq!(f.counters.meta_time_ns, 250_000_000);
    }

    #[test]
    fn a_malformed_line_is_named() {
        let bad = "POSIX\t0\t7\tPOSIX_OPENS\tmany\t/d/f\t/\text4\n";
        let e = parse_text(bad, "s", "x.txt", "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.txt:1") && e.contains("many"), "{e}");
    }
}
