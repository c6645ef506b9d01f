//! `surge server`: a burst-buffer node. It owns fast-tier directories ("devices") and a capacity,
//! hosts fragments of instances ([`store`]: chunk reads and writes on object files) and the
//! metadata service of the namespaces it is metadata server for ([`mds`], [`meta`]: an embedded
//! SQLite store; [`locks`]: their lock service), and speaks the `surge-proto` protocol over TCP and Unix sockets ([`conn`]),
//! within bounds on connections, frames and waits ([`admission`]). [`acl`]: the POSIX ACLs it
//! keeps with the namespace.
//!
//! Everything it hosts is recorded on its devices ([`registry`]) and recovered on restart, so an
//! instance's data and namespace survive `kill -9` followed by a restart on the same directories.
//! [`metrics`] serves Prometheus metrics on request.

pub mod access;
pub mod acl;
pub mod admission;
pub mod budget;
pub mod cli;
pub mod conn;
pub mod lockorder;
pub mod locks;
pub mod mds;
pub mod meta;
pub mod metrics;
pub mod registry;
pub mod reserve;
pub mod schema;
pub mod store;

pub use registry::Registry;
