//! Compute-node agents (`surge agent`): what each host has mounted, as it last said, and what
//! it should have mounted (the sessions whose phase asks for mounts on that host).
//!
//! The agents pull: every sync reports the host's mounts and gets the wanted ones back, so an
//! agent that restarts, a manager that restarts or a lost reply all converge on the next sync.
//! What the agents said is kept in memory only: it is re-learnt within one sync interval.

use crate::core::{namespace_for, Core, MResult};
use crate::store::SessionRow;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use surge_api::v1 as api;

/// An agent not heard from for this long is reported dead (its mounts are not waited for).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Clone)]
struct Seen {
    at: Instant,
    wall: i64,
    mounts: Vec<api::AgentMount>,
    failed: Vec<api::AgentMount>,
}

#[derive(Default)]
pub struct Agents {
    seen: Mutex<HashMap<String, Seen>>,
    /// Per host, woken when what its agent should mount may have changed (a phase of a
    /// session on it, its end): a change wakes the agents of that job's hosts, not all.
    changed: Mutex<HashMap<String, std::sync::Arc<tokio::sync::Notify>>>,
    /// Per host, woken when its agent reports (what `WaitMounts` waits on).
    reported: Mutex<HashMap<String, std::sync::Arc<tokio::sync::Notify>>>,
}

/// Where instance `var` of a session is mounted under `root` on its hosts.
pub fn mount_path(root: &str, session: u64, persistent_name: Option<&str>) -> String {
    match persistent_name {
        Some(n) => format!("{root}/{session}/persistent/{n}"),
        None => format!("{root}/{session}/job"),
    }
}

impl Agents {
    /// What the agents of `hosts` should mount may have changed: wake their long polls.
    pub fn poke(&self, hosts: &[String]) {
        let changed = self.changed.lock();
        for h in hosts {
            if let Some(n) = changed.get(h) {
                n.notify_waiters();
            }
        }
    }

    /// What wakes `host`'s agent.
    pub fn changed(&self, host: &str) -> std::sync::Arc<tokio::sync::Notify> {
        self.changed
            .lock()
            .entry(host.to_string())
            .or_default()
            .clone()
    }

    /// The agents of `hosts` only (`None` for a host never heard from).
    pub fn of(&self, hosts: &[String]) -> Vec<api::Agent> {
        let seen = self.seen.lock();
        hosts
            .iter()
            .map(|h| match seen.get(h) {
                Some(s) => api::Agent {
                    host: h.clone(),
                    last_seen: s.wall,
                    alive: s.at.elapsed() < AGENT_TIMEOUT,
                    mounts: s.mounts.clone(),
                    failed: s.failed.clone(),
                },
                None => api::Agent {
                    host: h.clone(),
                    ..Default::default()
                },
            })
            .collect()
    }

    pub fn record(&self, host: &str, mounts: Vec<api::AgentMount>, failed: Vec<api::AgentMount>) {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        self.seen.lock().insert(
            host.to_string(),
            Seen {
                at: Instant::now(),
                wall,
                mounts,
                failed,
            },
        );
        if let Some(n) = self.reported.lock().get(host) {
            n.notify_waiters();
        }
    }

    /// What wakes a wait for `host`'s next report.
    pub fn reported(&self, host: &str) -> std::sync::Arc<tokio::sync::Notify> {
        self.reported
            .lock()
            .entry(host.to_string())
            .or_default()
            .clone()
    }

    /// Waits (at most `wait`) until every host of session `s` reports all its instances
    /// mounted (`mounted`) or none, or an agent reports a failure for it; the agents of those
    /// hosts as they last said.
    pub async fn wait_mounts(
        &self,
        s: &SessionRow,
        mounted: bool,
        wait: Duration,
    ) -> Vec<api::Agent> {
        let want = s.job_instance.iter().count() + s.persistent.len();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notifies: Vec<_> = s.hosts.iter().map(|h| self.reported(h)).collect();
            let woken: Vec<_> = notifies.iter().map(|n| Box::pin(n.notified())).collect();
            let agents = self.of(&s.hosts);
            let done = agents.iter().all(|a| {
                let have = a.mounts.iter().filter(|m| m.session == s.id).count();
                if mounted {
                    a.alive && have >= want
                } else {
                    // A dead agent is not waited for: a restarted one cleans up.
                    !a.alive || have == 0
                }
            });
            let failed = agents
                .iter()
                .any(|a| a.failed.iter().any(|m| m.session == s.id));
            if done || failed || want == 0 || tokio::time::Instant::now() >= deadline {
                return agents;
            }
            let any = futures::future::select_all(woken);
            let _ = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + Duration::from_secs(1)),
                any,
            )
            .await;
        }
    }

    pub fn list(&self) -> Vec<api::Agent> {
        let seen = self.seen.lock();
        let mut out: Vec<api::Agent> = seen
            .iter()
            .map(|(host, s)| api::Agent {
                host: host.clone(),
                last_seen: s.wall,
                alive: s.at.elapsed() < AGENT_TIMEOUT,
                mounts: s.mounts.clone(),
                failed: s.failed.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.host.cmp(&b.host));
        out
    }
}

/// The mounts `host` should have: every active session that wants mounts there, each of its
/// instances in the namespace of the host's node. With descriptors and capabilities (the
/// agent mounts as the session's owner would). Only the sessions on that host are read (the
/// manager's index of mounts by host), never every active session.
pub async fn wanted(core: &Core, root: &str, host: &str) -> MResult<Vec<api::AgentMount>> {
    let mut out = Vec::new();
    for id in core.sessions_on(host) {
        let Ok(s) = core.session(id).await else {
            continue;
        };
        if s.state != "active" || !s.mount {
            continue;
        }
        let Some(node) = s.hosts.iter().position(|h| h == host) else {
            continue;
        };
        out.extend(session_mounts(core, root, &s, node as u32).await?);
    }
    Ok(out)
}

async fn session_mounts(
    core: &Core,
    root: &str,
    s: &SessionRow,
    node: u32,
) -> MResult<Vec<api::AgentMount>> {
    let owner = surge_auth::Caller::of(s.owner_uid, s.owner_gid);
    let mut out = Vec::new();
    for id in s.job_instance.iter().chain(s.persistent.iter()) {
        let inst = core.instance(*id, "").await?;
        let ns = namespace_for(&inst, node);
        let (token, _) = core.capability(&owner, &inst, Some(ns.0))?;
        let persistent = if Some(*id) == s.job_instance {
            None
        } else {
            inst.persistent_name.as_deref()
        };
        out.push(api::AgentMount {
            session: s.id,
            instance: inst.id,
            namespace: ns.0,
            path: mount_path(root, s.id, persistent),
            owner_uid: s.owner_uid,
            owner_gid: s.owner_gid,
            descriptor_json: serde_json::to_string(&inst.descriptor).unwrap_or_default(),
            token: token.to_text(),
            error: String::new(),
        });
    }
    Ok(out)
}

/// True when `have` (what an agent reports) is exactly the set of `want`.
pub fn same_mounts(have: &[api::AgentMount], want: &[api::AgentMount]) -> bool {
    let key = |m: &api::AgentMount| (m.session, m.instance, m.namespace, m.path.clone());
    let mut a: Vec<_> = have.iter().map(key).collect();
    let mut b: Vec<_> = want.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}

/// How far the mounts of session `s` are: the hosts that have all of them, the errors agents
/// reported for them, and the hosts whose agents are not alive.
pub struct MountProgress {
    pub mounted_on: Vec<String>,
    pub unmounted_on: Vec<String>,
    pub errors: Vec<String>,
    pub dead: Vec<String>,
}

pub fn progress(agents: &Agents, s: &SessionRow) -> MountProgress {
    let seen = agents.seen.lock();
    let want: usize = s.job_instance.iter().count() + s.persistent.len();
    let mut p = MountProgress {
        mounted_on: Vec::new(),
        unmounted_on: Vec::new(),
        errors: Vec::new(),
        dead: Vec::new(),
    };
    for h in &s.hosts {
        let Some(a) = seen.get(h).filter(|a| a.at.elapsed() < AGENT_TIMEOUT) else {
            p.dead.push(h.clone());
            continue;
        };
        let have = a.mounts.iter().filter(|m| m.session == s.id).count();
        if have >= want {
            p.mounted_on.push(h.clone());
        }
        if have == 0 {
            p.unmounted_on.push(h.clone());
        }
        for f in a.failed.iter().filter(|m| m.session == s.id) {
            p.errors.push(format!("{h}: {}: {}", f.path, f.error));
        }
    }
    p
}
