//! The system description: how many compute nodes, I/O nodes, file servers and LUNs a machine
//! has, and the bandwidth, latency and capacity of each, read from TOML (`docs/SIM.md` lists
//! every key; `examples/sim/systems/intrepid.toml` is the paper's machine).
//!
//! Overrides (`--set burst_buffer.enabled=false`) are applied to the TOML tree before it is
//! typed, so they are checked exactly like the file.

use crate::units::{Duration, Rate, Size};
use serde::Deserialize;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SystemError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("--set {text}: {message}")]
    Override { text: String, message: String },
}

/// The whole system file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    /// Short name used in reports.
    #[serde(default = "default_name")]
    pub name: String,
    /// One line on what machine this is.
    #[serde(default)]
    pub description: String,
    pub compute: Compute,
    pub ion: Ion,
    pub burst_buffer: BurstBuffer,
    pub storage_network: StorageNetwork,
    pub file_servers: FileServers,
    pub storage: Storage,
}

fn default_name() -> String {
    "system".to_string()
}

/// Compute nodes (CN) and their links into the I/O-forwarding tree.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compute {
    /// Number of compute nodes.
    pub nodes: u32,
    /// Application processes per node when a kernel does not say (BG/P: 4, one per core).
    #[serde(default = "default_ppn")]
    pub processes_per_node: u32,
    /// Compute nodes served by one I/O node (a BG/P "pset": 64 on Intrepid).
    pub nodes_per_ion: u32,
    /// Bandwidth of one CN's link into the tree, each direction.
    pub link_bandwidth: Rate,
    /// Latency of one CN's link.
    pub link_latency: Duration,
    /// Time for a barrier to release once the last process arrives.
    #[serde(default = "zero_duration")]
    pub barrier_latency: Duration,
}

fn default_ppn() -> u32 {
    1
}

fn zero_duration() -> Duration {
    Duration(0)
}

/// I/O nodes (ION): the I/O-forwarding layer, where the burst buffer sits.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ion {
    /// The ION's port on the CN tree, each direction: all traffic of its CNs shares it.
    pub tree_bandwidth: Rate,
    pub tree_latency: Duration,
    /// Memory-copy bandwidth of the forwarder (RAM <-> NIC <-> SSD), the ION's processing unit.
    pub memory_bandwidth: Rate,
    /// Fixed processing cost per transfer unit in the forwarder.
    #[serde(default = "zero_duration")]
    pub request_overhead: Duration,
    /// The ION's NIC on the storage network, each direction.
    pub network_bandwidth: Rate,
    pub network_latency: Duration,
    /// Bytes the forwarder can hold in flight; a CN's data moves only when space is granted,
    /// so a direct write progresses at the speed the storage accepts it.
    pub forward_buffer: Size,
    /// The forwarder's transfer unit: requests are cut into pieces of at most this size (and
    /// at stripe boundaries) that pipeline through the links and devices.
    pub transfer_size: Size,
}

/// When the burst buffer writes its data to the file servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrainPolicy {
    /// As soon as data is absorbed (Liu §III-C).
    Eager,
    /// Only when a process commits or the buffer is fuller than `high_watermark`.
    Lazy,
}

/// The SSD burst buffer in each ION (Liu Eq. 1: T = L/B + latency).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurstBuffer {
    pub enabled: bool,
    /// Capacity per ION.
    pub capacity: Size,
    pub write_bandwidth: Rate,
    pub read_bandwidth: Rate,
    pub write_latency: Duration,
    pub read_latency: Duration,
    #[serde(default = "default_drain")]
    pub drain: DrainPolicy,
    /// Transfer units each ION drains concurrently.
    #[serde(default = "default_drain_depth")]
    pub drain_depth: u32,
    /// For `drain = "lazy"`: start draining when this fraction of the capacity is used.
    #[serde(default = "default_watermark")]
    pub high_watermark: f64,
}

fn default_drain() -> DrainPolicy {
    DrainPolicy::Eager
}
fn default_drain_depth() -> u32 {
    16
}
fn default_watermark() -> f64 {
    0.8
}

/// The commodity network between IONs and file servers (Myrinet/10GbE on Intrepid).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageNetwork {
    /// Aggregate capacity of the switch core, each direction ("unlimited": never saturates).
    pub core_bandwidth: Rate,
    pub latency: Duration,
}

/// PFS file servers.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServers {
    pub count: u32,
    /// Each server's NIC, each direction.
    pub nic_bandwidth: Rate,
    pub nic_latency: Duration,
    /// The server's processing unit (CPU, DMA).
    pub processing_bandwidth: Rate,
    #[serde(default = "zero_duration")]
    pub request_overhead: Duration,
    /// Files are striped round-robin over the servers in units of this size.
    pub stripe_size: Size,
}

/// Enterprise storage behind the file servers: racks (controllers) of LUNs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    /// Storage racks/controller couplets; servers are split evenly between them (0: no rack
    /// level in the model).
    #[serde(default)]
    pub racks: u32,
    pub rack_bandwidth: Rate,
    pub luns_per_server: u32,
    pub lun_bandwidth: Rate,
    /// Positioning/controller time per request.
    pub lun_latency: Duration,
    /// Requests smaller than this pay `small_request_penalty` on top (read-modify-write of a
    /// RAID stripe; Liu §III-D penalised small HDF5 requests to match Intrepid).
    pub small_request: Size,
    pub small_request_penalty: Duration,
}

impl System {
    /// Reads a system file, applies `--set key=value` overrides, and validates the result.
    pub fn load(path: &Path, overrides: &[String]) -> Result<System, SystemError> {
        let text = std::fs::read_to_string(path).map_err(|source| SystemError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string(), overrides)
    }

    /// Parses system TOML text; `origin` names it in errors.
    pub fn from_toml(
        text: &str,
        origin: &str,
        overrides: &[String],
    ) -> Result<System, SystemError> {
        let parse_err = |e: toml::de::Error| SystemError::Parse {
            path: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        };
        let system: System = if overrides.is_empty() {
            // Straight from the text so errors carry line and column.
            toml::from_str(text).map_err(parse_err)?
        } else {
            let mut table: toml::Table = toml::from_str(text).map_err(parse_err)?;
            for o in overrides {
                apply_override(&mut table, o)?;
            }
            let described = overrides.join(", ");
            System::deserialize(toml::Value::Table(table)).map_err(|e| SystemError::Parse {
                path: format!("{origin} (with --set {described})"),
                message: e.to_string().trim_end().to_string(),
            })?
        };
        system.validate().map_err(|message| SystemError::Invalid {
            path: origin.to_string(),
            message,
        })?;
        Ok(system)
    }

    fn validate(&self) -> Result<(), String> {
        let c = &self.compute;
        if c.nodes == 0 {
            return Err("compute.nodes must be at least 1".into());
        }
        if c.nodes_per_ion == 0 {
            return Err("compute.nodes_per_ion must be at least 1".into());
        }
        if c.processes_per_node == 0 {
            return Err("compute.processes_per_node must be at least 1".into());
        }
        if self.file_servers.count == 0 {
            return Err("file_servers.count must be at least 1".into());
        }
        if self.storage.luns_per_server == 0 {
            return Err("storage.luns_per_server must be at least 1".into());
        }
        if self.storage.racks > self.file_servers.count {
            return Err(format!(
                "storage.racks ({}) is more than file_servers.count ({}); each rack needs a server",
                self.storage.racks, self.file_servers.count
            ));
        }
        if self.file_servers.stripe_size.0 == 0 {
            return Err("file_servers.stripe_size must be more than 0".into());
        }
        if self.ion.transfer_size.0 == 0 {
            return Err("ion.transfer_size must be more than 0".into());
        }
        if self.ion.transfer_size.0 > u32::MAX as u64 {
            return Err("ion.transfer_size must be less than 4 GiB".into());
        }
        if self.ion.forward_buffer.0 == 0 {
            return Err("ion.forward_buffer must be more than 0".into());
        }
        let bb = &self.burst_buffer;
        if bb.enabled && bb.drain_depth == 0 {
            return Err("burst_buffer.drain_depth must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&bb.high_watermark) {
            return Err(format!(
                "burst_buffer.high_watermark is {}, expected a fraction between 0 and 1",
                bb.high_watermark
            ));
        }
        Ok(())
    }

    /// Number of I/O nodes: one per `nodes_per_ion` compute nodes.
    pub fn ions(&self) -> u32 {
        self.compute.nodes.div_ceil(self.compute.nodes_per_ion)
    }

    /// The ION that serves compute node `cn`.
    pub fn ion_of(&self, cn: u32) -> u32 {
        cn / self.compute.nodes_per_ion
    }

    /// Total LUNs.
    pub fn luns(&self) -> u32 {
        self.file_servers.count * self.storage.luns_per_server
    }
}

/// Applies `a.b.c=value` to a TOML table. The value is read as TOML (`64`, `false`, `0.5`,
/// `"4GiB"`) and, failing that, as a bare string (`4GiB`), so shells need no extra quoting.
pub fn apply_override(table: &mut toml::Table, text: &str) -> Result<(), SystemError> {
    let bad = |message: String| SystemError::Override {
        text: text.to_string(),
        message,
    };
    let (key, raw) = text
        .split_once('=')
        .ok_or_else(|| bad("expected KEY=VALUE, e.g. burst_buffer.capacity=4GiB".into()))?;
    let key = key.trim();
    let raw = raw.trim();
    let value = match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or(toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad(format!("'{key}' is not a key such as storage.racks")));
    }
    let (last, parents) = parts.split_last().ok_or_else(|| bad("empty key".into()))?;
    let mut cur = table;
    for p in parents {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry
            .as_table_mut()
            .ok_or_else(|| bad(format!("'{p}' is a value, not a section")))?;
    }
    cur.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small system with every key, used by unit tests across the crate.
    pub(crate) const SMALL: &str = r#"
name = "small"
[compute]
nodes = 8
processes_per_node = 2
nodes_per_ion = 4
link_bandwidth = "1GiB/s"
link_latency = "1us"
[ion]
tree_bandwidth = "1GiB/s"
tree_latency = "1us"
memory_bandwidth = "unlimited"
network_bandwidth = "1GiB/s"
network_latency = "1us"
forward_buffer = "64MiB"
transfer_size = "4MiB"
[burst_buffer]
enabled = true
capacity = "1GiB"
write_bandwidth = "2GiB/s"
read_bandwidth = "2GiB/s"
write_latency = "10us"
read_latency = "10us"
[storage_network]
core_bandwidth = "unlimited"
latency = "1us"
[file_servers]
count = 2
nic_bandwidth = "1GiB/s"
nic_latency = "1us"
processing_bandwidth = "unlimited"
stripe_size = "4MiB"
[storage]
racks = 0
rack_bandwidth = "unlimited"
luns_per_server = 1
lun_bandwidth = "500MiB/s"
lun_latency = "1ms"
small_request = "64KiB"
small_request_penalty = "5ms"
"#;

    #[test]
    fn parses_units_and_derives_ions() {
        let s = System::from_toml(SMALL, "small.toml", &[]).unwrap();
        assert_eq!(s.ions(), 2);
        assert_eq!(s.ion_of(5), 1);
        assert_eq!(s.burst_buffer.capacity, Size(1 << 30));
        assert_eq!(s.ion.memory_bandwidth, Rate(None));
        assert_eq!(s.storage.lun_latency, Duration(1_000_000));
        assert_eq!(s.burst_buffer.drain, DrainPolicy::Eager);
    }

    #[test]
    fn errors_name_the_line_and_the_value() {
        let bad = SMALL.replace("capacity = \"1GiB\"", "capacity = \"1 parsec\"");
        let e = System::from_toml(&bad, "small.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("small.toml"), "{e}");
        assert!(e.contains("line 19"), "{e}");
        assert!(e.contains("1 parsec"), "{e}");
        let unknown = SMALL.replace("enabled = true", "enabled = true\nspeed = 3");
        let e = System::from_toml(&unknown, "small.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("speed"), "{e}");
    }

    #[test]
    fn overrides_are_typed_and_validated() {
        let s = System::from_toml(
            SMALL,
            "small.toml",
            &[
                "burst_buffer.enabled=false".into(),
                "file_servers.count=7".into(),
                "burst_buffer.capacity=4GiB".into(),
            ],
        )
        .unwrap();
        assert!(!s.burst_buffer.enabled);
        assert_eq!(s.file_servers.count, 7);
        assert_eq!(s.burst_buffer.capacity, Size(4 << 30));
        let e = System::from_toml(SMALL, "small.toml", &["file_servers.count=0".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("file_servers.count"), "{e}");
        let e = System::from_toml(SMALL, "small.toml", &["burst_buffer.capacity=lots".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lots"), "{e}");
        let e = System::from_toml(SMALL, "small.toml", &["nonsense".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("KEY=VALUE"), "{e}");
    }
}
