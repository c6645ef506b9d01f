//! Admission of connections: how many a server serves at once, in total and per peer, and what
//! becomes of the ones over the bounds (docs/DATAPLANE.md, "Bounds").
//!
//! Each connection costs a thread and a file descriptor. The total is capped by
//! `--max-connections` and by the open-file limit (`RLIMIT_NOFILE`, whose soft limit is raised
//! to the hard one at start), keeping [`FD_RESERVE`] descriptors for object files, metadata
//! stores and listeners, so that a flood of connections never leaves the server unable to open
//! a file for the clients it serves. One peer (a TCP address; a uid on the Unix socket) gets
//! at most `--max-connections-per-peer`.
//!
//! A connection over a bound is refused with an `ErrorCode::ConnectionLimit` reply and closed
//! (logged at most once a second, with a count). When the total is reached, the connection
//! that has been *silent* longest (no request since it was accepted, for at least
//! [`EVICT_AFTER`]) is closed to make room: a real client sends its first request as soon as
//! it connects, so a flood of connections that say nothing cannot lock real clients out.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::warn;

/// Default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;
/// Default of `--max-connections-per-peer`: a compute node's mount holds about 8 connections
/// to each server (4 pooled, one per FUSE thread, one for lease recalls), and `surge run`
/// emulates many nodes from one uid on the Unix socket.
pub const DEFAULT_MAX_PER_PEER: u32 = 256;
/// Default of `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default of `--frame-timeout`.
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// File descriptors kept for everything but connections (object files, metadata stores and
/// their journals, listeners, logs).
pub const FD_RESERVE: u64 = 256;
/// A connection silent this long after it was accepted may be closed to make room.
pub const EVICT_AFTER: Duration = Duration::from_secs(1);

/// The bounds on a server's connections (`surge server` flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    pub max_connections: u32,
    pub max_per_peer: u32,
    /// A connection with no request for this long is closed; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// A begun frame must be whole, and a reply taken, within this long; `None`: no bound.
    pub frame_timeout: Option<Duration>,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_per_peer: DEFAULT_MAX_PER_PEER,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            frame_timeout: Some(DEFAULT_FRAME_TIMEOUT),
        }
    }
}

impl ConnLimits {
    /// These bounds with the total lowered to what `nofile` open files allow (keeping
    /// [`FD_RESERVE`] for files); an error when they allow almost none.
    pub fn within_nofile(mut self, nofile: u64) -> anyhow::Result<ConnLimits> {
        let room = nofile.saturating_sub(FD_RESERVE);
        anyhow::ensure!(
            room >= 16,
            "the open-file limit (RLIMIT_NOFILE {nofile}) leaves room for {room} connections \
             after the {FD_RESERVE} kept for files: raise it (ulimit -n, LimitNOFILE=)"
        );
        if u64::from(self.max_connections) > room {
            tracing::info!(
                "connections capped at {room}, not {}: RLIMIT_NOFILE is {nofile} and {FD_RESERVE} \
                 descriptors are kept for files",
                self.max_connections
            );
            self.max_connections = room as u32;
        }
        self.max_per_peer = self.max_per_peer.min(self.max_connections);
        Ok(self)
    }

    /// The bounds as `Status` reports them.
    pub fn wire(&self) -> surge_proto::Limits {
        surge_proto::Limits::new(
            self.max_connections,
            self.max_per_peer,
            self.idle_timeout.unwrap_or_default(),
            self.frame_timeout.unwrap_or_default(),
        )
    }
}

/// Who a connection comes from, for the per-peer bound.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    Ip(std::net::IpAddr),
    /// A Unix-socket client, by its uid (`SO_PEERCRED`).
    Uid(u32),
    Unknown,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Ip(a) => write!(f, "{a}"),
            Peer::Uid(u) => write!(f, "uid {u} (Unix socket)"),
            Peer::Unknown => write!(f, "an unknown peer"),
        }
    }
}

impl Peer {
    /// The uid of the process at the other end of Unix socket `fd`.
    pub fn of_unix(fd: RawFd) -> Peer {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: SO_PEERCRED fills the ucred on our stack, of the length given.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if r == 0 {
            Peer::Uid(cred.uid)
        } else {
            Peer::Unknown
        }
    }
}

/// Counts the connections served and decides on new ones.
pub struct Admission {
    limits: ConnLimits,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    total: u32,
    per_peer: HashMap<Peer, u32>,
    /// Connections that have sent no request yet, oldest first (by admission number).
    silent: BTreeMap<u64, (RawFd, Instant)>,
    next: u64,
    /// Refusals and evictions not logged yet, and when the last log line was written.
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl State {
    /// Logs `what` at most once a second (with the count of those not logged meanwhile).
    fn log(&mut self, what: std::fmt::Arguments) {
        self.unlogged += 1;
        if self
            .logged_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            warn!(
                "{what} ({} refused or closed since the last such line)",
                self.unlogged
            );
            self.unlogged = 0;
            self.logged_at = Some(Instant::now());
        }
    }
}

/// A connection being served; dropping it gives its place back. Drop it before closing the
/// connection's socket (an eviction shuts the socket down by descriptor while the ticket lives).
pub struct Ticket {
    admission: Arc<Admission>,
    peer: Peer,
    seq: u64,
}

impl Admission {
    pub fn new(limits: ConnLimits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    pub fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    /// Connections served now.
    pub fn count(&self) -> u32 {
        self.state.lock().total
    }

    /// Admits a connection of `peer` on socket `fd`, or says why not (the reply to send).
    pub fn admit(self: &Arc<Self>, peer: Peer, fd: RawFd) -> Result<Ticket, String> {
        let mut st = self.state.lock();
        let of_peer = st.per_peer.get(&peer).copied().unwrap_or(0);
        if of_peer >= self.limits.max_per_peer {
            let why = format!(
                "server serves {of_peer} connections from {peer}, its most from one peer \
                 (--max-connections-per-peer)"
            );
            st.log(format_args!("refusing a connection: {why}"));
            return Err(why);
        }
        if st.total >= self.limits.max_connections {
            let oldest = st.silent.iter().next().map(|(&k, &(fd, at))| (k, fd, at));
            match oldest {
                Some((k, victim, at)) if at.elapsed() >= EVICT_AFTER => {
                    st.silent.remove(&k);
                    // SAFETY: the victim's descriptor is open: its ticket, dropped before the
                    // socket is closed, takes this lock to leave `silent` first.
                    unsafe { libc::shutdown(victim, libc::SHUT_RDWR) };
                    let silent_for = at.elapsed();
                    st.log(format_args!(
                        "at the connection limit ({}): closed a connection silent for \
                         {silent_for:?} to admit one from {peer}",
                        self.limits.max_connections
                    ));
                }
                _ => {
                    let why = format!(
                        "server serves {} connections, its most (--max-connections, and the \
                         open-file limit)",
                        st.total
                    );
                    st.log(format_args!("refusing a connection from {peer}: {why}"));
                    return Err(why);
                }
            }
        }
        st.total += 1;
        *st.per_peer.entry(peer.clone()).or_insert(0) += 1;
        let seq = st.next;
        st.next += 1;
        st.silent.insert(seq, (fd, Instant::now()));
        Ok(Ticket {
            admission: self.clone(),
            peer,
            seq,
        })
    }
}

impl Ticket {
    /// The connection sent a request: it is no longer one to close to make room.
    pub fn spoke(&self) {
        self.admission.state.lock().silent.remove(&self.seq);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.admission.state.lock();
        st.silent.remove(&self.seq);
        st.total = st.total.saturating_sub(1);
        if let Some(n) = st.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                st.per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: u32, per_peer: u32) -> ConnLimits {
        ConnLimits {
            max_connections: total,
            max_per_peer: per_peer,
            ..ConnLimits::default()
        }
    }

    #[test]
    fn per_peer_and_total_bounds_refuse_and_tickets_give_places_back() {
        let a = Admission::new(limits(3, 2));
        let p1 = Peer::Uid(1);
        let t1 = a.admit(p1.clone(), -1).unwrap();
        let t2 = a.admit(p1.clone(), -1).unwrap();
        let why = a.admit(p1.clone(), -1).err().unwrap();
        assert!(why.contains("--max-connections-per-peer"), "{why}");
        t1.spoke();
        t2.spoke();
        let t3 = a.admit(Peer::Uid(2), -1).unwrap();
        t3.spoke();
        // Full, and nobody is silent: refused.
        let why = a.admit(Peer::Uid(3), -1).err().unwrap();
        assert!(why.contains("--max-connections"), "{why}");
        drop(t1);
        assert_eq!(a.count(), 2);
        let _t4 = a.admit(p1, -1).unwrap();
        assert_eq!(a.count(), 3);
    }

    #[test]
    fn nofile_lowers_the_total_and_too_few_is_an_error() {
        let l = limits(4096, 256).within_nofile(1024).unwrap();
        assert_eq!(l.max_connections, 1024 - FD_RESERVE as u32);
        let l = limits(100, 256).within_nofile(1 << 20).unwrap();
        assert_eq!((l.max_connections, l.max_per_peer), (100, 100));
        let e = limits(4096, 256)
            .within_nofile(200)
            .unwrap_err()
            .to_string();
        assert!(e.contains("RLIMIT_NOFILE 200"), "{e}");
    }
}
