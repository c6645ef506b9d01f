//! Identifiers. Kept as plain newtypes so they cross the wire and the database unchanged.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An instance (an allocation of fragments). Unique per manager, or per set of servers when
/// instances are created by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InstanceId(pub u64);

/// One namespace (file tree) of an instance: a striped instance has one (0), a private instance
/// has one per compute node (0..nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NamespaceId(pub u32);

/// An inode number inside one namespace. 1 is the root directory.
pub type Ino = u64;

/// What names a file's data everywhere in an instance: its namespace and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileId {
    pub ns: NamespaceId,
    pub ino: Ino,
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ns.0, self.ino)
    }
}

impl FileId {
    /// A stable hash of the file id, used to pick the fragment holding stripe 0 so that small
    /// files spread over all fragments (DESIGN §3). FNV-1a: stable across builds and platforms.
    pub fn placement_hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self
            .ns
            .0
            .to_le_bytes()
            .iter()
            .chain(self.ino.to_le_bytes().iter())
        {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}
