//! The gRPC face of the manager: translates API messages to [`Core`] calls and errors to gRPC
//! status codes (so `surge` can print the manager's own message).

use crate::core::{Core, InstanceRequest, ManagerError};
use crate::stage::Stages;
use crate::views;
use std::sync::Arc;
use surge_api::v1 as api;
use surge_api::v1::manager_server::Manager;
use tonic::{Request, Response, Status};

pub struct Service {
    pub core: Arc<Core>,
    pub stages: Arc<Stages>,
}

impl From<ManagerError> for Status {
    fn from(e: ManagerError) -> Status {
        match e {
            ManagerError::NotFound(m) => Status::not_found(m),
            ManagerError::Invalid(m) => Status::invalid_argument(m),
            ManagerError::Busy(m) => Status::failed_precondition(m),
            ManagerError::NoSpace(m) => Status::resource_exhausted(m),
            ManagerError::Unavailable(m) => Status::unavailable(m),
            ManagerError::Db(e) => Status::internal(format!("state database: {e}")),
        }
    }
}

pub fn instance_request(r: &api::CreateInstanceRequest) -> InstanceRequest {
    InstanceRequest {
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
    }
}

type Res<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Manager for Service {
    async fn register_server(&self, req: Request<api::RegisterServerRequest>) -> Res<api::Server> {
        let r = req.into_inner();
        let row = self.core.register_server(&r.addr, &r.pool).await?;
        let servers = self.core.servers()?;
        let st = servers
            .iter()
            .find(|(s, _)| s.id == row.id)
            .and_then(|(_, st)| st.as_ref());
        Ok(Response::new(views::server(&row, st)))
    }

    async fn list_servers(&self, _req: Request<api::Empty>) -> Res<api::ServerList> {
        let servers = self
            .core
            .servers()?
            .iter()
            .map(|(s, st)| views::server(s, st.as_ref()))
            .collect();
        Ok(Response::new(api::ServerList { servers }))
    }

    async fn create_pool(&self, req: Request<api::CreatePoolRequest>) -> Res<api::Pool> {
        let r = req.into_inner();
        self.core.create_pool(&r.name, r.granularity)?;
        let usage = self.core.pool_usage()?;
        let u = usage
            .into_iter()
            .find(|u| u.pool.name == r.name)
            .ok_or_else(|| Status::internal("pool vanished"))?;
        Ok(Response::new(views::pool(&u)))
    }

    async fn list_pools(&self, _req: Request<api::Empty>) -> Res<api::PoolList> {
        let pools = self.core.pool_usage()?.iter().map(views::pool).collect();
        Ok(Response::new(api::PoolList { pools }))
    }

    async fn create_instance(
        &self,
        req: Request<api::CreateInstanceRequest>,
    ) -> Res<api::Instance> {
        let r = instance_request(req.get_ref());
        let inst = self.core.create_instance(&r).await?;
        Ok(Response::new(views::instance(&self.core, &inst)))
    }

    async fn get_instance(&self, req: Request<api::GetInstanceRequest>) -> Res<api::Instance> {
        let r = req.into_inner();
        let inst = self.core.instance(r.id, &r.persistent_name)?;
        Ok(Response::new(views::instance(&self.core, &inst)))
    }

    async fn list_instances(&self, _req: Request<api::Empty>) -> Res<api::InstanceList> {
        let instances = self
            .core
            .instances()?
            .iter()
            .map(|i| views::instance(&self.core, i))
            .collect();
        Ok(Response::new(api::InstanceList { instances }))
    }

    async fn destroy_instance(&self, req: Request<api::DestroyInstanceRequest>) -> Res<api::Empty> {
        let r = req.into_inner();
        let inst = self.core.instance(r.id, &r.persistent_name)?;
        if !r.hurry {
            self.stages.wait_idle(inst.id).await;
        }
        self.core.destroy_instance(inst.id, "", None).await?;
        Ok(Response::new(api::Empty {}))
    }

    async fn create_session(&self, req: Request<api::CreateSessionRequest>) -> Res<api::Session> {
        let r = req.into_inner();
        let job = r.job_instance.as_ref().map(instance_request).map(|mut i| {
            i.owner_uid = r.owner_uid;
            i.owner_gid = r.owner_gid;
            i
        });
        let s = self
            .core
            .create_session(&r.job, r.owner_uid, r.owner_gid, job, &r.persistent)
            .await?;
        Ok(Response::new(views::session(&self.core, &s)))
    }

    async fn get_session(&self, req: Request<api::GetSessionRequest>) -> Res<api::Session> {
        let s = self.core.session(req.into_inner().id)?;
        Ok(Response::new(views::session(&self.core, &s)))
    }

    async fn end_session(&self, req: Request<api::EndSessionRequest>) -> Res<api::Session> {
        let r = req.into_inner();
        self.stages.cancel_deferred(r.id)?;
        let s = self
            .core
            .end_session(r.id, r.keep_job_instance, &r.state)
            .await?;
        Ok(Response::new(views::session(&self.core, &s)))
    }

    async fn list_sessions(&self, _req: Request<api::Empty>) -> Res<api::SessionList> {
        let sessions = self
            .core
            .sessions()?
            .iter()
            .map(|s| views::session(&self.core, s))
            .collect();
        Ok(Response::new(api::SessionList { sessions }))
    }

    async fn start_stage(&self, req: Request<api::StartStageRequest>) -> Res<api::StageTask> {
        let t = self.stages.start(req.into_inner()).await?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn get_stage(&self, req: Request<api::GetStageRequest>) -> Res<api::StageTask> {
        let t = self.stages.get(req.into_inner().id)?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn list_stages(&self, req: Request<api::ListStagesRequest>) -> Res<api::StageTaskList> {
        let tasks = self
            .stages
            .list(req.into_inner().session)?
            .iter()
            .map(views::stage)
            .collect();
        Ok(Response::new(api::StageTaskList { tasks }))
    }

    async fn activate_stage(&self, req: Request<api::GetStageRequest>) -> Res<api::StageTask> {
        let t = self.stages.activate(req.into_inner().id).await?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn cancel_stage(&self, req: Request<api::GetStageRequest>) -> Res<api::StageTask> {
        let t = self.stages.cancel(req.into_inner().id).await?;
        Ok(Response::new(views::stage(&t)))
    }

    async fn set_stage_concurrency(
        &self,
        req: Request<api::SetStageConcurrencyRequest>,
    ) -> Res<api::Empty> {
        let r = req.into_inner();
        self.stages
            .set_concurrency(r.session, r.instance, r.concurrency)?;
        Ok(Response::new(api::Empty {}))
    }
}
