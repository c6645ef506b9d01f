//! The storage seam, in the manner of IOR's `aiori` table: the benchmark drives a [`Backend`]
//! (namespace operations) and the [`BenchFile`]s it opens (data operations), and knows nothing
//! else about the storage. [`PosixBackend`] is the kernel path (any mounted file system: a Surge
//! FUSE mount, the PFS, a local disk, `/dev/shm`); a native Surge-API backend plugs in here later.
//!
//! Both traits are object-safe and speak only `std` types (`Path`, `io::Result`), so a backend
//! that is not a kernel file system can implement them.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to open a file. `direct` asks the backend to bypass the client's cache (O_DIRECT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    /// Create the file if it does not exist.
    pub create: bool,
    /// Fail if the file exists (with `create`), as mdtest's creates do.
    pub exclusive: bool,
    pub direct: bool,
}

impl OpenFlags {
    pub fn read_only() -> OpenFlags {
        OpenFlags {
            read: true,
            ..OpenFlags::default()
        }
    }
    pub fn create_write() -> OpenFlags {
        OpenFlags {
            write: true,
            create: true,
            ..OpenFlags::default()
        }
    }
    pub fn with_direct(mut self, direct: bool) -> OpenFlags {
        self.direct = direct;
        self
    }
}

/// What `stat` reports that the benchmark uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub size: u64,
    pub is_dir: bool,
}

/// Capacity of the file system holding a path, for the pre-flight space check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Space {
    pub avail_bytes: u64,
    pub total_bytes: u64,
    /// Free inodes; `None` when the file system does not count them (many FUSE and network
    /// file systems report 0).
    pub avail_inodes: Option<u64>,
    /// File system type as the kernel names it (`tmpfs`, `ext4`, `fuse`...), or `unknown`.
    pub fs_type: String,
}

/// An open file. Methods take `&self` for data operations so a hot loop can hold one borrow.
pub trait BenchFile: Send {
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Fills all of `buf` from `offset`; a short file is an error (`UnexpectedEof`).
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads up to `buf.len()` bytes at `offset`, returning how many (mdtest's read of a file
    /// that may be shorter than asked).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Makes written data durable (fsync).
    fn sync(&self) -> io::Result<()>;
    /// Drops this file's pages from the client cache so the next read goes to storage (what
    /// fio's `invalidate=1` does). Returns false when the backend has no such cache.
    fn drop_cache(&self) -> io::Result<bool>;
    /// Closes the file, reporting errors a close can reveal (e.g. a deferred write error on NFS).
    fn close(self: Box<Self>) -> io::Result<()>;
}

/// Namespace operations of a storage target.
pub trait Backend: Send + Sync {
    /// Short name shown in reports and passed to worker processes (`posix`).
    fn name(&self) -> &'static str;
    fn open(&self, path: &Path, flags: OpenFlags) -> io::Result<Box<dyn BenchFile>>;
    fn stat(&self, path: &Path) -> io::Result<FileStat>;
    fn unlink(&self, path: &Path) -> io::Result<()>;
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// Names (not paths) of the entries of a directory.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    fn space(&self, path: &Path) -> io::Result<Space>;

    /// Removes a directory tree through the backend's own operations. Missing entries are not
    /// errors (another process may be removing the same tree).
    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        let st = match self.stat(path) {
            Ok(st) => st,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if !st.is_dir {
            return ignore_not_found(self.unlink(path));
        }
        for name in self.list_dir(path)? {
            self.remove_tree(&path.join(name))?;
        }
        ignore_not_found(self.rmdir(path))
    }
}

fn ignore_not_found(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The backends this build knows, by the name reports and workers use.
pub fn by_name(name: &str) -> Option<Arc<dyn Backend>> {
    match name {
        "posix" => Some(Arc::new(PosixBackend)),
        _ => None,
    }
}

/// Names accepted by [`by_name`], for help texts and errors.
pub const BACKENDS: &[&str] = &["posix"];

/// The kernel file-system path: `open(2)`, `pread(2)`, `pwrite(2)`, `fsync(2)`...
#[derive(Clone, Copy, Debug, Default)]
pub struct PosixBackend;

struct PosixFile {
    file: File,
}

impl BenchFile for PosixFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&self.file, buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }
    fn drop_cache(&self) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        // Dirty pages are not dropped by DONTNEED; write them back first.
        self.file.sync_data()?;
        // SAFETY: a valid open descriptor; offset 0 and length 0 mean the whole file.
        let rc =
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(true)
    }
    fn close(self: Box<Self>) -> io::Result<()> {
        use std::os::fd::IntoRawFd;
        let fd = self.file.into_raw_fd();
        // SAFETY: we own fd (taken out of the File above) and close it exactly once.
        if unsafe { libc::close(fd) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {} contains a NUL byte", path.display()),
        )
    })
}

/// The kernel's name for a file system magic number (statfs f_type), for reports.
pub fn fs_type_name(magic: i64) -> &'static str {
    match magic {
        0x0102_1994 => "tmpfs",
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x6573_5546 => "fuse",
        0x6969 => "nfs",
        0x0BD0_0BD0 => "lustre",
        0x4750_4653 => "gpfs",
        0x794C_7630 => "overlay",
        0x0102_1997 => "9p",
        0x2FC1_2FC1 => "zfs",
        0xFF53_4D42 => "cifs",
        0x6264_6576 => "beegfs",
        0x00C3_6400 => "ceph",
        _ => "unknown",
    }
}

impl Backend for PosixBackend {
    fn name(&self) -> &'static str {
        "posix"
    }

    fn open(&self, path: &Path, flags: OpenFlags) -> io::Result<Box<dyn BenchFile>> {
        let mut o = OpenOptions::new();
        o.read(flags.read).write(flags.write);
        if flags.create && flags.exclusive {
            o.create_new(true);
        } else if flags.create {
            o.create(true);
        }
        if flags.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let file = o.open(path)?;
        Ok(Box::new(PosixFile { file }))
    }

    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        let m = std::fs::metadata(path)?;
        Ok(FileStat {
            size: m.len(),
            is_dir: m.is_dir(),
        })
    }

    fn unlink(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn space(&self, path: &Path) -> io::Result<Space> {
        let c = c_path(path)?;
        // SAFETY: zeroed structs are valid out-parameters; c is a NUL-terminated path.
        let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut vfs) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        let fs_type = if unsafe { libc::statfs(c.as_ptr(), &mut fs) } == 0 {
            fs_type_name(fs.f_type as i64).to_string()
        } else {
            "unknown".to_string()
        };
        let frsize = vfs.f_frsize as u64;
        Ok(Space {
            avail_bytes: (vfs.f_bavail as u64).saturating_mul(frsize),
            total_bytes: (vfs.f_blocks as u64).saturating_mul(frsize),
            avail_inodes: if vfs.f_files == 0 {
                None
            } else {
                Some(vfs.f_favail as u64)
            },
            fs_type,
        })
    }
}

/// A path under `dir` named after this host and process, so concurrent runs never collide and an
/// admin can tell whose leftovers a directory holds.
pub fn unique_run_dir(dir: &Path, tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        "surge-bench.{tag}.{}.{}.{n}",
        crate::host_name(),
        std::process::id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_round_trip_and_remove_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let b = PosixBackend;
        let d = tmp.path().join("a");
        b.mkdir(&d).unwrap();
        b.mkdir(&d.join("b")).unwrap();
        let f = b.open(&d.join("b/f"), OpenFlags::create_write()).unwrap();
        f.write_all_at(b"hello", 3).unwrap();
        f.close().unwrap();
        assert_eq!(b.stat(&d.join("b/f")).unwrap().size, 8);
        let f = b.open(&d.join("b/f"), OpenFlags::read_only()).unwrap();
        let mut buf = [0u8; 5];
        f.read_exact_at(&mut buf, 3).unwrap();
        assert_eq!(&buf, b"hello");
        let mut big = [0u8; 100];
        assert_eq!(f.read_at(&mut big, 0).unwrap(), 8);
        f.close().unwrap();
        b.remove_tree(&d).unwrap();
        assert!(!d.exists());
        // Removing what is already gone is not an error.
        b.remove_tree(&d).unwrap();
    }

    #[test]
    fn exclusive_create_fails_on_existing_file() {
        let tmp = tempfile::tempdir().unwrap();
        let b = PosixBackend;
        let p = tmp.path().join("x");
        let flags = OpenFlags {
            write: true,
            create: true,
            exclusive: true,
            ..OpenFlags::default()
        };
        b.open(&p, flags).unwrap().close().unwrap();
        let e = b.open(&p, flags).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn space_reports_a_file_system() {
        let s = PosixBackend.space(Path::new("/")).unwrap();
        assert!(s.total_bytes > 0);
        assert!(s.avail_bytes <= s.total_bytes);
    }
}
