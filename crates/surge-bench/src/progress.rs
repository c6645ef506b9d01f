//! The live line on a terminal while a phase runs ("write rep 1/3: 42% 1234 MiB/s 3.1s"),
//! fed by the workers' progress messages. Silent when stderr is not a terminal, so logs and
//! pipes stay clean.

use crate::result::Phase;
use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct ProgressLine {
    enabled: bool,
    /// What runs, e.g. "io /dev/shm procs=4 rep 1/3".
    context: String,
    phase: Option<Phase>,
    /// Operations per process the phase will do (0 = unknown).
    ops_per_rank: u64,
    /// Bytes per operation, to show MiB/s (0 for metadata phases).
    op_bytes: u64,
    done: Vec<u64>,
    started: Instant,
    last_draw: Option<Instant>,
}

impl ProgressLine {
    /// `enabled` is further limited to stderr being a terminal.
    pub fn new(enabled: bool) -> ProgressLine {
        ProgressLine {
            enabled: enabled && std::io::stderr().is_terminal(),
            context: String::new(),
            phase: None,
            ops_per_rank: 0,
            op_bytes: 0,
            done: Vec::new(),
            started: Instant::now(),
            last_draw: None,
        }
    }

    pub fn set_context(&mut self, context: String, ops_per_rank: u64, op_bytes: u64) {
        self.context = context;
        self.ops_per_rank = ops_per_rank;
        self.op_bytes = op_bytes;
    }

    pub fn start_phase(&mut self, phase: Phase, procs: u32) {
        self.phase = Some(phase);
        self.done = vec![0; procs as usize];
        self.started = Instant::now();
        self.last_draw = None;
    }

    pub fn update(&mut self, rank: u32, ops: u64) {
        if let Some(d) = self.done.get_mut(rank as usize) {
            *d = ops;
        }
    }

    /// Redraws at most five times a second unless `force`.
    pub fn draw(&mut self, force: bool) {
        if !self.enabled {
            return;
        }
        if !force
            && self
                .last_draw
                .is_some_and(|t| t.elapsed().as_millis() < 200)
        {
            return;
        }
        self.last_draw = Some(Instant::now());
        let done: u64 = self.done.iter().sum();
        let total = self.ops_per_rank * self.done.len() as u64;
        let secs = self.started.elapsed().as_secs_f64();
        let mut line = format!(
            "{} {}",
            self.context,
            self.phase.map(|p| p.name()).unwrap_or("")
        );
        if total > 0 {
            line += &format!(": {:.0}%", 100.0 * done as f64 / total as f64);
        }
        if secs > 0.0 {
            if self.op_bytes > 0 {
                let mib = (done * self.op_bytes) as f64 / (1u64 << 20) as f64 / secs;
                line += &format!(" {mib:.0} MiB/s");
            } else {
                line += &format!(" {:.0} ops/s", done as f64 / secs);
            }
        }
        line += &format!(" {secs:.1}s");
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{line}");
        let _ = err.flush();
    }

    pub fn finish_phase(&mut self) {
        self.phase = None;
        self.clear();
    }

    pub fn clear(&self) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}
