//! A `type=cache` instance's work as stage tasks, for the batch system's phases (Slurm's
//! `burst_buffer/lua`), where no `surge run` process lives through the job: the lazy fill
//! before the job ([`CacheWork::Fill`]) and the drain during and after it
//! ([`CacheWork::Drain`], then [`CacheWork::DrainAll`]). The manager runs them like copies
//! (`surge stage worker`, as the session's owner, on a data mover when one is alive) and
//! reports them like copies.
//!
//! A drain task runs until it is terminated (SIGTERM, the manager's `cancel`, which the
//! `data_out` phase sends once the job's mounts are gone): it then copies everything still
//! journaled and ends with its report, as `surge run`'s drain does after the job. A drain that
//! makes no progress for [`DRAIN_STALL`] after that fails with the reason and the number of
//! changes not on the PFS; nothing is lost (the instance is kept by the phase that fails).
//! After it, the phase runs a [`CacheWork::DrainAll`] task, which drains what is left and
//! ends: it finds nothing when the first drain finished, and does the whole drain when that
//! one never ran (queued without a data mover, terminated before it started) or was lost.

use crate::drain::{drain_loop, DrainState};
use crate::worker::Event;
use crate::{ProgressSnapshot, StageReport};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_client::InstanceClient;

pub use crate::drain::DRAIN_STALL;

/// Which part of a cache instance's work a task does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheWork {
    /// The lazy fill of the new namespace from the PFS directory (`crate::fill`).
    Fill,
    /// The drain of the journal to the PFS directory until terminated, then to the end.
    Drain,
    /// The drain of everything journaled, at once, then the end (after the job).
    DrainAll,
}

impl CacheWork {
    /// The name a stage task of this kind has (its `direction`).
    pub fn as_str(self) -> &'static str {
        match self {
            CacheWork::Fill => "fill",
            CacheWork::Drain => "drain",
            CacheWork::DrainAll => "drain_all",
        }
    }

    pub fn parse(s: &str) -> Option<CacheWork> {
        match s {
            "fill" => Some(CacheWork::Fill),
            "drain" => Some(CacheWork::Drain),
            "drain_all" => Some(CacheWork::DrainAll),
            _ => None,
        }
    }
}

/// Runs `work` for the instance of `client`, whose PFS directory is `pfs` (`persistent`: a
/// persistent instance, whose fill names outlive the job); `say` sends the events. Returns
/// whether it succeeded.
pub async fn run(
    work: CacheWork,
    client: Arc<InstanceClient>,
    pfs: PathBuf,
    persistent: bool,
    say: impl Fn(&Event),
) -> bool {
    say(&Event::Planned { files: 0, bytes: 0 });
    match work {
        CacheWork::Fill => fill(&client, &pfs, &say).await,
        CacheWork::Drain => drain(client, pfs, false, persistent, &say).await,
        CacheWork::DrainAll => drain(client, pfs, true, persistent, &say).await,
    }
}

async fn fill(client: &InstanceClient, pfs: &std::path::Path, say: &impl Fn(&Event)) -> bool {
    let t = Instant::now();
    // What a killed job's drain left (its stable names) goes first, as `surge run` does.
    if let Err(e) = crate::drain::clear_through(pfs) {
        say(&Event::Failed(e.to_string()));
        return false;
    }
    let filled = match crate::fill::fill_lazy(client, pfs, || false).await {
        // What the fill made is journaled like any change, and is on the PFS already: the
        // journal is emptied, so the drain copies only what the job changes.
        Ok(st) => match client.drain_ack(u64::MAX, Vec::new()).await {
            Ok(()) => Ok(st),
            Err(e) => Err(format!(
                "cannot clear the cache's journal after the fill: {e}"
            )),
        },
        Err(e) => Err(format!(
            "the fill of the cache from {} failed: {e}",
            pfs.display()
        )),
    };
    match filled {
        Ok(st) => {
            say(&Event::Done(StageReport {
                files: st.lazy_files + st.copied_files,
                bytes: st.lazy_bytes + st.copied_bytes,
                dirs: st.dirs,
                symlinks: st.symlinks,
                seconds: t.elapsed().as_secs_f64(),
                ..Default::default()
            }));
            true
        }
        Err(e) => {
            say(&Event::Failed(e));
            false
        }
    }
}

/// `all`: drain what is journaled and end (else: until SIGTERM, then to the end).
async fn drain(
    client: Arc<InstanceClient>,
    pfs: PathBuf,
    all: bool,
    persistent: bool,
    say: &impl Fn(&Event),
) -> bool {
    let t = Instant::now();
    let id = client.desc.instance;
    let state = Arc::new(DrainState::default());
    let stop = Arc::new(AtomicBool::new(all));
    {
        // SIGTERM: the job is over and its mounts are gone: drain everything, then end.
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                term.recv().await;
                stop.store(true, Ordering::SeqCst);
            }
        });
    }
    let task = tokio::spawn(drain_loop(
        client,
        pfs.clone(),
        state.clone(),
        stop.clone(),
        Duration::from_millis(100),
    ));
    let st = &state.stats;
    let snapshot = |finished: bool| ProgressSnapshot {
        files_done: st.files.load(Ordering::Relaxed),
        files_total: 0,
        bytes_done: st.bytes.load(Ordering::Relaxed),
        bytes_total: 0,
        failed: 0,
        elapsed: t.elapsed(),
        finished,
        cancelled: false,
    };
    let watched = crate::drain::watch(
        &state,
        &task,
        DRAIN_STALL,
        Duration::from_millis(200),
        || stop.load(Ordering::SeqCst),
        || say(&Event::Progress(snapshot(false))),
    )
    .await;
    if let Err(why) = watched {
        say(&Event::Failed(format!(
            "the drain to {} {why} (finish it with `surge stage drain --instance {id}`)",
            pfs.display()
        )));
        return false;
    }
    // Drained, mounts gone: the stable names of files written through are extra (a
    // persistent cache keeps them: its lazily filled files still read from them).
    if !persistent {
        if let Err(e) = crate::drain::clear_through(&pfs) {
            tracing::warn!("{e}");
        }
    }
    say(&Event::Progress(snapshot(true)));
    say(&Event::Done(StageReport {
        files: st.files.load(Ordering::Relaxed),
        bytes: st.bytes.load(Ordering::Relaxed),
        seconds: t.elapsed().as_secs_f64(),
        ..Default::default()
    }));
    true
}
