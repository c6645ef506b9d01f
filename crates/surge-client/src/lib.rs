//! Surge's client side.
//!
//! - [`instance`]: the native API of an instance namespace (metadata calls, striped reads and
//!   writes), used by the FUSE mount and by staging, and by applications that bypass FUSE.
//! - [`fs`]: the file-system core (POSIX semantics, open files, close-to-open) with no FUSE types.
//! - [`fuse`]: the thin `fuser` adapter over the core; [`mount`]: mounting it;
//!   [`mount_helper`]: `mount.fuse.surge`, for mount(8) and fstab.
//! - [`preload`]: the mount's socket for the interposition library (`crates/surge-preload`).
//! - [`admin`]: creating and destroying instances on servers.
//! - [`auth`]: where a command gets the capability it presents to servers.
//! - [`conn`]: pipelined connections and per-server pools.

pub mod admin;
pub mod auth;
pub mod blocking;
pub mod cli;
pub mod conn;
pub mod error;
pub mod fs;
pub mod fuse;
pub mod instance;
pub mod lend;
pub mod mount;
pub mod mount_helper;
pub mod preload;
pub mod unmount;

pub use error::ClientError;
pub use instance::{ClientOptions, InstanceClient};
