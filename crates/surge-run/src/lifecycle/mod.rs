//! One job lifecycle for both ways a job runs: `surge run job.sh` (the driver in [`crate::run`]:
//! an embedded manager, emulated nodes) and a workload manager's hooks (`surge bb <phase>` in
//! [`crate::bb`], called by Slurm's `burst_buffer/lua`). Each phase is an idempotent function
//! over the manager and a [`Job`], which finds the job's session by its external id, so any
//! phase may be run again after a crash of the manager, the hook or the controller:
//!
//! | phase        | does                                                                        |
//! |--------------|-----------------------------------------------------------------------------|
//! | [`setup`]    | creates `#BB create_persistent` instances (one of the same owner that is there already is taken), opens the session (job instance, attached persistent instances) |
//! | [`data_in`]  | fills `type=cache` instances, stages in, starts the caches' drains          |
//! | [`paths`]    | the job's environment (`DW_JOB_STRIPED=...`), per node                      |
//! | [`pre_run`]  | mounts the session's instances on the job's nodes                          |
//! | [`post_run`] | unmounts them (every close reaches the servers)                             |
//! | [`data_out`] | finishes the caches' drains, stages out, waits for the job's own stage tasks |
//! | [`teardown`] | unmounts, ends the session (the job instance is kept when a stage-out or a drain failed), drains then destroys `#BB destroy_persistent` instances |
//!
//! Data moves only as the manager's stage tasks (copies, a cache's fill, its drain), run as the
//! job's owner, so a job moves its data the same way under `surge run` and under Slurm.
//! Mounts sit behind [`Mounts`], with two sides: [`LocalNodes`] (FUSE mounts in this process,
//! one set per emulated node) and [`Agents`] (the `surge agent`s of the job's hosts, told
//! through the manager). The phases say what they did through [`Report`]; each driver prints
//! it its own way.
//!
//! Errors of the manager are told apart by their gRPC code, never by their text.

mod cache;
mod local;
mod mounts;
mod setup;
mod staging;
mod teardown;

pub use cache::FillSummary;
pub use local::LocalNodes;
pub use mounts::{paths, post_run, pre_run, Agents, Mounts, NoMounts};
pub use setup::{cache_request, persistent_request, setup};
pub use staging::{data_in, data_out, split_private};
pub use teardown::{end_job_session, teardown, Ended, Teardown};

use anyhow::Context;
use std::path::PathBuf;
use std::time::Instant;
use surge_api::v1 as api;
use surge_core::directives::{allocation_var_suffix, Directives, DwVariable, JobAllocation};
use surge_manager::cli::status_err;
use surge_proto::InstanceDescriptor;

/// A job as the phases see it: its script's directives and the ids the manager knows it by.
#[derive(Clone, Debug)]
pub struct Job {
    /// The script's name in messages (`job.sh`, `job 42 script`).
    pub script: String,
    pub directives: Directives,
    /// The session's external id: `slurm:<job id>`, or `run:<host>:<pid>:<start>` for a
    /// `surge run` (the manager ends the session when that process is gone).
    pub external_id: String,
    /// The job's name in listings (`surge session ls`).
    pub label: String,
    /// The manager the job's own processes call (`$SURGE_MANAGER`).
    pub manager: String,
    /// What [`setup`] allocates for; the later phases find everything in the session.
    pub alloc: Option<Alloc>,
}

/// Who a job runs for and what its instances are sized for: known to the scheduler at setup.
#[derive(Clone, Debug, Default)]
pub struct Alloc {
    pub uid: u32,
    pub gid: u32,
    /// Compute nodes (a private instance has one namespace per node).
    pub nodes: u32,
    /// A pool the script names that does not exist here falls back to the default pool (the
    /// embedded default, whose one pool has no name a script would know).
    pub pool_fallback: bool,
    /// `#SURGE jobdw`: the peaks to size the targets from, as JSON (`surge run --peaks`);
    /// empty: the manager's calibrated peaks.
    pub peaks_json: String,
    /// Bytes staged into the job instance: an instance sized by targets only must hold them.
    pub stage_in_bytes: u64,
}

/// What a phase did, for the driver to report (`surge run`'s timed lines and `--report`, the
/// lines of a Slurm hook). `started` is when that step began.
#[derive(Debug)]
pub enum Event<'a> {
    /// A pool the script names is not defined here: the default pool is used.
    PoolFallback { pool: &'a str },
    /// A `#BB create_persistent` instance: made now, or there already with the same owner (a
    /// re-run).
    Persistent {
        name: &'a str,
        instance: &'a api::Instance,
        created: bool,
        started: Instant,
    },
    /// The instance of a Rabbit allocation (`#DW jobdw ... name=`): made now, or there
    /// already (a re-run). `var` is its `$DW_JOB_<name>`.
    Allocation {
        var: &'a DwVariable,
        instance: &'a api::Instance,
        created: bool,
        started: Instant,
    },
    /// The instance of a Rabbit allocation is gone (`existed`: this phase destroyed it), or
    /// could not be destroyed (`ok` false; the phase's failures say why).
    AllocationDestroyed {
        var: &'a DwVariable,
        instance: &'a str,
        existed: bool,
        ok: bool,
        started: Instant,
    },
    /// A `#BB create_persistent` instance could not be made (the phase fails with why).
    PersistentFailed { name: &'a str, started: Instant },
    /// The job's session is there already with everything its script asks for.
    AlreadySetUp { session: &'a api::Session },
    /// The job's session lacks what its script asks for (a setup cut short): it is ended and
    /// made again.
    Incomplete {
        session: &'a api::Session,
        lacks: &'a str,
    },
    /// The session is open and its instances allocated.
    Allocated {
        session: &'a api::Session,
        started: Instant,
    },
    /// A stage task of the script's directives ended (done or failed).
    Staged {
        direction: &'a str,
        var: &'a DwVariable,
        instance: &'a api::Instance,
        ns: u32,
        task: &'a api::StageTask,
        started: Instant,
    },
    /// A cache instance was filled from its PFS directory (or its fill failed: `task` says).
    Filled {
        var: &'a DwVariable,
        instance: &'a api::Instance,
        pfs: &'a str,
        task: &'a api::StageTask,
        summary: Option<FillSummary>,
        started: Instant,
    },
    /// A cache instance's drain runs in the background from now on.
    DrainStarted {
        var: &'a DwVariable,
        pfs: &'a str,
        task: &'a api::StageTask,
    },
    /// A cache instance's drain ended: everything journaled is on the PFS, or `error` says
    /// why not.
    Drained {
        var: &'a DwVariable,
        pfs: &'a str,
        files: u64,
        bytes: u64,
        seconds: f64,
        error: Option<&'a str>,
        started: Instant,
    },
    /// The instances are mounted on the job's nodes.
    Mounted { detail: String, started: Instant },
    /// The instances are unmounted.
    Unmounted { detail: String, started: Instant },
    /// A stage task the job started itself (`surge stage`, libdatawarp) ended; `deferred`: a
    /// stage-out at job end, run now.
    JobStage {
        task: &'a api::StageTask,
        deferred: bool,
        started: Instant,
    },
    /// The job has no session: nothing to tear down.
    NoSession,
    /// The session ended; `kept` is the job instance kept with its data.
    Ended {
        session: &'a api::Session,
        kept: Option<u64>,
        started: Instant,
    },
    /// A `#BB destroy_persistent` instance is gone (`existed`: this phase destroyed it), or
    /// could not be destroyed (`ok` false; the phase's failures say why).
    Destroyed {
        name: &'a str,
        existed: bool,
        ok: bool,
        started: Instant,
    },
}

/// Where the phases report to.
pub trait Report {
    fn event(&mut self, e: Event<'_>);
    /// True once the driver was told to stop (Ctrl-C of `surge run`): a stage-in stops
    /// waiting, and the job does not run.
    fn stopped(&self) -> bool {
        false
    }
    /// Live progress of stage tasks on stderr.
    fn progress(&self) -> bool {
        false
    }
}

/// The job's newest session, if it has one.
pub async fn find(m: &mut surge_api::Client, job: &Job) -> anyhow::Result<Option<api::Session>> {
    match m
        .find_session(api::FindSessionRequest {
            external_id: job.external_id.clone(),
        })
        .await
    {
        Ok(s) => Ok(Some(s.into_inner())),
        Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
        Err(e) => Err(status_err(e)),
    }
}

/// The job's active session.
pub async fn session(m: &mut surge_api::Client, job: &Job) -> anyhow::Result<api::Session> {
    let s = find(m, job)
        .await?
        .with_context(|| format!("{} has no burst-buffer session (was setup run?)", who(job)))?;
    anyhow::ensure!(
        s.is_active(),
        "{}: session {} is {}",
        who(job),
        s.id,
        s.state
    );
    Ok(s)
}

/// The job's active session, complete: a session without an instance its directives ask for
/// is an error here, so `paths` and `pre_run` never let such a job start.
pub async fn complete_session(
    m: &mut surge_api::Client,
    job: &Job,
) -> anyhow::Result<api::Session> {
    let s = session(m, job).await?;
    if let Some(what) = missing(job, &s) {
        anyhow::bail!(
            "{}: session {} lacks {what} that {} asks for: the job must not run (re-run \
             setup, or end the session with `surge session end {}`)",
            who(job),
            s.id,
            job.script,
            s.id
        );
    }
    Ok(s)
}

/// The job in messages: "job 42" for a scheduler's job, the script's name otherwise.
fn who(job: &Job) -> String {
    match job.external_id.split_once(':') {
        Some(("run", _)) | None => job.script.clone(),
        Some((_, id)) => format!("job {id}"),
    }
}

/// What session `s` lacks of what job `job`'s directives ask for (its job instance, a
/// persistent instance it attaches, a Rabbit allocation), if anything: no phase lets a job run
/// without them.
pub fn missing(job: &Job, s: &api::Session) -> Option<String> {
    let d = &job.directives;
    if d.jobdw.is_some()
        && (s.job_instance == 0 || !s.instances.iter().any(|i| i.id == s.job_instance))
    {
        return Some("its job instance".into());
    }
    let lacking: Vec<String> = attached(job)
        .into_iter()
        .filter(|n| {
            !s.instances
                .iter()
                .any(|i| i.id != s.job_instance && &i.name == n)
        })
        .collect();
    (!lacking.is_empty()).then(|| format!("persistent instance(s) {}", lacking.join(", ")))
}

/// The named instances a job's session attaches: its `persistentdw` ones, the persistent
/// caches it creates (their fill and drain are stage tasks of the session) and the instances
/// of its Rabbit allocations (see [`allocation_instance`]).
pub fn attached(job: &Job) -> Vec<String> {
    let d = &job.directives;
    let mut names: Vec<String> = d.persistentdw.iter().map(|p| p.name.clone()).collect();
    names.extend(
        d.allocations
            .iter()
            .map(|a| allocation_instance(&job.external_id, a)),
    );
    for cp in d
        .create_persistent
        .iter()
        .filter(|cp| cp.cache.pfs.is_some())
    {
        if !names.contains(&cp.name) {
            names.push(cp.name.clone());
        }
    }
    names
}

/// Records the phase session `s` is in, the hosts it runs on and whether the agents of those
/// hosts mount it (the scheduler's say: see the manager).
pub async fn set_phase(
    m: &mut surge_api::Client,
    s: &api::Session,
    phase: &str,
    hosts: Vec<String>,
    mount: bool,
) -> anyhow::Result<api::Session> {
    Ok(m.set_session_phase(api::SetSessionPhaseRequest {
        id: s.id,
        phase: phase.into(),
        hosts,
        mount,
    })
    .await
    .map_err(status_err)?
    .into_inner())
}

/// The tag the instances of a job's Rabbit allocations are named with: `slurm<id>` for a
/// Slurm job, `job<hash of the external id>` otherwise (a `surge run`'s id names a host, a pid
/// and a time). The same in every phase and every process, so a phase run again finds them.
pub fn job_tag(external_id: &str) -> String {
    let slurm = external_id
        .strip_prefix("slurm:")
        .filter(|id| (1..=18).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit()));
    let tag = match slurm {
        Some(id) => format!("slurm{id}"),
        None => {
            // FNV-1a: stable across processes and releases, unlike std's hasher.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in external_id.bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
            format!("job{h:016x}")
        }
    };
    debug_assert!(tag.len() <= surge_core::directives::MAX_JOB_TAG_LEN);
    tag
}

/// The name of the instance Surge makes for Rabbit allocation `a` of the job `external_id`:
/// `<job tag>_<name>` (`-` written `_`). A Rabbit allocation is a named instance of the job's
/// owner, attached to the job's session, made at setup and destroyed at teardown, since a
/// session has one unnamed job instance.
pub fn allocation_instance(external_id: &str, a: &JobAllocation) -> String {
    format!(
        "{}_{}",
        job_tag(external_id),
        allocation_var_suffix(&a.name)
    )
}

/// The variable a job reaches instance `i` of session `s` by.
pub fn var_of(s: &api::Session, i: &api::Instance) -> DwVariable {
    if i.id != s.job_instance {
        let tag = format!("{}_", job_tag(&s.external_id));
        if let Some(suffix) = i.name.strip_prefix(&tag) {
            return DwVariable::JobNamed(suffix.to_string());
        }
        return DwVariable::PersistentStriped(i.name.clone());
    }
    match i.access_mode.as_str() {
        "private" => DwVariable::JobPrivate,
        "ldbalance" => DwVariable::JobLdbal,
        _ if cache_pfs(i).is_some() => DwVariable::JobStripedCache,
        _ => DwVariable::JobStriped,
    }
}

/// The session's instance a `$DW_...` variable names.
pub fn instance_of<'a>(s: &'a api::Session, var: &DwVariable) -> Option<&'a api::Instance> {
    match var {
        DwVariable::PersistentStriped(n) => s
            .instances
            .iter()
            .find(|i| &i.name == n && i.id != s.job_instance),
        DwVariable::JobNamed(suffix) => {
            let name = format!("{}_{suffix}", job_tag(&s.external_id));
            s.instances
                .iter()
                .find(|i| i.name == name && i.id != s.job_instance)
        }
        _ => s.instances.iter().find(|i| i.id == s.job_instance),
    }
}

/// The instance's data-plane descriptor.
pub fn descriptor(i: &api::Instance) -> anyhow::Result<InstanceDescriptor> {
    serde_json::from_str(&i.descriptor_json)
        .with_context(|| format!("instance {}: bad descriptor from the manager", i.id))
}

/// The PFS directory a `type=cache` instance mirrors.
pub fn cache_pfs(i: &api::Instance) -> Option<String> {
    descriptor(i).ok()?.cache_pfs
}

/// The namespaces of instance `i`: one per node (private), one per replica (ldbalance), else
/// one.
pub fn namespaces(i: &api::Instance) -> u32 {
    match i.access_mode.as_str() {
        "private" => i.nodes.max(1),
        "ldbalance" => descriptor(i).map_or(1, |d| d.namespaces.len().max(1) as u32),
        _ => 1,
    }
}

/// The namespace of instance `i` that node `node` mounts (as the manager tells agents).
pub fn namespace_on(i: &api::Instance, node: u32) -> u32 {
    node % namespaces(i)
}

/// The stage tasks of session `session`.
pub async fn session_tasks(
    m: &mut surge_api::Client,
    session: u64,
) -> anyhow::Result<Vec<api::StageTask>> {
    Ok(m.list_stages(api::ListStagesRequest { session })
        .await
        .map_err(status_err)?
        .into_inner()
        .tasks)
}

/// A capability for instance `i` from the manager (namespace `ns`, or every namespace with
/// `all`), with the instance's descriptor.
pub async fn capability(
    m: &mut surge_api::Client,
    i: &api::Instance,
    ns: u32,
    all: bool,
) -> anyhow::Result<(InstanceDescriptor, surge_auth::Token)> {
    let cap = m
        .get_capability(api::GetCapabilityRequest {
            instance: i.id,
            persistent_name: String::new(),
            namespace: ns,
            all_namespaces: all,
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let desc: InstanceDescriptor = serde_json::from_str(&cap.descriptor_json)
        .with_context(|| format!("instance {}: bad descriptor from the manager", i.id))?;
    Ok((desc, surge_auth::Token::from_text(&cap.token)?))
}

/// A client of namespace `ns` of instance `i`.
pub async fn instance_client(
    m: &mut surge_api::Client,
    i: &api::Instance,
    ns: u32,
) -> anyhow::Result<surge_client::InstanceClient> {
    let (desc, token) = capability(m, i, ns, false).await?;
    Ok(surge_client::InstanceClient::new(
        desc,
        surge_core::NamespaceId(ns),
        token,
    )?)
}

/// The persistent instance named `name`, if there is one.
pub async fn persistent(
    m: &mut surge_api::Client,
    name: &str,
) -> anyhow::Result<Option<api::Instance>> {
    match m
        .get_instance(api::GetInstanceRequest {
            id: 0,
            persistent_name: name.to_string(),
        })
        .await
    {
        Ok(i) => Ok(Some(i.into_inner())),
        Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
        Err(e) => Err(status_err(e)),
    }
}

/// What a stage task could not do: its error, then each file that failed.
pub fn failure_lines(t: &api::StageTask) -> Vec<String> {
    let mut out = Vec::new();
    if !t.error.is_empty() {
        out.push(t.error.clone());
    }
    out.extend(failed_files(t));
    out
}

/// The files a stage task could not copy: "path -> destination: why".
pub fn failed_files(t: &api::StageTask) -> Vec<String> {
    let v: Vec<serde_json::Value> = serde_json::from_str(&t.failures_json).unwrap_or_default();
    v.iter()
        .map(|f| {
            format!(
                "{} -> {}: {}",
                f["path"].as_str().unwrap_or("?"),
                f["destination"].as_str().unwrap_or("?"),
                f["error"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// " (123 MiB/s)" for `bytes` in `seconds`, or nothing.
pub fn rate(bytes: u64, seconds: f64) -> String {
    if seconds > 0.0 && bytes > 0 {
        format!(" ({:.0} MiB/s)", bytes as f64 / 1048576.0 / seconds)
    } else {
        String::new()
    }
}

/// Where instance `i` of session `s` is mounted under a node's directory `base`: `job` for the
/// job instance, `persistent/<name>` for a persistent one (as the agents mount them).
pub fn mount_dir(base: &std::path::Path, s: &api::Session, i: &api::Instance) -> PathBuf {
    if i.id == s.job_instance {
        base.join("job")
    } else {
        base.join("persistent").join(&i.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: u64, name: &str, mode: &str, cache: Option<&str>) -> api::Instance {
        let server = surge_proto::ServerRef {
            id: "s".into(),
            addrs: vec!["127.0.0.1:1".into()],
        };
        let desc = InstanceDescriptor {
            instance: surge_core::InstanceId(id),
            name: name.into(),
            access_mode: mode.into(),
            capacity: 1 << 30,
            stripe_size: 8 << 20,
            fragments: Vec::new(),
            // Three namespaces (an ldbalance instance's replicas).
            namespaces: (0..3)
                .map(|ns| surge_proto::NamespaceRef {
                    ns: surge_core::NamespaceId(ns),
                    server: server.clone(),
                })
                .collect(),
            cache_pfs: cache.map(str::to_string),
            cache_fsync_pfs: false,
            cache_dirty_high: None,
            cache_passthrough: false,
            generation: 0,
        };
        api::Instance {
            id,
            name: name.into(),
            access_mode: mode.into(),
            nodes: 4,
            descriptor_json: serde_json::to_string(&desc).expect("a descriptor"),
            ..Default::default()
        }
    }

    fn session(job: u64, instances: Vec<api::Instance>) -> api::Session {
        api::Session {
            id: 9,
            job_instance: job,
            instances,
            ..Default::default()
        }
    }

    fn directives(script: &str) -> Directives {
        surge_core::directives::parse_script("job.sh", script).expect("a valid script")
    }

    fn job(script: &str, external_id: &str) -> Job {
        Job {
            script: "job.sh".into(),
            directives: directives(script),
            external_id: external_id.into(),
            label: "job".into(),
            manager: String::new(),
            alloc: None,
        }
    }

    #[test]
    fn a_session_attaches_the_persistent_instances_used_and_the_caches_created() {
        let j = job(
            "#!/bin/bash\n#DW persistentdw name=a\n\
             #BB create_persistent name=c capacity=1GiB access_mode=striped type=cache pfs=/p\n\
             #BB create_persistent name=s capacity=1GiB access_mode=striped type=scratch\n",
            "slurm:42",
        );
        assert_eq!(attached(&j), vec!["a".to_string(), "c".to_string()]);
    }

    #[test]
    fn a_session_without_what_the_script_asks_for_is_incomplete() {
        let d = job(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n\
             #DW persistentdw name=a\n",
            "slurm:42",
        );
        let job = instance(1, "", "striped", None);
        let a = instance(2, "a", "striped", None);
        assert_eq!(missing(&d, &session(1, vec![job.clone(), a.clone()])), None);
        assert_eq!(
            missing(&d, &session(0, vec![a])).as_deref(),
            Some("its job instance")
        );
        assert_eq!(
            missing(&d, &session(1, vec![job])).as_deref(),
            Some("persistent instance(s) a")
        );
    }

    #[test]
    fn rabbit_allocations_are_instances_named_after_the_job_with_their_own_variables() {
        let j = job(
            "#!/bin/bash\n#DW jobdw type=xfs capacity=1GiB name=node-local\n\
             #DW jobdw type=lustre capacity=1GiB name=shared\n#DW persistentdw name=p\n",
            "slurm:42",
        );
        assert_eq!(
            attached(&j),
            ["p", "slurm42_node_local", "slurm42_shared"].map(String::from)
        );
        let mut s = session(
            0,
            vec![
                instance(2, "p", "striped", None),
                instance(3, "slurm42_node_local", "private", None),
            ],
        );
        s.external_id = "slurm:42".into();
        assert_eq!(
            missing(&j, &s).as_deref(),
            Some("persistent instance(s) slurm42_shared")
        );
        s.instances
            .push(instance(4, "slurm42_shared", "striped", None));
        assert_eq!(missing(&j, &s), None);
        let vars: Vec<DwVariable> = s.instances.iter().map(|i| var_of(&s, i)).collect();
        assert_eq!(
            vars,
            [
                DwVariable::PersistentStriped("p".into()),
                DwVariable::JobNamed("node_local".into()),
                DwVariable::JobNamed("shared".into()),
            ]
        );
        let found = instance_of(&s, &DwVariable::JobNamed("shared".into())).map(|i| i.id);
        assert_eq!(found, Some(4));
        // Another job's tag: a `surge run`'s id is hashed, stable, and differs per run.
        let a = job_tag("run:host:1:2");
        assert_eq!(a, job_tag("run:host:1:2"));
        assert_ne!(a, job_tag("run:host:1:3"));
        assert!(a.starts_with("job") && a.len() == 19, "{a}");
    }

    #[test]
    fn each_instance_has_its_variable_and_each_node_its_namespace() {
        let s = session(1, Vec::new());
        let cases = [
            (
                instance(1, "", "striped", None),
                DwVariable::JobStriped,
                [0, 0, 0, 0],
            ),
            (
                instance(1, "", "striped", Some("/p")),
                DwVariable::JobStripedCache,
                [0; 4],
            ),
            (
                instance(1, "", "private", None),
                DwVariable::JobPrivate,
                [0, 1, 2, 3],
            ),
            // Three replicas: node 3 reads the first again.
            (
                instance(1, "", "ldbalance", None),
                DwVariable::JobLdbal,
                [0, 1, 2, 0],
            ),
            (
                instance(2, "keep", "striped", None),
                DwVariable::PersistentStriped("keep".into()),
                [0; 4],
            ),
        ];
        for (i, var, ns) in cases {
            assert_eq!(var_of(&s, &i), var);
            let got: Vec<u32> = (0..4).map(|node| namespace_on(&i, node)).collect();
            assert_eq!(got, ns, "{var}");
        }
    }

    #[test]
    fn a_failed_task_says_why_then_each_file() {
        let t = api::StageTask {
            error: "1 file(s) could not be copied".into(),
            failures_json: r#"[{"path":"/x","destination":"/o/x","error":"No space"}]"#.into(),
            ..Default::default()
        };
        assert_eq!(
            failure_lines(&t),
            vec![
                "1 file(s) could not be copied".to_string(),
                "/x -> /o/x: No space".to_string()
            ]
        );
    }
}
