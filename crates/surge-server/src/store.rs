//! The chunk store of one fragment: a directory on a fast-tier device holding one object file per
//! file of the instance (all of that file's stripes on this fragment, at packed offsets; see
//! `surge_core::layout`).
//!
//! Capacity is enforced here. `used` counts the blocks the device really allocated (st_blocks),
//! so sparse files cost only what they store. A write that could grow the fragment past its
//! capacity is refused with `NoSpace` before a byte is written, so nothing already stored is
//! harmed; overwrites of allocated bytes are always allowed.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use surge_core::{FileId, InstanceId};
use surge_proto::{AllocMode, ErrorCode, ErrorReply};

/// Open objects kept per fragment; beyond this, idle ones are closed.
const MAX_OPEN_OBJECTS: usize = 4096;
/// Device allocation unit assumed when bounding a write's growth.
const BLOCK: u64 = 4096;

struct Object {
    file: File,
    /// (apparent size, allocated bytes) as of the last change made through this server.
    state: Mutex<(u64, u64)>,
}

/// A read of `len` bytes within the protocol's limit of one request, or its refusal (before
/// anything is allocated).
fn read_limit(len: u32) -> Result<(), ErrorReply> {
    if len > surge_proto::frame::MAX_IO {
        return Err(ErrorReply::new(
            ErrorCode::TooLarge,
            format!(
                "read of {len} bytes exceeds the {}-byte limit of one request",
                surge_proto::frame::MAX_IO
            ),
        ));
    }
    Ok(())
}

/// An object's open file, kept open while a reply is sent from it.
pub struct ObjectFile(Arc<Object>);

impl ObjectFile {
    pub fn file(&self) -> &File {
        &self.0.file
    }
}

pub use crate::budget::Budget;

pub struct Fragment {
    pub instance: InstanceId,
    pub index: u32,
    pub dir: PathBuf,
    /// `dir`, open: objects are removed relative to it (no walk of the whole path each time).
    dir_fd: std::fs::File,
    pub capacity: u64,
    pub device: PathBuf,
    used: AtomicU64,
    /// The instance's space on this server, shared with its other fragments here.
    budget: Arc<Budget>,
    objects: Mutex<HashMap<FileId, Arc<Object>>>,
    /// Bytes allocated to each object as last measured; `used` is their sum. Kept for every
    /// object, open or not, so an object written behind the server's back (passthrough) or
    /// closed and reopened is never counted twice or missed.
    allocs: Mutex<HashMap<FileId, u64>>,
}

fn io_err(what: &str, path: &Path, e: io::Error) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::from_io(&e),
        format!("{what} {}: {e}", path.display()),
    )
}

fn allocated(md: &std::fs::Metadata) -> u64 {
    md.blocks() * 512
}

impl Fragment {
    /// Opens a fragment directory, measuring what its objects already use; its capacity and
    /// use join the instance's `budget` on this server.
    pub fn open(
        instance: InstanceId,
        index: u32,
        dir: PathBuf,
        device: PathBuf,
        capacity: u64,
        budget: Arc<Budget>,
    ) -> io::Result<Fragment> {
        std::fs::create_dir_all(&dir)?;
        let mut used = 0;
        let mut allocs = HashMap::new();
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            if let Some((ns, ino)) = Self::parse_object_name(&e.file_name().to_string_lossy()) {
                let a = allocated(&e.metadata()?);
                used += a;
                allocs.insert(
                    FileId {
                        ns: surge_core::NamespaceId(ns),
                        ino,
                    },
                    a,
                );
            }
        }
        let dir_fd = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_PATH)
                .open(&dir)?
        };
        budget.add_capacity(capacity);
        budget.add_used(used);
        Ok(Fragment {
            instance,
            index,
            dir,
            dir_fd,
            capacity,
            device,
            budget,
            used: AtomicU64::new(used),
            objects: Mutex::new(HashMap::new()),
            allocs: Mutex::new(allocs),
        })
    }

    fn parse_object_name(name: &str) -> Option<(u32, u64)> {
        let (ns, ino) = name.split_once('-')?;
        Some((ns.parse().ok()?, ino.parse().ok()?))
    }

    fn object_path(&self, file: FileId) -> PathBuf {
        self.dir.join(surge_core::layout::object_name(file))
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// What the instance has left on this server: its budget here less what its fragments
    /// here use.
    pub fn room(&self) -> u64 {
        self.budget.room()
    }

    /// The object of `file`, opened (and created when `create`) on first use.
    fn object(&self, file: FileId, create: bool) -> Result<Option<Arc<Object>>, ErrorReply> {
        if let Some(o) = self.objects.lock().get(&file) {
            return Ok(Some(o.clone()));
        }
        let path = self.object_path(file);
        let f = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
            Err(e) => return Err(io_err("cannot open object", &path, e)),
        };
        let md = f
            .metadata()
            .map_err(|e| io_err("cannot stat object", &path, e))?;
        let obj = Arc::new(Object {
            file: f,
            state: Mutex::new((md.len(), allocated(&md))),
        });
        let mut objects = self.objects.lock();
        if objects.len() >= MAX_OPEN_OBJECTS {
            // Close idle objects (those no request holds); in-flight requests keep theirs.
            objects.retain(|_, o| Arc::strong_count(o) > 1);
        }
        Ok(Some(objects.entry(file).or_insert(obj).clone()))
    }

    /// Records `new_alloc` bytes for `file` and updates `used` by the difference.
    fn set_alloc(&self, file: FileId, new_alloc: Option<u64>) {
        let old = {
            let mut allocs = self.allocs.lock();
            match new_alloc {
                Some(a) => allocs.insert(file, a),
                None => allocs.remove(&file),
            }
        }
        .unwrap_or(0);
        let new = new_alloc.unwrap_or(0);
        if new >= old {
            self.used.fetch_add(new - old, Ordering::Relaxed);
            self.budget.add_used(new - old);
        } else {
            self.used
                .fetch_sub((old - new).min(self.used()), Ordering::Relaxed);
            self.budget.sub_used(old - new);
        }
    }

    /// Re-reads the object's size and allocation after a change and updates `used`.
    fn account(
        &self,
        file: FileId,
        obj: &Object,
        st: &mut (u64, u64),
        path: &Path,
    ) -> Result<(), ErrorReply> {
        let md = obj
            .file
            .metadata()
            .map_err(|e| io_err("cannot stat object", path, e))?;
        let new_alloc = allocated(&md);
        self.set_alloc(file, Some(new_alloc));
        *st = (md.len(), new_alloc);
        Ok(())
    }

    /// Reserves in the instance's budget on this server what a change ending at `end` and
    /// `len` bytes long may newly allocate in an object whose (size, allocated bytes) are `st`:
    /// nothing when it only covers a fully allocated region, else at most the whole blocks it
    /// touches. `NoSpace` (nothing reserved) when that could pass the capacity of
    /// the instance's fragments here. The caller gives the returned bytes back (with
    /// [`Fragment::unreserve`]) once the object has been measured again.
    fn reserve(&self, st: (u64, u64), end: u64, len: u64) -> Result<u64, ErrorReply> {
        let (size, alloc) = st;
        if end <= size && alloc >= size {
            return Ok(0);
        }
        // The blocks the range touches (a range of exactly the space left fits).
        let start = end - len;
        let growth = (end.div_ceil(BLOCK) - start / BLOCK) * BLOCK;
        crate::reserve::data_may_grow(&self.dir, growth)?;
        if let Err((before, capacity)) = self.budget.reserve(growth) {
            return Err(ErrorReply::new(
                ErrorCode::NoSpace,
                format!(
                    "instance {} cannot take {} more on this server (fragment {}; {} of the {} \
                     of its fragments here used)",
                    self.instance,
                    surge_core::format_bytes(len),
                    self.index,
                    surge_core::format_bytes(before),
                    surge_core::format_bytes(capacity)
                ),
            ));
        }
        Ok(growth)
    }

    /// Gives back what [`reserve`](Self::reserve) took.
    fn unreserve(&self, growth: u64) {
        self.budget.sub_used(growth);
    }

    pub fn write(&self, file: FileId, offset: u64, data: &[u8]) -> Result<u64, ErrorReply> {
        let len = data.len() as u64;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| ErrorReply::new(ErrorCode::TooLarge, "write past the largest offset"))?;
        let Some(obj) = self.object(file, true)? else {
            return Err(ErrorReply::new(ErrorCode::Io, "object vanished"));
        };
        let path = self.object_path(file);
        let mut st = obj.state.lock();
        let growth = self.reserve(*st, end, len)?;
        let res = obj.file.write_all_at(data, offset);
        self.unreserve(growth);
        let acct = self.account(file, &obj, &mut st, &path);
        res.map_err(|e| io_err("cannot write object", &path, e))?;
        acct?;
        Ok(len)
    }

    /// Appends `data` to the object of `file`, a file of one stripe (the object is the file),
    /// first extended to `at_least` bytes; returns the offset it was written at. The write
    /// is the kernel's append (`RWF_APPEND`, under the object's inode lock), so it never
    /// overlaps an append a node's kernel makes straight into the object (passthrough).
    pub fn append(&self, file: FileId, at_least: u64, data: &[u8]) -> Result<u64, ErrorReply> {
        use std::os::fd::AsRawFd;
        let len = data.len() as u64;
        let Some(obj) = self.object(file, true)? else {
            return Err(ErrorReply::new(ErrorCode::Io, "object vanished"));
        };
        let path = self.object_path(file);
        // Also keeps the descriptor's position, which tells where the append went.
        let mut st = obj.state.lock();
        let size = obj
            .file
            .metadata()
            .map_err(|e| io_err("cannot stat object", &path, e))?
            .len();
        let end = size.max(at_least).checked_add(len).ok_or_else(|| {
            ErrorReply::new(ErrorCode::TooLarge, "append past the largest offset")
        })?;
        let growth = self.reserve((size, st.1), end, len)?;
        let res = (|| {
            if size < at_least {
                obj.file.set_len(at_least)?;
            }
            let mut done = 0usize;
            while done < data.len() {
                let rest = &data[done..];
                let iov = libc::iovec {
                    iov_base: rest.as_ptr() as *mut libc::c_void,
                    iov_len: rest.len(),
                };
                // SAFETY: one iovec over `rest`, which outlives the call; offset -1 is the
                // descriptor's position, which an append moves to the end of what it wrote.
                let n =
                    unsafe { libc::pwritev2(obj.file.as_raw_fd(), &iov, 1, -1, libc::RWF_APPEND) };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "append wrote nothing",
                    ));
                }
                // A short append is continued at the new end: nothing else appends through
                // this server meanwhile (the state lock), and in practice a regular file's
                // append is whole.
                done += n as usize;
            }
            // SAFETY: lseek of an open descriptor.
            let pos = unsafe { libc::lseek(obj.file.as_raw_fd(), 0, libc::SEEK_CUR) };
            if pos < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(pos as u64 - len)
        })();
        self.unreserve(growth);
        let acct = self.account(file, &obj, &mut st, &path);
        let offset = res.map_err(|e| io_err("cannot append to object", &path, e))?;
        acct?;
        Ok(offset)
    }

    /// Where a read of up to `len` bytes at `offset` lies, for a reply sent straight from the
    /// object (`sendfile`): the object's file and how many bytes it holds there (shorter when
    /// it ends there, `None` when it is missing: a file never written on this fragment reads
    /// as empty). The same limits as [`read`](Self::read).
    pub fn read_source(
        &self,
        file: FileId,
        offset: u64,
        len: u32,
    ) -> Result<Option<(ObjectFile, usize)>, ErrorReply> {
        read_limit(len)?;
        let Some(obj) = self.object(file, false)? else {
            return Ok(None);
        };
        let size = obj
            .file
            .metadata()
            .map_err(|e| io_err("cannot stat object", &self.object_path(file), e))?
            .len();
        let n = size.saturating_sub(offset).min(len as u64) as usize;
        Ok(Some((ObjectFile(obj), n)))
    }

    /// Reads up to `len` bytes at `offset` into `out` (cleared first). Shorter when the object
    /// ends there; a missing object reads as empty (a file never written on this fragment).
    /// A `len` over the protocol's read limit is refused before anything is allocated.
    pub fn read(
        &self,
        file: FileId,
        offset: u64,
        len: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), ErrorReply> {
        out.clear();
        read_limit(len)?;
        let Some(obj) = self.object(file, false)? else {
            return Ok(());
        };
        surge_core::sys::read_full_at_append(&obj.file, out, len as usize, offset)
            .map_err(|e| io_err("cannot read object", &self.object_path(file), e))?;
        Ok(())
    }

    pub fn truncate(&self, file: FileId, len: u64) -> Result<(), ErrorReply> {
        let path = self.object_path(file);
        let Some(obj) = self.object(file, len > 0)? else {
            return Ok(());
        };
        let mut st = obj.state.lock();
        obj.file
            .set_len(len)
            .map_err(|e| io_err("cannot truncate object", &path, e))?;
        self.account(file, &obj, &mut st, &path)
    }

    /// `fallocate(2)` on the object's range `[offset, offset + len)`. Allocation is refused with
    /// `NoSpace` before anything changes when it could take the fragment past its capacity
    /// (bounded by the range's length: ranges already allocated are not subtracted); punching
    /// a hole always succeeds on a missing object (nothing to release).
    pub fn allocate(
        &self,
        file: FileId,
        offset: u64,
        len: u64,
        mode: AllocMode,
    ) -> Result<(), ErrorReply> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| ErrorReply::new(ErrorCode::TooLarge, "range past the largest offset"))?;
        if len == 0 {
            return Err(ErrorReply::new(ErrorCode::Invalid, "empty range"));
        }
        let punch = mode == AllocMode::PunchHole;
        let Some(obj) = self.object(file, !punch)? else {
            return Ok(());
        };
        let path = self.object_path(file);
        let mut st = obj.state.lock();
        let growth = if punch {
            0
        } else {
            self.reserve(*st, end, len)?
        };
        let flags = match mode {
            AllocMode::Allocate => 0,
            AllocMode::KeepSize => libc::FALLOC_FL_KEEP_SIZE,
            AllocMode::PunchHole => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        };
        // SAFETY: fallocate on a descriptor this object owns; offsets checked to fit in off_t.
        let rc = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&obj.file),
                flags,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        let res = if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        self.unreserve(growth);
        let acct = self.account(file, &obj, &mut st, &path);
        res.map_err(|e| io_err("cannot fallocate object", &path, e))?;
        acct
    }

    pub fn remove(&self, file: FileId) -> Result<(), ErrorReply> {
        let name = surge_core::layout::object_name(file);
        self.objects.lock().remove(&file);
        let removed = std::ffi::CString::new(name.as_str())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            .and_then(|c| {
                use std::os::fd::AsRawFd;
                // SAFETY: a valid directory descriptor this fragment owns and a NUL-terminated
                // name; unlinkat touches nothing else.
                let rc = unsafe { libc::unlinkat(self.dir_fd.as_raw_fd(), c.as_ptr(), 0) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            });
        match removed {
            Ok(()) => {
                self.set_alloc(file, None);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.set_alloc(file, None);
                Ok(())
            }
            Err(e) => Err(io_err("cannot remove object", &self.dir.join(&name), e)),
        }
    }

    /// The object's path (created empty if missing) and its device and inode numbers.
    pub fn local_object(&self, file: FileId) -> Result<(String, u64, u64), ErrorReply> {
        let path = self.object_path(file);
        let Some(obj) = self.object(file, true)? else {
            return Err(ErrorReply::new(ErrorCode::Io, "object vanished"));
        };
        let md = obj
            .file
            .metadata()
            .map_err(|e| io_err("cannot stat object", &path, e))?;
        Ok((path.display().to_string(), md.dev(), md.ino()))
    }

    /// The fragment's directory and its device and inode numbers.
    pub fn local_dir(&self) -> Result<(String, u64, u64), ErrorReply> {
        let md = self
            .dir_fd
            .metadata()
            .map_err(|e| io_err("cannot stat fragment directory", &self.dir, e))?;
        Ok((self.dir.display().to_string(), md.dev(), md.ino()))
    }

    /// Re-measures an object written without this server (kernel passthrough on its host).
    pub fn changed(&self, file: FileId) -> Result<(), ErrorReply> {
        let path = self.object_path(file);
        match self.object(file, false)? {
            Some(obj) => {
                let mut st = obj.state.lock();
                self.account(file, &obj, &mut st, &path)
            }
            None => Ok(()),
        }
    }

    /// The object's metadata, measured now (`None` when there is none): a passthrough writer
    /// on this host changes it without this server.
    fn object_metadata(&self, file: FileId) -> Result<Option<std::fs::Metadata>, ErrorReply> {
        match self.object(file, false)? {
            Some(obj) => obj
                .file
                .metadata()
                .map(Some)
                .map_err(|e| io_err("cannot stat object", &self.object_path(file), e)),
            None => Ok(None),
        }
    }

    /// The object's length (0 when there is none).
    pub fn length(&self, file: FileId) -> Result<u64, ErrorReply> {
        Ok(self.object_metadata(file)?.map_or(0, |md| md.len()))
    }

    /// The bytes the device allocated to the object (0 when there is none).
    pub fn allocated(&self, file: FileId) -> Result<u64, ErrorReply> {
        Ok(self.object_metadata(file)?.map_or(0, |md| allocated(&md)))
    }

    /// `SEEK_DATA` (`hole` false) or `SEEK_HOLE` in the object from `offset` (see
    /// [`surge_core::sys::seek_data_or_hole`]); a missing object is all hole.
    pub fn seek(&self, file: FileId, offset: u64, hole: bool) -> Result<Option<u64>, ErrorReply> {
        match self.object(file, false)? {
            Some(obj) => surge_core::sys::seek_data_or_hole(&obj.file, offset, hole)
                .map_err(|e| io_err("cannot seek in object", &self.object_path(file), e)),
            None => Ok(hole.then_some(offset)),
        }
    }

    pub fn sync(&self, file: FileId) -> Result<(), ErrorReply> {
        match self.object(file, false)? {
            Some(obj) => obj
                .file
                .sync_data()
                .map_err(|e| io_err("cannot sync object", &self.object_path(file), e)),
            None => Ok(()),
        }
    }

    /// Closes every object and deletes the fragment's directory.
    pub fn destroy(&self) -> io::Result<()> {
        self.objects.lock().clear();
        // The instance's budget here no longer has this fragment's share or use.
        self.budget.sub_capacity(self.capacity);
        self.budget.sub_used(self.used());
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_core::NamespaceId;

    fn fid(ino: u64) -> FileId {
        FileId {
            ns: NamespaceId(0),
            ino,
        }
    }

    fn frag(dir: &Path, capacity: u64) -> Fragment {
        Fragment::open(
            InstanceId(1),
            0,
            dir.join("f"),
            dir.to_path_buf(),
            capacity,
            Arc::default(),
        )
        .unwrap()
    }

    #[test]
    fn write_read_and_holes() {
        let t = tempfile::tempdir().unwrap();
        let f = frag(t.path(), 1 << 20);
        f.write(fid(2), 10, b"abc").unwrap();
        let mut out = Vec::new();
        f.read(fid(2), 8, 10, &mut out).unwrap();
        assert_eq!(out, b"\0\0abc");
        f.read(fid(3), 0, 10, &mut out).unwrap();
        assert!(out.is_empty(), "missing object reads as empty");
    }

    #[test]
    fn refuses_growth_past_capacity_but_allows_overwrite() {
        let t = tempfile::tempdir().unwrap();
        let f = frag(t.path(), 64 * 1024);
        let block = vec![7u8; 32 * 1024];
        f.write(fid(2), 0, &block).unwrap();
        // Exactly the space left fits; a block more does not.
        f.write(fid(2), 32 * 1024, &block).unwrap();
        let e = f.write(fid(2), 64 * 1024, &[1u8; 4096]).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSpace);
        // What was written is intact and can be overwritten.
        f.write(fid(2), 0, &[9u8; 1024]).unwrap();
        let mut out = Vec::new();
        f.read(fid(2), 0, 32 * 1024, &mut out).unwrap();
        assert_eq!(&out[..1024], &[9u8; 1024][..]);
        assert_eq!(&out[1024..], &block[1024..]);
    }

    /// Appends through the server and the kernel's own appends to the object (a node passing
    /// the file through) land one after another, none over another.
    #[test]
    fn appends_land_at_the_object_end_beside_the_kernels_own() {
        let t = tempfile::tempdir().unwrap();
        let f = Arc::new(frag(t.path(), 64 << 20));
        // Extended without writing (truncate up elsewhere): the first append goes after it.
        assert_eq!(f.append(fid(2), 5, b"ab").unwrap(), 5);
        assert_eq!(f.append(fid(2), 0, b"cd").unwrap(), 7);
        let path = f.object_path(fid(2));
        let kernel = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut o = OpenOptions::new().append(true).open(path).unwrap();
                for _ in 0..2000 {
                    std::io::Write::write_all(&mut o, b"K123").unwrap();
                }
            })
        };
        let mut offsets = Vec::new();
        for _ in 0..2000 {
            offsets.push(f.append(fid(2), 0, b"S456").unwrap());
        }
        kernel.join().unwrap();
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len(), 9 + 2 * 2000 * 4);
        assert_eq!(&data[..9], b"\0\0\0\0\0abcd");
        for at in &offsets {
            let at = *at as usize;
            assert_eq!(&data[at..at + 4], b"S456", "the server's append at {at}");
        }
        let k = data[9..].chunks(4).filter(|c| *c == b"K123").count();
        assert_eq!(k, 2000, "every append of the kernel whole");
        assert_eq!(f.used(), allocated(&std::fs::metadata(&path).unwrap()));
    }

    #[test]
    fn fragments_of_one_instance_on_a_server_share_their_space() {
        let t = tempfile::tempdir().unwrap();
        let budget: Arc<Budget> = Arc::default();
        let open = |i: u32| {
            Fragment::open(
                InstanceId(1),
                i,
                t.path().join(format!("f{i}")),
                t.path().to_path_buf(),
                64 * 1024,
                budget.clone(),
            )
            .unwrap()
        };
        let (a, b) = (open(0), open(1));
        assert_eq!(budget.capacity(), 128 * 1024);
        // A file of one stripe on fragment 0 may take what both fragments have here.
        let block = vec![7u8; 32 * 1024];
        for k in 0..3 {
            a.write(fid(2), k * 32 * 1024, &block).unwrap();
        }
        assert!(a.used() > a.capacity, "past one fragment's share");
        // What is left is shared: fragment 1 gets what fragment 0 did not take.
        let e = b.write(fid(3), 0, &[1u8; 40 * 1024]).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSpace);
        assert!(e.message.contains("instance 1"), "{}", e.message);
        b.write(fid(3), 0, &[1u8; 4096]).unwrap();
        // A fragment destroyed takes its share and its use away.
        a.destroy().unwrap();
        assert_eq!(budget.capacity(), 64 * 1024);
        assert_eq!(budget.used(), b.used());
    }

    #[test]
    fn usage_follows_truncate_and_remove_and_survives_reopen() {
        let t = tempfile::tempdir().unwrap();
        let f = frag(t.path(), 1 << 30);
        f.write(fid(2), 0, &vec![1u8; 1 << 20]).unwrap();
        assert!(f.used() >= 1 << 20);
        f.truncate(fid(2), 4096).unwrap();
        assert!(f.used() < 1 << 20);
        let again = frag(t.path(), 1 << 30);
        assert_eq!(again.used(), f.used());
        f.remove(fid(2)).unwrap();
        assert_eq!(f.used(), 0);
    }

    #[test]
    fn allocate_reserves_punch_releases_and_capacity_is_checked_first() {
        let t = tempfile::tempdir().unwrap();
        let f = frag(t.path(), 4 << 20);
        let len_of = |f: &Fragment| std::fs::metadata(f.object_path(fid(2))).unwrap().len();
        f.write(fid(2), 0, b"head").unwrap();
        f.allocate(fid(2), 0, 1 << 20, AllocMode::Allocate).unwrap();
        assert_eq!(len_of(&f), 1 << 20, "Allocate extends the object");
        assert!(f.used() >= 1 << 20, "used {}", f.used());
        f.allocate(fid(2), 1 << 20, 1 << 20, AllocMode::KeepSize)
            .unwrap();
        assert_eq!(len_of(&f), 1 << 20, "KeepSize keeps the length");
        assert!(f.used() >= 2 << 20);
        let before = f.used();
        let e = f
            .allocate(fid(2), 2 << 20, 4 << 20, AllocMode::Allocate)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSpace);
        assert_eq!(f.used(), before, "a refused allocation changes nothing");
        assert_eq!(len_of(&f), 1 << 20);
        f.allocate(fid(2), 4096, (1 << 20) - 4096, AllocMode::PunchHole)
            .unwrap();
        assert!(
            f.used() < before - (512 << 10),
            "punch releases: {}",
            f.used()
        );
        let mut out = Vec::new();
        f.read(fid(2), 0, 8192, &mut out).unwrap();
        assert_eq!(&out[..4], b"head");
        assert!(out[4..].iter().all(|&b| b == 0));
        // Punching a file never written here is a no-op; an empty range is refused.
        f.allocate(fid(9), 0, 4096, AllocMode::PunchHole).unwrap();
        assert!(!f.object_path(fid(9)).exists());
        assert_eq!(
            f.allocate(fid(2), 0, 0, AllocMode::Allocate)
                .unwrap_err()
                .code,
            ErrorCode::Invalid
        );
    }
}
