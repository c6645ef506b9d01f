//! Planning a stage: walking the sources (the PFS for a stage-in, the instance for a stage-out)
//! into the lists of directories, files and symlinks to create, with the attributes each copy
//! gets. Every source problem (missing, wrong kind, unreadable directory) is found here, before
//! a byte is copied.

use crate::names::is_temp_name;
use crate::ns::{self, file_name};
use crate::{pfs, Direction, ItemKind, StageError, StageFailure, StageItem};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use surge_client::InstanceClient;
use surge_core::Ino;
use surge_proto::{Attr, FileKind, Timestamp};

/// Attributes a copy is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
}

impl Meta {
    pub(crate) fn of_attr(a: &Attr) -> Meta {
        Meta {
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            atime: a.atime,
            mtime: a.mtime,
        }
    }
}

/// Where a file's bytes come from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    Pfs(PathBuf),
    Instance(Ino),
}

/// A directory to make sure of on the destination side.
#[derive(Clone, Debug)]
pub(crate) struct DirEntryPlan {
    pub dest: PathBuf,
    /// The source directory, for reports (empty for a parent of a destination).
    pub source: String,
    /// Attributes to give it: those of its source directory; `None` for a parent directory
    /// that only has to exist.
    pub meta: Option<Meta>,
    /// The destination of an item (or a parent of one) rather than a directory found inside a
    /// source tree: when it exists already (e.g. the instance root) its attributes are left
    /// alone.
    pub top: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct FileEntry {
    pub source: Source,
    pub source_name: String,
    pub dest: PathBuf,
    pub size: u64,
    pub meta: Meta,
}

#[derive(Clone, Debug)]
pub(crate) struct LinkEntry {
    pub source_name: String,
    pub dest: PathBuf,
    pub target: Vec<u8>,
    pub meta: Meta,
}

/// What a stage will copy, from [`plan()`]; give it to [`crate::execute`].
#[derive(Clone, Debug)]
pub struct Plan {
    pub direction: Direction,
    /// Regular files to copy.
    pub files: u64,
    /// Their total size.
    pub bytes: u64,
    /// Directories found in the sources (the top directory of each directory item included).
    pub dirs: u64,
    pub symlinks: u64,
    /// Sources that will not be copied (FIFOs, sockets, devices).
    pub skipped: Vec<StageFailure>,
    /// Parents before children.
    pub(crate) dir_list: Vec<DirEntryPlan>,
    pub(crate) file_list: Vec<FileEntry>,
    pub(crate) link_list: Vec<LinkEntry>,
    /// Space the copies take on the instance (whole blocks per object).
    pub(crate) space: u64,
}

impl Plan {
    /// Space a stage-in takes on the instance: every file's size rounded up to whole 4 KiB
    /// blocks on each fragment it is striped over (what the servers charge).
    pub fn space_needed(&self) -> u64 {
        self.space
    }
}

/// Accumulates a plan.
#[derive(Default)]
struct Parts {
    dirs: BTreeMap<PathBuf, DirEntryPlan>,
    found_dirs: u64,
    files: Vec<FileEntry>,
    links: Vec<LinkEntry>,
    skipped: Vec<StageFailure>,
}

impl Parts {
    fn add_dir(&mut self, d: DirEntryPlan) {
        if d.meta.is_some() {
            self.found_dirs += 1;
        }
        match self.dirs.get(&d.dest) {
            // A directory met twice: the one with attributes to give wins.
            Some(old) if old.meta.is_some() || d.meta.is_none() => {}
            _ => {
                self.dirs.insert(d.dest.clone(), d);
            }
        }
    }

    fn add_parent_of(&mut self, dest: &Path) {
        if let Some(parent) = dest.parent() {
            self.add_dir(DirEntryPlan {
                dest: parent.to_path_buf(),
                source: String::new(),
                meta: None,
                top: true,
            });
        }
    }

    fn finish(self, direction: Direction, stripe_size: u64, fragments: u32) -> Plan {
        const BLOCK: u64 = 4096;
        let space = self
            .files
            .iter()
            .map(|f| {
                let objects = f
                    .size
                    .div_ceil(stripe_size.max(1))
                    .clamp(1, u64::from(fragments.max(1)));
                f.size.div_ceil(BLOCK) * BLOCK + (objects - 1) * BLOCK
            })
            .sum();
        Plan {
            direction,
            files: self.files.len() as u64,
            bytes: self.files.iter().map(|f| f.size).sum(),
            dirs: self.found_dirs,
            symlinks: self.links.len() as u64,
            skipped: self.skipped,
            dir_list: self.dirs.into_values().collect(),
            file_list: self.files,
            link_list: self.links,
            space,
        }
    }
}

fn kind_name(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_file() {
        "a regular file"
    } else if ft.is_symlink() {
        "a symlink"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "a device"
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StageError + '_ {
    move |e| {
        if e.kind() == io::ErrorKind::NotFound {
            StageError::Missing {
                path: path.display().to_string(),
            }
        } else {
            StageError::Io {
                path: path.display().to_string(),
                source: e,
            }
        }
    }
}

/// An item's kind once its source is known: [`ItemKind::Any`] becomes what the source is.
fn settle(kind: ItemKind, source_is_dir: bool) -> ItemKind {
    match kind {
        ItemKind::Any if source_is_dir => ItemKind::Directory,
        ItemKind::Any => ItemKind::File,
        k => k,
    }
}

fn absolute(p: &Path) -> Result<PathBuf, StageError> {
    std::path::absolute(p).map_err(|e| StageError::Io {
        path: p.display().to_string(),
        source: e,
    })
}

/// Scans the sources of `items`, which must all go the same `direction`. Fails, naming the
/// path, when a source is missing, is not of the item's kind, or cannot be read.
pub async fn plan(
    client: &InstanceClient,
    direction: Direction,
    items: &[StageItem],
) -> Result<Plan, StageError> {
    let parts = match direction {
        Direction::In => {
            let items = items.to_vec();
            tokio::task::spawn_blocking(move || scan_pfs(&items))
                .await
                .map_err(|e| StageError::Io {
                    path: String::new(),
                    source: io::Error::other(format!("scan task failed: {e}")),
                })??
        }
        Direction::Out => scan_instance(client, items).await?,
    };
    Ok(parts.finish(direction, client.desc.stripe_size, client.fragments()))
}

fn scan_pfs(items: &[StageItem]) -> Result<Parts, StageError> {
    let mut parts = Parts::default();
    for item in items {
        let src = absolute(&item.pfs)?;
        let mut dest = ns::parse_instance_path(&item.instance_path)?;
        // The item's own source is followed if it is a symlink (as `cp` does with its
        // arguments); symlinks inside a tree are copied as symlinks.
        let md = std::fs::metadata(&src).map_err(io_err(&src))?;
        let kind = settle(item.kind, md.is_dir());
        if item.kind == ItemKind::Any
            && kind == ItemKind::File
            && (item.instance_path.ends_with('/') || file_name(&dest).is_empty())
        {
            if let Some(name) = src.file_name() {
                dest = dest.join(name);
            }
        }
        match kind {
            ItemKind::Any => unreachable!("settled above"),
            ItemKind::File => {
                if md.is_dir() {
                    return Err(StageError::WrongKind {
                        path: src.display().to_string(),
                        found: "a directory",
                        expected: "file",
                        hint: " (type=directory, or --directory, copies its contents)",
                    });
                }
                if !md.is_file() {
                    return Err(StageError::WrongKind {
                        path: src.display().to_string(),
                        found: kind_name(md.file_type()),
                        expected: "file",
                        hint: "",
                    });
                }
                if file_name(&dest).is_empty() {
                    return Err(StageError::BadPath {
                        path: item.instance_path.clone(),
                        message: "a file's destination must name the file, not the root".into(),
                    });
                }
                parts.add_parent_of(&dest);
                parts.files.push(FileEntry {
                    source: Source::Pfs(src.clone()),
                    source_name: src.display().to_string(),
                    dest,
                    size: md.len(),
                    meta: pfs::meta_of(&md),
                });
            }
            ItemKind::Directory => {
                if !md.is_dir() {
                    return Err(StageError::WrongKind {
                        path: src.display().to_string(),
                        found: kind_name(md.file_type()),
                        expected: "directory",
                        hint: " (use type=file, i.e. leave out --directory)",
                    });
                }
                parts.add_dir(DirEntryPlan {
                    dest: dest.clone(),
                    source: src.display().to_string(),
                    meta: Some(pfs::meta_of(&md)),
                    top: true,
                });
                walk_pfs(&mut parts, src, dest)?;
            }
        }
    }
    Ok(parts)
}

/// Walks a PFS tree (iteratively: deep trees must not overflow the stack).
fn walk_pfs(parts: &mut Parts, src: PathBuf, dest: PathBuf) -> Result<(), StageError> {
    let mut stack = vec![(src, dest)];
    while let Some((s, d)) = stack.pop() {
        for e in std::fs::read_dir(&s).map_err(io_err(&s))? {
            let e = e.map_err(io_err(&s))?;
            let name = e.file_name();
            if is_temp_name(name.as_bytes()) {
                continue;
            }
            let sp = e.path();
            let dp = d.join(&name);
            let md = std::fs::symlink_metadata(&sp).map_err(io_err(&sp))?;
            let ft = md.file_type();
            if ft.is_dir() {
                parts.add_dir(DirEntryPlan {
                    dest: dp.clone(),
                    source: sp.display().to_string(),
                    meta: Some(pfs::meta_of(&md)),
                    top: false,
                });
                stack.push((sp, dp));
            } else if ft.is_file() {
                parts.files.push(FileEntry {
                    source: Source::Pfs(sp.clone()),
                    source_name: sp.display().to_string(),
                    dest: dp,
                    size: md.len(),
                    meta: pfs::meta_of(&md),
                });
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&sp).map_err(io_err(&sp))?;
                parts.links.push(LinkEntry {
                    source_name: sp.display().to_string(),
                    dest: dp,
                    target: target.as_os_str().as_bytes().to_vec(),
                    meta: pfs::meta_of(&md),
                });
            } else {
                parts.skipped.push(StageFailure {
                    path: sp.display().to_string(),
                    destination: dp.display().to_string(),
                    error: format!("{}: not copied", kind_name(ft)),
                });
            }
        }
    }
    Ok(())
}

fn instance_err(path: &Path, e: surge_client::ClientError) -> StageError {
    if ns::is_errno(&e, libc::ENOENT) {
        StageError::Missing {
            path: path.display().to_string(),
        }
    } else if ns::is_errno(&e, libc::ENOTDIR) {
        StageError::BadPath {
            path: path.display().to_string(),
            message: "a component of the path is not a directory".into(),
        }
    } else {
        StageError::Instance {
            path: path.display().to_string(),
            source: e,
        }
    }
}

async fn scan_instance(client: &InstanceClient, items: &[StageItem]) -> Result<Parts, StageError> {
    let mut parts = Parts::default();
    for item in items {
        let src = ns::parse_instance_path(&item.instance_path)?;
        let mut dest = absolute(&item.pfs)?;
        let attr = ns::resolve(client, &src)
            .await
            .map_err(|e| instance_err(&src, e))?;
        let kind = settle(item.kind, attr.kind == FileKind::Dir);
        if item.kind == ItemKind::Any
            && kind == ItemKind::File
            && (item.pfs.as_os_str().as_bytes().ends_with(b"/") || dest.is_dir())
        {
            if let Some(name) = src.file_name() {
                dest = dest.join(name);
            }
        }
        match kind {
            ItemKind::Any => unreachable!("settled above"),
            ItemKind::File => {
                if attr.kind == FileKind::Dir {
                    return Err(StageError::WrongKind {
                        path: src.display().to_string(),
                        found: "a directory",
                        expected: "file",
                        hint: " (type=directory, or --directory, copies its contents)",
                    });
                }
                if dest.file_name().is_none() {
                    return Err(StageError::BadPath {
                        path: dest.display().to_string(),
                        message: "a file's destination must name the file".into(),
                    });
                }
                parts.add_parent_of(&dest);
                add_instance_entry(client, &mut parts, &src, dest, &attr).await?;
            }
            ItemKind::Directory => {
                if attr.kind != FileKind::Dir {
                    return Err(StageError::WrongKind {
                        path: src.display().to_string(),
                        found: if attr.kind == FileKind::File {
                            "a regular file"
                        } else {
                            "a symlink"
                        },
                        expected: "directory",
                        hint: " (use type=file, i.e. leave out --directory)",
                    });
                }
                parts.add_dir(DirEntryPlan {
                    dest: dest.clone(),
                    source: src.display().to_string(),
                    meta: Some(Meta::of_attr(&attr)),
                    top: true,
                });
                let mut stack = vec![(attr.ino, src, dest)];
                while let Some((ino, s, d)) = stack.pop() {
                    let entries = ns::list_dir(client, ino, true)
                        .await
                        .map_err(|e| instance_err(&s, e))?;
                    for e in entries {
                        if is_temp_name(&e.name) {
                            continue;
                        }
                        let name = OsStr::from_bytes(&e.name);
                        let sp = s.join(name);
                        let dp = d.join(name);
                        let a = match e.attr {
                            Some(a) => a,
                            None => client
                                .getattr(e.ino)
                                .await
                                .map_err(|err| instance_err(&sp, err))?,
                        };
                        if a.kind == FileKind::Dir {
                            parts.add_dir(DirEntryPlan {
                                dest: dp.clone(),
                                source: sp.display().to_string(),
                                meta: Some(Meta::of_attr(&a)),
                                top: false,
                            });
                            stack.push((a.ino, sp, dp));
                        } else {
                            add_instance_entry(client, &mut parts, &sp, dp, &a).await?;
                        }
                    }
                }
            }
        }
    }
    Ok(parts)
}

/// Adds a file or symlink of the instance to copy to `dest`.
async fn add_instance_entry(
    client: &InstanceClient,
    parts: &mut Parts,
    src: &Path,
    dest: PathBuf,
    a: &Attr,
) -> Result<(), StageError> {
    match a.kind {
        FileKind::File => parts.files.push(FileEntry {
            source: Source::Instance(a.ino),
            source_name: src.display().to_string(),
            dest,
            size: a.size,
            meta: Meta::of_attr(a),
        }),
        // A symlink is copied as a symlink: its target may name a path only meaningful where
        // the instance is mounted.
        FileKind::Symlink => {
            let target = client
                .readlink(a.ino)
                .await
                .map_err(|e| instance_err(src, e))?;
            parts.links.push(LinkEntry {
                source_name: src.display().to_string(),
                dest,
                target,
                meta: Meta::of_attr(a),
            });
        }
        FileKind::Dir => {
            return Err(StageError::WrongKind {
                path: src.display().to_string(),
                found: "a directory",
                expected: "file",
                hint: "",
            })
        }
        // As for special files on the PFS: a FIFO or socket has no data, and a device
        // number means nothing on the PFS's host.
        FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev => {
            parts.skipped.push(StageFailure {
                path: src.display().to_string(),
                destination: dest.display().to_string(),
                error: format!("{}: not copied", special_name(a.kind)),
            })
        }
    }
    Ok(())
}

fn special_name(k: FileKind) -> &'static str {
    match k {
        FileKind::Fifo => "a FIFO",
        FileKind::Socket => "a socket",
        FileKind::CharDev => "a character device",
        FileKind::BlockDev => "a block device",
        FileKind::File => "a regular file",
        FileKind::Dir => "a directory",
        FileKind::Symlink => "a symlink",
    }
}
