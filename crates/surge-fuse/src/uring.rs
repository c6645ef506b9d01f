//! FUSE over io_uring (Linux >= 6.14, `/sys/module/fuse/parameters/enable_uring`).
//!
//! The kernel keeps one request queue per possible CPU and hands a request to the queue of the
//! CPU its caller runs on. The daemon registers, for every queue, a number of *ring entries*:
//! each a header buffer (`struct fuse_uring_req_header`: the in/out header, the operation's own
//! header, the entry's commit id and payload length) and a payload buffer at least as large as
//! the connection's largest request. A registered entry is an `IORING_OP_URING_CMD` that stays
//! pending until the kernel puts a request in its buffers and completes it; the daemon answers
//! by writing the reply into the same buffers and sending `COMMIT_AND_FETCH`, which hands the
//! reply to the kernel and makes the entry wait for the next request, in one system call for
//! any number of entries. Compared with `read`/`write` on `/dev/fuse` this saves a system call
//! per request and, since each queue is served by a thread pinned to its CPU, the wake-up of a
//! thread on another CPU.
//!
//! What still goes through `/dev/fuse` (the session's classic threads keep reading it):
//! `FORGET`/`BATCH_FORGET`, `INTERRUPT`, every request before all queues are registered, and
//! notifications.
//!
//! The kernel ABI (`include/uapi/linux/fuse.h`, `fs/fuse/dev_uring.c`):
//! - the ring is set up with 128-byte SQEs; the command's 80 bytes hold
//!   `struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 pad[6]; }`;
//! - `sqe->addr` points to two iovecs (header, payload) and `sqe->len` is 2;
//! - a request arrives with `fuse_in_header` in `in_out`, the operation's first argument (its
//!   header, possibly empty) in `op_in`, the other arguments in the payload and their length in
//!   `ring_ent_in_out.payload_sz`; `fuse_in_header.len` is the length the request would have
//!   on `/dev/fuse`, so the first argument's length is what remains;
//! - a reply is `fuse_out_header` in `in_out`, every out argument in the payload, their length
//!   in `payload_sz`, and `commit_id` (from the request's `ring_ent_in_out`) in the command.
//!
//! Memory rules here: the kernel writes an entry's buffers only while the entry is with it
//! (registered or committed, until its completion is reaped); the daemon reads the request and
//! writes the reply only between that completion and the next commit. An entry's state
//! ([`Slot`]) is kept under its own lock, and the request's bytes are borrowed only while the
//! queue thread dispatches it: a reply sent meanwhile (inline, or from another thread) is kept
//! aside and written into the buffers once the dispatch is over.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use parking_lot::Mutex;
use tracing::debug;
use tracing::error;
use tracing::info;
use tracing::warn;

use crate::Filesystem;
use crate::dev_fuse::DevFuse;
use crate::ll::fuse_abi as abi;
use crate::passthrough::BackingId;
use crate::request::ReplyTarget;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `FUSE_IO_URING_CMD_REGISTER`: register an entry's buffers and wait for a request.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: hand a reply to the kernel and wait for a request.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IN_OUT_HEADER_SZ` and `FUSE_URING_OP_IN_OUT_SZ`.
const IN_OUT_SZ: usize = 128;
const OP_IN_SZ: usize = 128;
/// `sizeof(struct fuse_uring_req_header)`: in_out, op_in, then `fuse_uring_ent_in_out`
/// (`u64 flags; u64 commit_id; u32 payload_sz; u32 padding; u64 reserved;`).
const REQ_HEADER_SZ: usize = IN_OUT_SZ + OP_IN_SZ + 32;
const ENT_IN_OUT_OFF: usize = IN_OUT_SZ + OP_IN_SZ;
/// Where each entry's header starts in the queue's header area (a cache line multiple).
const HEADER_STRIDE: usize = 512;
const _: () = assert!(REQ_HEADER_SZ <= HEADER_STRIDE);
/// `FUSE_MIN_READ_BUFFER`: the kernel's least payload buffer.
const MIN_PAYLOAD: usize = 8192;
/// Bytes in front of each payload where the in header and the operation's header are copied,
/// so that the request reads as one contiguous `/dev/fuse` message without copying its payload.
const PREFIX: usize = 4096;
const IN_HEADER_SZ: usize = size_of::<abi::fuse_in_header>();
const _: () = assert!(IN_HEADER_SZ + OP_IN_SZ <= PREFIX);
/// Entries registered per queue unless the configuration says otherwise. Each holds a payload
/// buffer of the connection's largest request (1 MiB for a 1 MiB `max_write`); pages are
/// touched only as requests use them.
pub(crate) const DEFAULT_DEPTH: usize = 16;
/// At most this many entries per queue (their index is a `u16` in the completion token).
pub(crate) const MAX_DEPTH: usize = 1024;
/// How many times a reply that fills its ring entry itself yields while the entry's request
/// is still being dispatched, before it falls back to a buffer of its own.
const DISPATCH_WAIT_YIELDS: usize = 1000;
/// The completion token of the queue's eventfd read (entries use their index).
const WAKE_TOKEN: u64 = u64::MAX;

/// How the session moves requests and replies, decided at `INIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// FUSE over io_uring: per-CPU queues of ring entries.
    IoUring {
        /// Queues, one per possible CPU.
        queues: usize,
        /// Ring entries per queue.
        depth: usize,
    },
    /// `read`/`writev` on `/dev/fuse`.
    DevFuse,
}

/// Why a session serves requests the way it does, for its log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportInfo {
    /// What the session uses.
    pub kind: TransportKind,
    /// Why (e.g. "the kernel does not offer FUSE over io_uring (enable_uring=N)").
    pub reason: String,
}

impl std::fmt::Display for TransportInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            TransportKind::IoUring { queues, depth } => write!(
                f,
                "io_uring ({queues} queues x {depth} entries; {})",
                self.reason
            ),
            TransportKind::DevFuse => write!(f, "/dev/fuse ({})", self.reason),
        }
    }
}

/// Requests served by each path of a session (kept for as long as anyone holds it).
#[derive(Debug, Default)]
pub struct TransportStats {
    /// Requests taken from io_uring completions.
    pub uring_requests: AtomicU64,
    /// Requests read from `/dev/fuse` (forgets, interrupts, everything when io_uring is off).
    pub dev_fuse_requests: AtomicU64,
    /// Replies written into a ring entry straight from the file system's buffer-filling
    /// callback (`ReplyData::data_with`), i.e. copied once.
    pub uring_direct_replies: AtomicU64,
    /// Which requests have been dispatched, by number (see [`crate::DispatchOrder`]).
    pub order: crate::DispatchOrder,
}

/// Whether this process can make a ring of 128-byte SQEs (io_uring may be disabled by
/// `kernel.io_uring_disabled`, by seccomp, or absent). Asked before `INIT`: once the kernel
/// was told the daemon speaks io_uring, it holds every request until the queues are
/// registered.
pub(crate) fn ring_available() -> io::Result<()> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(2)
        .map(drop)
}

/// The number of queues the kernel keeps: one per possible CPU (`num_possible_cpus()`).
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(s.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cannot parse /sys/devices/system/cpu/possible: {s:?}"),
        )
    })
}

/// The number of CPUs in a list such as `0-3,8,10-11`.
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.parse::<usize>().ok()?;
                n += 1;
            }
        }
    }
    (n > 0).then_some(n)
}

/// The kernel's payload buffer size for a connection (`fuse_uring_create`):
/// max(FUSE_MIN_READ_BUFFER, max_write, max_pages * PAGE_SIZE), rounded up to pages.
pub(crate) fn payload_size(max_write: u32, max_pages: u16) -> usize {
    let page = page_size::get();
    let n = MIN_PAYLOAD
        .max(max_write as usize)
        .max(usize::from(max_pages) * page);
    n.div_ceil(page) * page
}

/// Anonymous memory of one queue, unmapped when the last holder goes.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; who may touch which bytes when is ruled by the
// entries' `Slot` states (module doc), not by the owner of the mapping.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing borrows the mapping any
        // more: the last `Arc<Queue>` holder is going, and the queue's ring, through which the
        // kernel wrote into it, was closed before (it is the queue's first field).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A reply kept aside while its request is still being dispatched.
#[derive(Debug)]
struct Stashed {
    out_header: [u8; size_of::<abi::fuse_out_header>()],
    payload: Vec<u8>,
    /// The reply's data is already in the entry's payload buffer, this many bytes (filled
    /// during the dispatch of a request that carries no payload; `payload` is empty).
    in_place: Option<usize>,
}

/// Where one ring entry is, and who may touch its buffers.
#[derive(Debug)]
enum Slot {
    /// With the kernel: registered or committed, no completion reaped. Only the kernel
    /// writes the buffers.
    Kernel,
    /// Its request (`unique`) is being dispatched on the queue thread, which borrows the
    /// buffers for reading.
    Dispatching {
        unique: u64,
        stashed: Option<Stashed>,
        /// The request carries no payload (a read), so the payload buffer is not borrowed:
        /// a reply may fill its data there at once (see `UringReply::send_data_with`).
        payload_free: bool,
    },
    /// Dispatched; waiting for the reply to `unique`, which may write the buffers.
    Awaiting { unique: u64 },
}

/// One queue: its entries' buffers and states, and the replies ready to commit.
pub(crate) struct Queue {
    /// The queue's ring: submissions under `sq` (the queue thread's, and in the replier mode
    /// the repliers'), completions reaped by the queue thread only. First, so that it is closed
    /// before the buffers the kernel writes into are unmapped.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    sq: Mutex<()>,
    /// `/dev/fuse`, the file the commands are for.
    dev_fd: i32,
    iovecs: Vec<EntryIovecs>,
    /// Replies submit their commits themselves (`SURGE_FUSE_URING_COMMIT=replier`) instead of
    /// handing them to the queue thread.
    replier_commits: bool,
    qid: u16,
    depth: usize,
    payload: usize,
    stride: usize,
    headers: Mapping,
    payloads: Mapping,
    slots: Vec<Mutex<Slot>>,
    /// Entries whose reply is written, to be committed by the queue thread.
    ready: Mutex<Vec<u16>>,
    ready_len: AtomicUsize,
    /// Set by the queue thread before it sleeps in `io_uring_enter`; a reply from another
    /// thread then writes `wake` (the ring has a read of it pending).
    sleeping: AtomicBool,
    wake: OwnedFd,
    /// For `open_backing` from a reply (passthrough).
    dev: Arc<DevFuse>,
    stats: Arc<TransportStats>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("qid", &self.qid)
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

impl Queue {
    fn new(
        qid: u16,
        plan: &UringPlan,
        dev: Arc<DevFuse>,
        stats: Arc<TransportStats>,
    ) -> io::Result<Queue> {
        let (depth, payload) = (plan.depth, plan.payload);
        let stride = PREFIX + payload;
        // The headers, then the 8 bytes the eventfd is read into.
        let headers = Mapping::new(depth * HEADER_STRIDE + HEADER_STRIDE)?;
        let payloads = Mapping::new(depth * stride)?;
        let entries = (depth + 1).next_power_of_two() as u32;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(entries * 2)
            .setup_submit_all()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)?;
        let iovecs = (0..depth)
            .map(|i| {
                // SAFETY: i < depth: inside the mappings.
                let (h, p) = unsafe {
                    (
                        headers.ptr.as_ptr().add(i * HEADER_STRIDE),
                        payloads.ptr.as_ptr().add(i * stride + PREFIX),
                    )
                };
                EntryIovecs([
                    libc::iovec {
                        iov_base: h.cast(),
                        iov_len: REQ_HEADER_SZ,
                    },
                    libc::iovec {
                        iov_base: p.cast(),
                        iov_len: payload,
                    },
                ])
            })
            .collect();
        // SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Queue {
            ring,
            sq: Mutex::new(()),
            dev_fd: dev.as_raw_fd(),
            iovecs,
            replier_commits: plan.replier_commits,
            qid,
            depth,
            payload,
            stride,
            headers,
            payloads,
            slots: (0..depth).map(|_| Mutex::new(Slot::Kernel)).collect(),
            ready: Mutex::new(Vec::with_capacity(depth)),
            ready_len: AtomicUsize::new(0),
            sleeping: AtomicBool::new(false),
            wake,
            dev,
            stats,
        })
    }

    fn header_ptr(&self, idx: usize) -> *mut u8 {
        debug_assert!(idx < self.depth);
        // SAFETY: idx < depth, so the offset is inside the header mapping.
        unsafe { self.headers.ptr.as_ptr().add(idx * HEADER_STRIDE) }
    }

    /// The start of entry `idx`'s payload (its prefix is the `PREFIX` bytes before it).
    fn payload_ptr(&self, idx: usize) -> *mut u8 {
        debug_assert!(idx < self.depth);
        // SAFETY: idx < depth, so the offset is inside the payload mapping.
        unsafe { self.payloads.ptr.as_ptr().add(idx * self.stride + PREFIX) }
    }

    /// Writes a reply into entry `idx`'s buffers. The caller holds the entry's lock in a state
    /// where the daemon owns the buffers and no request borrows them (`Awaiting`, or
    /// `Dispatching` just finished).
    fn write_reply(&self, idx: usize, out_header: &[u8], payload: &[IoSlice<'_>]) {
        let total: usize = payload.iter().map(|s| s.len()).sum();
        let mut header = [0u8; size_of::<abi::fuse_out_header>()];
        let n = out_header.len().min(header.len());
        header[..n].copy_from_slice(&out_header[..n]);
        let mut payload_sz = total;
        if total > self.payload {
            // Larger than any request the kernel can make: a bug of the file system.
            error!(
                "reply of {total} bytes does not fit the ring entry's {} bytes: replying EIO",
                self.payload
            );
            header[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            payload_sz = 0;
        } else {
            let mut at = self.payload_ptr(idx);
            for s in payload {
                // SAFETY: the bytes fit the payload buffer (checked above); the daemon owns
                // them in this state (caller's contract); `s` is another allocation.
                unsafe {
                    std::ptr::copy_nonoverlapping(s.as_ptr(), at, s.len());
                    at = at.add(s.len());
                }
            }
        }
        self.write_header(idx, &header, payload_sz);
    }

    /// Writes a reply's header into entry `idx`, its `payload_sz` bytes of data being in the
    /// payload buffer already (see `Stashed::in_place`). The caller holds the entry's lock as
    /// for [`write_reply`](Self::write_reply).
    fn write_header(&self, idx: usize, out_header: &[u8], payload_sz: usize) {
        let mut header = [0u8; size_of::<abi::fuse_out_header>()];
        let n = out_header.len().min(header.len());
        header[..n].copy_from_slice(&out_header[..n]);
        let h = self.header_ptr(idx);
        // SAFETY: the header buffer is REQ_HEADER_SZ bytes; the daemon owns it in this state.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), h, header.len());
            let sz = h.add(ENT_IN_OUT_OFF + 16).cast::<u32>();
            sz.write_unaligned(payload_sz.min(self.payload) as u32);
        }
    }

    /// Queues an SQE (the ring's submission side is shared: under `sq`).
    fn push(&self, e: &squeue::Entry128) -> io::Result<()> {
        let _sq = self.sq.lock();
        loop {
            // SAFETY: `sq` makes this the only view of the submission queue; the SQE's buffers
            // (iovecs, headers, payloads, the wake buffer) live in `self`, after the ring.
            let pushed = unsafe { self.ring.submission_shared().push(e) }.is_ok();
            if pushed {
                return Ok(());
            }
            self.ring.submitter().submit()?;
        }
    }

    fn push_cmd(&self, cmd_op: u32, idx: u16, commit_id: u64) -> io::Result<()> {
        let e = fuse_cmd_sqe(
            self.dev_fd,
            cmd_op,
            self.qid,
            commit_id,
            self.iovecs[usize::from(idx)].0.as_ptr(),
            idx,
        );
        self.push(&e)
    }

    /// The 8 bytes the queue's eventfd is read into.
    fn wake_buf(&self) -> *mut u8 {
        // SAFETY: the header mapping has one stride more than the entries' headers.
        unsafe { self.headers.ptr.as_ptr().add(self.depth * HEADER_STRIDE) }
    }

    /// Hands entry `idx`'s reply (written) to the kernel: by the queue thread, or in the
    /// replier mode right here.
    fn commit(&self, idx: u16, unique: u64) {
        if self.replier_commits {
            let r = self
                .push_cmd(CMD_COMMIT_AND_FETCH, idx, unique)
                .and_then(|()| self.ring.submitter().submit());
            if let Err(e) = r {
                error!(
                    "io_uring queue {}: cannot commit entry {idx}: {e}",
                    self.qid
                );
            }
        } else {
            self.push_ready(idx);
        }
    }

    /// Wakes the queue thread (to see the session's stop flag).
    pub(crate) fn wake_up(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                (&raw const one).cast(),
                size_of::<u64>(),
            )
        };
    }

    /// Hands entry `idx` to the queue thread for its commit.
    fn push_ready(&self, idx: u16) {
        self.ready.lock().push(idx);
        self.ready_len.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a local to our eventfd.
            let rc = unsafe {
                libc::write(
                    self.wake.as_raw_fd(),
                    (&raw const one).cast(),
                    size_of::<u64>(),
                )
            };
            if rc < 0 {
                warn!(
                    "cannot wake io_uring queue {}: {}",
                    self.qid,
                    io::Error::last_os_error()
                );
            }
        }
    }
}

/// The reply side of a request that came from a ring entry.
#[derive(Debug, Clone)]
pub(crate) struct UringReply {
    queue: Arc<Queue>,
    idx: u16,
    unique: u64,
}

impl UringReply {
    /// Sends a reply (`iov[0]` is the `fuse_out_header`, the rest the out arguments).
    pub(crate) fn send(&self, iov: &[IoSlice<'_>]) -> io::Result<()> {
        let (header, payload) = iov
            .split_first()
            .ok_or_else(|| io::Error::other("empty reply"))?;
        let q = &self.queue;
        let idx = usize::from(self.idx);
        let mut slot = q.slots[idx].lock();
        match &mut *slot {
            Slot::Dispatching {
                unique, stashed, ..
            } if *unique == self.unique && stashed.is_none() => {
                *stashed = Some(Stashed {
                    out_header: header_bytes(header),
                    payload: payload.iter().flat_map(|s| s.iter().copied()).collect(),
                    in_place: None,
                });
                Ok(())
            }
            Slot::Awaiting { unique } if *unique == self.unique => {
                q.write_reply(idx, header, payload);
                *slot = Slot::Kernel;
                drop(slot);
                q.commit(self.idx, self.unique);
                Ok(())
            }
            other => Err(io::Error::other(format!(
                "second reply to request {} on io_uring queue {} entry {idx} ({other:?})",
                self.unique, q.qid
            ))),
        }
    }

    /// Fills the reply's data straight into the ring entry's payload buffer (one copy, by the
    /// kernel, from there), or returns `None` when the entry cannot be written yet (its request
    /// is still being dispatched); the caller then replies the ordinary way. `fill` gets `len`
    /// bytes and returns how many it wrote.
    pub(crate) fn send_data_with(
        &self,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
    ) -> Option<io::Result<usize>> {
        let q = &self.queue;
        let idx = usize::from(self.idx);
        let mut slot = q.slots[idx].lock();
        // A reply from another thread may come while the queue thread still finishes the
        // dispatch (microseconds): wait for it a little rather than copy. Unless the request
        // borrows no payload (a read): then the data goes there at once, and the header
        // after the dispatch (a reply made during the dispatch, on the queue thread itself,
        // would otherwise wait for its own end).
        for _ in 0..DISPATCH_WAIT_YIELDS {
            match &*slot {
                Slot::Dispatching {
                    unique,
                    stashed: None,
                    payload_free: true,
                } if *unique == self.unique => break,
                Slot::Dispatching { unique, .. } if *unique == self.unique => {}
                _ => break,
            }
            drop(slot);
            std::thread::yield_now();
            slot = q.slots[idx].lock();
        }
        let dispatching = match &*slot {
            Slot::Awaiting { unique } if *unique == self.unique => false,
            Slot::Dispatching {
                unique,
                stashed: None,
                payload_free: true,
            } if *unique == self.unique => true,
            _ => return None,
        };
        let len = len.min(q.payload);
        // SAFETY: the entry is Awaiting, so the daemon owns its payload buffer and nothing else
        // borrows it, or Dispatching a request with no payload, whose bytes (the prefix before
        // the payload buffer) end where the buffer starts; we hold the entry's lock for as
        // long as the slice lives.
        let buf = unsafe { std::slice::from_raw_parts_mut(q.payload_ptr(idx), len) };
        let res = fill(buf).map(|n| n.min(len));
        let (error, n) = match &res {
            Ok(n) => (0i32, *n),
            Err(e) => (-e.raw_os_error().unwrap_or(libc::EIO), 0),
        };
        let mut header = [0u8; size_of::<abi::fuse_out_header>()];
        let total = (size_of::<abi::fuse_out_header>() + n) as u32;
        header[0..4].copy_from_slice(&total.to_ne_bytes());
        header[4..8].copy_from_slice(&error.to_ne_bytes());
        header[8..16].copy_from_slice(&self.unique.to_ne_bytes());
        q.stats.uring_direct_replies.fetch_add(1, Ordering::Relaxed);
        if dispatching {
            // The header buffer is still borrowed: the queue thread writes it after the
            // dispatch.
            if let Slot::Dispatching { stashed, .. } = &mut *slot {
                *stashed = Some(Stashed {
                    out_header: header,
                    payload: Vec::new(),
                    in_place: Some(n),
                });
            }
            return Some(res);
        }
        q.write_header(idx, &header, n);
        *slot = Slot::Kernel;
        drop(slot);
        q.commit(self.idx, self.unique);
        Some(res)
    }

    pub(crate) fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<BackingId> {
        BackingId::create(&self.queue.dev, fd)
    }

    /// # Safety
    /// `id` must be a backing id this connection registered and nobody else closes.
    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        // SAFETY: the caller's contract (see `BackingId::wrap_raw`).
        unsafe { BackingId::wrap_raw(&self.queue.dev, id) }
    }
}

fn header_bytes(s: &[u8]) -> [u8; size_of::<abi::fuse_out_header>()] {
    let mut h = [0u8; size_of::<abi::fuse_out_header>()];
    let n = s.len().min(h.len());
    h[..n].copy_from_slice(&s[..n]);
    h
}

/// What a session needs to start its io_uring queues after `INIT`.
#[derive(Debug, Clone)]
pub(crate) struct UringPlan {
    pub(crate) queues: usize,
    pub(crate) depth: usize,
    pub(crate) payload: usize,
    /// See `Queue::replier_commits`.
    pub(crate) replier_commits: bool,
}

/// The two iovecs (header, payload) of one entry, read by the kernel at registration.
struct EntryIovecs([libc::iovec; 2]);

// SAFETY: the iovecs point into the queue's mapping, which is `Send`; they are only data.
unsafe impl Send for EntryIovecs {}
// SAFETY: as above; they are never written after the queue is made.
unsafe impl Sync for EntryIovecs {}

/// One queue's ring and the thread-side state that serves it.
pub(crate) struct QueueThread<FS: Filesystem> {
    pub(crate) queue: Arc<Queue>,
    pub(crate) event_loop: SessionEventLoop<FS>,
    live: usize,
    stop: Arc<AtomicBool>,
}

/// Makes the queues' memory and rings (on the calling thread, so failures are known before
/// any thread starts). Each queue is then run by [`QueueThread::run`] on a thread of its own.
pub(crate) fn make_queues<FS: Filesystem>(
    plan: &UringPlan,
    dev: &Arc<DevFuse>,
    stats: &Arc<TransportStats>,
    stop: &Arc<AtomicBool>,
    event_loop: impl Fn(usize) -> SessionEventLoop<FS>,
) -> io::Result<Vec<QueueThread<FS>>> {
    let mut out = Vec::with_capacity(plan.queues);
    for qid in 0..plan.queues {
        let qid16 = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
        let queue = Arc::new(Queue::new(qid16, plan, dev.clone(), stats.clone())?);
        out.push(QueueThread {
            queue,
            event_loop: event_loop(qid),
            live: 0,
            stop: stop.clone(),
        });
    }
    Ok(out)
}

/// An SQE of a FUSE uring command for entry `idx` of queue `qid`.
fn fuse_cmd_sqe(
    fd: i32,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    iov: *const libc::iovec,
    idx: u16,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let e = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd)
        .addr(Some(iov as u64))
        .build()
        .user_data(u64::from(idx));
    // The crate has no setter for `len`, which the kernel wants to be the iovec count (2):
    // it is the u32 at byte 24 of `struct io_uring_sqe`.
    // SAFETY: `Entry128` is `repr(C)` plain data of 128 bytes (an `io_uring_sqe` and its
    // 64-byte extension); transmute checks the sizes.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above; any bit pattern is a valid `Entry128`.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl<FS: Filesystem> QueueThread<FS> {
    fn push_cmd(&mut self, cmd_op: u32, idx: u16, commit_id: u64) -> io::Result<()> {
        self.queue.push_cmd(cmd_op, idx, commit_id)
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let e = opcode::Read::new(
            types::Fd(self.queue.wake.as_raw_fd()),
            self.queue.wake_buf(),
            8,
        )
        .build()
        .user_data(WAKE_TOKEN);
        // An Entry (64 bytes) in a ring of 128-byte SQEs.
        self.queue.push(&e.into())
    }

    /// Registers every entry, then serves requests until the connection ends or the session
    /// stops. Pinned to CPU `qid`, where the kernel queues the requests of that CPU.
    pub(crate) fn run(mut self) -> io::Result<()> {
        let qid = self.queue.qid;
        pin_to_cpu(usize::from(qid));
        for idx in 0..self.queue.depth as u16 {
            self.push_cmd(CMD_REGISTER, idx, 0)?;
        }
        self.live = self.queue.depth;
        self.arm_wake()?;
        self.queue.ring.submitter().submit()?;
        debug!(
            "io_uring queue {qid}: {} entries of {} bytes registered",
            self.queue.depth, self.queue.payload
        );
        // The ring is closed, and the buffers unmapped after it, when the last holder of the
        // queue (this thread, or a late reply) lets it go.
        self.serve()
    }

    fn serve(&mut self) -> io::Result<()> {
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(self.queue.depth + 1);
        let mut ready: Vec<u16> = Vec::with_capacity(self.queue.depth);
        loop {
            if self.stop.load(Ordering::Relaxed) {
                debug!("io_uring queue {}: session stopped", self.queue.qid);
                return Ok(());
            }
            // Commit what is ready; sleep only if nothing is.
            self.queue.sleeping.store(true, Ordering::SeqCst);
            if self.queue.ready_len.load(Ordering::SeqCst) > 0 {
                self.queue.sleeping.store(false, Ordering::SeqCst);
                self.commit_ready(&mut ready)?;
                self.queue.ring.submitter().submit()?;
            } else {
                match self.queue.ring.submitter().submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    Err(e) => {
                        self.queue.sleeping.store(false, Ordering::SeqCst);
                        return Err(e);
                    }
                }
                self.queue.sleeping.store(false, Ordering::SeqCst);
            }
            completions.clear();
            // SAFETY: only this thread reaps the queue's completions.
            completions.extend(
                unsafe { self.queue.ring.completion_shared() }.map(|c| (c.user_data(), c.result())),
            );
            for &(token, res) in &completions {
                if token == WAKE_TOKEN {
                    self.arm_wake()?;
                    continue;
                }
                let Ok(idx) = u16::try_from(token) else {
                    error!(
                        "io_uring queue {}: unknown completion {token}",
                        self.queue.qid
                    );
                    continue;
                };
                if usize::from(idx) >= self.queue.depth {
                    error!("io_uring queue {}: unknown entry {idx}", self.queue.qid);
                    continue;
                }
                match res {
                    0 => self.dispatch(idx),
                    r if r == -libc::EAGAIN || r == -libc::EINTR => {
                        // The kernel was not ready for the registration yet.
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        self.push_cmd(CMD_REGISTER, idx, 0)?;
                    }
                    r => {
                        // ENOTCONN/ECONNABORTED at unmount; anything else is logged.
                        if r != -libc::ENOTCONN && r != -libc::ECONNABORTED && r != -libc::ENODEV {
                            warn!(
                                "io_uring queue {} entry {idx}: {}",
                                self.queue.qid,
                                io::Error::from_raw_os_error(-r)
                            );
                        }
                        self.live -= 1;
                    }
                }
            }
            if self.live == 0 {
                debug!("io_uring queue {}: connection ended", self.queue.qid);
                return Ok(());
            }
            self.commit_ready(&mut ready)?;
        }
    }

    /// Moves the replies other threads (and the dispatches just done) made ready into the
    /// submission queue as `COMMIT_AND_FETCH` commands.
    fn commit_ready(&mut self, ready: &mut Vec<u16>) -> io::Result<()> {
        if self.queue.ready_len.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        {
            let mut r = self.queue.ready.lock();
            self.queue.ready_len.store(0, Ordering::SeqCst);
            std::mem::swap(&mut *r, ready);
        }
        for &idx in ready.iter() {
            let h = self.queue.header_ptr(usize::from(idx));
            // SAFETY: the out header's unique (bytes 8..16 of in_out) was written by the reply
            // before it pushed the entry; the kernel does not touch it until the commit.
            let unique = unsafe { h.add(8).cast::<u64>().read_unaligned() };
            self.push_cmd(CMD_COMMIT_AND_FETCH, idx, unique)?;
        }
        ready.clear();
        Ok(())
    }

    /// Reads the request in entry `idx` and hands it to the file system.
    fn dispatch(&mut self, idx: u16) {
        let q = self.queue.clone();
        let i = usize::from(idx);
        let h = q.header_ptr(i);
        // SAFETY: the completion was reaped, so the kernel is done with the entry's buffers
        // until the next commit; the header is REQ_HEADER_SZ bytes.
        let (in_header, payload_sz, commit_id) = unsafe {
            let mut ih = [0u8; IN_HEADER_SZ];
            std::ptr::copy_nonoverlapping(h, ih.as_mut_ptr(), IN_HEADER_SZ);
            let ent = h.add(ENT_IN_OUT_OFF);
            (
                ih,
                ent.add(16).cast::<u32>().read_unaligned() as usize,
                ent.add(8).cast::<u64>().read_unaligned(),
            )
        };
        let total =
            u32::from_ne_bytes([in_header[0], in_header[1], in_header[2], in_header[3]]) as usize;
        let unique = u64::from_ne_bytes(in_header[8..16].try_into().unwrap_or([0; 8]));
        q.stats.uring_requests.fetch_add(1, Ordering::Relaxed);
        let op_len = total.checked_sub(IN_HEADER_SZ + payload_sz);
        let Some(op_len) = op_len.filter(|&n| n <= OP_IN_SZ && payload_sz <= q.payload) else {
            // The kernel would not send this; answer EIO so the entry is not lost.
            error!(
                "io_uring queue {} entry {idx}: request of {total} bytes with payload \
                 {payload_sz}: replying EIO",
                q.qid
            );
            *q.slots[i].lock() = Slot::Awaiting { unique: commit_id };
            let reply = UringReply {
                queue: q.clone(),
                idx,
                unique: commit_id,
            };
            let mut hdr = [0u8; 16];
            hdr[0..4].copy_from_slice(&16u32.to_ne_bytes());
            hdr[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            hdr[8..16].copy_from_slice(&commit_id.to_ne_bytes());
            if let Err(e) = reply.send(&[IoSlice::new(&hdr)]) {
                error!("{e}");
            }
            return;
        };
        if unique != commit_id {
            debug!("io_uring: commit id {commit_id} of request {unique}");
        }
        *q.slots[i].lock() = Slot::Dispatching {
            unique,
            stashed: None,
            payload_free: payload_sz == 0,
        };
        let payload = q.payload_ptr(i);
        let start_off = IN_HEADER_SZ + op_len;
        // SAFETY: the prefix (PREFIX bytes before the payload, in the same mapping) is the
        // daemon's own; the header and op header fit in it (IN_HEADER_SZ + OP_IN_SZ <= PREFIX).
        let data: &[u8] = unsafe {
            let start = payload.sub(start_off);
            std::ptr::copy_nonoverlapping(h, start, IN_HEADER_SZ);
            std::ptr::copy_nonoverlapping(h.add(IN_OUT_SZ), start.add(IN_HEADER_SZ), op_len);
            std::slice::from_raw_parts(start, start_off + payload_sz)
        };
        let reply = UringReply {
            queue: q.clone(),
            idx,
            unique,
        };
        let aligned;
        let bytes = if (data.as_ptr() as usize) % align_of::<abi::fuse_in_header>() == 0 {
            data
        } else {
            // An operation header of an odd length: parse a copy.
            aligned = AlignedCopy::new(data);
            aligned.as_slice()
        };
        match RequestWithSender::new(
            self.event_loop.ch.sender(),
            ReplyTarget::Uring(reply),
            bytes,
        ) {
            Some(req) => {
                if let Ok(crate::ll::Operation::Destroy(_)) = req.request.operation() {
                    // The connection ends after this reply; the entries then complete with
                    // ENOTCONN and the queue stops.
                    req.reply::<crate::ReplyEmpty>().ok();
                } else {
                    req.dispatch(&self.event_loop);
                }
            }
            None => {
                error!("io_uring queue {} entry {idx}: invalid request", q.qid);
                let mut slot = q.slots[i].lock();
                if let Slot::Dispatching { stashed, .. } = &mut *slot {
                    if stashed.is_none() {
                        let mut hdr = [0u8; 16];
                        hdr[0..4].copy_from_slice(&16u32.to_ne_bytes());
                        hdr[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
                        hdr[8..16].copy_from_slice(&unique.to_ne_bytes());
                        *stashed = Some(Stashed {
                            out_header: hdr,
                            payload: Vec::new(),
                            in_place: None,
                        });
                    }
                }
            }
        }
        // The request's bytes are no longer borrowed: a reply kept aside is written now,
        // later ones write the buffers themselves.
        let mut slot = q.slots[i].lock();
        match std::mem::replace(&mut *slot, Slot::Kernel) {
            Slot::Dispatching {
                stashed: Some(s), ..
            } => {
                match s.in_place {
                    Some(n) => q.write_header(i, &s.out_header, n),
                    None => q.write_reply(i, &s.out_header, &[IoSlice::new(&s.payload)]),
                }
                drop(slot);
                q.push_ready(idx);
            }
            Slot::Dispatching {
                unique,
                stashed: None,
                ..
            } => *slot = Slot::Awaiting { unique },
            other => {
                error!(
                    "io_uring queue {} entry {idx}: state {other:?} after dispatch",
                    q.qid
                );
                *slot = other;
            }
        }
    }
}

/// A copy of a request on an 8-byte boundary.
struct AlignedCopy(Vec<u64>, usize);

impl AlignedCopy {
    fn new(b: &[u8]) -> AlignedCopy {
        let mut v = vec![0u64; b.len().div_ceil(8)];
        // SAFETY: `v` holds at least b.len() bytes; the regions do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr().cast::<u8>(), b.len()) };
        AlignedCopy(v, b.len())
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `self.1` bytes of the vector's buffer were initialized in `new`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.1) }
    }
}

/// Makes the kernel give FUSE over io_uring up for this connection after INIT negotiated it
/// (the daemon could not set its queues up): a registration it must refuse (a payload buffer
/// of 0 bytes) clears the connection's io_uring flag and releases the requests waiting for
/// the queues to /dev/fuse.
pub(crate) fn abandon(dev: &Arc<DevFuse>) -> io::Result<()> {
    let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
    let mut header = [0u8; REQ_HEADER_SZ];
    let iov = [
        libc::iovec {
            iov_base: header.as_mut_ptr().cast(),
            iov_len: REQ_HEADER_SZ,
        },
        libc::iovec {
            iov_base: header.as_mut_ptr().cast(),
            iov_len: 0,
        },
    ];
    let e = fuse_cmd_sqe(dev.as_raw_fd(), CMD_REGISTER, 0, 0, iov.as_ptr(), 0);
    // SAFETY: `iov` and `header` outlive the wait below, which reaps the command's
    // completion (the kernel refuses the registration at once).
    unsafe { ring.submission().push(&e) }.map_err(|_| io::Error::other("submission queue full"))?;
    ring.submit_and_wait(1)?;
    let res = ring.completion().next().map(|c| c.result());
    match res {
        Some(r) if r < 0 => Ok(()),
        other => Err(io::Error::other(format!(
            "the refused registration completed with {other:?}"
        ))),
    }
}

fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if let Err(e) = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set))
    {
        // An offline CPU: its queue still serves whatever the kernel puts in it.
        info!("io_uring queue {cpu}: cannot pin to CPU {cpu}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
    }

    #[test]
    fn payload_is_the_kernels_largest_request() {
        let page = page_size::get();
        assert_eq!(payload_size(1 << 20, 256), (1 << 20).max(256 * page));
        assert_eq!(payload_size(4096, 1), MIN_PAYLOAD.div_ceil(page) * page);
    }

    #[test]
    fn commands_carry_two_iovecs_and_the_commit_id() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let e = fuse_cmd_sqe(7, CMD_COMMIT_AND_FETCH, 3, 0xabcdef, iov.as_ptr(), 5);
        // SAFETY: as in `fuse_cmd_sqe`: 128 bytes of plain data.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(raw[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7);
        // cmd_op shares the union with `off` (bytes 8..12).
        assert_eq!(u32::from_ne_bytes(raw[8..12].try_into().unwrap()), 2);
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            iov.as_ptr() as u64
        );
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        assert_eq!(u64::from_ne_bytes(raw[32..40].try_into().unwrap()), 5);
        // The command area starts at byte 48: flags, commit_id, qid.
        assert_eq!(
            u64::from_ne_bytes(raw[56..64].try_into().unwrap()),
            0xabcdef
        );
        assert_eq!(u16::from_ne_bytes(raw[64..66].try_into().unwrap()), 3);
    }
}
