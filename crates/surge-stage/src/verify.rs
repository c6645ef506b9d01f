//! Verifying a finished stage: every file of a plan compared with its copy, chunk by chunk
//! (xxh3), without copying anything. `execute` with `checksum` checks each copy as it makes
//! it; this checks copies made earlier (after a restart, or before trusting a stage-out enough
//! to destroy the instance).

use crate::copy::run_bounded;
use crate::ns;
use crate::plan::{FileEntry, Source};
use crate::{Direction, Plan, Progress, StageError, StageFailure, StageOptions, StageReport};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;
use surge_client::InstanceClient;
use surge_core::Ino;
use xxhash_rust::xxh3::xxh3_64;

/// Compares every file of `plan` with its copy. Differences (content, size, a missing copy)
/// are the report's failures.
pub async fn verify(
    client: Arc<InstanceClient>,
    plan: &Plan,
    opts: &StageOptions,
    progress: Arc<Progress>,
) -> Result<StageReport, StageError> {
    let start = Instant::now();
    progress.begin(plan);
    let chunk = opts.chunk_size.clamp(64 << 10, 64 << 20);
    let direction = plan.direction;
    let results: Vec<(FileEntry, Result<u64, String>)> =
        run_bounded(plan.file_list.clone(), opts.workers.clamp(1, 256), |f| {
            let client = client.clone();
            let progress = progress.clone();
            async move {
                let r = if progress.is_cancelled() {
                    Err("cancelled".to_string())
                } else {
                    verify_one(&client, direction, &f, chunk, &progress).await
                };
                (f, r)
            }
        })
        .await;
    progress.end();
    if progress.is_cancelled() {
        return Err(StageError::Cancelled);
    }
    let mut report = StageReport {
        checksummed: true,
        ..StageReport::default()
    };
    for (f, r) in results {
        match r {
            Ok(size) => {
                progress.file_done();
                report.files += 1;
                report.bytes += size;
            }
            Err(e) => {
                progress.file_failed();
                report.push_failure(StageFailure {
                    path: f.source_name.clone(),
                    destination: f.dest.display().to_string(),
                    error: e,
                });
            }
        }
    }
    report.checksummed = report.ok();
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// One side of a comparison.
enum Side {
    Pfs(Arc<File>),
    Instance(Ino),
}

async fn read_chunk(
    client: &InstanceClient,
    side: &Side,
    offset: u64,
    buf: Vec<u8>,
) -> Result<Vec<u8>, String> {
    match side {
        Side::Pfs(f) => {
            let f = f.clone();
            tokio::task::spawn_blocking(move || {
                let mut buf = buf;
                f.read_exact_at(&mut buf, offset)
                    .map(|()| buf)
                    .map_err(|e| format!("cannot read at offset {offset}: {e}"))
            })
            .await
            .map_err(|e| format!("internal error: {e}"))?
        }
        Side::Instance(ino) => {
            let mut buf = buf;
            client
                .read_into(*ino, offset, &mut buf)
                .await
                .map_err(|e| format!("cannot read at offset {offset}: {e}"))?;
            Ok(buf)
        }
    }
}

async fn open_pfs(path: &std::path::Path) -> Result<(Arc<File>, u64), String> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let f = File::open(&p).map_err(|e| format!("cannot open {}: {e}", p.display()))?;
        let len = f
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", p.display()))?
            .len();
        Ok((Arc::new(f), len))
    })
    .await
    .map_err(|e| format!("internal error: {e}"))?
}

async fn verify_one(
    client: &InstanceClient,
    direction: Direction,
    f: &FileEntry,
    chunk: u64,
    progress: &Progress,
) -> Result<u64, String> {
    let (src, src_len, dst, dst_len) = match (direction, &f.source) {
        (Direction::In, Source::Pfs(p)) => {
            let (file, len) = open_pfs(p).await?;
            let a = ns::resolve(client, &f.dest)
                .await
                .map_err(|e| format!("the copy {} cannot be found: {e}", f.dest.display()))?;
            (Side::Pfs(file), len, Side::Instance(a.ino), a.size)
        }
        (Direction::Out, Source::Instance(ino)) => {
            let a = client
                .getattr(*ino)
                .await
                .map_err(|e| format!("the source cannot be read: {e}"))?;
            let (file, len) = open_pfs(&f.dest).await?;
            (Side::Instance(*ino), a.size, Side::Pfs(file), len)
        }
        _ => return Err("internal error: source on the wrong side".into()),
    };
    if src_len != dst_len {
        return Err(format!(
            "size differs: the source has {src_len} bytes, the copy {dst_len}"
        ));
    }
    let mut offset = 0;
    while offset < src_len {
        let len = (src_len - offset).min(chunk) as usize;
        let a = read_chunk(client, &src, offset, vec![0u8; len]).await?;
        let b = read_chunk(client, &dst, offset, vec![0u8; len]).await?;
        if xxh3_64(&a) != xxh3_64(&b) {
            return Err(format!(
                "checksum mismatch: the copy differs from the source in the {len} bytes at offset {offset}"
            ));
        }
        progress.add_bytes(len as u64);
        offset += len as u64;
    }
    Ok(src_len)
}
