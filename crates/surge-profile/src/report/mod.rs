//! Renderings of a profile: a terminal table ([`text`]) and a self-contained HTML page
//! ([`html`]). Both print the same rows, built once here in Daley's order and wording.

pub mod html;
pub mod text;

use crate::model::{FileStats, Profile};
use crate::tables::Summary;

/// One row of a table: Daley's label, the value, and an optional remark.
pub struct Row {
    pub label: &'static str,
    pub value: String,
    pub detail: String,
}

pub struct Section {
    pub title: &'static str,
    pub rows: Vec<Row>,
}

fn row(label: &'static str, value: String) -> Row {
    Row {
        label,
        value,
        detail: String::new(),
    }
}

fn row_d(label: &'static str, value: String, detail: String) -> Row {
    Row {
        label,
        value,
        detail,
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.prec$}"))
}

/// Tables 1-3 as rows.
pub fn sections(p: &Profile, s: &Summary) -> Vec<Section> {
    let t1 = &s.table1;
    let t2 = &s.table2;
    let t3 = &s.table3;
    let mut table2 = vec![
        row("Wall time (s)", format!("{:.2}", t2.wall_time_s)),
        row("I/O time (%)", format!("{:.1}", t2.io_time_pct)),
        row_d(
            "I/O time in data operations (s)",
            format!("{:.3}", t2.data_time_s),
            format!(
                "small {:.3}, large {:.3}, of which sync {:.3} ({} syncs)",
                t2.small_data_time_s, t2.large_data_time_s, t2.sync_time_s, t2.syncs
            ),
        ),
        row(
            "I/O time in metadata operations (s)",
            format!("{:.3}", t2.meta_time_s),
        ),
        row_d(
            "I/O (MiB)",
            format!("{:.1}", t2.io_mib),
            format!("read {:.1}, written {:.1}", t2.read_mib, t2.write_mib),
        ),
        row("Read/write operations", t2.read_write_ops.to_string()),
        row(
            "Mean read/write transaction size (KiB)",
            format!("{:.1}", t2.mean_transfer_kib),
        ),
        row("Metadata operations", t2.metadata_ops.to_string()),
        row("Bandwidth (MiB/s)", format!("{:.0}", t2.bandwidth_mib_s)),
        row(
            "Read/write rate (operations/s)",
            format!("{:.0}", t2.read_write_rate_ops_s),
        ),
        row(
            "Metadata rate (operations/s)",
            format!("{:.0}", t2.metadata_rate_ops_s),
        ),
    ];
    if let Some(pk) = &t2.peaks {
        table2.extend([
            row_d(
                "% of peak bandwidth",
                format!("{:.1}", pk.pct_peak_bandwidth),
                format!("peak {:.0} MiB/s", pk.peak_bandwidth_mib_s),
            ),
            row_d(
                "% of peak IOPS",
                format!("{:.1}", pk.pct_peak_iops),
                format!("peak {:.0} ops/s", pk.peak_iops),
            ),
            row_d(
                "% of peak metadata rate",
                format!("{:.1}", pk.pct_peak_metadata),
                format!("peak {:.0} ops/s", pk.peak_metadata_ops_s),
            ),
            row_d(
                "Pipelines to saturate data performance",
                pk.pipelines_to_saturate_data.to_string(),
                format!(
                    "{} if pipelines do I/O at independent times",
                    pk.pipelines_to_saturate_data_sustained
                ),
            ),
            row_d(
                "Pipelines to saturate metadata performance",
                pk.pipelines_to_saturate_metadata.to_string(),
                format!(
                    "{} if pipelines do I/O at independent times",
                    pk.pipelines_to_saturate_metadata_sustained
                ),
            ),
        ]);
    }
    vec![
        Section {
            title: "Table 1: resource requirements",
            rows: vec![
                row("Processes", t1.processes.to_string()),
                row(
                    "Compute threads (most in one process)",
                    t1.threads.to_string(),
                ),
                row(
                    "I/O threads (most in one process)",
                    t1.io_threads.to_string(),
                ),
                row(
                    "Peak memory footprint (MiB)",
                    format!("{:.1}", t1.peak_memory_mib),
                ),
                row_d(
                    "Total file size (MiB)",
                    format!("{:.1}", t1.total_file_size_mib),
                    format!("{} files", t1.files),
                ),
            ],
        },
        Section {
            title: "Table 2: performance",
            rows: table2,
        },
        Section {
            title: "Table 3: data movement",
            rows: vec![
                row_d(
                    "User I/O (% total)",
                    opt(t3.user_io_pct, 1),
                    if p.data_paths.is_empty() {
                        "give --data-path".into()
                    } else {
                        p.data_paths.join(", ")
                    },
                ),
                row("Data reuse", format!("{:.2}", t3.data_reuse)),
                row("User data reuse", opt(t3.user_data_reuse, 2)),
                row("Read:write I/O", opt(t3.read_write_ratio, 2)),
                row("Read:write user I/O", opt(t3.read_write_ratio_user, 2)),
            ],
        },
    ]
}

/// Storage files by I/O time, most expensive first.
pub fn top_files(p: &Profile, n: usize) -> Vec<&FileStats> {
    let mut v: Vec<&FileStats> = p.files.iter().filter(|f| f.is_storage()).collect();
    v.sort_by_key(|f| std::cmp::Reverse(f.counters.data_time_ns() + f.counters.meta_time_ns));
    v.truncate(n);
    v
}
