//! The gRPC face of the manager: translates API messages to [`Core`] calls and errors to gRPC
//! status codes (so `surge` can print the manager's own message).
//!
//! Every call was authenticated with MUNGE before it gets here ([`authenticate`]): the caller
//! is in the request's extensions, and each call checks what that caller may do
//! (docs/SECURITY.md): administration is for root, the manager's user and its admin group;
//! an instance, a session and its stage tasks are their owner's (and an administrator's).

use crate::core::{Core, InstanceRequest, ManagerError};
use crate::stage::Stages;
use crate::views;
use std::collections::HashMap;
use std::sync::Arc;
use surge_api::v1 as api;
use surge_api::v1::manager_server::Manager;
use surge_auth::Caller;
use tonic::{Request, Response, Status};
use tracing::info;

pub struct Service {
    pub core: Arc<Core>,
    pub stages: Arc<Stages>,
    /// Where the HTTP API listens, if it does.
    pub http: Option<String>,
    /// Compute-node agents and where they mount job instances.
    pub agents: Arc<crate::agents::Agents>,
    pub mount_root: String,
}

impl From<ManagerError> for Status {
    fn from(e: ManagerError) -> Status {
        match e {
            ManagerError::Denied(m) => Status::permission_denied(m),
            ManagerError::Quota(m) => Status::resource_exhausted(m),
            ManagerError::NotFound(m) => Status::not_found(m),
            ManagerError::Invalid(m) => Status::invalid_argument(m),
            ManagerError::Busy(m) => Status::failed_precondition(m),
            ManagerError::NoSpace(m) => Status::resource_exhausted(m),
            ManagerError::Unavailable(m) => Status::unavailable(m),
            ManagerError::Store(crate::store::StoreError::NotLeader(m)) => {
                Status::unavailable(format!("this manager no longer leads: {m}"))
            }
            ManagerError::Store(e) => Status::internal(e.to_string()),
        }
    }
}

/// What a request asks, checked: targets (any of them non-zero) and peaks given with it.
pub fn instance_request(r: &api::CreateInstanceRequest) -> Result<InstanceRequest, Status> {
    let targets = r
        .targets
        .as_ref()
        .filter(|t| t.bandwidth > 0 || t.iops > 0 || t.metadata > 0)
        .map(|t| surge_core::directives::Targets {
            bandwidth: (t.bandwidth > 0).then_some(t.bandwidth),
            iops: (t.iops > 0).then_some(t.iops),
            metadata: (t.metadata > 0).then_some(t.metadata),
        });
    let peaks = if r.peaks_json.is_empty() {
        None
    } else {
        let p: surge_core::peaks::Peaks = serde_json::from_str(&r.peaks_json)
            .map_err(|e| Status::invalid_argument(format!("the peaks given are not valid: {e}")))?;
        crate::targets::check_peaks(&p)
            .map_err(|e| Status::invalid_argument(format!("the peaks given: {e}")))?;
        Some(p)
    };
    if peaks.is_some() && targets.is_none() {
        return Err(Status::invalid_argument(
            "peaks were given without performance targets: they size targets only",
        ));
    }
    Ok(InstanceRequest {
        targets,
        peaks,
        server: (!r.server.is_empty()).then(|| r.server.clone()),
        capacity: r.capacity,
        access_mode: if r.access_mode.is_empty() {
            "striped".into()
        } else {
            r.access_mode.clone()
        },
        pool: r.pool.clone(),
        persistent_name: if r.persistent_name.is_empty() {
            None
        } else {
            Some(r.persistent_name.clone())
        },
        nodes: r.nodes.max(1),
        owner_uid: r.owner_uid,
        owner_gid: r.owner_gid,
        stripe_size: r.stripe_size,
        group_shared: r.share_with_group,
        cache_pfs: (!r.cache_pfs.is_empty()).then(|| r.cache_pfs.clone()),
        cache_fsync_pfs: r.cache_fsync_pfs,
        cache_passthrough: r.cache_passthrough,
        cache_dirty_high: if r.cache_dirty_high.is_empty() {
            None
        } else {
            Some(
                surge_core::directives::parse_dirty_high(&r.cache_dirty_high)
                    .map_err(Status::invalid_argument)?,
            )
        },
    })
}

/// How long a decoded credential is known without asking munged again: twice what a client
/// reuses one for ([`surge_api::CREDENTIAL_REUSE`]), far inside munged's time to live.
const CREDENTIAL_KNOWN: std::time::Duration = std::time::Duration::from_secs(60);
/// At most this many credentials are known at once (expired ones are dropped first; past it
/// a credential is decoded on every call).
const CREDENTIALS_KNOWN_MAX: usize = 100_000;

/// The credentials decoded lately: who made each, from which address, when first decoded.
/// munged refuses a credential decoded before (a replay), so a client that sends one
/// credential for several calls ([`surge_api::Munge`]) is known from here: on every
/// connection from the same address (a client's channel reconnects), never from another, and
/// for [`CREDENTIAL_KNOWN`] only.
#[derive(Default)]
struct Known(HashMap<String, (u32, u32, std::net::IpAddr, std::time::Instant)>);

impl Known {
    fn get(&self, cred: &str, from: std::net::IpAddr) -> Option<(u32, u32)> {
        let (uid, gid, ip, at) = self.0.get(cred)?;
        (*ip == from && at.elapsed() < CREDENTIAL_KNOWN).then_some((*uid, *gid))
    }

    fn insert(&mut self, cred: &str, from: std::net::IpAddr, who: (u32, u32)) {
        if self.0.len() >= CREDENTIALS_KNOWN_MAX {
            self.0.retain(|_, v| v.3.elapsed() < CREDENTIAL_KNOWN);
            if self.0.len() >= CREDENTIALS_KNOWN_MAX {
                return;
            }
        }
        self.0.insert(
            cred.to_string(),
            (who.0, who.1, from, std::time::Instant::now()),
        );
    }
}

/// The tonic interceptor of the manager's API: takes the caller from the call's MUNGE
/// credential (decoded by the munged at `socket`, or known from an earlier call of the same
/// client: see [`Known`]), or refuses the call.
pub fn authenticate(
    socket: std::path::PathBuf,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    let known = Arc::new(std::sync::Mutex::new(Known::default()));
    move |mut req: Request<()>| {
        // A client of a release this one does not work with is told so, with both versions,
        // before anything else (a client too old to send its version is taken as it is).
        if let Some(v) = req.metadata().get(surge_api::VERSION_HEADER) {
            let v = v.to_str().unwrap_or("?");
            if let Some(why) = surge_api::incompatible(v, surge_api::VERSION) {
                return Err(Status::failed_precondition(why));
            }
        }
        let cred = req
            .metadata()
            .get(surge_api::MUNGE_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "no MUNGE credential: the manager takes who you are from MUNGE (use the `surge` \
                     commands, which send one; is munged running?)",
                )
            })?;
        let from = req.remote_addr().map(|a| a.ip());
        let cached = from.and_then(|ip| {
            known
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(cred, ip)
        });
        let (uid, gid) = match cached {
            Some(who) => who,
            None => {
                let who = surge_auth::munge::decode(cred, &socket)
                    .map_err(|e| Status::unauthenticated(e.to_string()))?;
                if let Some(ip) = from {
                    known
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(cred, ip, who);
                }
                who
            }
        };
        req.extensions_mut().insert(Caller::of(uid, gid));
        Ok(req)
    }
}

/// The caller of `req`, put there by [`authenticate`].
fn caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the call was not authenticated"))
}

fn denied(m: String) -> Status {
    Status::permission_denied(m)
}

type Res<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Manager for Service {
    async fn register_server(&self, req: Request<api::RegisterServerRequest>) -> Res<api::Server> {
        let c = caller(&req)?;
        self.admin(&c, "register a server")?;
        let r = req.into_inner();
        let row = self.core.register_server(&r.addr, &r.pool).await?;
        let servers = self.core.servers().await?;
        let st = servers
            .iter()
            .find(|(s, _)| s.id == row.id)
            .and_then(|(_, st)| st.as_ref());
        Ok(Response::new(views::server(&row, st)))
    }

    async fn list_servers(&self, _req: Request<api::Empty>) -> Res<api::ServerList> {
        let servers = self
            .core
            .servers()
            .await?
            .iter()
            .map(|(s, st)| views::server(s, st.as_ref()))
            .collect();
        Ok(Response::new(api::ServerList { servers }))
    }

    async fn register_peaks(
        &self,
        req: Request<api::RegisterPeaksRequest>,
    ) -> Res<api::RegisteredPeaks> {
        let c = caller(&req)?;
        self.admin(&c, "register calibrated peaks")?;
        let r = req.into_inner();
        let peaks: surge_core::peaks::Peaks = serde_json::from_str(&r.peaks_json)
            .map_err(|e| Status::invalid_argument(format!("the peaks are not valid: {e}")))?;
        let row = self
            .core
            .register_peaks(
                &r.server,
                &r.pool,
                r.pool_aggregate.then_some(r.servers),
                &peaks,
                &r.source,
            )
            .await?;
        let view = self
            .core
            .peaks(if r.pool_aggregate { &row.key } else { "" })
            .await?;
        let out = if r.pool_aggregate {
            view.pools
                .iter()
                .find(|p| p.key == row.key && p.servers == row.servers)
                .map(views::pool_peaks)
        } else {
            view.servers
                .iter()
                .find(|(s, _)| s.id == row.key)
                .map(|(s, p)| views::server_peaks(s, p.as_ref()))
        };
        Ok(Response::new(out.ok_or_else(|| {
            Status::internal("registered peaks vanished")
        })?))
    }

    async fn list_peaks(&self, req: Request<api::ListPeaksRequest>) -> Res<api::PeaksList> {
        let v = self.core.peaks(&req.into_inner().pool).await?;
        Ok(Response::new(api::PeaksList {
            servers: v
                .servers
                .iter()
                .map(|(s, p)| views::server_peaks(s, p.as_ref()))
                .collect(),
            pools: v.pools.iter().map(views::pool_peaks).collect(),
        }))
    }

    async fn create_pool(&self, req: Request<api::CreatePoolRequest>) -> Res<api::Pool> {
        let c = caller(&req)?;
        self.admin(&c, "create a pool")?;
        let r = req.into_inner();
        self.core.create_pool(&r.name, r.granularity).await?;
        let usage = self.core.pool_usage().await?;
        let u = usage
            .into_iter()
            .find(|u| u.pool.name == r.name)
            .ok_or_else(|| Status::internal("pool vanished"))?;
        Ok(Response::new(views::pool(&u)))
    }

    async fn list_pools(&self, _req: Request<api::Empty>) -> Res<api::PoolList> {
        let pools = self
            .core
            .pool_usage()
            .await?
            .iter()
            .map(views::pool)
            .collect();
        Ok(Response::new(api::PoolList { pools }))
    }

    async fn create_instance(
        &self,
        req: Request<api::CreateInstanceRequest>,
    ) -> Res<api::Instance> {
        let c = caller(&req)?;
        let mut r = instance_request(req.get_ref())?;
        if let Some(s) = &r.server {
            self.admin(&c, &format!("place an instance on server {s} only"))?;
        }
        (r.owner_uid, r.owner_gid) = self.owner(&c, r.owner_uid, r.owner_gid)?;
        let inst = self.core.create_instance(&r).await?;
        Ok(Response::new(views::instance(&self.core, &inst).await))
    }

    async fn get_instance(&self, req: Request<api::GetInstanceRequest>) -> Res<api::Instance> {
        let c = caller(&req)?;
        let r = req.into_inner();
        let inst = self.core.instance(r.id, &r.persistent_name).await?;
        self.core.check_use(&c, &inst)?;
        Ok(Response::new(views::instance(&self.core, &inst).await))
    }

    async fn list_instances(&self, req: Request<api::Empty>) -> Res<api::InstanceList> {
        let c = caller(&req)?;
        let mut instances = Vec::new();
        for i in self
            .core
            .instances()
            .await?
            .iter()
            .filter(|i| self.core.may_use(&c, i))
        {
            instances.push(views::instance(&self.core, i).await);
        }
        Ok(Response::new(api::InstanceList { instances }))
    }

    async fn destroy_instance(&self, req: Request<api::DestroyInstanceRequest>) -> Res<api::Empty> {
        let c = caller(&req)?;
        let r = req.into_inner();
        let inst = self.core.instance(r.id, &r.persistent_name).await?;
        if !self.core.is_admin(&c) && c.uid != inst.owner_uid {
            return Err(denied(format!(
                "instance {} ({}) belongs to uid {}: only its owner or an administrator may \
                 destroy it",
                inst.id, inst.name, inst.owner_uid
            )));
        }
        if !r.hurry && self.core.sessions_using(inst.id).await?.is_empty() {
            self.stages.wait_idle(inst.id).await;
            // A cache's changes not yet on its PFS directory are the only copy: drained
            // first (a job that attaches it, or `surge stage drain`), or given up with hurry.
            match self.core.undrained(&inst).await {
                Some(Ok(0)) | None => {}
                Some(Ok(n)) => {
                    return Err(Status::failed_precondition(format!(
                        "instance {} ({}) is a cache with {n} change(s) not yet on its PFS \
                         directory {}: drain them first (`surge stage drain --instance {}` as \
                         its owner, or a job that attaches it), or destroy with hurry to lose \
                         them",
                        inst.id,
                        inst.name,
                        inst.descriptor.cache_pfs.as_deref().unwrap_or("?"),
                        inst.id
                    )))
                }
                Some(Err(e)) => {
                    return Err(Status::unavailable(format!(
                        "instance {} ({}) is a cache whose journal could not be read ({e}): \
                         not destroyed, its changes may not be on the PFS yet",
                        inst.id, inst.name
                    )))
                }
            }
        }
        self.core.destroy_instance(inst.id, "", None).await?;
        Ok(Response::new(api::Empty {}))
    }

    async fn create_session(&self, req: Request<api::CreateSessionRequest>) -> Res<api::Session> {
        let c = caller(&req)?;
        let r = req.into_inner();
        let (uid, gid) = self.owner(&c, r.owner_uid, r.owner_gid)?;
        // The persistent instances it attaches must be the owner's to use.
        let owner = Caller::of(uid, gid);
        for name in &r.persistent {
            let inst = self.core.instance(0, name).await?;
            self.core.check_use(&owner, &inst)?;
        }
        let job = match r.job_instance.as_ref().map(instance_request).transpose()? {
            Some(mut i) => {
                if let Some(s) = &i.server {
                    self.admin(&c, &format!("place an instance on server {s} only"))?;
                }
                i.owner_uid = uid;
                i.owner_gid = gid;
                Some(i)
            }
            None => None,
        };
        let external = Some(r.external_id.as_str()).filter(|e| !e.is_empty());
        // A scheduler's job id finds the job's session again in every phase: only the
        // scheduler (an administrator) may name one, or a user could take a future job's id.
        if let Some(ext) = external {
            if !ext.starts_with("run:") {
                self.admin(&c, &format!("open a session for scheduler job {ext}"))?;
            }
        }
        let s = self
            .core
            .create_session(&r.job, uid, gid, job, &r.persistent, external)
            .await?;
        Ok(Response::new(self.session_view(&s).await))
    }

    async fn find_session(&self, req: Request<api::FindSessionRequest>) -> Res<api::Session> {
        let c = caller(&req)?;
        let r = req.into_inner();
        let s = self.core.session_of(&r.external_id).await?;
        let s = self.own_session(&c, s.id).await?;
        Ok(Response::new(self.session_view(&s).await))
    }

    async fn set_session_phase(
        &self,
        req: Request<api::SetSessionPhaseRequest>,
    ) -> Res<api::Session> {
        let c = caller(&req)?;
        let r = req.into_inner();
        let s = self.own_session(&c, r.id).await?;
        // Where a job's instances are mounted is the scheduler's say, not the user's: agents
        // make root mounts on the hosts named.
        if r.mount || !r.hosts.is_empty() {
            self.admin(&c, "have agents mount a session")?;
        }
        if r.mount && s.state != "active" {
            return Err(Status::failed_precondition(format!(
                "session {} is {}: nothing to mount",
                s.id, s.state
            )));
        }
        let hosts = (!r.hosts.is_empty()).then_some(r.hosts.as_slice());
        if let Some(h) = hosts {
            if let Some(bad) = h.iter().find(|h| h.is_empty() || h.contains('/')) {
                return Err(Status::invalid_argument(format!("bad host name {bad:?}")));
            }
        }
        let before = s.hosts.clone();
        let s = self.core.set_phase(r.id, &r.phase, hosts, r.mount).await?;
        // The agents of the job's hosts, before and after: no one else's.
        self.agents.poke(&before);
        self.agents.poke(&s.hosts);
        Ok(Response::new(self.session_view(&s).await))
    }

    async fn agent_sync(&self, req: Request<api::AgentSyncRequest>) -> Res<api::AgentSyncReply> {
        let c = caller(&req)?;
        self.admin(&c, "run an agent")?;
        let r = req.into_inner();
        if r.host.is_empty() {
            return Err(Status::invalid_argument("an agent must name its host"));
        }
        let wait = std::time::Duration::from_millis(u64::from(r.wait_ms.min(30_000)));
        let have = r.mounts.clone();
        let unchanged_failures = r.failed.is_empty();
        self.agents.record(&r.host, r.mounts, r.failed);
        let notify = self.agents.changed(&r.host);
        let changed = notify.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let mut mounts = crate::agents::wanted(&self.core, &self.mount_root, &r.host).await?;
        if !wait.is_zero() && unchanged_failures && crate::agents::same_mounts(&have, &mounts) {
            let _ = tokio::time::timeout(wait, changed).await;
            mounts = crate::agents::wanted(&self.core, &self.mount_root, &r.host).await?;
        }
        Ok(Response::new(api::AgentSyncReply {
            mounts,
            mount_root: self.mount_root.clone(),
        }))
    }

    async fn wait_mounts(&self, req: Request<api::WaitMountsRequest>) -> Res<api::AgentList> {
        let c = caller(&req)?;
        let r = req.into_inner();
        let s = self.own_session(&c, r.session).await?;
        let wait = std::time::Duration::from_millis(u64::from(r.wait_ms.min(60_000)));
        let agents = self.agents.wait_mounts(&s, r.mounted, wait).await;
        Ok(Response::new(api::AgentList { agents }))
    }

    async fn set_quota(&self, req: Request<api::Quota>) -> Res<api::Quota> {
        let c = caller(&req)?;
        self.admin(&c, "set quotas")?;
        let q = req.into_inner();
        if !matches!(q.kind.as_str(), "user" | "group" | "default") {
            return Err(Status::invalid_argument(format!(
                "quota kind '{}' is not user, group or default",
                q.kind
            )));
        }
        let row = crate::store::QuotaRow {
            kind: q.kind.clone(),
            id: if q.kind == "default" { 0 } else { q.id },
            capacity: q.capacity,
            instances: q.instances,
            sessions: q.sessions,
            stage_tasks: q.stage_tasks,
        };
        self.core
            .store
            .set_quota(&row, q.clear)
            .await
            .map_err(crate::core::ManagerError::from)?;
        tracing::info!(
            "quota of {} {}: {}",
            row.kind,
            row.id,
            if q.clear {
                "removed".to_string()
            } else {
                format!("{row:?}")
            }
        );
        Ok(Response::new(api::Quota { id: row.id, ..q }))
    }

    async fn list_quotas(&self, req: Request<api::Empty>) -> Res<api::QuotaList> {
        let _ = caller(&req)?;
        let mut quotas = Vec::new();
        for q in self
            .core
            .store
            .quotas()
            .await
            .map_err(crate::core::ManagerError::from)?
        {
            let (cap, inst, sess, tasks) = if q.kind == "default" {
                (0, 0, 0, 0)
            } else {
                self.core.held(&q.kind, q.id).await?
            };
            quotas.push(api::Quota {
                kind: q.kind,
                id: q.id,
                capacity: q.capacity,
                instances: q.instances,
                sessions: q.sessions,
                stage_tasks: q.stage_tasks,
                clear: false,
                used_capacity: cap,
                used_instances: inst,
                used_sessions: sess,
                used_stage_tasks: tasks,
            });
        }
        Ok(Response::new(api::QuotaList { quotas }))
    }

    async fn mover_poll(&self, req: Request<api::MoverPollRequest>) -> Res<api::MoverPollReply> {
        let c = caller(&req)?;
        self.admin(&c, "run a data mover")?;
        let r = req.into_inner();
        if r.host.is_empty() {
            return Err(Status::invalid_argument("a data mover must name its host"));
        }
        let movers = &self.stages.movers;
        movers.seen(&r.host);
        let wait = std::time::Duration::from_millis(u64::from(r.wait_ms.min(30_000)));
        let start = std::time::Instant::now();
        loop {
            let woken = movers.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let tasks = movers.take(&r.host, r.free_slots as usize);
            let cancel = self.stages.cancelled_on(&r.running);
            let left = wait.saturating_sub(start.elapsed());
            if !tasks.is_empty() || !cancel.is_empty() || left.is_zero() {
                for (id, _, _) in &tasks {
                    info!("stage task {id}: runs on data mover {}", r.host);
                }
                return Ok(Response::new(api::MoverPollReply {
                    tasks: tasks
                        .into_iter()
                        .map(|(id, task_json, owner)| api::MoverTask {
                            id,
                            task_json,
                            uid: owner.uid,
                            gid: owner.gid,
                            groups: owner.groups.clone(),
                        })
                        .collect(),
                    cancel,
                }));
            }
            // Terminations are looked for at least once a second.
            let _ = tokio::time::timeout(left.min(std::time::Duration::from_secs(1)), woken).await;
            movers.seen(&r.host);
        }
    }

    async fn mover_event(&self, req: Request<api::MoverEventRequest>) -> Res<api::MoverEventReply> {
        let c = caller(&req)?;
        self.admin(&c, "run a data mover")?;
        let r = req.into_inner();
        let movers = &self.stages.movers;
        movers.seen(&r.host);
        let msg =
            if r.exited {
                crate::stage::MoverMsg::Exited(r.exit_status)
            } else {
                crate::stage::MoverMsg::Event(serde_json::from_str(&r.event_json).map_err(|e| {
                    Status::invalid_argument(format!("unreadable worker event: {e}"))
                })?)
            };
        // A task a previous manager gave this mover (it reports to whoever leads now).
        if matches!(msg, crate::stage::MoverMsg::Event(_)) && !movers.follows(r.task) {
            self.stages.adopt(r.task, &r.host).await;
        }
        if !movers.deliver(&r.host, r.task, msg) {
            return Err(Status::not_found(format!(
                "stage task {} is not running on {}",
                r.task, r.host
            )));
        }
        Ok(Response::new(api::MoverEventReply {
            cancel: !self.stages.cancelled_on(&[r.task]).is_empty(),
        }))
    }

    async fn list_agents(&self, req: Request<api::Empty>) -> Res<api::AgentList> {
        let c = caller(&req)?;
        self.admin(&c, "list agents")?;
        let mut agents = self.agents.list();
        for a in &mut agents {
            for m in a.mounts.iter_mut().chain(a.failed.iter_mut()) {
                m.token.clear();
                m.descriptor_json.clear();
            }
        }
        Ok(Response::new(api::AgentList { agents }))
    }

    async fn get_session(&self, req: Request<api::GetSessionRequest>) -> Res<api::Session> {
        let c = caller(&req)?;
        let s = self.own_session(&c, req.into_inner().id).await?;
        Ok(Response::new(self.session_view(&s).await))
    }

    async fn end_session(&self, req: Request<api::EndSessionRequest>) -> Res<api::Session> {
        let c = caller(&req)?;
        let r = req.into_inner();
        self.own_session(&c, r.id).await?;
        let state = crate::core::requested_end(r.id, &r.state)?;
        self.stages.cancel_deferred(r.id).await?;
        let s = self
            .core
            .end_session(r.id, r.keep_job_instance, state)
            .await?;
        self.agents.poke(&s.hosts);
        Ok(Response::new(self.session_view(&s).await))
    }

    async fn list_sessions(&self, req: Request<api::Empty>) -> Res<api::SessionList> {
        let c = caller(&req)?;
        let owner = (!self.core.is_admin(&c)).then_some(c.uid);
        // Bounded for clients that cannot page: every open session (what `surge bb
        // reconcile` needs) and the newest ended ones.
        let mut rows = self
            .core
            .sessions_page(0, crate::core::MAX_PAGE, true, owner)
            .await?;
        for s in self
            .core
            .sessions_page(0, crate::core::DEFAULT_PAGE, false, owner)
            .await?
        {
            if !rows.iter().any(|r| r.id == s.id) {
                rows.push(s);
            }
        }
        rows.sort_by_key(|s| s.id);
        let mut sessions = Vec::new();
        for s in &rows {
            sessions.push(self.session_view(s).await);
        }
        Ok(Response::new(api::SessionList { sessions }))
    }

    async fn list_sessions_page(
        &self,
        req: Request<api::ListSessionsRequest>,
    ) -> Res<api::SessionPage> {
        let c = caller(&req)?;
        let owner = (!self.core.is_admin(&c)).then_some(c.uid);
        let r = req.into_inner();
        let limit = crate::core::page_limit(r.limit);
        let rows = self
            .core
            .sessions_page(r.before, limit, r.open_only, owner)
            .await?;
        let mut sessions = Vec::new();
        let mut bytes = 0usize;
        for s in &rows {
            let v = self.session_view(s).await;
            bytes += prost::Message::encoded_len(&v);
            sessions.push(v);
            if bytes > MAX_ANSWER {
                break;
            }
        }
        let next_before = match sessions.last() {
            Some(last) if sessions.len() < rows.len() || rows.len() == limit as usize => last.id,
            _ => 0,
        };
        Ok(Response::new(api::SessionPage {
            sessions,
            next_before,
        }))
    }

    async fn start_stage(&self, req: Request<api::StartStageRequest>) -> Res<api::StageTask> {
        let c = caller(&req)?;
        let r = req.into_inner();
        self.own_session(&c, r.session).await?;
        let t = self.stages.start(r).await?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn get_stage(&self, req: Request<api::GetStageRequest>) -> Res<api::StageTask> {
        let c = caller(&req)?;
        let t = self.stages.get(req.into_inner().id).await?;
        self.own_session(&c, t.session).await?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn list_stages(&self, req: Request<api::ListStagesRequest>) -> Res<api::StageTaskList> {
        let c = caller(&req)?;
        let session = req.into_inner().session;
        self.own_session(&c, session).await?;
        let tasks = self
            .stages
            .list(session)
            .await?
            .iter()
            .map(views::stage)
            .collect();
        Ok(Response::new(api::StageTaskList { tasks }))
    }

    async fn list_stages_page(
        &self,
        req: Request<api::ListStagesPageRequest>,
    ) -> Res<api::StageTaskPage> {
        let c = caller(&req)?;
        let r = req.into_inner();
        if r.session != 0 || !self.core.is_admin(&c) {
            self.own_session(&c, r.session).await?;
        }
        let limit = crate::core::page_limit(r.limit);
        let rows = self.stages.page(r.session, r.before, limit).await?;
        let mut tasks = Vec::new();
        let mut bytes = 0usize;
        for t in &rows {
            let v = views::stage(t);
            bytes += prost::Message::encoded_len(&v);
            tasks.push(v);
            if bytes > MAX_ANSWER {
                break;
            }
        }
        let next_before = match tasks.last() {
            Some(last) if tasks.len() < rows.len() || rows.len() == limit as usize => last.id,
            _ => 0,
        };
        Ok(Response::new(api::StageTaskPage { tasks, next_before }))
    }

    async fn activate_stage(&self, req: Request<api::GetStageRequest>) -> Res<api::StageTask> {
        let c = caller(&req)?;
        let id = req.into_inner().id;
        self.own_session(&c, self.stages.get(id).await?.session)
            .await?;
        let t = self.stages.activate(id).await?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn cancel_stage(&self, req: Request<api::GetStageRequest>) -> Res<api::StageTask> {
        let c = caller(&req)?;
        let id = req.into_inner().id;
        self.own_session(&c, self.stages.get(id).await?.session)
            .await?;
        let t = self.stages.cancel(id).await?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn set_stage_concurrency(
        &self,
        req: Request<api::SetStageConcurrencyRequest>,
    ) -> Res<api::Empty> {
        let c = caller(&req)?;
        let r = req.into_inner();
        self.own_session(&c, r.session).await?;
        self.stages
            .set_concurrency(r.session, r.instance, r.concurrency)
            .await?;
        Ok(Response::new(api::Empty {}))
    }

    async fn get_capability(
        &self,
        req: Request<api::GetCapabilityRequest>,
    ) -> Res<api::Capability> {
        let c = caller(&req)?;
        let r = req.into_inner();
        let inst = self.core.instance(r.instance, &r.persistent_name).await?;
        let ns = (!r.all_namespaces).then_some(r.namespace);
        let (token, expires) = self.core.capability(&c, &inst, ns)?;
        Ok(Response::new(api::Capability {
            token: token.to_text(),
            descriptor_json: serde_json::to_string(&inst.descriptor)
                .map_err(|e| Status::internal(e.to_string()))?,
            expires,
        }))
    }

    async fn get_view_token(&self, req: Request<api::Empty>) -> Res<api::ViewToken> {
        let c = caller(&req)?;
        let (token, expires) = self.core.view_token(&c);
        Ok(Response::new(api::ViewToken {
            token: token.to_text(),
            expires,
            http: self.http.clone().unwrap_or_default(),
        }))
    }
}

/// Bytes of one page of a listing at most (gRPC's default message limit is 4 MiB): rows past
/// it go to the next page.
const MAX_ANSWER: usize = 2 << 20;

impl Service {
    async fn session_view(&self, s: &crate::store::SessionRow) -> api::Session {
        let mut v = views::session(&self.core, s).await;
        v.mount_root = self.mount_root.clone();
        v
    }

    fn admin(&self, c: &Caller, what: &str) -> Result<(), Status> {
        if self.core.is_admin(c) {
            Ok(())
        } else {
            Err(denied(format!(
                "uid {} may not {what}: only root, the manager's user and its admin group may",
                c.uid
            )))
        }
    }

    /// The owner of something `c` creates: `c`, unless an administrator names another user
    /// (the scheduler acting for a job's owner). A user naming someone else is refused.
    fn owner(&self, c: &Caller, uid: u32, gid: u32) -> Result<(u32, u32), Status> {
        let named = uid != 0 || gid != 0;
        if self.core.is_admin(c) && named {
            return Ok((uid, gid));
        }
        if named && uid != c.uid {
            return Err(denied(format!(
                "uid {} may not create for uid {uid}",
                c.uid
            )));
        }
        let gid = if named && c.in_group(gid) { gid } else { c.gid };
        Ok((c.uid, gid))
    }

    /// Session `id`, if `c` owns it (or administers).
    async fn own_session(&self, c: &Caller, id: u64) -> Result<crate::store::SessionRow, Status> {
        let s = self.core.session(id).await?;
        if self.core.is_admin(c) || s.owner_uid == c.uid {
            Ok(s)
        } else {
            Err(denied(format!(
                "session {id} belongs to uid {}, not to uid {}",
                s.owner_uid, c.uid
            )))
        }
    }
}
