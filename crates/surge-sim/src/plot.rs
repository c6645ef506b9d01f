//! Line charts as self-contained SVG, written by hand: a few hundred lines instead of a plotting
//! crate with a font stack. Enough for time series and the paper's figures: titled axes, nice
//! ticks, a linear or log2 x axis, markers for sparse data, a legend.

use std::fmt::Write as _;

const PALETTE: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One series.
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

impl Line {
    pub fn new(name: &str, points: Vec<(f64, f64)>) -> Self {
        Line {
            name: name.to_string(),
            points,
            dashed: false,
        }
    }

    pub fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }
}

/// A chart with one or more lines.
pub struct Chart {
    title: String,
    x_label: String,
    y_label: String,
    lines: Vec<Line>,
    log2_x: bool,
    log2_y: bool,
    markers: bool,
    width: f64,
    height: f64,
}

impl Chart {
    pub fn new(title: &str, x_label: &str, y_label: &str) -> Self {
        Chart {
            title: title.to_string(),
            x_label: x_label.to_string(),
            y_label: y_label.to_string(),
            lines: Vec::new(),
            log2_x: false,
            log2_y: false,
            markers: false,
            width: 760.0,
            height: 420.0,
        }
    }

    /// Powers of two on the x axis (process counts, request sizes).
    pub fn log2_x(mut self) -> Self {
        self.log2_x = true;
        self
    }

    /// Powers of two on the y axis too: linear scaling becomes a straight line.
    pub fn log2_y(mut self) -> Self {
        self.log2_y = true;
        self
    }

    /// Draw a marker at each point (for sweeps with a handful of points).
    pub fn markers(mut self) -> Self {
        self.markers = true;
        self
    }

    pub fn line(&mut self, line: Line) {
        self.lines.push(line);
    }

    fn tx(&self, x: f64) -> f64 {
        if self.log2_x {
            x.max(f64::MIN_POSITIVE).log2()
        } else {
            x
        }
    }

    fn ty(&self, y: f64) -> f64 {
        if self.log2_y {
            y.max(f64::MIN_POSITIVE).log2()
        } else {
            y
        }
    }

    fn usable(&self, x: f64, y: f64) -> bool {
        x.is_finite() && y.is_finite() && (!self.log2_x || x > 0.0) && (!self.log2_y || y > 0.0)
    }

    pub fn to_svg(&self) -> String {
        let (w, h) = (self.width, self.height);
        let (left, right, top, bottom) = (70.0, 20.0, 40.0, 55.0);
        let legend_h = 18.0 * self.lines.len().div_ceil(2) as f64;
        let plot_w = w - left - right;
        let plot_h = h - top - bottom - legend_h;
        let pts = self.lines.iter().flat_map(|l| l.points.iter());
        let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut ymin, mut y1) = (f64::INFINITY, 0.0f64);
        for &(x, y) in pts {
            if !self.usable(x, y) {
                continue;
            }
            x0 = x0.min(self.tx(x));
            x1 = x1.max(self.tx(x));
            ymin = ymin.min(y);
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        // Y axis: [0, nice top] when linear; whole powers of two around the data when log2.
        let (ylo, yhi, yticks): (f64, f64, Vec<(f64, String)>) = if self.log2_y {
            let lo = if ymin.is_finite() {
                ymin.log2().floor()
            } else {
                0.0
            };
            let hi = if y1 > 0.0 { y1.log2().ceil() } else { lo + 1.0 };
            let hi = if hi <= lo { lo + 1.0 } else { hi };
            let ticks = (lo as i32..=hi as i32)
                .map(|e| {
                    let v = 2f64.powi(e);
                    (v, fmt_num(v))
                })
                .collect();
            (lo, hi, ticks)
        } else {
            let (t, top) = nice_ticks(0.0, if y1 > 0.0 { y1 } else { 1.0 });
            (0.0, top, t.into_iter().map(|v| (v, fmt_num(v))).collect())
        };
        let sx = |x: f64| left + (self.tx(x) - x0) / (x1 - x0) * plot_w;
        let sy = |y: f64| top + plot_h - (self.ty(y) - ylo) / (yhi - ylo) * plot_h;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
        );
        let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = write!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            w / 2.0,
            esc(&self.title)
        );
        // Grid and y ticks.
        for (t, label) in &yticks {
            let y = sy(*t);
            let _ = write!(
                s,
                r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + plot_w,
                left - 6.0,
                y + 4.0,
                esc(label)
            );
        }
        // X ticks.
        let xticks: Vec<(f64, String)> = if self.log2_x {
            let (a, b) = (x0.floor() as i32, x1.ceil() as i32);
            let step = ((b - a) / 10 + 1).max(1);
            (a..=b)
                .step_by(step as usize)
                .map(|e| {
                    let v = 2f64.powi(e);
                    (v, fmt_pow2(v))
                })
                .filter(|(v, _)| self.tx(*v) >= x0 - 1e-9 && self.tx(*v) <= x1 + 1e-9)
                .collect()
        } else {
            nice_ticks(x0, x1)
                .0
                .into_iter()
                .filter(|v| *v >= x0 - 1e-9 && *v <= x1 + 1e-9)
                .map(|v| (v, fmt_num(v)))
                .collect()
        };
        for (v, label) in &xticks {
            let x = sx(*v);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                top + plot_h,
                top + plot_h + 16.0,
                esc(label)
            );
        }
        let _ = write!(
            s,
            r##"<rect x="{left}" y="{top}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#444"/>"##
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            left + plot_w / 2.0,
            top + plot_h + 36.0,
            esc(&self.x_label)
        );
        let _ = write!(
            s,
            r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            top + plot_h / 2.0,
            esc(&self.y_label)
        );
        for (i, l) in self.lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let path: Vec<String> = l
                .points
                .iter()
                .filter(|(x, y)| self.usable(*x, *y))
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            if path.is_empty() {
                continue;
            }
            let dash = if l.dashed {
                r#" stroke-dasharray="6,4""#
            } else {
                ""
            };
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{}"/>"#,
                path.join(" ")
            );
            if self.markers {
                for p in &path {
                    if let Some((x, y)) = p.split_once(',') {
                        let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
                    }
                }
            }
            let lx = left + (i % 2) as f64 * plot_w / 2.0;
            let ly = h - legend_h - 4.0 + 18.0 * (i / 2) as f64 + 10.0;
            let _ = write!(
                s,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 24.0,
                lx + 30.0,
                ly + 4.0,
                esc(&l.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Ticks at 1, 2 or 5 times a power of ten covering [lo, hi]; returns them and the top.
fn nice_ticks(lo: f64, hi: f64) -> (Vec<f64>, f64) {
    let span = (hi - lo).max(1e-12);
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 7.0)
        .unwrap_or(10.0 * mag);
    let start = (lo / step).floor() * step;
    let top = (hi / step).ceil() * step;
    let mut ticks = Vec::new();
    let mut t = start;
    while t <= top + step * 1e-6 {
        ticks.push((t / step).round() * step);
        t += step;
    }
    (ticks, top.max(start + step))
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_pow2(v: f64) -> String {
    let n = v.round() as u64;
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}K", n >> 10)
    } else {
        format!("{n}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        let (t, top) = nice_ticks(0.0, 47.3);
        assert_eq!(t.first(), Some(&0.0));
        assert!((47.3..=60.0).contains(&top), "{top}");
        assert!(t.len() >= 4 && t.len() <= 8, "{t:?}");
        assert!(
            t.windows(2).all(|w| ((w[1] - w[0]) - 10.0).abs() < 1e-9),
            "{t:?}"
        );
    }

    #[test]
    fn svg_has_every_series_and_label() {
        let mut c = Chart::new("IOR <scaling>", "processes", "GiB/s")
            .log2_x()
            .markers();
        c.line(Line::new("with BB", vec![(2048.0, 5.0), (4096.0, 10.0)]));
        c.line(Line::new("no BB", vec![(2048.0, 4.0), (4096.0, 4.5)]).dashed());
        let svg = c.to_svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("IOR &lt;scaling&gt;"));
        assert!(svg.contains(">with BB<") && svg.contains(">no BB<"));
        assert!(svg.contains(">2K<") && svg.contains(">4K<"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
    }

    #[test]
    fn log_log_axes_put_powers_of_two_on_both() {
        let mut c = Chart::new("t", "x", "y").log2_x().log2_y();
        c.line(Line::new(
            "a",
            vec![(256.0, 0.68), (8192.0, 21.8), (0.0, 5.0)],
        ));
        let svg = c.to_svg();
        for label in [">0.50<", ">1<", ">16<", ">32<", ">256<", ">8K<"] {
            assert!(svg.contains(label), "{label} in {svg}");
        }
        // The point at x = 0 cannot be drawn on a log axis and is left out.
        let pts = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(pts.split(' ').count(), 2);
    }

    #[test]
    fn empty_chart_still_renders() {
        let c = Chart::new("nothing", "x", "y");
        assert!(c.to_svg().ends_with("</svg>\n"));
    }
}
