//! Following a stage task run by the manager: a live line on a terminal, one line per second
//! otherwise, until the task is done or failed.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use surge_api::v1 as api;
use surge_core::format_bytes;

fn line(label: &str, t: &api::StageTask) -> String {
    let pct = if t.bytes_total > 0 {
        t.bytes_done as f64 * 100.0 / t.bytes_total as f64
    } else if t.files_total > 0 {
        t.files_done as f64 * 100.0 / t.files_total as f64
    } else {
        0.0
    };
    let rate = if t.seconds > 0.0 {
        t.bytes_done as f64 / 1048576.0 / t.seconds
    } else {
        0.0
    };
    format!(
        "{label}: {pct:5.1}%  {}/{} files  {}/{}  {rate:.0} MiB/s",
        t.files_done,
        t.files_total,
        format_bytes(t.bytes_done),
        format_bytes(t.bytes_total)
    )
}

/// Polls task `t` until it ends; `stop` lets a caller give up (e.g. on Ctrl-C).
pub async fn wait_stage(
    c: &mut surge_api::Client,
    mut t: api::StageTask,
    label: &str,
    quiet: bool,
    stop: impl Fn() -> bool,
) -> anyhow::Result<api::StageTask> {
    let tty = std::io::stderr().is_terminal();
    let mut last_log = Instant::now();
    let mut drew = false;
    while t.in_progress() {
        if stop() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        t = c
            .get_stage(api::GetStageRequest { id: t.id })
            .await
            .map_err(status_err)?
            .into_inner();
        if quiet {
            continue;
        }
        if tty {
            eprint!("\r\x1b[2K{}", line(label, &t));
            let _ = std::io::stderr().flush();
            drew = true;
        } else if last_log.elapsed() >= Duration::from_secs(1) {
            eprintln!("{}", line(label, &t));
            last_log = Instant::now();
        }
    }
    if drew {
        eprint!("\r\x1b[2K");
    }
    Ok(t)
}

pub use surge_api::status_err;
