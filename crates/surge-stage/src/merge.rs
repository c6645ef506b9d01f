//! Stage-out from the namespaces of a private instance (one per compute node): every node's
//! tree goes to the same destination, so a path present in two namespaces would keep only one
//! node's copy. [`private_outputs`] finds, before anything is copied, which namespaces hold
//! each item and which destination paths more than one of them would write.

use crate::ns;
use crate::{ItemKind, StageError, StageItem};
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use surge_client::InstanceClient;
use surge_proto::FileKind;

/// What the namespaces of a private instance hold of a stage-out's items.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PrivateOutputs {
    /// For each namespace (by index in the clients given), the items it holds.
    pub items: Vec<Vec<StageItem>>,
    /// Destination paths more than one namespace would write, with those namespaces.
    pub conflicts: Vec<(PathBuf, Vec<u32>)>,
}

/// `clients[k]` is a client of namespace `k`.
pub async fn private_outputs(
    clients: &[std::sync::Arc<InstanceClient>],
    items: &[StageItem],
) -> Result<PrivateOutputs, StageError> {
    let mut out = PrivateOutputs {
        items: vec![Vec::new(); clients.len()],
        conflicts: Vec::new(),
    };
    let mut writers: BTreeMap<PathBuf, Vec<u32>> = BTreeMap::new();
    for item in items {
        let src = ns::parse_instance_path(&item.instance_path)?;
        for (k, client) in clients.iter().enumerate() {
            let Ok(attr) = ns::resolve(client, &src).await else {
                continue;
            };
            out.items[k].push(item.clone());
            match (&item.kind, attr.kind) {
                (ItemKind::Directory, FileKind::Dir) => {
                    let mut dests = Vec::new();
                    walk(client, attr.ino, &item.pfs, &mut dests).await?;
                    for d in dests {
                        writers.entry(d).or_default().push(k as u32);
                    }
                }
                _ => writers.entry(item.pfs.clone()).or_default().push(k as u32),
            }
        }
    }
    out.conflicts = writers
        .into_iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .collect();
    Ok(out)
}

/// The destination of every non-directory below directory `ino`, copied into `dest`.
async fn walk(
    client: &InstanceClient,
    ino: surge_core::Ino,
    dest: &Path,
    out: &mut Vec<PathBuf>,
) -> Result<(), StageError> {
    let mut stack = vec![(ino, dest.to_path_buf())];
    while let Some((dir, d)) = stack.pop() {
        let entries =
            ns::list_dir(client, dir, false)
                .await
                .map_err(|source| StageError::Instance {
                    path: d.display().to_string(),
                    source,
                })?;
        for e in entries {
            if crate::is_temp_name(&e.name) {
                continue;
            }
            let p = d.join(std::ffi::OsStr::from_bytes(&e.name));
            if e.kind == FileKind::Dir {
                stack.push((e.ino, p));
            } else {
                out.push(p);
            }
        }
    }
    Ok(())
}
