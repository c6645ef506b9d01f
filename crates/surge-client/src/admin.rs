//! Administration of instances on servers: what `surge instance create|destroy` and the manager
//! use to turn a placement decision into fragments and namespaces on real servers.
//!
//! Placement (which servers, how much capacity on each) is the caller's decision; this module
//! only carries it out, all-or-nothing: a failure part-way destroys what was created. Every
//! call presents a capability: an administrator's (`Rights::Admin`, made with the cluster key)
//! for everything but `describe`, which an instance's own capability answers too.

use crate::conn::ServerPool;
use crate::error::{ClientError, Result};
use futures::future::join_all;
use std::time::Duration;
use surge_auth::Token;
use surge_core::{InstanceId, NamespaceId};
use surge_proto::{
    FragmentRef, InstanceDescriptor, NamespaceRef, Request, Response, ServerRef, ServerStatus,
};

/// What to create.
#[derive(Clone, Debug)]
pub struct InstancePlan {
    pub instance: InstanceId,
    pub name: String,
    /// `striped` (one namespace) or `private` (one namespace per compute node).
    pub access_mode: String,
    pub stripe_size: u64,
    /// One fragment per entry, in layout order, with its capacity.
    pub fragments: Vec<(ServerRef, u64)>,
    /// Metadata server of each namespace (namespace i on entry i).
    pub namespaces: Vec<ServerRef>,
    /// Owner and mode of each namespace's root directory.
    pub root_uid: u32,
    pub root_gid: u32,
    pub root_perm: u16,
    /// `type=cache`: the PFS directory the instance mirrors (its namespaces keep a journal).
    pub cache_pfs: Option<String>,
    /// `type=cache` with `fsync=pfs`.
    pub cache_fsync_pfs: bool,
    /// `type=cache`: `dirty_high=` (`None`: the default).
    pub cache_dirty_high: Option<surge_core::directives::DirtyHigh>,
    /// `type=cache` with `passthrough=on`.
    pub cache_passthrough: bool,
    /// The instance's generation (`surge_auth::token::new_generation`).
    pub generation: u64,
}

impl InstancePlan {
    pub fn descriptor(&self) -> InstanceDescriptor {
        InstanceDescriptor {
            instance: self.instance,
            name: self.name.clone(),
            access_mode: self.access_mode.clone(),
            capacity: self.fragments.iter().map(|f| f.1).sum(),
            stripe_size: self.stripe_size,
            fragments: self
                .fragments
                .iter()
                .enumerate()
                .map(|(i, (s, c))| FragmentRef {
                    index: i as u32,
                    server: s.clone(),
                    capacity: *c,
                })
                .collect(),
            namespaces: self
                .namespaces
                .iter()
                .enumerate()
                .map(|(i, s)| NamespaceRef {
                    ns: NamespaceId(i as u32),
                    server: s.clone(),
                })
                .collect(),
            cache_pfs: self.cache_pfs.clone(),
            cache_fsync_pfs: self.cache_fsync_pfs,
            cache_dirty_high: self.cache_dirty_high,
            cache_passthrough: self.cache_passthrough,
            generation: self.generation,
        }
    }
}

/// How long each call to a server waits by default (the connection's own default).
fn default_deadline() -> Option<Duration> {
    Some(crate::conn::DEFAULT_DEADLINE)
}

fn pool(server: &ServerRef, token: &Token, deadline: Option<Duration>) -> Result<ServerPool> {
    Ok(ServerPool::new(server.clone(), 1)?
        .with_token(std::sync::Arc::new(token.clone()))
        .with_deadline(deadline))
}

async fn call_ok(
    server: &ServerRef,
    token: &Token,
    req: Request,
    deadline: Option<Duration>,
) -> Result<()> {
    match pool(server, token, deadline)?.call(&req, &[]).await?.0 {
        Response::Ok => Ok(()),
        other => Err(ClientError::Protocol {
            server: server.id.clone(),
            request: req.name(),
            reply: format!("{other:?}"),
        }),
    }
}

/// Status of the server at `addr` (`host:port` or `unix:/path`).
pub async fn status(addr: &str, token: &Token) -> Result<ServerStatus> {
    status_within(addr, token, default_deadline()).await
}

/// [`status`], answered within `deadline` (connecting included) or an error: what liveness
/// checks use, so a hung server is found in seconds.
pub async fn status_within(
    addr: &str,
    token: &Token,
    deadline: Option<Duration>,
) -> Result<ServerStatus> {
    let s = ServerRef {
        id: addr.to_string(),
        addrs: vec![addr.to_string()],
    };
    match pool(&s, token, deadline)?
        .call(&Request::Status, &[])
        .await?
        .0
    {
        Response::Status(st) => Ok(st),
        other => Err(ClientError::Protocol {
            server: addr.to_string(),
            request: "Status",
            reply: format!("{other:?}"),
        }),
    }
}

/// A reference to the server at `addr`: its id, the address used to reach it first, then its
/// other listening addresses (a Unix socket is used by clients on the same host).
pub async fn server_ref(addr: &str, token: &Token) -> Result<ServerRef> {
    let st = status(addr, token).await?;
    let mut addrs = vec![addr.to_string()];
    for a in st.addrs {
        if a.starts_with("unix:") && !addrs.contains(&a) {
            addrs.insert(0, a);
        }
    }
    Ok(ServerRef { id: st.id, addrs })
}

/// The descriptor of `instance`, from any server that holds a piece of it.
pub async fn describe(
    addr: &str,
    instance: InstanceId,
    token: &Token,
) -> Result<InstanceDescriptor> {
    let s = ServerRef {
        id: addr.to_string(),
        addrs: vec![addr.to_string()],
    };
    match pool(&s, token, default_deadline())?
        .call(&Request::Describe { instance }, &[])
        .await?
        .0
    {
        Response::Descriptor(d) => Ok(d),
        other => Err(ClientError::Protocol {
            server: addr.to_string(),
            request: "Describe",
            reply: format!("{other:?}"),
        }),
    }
}

/// Creates every fragment and namespace of the plan; on failure removes what was created and
/// returns the first error.
pub async fn create_instance(plan: &InstancePlan, token: &Token) -> Result<InstanceDescriptor> {
    create_instance_within(plan, token, default_deadline()).await
}

/// [`create_instance`] with each server call bounded by `deadline`.
pub async fn create_instance_within(
    plan: &InstancePlan,
    token: &Token,
    deadline: Option<Duration>,
) -> Result<InstanceDescriptor> {
    let desc = plan.descriptor();
    let frag_calls = desc.fragments.iter().map(|f| {
        call_ok(
            &f.server,
            token,
            Request::CreateFragment {
                instance: desc.instance,
                fragment: f.index,
                capacity: f.capacity,
                descriptor: desc.clone(),
            },
            deadline,
        )
    });
    let mut first_err = join_all(frag_calls).await.into_iter().find_map(|r| r.err());
    if first_err.is_none() {
        let ns_calls = desc.namespaces.iter().map(|n| {
            call_ok(
                &n.server,
                token,
                Request::CreateNamespace {
                    instance: desc.instance,
                    ns: n.ns,
                    descriptor: desc.clone(),
                    root_uid: plan.root_uid,
                    root_gid: plan.root_gid,
                    root_perm: plan.root_perm,
                },
                deadline,
            )
        });
        first_err = join_all(ns_calls).await.into_iter().find_map(|r| r.err());
    }
    match first_err {
        None => Ok(desc),
        Some(e) => {
            let _ = destroy_instance_within(&desc, token, deadline).await;
            Err(e)
        }
    }
}

/// Destroys every namespace and fragment of an instance (idempotent: missing pieces are fine).
/// Returns the first error after trying them all.
pub async fn destroy_instance(desc: &InstanceDescriptor, token: &Token) -> Result<()> {
    destroy_instance_within(desc, token, default_deadline()).await
}

/// [`destroy_instance`] with each server call bounded by `deadline`.
pub async fn destroy_instance_within(
    desc: &InstanceDescriptor,
    token: &Token,
    deadline: Option<Duration>,
) -> Result<()> {
    let ns_calls = desc.namespaces.iter().map(|n| {
        call_ok(
            &n.server,
            token,
            Request::DestroyNamespace {
                instance: desc.instance,
                ns: n.ns,
            },
            deadline,
        )
    });
    let frag_calls = desc.fragments.iter().map(|f| {
        call_ok(
            &f.server,
            token,
            Request::DestroyFragment {
                instance: desc.instance,
                fragment: f.index,
            },
            deadline,
        )
    });
    // All at once: a hung server costs one deadline, not one per kind of piece.
    let (ns, frags) = futures::future::join(join_all(ns_calls), join_all(frag_calls)).await;
    ns.into_iter().chain(frags).collect()
}
