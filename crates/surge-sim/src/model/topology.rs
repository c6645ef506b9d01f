//! The machine as a set of FIFO servers ("resources") and the routes data takes through them.
//!
//! Every component of Liu's model (§III-B) has an incoming queue, a processing unit and an
//! outgoing queue; here each of those is a [`Resource`]: a single FIFO server with a bandwidth,
//! a fixed cost per transfer and a propagation latency.
//!
//! | component | incoming | processing | outgoing |
//! |---|---|---|---|
//! | compute node | `CnIn` (tree, down) | the kernel's compute phases | `CnOut` (tree, up) |
//! | I/O node | `IonTreeIn`, `IonNetIn` | `IonMem` (forwarder copy), `Bb` (SSD) | `IonNetOut`, `IonTreeOut` |
//! | storage network | `CoreUp` | | `CoreDown` |
//! | file server | `FsNetIn` | `FsCpu`, `Rack`, `Lun` | `FsNetOut` |
//!
//! A resource with unlimited bandwidth, no fixed cost and no latency can never delay anything,
//! so it is left out of routes (and costs no events), except the CN links and the LUNs, where
//! the time series are measured.

use crate::engine::{mix64, SimTime, NS_PER_S};
use crate::system::System;
use crate::units::Rate;

/// What a resource is, for statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    CnOut,
    CnIn,
    IonTreeIn,
    IonTreeOut,
    IonMem,
    Bb,
    IonNetOut,
    IonNetIn,
    CoreUp,
    CoreDown,
    FsNetIn,
    FsNetOut,
    FsCpu,
    Rack,
    Lun,
}

#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    ns_per_byte: f64,
    overhead: SimTime,
}

/// A FIFO server. Because it serves in arrival order at a deterministic speed, the departure
/// of a piece can be computed the moment it arrives (`start = max(arrival, free_at)`), so a
/// queue costs one event per piece and no stored queue at all: the backlog is implicit in
/// `free_at`.
#[derive(Clone, Debug)]
pub struct Resource {
    pub class: Class,
    pub free_at: SimTime,
    write: Cost,
    read: Cost,
    /// Propagation delay after service (links); devices have 0.
    pub latency: SimTime,
    small_bytes: u64,
    small_penalty: SimTime,
    /// Total service time, for utilisation.
    pub busy: SimTime,
    pub bytes: u64,
}

fn ns_per_byte(rate: Rate) -> f64 {
    match rate.0 {
        Some(bps) => NS_PER_S as f64 / bps,
        None => 0.0,
    }
}

impl Resource {
    fn link(class: Class, bandwidth: Rate, latency: SimTime) -> Self {
        let c = Cost {
            ns_per_byte: ns_per_byte(bandwidth),
            overhead: 0,
        };
        Resource {
            class,
            free_at: 0,
            write: c,
            read: c,
            latency,
            small_bytes: 0,
            small_penalty: 0,
            busy: 0,
            bytes: 0,
        }
    }

    fn processor(class: Class, bandwidth: Rate, overhead: SimTime) -> Self {
        let mut r = Self::link(class, bandwidth, 0);
        r.write.overhead = overhead;
        r.read.overhead = overhead;
        r
    }

    /// Service time of `bytes` (Liu Eq. 1 for the SSD: L/B + latency, with the latency as a
    /// fixed cost that occupies the device).
    #[inline]
    pub fn service(&self, bytes: u64, read: bool) -> SimTime {
        let c = if read { self.read } else { self.write };
        // `+ 0.5` then truncate: round-to-nearest for non-negative values, without a libm call.
        let mut t = c.overhead + (bytes as f64 * c.ns_per_byte + 0.5) as SimTime;
        if bytes < self.small_bytes {
            t += self.small_penalty;
        }
        t
    }

    /// Serves `bytes` arriving at `at`; returns the departure time.
    #[inline]
    pub fn serve(&mut self, at: SimTime, bytes: u64, read: bool) -> SimTime {
        let svc = self.service(bytes, read);
        let start = at.max(self.free_at);
        let depart = start.saturating_add(svc);
        self.free_at = depart;
        self.busy += svc;
        self.bytes += bytes;
        depart
    }

    /// Whether this resource is on routes: it can delay a piece, or it is where traffic is
    /// measured (the CN links and the LUNs always are, so the time series see every byte).
    pub fn present(&self) -> bool {
        matches!(self.class, Class::CnOut | Class::CnIn | Class::Lun)
            || self.write.ns_per_byte > 0.0
            || self.read.ns_per_byte > 0.0
            || self.write.overhead > 0
            || self.read.overhead > 0
            || self.latency > 0
            || self.small_penalty > 0
    }
}

/// High bit of a route entry: the device operation at this hop is a read.
pub const READ: u32 = 1 << 31;
/// A route step that does not exist in this machine (no rack level).
const NONE: u32 = u32::MAX;
/// Longest route: CN -> tree -> ION copy -> NIC -> core -> FS NIC -> FS CPU -> rack -> LUN.
pub const MAX_HOPS: usize = 10;

/// A piece's path: resource indices, each possibly tagged [`READ`].
#[derive(Clone, Copy, Debug)]
pub struct Route {
    pub hops: [u32; MAX_HOPS],
    pub len: u8,
}

/// Where a stripe of a file lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeHome {
    pub server: u32,
    pub lun: u32,
    pub rack: Option<u32>,
}

/// All resources of a machine, with the index arithmetic to find them.
pub struct Topology {
    pub res: Vec<Resource>,
    present: Vec<bool>,
    nodes: u32,
    ions: u32,
    servers: u32,
    racks: u32,
    luns_per_server: u32,
    nodes_per_ion: u32,
    pub stripe: u64,
    pub transfer: u64,
    cn_out: u32,
    cn_in: u32,
    tree_in: u32,
    tree_out: u32,
    mem: u32,
    bb: u32,
    net_out: u32,
    net_in: u32,
    core_up: u32,
    core_down: u32,
    fs_in: u32,
    fs_out: u32,
    fs_cpu: u32,
    rack: u32,
    lun: u32,
    /// Propagation latency CN <-> ION (control messages: request, grant, acknowledgement).
    pub lat_cn_ion: SimTime,
    /// Propagation latency ION <-> file server.
    pub lat_ion_fs: SimTime,
    placement_seed: u64,
}

impl Topology {
    pub fn new(sys: &System, seed: u64) -> Topology {
        let nodes = sys.compute.nodes;
        let ions = sys.ions();
        let servers = sys.file_servers.count;
        let racks = sys.storage.racks;
        let luns = sys.luns();
        let mut res: Vec<Resource> = Vec::new();
        let block = |res: &mut Vec<Resource>, n: u32, make: &dyn Fn() -> Resource| -> u32 {
            let base = res.len() as u32;
            res.extend((0..n).map(|_| make()));
            base
        };
        let c = &sys.compute;
        let i = &sys.ion;
        let bb = &sys.burst_buffer;
        let net = &sys.storage_network;
        let fs = &sys.file_servers;
        let st = &sys.storage;
        let cn_out = block(&mut res, nodes, &|| {
            Resource::link(Class::CnOut, c.link_bandwidth, c.link_latency.0)
        });
        let cn_in = block(&mut res, nodes, &|| {
            Resource::link(Class::CnIn, c.link_bandwidth, c.link_latency.0)
        });
        let tree_in = block(&mut res, ions, &|| {
            Resource::link(Class::IonTreeIn, i.tree_bandwidth, i.tree_latency.0)
        });
        let tree_out = block(&mut res, ions, &|| {
            Resource::link(Class::IonTreeOut, i.tree_bandwidth, i.tree_latency.0)
        });
        let mem = block(&mut res, ions, &|| {
            Resource::processor(Class::IonMem, i.memory_bandwidth, i.request_overhead.0)
        });
        let bb_base = block(&mut res, ions, &|| Resource {
            class: Class::Bb,
            free_at: 0,
            write: Cost {
                ns_per_byte: ns_per_byte(bb.write_bandwidth),
                overhead: bb.write_latency.0,
            },
            read: Cost {
                ns_per_byte: ns_per_byte(bb.read_bandwidth),
                overhead: bb.read_latency.0,
            },
            latency: 0,
            small_bytes: 0,
            small_penalty: 0,
            busy: 0,
            bytes: 0,
        });
        let net_out = block(&mut res, ions, &|| {
            Resource::link(Class::IonNetOut, i.network_bandwidth, i.network_latency.0)
        });
        let net_in = block(&mut res, ions, &|| {
            Resource::link(Class::IonNetIn, i.network_bandwidth, i.network_latency.0)
        });
        let core_up = block(&mut res, 1, &|| {
            Resource::link(Class::CoreUp, net.core_bandwidth, net.latency.0)
        });
        let core_down = block(&mut res, 1, &|| {
            Resource::link(Class::CoreDown, net.core_bandwidth, net.latency.0)
        });
        let fs_in = block(&mut res, servers, &|| {
            Resource::link(Class::FsNetIn, fs.nic_bandwidth, fs.nic_latency.0)
        });
        let fs_out = block(&mut res, servers, &|| {
            Resource::link(Class::FsNetOut, fs.nic_bandwidth, fs.nic_latency.0)
        });
        let fs_cpu = block(&mut res, servers, &|| {
            Resource::processor(Class::FsCpu, fs.processing_bandwidth, fs.request_overhead.0)
        });
        let rack = block(&mut res, racks, &|| {
            Resource::processor(Class::Rack, st.rack_bandwidth, 0)
        });
        let lun = block(&mut res, luns, &|| {
            let mut r = Resource::processor(Class::Lun, st.lun_bandwidth, st.lun_latency.0);
            r.small_bytes = st.small_request.0;
            r.small_penalty = st.small_request_penalty.0;
            r
        });
        let present = res.iter().map(Resource::present).collect();
        Topology {
            res,
            present,
            nodes,
            ions,
            servers,
            racks,
            luns_per_server: st.luns_per_server,
            nodes_per_ion: c.nodes_per_ion,
            stripe: fs.stripe_size.0,
            transfer: i.transfer_size.0,
            cn_out,
            cn_in,
            tree_in,
            tree_out,
            mem,
            bb: bb_base,
            net_out,
            net_in,
            core_up,
            core_down,
            fs_in,
            fs_out,
            fs_cpu,
            rack,
            lun,
            lat_cn_ion: c.link_latency.0 + i.tree_latency.0,
            lat_ion_fs: i.network_latency.0 + net.latency.0 + fs.nic_latency.0,
            placement_seed: mix64(seed ^ 0x5EED_F11E),
        }
    }

    pub fn ions(&self) -> u32 {
        self.ions
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    pub fn ion_of(&self, cn: u32) -> u32 {
        cn / self.nodes_per_ion
    }

    /// Which server, LUN and rack hold stripe `stripe` of the file `file_key`. Files start on
    /// a server chosen by hashing the key with the seed, then go round-robin (PVFS/GPFS style).
    pub fn home(&self, file_key: u64, stripe: u64) -> StripeHome {
        let start = mix64(self.placement_seed ^ file_key) % u64::from(self.servers);
        let server = ((start + stripe) % u64::from(self.servers)) as u32;
        let lun_in_server =
            ((stripe / u64::from(self.servers)) % u64::from(self.luns_per_server)) as u32;
        let rack = (self.racks > 0)
            .then(|| (u64::from(server) * u64::from(self.racks) / u64::from(self.servers)) as u32);
        StripeHome {
            server,
            lun: server * self.luns_per_server + lun_in_server,
            rack,
        }
    }

    /// The resource index of the burst buffer of `ion` (for statistics).
    pub fn bb_index(&self, ion: u32) -> usize {
        (self.bb + ion) as usize
    }

    /// Range of LUN resource indices.
    pub fn lun_range(&self) -> std::ops::Range<usize> {
        let start = self.lun as usize;
        start..start + (self.servers * self.luns_per_server) as usize
    }

    /// Builds a route from resource indices; [`NONE`] entries and resources that cannot delay
    /// anything are skipped.
    fn route(&self, steps: &[u32]) -> Route {
        let mut r = Route {
            hops: [0; MAX_HOPS],
            len: 0,
        };
        for &s in steps {
            if s != NONE && self.present[(s & !READ) as usize] {
                r.hops[r.len as usize] = s;
                r.len += 1;
            }
        }
        r
    }

    fn storage_steps(&self, home: StripeHome, read: bool) -> [u32; 3] {
        let dev = if read { READ } else { 0 };
        let rack = home.rack.map_or(NONE, |r| self.rack + r);
        [self.fs_cpu + home.server, rack, (self.lun + home.lun) | dev]
    }

    /// CN -> ION -> SSD (a write absorbed by the burst buffer).
    pub fn route_absorb(&self, cn: u32, ion: u32) -> Route {
        self.route(&[
            self.cn_out + cn,
            self.tree_in + ion,
            self.mem + ion,
            self.bb + ion,
        ])
    }

    /// CN -> ION -> storage network -> file server -> LUN (the original write path).
    pub fn route_direct(&self, cn: u32, ion: u32, home: StripeHome) -> Route {
        let [cpu, rack, lun] = self.storage_steps(home, false);
        self.route(&[
            self.cn_out + cn,
            self.tree_in + ion,
            self.mem + ion,
            self.net_out + ion,
            self.core_up,
            self.fs_in + home.server,
            cpu,
            rack,
            lun,
        ])
    }

    /// SSD -> ION -> storage network -> file server -> LUN (the drain).
    pub fn route_drain(&self, ion: u32, home: StripeHome) -> Route {
        let [cpu, rack, lun] = self.storage_steps(home, false);
        self.route(&[
            (self.bb + ion) | READ,
            self.mem + ion,
            self.net_out + ion,
            self.core_up,
            self.fs_in + home.server,
            cpu,
            rack,
            lun,
        ])
    }

    /// LUN -> file server -> storage network -> ION -> CN (a read from the PFS).
    pub fn route_read_pfs(&self, cn: u32, ion: u32, home: StripeHome) -> Route {
        let [cpu, rack, lun] = self.storage_steps(home, true);
        self.route(&[
            lun,
            rack,
            cpu,
            self.fs_out + home.server,
            self.core_down,
            self.net_in + ion,
            self.mem + ion,
            self.tree_out + ion,
            self.cn_in + cn,
        ])
    }

    /// SSD -> ION -> CN (a read served by the burst buffer).
    pub fn route_read_bb(&self, cn: u32, ion: u32) -> Route {
        self.route(&[
            (self.bb + ion) | READ,
            self.mem + ion,
            self.tree_out + ion,
            self.cn_in + cn,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::tests::SMALL;

    #[test]
    fn unlimited_components_are_left_out_of_routes() {
        let sys = System::from_toml(SMALL, "small", &[]).unwrap();
        let t = Topology::new(&sys, 1);
        // SMALL has unlimited ION memory, core and FS CPU, and no racks.
        let r = t.route_direct(0, 0, t.home(1, 0));
        let classes: Vec<Class> = r.hops[..r.len as usize]
            .iter()
            .map(|&h| t.res[(h & !READ) as usize].class)
            .collect();
        // The core has a latency, so it stays; memory and FS CPU are free and vanish.
        assert_eq!(
            classes,
            vec![
                Class::CnOut,
                Class::IonTreeIn,
                Class::IonNetOut,
                Class::CoreUp,
                Class::FsNetIn,
                Class::Lun
            ]
        );
        let d = t.route_drain(1, t.home(1, 0));
        assert_eq!(d.hops[0], (t.bb_index(1) as u32) | READ);
    }

    #[test]
    fn stripes_go_round_robin_from_a_hashed_start() {
        let sys = System::from_toml(
            SMALL,
            "small",
            &[
                "file_servers.count=5".into(),
                "storage.luns_per_server=2".into(),
                "storage.racks=2".into(),
            ],
        )
        .unwrap();
        let t = Topology::new(&sys, 1);
        let first = t.home(42, 0).server;
        for s in 0..10u64 {
            let h = t.home(42, s);
            assert_eq!(h.server, ((u64::from(first) + s) % 5) as u32);
            assert_eq!(h.lun, h.server * 2 + ((s / 5) % 2) as u32);
            assert_eq!(h.rack, Some(h.server * 2 / 5));
        }
        // Different files start on different servers (for most keys).
        let starts: std::collections::BTreeSet<u32> =
            (0..50).map(|k| t.home(k, 0).server).collect();
        assert!(starts.len() >= 4, "{starts:?}");
    }

    #[test]
    fn ssd_service_is_size_over_bandwidth_plus_latency() {
        let sys = System::from_toml(SMALL, "small", &[]).unwrap();
        let t = Topology::new(&sys, 1);
        let bb = &t.res[t.bb_index(0)];
        // 2 GiB/s, 10 us: 4 MiB takes 1/512 s + 10 us.
        assert_eq!(bb.service(4 << 20, false), 1_953_125 + 10_000);
        let lun = &t.res[t.lun_range().start];
        // 500 MiB/s, 1 ms, +5 ms below 64 KiB.
        assert_eq!(lun.service(1 << 20, false), 2_000_000 + 1_000_000);
        // 4096 B at 500 MiB/s is 7812.5 ns, rounded to the nearest ns.
        assert_eq!(lun.service(4096, false), 7_813 + 1_000_000 + 5_000_000);
    }
}
