//! What a server hosts: fragments of instances (chunk stores) and namespaces (metadata services),
//! their directories on the fast-tier devices, and their recovery after a restart.
//!
//! On a device:
//! ```text
//! <device>/surge-server.json                       the server's stable id
//! <device>/instances/<id>/frag-<n>/fragment.json    a fragment: capacity, instance descriptor
//! <device>/instances/<id>/frag-<n>/<ns>-<ino>       objects
//! <device>/instances/<id>/ns-<n>/namespace.json     a namespace this server is metadata server of
//! <device>/instances/<id>/ns-<n>/meta.db            its store
//! ```
//! Every JSON file is written to a temporary name and renamed, so a crash never leaves half of one.

use crate::mds::Namespace;
use crate::store::Fragment;
use anyhow::Context;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use surge_core::{InstanceId, NamespaceId};
use surge_proto::{ErrorCode, ErrorReply, FragmentStatus, InstanceDescriptor, ServerStatus};
use tracing::{info, warn};

#[derive(Serialize, Deserialize)]
struct ServerFile {
    id: String,
}

#[derive(Serialize, Deserialize)]
struct FragmentFile {
    instance: InstanceId,
    index: u32,
    capacity: u64,
    descriptor: InstanceDescriptor,
}

#[derive(Serialize, Deserialize)]
struct NamespaceFile {
    instance: InstanceId,
    ns: NamespaceId,
    descriptor: InstanceDescriptor,
    root_uid: u32,
    root_gid: u32,
    root_perm: u16,
}

pub struct Registry {
    pub id: String,
    /// The cluster key: connections present capabilities signed with it (see `access`).
    pub key: surge_auth::Key,
    pub capacity: u64,
    pub devices: Vec<PathBuf>,
    /// Listening addresses, set once the listeners are bound.
    pub addrs: RwLock<Vec<String>>,
    /// The bounds this server's connections are served within (`Status` reports them).
    pub limits: RwLock<surge_proto::Limits>,
    fragments: RwLock<HashMap<(InstanceId, u32), Arc<Fragment>>>,
    /// Each instance's space on this server, shared by its fragments here.
    budgets: parking_lot::Mutex<HashMap<InstanceId, Arc<crate::store::Budget>>>,
    namespaces: RwLock<HashMap<(InstanceId, NamespaceId), Arc<Namespace>>>,
    descriptors: RwLock<HashMap<InstanceId, InstanceDescriptor>>,
    /// Serializes creation and destruction (rare, and they touch several maps and files).
    admin: Mutex<()>,
}

pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("{} is not valid", path.display()))
}

fn new_id() -> String {
    let b: [u8; 6] = surge_core::sys::random_bytes();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{host}-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

fn err(code: ErrorCode, msg: String) -> ErrorReply {
    ErrorReply::new(code, msg)
}

impl Registry {
    /// Opens the devices, loads (or creates) the server id and recovers every fragment and
    /// namespace found on them.
    pub fn open(
        devices: Vec<PathBuf>,
        capacity: u64,
        id: Option<String>,
        key: surge_auth::Key,
    ) -> anyhow::Result<Registry> {
        anyhow::ensure!(!devices.is_empty(), "a server needs at least one --device");
        for d in &devices {
            std::fs::create_dir_all(d.join("instances"))
                .with_context(|| format!("cannot use device directory {}", d.display()))?;
            // Data at rest is the service user's: users reach it only through mounts, which
            // enforce the stored modes and owners.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make device directory {} private", d.display()))?;
        }
        let idfile = devices[0].join("surge-server.json");
        let id = match id {
            Some(id) => id,
            None if idfile.exists() => read_json::<ServerFile>(&idfile)?.id,
            None => new_id(),
        };
        // Written only when it changes: a server restarted on a full device must come up.
        let unchanged =
            idfile.exists() && read_json::<ServerFile>(&idfile).is_ok_and(|f| f.id == id);
        if !unchanged {
            write_json_atomic(&idfile, &ServerFile { id: id.clone() })
                .with_context(|| format!("cannot write {}", idfile.display()))?;
        }
        let reg = Registry {
            id,
            key,
            capacity,
            devices,
            addrs: RwLock::new(Vec::new()),
            limits: RwLock::new(crate::admission::ConnLimits::default().wire()),
            fragments: RwLock::new(HashMap::new()),
            budgets: parking_lot::Mutex::new(HashMap::new()),
            namespaces: RwLock::new(HashMap::new()),
            descriptors: RwLock::new(HashMap::new()),
            admin: Mutex::new(()),
        };
        reg.recover()?;
        Ok(reg)
    }

    fn recover(&self) -> anyhow::Result<()> {
        for dev in &self.devices {
            let root = dev.join("instances");
            for inst in std::fs::read_dir(&root)? {
                let inst = inst?.path();
                let Ok(entries) = std::fs::read_dir(&inst) else {
                    continue;
                };
                for e in entries {
                    let p = e?.path();
                    let name = p
                        .file_name()
                        .map(|n| n.to_string_lossy().to_string())
                        .unwrap_or_default();
                    let res = if name.starts_with("frag-") {
                        self.recover_fragment(dev, &p)
                    } else if name.starts_with("ns-") {
                        self.recover_namespace(dev, &p)
                    } else {
                        Ok(())
                    };
                    if let Err(e) = res {
                        warn!("skipping {}: {e:#}", p.display());
                    }
                }
            }
        }
        let (f, n) = (self.fragments.read().len(), self.namespaces.read().len());
        if f + n > 0 {
            info!("recovered {f} fragments and {n} namespaces");
        }
        Ok(())
    }

    fn recover_fragment(&self, dev: &Path, dir: &Path) -> anyhow::Result<()> {
        let meta: FragmentFile = read_json(&dir.join("fragment.json"))?;
        let frag = Fragment::open(
            meta.instance,
            meta.index,
            dir.to_path_buf(),
            dev.to_path_buf(),
            meta.capacity,
            self.budget(&meta.descriptor, dev),
        )?;
        self.descriptors
            .write()
            .insert(meta.instance, meta.descriptor);
        self.fragments
            .write()
            .insert((meta.instance, meta.index), Arc::new(frag));
        Ok(())
    }

    fn recover_namespace(&self, dev: &Path, dir: &Path) -> anyhow::Result<()> {
        let meta: NamespaceFile = read_json(&dir.join("namespace.json"))?;
        let ns = Namespace::start(
            dir,
            meta.instance,
            meta.ns,
            (meta.root_uid, meta.root_gid, meta.root_perm),
            meta.descriptor.cache_pfs.is_some(),
            self.budget(&meta.descriptor, dev),
        )?;
        self.descriptors
            .write()
            .insert(meta.instance, meta.descriptor);
        self.namespaces
            .write()
            .insert((meta.instance, meta.ns), Arc::new(ns));
        Ok(())
    }

    /// The instance's space on this server, shared with the other servers of this host
    /// whose devices are on the file system of `dev` (made empty if it has none yet).
    fn budget(&self, d: &InstanceDescriptor, dev: &Path) -> Arc<crate::store::Budget> {
        self.budgets
            .lock()
            .entry(d.instance)
            .or_insert_with(|| {
                Arc::new(crate::store::Budget::on_host(d.instance, d.generation, dev))
            })
            .clone()
    }

    fn reserved_on(&self, dev: &Path) -> u64 {
        self.fragments
            .read()
            .values()
            .filter(|f| f.device == dev)
            .map(|f| f.capacity)
            .sum()
    }

    fn reserved(&self) -> u64 {
        self.fragments.read().values().map(|f| f.capacity).sum()
    }

    fn least_used_device(&self) -> PathBuf {
        self.devices
            .iter()
            .min_by_key(|d| self.reserved_on(d))
            .cloned()
            .unwrap_or_default()
    }

    fn instance_dir(dev: &Path, instance: InstanceId) -> PathBuf {
        dev.join("instances").join(instance.0.to_string())
    }

    pub fn create_fragment(
        &self,
        instance: InstanceId,
        index: u32,
        capacity: u64,
        descriptor: InstanceDescriptor,
    ) -> Result<(), ErrorReply> {
        let _g = self.admin.lock();
        if let Some(f) = self.fragments.read().get(&(instance, index)) {
            // Idempotent, so a manager can retry a half-finished allocation.
            if f.capacity == capacity {
                return Ok(());
            }
            return Err(err(
                ErrorCode::Exists,
                format!("fragment {index} of instance {instance} exists with another capacity"),
            ));
        }
        let reserved = self.reserved();
        if reserved + capacity > self.capacity {
            return Err(err(
                ErrorCode::NoSpace,
                format!(
                    "server {} cannot host {capacity} more bytes ({reserved} of {} reserved)",
                    self.id, self.capacity
                ),
            ));
        }
        let dev = self.least_used_device();
        let dir = Self::instance_dir(&dev, instance).join(format!("frag-{index}"));
        let io = |e: std::io::Error| err(ErrorCode::Io, format!("{}: {e}", dir.display()));
        let frag = Fragment::open(
            instance,
            index,
            dir.clone(),
            dev.clone(),
            capacity,
            self.budget(&descriptor, &dev),
        )
        .map_err(io)?;
        write_json_atomic(
            &dir.join("fragment.json"),
            &FragmentFile {
                instance,
                index,
                capacity,
                descriptor: descriptor.clone(),
            },
        )
        .map_err(io)?;
        self.descriptors.write().insert(instance, descriptor);
        self.fragments
            .write()
            .insert((instance, index), Arc::new(frag));
        info!(
            "created fragment {index} of instance {instance} ({capacity} bytes) in {}",
            dir.display()
        );
        Ok(())
    }

    pub fn destroy_fragment(&self, instance: InstanceId, index: u32) -> Result<(), ErrorReply> {
        let _g = self.admin.lock();
        let Some(frag) = self.fragments.write().remove(&(instance, index)) else {
            return Ok(());
        };
        frag.destroy()
            .map_err(|e| err(ErrorCode::Io, format!("{}: {e}", frag.dir.display())))?;
        self.forget_instance_if_unused(instance, &frag.device);
        info!("destroyed fragment {index} of instance {instance}");
        Ok(())
    }

    pub fn create_namespace(
        &self,
        instance: InstanceId,
        ns: NamespaceId,
        descriptor: InstanceDescriptor,
        root: (u32, u32, u16),
    ) -> Result<(), ErrorReply> {
        let _g = self.admin.lock();
        if self.namespaces.read().contains_key(&(instance, ns)) {
            return Ok(());
        }
        let dev = self.least_used_device();
        let dir = Self::instance_dir(&dev, instance).join(format!("ns-{}", ns.0));
        let io = |e: String| err(ErrorCode::Io, format!("{}: {e}", dir.display()));
        let space = Namespace::start(
            &dir,
            instance,
            ns,
            root,
            descriptor.cache_pfs.is_some(),
            self.budget(&descriptor, &dev),
        )
        .map_err(|e| io(format!("{e:#}")))?;
        write_json_atomic(
            &dir.join("namespace.json"),
            &NamespaceFile {
                instance,
                ns,
                descriptor: descriptor.clone(),
                root_uid: root.0,
                root_gid: root.1,
                root_perm: root.2,
            },
        )
        .map_err(|e| io(e.to_string()))?;
        self.descriptors.write().insert(instance, descriptor);
        self.namespaces
            .write()
            .insert((instance, ns), Arc::new(space));
        info!(
            "serving metadata of namespace {} of instance {instance}",
            ns.0
        );
        Ok(())
    }

    pub fn destroy_namespace(
        &self,
        instance: InstanceId,
        ns: NamespaceId,
    ) -> Result<(), ErrorReply> {
        let _g = self.admin.lock();
        let Some(space) = self.namespaces.write().remove(&(instance, ns)) else {
            return Ok(());
        };
        space.stop();
        if let Err(e) = std::fs::remove_dir_all(&space.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(err(ErrorCode::Io, format!("{}: {e}", space.dir.display())));
            }
        }
        if let Some(dev) = space
            .dir
            .parent()
            .and_then(|p| p.parent())
            .and_then(|p| p.parent())
        {
            self.forget_instance_if_unused(instance, dev);
        }
        info!("destroyed namespace {} of instance {instance}", ns.0);
        Ok(())
    }

    fn forget_instance_if_unused(&self, instance: InstanceId, dev: &Path) {
        let used = self.fragments.read().keys().any(|(i, _)| *i == instance)
            || self.namespaces.read().keys().any(|(i, _)| *i == instance);
        if !used {
            self.descriptors.write().remove(&instance);
        }
        if !self.fragments.read().keys().any(|(i, _)| *i == instance) {
            self.budgets.lock().remove(&instance);
        }
        // Remove the instance directory on this device once it is empty.
        let _ = std::fs::remove_dir(Self::instance_dir(dev, instance));
    }

    pub fn fragment(&self, instance: InstanceId, index: u32) -> Result<Arc<Fragment>, ErrorReply> {
        if let Some(f) = self.fragments.read().get(&(instance, index)) {
            return Ok(f.clone());
        }
        Err(self.unknown(instance, || {
            (
                ErrorCode::UnknownFragment,
                format!(
                    "server {} holds no fragment {index} of instance {instance}",
                    self.id
                ),
            )
        }))
    }

    /// Removes the objects of a file the metadata server has just forgotten from the fragments of
    /// its instance that live on this server. The client removes objects holding data on other
    /// servers, but cannot know of empty ones (a passthrough open creates its object; a truncate
    /// to zero keeps it), which would otherwise stay behind.
    pub fn remove_local_objects(&self, instance: InstanceId, file: surge_core::FileId) {
        let frags: Vec<Arc<Fragment>> = self
            .fragments
            .read()
            .iter()
            .filter(|((i, _), _)| *i == instance)
            .map(|(_, f)| f.clone())
            .collect();
        for f in frags {
            if let Err(e) = f.remove(file) {
                tracing::warn!(
                    "cannot remove the object of forgotten inode {}: {}",
                    file.ino,
                    e.message
                );
            }
        }
    }

    pub fn namespace(
        &self,
        instance: InstanceId,
        ns: NamespaceId,
    ) -> Result<Arc<Namespace>, ErrorReply> {
        if let Some(n) = self.namespaces.read().get(&(instance, ns)) {
            return Ok(n.clone());
        }
        Err(self.unknown(instance, || {
            (
                ErrorCode::UnknownNamespace,
                format!(
                    "server {} is not the metadata server of namespace {} of instance {instance}",
                    self.id, ns.0
                ),
            )
        }))
    }

    fn unknown(
        &self,
        instance: InstanceId,
        known: impl FnOnce() -> (ErrorCode, String),
    ) -> ErrorReply {
        if self.descriptors.read().contains_key(&instance) {
            let (c, m) = known();
            err(c, m)
        } else {
            err(
                ErrorCode::UnknownInstance,
                format!("server {} hosts no part of instance {instance}", self.id),
            )
        }
    }

    /// The generation of `instance` as this server holds it (`None`: it holds nothing of it);
    /// see `access::not_revoked`.
    pub fn generation(&self, instance: InstanceId) -> Option<u64> {
        self.descriptors.read().get(&instance).map(|d| d.generation)
    }

    pub fn describe(&self, instance: InstanceId) -> Result<InstanceDescriptor, ErrorReply> {
        self.descriptors
            .read()
            .get(&instance)
            .cloned()
            .ok_or_else(|| {
                err(
                    ErrorCode::UnknownInstance,
                    format!("server {} hosts no part of instance {instance}", self.id),
                )
            })
    }

    pub fn status(&self) -> ServerStatus {
        let mut fragments: Vec<FragmentStatus> = self
            .fragments
            .read()
            .values()
            .map(|f| FragmentStatus {
                instance: f.instance,
                index: f.index,
                capacity: f.capacity,
                used: f.used(),
                device: f.device.display().to_string(),
            })
            .collect();
        fragments.sort_by_key(|f| (f.instance, f.index));
        for f in fragments.iter_mut() {
            f.used += self.metadata_under(f.instance, f.index);
        }
        let mut namespaces: Vec<_> = self.namespaces.read().keys().copied().collect();
        namespaces.sort();
        ServerStatus {
            id: self.id.clone(),
            addrs: self.addrs.read().clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            capacity: self.capacity,
            reserved: fragments.iter().map(|f| f.capacity).sum(),
            used: fragments.iter().map(|f| f.used).sum(),
            devices: self
                .devices
                .iter()
                .map(|d| d.display().to_string())
                .collect(),
            fragments,
            namespaces,
            limits: self.limits.read().clone(),
        }
    }

    /// What the namespaces of `instance` here keep in metadata that counts as its use (their
    /// extended attributes), when `index` is the instance's first fragment on this server:
    /// reported under that fragment, as use the instance's space here pays for (placement
    /// puts every namespace on a server holding fragments of its instance).
    pub fn metadata_under(&self, instance: InstanceId, index: u32) -> u64 {
        let first = self
            .fragments
            .read()
            .keys()
            .filter(|(i, _)| *i == instance)
            .map(|(_, n)| *n)
            .min();
        if first != Some(index) {
            return 0;
        }
        self.namespaces
            .read()
            .iter()
            .filter(|((i, _), _)| *i == instance)
            .map(|(_, space)| space.xattr_bytes())
            .sum()
    }

    /// Stops every metadata service (their last transactions are committed already).
    pub fn shutdown(&self) {
        for ns in self.namespaces.read().values() {
            ns.stop();
        }
    }
}
