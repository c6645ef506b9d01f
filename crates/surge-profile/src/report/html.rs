//! A self-contained HTML report: the tables, the verdict, I/O over time and the transfer-size
//! histogram as inline SVG (no scripts, no external files: it can be mailed or attached).

use super::{sections, top_files};
use crate::model::{Profile, HIST_LABELS};
use crate::tables::Summary;
use std::fmt::Write;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const W: f64 = 760.0;
const H: f64 = 220.0;
const PAD_L: f64 = 64.0;
const PAD_B: f64 = 34.0;

/// Bars of bytes read (blue) and written (orange) per time bin, metadata ops as a line.
fn timeline_svg(p: &Profile) -> String {
    let t = &p.timeline;
    let n = t.bytes_read.len();
    let mut o = String::new();
    if n == 0 {
        return "<p>No timeline recorded by this source.</p>".into();
    }
    let mib = 1024.0 * 1024.0;
    let max_b = (0..n)
        .map(|i| (t.bytes_read[i] + t.bytes_written[i]) as f64 / mib)
        .fold(0.0, f64::max)
        .max(1e-9);
    let max_m = t.meta_ops.iter().copied().max().unwrap_or(0).max(1) as f64;
    let pw = W - PAD_L - 50.0;
    let ph = H - PAD_B - 10.0;
    let bw = pw / n as f64;
    let _ = write!(
        o,
        r#"<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="I/O over time">"#
    );
    for i in 0..n {
        let r = t.bytes_read[i] as f64 / mib;
        let w = t.bytes_written[i] as f64 / mib;
        let x = PAD_L + i as f64 * bw;
        let hr = ph * r / max_b;
        let hw = ph * w / max_b;
        if hr > 0.0 {
            let _ = write!(
                o,
                r##"<rect x="{x:.1}" y="{:.1}" width="{:.2}" height="{hr:.1}" fill="#3b75af"><title>{:.3}s: read {r:.2} MiB</title></rect>"##,
                10.0 + ph - hr,
                bw.max(0.5),
                i as f64 * t.bin_s
            );
        }
        if hw > 0.0 {
            let _ = write!(
                o,
                r##"<rect x="{x:.1}" y="{:.1}" width="{:.2}" height="{hw:.1}" fill="#ef8636"><title>{:.3}s: written {w:.2} MiB</title></rect>"##,
                10.0 + ph - hr - hw,
                bw.max(0.5),
                i as f64 * t.bin_s
            );
        }
    }
    let pts: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "{:.1},{:.1}",
                PAD_L + (i as f64 + 0.5) * bw,
                10.0 + ph - ph * t.meta_ops[i] as f64 / max_m
            )
        })
        .collect();
    let _ = write!(
        o,
        r##"<polyline points="{}" fill="none" stroke="#c03d3e" stroke-width="1.5"/>"##,
        pts.join(" ")
    );
    let total = n as f64 * t.bin_s;
    let _ = write!(
        o,
        r##"<line x1="{PAD_L}" y1="{y}" x2="{x2}" y2="{y}" stroke="#333"/><line x1="{PAD_L}" y1="10" x2="{PAD_L}" y2="{y}" stroke="#333"/>
<text x="{PAD_L}" y="{ty}" font-size="11">0 s</text><text x="{x2}" y="{ty}" font-size="11" text-anchor="end">{total:.2} s</text>
<text x="{lx}" y="16" font-size="11" text-anchor="end">{max_b:.1} MiB</text><text x="{lx}" y="{y}" font-size="11" text-anchor="end">0</text>
<text x="{rx}" y="16" font-size="11" fill="#c03d3e">{max_m:.0} md ops</text>
<text x="{cx}" y="{ly}" font-size="11" text-anchor="middle"><tspan fill="#3b75af">&#9632; MiB read</tspan>  <tspan fill="#ef8636">&#9632; MiB written</tspan>  <tspan fill="#c03d3e">&#8212; metadata ops</tspan> per {bin:.3} s bin</text></svg>"##,
        y = 10.0 + ph,
        x2 = PAD_L + pw,
        ty = 10.0 + ph + 14.0,
        lx = PAD_L - 4.0,
        rx = PAD_L + pw + 4.0,
        cx = PAD_L + pw / 2.0,
        ly = H - 4.0,
        bin = t.bin_s
    );
    o
}

fn histogram_svg(s: &Summary) -> String {
    let mut o = String::new();
    let max = s
        .hist_read
        .iter()
        .chain(s.hist_write.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let pw = W - PAD_L - 10.0;
    let ph = H - PAD_B - 10.0;
    let gw = pw / 10.0;
    let _ = write!(
        o,
        r#"<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="transfer sizes">"#
    );
    for (i, label) in HIST_LABELS.iter().enumerate() {
        let x = PAD_L + i as f64 * gw;
        for (k, (v, color)) in [(s.hist_read[i], "#3b75af"), (s.hist_write[i], "#ef8636")]
            .iter()
            .enumerate()
        {
            // Log scale: a few large transfers must stay visible next to thousands of small.
            let h = if *v > 0 {
                ph * ((*v as f64).ln_1p() / max.ln_1p())
            } else {
                0.0
            };
            let _ = write!(
                o,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{color}"><title>{}: {v} {}</title></rect>"#,
                x + 4.0 + k as f64 * (gw - 8.0) / 2.0,
                10.0 + ph - h,
                (gw - 8.0) / 2.0,
                label,
                if k == 0 { "reads" } else { "writes" }
            );
        }
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
            x + gw / 2.0,
            10.0 + ph + 13.0,
            label
        );
    }
    let _ = write!(
        o,
        r##"<line x1="{PAD_L}" y1="{y}" x2="{x2}" y2="{y}" stroke="#333"/><text x="{lx}" y="16" font-size="11" text-anchor="end">{max:.0}</text>
<text x="{cx}" y="{ly}" font-size="11" text-anchor="middle"><tspan fill="#3b75af">&#9632; reads</tspan>  <tspan fill="#ef8636">&#9632; writes</tspan> per transfer size (bytes; log scale)</text></svg>"##,
        y = 10.0 + ph,
        x2 = PAD_L + pw,
        lx = PAD_L - 4.0,
        cx = PAD_L + pw / 2.0,
        ly = H - 4.0
    );
    o
}

pub fn render(p: &Profile, s: &Summary) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>surge profile: {stage}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:820px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}td,th{{padding:2px 10px;border-bottom:1px solid #ddd;text-align:left}}
td.v{{text-align:right;font-variant-numeric:tabular-nums}}td.d{{color:#666;font-size:90%}}
.verdict{{font-size:130%;padding:.6em 1em;background:#f3f6fa;border-left:6px solid #3b75af}}
code{{font-size:90%}}</style></head><body>
<h1>surge profile: {stage}</h1>"#,
        stage = esc(&p.stage)
    );
    let src = &p.source;
    let _ = write!(
        o,
        "<p>Source: {:?}{}. Host {}, started {}. {} process(es).</p>",
        src.kind,
        src.file
            .as_ref()
            .map(|f| format!(" (<code>{}</code>, {})", esc(f), esc(&src.detail)))
            .unwrap_or_default(),
        esc(&p.host),
        esc(&p.started_at),
        p.processes.len()
    );
    if !src.command.is_empty() {
        let _ = write!(
            o,
            "<p>Command: <code>{}</code></p>",
            esc(&src.command.join(" "))
        );
    }
    let v = &s.verdict;
    let _ = write!(
        o,
        r#"<div class="verdict"><b>{}</b><br>{}"#,
        esc(&v.bound.label().to_uppercase()),
        esc(&v.reason)
    );
    if let Some(l) = &v.limiter_at_scale {
        let _ = write!(
            o,
            "<br>At scale: {} first, after {} concurrent pipelines.",
            esc(l.bound.label()),
            l.pipelines
        );
    }
    for n in &v.notes {
        let _ = write!(o, "<br><i>{}</i>", esc(n));
    }
    o.push_str("</div>");
    for sec in sections(p, s) {
        let _ = write!(o, "<h2>{}</h2><table>", esc(sec.title));
        for r in sec.rows {
            let _ = write!(
                o,
                r#"<tr><td>{}</td><td class="v">{}</td><td class="d">{}</td></tr>"#,
                esc(r.label),
                esc(&r.value),
                esc(&r.detail)
            );
        }
        o.push_str("</table>");
    }
    o.push_str("<h2>I/O over time</h2>");
    o.push_str(&timeline_svg(p));
    o.push_str("<h2>Transfer sizes</h2>");
    o.push_str(&histogram_svg(s));
    o.push_str("<h2>Files by I/O time</h2><table><tr><th>data s</th><th>meta s</th><th>r/w ops</th><th>md ops</th><th>MiB</th><th>procs</th><th>path</th></tr>");
    for f in top_files(p, 25) {
        let c = &f.counters;
        let _ = write!(
            o,
            r#"<tr><td class="v">{:.4}</td><td class="v">{:.4}</td><td class="v">{}</td><td class="v">{}</td><td class="v">{:.2}</td><td class="v">{}</td><td><code>{}</code></td></tr>"#,
            c.data_time_ns() as f64 / 1e9,
            c.meta_time_ns as f64 / 1e9,
            c.data_ops(),
            c.meta_ops(),
            c.bytes_total() as f64 / 1048576.0,
            f.processes,
            esc(&f.path)
        );
    }
    o.push_str("</table>");
    if !p.caveats.is_empty() {
        o.push_str("<h2>Caveats</h2><ul>");
        for c in &p.caveats {
            let _ = write!(o, "<li>{}</li>", esc(c));
        }
        o.push_str("</ul>");
    }
    o.push_str("<h2>Processes</h2><table><tr><th>pid</th><th>ppid</th><th>start s</th><th>end s</th><th>ending</th><th>threads</th><th>peak MiB</th><th>command</th></tr>");
    for pr in p.processes.iter().take(200) {
        let _ = write!(
            o,
            r#"<tr><td>{}</td><td>{}</td><td class="v">{:.3}</td><td class="v">{:.3}</td><td>{:?}</td><td class="v">{}</td><td class="v">{:.1}</td><td><code>{}</code></td></tr>"#,
            pr.pid,
            pr.ppid,
            pr.start_s,
            pr.end_s,
            pr.ending,
            pr.threads,
            pr.peak_rss_bytes as f64 / 1048576.0,
            esc(&pr.cmdline)
        );
    }
    o.push_str("</table><p><small>Generated by surge profile. Tables follow Daley et al., FGCS 2020 (Tables 1-3); see docs/PROFILE.md.</small></p></body></html>\n");
    o
}
