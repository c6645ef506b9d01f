//! The job lifecycle ([`lifecycle`]: one set of phases) and its two drivers: `surge run job.sh`
//! ([`run`]) with the embedded default ([`embedded`]), and a workload manager's hooks (`surge bb`,
//! [`bb`]); the translation of stage directives ([`jobplan`]), `surge exec` on emulated
//! nodes ([`exec`]), `surge stage` from inside a job ([`stage_cli`], over the library of
//! [`job_stage`], which libdatawarp's compatibility library shares) and the sizing of
//! `#SURGE jobdw` performance targets ([`targets`]).

pub mod agent;
pub mod bb;
pub mod calibrate;
pub mod embedded;
pub mod exec;
pub use surge_stage::job as job_stage;
pub use surge_stage::job::{nodes, progress};
pub mod jobplan;
pub mod lifecycle;
pub mod loadgen;
pub mod mover;
pub mod run;
pub mod stage_cli;
pub mod targets;
