//! Surge's vocabulary, shared by every other crate: sizes and rates as users write them
//! ([`units`]), how a file's bytes map onto an instance's fragments ([`layout`]), the
//! identifiers of instances, namespaces and inodes ([`ids`]), and the `#DW`/`#BB` directives of
//! job scripts ([`directives`]).
//!
//! Little here does I/O ([`sys`] and [`private_dir`] are the exceptions); it is the part of
//! Surge that can be unit-tested exhaustively.

pub mod addr;
pub mod backoff;
pub mod directives;
pub mod failpoint;
pub mod ids;
pub mod layout;
pub mod limits;
pub mod peaks;
pub mod private_dir;
pub mod sys;
pub mod units;

pub use ids::{FileId, Ino, InstanceId, NamespaceId};
pub use layout::{FileLayout, Layout, LayoutError, Piece};
pub use units::{capacity_text, format_bytes, parse_rate, parse_size, ParseUnitError};
