//! `surge profile` and `surge advise`: Daley's I/O characterization of a workflow stage
//! (Daley et al., FGCS 2020, Tables 1-3, §3-5) with a verdict, and an allocation from it.
//!
//! Layout, one job per module:
//! - `shim/surge_shim.c` (built by `build.rs`, embedded by [`shim`]): the LD_PRELOAD library
//!   that counts a command's I/O per process and per file into mmap'd record files.
//! - [`run`] spawns a command under the shim; [`records`] reads and merges its record files.
//! - [`import`] builds the same [`model::Profile`] from strace and Darshan logs.
//! - [`tables`] derives Tables 1-3 and the verdict; [`report`] prints them (text, HTML).
//! - [`advise`] turns a profile and calibrated peaks into fragments, access mode, placement,
//!   staging and `#DW` lines.
//! - [`cli`] holds the flags and wiring the `surge` binary calls.
//!
//! The profile JSON schema and the verdict rules are documented in `docs/PROFILE.md`.

pub mod advise;
pub mod cli;
pub mod import;
pub mod model;
pub mod records;
pub mod report;
pub mod run;
pub mod shim;
pub mod tables;
