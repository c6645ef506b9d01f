//! What `surge tune` tells: a short summary on the terminal (or `--json`, schema
//! `surge.tune/1`), and a self-contained HTML report: the chosen configuration, its speed-up
//! over the job as written and over the PFS only, every run (new or from the history), the
//! search's decisions, and a plot of the median time of every configuration tried. Each
//! configuration and run says its layout in words (`stripe_count=all stripe_size=1MiB`, or
//! `mount's choice`), not only through its key, which leaves the mount's choice out.

use crate::history::Run;
use crate::search::median;
use crate::space::Config;
use serde::Serialize;
use std::collections::BTreeMap;

/// A configuration's runs summarised.
#[derive(Clone, Debug, Serialize)]
pub struct Tried {
    pub config: Config,
    pub key: String,
    /// The layout of the files the job makes, in words.
    pub layout: String,
    pub runs: usize,
    pub failed: usize,
    /// Median seconds of the successful runs.
    pub median_s: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TuneReport {
    pub schema: String,
    pub script: String,
    pub tuned_script: String,
    pub html: String,
    pub history: String,
    pub search: String,
    pub space_size: u64,
    pub new_runs: u64,
    pub reused_runs: u64,
    pub budget_exhausted: bool,
    pub as_written: Tried,
    pub pfs_only: Option<Tried>,
    pub best: Tried,
    pub speedup_vs_as_written: Option<f64>,
    pub speedup_vs_pfs_only: Option<f64>,
    pub tried: Vec<Tried>,
    pub runs: Vec<RunRow>,
    pub trace: Vec<String>,
    pub notes: Vec<String>,
}

/// A run as the report shows it: the run, and its layout in words.
#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    #[serde(flatten)]
    pub run: Run,
    pub layout: String,
}

impl From<Run> for RunRow {
    fn from(run: Run) -> RunRow {
        RunRow {
            layout: run.config.layout_text(),
            run,
        }
    }
}

pub fn tried(runs: &[Run]) -> Vec<Tried> {
    let mut by: BTreeMap<Config, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by.entry(r.config.clone()).or_default().push(r);
    }
    let mut out: Vec<Tried> = by
        .into_iter()
        .map(|(c, rs)| Tried {
            key: c.key(),
            layout: c.layout_text(),
            runs: rs.len(),
            failed: rs.iter().filter(|r| !r.ok).count(),
            median_s: median(&rs),
            config: c,
        })
        .collect();
    out.sort_by(|a, b| {
        a.median_s
            .unwrap_or(f64::INFINITY)
            .total_cmp(&b.median_s.unwrap_or(f64::INFINITY))
    });
    out
}

pub fn find(tried: &[Tried], c: &Config) -> Tried {
    tried
        .iter()
        .find(|t| &t.config == c)
        .cloned()
        .unwrap_or(Tried {
            config: c.clone(),
            key: c.key(),
            layout: c.layout_text(),
            runs: 0,
            failed: 0,
            median_s: None,
        })
}

pub fn speedup(base: &Tried, best: &Tried) -> Option<f64> {
    match (base.median_s, best.median_s) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn secs(t: &Tried) -> String {
    match t.median_s {
        Some(s) => format!("{s:.3} s (median of {})", t.runs - t.failed),
        None if t.runs == 0 => "not measured".into(),
        None => "failed".into(),
    }
}

pub fn text(r: &TuneReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "surge tune: {}: {} runs used ({} new, {} from the history) of a space of {} \
         configurations ({})",
        r.script,
        r.new_runs + r.reused_runs,
        r.new_runs,
        r.reused_runs,
        r.space_size,
        r.search
    );
    if r.budget_exhausted {
        let _ = writeln!(o, "  the budget ran out: the result is the best so far");
    }
    let _ = writeln!(
        o,
        "  as written   {:<56} {}",
        r.as_written.key,
        secs(&r.as_written)
    );
    if let Some(p) = &r.pfs_only {
        let _ = writeln!(o, "  PFS only     {:<56} {}", p.key, secs(p));
    }
    let _ = writeln!(o, "  tuned        {:<56} {}", r.best.key, secs(&r.best));
    let _ = writeln!(o, "  layout       {}", r.best.layout);
    let mut sp = Vec::new();
    if let Some(x) = r.speedup_vs_as_written {
        sp.push(format!("{x:.2}x the job as written"));
    }
    if let Some(x) = r.speedup_vs_pfs_only {
        sp.push(format!("{x:.2}x the PFS only"));
    }
    if !sp.is_empty() {
        let _ = writeln!(o, "  speed-up     {}", sp.join(", "));
    }
    let _ = writeln!(o, "tuned script: {}", r.tuned_script);
    let _ = writeln!(o, "report:       {}", r.html);
    let _ = writeln!(o, "history:      {}", r.history);
    for n in &r.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Horizontal bars: median seconds of each configuration, fastest first.
fn plot(r: &TuneReport) -> String {
    let rows: Vec<&Tried> = r.tried.iter().filter(|t| t.median_s.is_some()).collect();
    if rows.is_empty() {
        return String::new();
    }
    let max = rows
        .iter()
        .filter_map(|t| t.median_s)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let (label_w, bar_w, row_h) = (430.0, 380.0, 18.0);
    let h = row_h * rows.len() as f64 + 30.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"11\">",
        label_w + bar_w + 80.0
    );
    for (i, t) in rows.iter().enumerate() {
        let y = 10.0 + i as f64 * row_h;
        let v = t.median_s.unwrap_or(0.0);
        let w = bar_w * v / max;
        let color = if t.config == r.best.config {
            "#2a9d8f"
        } else if t.config == r.as_written.config {
            "#e9c46a"
        } else if t.config.pfs_only() {
            "#e76f51"
        } else {
            "#8da9c4"
        };
        s += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{}\" y=\"{}\" width=\"{w:.1}\" height=\"{}\" fill=\"{color}\"/>\
             <text x=\"{}\" y=\"{}\">{v:.3} s</text>",
            label_w - 6.0,
            y + 12.0,
            esc(&t.key),
            label_w,
            y + 2.0,
            row_h - 4.0,
            label_w + w + 4.0,
            y + 12.0
        );
    }
    s += "</svg>";
    s
}

pub fn html(r: &TuneReport) -> String {
    let mut o = String::new();
    o += "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>surge tune</title><style>\
          body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}\
          td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}td.n{text-align:right}\
          .best{background:#e0f2ef}</style></head><body>";
    o += &format!("<h1>surge tune: {}</h1>", esc(&r.script));
    o += &format!(
        "<p>{} runs used ({} new, {} from the history) in a space of {} configurations; \
         search: {}. Objective: stage in + job + stage out, median seconds.</p>",
        r.new_runs + r.reused_runs,
        r.new_runs,
        r.reused_runs,
        r.space_size,
        esc(&r.search)
    );
    o += "<h2>Result</h2><table><tr><th></th><th>configuration</th><th>layout</th>\
          <th>median</th></tr>";
    let mut row = |name: &str, t: &Tried| {
        o += &format!(
            "<tr><td>{name}</td><td>{}</td><td>{}</td><td class=n>{}</td></tr>",
            esc(&t.key),
            esc(&t.layout),
            esc(&secs(t))
        );
    };
    row("as written", &r.as_written);
    if let Some(p) = &r.pfs_only {
        row("PFS only", p);
    }
    row("tuned", &r.best);
    o += "</table>";
    if let Some(x) = r.speedup_vs_as_written {
        o += &format!("<p>Speed-up over the job as written: <b>{x:.2}x</b>");
        if let Some(y) = r.speedup_vs_pfs_only {
            o += &format!("; over the PFS only: <b>{y:.2}x</b>");
        }
        o += "</p>";
    }
    o += &format!(
        "<p>Tuned script: <code>{}</code>. History: <code>{}</code>.</p>",
        esc(&r.tuned_script),
        esc(&r.history)
    );
    o += "<h2>Configurations tried</h2>";
    o += &plot(r);
    o += "<h2>Runs</h2><table><tr><th>#</th><th>configuration</th><th>layout</th>\
          <th>seconds</th><th>exit</th><th>source</th><th>started</th><th>phases</th></tr>";
    for (i, row) in r.runs.iter().enumerate() {
        let run = &row.run;
        let cls = if run.config == r.best.config {
            " class=best"
        } else {
            ""
        };
        o += &format!(
            "<tr{cls}><td class=n>{}</td><td>{}</td><td>{}</td><td class=n>{}</td>\
             <td class=n>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            i + 1,
            esc(&run.config.key()),
            esc(&row.layout),
            run.seconds
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "failed".into()),
            run.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            if run.new { "new" } else { "history" },
            esc(&run.started_at),
            esc(&run
                .phases
                .iter()
                .map(|(n, s)| format!("{n} {s:.2}"))
                .collect::<Vec<_>>()
                .join(", "))
        );
    }
    o += "</table><h2>Decisions</h2><ul>";
    for t in &r.trace {
        o += &format!("<li>{}</li>", esc(t));
    }
    o += "</ul>";
    if !r.notes.is_empty() {
        o += "<h2>Notes</h2><ul>";
        for n in &r.notes {
            o += &format!("<li>{}</li>", esc(n));
        }
        o += "</ul>";
    }
    o += "</body></html>\n";
    o
}
