//! Reads the per-process record files the shim writes (`*.surgerec`, layout in
//! `shim/surge_shim.h`) and merges them into a [`Profile`].
//!
//! The reader takes the record size, offsets and counter names from each file's header, so a
//! counter the Rust side does not know is skipped (and reported), never misread.

use crate::model::{Counters, Ending, FileKind, FileStats, Process, Profile, Timeline};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const MAGIC: u64 = 0x3152_5045_4752_5553; // "SURGEPR1"
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 4752;
const BIN_FIELDS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot read record file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path} is not a surge record file (bad magic; the process may have died while starting)"
    )]
    BadMagic { path: String },
    #[error("{path} has record version {found}, this surge reads version {VERSION}")]
    Version { path: String, found: u32 },
    #[error("{path} is inconsistent: {what}")]
    Corrupt { path: String, what: String },
}

/// One process's record, timestamps still in CLOCK_MONOTONIC nanoseconds.
#[derive(Debug, Clone)]
pub struct ProcessRecord {
    pub pid: i32,
    pub ppid: i32,
    pub start_mono_ns: u64,
    pub start_real_ns: u64,
    pub last_mono_ns: u64,
    pub end_mono_ns: u64,
    pub ended: u32,
    pub peak_rss_kib: u64,
    pub threads_peak: u32,
    pub io_threads: u32,
    pub dropped_paths: u64,
    pub exe: String,
    pub cmdline: String,
    pub bin_width_ns: u64,
    /// bins[i] = [bytes_read, bytes_written, data_ops, meta_ops]
    pub bins: Vec<[u64; 4]>,
    pub files: Vec<(String, FileKind, Counters)>,
    /// Counter names in the file that this reader does not know.
    pub unknown_counters: Vec<String>,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Sets the counter called `name`; false when the name is unknown.
pub fn set_counter(c: &mut Counters, name: &str, v: u64) -> bool {
    if let Some(rest) = name.strip_prefix("hist_read_") {
        return set_hist(&mut c.hist_read, rest, v);
    }
    if let Some(rest) = name.strip_prefix("hist_write_") {
        return set_hist(&mut c.hist_write, rest, v);
    }
    let slot = match name {
        "opens" => &mut c.opens,
        "closes" => &mut c.closes,
        "reads" => &mut c.reads,
        "writes" => &mut c.writes,
        "bytes_read" => &mut c.bytes_read,
        "bytes_written" => &mut c.bytes_written,
        "seeks" => &mut c.seeks,
        "stats" => &mut c.stats,
        "syncs" => &mut c.syncs,
        "unlinks" => &mut c.unlinks,
        "renames" => &mut c.renames,
        "mkdirs" => &mut c.mkdirs,
        "rmdirs" => &mut c.rmdirs,
        "opendirs" => &mut c.opendirs,
        "readdirs" => &mut c.readdirs,
        "accesses" => &mut c.accesses,
        "meta_errors" => &mut c.meta_errors,
        "stdio_opens" => &mut c.stdio_opens,
        "stdio_closes" => &mut c.stdio_closes,
        "stdio_reads" => &mut c.stdio_reads,
        "stdio_writes" => &mut c.stdio_writes,
        "stdio_bytes_read" => &mut c.stdio_bytes_read,
        "stdio_bytes_written" => &mut c.stdio_bytes_written,
        "stdio_seeks" => &mut c.stdio_seeks,
        "stdio_flushes" => &mut c.stdio_flushes,
        "stdio_kernel_reads_est" => &mut c.stdio_kernel_reads_est,
        "stdio_kernel_writes_est" => &mut c.stdio_kernel_writes_est,
        "read_time_ns" => &mut c.read_time_ns,
        "write_time_ns" => &mut c.write_time_ns,
        "meta_time_ns" => &mut c.meta_time_ns,
        "sync_time_ns" => &mut c.sync_time_ns,
        "small_data_time_ns" => &mut c.small_data_time_ns,
        "large_data_time_ns" => &mut c.large_data_time_ns,
        "first_ns" => &mut c.first_ns,
        "last_ns" => &mut c.last_ns,
        "first_read_ns" => &mut c.first_read_ns,
        "first_write_ns" => &mut c.first_write_ns,
        "max_byte_read" => &mut c.max_byte_read,
        "max_byte_written" => &mut c.max_byte_written,
        "size_seen" => &mut c.size_seen,
        _ => return false,
    };
    *slot = v;
    true
}

fn set_hist(h: &mut [u64; 10], bucket: &str, v: u64) -> bool {
    const NAMES: [&str; 10] = [
        "0_100", "100_1k", "1k_10k", "10k_100k", "100k_1m", "1m_4m", "4m_10m", "10m_100m",
        "100m_1g", "1g_plus",
    ];
    match NAMES.iter().position(|n| *n == bucket) {
        Some(i) => {
            h[i] = v;
            true
        }
        None => false,
    }
}

fn read_at(f: &mut File, off: u64, len: usize, path: &str) -> Result<Vec<u8>, RecordError> {
    let io = |source| RecordError::Io {
        path: path.to_string(),
        source,
    };
    f.seek(SeekFrom::Start(off)).map_err(io)?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

/// Reads one record file.
pub fn read_record(path: &Path) -> Result<ProcessRecord, RecordError> {
    let p = path.display().to_string();
    let mut f = File::open(path).map_err(|source| RecordError::Io {
        path: p.clone(),
        source,
    })?;
    let h = read_at(&mut f, 0, HEADER_BYTES, &p)?;
    if u64_at(&h, 0) != MAGIC {
        return Err(RecordError::BadMagic { path: p });
    }
    let version = u32_at(&h, 8);
    if version != VERSION {
        return Err(RecordError::Version {
            path: p,
            found: version,
        });
    }
    let corrupt = |what: &str| RecordError::Corrupt {
        path: p.clone(),
        what: what.to_string(),
    };
    let record_size = u32_at(&h, 16) as usize;
    let max_records = u32_at(&h, 20) as usize;
    let ncounters = u32_at(&h, 24) as usize;
    let nbins = u32_at(&h, 28) as usize;
    let records_off = u64_at(&h, 32);
    let arena_off = u64_at(&h, 40);
    let bins_off = u64_at(&h, 48);
    let n_records = (u32_at(&h, 100) as usize).min(max_records);
    let arena_used = u64_at(&h, 104) as usize;
    if record_size < 24 + 8 * ncounters || arena_used > (64 << 20) || nbins > 1 << 20 {
        return Err(corrupt("header sizes out of range"));
    }
    let names: Vec<String> = cstr(&h[2704..4752])
        .split(',')
        .map(str::to_string)
        .collect();
    if names.len() != ncounters {
        return Err(corrupt("counter names do not match the counter count"));
    }
    let recs = read_at(&mut f, records_off, n_records * record_size, &p)?;
    let arena = read_at(&mut f, arena_off, arena_used, &p)?;
    let raw_bins = read_at(&mut f, bins_off, nbins * BIN_FIELDS * 8, &p)?;

    let mut unknown_counters = Vec::new();
    let mut probe = Counters::default();
    for n in &names {
        if !set_counter(&mut probe, n, 0) {
            unknown_counters.push(n.clone());
        }
    }
    let mut files = Vec::with_capacity(n_records);
    for i in 0..n_records {
        let r = &recs[i * record_size..(i + 1) * record_size];
        if u64_at(r, 0) == 0 {
            continue; // a slot being filled when the process died
        }
        let off = u32_at(r, 8) as usize;
        let len = u32_at(r, 12) as usize;
        let Some(path_bytes) = arena.get(off..off + len) else {
            return Err(corrupt(&format!(
                "record {i} points outside the path arena"
            )));
        };
        let path = String::from_utf8_lossy(path_bytes).into_owned();
        let kind = FileKind::from_shim(u32_at(r, 16));
        let mut c = Counters::default();
        for (k, name) in names.iter().enumerate() {
            set_counter(&mut c, name, u64_at(r, 24 + 8 * k));
        }
        files.push((path, kind, c));
    }
    let bins = (0..nbins)
        .map(|i| {
            let b = i * BIN_FIELDS * 8;
            [
                u64_at(&raw_bins, b),
                u64_at(&raw_bins, b + 8),
                u64_at(&raw_bins, b + 16),
                u64_at(&raw_bins, b + 24),
            ]
        })
        .collect();
    Ok(ProcessRecord {
        pid: u32_at(&h, 56) as i32,
        ppid: u32_at(&h, 60) as i32,
        start_mono_ns: u64_at(&h, 64),
        start_real_ns: u64_at(&h, 72),
        last_mono_ns: u64_at(&h, 80),
        end_mono_ns: u64_at(&h, 88),
        ended: u32_at(&h, 96),
        peak_rss_kib: u64_at(&h, 112),
        threads_peak: u32_at(&h, 120),
        io_threads: u32_at(&h, 124),
        dropped_paths: u64_at(&h, 136),
        exe: cstr(&h[144..656]),
        cmdline: cstr(&h[656..2704]).trim_end().to_string(),
        bin_width_ns: u64_at(&h, 128).max(1),
        bins,
        files,
        unknown_counters,
    })
}

/// All record files in a directory, oldest process first.
pub fn read_dir(dir: &Path) -> Result<(Vec<ProcessRecord>, Vec<String>), RecordError> {
    let io = |source| RecordError::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "surgerec"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for p in paths {
        // A process that died (or was caught) between creating its file and sizing it leaves
        // a file shorter than the header: nothing was recorded in it.
        if let Ok(m) = std::fs::metadata(&p) {
            if m.len() < HEADER_BYTES as u64 {
                problems.push(format!(
                    "{}: {} byte(s), shorter than a record's header (process died while \
                     starting): skipped",
                    p.display(),
                    m.len()
                ));
                continue;
            }
        }
        match read_record(&p) {
            Ok(r) => out.push(r),
            // A process killed between creating its file and writing the header leaves an
            // empty record: say so, keep the others.
            Err(RecordError::BadMagic { path }) => problems.push(format!(
                "{path}: empty record (process died while starting)"
            )),
            Err(e) => return Err(e),
        }
    }
    out.sort_by_key(|r| (r.start_mono_ns, r.pid));
    Ok((out, problems))
}

/// Shifts a monotonic timestamp to "ns since t0", keeping 0 as "never".
fn rel(ts: u64, t0: u64) -> u64 {
    if ts == 0 {
        0
    } else {
        ts.saturating_sub(t0).max(1)
    }
}

/// Merges process records into the profile: one [`Process`] each, files summed by path, and
/// the timelines resampled onto one grid. `t0_mono_ns` is the profile's start.
pub fn merge_into(profile: &mut Profile, records: &[ProcessRecord], t0_mono_ns: u64) {
    let mut by_path: HashMap<String, usize> = HashMap::new();
    for r in records {
        let ending = match r.ended {
            1 => Ending::Exit,
            2 => Ending::Exec,
            _ => Ending::Unknown,
        };
        let end = if r.end_mono_ns > 0 {
            r.end_mono_ns
        } else {
            r.last_mono_ns
        };
        profile.processes.push(Process {
            pid: i64::from(r.pid),
            ppid: i64::from(r.ppid),
            exe: r.exe.clone(),
            cmdline: r.cmdline.clone(),
            start_s: rel(r.start_mono_ns, t0_mono_ns) as f64 / 1e9,
            end_s: rel(end, t0_mono_ns) as f64 / 1e9,
            ending,
            threads: r.threads_peak,
            io_threads: r.io_threads,
            peak_rss_bytes: r.peak_rss_kib * 1024,
        });
        if r.dropped_paths > 0 {
            profile.caveats.push(format!(
                "process {} touched more files than its record holds: {} calls are counted under <other files>",
                r.pid, r.dropped_paths
            ));
        }
        for u in &r.unknown_counters {
            profile
                .caveats
                .push(format!("process {}: unknown counter '{u}' ignored", r.pid));
        }
        for (path, kind, c) in &r.files {
            let c0 = c;
            if c0 == &Counters::default() && *kind == FileKind::Unknown {
                continue; // the empty overflow record
            }
            let mut c = c0.clone();
            c.first_ns = rel(c.first_ns, t0_mono_ns);
            c.last_ns = rel(c.last_ns, t0_mono_ns);
            c.first_read_ns = rel(c.first_read_ns, t0_mono_ns);
            c.first_write_ns = rel(c.first_write_ns, t0_mono_ns);
            match by_path.get(path) {
                Some(&i) => {
                    let f = &mut profile.files[i];
                    f.counters.merge(&c);
                    f.processes += 1;
                    if matches!(f.kind, FileKind::Unknown | FileKind::Missing)
                        && *kind != FileKind::Unknown
                    {
                        f.kind = *kind;
                    }
                }
                None => {
                    by_path.insert(path.clone(), profile.files.len());
                    profile.files.push(FileStats {
                        path: path.clone(),
                        exists_after: None,
                        kind: *kind,
                        processes: 1,
                        counters: c,
                    });
                }
            }
        }
    }
    profile.files.sort_by(|a, b| a.path.cmp(&b.path));
    profile.timeline = merge_timelines(records, t0_mono_ns, profile.wall_time_s);
}

/// Resamples every process's bins onto one grid starting at t0: the widest bin width in use,
/// doubled until the run fits in 512 bins.
fn merge_timelines(records: &[ProcessRecord], t0: u64, wall_s: f64) -> Timeline {
    let mut width = records
        .iter()
        .map(|r| r.bin_width_ns)
        .max()
        .unwrap_or(10_000_000);
    let span = (wall_s * 1e9) as u64;
    while span / width >= 512 {
        width *= 2;
    }
    let n = (span / width + 1) as usize;
    let mut t = Timeline {
        bin_s: width as f64 / 1e9,
        bytes_read: vec![0; n],
        bytes_written: vec![0; n],
        data_ops: vec![0; n],
        meta_ops: vec![0; n],
    };
    for r in records {
        for (i, b) in r.bins.iter().enumerate() {
            if b.iter().all(|&v| v == 0) {
                continue;
            }
            let at = (r.start_mono_ns + i as u64 * r.bin_width_ns).saturating_sub(t0);
            let j = ((at / width) as usize).min(n - 1);
            t.bytes_read[j] += b[0];
            t.bytes_written[j] += b[1];
            t.data_ops[j] += b[2];
            t.meta_ops[j] += b[3];
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_name_of_the_shim_is_known() {
        let header = include_str!("../shim/surge_shim.h");
        let mut c = Counters::default();
        let mut n = 0;
        for line in header.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("X(") {
                let name = rest.split('"').nth(1).unwrap_or_default();
                assert!(
                    set_counter(&mut c, name, 1),
                    "counter {name} unknown to Rust"
                );
                n += 1;
            }
        }
        assert_eq!(n, 60, "the shim defines 60 counters");
    }

    #[test]
    fn a_non_record_file_is_refused_by_magic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.surgerec");
        std::fs::write(&p, vec![0u8; 8192]).unwrap();
        assert!(matches!(read_record(&p), Err(RecordError::BadMagic { .. })));
    }

    #[test]
    fn a_record_file_shorter_than_its_header_is_skipped_and_said() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p1-1-0.surgerec"), b"").unwrap();
        std::fs::write(dir.path().join("p2-1-0.surgerec"), [0u8; 100]).unwrap();
        let (records, problems) = read_dir(dir.path()).expect("read_dir");
        assert!(records.is_empty());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("0 byte(s)"), "{problems:?}");
    }
}
