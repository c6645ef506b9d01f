//! The fill of a cache instance (`type=cache pfs=DIR`) before its job: the lazy fill. The
//! namespace gets the PFS directory's tree (directories, files with their sizes, modes and
//! times, symbolic links) without its data: each regular file is linked on the PFS under its
//! fill name (`surge_proto::cache_through_path(root, ino, THROUGH_FILL)`) and marked
//! [`THROUGH_FILL`] on the metadata server, so the mounts read it from the PFS until a mount
//! has copied it into the fast tier (see `surge_client`'s `fs::fill`). A file that cannot be
//! linked (owned by another user under `fs.protected_hardlinks`, another file system) is copied
//! now instead. Runs as the instance's owner; the namespace must be new.

use crate::drain::{pfs_err, DrainError, THROUGH_DIR};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use surge_client::InstanceClient;
use surge_core::Ino;
use surge_proto::{FillStep, NewNode, Timestamp, THROUGH_FILL};

/// The root inode of a namespace.
const ROOT: Ino = 1;
/// Bytes per request when a file is copied now.
const CHUNK: usize = 8 << 20;

/// What a fill made.
#[derive(Debug, Default, Clone, Copy)]
pub struct FillStats {
    pub dirs: u64,
    /// Regular files left on the PFS until first read.
    pub lazy_files: u64,
    /// Their bytes.
    pub lazy_bytes: u64,
    /// Regular files copied during the fill (could not be linked), and their bytes.
    pub copied_files: u64,
    pub copied_bytes: u64,
    pub symlinks: u64,
    /// FIFOs, sockets and devices, which a cache does not mirror.
    pub skipped: u64,
}

fn inst_err(path: &Path) -> impl FnOnce(surge_client::ClientError) -> DrainError + '_ {
    move |source| DrainError::Instance {
        path: path.to_path_buf(),
        source,
    }
}

fn ts(secs: i64, nsec: i64) -> Timestamp {
    Timestamp {
        secs,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    }
}

/// Fills the new namespace of `client` from PFS directory `root` lazily. `interrupted` is
/// asked between files.
pub async fn fill_lazy(
    client: &InstanceClient,
    root: &Path,
    interrupted: impl Fn() -> bool,
) -> Result<FillStats, DrainError> {
    let links = root.join(THROUGH_DIR);
    std::fs::create_dir_all(&links).map_err(pfs_err(&links, "cannot create"))?;
    std::fs::set_permissions(&links, std::fs::Permissions::from_mode(0o700))
        .map_err(pfs_err(&links, "cannot set the mode of"))?;
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut stats = FillStats::default();
    // `passthrough=on`: each file one stripe, so that a mount of a fragment's host reads and
    // writes it by kernel passthrough once it is on the tier; on this host's fragments when
    // it has some (the embedded default: all), else spread over all of them.
    let one_stripe: Vec<u32> = if client.desc.cache_passthrough {
        match client.local_fragments().await {
            l if l.is_empty() => (0..client.fragments()).collect(),
            l => l,
        }
    } else {
        Vec::new()
    };
    let mut todo: Vec<(PathBuf, Ino)> = vec![(root.to_path_buf(), ROOT)];
    while let Some((dir, parent)) = todo.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(pfs_err(&dir, "cannot list"))?
            .collect::<Result<_, _>>()
            .map_err(pfs_err(&dir, "cannot list"))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if interrupted() {
                return Err(DrainError::Pfs {
                    path: dir.clone(),
                    what: "fill interrupted in",
                    source: std::io::Error::from(std::io::ErrorKind::Interrupted),
                });
            }
            let name = e.file_name();
            let path = e.path();
            if parent == ROOT && name == THROUGH_DIR {
                continue;
            }
            // A copy a crashed drain left.
            if name.as_bytes().ends_with(b".surge-drain") && name.as_bytes().starts_with(b".") {
                continue;
            }
            let m = std::fs::symlink_metadata(&path).map_err(pfs_err(&path, "cannot stat"))?;
            let perm = (m.permissions().mode() & 0o7777) as u16;
            let name = name.as_bytes();
            let ft = m.file_type();
            if ft.is_dir() {
                let a = client
                    .create(parent, name, NewNode::Dir, perm, uid, gid)
                    .await
                    .map_err(inst_err(&path))?;
                stats.dirs += 1;
                todo.push((path, a.ino));
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&path).map_err(pfs_err(&path, "cannot read"))?;
                client
                    .create(
                        parent,
                        name,
                        NewNode::Symlink {
                            target: target.as_os_str().as_bytes().to_vec(),
                        },
                        0o777,
                        uid,
                        gid,
                    )
                    .await
                    .map_err(inst_err(&path))?;
                stats.symlinks += 1;
            } else if ft.is_file() {
                let a = client
                    .create(parent, name, NewNode::File, perm, uid, gid)
                    .await
                    .map_err(inst_err(&path))?;
                if !one_stripe.is_empty() {
                    let layout = surge_core::FileLayout {
                        stripe_size: 0,
                        stripe_count: 1,
                        start: one_stripe
                            [(stats.lazy_files + stats.copied_files) as usize % one_stripe.len()],
                    };
                    client
                        .set_layout(a.ino, layout)
                        .await
                        .map_err(inst_err(&path))?;
                }
                let atime = ts(m.atime(), m.atime_nsec());
                let mtime = ts(m.mtime(), m.mtime_nsec());
                let size = m.len();
                let link = surge_proto::cache_through_path(root, a.ino, THROUGH_FILL);
                let linked = size > 0 && std::fs::hard_link(&path, &link).is_ok();
                if linked {
                    client
                        .cache_fill(a.ino, FillStep::Mark { size, atime, mtime })
                        .await
                        .map_err(inst_err(&path))?;
                    stats.lazy_files += 1;
                    stats.lazy_bytes += size;
                } else {
                    copy_now(client, a.ino, &path, size).await?;
                    client
                        .setattr_meta(
                            a.ino,
                            surge_proto::SetAttr {
                                atime: Some(surge_proto::TimeSet::At(atime)),
                                mtime: Some(surge_proto::TimeSet::At(mtime)),
                                ..Default::default()
                            },
                        )
                        .await
                        .map_err(inst_err(&path))?;
                    stats.copied_files += 1;
                    stats.copied_bytes += size;
                }
            } else {
                stats.skipped += 1;
            }
        }
    }
    Ok(stats)
}

/// Copies PFS file `path` (`size` bytes) into `ino` now.
async fn copy_now(
    client: &InstanceClient,
    ino: Ino,
    path: &Path,
    size: u64,
) -> Result<(), DrainError> {
    use std::io::Read;
    if size == 0 {
        return Ok(());
    }
    let mut f = std::fs::File::open(path).map_err(pfs_err(path, "cannot open"))?;
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(pfs_err(path, "cannot read"))?;
        if n == 0 {
            break;
        }
        client
            .write(ino, off, &buf[..n])
            .await
            .map_err(inst_err(path))?;
        off += n as u64;
    }
    client
        .commit_write(ino, off, surge_proto::TimeSet::Now, false)
        .await
        .map_err(inst_err(path))?;
    Ok(())
}
