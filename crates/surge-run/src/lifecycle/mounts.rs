//! Where a job's instances are mounted, behind one seam ([`Mounts`]) with two sides: the
//! emulated nodes of `surge run` ([`super::LocalNodes`], FUSE mounts in this process) and the
//! compute hosts of a workload manager's job ([`Agents`]: the `surge agent` of each host mounts
//! what the manager says the session wants there, and reports it). The phases [`paths`],
//! [`pre_run`] and [`post_run`] are the same for both.

use super::{complete_session, mount_dir, session, set_phase, var_of, Event, Job, Report};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use surge_api::v1 as api;
use surge_core::directives::DwVariable;
use surge_manager::cli::status_err;

/// Mounts of a job's session on its nodes.
// The phases are generic over the two sides and await them in place (never spawned), so the
// futures need no `Send` bound: `async fn` is what the trait says.
#[allow(async_fn_in_trait)]
pub trait Mounts {
    /// Nodes whose environments differ (the agents mount at the same paths on every host: 1).
    fn nodes(&self) -> u32;
    /// Where node `node` finds instance `i` of session `s`.
    fn path(&self, s: &api::Session, i: &api::Instance, node: u32) -> PathBuf;
    /// The hosts to record with the session, and whether their agents mount it.
    fn hosts(&self) -> (Vec<String>, bool);
    /// Mounts session `s`'s instances on every node (the manager has the phase already); what
    /// was mounted, `None` when the session has nothing to mount.
    async fn mount(
        &mut self,
        m: &mut surge_api::Client,
        s: &api::Session,
    ) -> anyhow::Result<Option<String>>;
    /// Unmounts them (the manager was told already); what was unmounted, if anything.
    /// `hurry`: the job was cancelled, do not wait long. Nothing mounted: nothing to do.
    async fn unmount(
        &mut self,
        m: &mut surge_api::Client,
        s: &api::Session,
        hurry: bool,
    ) -> anyhow::Result<Option<String>>;
}

/// The job's environment on each node ([`Mounts::nodes`] of them): `DW_JOB_STRIPED=...`
/// (DataWarp's names, so existing scripts run unchanged), the `SURGE_...` equivalents,
/// `SURGE_JOB_INSTANCE`, `SURGE_SESSION` and `SURGE_MANAGER`. Refuses a session that lacks
/// what the script asks for.
pub async fn paths(
    m: &mut surge_api::Client,
    job: &Job,
    mounts: &impl Mounts,
) -> anyhow::Result<Vec<BTreeMap<String, String>>> {
    let s = complete_session(m, job).await?;
    let envs = (0..mounts.nodes())
        .map(|node| env(job, &s, |i| mounts.path(&s, i, node)))
        .collect();
    set_phase(m, &s, "paths", Vec::new(), false).await?;
    Ok(envs)
}

fn env(
    job: &Job,
    s: &api::Session,
    path_of: impl Fn(&api::Instance) -> PathBuf,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for i in &s.instances {
        let var = var_of(s, i);
        let path = path_of(i).display().to_string();
        if let DwVariable::PersistentStriped(n) = &var {
            // Rabbit's name of the same mount.
            env.insert(format!("DW_PERSISTENT_{n}"), path.clone());
        }
        env.insert(var.env_name(), path.clone());
        env.insert(surge_name(&var), path);
    }
    if s.job_instance != 0 {
        env.insert("SURGE_JOB_INSTANCE".into(), s.job_instance.to_string());
    }
    env.insert("SURGE_SESSION".into(), s.id.to_string());
    env.insert("SURGE_MANAGER".into(), job.manager.clone());
    env
}

/// Surge's own name of a DataWarp variable.
fn surge_name(var: &DwVariable) -> String {
    match var {
        DwVariable::JobStriped => "SURGE_JOB_STRIPED".into(),
        DwVariable::JobPrivate => "SURGE_JOB_PRIVATE".into(),
        DwVariable::JobLdbal => "SURGE_JOB_LDBAL".into(),
        DwVariable::JobStripedCache => "SURGE_JOB_STRIPED_CACHE".into(),
        DwVariable::PersistentStriped(n) => format!("SURGE_PERSISTENT_{n}"),
        DwVariable::JobNamed(n) => format!("SURGE_JOB_{n}"),
    }
}

/// Mounts the session's instances on the job's nodes and records the phase (with the hosts,
/// for the agents). Refuses a session that lacks what the script asks for.
pub async fn pre_run(
    m: &mut surge_api::Client,
    job: &Job,
    mounts: &mut impl Mounts,
    rep: &mut impl Report,
) -> anyhow::Result<()> {
    let s = complete_session(m, job).await?;
    let (hosts, mount) = mounts.hosts();
    let s = set_phase(m, &s, "pre_run", hosts, mount).await?;
    let t = Instant::now();
    if let Some(detail) = mounts.mount(m, &s).await? {
        rep.event(Event::Mounted { detail, started: t });
    }
    Ok(())
}

/// Unmounts the session's instances from the job's nodes: every close of the job has reached
/// the servers after it.
pub async fn post_run(
    m: &mut surge_api::Client,
    job: &Job,
    mounts: &mut impl Mounts,
    rep: &mut impl Report,
) -> anyhow::Result<()> {
    let s = session(m, job).await?;
    let s = set_phase(m, &s, "post_run", Vec::new(), false).await?;
    let t = Instant::now();
    if let Some(detail) = mounts.unmount(m, &s, false).await? {
        rep.event(Event::Unmounted { detail, started: t });
    }
    Ok(())
}

/// The compute hosts of a workload manager's job: the manager tells their agents what to mount
/// (the session's hosts and mount flag), and the agents report what they mounted.
#[derive(Clone, Debug)]
pub struct Agents {
    /// The job's hosts in node order (node i of a private instance gets namespace i); empty
    /// after pre_run (the session keeps them).
    pub hosts: Vec<String>,
    /// How long to wait for the agents.
    pub timeout: Duration,
}

/// How long a hurried teardown waits for the agents to unmount.
const HURRIED: Duration = Duration::from_secs(10);

impl Mounts for Agents {
    fn nodes(&self) -> u32 {
        1
    }

    fn path(&self, s: &api::Session, i: &api::Instance, _node: u32) -> PathBuf {
        mount_dir(&Path::new(&s.mount_root).join(s.id.to_string()), s, i)
    }

    fn hosts(&self) -> (Vec<String>, bool) {
        let hosts = self
            .hosts
            .iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect();
        (hosts, true)
    }

    async fn mount(
        &mut self,
        m: &mut surge_api::Client,
        s: &api::Session,
    ) -> anyhow::Result<Option<String>> {
        let want = s.instances.len();
        if want == 0 {
            return Ok(None);
        }
        let t = Instant::now();
        loop {
            let left = self.timeout.saturating_sub(t.elapsed());
            let (per_host, errors) = mount_state(m, s, true, left).await?;
            if !errors.is_empty() {
                anyhow::bail!("{}", errors.join("\n"));
            }
            if per_host.iter().all(|(_, n)| n.is_some_and(|n| n >= want)) {
                return Ok(Some(format!(
                    "{want} instance(s) mounted on {} in {:.1} s",
                    s.hosts.join(","),
                    t.elapsed().as_secs_f64()
                )));
            }
            if t.elapsed() > self.timeout {
                let missing: Vec<String> = per_host
                    .iter()
                    .filter(|(_, n)| !n.is_some_and(|n| n >= want))
                    .map(|(h, n)| match n {
                        None => format!("{h} (no live agent: is `surge agent` running there?)"),
                        Some(n) => format!("{h} ({n} of {want} mounted)"),
                    })
                    .collect();
                anyhow::bail!(
                    "session {}: not mounted after {} s on {}",
                    s.id,
                    self.timeout.as_secs_f64(),
                    missing.join(", ")
                );
            }
        }
    }

    /// Waits until every live agent has none of the session's mounts. Dead agents are not
    /// waited for (the manager and a restarted agent clean up after them).
    async fn unmount(
        &mut self,
        m: &mut surge_api::Client,
        s: &api::Session,
        hurry: bool,
    ) -> anyhow::Result<Option<String>> {
        let timeout = if hurry { HURRIED } else { self.timeout };
        let t = Instant::now();
        let mut warned = false;
        loop {
            let left = timeout.saturating_sub(t.elapsed());
            let (per_host, _) = mount_state(m, s, false, left).await?;
            if !warned {
                for (h, _) in per_host.iter().filter(|(_, n)| n.is_none()) {
                    eprintln!(
                        "warning: no live agent on {h}: its mounts of session {} are not \
                         waited for",
                        s.id
                    );
                }
                warned = true;
            }
            let left: Vec<&String> = per_host
                .iter()
                .filter(|(_, n)| n.is_some_and(|n| n > 0))
                .map(|(h, _)| h)
                .collect();
            if left.is_empty() {
                return Ok(None);
            }
            if t.elapsed() > timeout {
                anyhow::bail!(
                    "session {}: still mounted on {left:?} after {} s",
                    s.id,
                    timeout.as_secs_f64()
                );
            }
        }
    }
}

/// How many of the session's mounts each of its hosts' agent reports (`None`: no live agent),
/// and what failed: the manager answers once those hosts report every instance mounted
/// (`mounted`) or none, or a failure, or after `wait` (at most a second at a time, so the
/// caller's timeout holds). Only the session's hosts are asked about, and nothing polls.
async fn mount_state(
    m: &mut surge_api::Client,
    s: &api::Session,
    mounted: bool,
    wait: Duration,
) -> anyhow::Result<(Vec<(String, Option<usize>)>, Vec<String>)> {
    let agents = m
        .wait_mounts(api::WaitMountsRequest {
            session: s.id,
            mounted,
            wait_ms: wait.min(Duration::from_secs(1)).as_millis() as u32,
        })
        .await
        .map_err(status_err)?
        .into_inner()
        .agents;
    let mut per_host = Vec::new();
    let mut errors = Vec::new();
    for h in &s.hosts {
        match agents.iter().find(|a| &a.host == h && a.alive) {
            None => per_host.push((h.clone(), None)),
            Some(a) => {
                per_host.push((
                    h.clone(),
                    Some(a.mounts.iter().filter(|x| x.session == s.id).count()),
                ));
                errors.extend(
                    a.failed
                        .iter()
                        .filter(|x| x.session == s.id)
                        .map(|x| format!("{h}: cannot mount {}: {}", x.path, x.error)),
                );
            }
        }
    }
    Ok((per_host, errors))
}

/// The mounts of a job that has none: what tears down a `surge run` whose emulated nodes
/// could not be made.
pub struct NoMounts;

impl Mounts for NoMounts {
    fn nodes(&self) -> u32 {
        1
    }

    fn path(&self, s: &api::Session, i: &api::Instance, _node: u32) -> PathBuf {
        mount_dir(Path::new("/"), s, i)
    }

    fn hosts(&self) -> (Vec<String>, bool) {
        (Vec::new(), false)
    }

    async fn mount(
        &mut self,
        _m: &mut surge_api::Client,
        s: &api::Session,
    ) -> anyhow::Result<Option<String>> {
        anyhow::bail!("session {}: this job has nowhere to mount", s.id)
    }

    async fn unmount(
        &mut self,
        _m: &mut surge_api::Client,
        _s: &api::Session,
        _hurry: bool,
    ) -> anyhow::Result<Option<String>> {
        Ok(None)
    }
}
