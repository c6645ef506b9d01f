//! A small hand-written SVG line chart for sweeps: process count on a log2 x axis (as Daley's
//! Figures 3-5), one line per phase with min-max bars over repetitions. No plotting dependency:
//! the picture is a few dozen SVG elements.

use crate::sweep::{phases_of, Metric, SweepResult};
use std::fmt::Write;

/// One line of the chart: (x, mean, min, max) per point.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64, f64, f64)>,
}

const W: f64 = 760.0;
const H: f64 = 460.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis maximum (1, 2, 2.5 or 5 times a power of ten) at or above `v`.
pub fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v * 0.999_999 {
            return m * p;
        }
    }
    10.0 * p
}

fn fmt_tick(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else if v * 10.0 == (v * 10.0).round() {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Renders the chart. X values must be positive (they are process counts).
pub fn line_chart_svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| *x > 0.0)
        .collect();
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.dedup();
    let (xmin, xmax) = (
        xs.first().copied().unwrap_or(1.0).log2(),
        xs.last().copied().unwrap_or(1.0).log2(),
    );
    let ymax = nice_ceiling(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.3.max(p.1)))
            .fold(0.0, f64::max),
    );
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| {
        if xmax > xmin {
            LEFT + (x.log2() - xmin) / (xmax - xmin) * pw
        } else {
            LEFT + pw / 2.0
        }
    };
    let sy = |y: f64| TOP + ph - (y / ymax) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Grid and y ticks.
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        let y = sy(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v)
        );
    }
    // X ticks at every process count.
    for &x in &xs {
        let px = sx(x);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
            fmt_tick(x)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 18.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="22" y="{:.1}" text-anchor="middle" transform="rotate(-90 22 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    for (i, se) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = se
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", sx(p.0), sy(p.1)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            pts.join(" ")
        );
        for p in &se.points {
            let (x, y) = (sx(p.0), sy(p.1));
            if p.3 > p.2 {
                let _ = writeln!(
                    s,
                    r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{color}"/>"#,
                    sy(p.2),
                    sy(p.3)
                );
            }
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}"><title>{}: {} procs, {}</title></circle>"#,
                esc(&se.name),
                fmt_tick(p.0),
                fmt_tick((p.1 * 100.0).round() / 100.0)
            );
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + pw + 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            esc(&se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The chart of a sweep, in the units of Daley's figures (GiB/s when bandwidth exceeds 1 GiB/s,
/// thousands of operations when rates exceed 10,000/s).
pub fn sweep_svg(r: &SweepResult) -> String {
    let phases = phases_of(&r.points);
    let peak = r
        .points
        .iter()
        .flat_map(|p| p.phases.iter().map(|x| r.metric.of(x).max))
        .fold(0.0, f64::max);
    let (scale, unit) = match r.metric {
        Metric::Bandwidth if peak >= 1024.0 => (1.0 / 1024.0, "Bandwidth (GiB/s)"),
        Metric::Bandwidth => (1.0, "Bandwidth (MiB/s)"),
        Metric::Iops if peak >= 10_000.0 => (1e-3, "Thousands of IOPS"),
        Metric::Iops => (1.0, "IOPS"),
        Metric::MetadataOps if peak >= 10_000.0 => (1e-3, "Thousands of operations/s"),
        Metric::MetadataOps => (1.0, "Operations/s"),
    };
    let series: Vec<Series> = phases
        .iter()
        .map(|ph| Series {
            name: ph.name().to_string(),
            points: r
                .points
                .iter()
                .filter_map(|p| {
                    p.phase(*ph).map(|x| {
                        let st = r.metric.of(x);
                        (
                            f64::from(p.procs),
                            st.mean * scale,
                            st.min * scale,
                            st.max * scale,
                        )
                    })
                })
                .collect(),
        })
        .collect();
    let title = format!("{} on {} ({})", r.title, r.path, r.fs_type);
    line_chart_svg(&title, "I/O processes", unit, &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(6.5), 10.0);
        assert_eq!(nice_ceiling(4.2), 5.0);
        assert_eq!(nice_ceiling(94_000.0), 100_000.0);
        assert_eq!(nice_ceiling(2.1), 2.5);
        assert_eq!(nice_ceiling(2000.0), 2000.0);
    }

    #[test]
    fn chart_has_a_line_and_a_marker_per_point_and_escapes_text() {
        let s = line_chart_svg(
            "read & write <test>",
            "procs",
            "GiB/s",
            &[
                Series {
                    name: "read".into(),
                    points: vec![
                        (1.0, 2.0, 1.9, 2.1),
                        (2.0, 3.5, 3.4, 3.6),
                        (4.0, 6.5, 6.5, 6.5),
                    ],
                },
                Series {
                    name: "write".into(),
                    points: vec![
                        (1.0, 1.5, 1.5, 1.5),
                        (2.0, 3.0, 3.0, 3.0),
                        (4.0, 5.3, 5.3, 5.3),
                    ],
                },
            ],
        );
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("<circle").count(), 6);
        assert!(s.contains("read &amp; write &lt;test&gt;"));
        // x ticks for 1, 2 and 4 processes.
        for t in [">1</text>", ">2</text>", ">4</text>"] {
            assert!(s.contains(t), "{t}");
        }
    }
}
