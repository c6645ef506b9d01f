//! Prometheus metrics of a server (`surge server --metrics HOST:PORT`, `GET /metrics`), in the
//! OpenMetrics text format written by the `prometheus-client` crate.
//!
//! - Per request opcode (label `op`, the request's name): requests, error replies, payload bytes
//!   received and sent, and a latency histogram (`surge_server_request_duration_seconds`).
//! - Connections: open now, and accepted since start.
//! - At each scrape, from the registry: capacity, space promised to fragments and bytes stored,
//!   per server and per fragment (labels `instance_id`, `fragment`: `instance` is the label
//!   Prometheus gives the scrape target), and namespaces served.
//!
//! The counters are process-wide (one server per process), so the connection code records with
//! one call and needs no handle.

use crate::registry::Registry;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;
use tracing::{info, warn};

type OpLabels = [(&'static str, &'static str); 1];

/// Request latency buckets: 10 µs to ~2.6 s, by factors of 4.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 4.0, 10))
}

struct Metrics {
    requests: Family<OpLabels, Counter>,
    errors: Family<OpLabels, Counter>,
    received: Family<OpLabels, Counter>,
    sent: Family<OpLabels, Counter>,
    latency: Family<OpLabels, Histogram, fn() -> Histogram>,
    connections: Gauge,
    accepted: Counter,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    requests: Family::default(),
    errors: Family::default(),
    received: Family::default(),
    sent: Family::default(),
    latency: Family::new_with_constructor(latency_histogram),
    connections: Gauge::default(),
    accepted: Counter::default(),
});

/// Records one answered request.
pub fn request(op: &'static str, took: Duration, received: usize, sent: usize, error: bool) {
    let m = &*METRICS;
    let l = [("op", op)];
    m.requests.get_or_create(&l).inc();
    if error {
        m.errors.get_or_create(&l).inc();
    }
    m.received.get_or_create(&l).inc_by(received as u64);
    m.sent.get_or_create(&l).inc_by(sent as u64);
    m.latency.get_or_create(&l).observe(took.as_secs_f64());
}

/// Counts a connection while it is alive.
pub struct ConnectionGuard(());

pub fn connection() -> ConnectionGuard {
    METRICS.accepted.inc();
    METRICS.connections.inc();
    ConnectionGuard(())
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        METRICS.connections.dec();
    }
}

/// What the registry holds, read at each scrape.
#[derive(Debug)]
struct Holdings(Weak<Registry>);

fn gauges<L: prometheus_client::encoding::EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    values: &[(L, i64)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in values {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// One gauge without labels.
fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let m = encoder.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(m)
}

impl Collector for Holdings {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(reg) = self.0.upgrade() else {
            return Ok(());
        };
        let st = reg.status();
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "capacity",
            "Capacity this server offers",
            Some(&Unit::Bytes),
            st.capacity,
        )?;
        gauge(
            &mut encoder,
            "reserved",
            "Capacity promised to the fragments this server hosts",
            Some(&Unit::Bytes),
            st.reserved,
        )?;
        gauge(
            &mut encoder,
            "used",
            "Bytes stored in the fragments this server hosts",
            Some(&Unit::Bytes),
            st.used,
        )?;
        gauge(
            &mut encoder,
            "namespaces",
            "Namespaces (metadata services) this server runs",
            None,
            st.namespaces.len() as u64,
        )?;
        let frag = |f: &surge_proto::FragmentStatus| {
            [
                ("instance_id", f.instance.0.to_string()),
                ("fragment", f.index.to_string()),
            ]
        };
        let caps: Vec<_> = st
            .fragments
            .iter()
            .map(|f| (frag(f), i(f.capacity)))
            .collect();
        gauges(
            &mut encoder,
            "fragment_capacity",
            "Capacity of a fragment of an instance on this server",
            Some(&Unit::Bytes),
            &caps,
        )?;
        let used: Vec<_> = st.fragments.iter().map(|f| (frag(f), i(f.used))).collect();
        gauges(
            &mut encoder,
            "fragment_used",
            "Bytes stored in a fragment of an instance on this server",
            Some(&Unit::Bytes),
            &used,
        )?;
        Ok(())
    }
}

/// The registry of everything above, under the prefix `surge_server`.
fn registry(reg: &Arc<Registry>) -> prometheus_client::registry::Registry {
    let m = &*METRICS;
    let mut r = prometheus_client::registry::Registry::with_prefix("surge_server");
    r.register(
        "requests",
        "Requests answered, by opcode",
        m.requests.clone(),
    );
    r.register(
        "request_errors",
        "Requests answered with an error, by opcode",
        m.errors.clone(),
    );
    r.register_with_unit(
        "received",
        "Payload bytes received with requests, by opcode",
        Unit::Bytes,
        m.received.clone(),
    );
    r.register_with_unit(
        "sent",
        "Payload bytes sent with replies, by opcode",
        Unit::Bytes,
        m.sent.clone(),
    );
    r.register_with_unit(
        "request_duration",
        "Time to answer a request, by opcode",
        Unit::Seconds,
        m.latency.clone(),
    );
    r.register(
        "connections",
        "Client connections open",
        m.connections.clone(),
    );
    r.register(
        "connections_accepted",
        "Client connections accepted since the server started",
        m.accepted.clone(),
    );
    r.register_collector(Box::new(Holdings(Arc::downgrade(reg))));
    r
}

/// The metrics as OpenMetrics text.
pub fn render(reg: &Arc<Registry>) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry(reg))?;
    Ok(out)
}

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `listen` from a thread; returns the address bound.
pub fn serve(reg: Arc<Registry>, listen: &str) -> anyhow::Result<std::net::SocketAddr> {
    use anyhow::Context;
    let http = tiny_http::Server::http(listen)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot serve metrics on {listen}"))?;
    let addr = http
        .server_addr()
        .to_ip()
        .with_context(|| format!("metrics address of {listen}"))?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            for req in http.incoming_requests() {
                let resp = if req.url() == "/metrics" || req.url().starts_with("/metrics?") {
                    match render(&reg) {
                        Ok(text) => tiny_http::Response::from_string(text).with_header(
                            tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                                .expect("a valid header"),
                        ),
                        Err(e) => {
                            warn!("cannot encode metrics: {e}");
                            tiny_http::Response::from_string("cannot encode metrics\n")
                                .with_status_code(500)
                        }
                    }
                } else {
                    tiny_http::Response::from_string("not found: this server serves /metrics\n")
                        .with_status_code(404)
                };
                if let Err(e) = req.respond(resp) {
                    warn!("metrics: cannot answer: {e}");
                }
            }
        })?;
    info!("metrics on http://{addr}/metrics");
    Ok(addr)
}
