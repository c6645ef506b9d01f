//! The terminal rendering: Daley's tables, the transfer-size histogram, the most expensive
//! files and the verdict, in plain aligned text (no colour when not a terminal).

use super::{sections, top_files};
use crate::model::{Profile, HIST_LABELS};
use crate::tables::Summary;
use std::fmt::Write;

fn bold(s: &str, color: bool) -> String {
    if color {
        format!("\x1b[1m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

fn human_bytes(b: u64) -> String {
    surge_core::format_bytes(b)
}

pub fn render(p: &Profile, s: &Summary, color: bool) -> String {
    let mut o = String::new();
    let src = &p.source;
    let _ = writeln!(
        o,
        "{} {}  ({:?}, {} process{}{})",
        bold("surge profile: stage", color),
        bold(&p.stage, color),
        src.kind,
        p.processes.len(),
        if p.processes.len() == 1 { "" } else { "es" },
        match (src.exit_code, src.signal) {
            (Some(c), _) => format!(", exit {c}"),
            (None, Some(sig)) => format!(", killed by signal {sig}"),
            _ => String::new(),
        }
    );
    if !src.command.is_empty() {
        let _ = writeln!(o, "command: {}", src.command.join(" "));
    }
    if let Some(f) = &src.file {
        let _ = writeln!(o, "from: {f} ({})", src.detail);
    }
    for sec in sections(p, s) {
        let _ = writeln!(o, "\n{}", bold(sec.title, color));
        for r in sec.rows {
            if r.detail.is_empty() {
                let _ = writeln!(o, "  {:<44} {:>12}", r.label, r.value);
            } else {
                let _ = writeln!(o, "  {:<44} {:>12}   {}", r.label, r.value, r.detail);
            }
        }
    }
    let _ = writeln!(o, "\n{}", bold("Transfer sizes (operations)", color));
    let _ = writeln!(o, "  {:<10} {:>10} {:>10}", "size", "reads", "writes");
    for (i, label) in HIST_LABELS.iter().enumerate() {
        if s.hist_read[i] + s.hist_write[i] > 0 {
            let _ = writeln!(
                o,
                "  {:<10} {:>10} {:>10}",
                label, s.hist_read[i], s.hist_write[i]
            );
        }
    }
    let top = top_files(p, 8);
    if !top.is_empty() {
        let _ = writeln!(o, "\n{}", bold("Files by I/O time", color));
        let _ = writeln!(
            o,
            "  {:>9} {:>9} {:>7} {:>7} {:>10}  path",
            "data s", "meta s", "r/w ops", "md ops", "moved"
        );
        for f in top {
            let c = &f.counters;
            let _ = writeln!(
                o,
                "  {:>9.4} {:>9.4} {:>7} {:>7} {:>10}  {}",
                c.data_time_ns() as f64 / 1e9,
                c.meta_time_ns as f64 / 1e9,
                c.data_ops(),
                c.meta_ops(),
                human_bytes(c.bytes_total()),
                f.path
            );
        }
    }
    let v = &s.verdict;
    let _ = writeln!(
        o,
        "\n{} {}",
        bold("Verdict:", color),
        bold(&v.bound.label().to_uppercase(), color)
    );
    let _ = writeln!(o, "  {}", v.reason);
    if let Some(l) = &v.limiter_at_scale {
        let _ = writeln!(
            o,
            "  at scale: {} first, after {} concurrent pipelines (Daley's estimate)",
            l.bound.label(),
            l.pipelines
        );
    }
    for n in &v.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    if !p.caveats.is_empty() {
        let _ = writeln!(o, "\n{}", bold("Caveats", color));
        for c in &p.caveats {
            let _ = writeln!(o, "  - {c}");
        }
    }
    o
}
