//! `surge manager`: Surge's control plane (DESIGN §2).
//!
//! - [`core`]: servers and liveness, pools, instance allocation ([`placement`]) and
//!   destruction, sessions; state behind [`store`] (SQLite or etcd).
//! - [`stage`]: stage tasks, run with the `surge-stage` engine.
//! - [`service`]: the gRPC API (`surge-api`); [`http`]: the JSON read API; [`views`]: the
//!   JSON shape both the HTTP API and `--json` print; [`metrics`]: Prometheus `/metrics`.
//! - [`targets`]: performance-target allocation: servers, fragments and metadata servers from
//!   the calibrated peaks the manager keeps per server and per pool.
//! - [`cli`]: the daemon and the commands that talk to it.

pub mod agents;
pub mod cli;
pub mod core;
pub mod http;
pub mod listen;
pub mod metrics;
pub mod placement;
pub mod service;
pub mod stage;
pub mod store;
pub mod targets;
pub mod views;
