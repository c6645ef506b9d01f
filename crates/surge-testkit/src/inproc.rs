//! Servers inside the test process and one instance over them: the real protocol and the real
//! metadata and chunk stores, without a `surge` binary or a kernel mount.

use crate::Scratch;
use std::path::PathBuf;
use std::sync::Arc;
use surge_client::admin::{self, InstancePlan};
use surge_client::InstanceClient;
use surge_core::{InstanceId, NamespaceId};
use surge_proto::InstanceDescriptor;
use surge_server::cli::Running;

/// What instance to make.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Servers (one fragment each).
    pub servers: usize,
    /// Capacity of the instance, split evenly over the fragments.
    pub capacity: u64,
    pub stripe_size: u64,
    /// `striped` (one namespace) or `private` (one per node, namespace i on server i mod n).
    pub access_mode: &'static str,
    /// Namespaces of a private instance.
    pub nodes: u32,
    /// `type=cache`: the PFS directory the instance mirrors (its namespace keeps a journal).
    pub cache_pfs: Option<String>,
    /// With `cache_pfs`: `fsync=pfs`.
    pub cache_fsync_pfs: bool,
    /// With `cache_pfs`: `passthrough=on`.
    pub cache_passthrough: bool,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            servers: 1,
            capacity: 1 << 30,
            stripe_size: 8 << 20,
            access_mode: "striped",
            nodes: 1,
            cache_pfs: None,
            cache_fsync_pfs: false,
            cache_passthrough: false,
        }
    }
}

/// `n` in-process servers and one instance over them. The servers stop when it is dropped.
pub struct Cluster {
    pub servers: Vec<Running>,
    /// A client of namespace 0.
    pub client: Arc<InstanceClient>,
    pub desc: InstanceDescriptor,
    pub instance: InstanceId,
    pub scratch: Scratch,
}

impl Cluster {
    /// A striped instance of `capacity` bytes with `stripe` bytes stripes over `n` servers.
    pub async fn start(tag: &str, n: usize, capacity: u64, stripe: u64) -> Cluster {
        Cluster::with(
            tag,
            &Spec {
                servers: n,
                capacity,
                stripe_size: stripe,
                ..Spec::default()
            },
        )
        .await
    }

    pub async fn with(tag: &str, spec: &Spec) -> Cluster {
        let scratch = Scratch::new(tag);
        let mut servers = Vec::new();
        for i in 0..spec.servers {
            let dir = scratch.path().join(format!("bb{i}"));
            let sock = scratch.path().join(format!("bb{i}.sock"));
            servers.push(
                surge_server::cli::start(
                    vec![dir],
                    Some(1 << 40),
                    "127.0.0.1:0",
                    Some(&sock),
                    None,
                    crate::key(),
                )
                .expect("start a server"),
            );
        }
        let admin_token = crate::admin_token();
        let mut refs = Vec::new();
        for s in &servers {
            refs.push(
                admin::server_ref(s.tcp_addr(), &admin_token)
                    .await
                    .expect("server ref"),
            );
        }
        let instance = InstanceId(1000 + u64::from(fastrand::u32(..)));
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let namespaces = if spec.access_mode == "private" {
            (0..spec.nodes as usize)
                .map(|i| refs[i % refs.len()].clone())
                .collect()
        } else {
            vec![refs[0].clone()]
        };
        let plan = InstancePlan {
            instance,
            name: format!("test-{tag}"),
            access_mode: spec.access_mode.into(),
            stripe_size: spec.stripe_size,
            fragments: refs
                .iter()
                .map(|r| (r.clone(), spec.capacity / spec.servers as u64))
                .collect(),
            namespaces,
            root_uid: uid,
            root_gid: gid,
            root_perm: 0o755,
            cache_pfs: spec.cache_pfs.clone(),
            cache_fsync_pfs: spec.cache_fsync_pfs,
            cache_dirty_high: None,
            cache_passthrough: spec.cache_passthrough,
            generation: surge_auth::token::new_generation(),
        };
        let desc = admin::create_instance(&plan, &admin_token)
            .await
            .expect("create instance");
        let client = Arc::new(
            InstanceClient::new(
                desc.clone(),
                NamespaceId(0),
                crate::instance_token(instance.0),
            )
            .expect("client"),
        );
        Cluster {
            servers,
            client,
            desc,
            instance,
            scratch,
        }
    }

    /// A new client of namespace `ns` (its own connections and session, as another node).
    pub fn new_client(&self, ns: u32) -> Arc<InstanceClient> {
        Arc::new(
            InstanceClient::new(
                self.desc.clone(),
                NamespaceId(ns),
                crate::instance_token(self.instance.0),
            )
            .expect("client"),
        )
    }

    /// A new client of namespace `ns` whose capability acts for `caller` (a root agent's
    /// mount for a job's user).
    pub fn client_for(&self, ns: u32, caller: surge_auth::Caller) -> Arc<InstanceClient> {
        Arc::new(
            InstanceClient::new(
                self.desc.clone(),
                NamespaceId(ns),
                crate::instance_token_for(self.instance.0, caller),
            )
            .expect("client"),
        )
    }

    pub fn path(&self) -> &std::path::Path {
        self.scratch.path()
    }

    /// The object file holding fragment `index`'s stripes of inode `ino` of namespace 0.
    pub fn object_path(&self, index: u32, ino: u64) -> PathBuf {
        let frag = self.servers[index as usize]
            .registry
            .fragment(self.instance, index)
            .expect("fragment");
        frag.dir.join(format!("0-{ino}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &self.servers {
            s.registry.shutdown();
        }
    }
}
