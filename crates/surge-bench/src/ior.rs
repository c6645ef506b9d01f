//! `surge bench io`: IOR's bandwidth and IOPS test. This module holds the parameters (in IOR's
//! vocabulary), their validation, and what one process does in one phase: open, a plain
//! `pwrite`/`pread` loop over preallocated buffers, optional fsync, close. Everything around it
//! (processes, barriers, repetitions, reports) is in [`crate::run`].
//!
//! The hot loop does per transfer: one offset computation, an optional 16-byte stamp, the I/O
//! call through the backend, one clock read and one histogram increment. Nothing allocates.

use crate::backend::{Backend, BenchFile, OpenFlags};
use crate::buffer::AlignedBuf;
use crate::clock::mono_ns;
use crate::histogram::Histogram;
use crate::layout::{self, TransferOrder};
use crate::result::{Phase, RankResult};
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How often a worker reports progress to the parent.
pub const PROGRESS_NS: u64 = 250_000_000;

/// The largest shuffled order we build (8 bytes per transfer per process).
const MAX_RANDOM_TRANSFERS: u64 = 1 << 26;

/// Parameters of an IOR-style run, named as IOR names them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoParams {
    /// Bytes per I/O call (IOR `-t`).
    pub transfer: u64,
    /// Bytes per process per segment (IOR `-b`).
    pub block: u64,
    /// Number of blocks per process (IOR `-s`).
    pub segments: u64,
    /// Processes (IOR's MPI ranks).
    pub procs: u32,
    /// One file shared by all processes instead of a file per process (IOR without `-F`).
    pub shared_file: bool,
    /// Shuffled offsets (IOR `-z`).
    pub random: bool,
    /// fsync after every write (IOR `-Y`).
    pub fsync_per_write: bool,
    /// fsync before close after writing (IOR `-e`).
    pub fsync: bool,
    /// O_DIRECT (IOR `--posix.odirect`).
    pub direct: bool,
    /// Read another process's data (IOR `-C`).
    pub reorder: bool,
    /// Drop the file's pages from the page cache before reading (fio's `invalidate=1`).
    pub drop_cache: bool,
    /// Check that every transfer read carries the writer's stamp (IOR `-R`).
    pub verify: bool,
    pub write: bool,
    pub read: bool,
    pub repetitions: u32,
    /// Stop a phase after this many seconds (IOR `-D`, stonewalling).
    pub deadline_s: Option<f64>,
    /// Seed of the random offsets.
    pub seed: u64,
}

impl Default for IoParams {
    fn default() -> Self {
        IoParams {
            transfer: 8 << 20,
            block: 64 << 20,
            segments: 1,
            procs: 1,
            shared_file: false,
            random: false,
            fsync_per_write: false,
            fsync: false,
            direct: false,
            reorder: true,
            drop_cache: false,
            verify: false,
            write: true,
            read: true,
            repetitions: 1,
            deadline_s: None,
            seed: 0x5eed,
        }
    }
}

impl IoParams {
    pub fn transfers_per_block(&self) -> u64 {
        self.block / self.transfer
    }
    pub fn transfers_per_rank(&self) -> u64 {
        self.segments * self.transfers_per_block()
    }
    pub fn bytes_per_rank(&self) -> u64 {
        self.segments * self.block
    }
    pub fn aggregate_bytes(&self) -> u64 {
        u64::from(self.procs) * self.bytes_per_rank()
    }
    /// The phases run in each repetition, in order.
    pub fn phases(&self) -> Vec<Phase> {
        let mut v = Vec::new();
        if self.write {
            v.push(Phase::Write);
        }
        if self.read {
            v.push(Phase::Read);
        }
        v
    }

    /// Checks the parameters before anything touches storage.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Params(m));
        if self.transfer == 0 || self.block == 0 || self.segments == 0 {
            return bad("--transfer, --block and --segments must be positive".into());
        }
        if self.transfer > 1 << 30 {
            return bad(format!(
                "--transfer {} is larger than 1 GiB; each process holds one transfer in memory",
                self.transfer
            ));
        }
        if !self.block.is_multiple_of(self.transfer) {
            return bad(format!(
                "--block ({}) must be a multiple of --transfer ({}), as in IOR",
                self.block, self.transfer
            ));
        }
        if self.procs == 0 || self.procs > 4096 {
            return bad(format!("--procs {} is not in 1..=4096", self.procs));
        }
        if self.repetitions == 0 {
            return bad("--repetitions must be at least 1".into());
        }
        if !self.write && !self.read {
            return bad("nothing to do: both the write and the read phase are disabled".into());
        }
        if self.direct && (!self.transfer.is_multiple_of(4096) || !self.block.is_multiple_of(4096))
        {
            return bad(format!(
                "--direct needs --transfer ({}) and --block ({}) to be multiples of 4096 bytes \
                 (O_DIRECT offsets and sizes must be block-aligned)",
                self.transfer, self.block
            ));
        }
        if self.verify && self.transfer < 16 {
            return bad("--verify needs --transfer of at least 16 bytes (the stamp)".into());
        }
        if self.random && self.transfers_per_rank() > MAX_RANDOM_TRANSFERS {
            return bad(format!(
                "--random with {} transfers per process is too many to shuffle in memory \
                 (limit {MAX_RANDOM_TRANSFERS}); use a larger --transfer or fewer --segments",
                self.transfers_per_rank()
            ));
        }
        if let Some(d) = self.deadline_s {
            if d.is_nan() || d <= 0.0 {
                return bad(format!(
                    "--deadline {d} must be a positive number of seconds"
                ));
            }
        }
        self.aggregate_bytes_checked()?;
        Ok(())
    }

    fn aggregate_bytes_checked(&self) -> Result<u64, BenchError> {
        self.segments
            .checked_mul(self.block)
            .and_then(|b| b.checked_mul(u64::from(self.procs)))
            .ok_or_else(|| BenchError::Params("the aggregate size overflows 64 bits".into()))
    }
}

/// One process's prepared part of one phase: buffer allocated, order computed, cache dropped.
/// Preparing happens before the barrier; [`IoRankTask::run`] is the timed part.
pub struct IoRankTask {
    params: IoParams,
    rank: u32,
    phase: Phase,
    owner: u32,
    path: PathBuf,
    count: u64,
    order: TransferOrder,
    buf: AlignedBuf,
    deadline_s: Option<f64>,
}

fn io_err(op: String, path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

impl IoRankTask {
    /// `limit` caps the transfers (the owner's count after a stonewalled write); `deadline_s`
    /// stonewalls this phase.
    pub fn prepare(
        backend: &dyn Backend,
        params: &IoParams,
        dir: &Path,
        rank: u32,
        phase: Phase,
        limit: Option<u64>,
        deadline_s: Option<f64>,
    ) -> Result<IoRankTask, BenchError> {
        let owner = match phase {
            Phase::Write => rank,
            Phase::Read => layout::read_owner(params, rank),
            other => {
                return Err(BenchError::Params(format!(
                    "{other} is not a phase of the io benchmark"
                )))
            }
        };
        let path = dir.join(layout::file_name(params, owner));
        let count = limit.unwrap_or(u64::MAX).min(params.transfers_per_rank());
        let mut buf = AlignedBuf::new(params.transfer as usize)
            .map_err(|e| BenchError::Params(format!("cannot allocate the transfer buffer: {e}")))?;
        if phase == Phase::Write {
            buf.fill_pseudo_random(params.seed ^ u64::from(rank));
        }
        if phase == Phase::Read && params.drop_cache {
            let f = backend
                .open(&path, OpenFlags::read_only())
                .map_err(io_err("open (to drop its cache)".into(), &path))?;
            f.drop_cache()
                .map_err(io_err("drop cache of".into(), &path))?;
            f.close().map_err(io_err("close".into(), &path))?;
        }
        Ok(IoRankTask {
            params: params.clone(),
            rank,
            phase,
            owner,
            path,
            count,
            order: TransferOrder::for_owner(params, owner),
            buf,
            deadline_s,
        })
    }

    /// The timed part: open, transfers, fsync at close if asked, close. `progress` receives the
    /// number of transfers done about every [`PROGRESS_NS`].
    pub fn run(
        mut self,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(u64),
    ) -> Result<RankResult, BenchError> {
        let p = &self.params;
        let write = self.phase == Phase::Write;
        let flags = if write {
            OpenFlags::create_write()
        } else {
            OpenFlags::read_only()
        }
        .with_direct(p.direct);

        let start_ns = mono_ns();
        let file = backend
            .open(&self.path, flags)
            .map_err(io_err("open".into(), &self.path))?;
        let io_start_ns = mono_ns();
        let deadline_at = match self.deadline_s {
            Some(d) => io_start_ns.saturating_add((d * 1e9) as u64),
            None => u64::MAX,
        };
        let mut hist = Histogram::new();
        let loop_result = if write {
            write_loop(
                &*file,
                p,
                self.owner,
                &self.order,
                self.count,
                self.buf.as_mut_slice(),
                deadline_at,
                &mut hist,
                progress,
            )
        } else {
            read_loop(
                &*file,
                p,
                self.owner,
                &self.order,
                self.count,
                self.buf.as_mut_slice(),
                deadline_at,
                &mut hist,
                progress,
            )
        };
        let (done, io_end_ns, verify_errors) = match loop_result {
            Ok(v) => v,
            Err((op, offset, e)) => {
                let _ = file.close();
                return Err(BenchError::Io {
                    op: format!("{op} at offset {offset} of"),
                    path: self.path.clone(),
                    source: e,
                });
            }
        };
        if write && p.fsync {
            file.sync()
                .map_err(io_err("fsync at close".into(), &self.path))?;
        }
        file.close().map_err(io_err("close".into(), &self.path))?;
        let end_ns = mono_ns();
        Ok(RankResult {
            rank: self.rank,
            ops: done,
            bytes: done * p.transfer,
            start_ns,
            io_start_ns,
            io_end_ns,
            end_ns,
            stonewalled: done < self.count,
            verify_errors,
            latency: hist,
        })
    }
}

type LoopResult = Result<(u64, u64, u64), (&'static str, u64, std::io::Error)>;

#[allow(clippy::too_many_arguments)]
fn write_loop(
    file: &dyn BenchFile,
    p: &IoParams,
    owner: u32,
    order: &TransferOrder,
    count: u64,
    buf: &mut [u8],
    deadline_at: u64,
    hist: &mut Histogram,
    progress: &mut dyn FnMut(u64),
) -> LoopResult {
    let stamp = layout::stamp_word(owner).to_le_bytes();
    let stamped = buf.len() >= 16;
    let mut prev = mono_ns();
    let mut next_progress = prev + PROGRESS_NS;
    let mut done = 0u64;
    while done < count && prev < deadline_at {
        let off = layout::offset(p, owner, order.index(done));
        if stamped {
            buf[..8].copy_from_slice(&stamp);
            buf[8..16].copy_from_slice(&off.to_le_bytes());
        }
        file.write_all_at(buf, off).map_err(|e| ("write", off, e))?;
        if p.fsync_per_write {
            file.sync().map_err(|e| ("fsync after write", off, e))?;
        }
        let now = mono_ns();
        hist.record(now - prev);
        prev = now;
        done += 1;
        if now >= next_progress {
            progress(done);
            next_progress = now + PROGRESS_NS;
        }
    }
    Ok((done, prev, 0))
}

#[allow(clippy::too_many_arguments)]
fn read_loop(
    file: &dyn BenchFile,
    p: &IoParams,
    owner: u32,
    order: &TransferOrder,
    count: u64,
    buf: &mut [u8],
    deadline_at: u64,
    hist: &mut Histogram,
    progress: &mut dyn FnMut(u64),
) -> LoopResult {
    let stamp = layout::stamp_word(owner).to_le_bytes();
    let mut prev = mono_ns();
    let mut next_progress = prev + PROGRESS_NS;
    let mut done = 0u64;
    let mut bad = 0u64;
    while done < count && prev < deadline_at {
        let off = layout::offset(p, owner, order.index(done));
        file.read_exact_at(buf, off).map_err(|e| ("read", off, e))?;
        if p.verify && (buf[..8] != stamp || buf[8..16] != off.to_le_bytes()) {
            bad += 1;
        }
        let now = mono_ns();
        hist.record(now - prev);
        prev = now;
        done += 1;
        if now >= next_progress {
            progress(done);
            next_progress = now + PROGRESS_NS;
        }
    }
    Ok((done, prev, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PosixBackend;

    fn small(shared: bool, random: bool) -> IoParams {
        IoParams {
            transfer: 4096,
            block: 4096 * 4,
            segments: 3,
            procs: 3,
            shared_file: shared,
            random,
            verify: true,
            ..IoParams::default()
        }
    }

    /// Runs a phase for every rank in turn, in this process.
    fn run_all(p: &IoParams, dir: &Path, phase: Phase) -> Vec<RankResult> {
        (0..p.procs)
            .map(|r| {
                IoRankTask::prepare(&PosixBackend, p, dir, r, phase, None, None)
                    .unwrap()
                    .run(&PosixBackend, &mut |_| {})
                    .unwrap()
            })
            .collect()
    }

    fn stamps_in(path: &Path, transfer: u64) -> Vec<(u64, u64)> {
        let data = std::fs::read(path).unwrap();
        data.chunks(transfer as usize)
            .map(|c| {
                let w = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap());
                (w(0) & 0xffff, w(8))
            })
            .collect()
    }

    #[test]
    fn file_per_process_writes_one_file_of_segments_times_block_each() {
        let tmp = tempfile::tempdir().unwrap();
        let p = small(false, false);
        let w = run_all(&p, tmp.path(), Phase::Write);
        for r in 0..3u32 {
            let f = tmp.path().join(format!("data.0000{r}"));
            assert_eq!(std::fs::metadata(&f).unwrap().len(), 3 * 4 * 4096);
            // Every transfer carries its writer and its own offset.
            for (i, (owner, off)) in stamps_in(&f, 4096).into_iter().enumerate() {
                assert_eq!((owner, off), (u64::from(r), i as u64 * 4096));
            }
            assert_eq!(w[r as usize].ops, 12);
            assert_eq!(w[r as usize].bytes, 12 * 4096);
            assert!(!w[r as usize].stonewalled);
        }
    }

    #[test]
    fn shared_file_interleaves_processes_per_segment() {
        let tmp = tempfile::tempdir().unwrap();
        let p = small(true, true);
        run_all(&p, tmp.path(), Phase::Write);
        let f = tmp.path().join("data.shared");
        assert_eq!(std::fs::metadata(&f).unwrap().len(), p.aggregate_bytes());
        let stamps = stamps_in(&f, 4096);
        for (i, (owner, off)) in stamps.into_iter().enumerate() {
            let block_no = i as u64 / 4; // 4 transfers per block
            assert_eq!(owner, block_no % 3, "transfer {i}");
            assert_eq!(off, i as u64 * 4096);
        }
    }

    #[test]
    fn read_phase_reads_the_next_process_data_and_verifies_it() {
        let tmp = tempfile::tempdir().unwrap();
        for shared in [false, true] {
            let dir = tmp.path().join(format!("s{shared}"));
            std::fs::create_dir(&dir).unwrap();
            let p = small(shared, true);
            run_all(&p, &dir, Phase::Write);
            let r = run_all(&p, &dir, Phase::Read);
            assert!(r.iter().all(|x| x.verify_errors == 0 && x.ops == 12));
        }
        // Verification can fail: put rank 1's data where rank 0's should be and read it back as
        // rank 0's without reordering.
        let dir = tmp.path().join("swapped");
        std::fs::create_dir(&dir).unwrap();
        let mut p = small(false, false);
        run_all(&p, &dir, Phase::Write);
        std::fs::copy(dir.join("data.00001"), dir.join("data.00000")).unwrap();
        p.reorder = false;
        let r0 = IoRankTask::prepare(&PosixBackend, &p, &dir, 0, Phase::Read, None, None)
            .unwrap()
            .run(&PosixBackend, &mut |_| {})
            .unwrap();
        assert_eq!(r0.verify_errors, 12);
    }

    #[test]
    fn limit_and_deadline_cap_the_transfers() {
        let tmp = tempfile::tempdir().unwrap();
        let p = small(false, false);
        let r = IoRankTask::prepare(
            &PosixBackend,
            &p,
            tmp.path(),
            0,
            Phase::Write,
            Some(5),
            None,
        )
        .unwrap()
        .run(&PosixBackend, &mut |_| {})
        .unwrap();
        assert_eq!((r.ops, r.bytes), (5, 5 * 4096));
        assert!(!r.stonewalled, "a limit is not a deadline");
        let r = IoRankTask::prepare(
            &PosixBackend,
            &p,
            tmp.path(),
            1,
            Phase::Write,
            None,
            Some(1e-9),
        )
        .unwrap()
        .run(&PosixBackend, &mut |_| {})
        .unwrap();
        assert!(r.ops <= 1 && r.stonewalled, "{}", r.ops);
    }

    #[test]
    fn validation_names_the_offending_option() {
        let mut p = IoParams {
            transfer: 3000,
            block: 4096,
            ..IoParams::default()
        };
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("multiple of --transfer"));
        p.block = 6000;
        p.direct = true;
        assert!(p.validate().unwrap_err().to_string().contains("--direct"));
        p.direct = false;
        assert!(p.validate().is_ok());
        p.write = false;
        p.read = false;
        assert!(p.validate().is_err());
    }
}
