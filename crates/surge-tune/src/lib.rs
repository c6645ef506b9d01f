//! `surge tune job.sh`: ExPBB's auto-tuner (Markomanolis, seed 001), with a smarter search and a
//! memory. It runs the job itself, through `surge run`, under variants of its burst-buffer
//! request, and keeps the fastest.
//!
//! - [`space`]: what is searched (fragments, access mode, PFS-only, hybrid placement of staged
//!   paths, MPI-IO hints, the layout of the files the job makes) and one point of it, a
//!   [`space::Config`].
//! - [`script`]: a configuration applied to the job script (the variant that runs, and the tuned
//!   script written at the end): plain `#DW` lines and shell, so it runs without Surge's tuner.
//! - [`search`]: coordinate descent seeded by `surge profile`'s verdict, then successive halving
//!   of the best few (re-runs against noise), under a budget of runs and minutes.
//! - [`history`]: every run in SQLite, keyed by job, inputs and pool; reused by the next call.
//! - [`runner`]: one measured `surge run` of a variant.
//! - [`report`]: the terminal summary and the HTML report.
//! - [`cli`]: the flags of `surge tune`.

pub mod cli;
pub mod history;
pub mod report;
pub mod runner;
pub mod script;
pub mod search;
pub mod space;
