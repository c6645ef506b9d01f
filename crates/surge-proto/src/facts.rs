//! Each request's facts, said once, in matches the compiler checks (issue 33 item 2).
//!
//! A request is one variant of [`Request`]. What the rest of Surge needs to know about it is
//! here and nowhere else, one exhaustive `match` per fact and none with a `_` arm, so a new
//! variant does not compile until each fact is stated for it:
//! - [`RequestKind`]: its opcode and name. The opcode is the variant's position in
//!   [`Request`], which is also the tag postcard writes for it: one numbering on the wire (the
//!   frame header's opcode must equal the decoded request's, see [`crate::codec`]);
//! - [`Facts`] (per kind): which service answers it, who may send it, whether it changes
//!   anything;
//! - [`Request::scope`]: the instance and namespace it is about (what a capability must cover);
//! - [`Request::owners`]: the owners it gives new or changed nodes (a capability's user must be
//!   allowed to);
//! - [`Request::dirs`]: the directories whose entries it reads or changes (their leases held by
//!   another session are recalled first);
//! - [`Request::change`]: the change of the tree a cache namespace's drain journal records.
//!
//! The handlers are the other exhaustive sites: the server's `conn::handle` (administration
//! and data) and `mds::run` (metadata).
//!
//! To add a request: append a variant to [`Request`] (appending keeps every other's
//! encoding), bump [`crate::PROTOCOL_VERSION`], then follow the compiler.

use crate::msg::{BatchOp, NewNode, Request, SetAttr, ACL_ACCESS_XATTR};
use surge_core::{Ino, InstanceId, NamespaceId};

/// Which part of a server answers a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// The connection itself (authentication).
    Connection,
    /// Server administration: fragments and namespaces made and destroyed, status.
    Admin,
    /// One fragment's objects (file data).
    Data,
    /// A namespace's metadata service.
    Metadata,
}

/// Who may send a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// Anyone, before presenting a capability.
    Anyone,
    /// The manager and administrators (an admin capability).
    Admin,
    /// A capability that covers the request's [`Scope`].
    Holder,
}

/// What the rest of Surge needs to know about a kind of request, field by field for every
/// kind in [`RequestKind::facts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// For logs, metrics and error messages.
    pub name: &'static str,
    pub service: Service,
    pub sender: Sender,
    /// Answered without changing anything stored (a metadata server takes no room back for
    /// it from its reserve).
    pub read_only: bool,
}

/// The instance and namespace a request is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The server as a whole.
    Server,
    /// One instance (its fragments, its descriptor).
    Instance(InstanceId),
    /// One namespace of an instance (its files, their objects).
    Namespace(InstanceId, NamespaceId),
}

/// The owners a request gives the nodes it makes or changes.
#[derive(Clone, Copy, Debug)]
pub enum Owners<'a> {
    None,
    /// A new node owned by `uid` and `gid`.
    New {
        uid: u32,
        gid: u32,
    },
    /// New files among a batch's operations.
    Batch(&'a [BatchOp]),
    /// An owner or group change among a node's attributes.
    Change(&'a SetAttr),
}

/// The directories whose entries a request reads or changes. Directories a request only names
/// by inode for their attributes (getattr, setattr) are not among them: their attributes may
/// lag a lease holder's changes by a round trip, as for any change made behind.
#[derive(Clone, Copy, Debug)]
pub enum Dirs<'a> {
    None,
    /// One directory.
    Of(Ino),
    /// `parent`, and `name` in it if that is a directory (removed or replaced: it must be
    /// empty, and only its lease holder knows).
    Removing {
        parent: Ino,
        name: &'a [u8],
    },
    /// Both parents of a rename, and the directory it replaces if any.
    Renaming {
        parent: Ino,
        new_parent: Ino,
        new_name: &'a [u8],
    },
    /// The parents of a batch's operations.
    Batch(&'a [BatchOp]),
}

/// The change of a namespace's tree a request makes, as a cache namespace's drain replays it
/// on the PFS.
#[derive(Clone, Copy, Debug)]
pub enum Change<'a> {
    None,
    Create {
        parent: Ino,
        name: &'a [u8],
        node: &'a NewNode,
    },
    Link {
        ino: Ino,
        new_parent: Ino,
        new_name: &'a [u8],
    },
    Unlink {
        parent: Ino,
        name: &'a [u8],
    },
    Rmdir {
        parent: Ino,
        name: &'a [u8],
    },
    Rename {
        parent: Ino,
        name: &'a [u8],
        new_parent: Ino,
        new_name: &'a [u8],
        flags: u32,
    },
    /// Attributes: the mode, owner and times the drain copies (an access ACL changes the
    /// mode).
    Attr {
        ino: Ino,
    },
    /// The file's data (a write committed, a size set, an append).
    Data {
        ino: Ino,
    },
    Batch(&'a [BatchOp]),
}

macro_rules! kinds {
    ($($kind:ident),* $(,)?) => {
        /// The kind of a [`Request`], variant for variant in the same order: `kind as u16` is
        /// the request's opcode.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum RequestKind {
            $($kind),*
        }

        impl RequestKind {
            /// Every kind, in opcode order.
            pub const ALL: &'static [RequestKind] = &[$(RequestKind::$kind),*];
        }

        impl Request {
            pub fn kind(&self) -> RequestKind {
                match self {
                    $(Request::$kind { .. } => RequestKind::$kind),*
                }
            }
        }
    };
}

kinds!(
    Status,
    CreateFragment,
    DestroyFragment,
    CreateNamespace,
    DestroyNamespace,
    Describe,
    Write,
    Read,
    TruncateObject,
    RemoveObject,
    SyncObject,
    FragmentUsage,
    LocalObject,
    LocalFragment,
    ObjectChanged,
    Lookup,
    GetAttr,
    SetAttr,
    Create,
    Link,
    Unlink,
    Rmdir,
    Rename,
    Readlink,
    ReadDir,
    CommitWrite,
    Purge,
    NamespaceStats,
    AllocateObject,
    NamespaceBatch,
    AllocInodes,
    LeaseDir,
    WaitRecall,
    ReleaseLeases,
    GetXattr,
    ListXattr,
    SetXattr,
    RemoveXattr,
    Authenticate,
    DrainPoll,
    CacheThrough,
    DrainAck,
    CacheFill,
    CacheOpen,
    CacheUse,
    CacheEvict,
    SetLayout,
    DrainHold,
    ObjectAllocated,
    SeekObject,
    Lock,
    Append,
    Tmpfile,
    AppendObject,
    Accessed,
    AllocatedPastEnd,
    OpenWrite,
    Recovered,
    Goodbye,
    ObjectLength,
    ClaimOrphans,
);

impl RequestKind {
    /// The opcode in frame headers (and postcard's tag for the variant).
    pub fn opcode(self) -> u16 {
        self as u16
    }

    pub fn from_opcode(op: u16) -> Option<RequestKind> {
        RequestKind::ALL.get(usize::from(op)).copied()
    }

    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// The kind's facts: one line per kind, every field given.
    pub const fn facts(self) -> Facts {
        use RequestKind as K;
        use Sender::{Admin as A, Anyone, Holder as H};
        use Service::{Admin as Adm, Connection, Data as D, Metadata as M};
        const fn f(name: &'static str, service: Service, sender: Sender, read_only: bool) -> Facts {
            Facts {
                name,
                service,
                sender,
                read_only,
            }
        }
        match self {
            K::Authenticate => f("Authenticate", Connection, Anyone, true),
            K::Status => f("Status", Adm, A, true),
            K::CreateFragment => f("CreateFragment", Adm, A, false),
            K::DestroyFragment => f("DestroyFragment", Adm, A, false),
            K::CreateNamespace => f("CreateNamespace", Adm, A, false),
            K::DestroyNamespace => f("DestroyNamespace", Adm, A, false),
            K::Describe => f("Describe", Adm, H, true),
            K::Write => f("Write", D, H, false),
            K::AppendObject => f("AppendObject", D, H, false),
            K::Read => f("Read", D, H, true),
            K::TruncateObject => f("TruncateObject", D, H, false),
            K::RemoveObject => f("RemoveObject", D, H, false),
            K::SyncObject => f("SyncObject", D, H, false),
            K::FragmentUsage => f("FragmentUsage", D, H, true),
            K::LocalObject => f("LocalObject", D, H, false),
            K::LocalFragment => f("LocalFragment", D, H, true),
            K::ObjectChanged => f("ObjectChanged", D, H, false),
            K::AllocateObject => f("AllocateObject", D, H, false),
            K::ObjectAllocated => f("ObjectAllocated", D, H, true),
            K::SeekObject => f("SeekObject", D, H, true),
            K::Lookup => f("Lookup", M, H, true),
            K::GetAttr => f("GetAttr", M, H, true),
            K::SetAttr => f("SetAttr", M, H, false),
            K::Accessed => f("Accessed", M, H, false),
            K::AllocatedPastEnd => f("AllocatedPastEnd", M, H, false),
            // Records the writer, and moves the atime when asked.
            K::OpenWrite => f("OpenWrite", M, H, false),
            K::Recovered => f("Recovered", M, H, false),
            // Changes the server's memory only (nothing stored).
            K::Goodbye => f("Goodbye", M, H, true),
            K::ObjectLength => f("ObjectLength", D, H, true),
            // Changes the server's memory only (nothing stored).
            K::ClaimOrphans => f("ClaimOrphans", M, H, true),
            K::Create => f("Create", M, H, false),
            K::Link => f("Link", M, H, false),
            K::Unlink => f("Unlink", M, H, false),
            K::Rmdir => f("Rmdir", M, H, false),
            K::Rename => f("Rename", M, H, false),
            K::Readlink => f("Readlink", M, H, true),
            K::ReadDir => f("ReadDir", M, H, true),
            K::CommitWrite => f("CommitWrite", M, H, false),
            K::Purge => f("Purge", M, H, false),
            K::NamespaceStats => f("NamespaceStats", M, H, true),
            K::NamespaceBatch => f("NamespaceBatch", M, H, false),
            K::AllocInodes => f("AllocInodes", M, H, false),
            K::LeaseDir => f("LeaseDir", M, H, false),
            K::WaitRecall => f("WaitRecall", M, H, false),
            K::ReleaseLeases => f("ReleaseLeases", M, H, false),
            K::GetXattr => f("GetXattr", M, H, true),
            K::ListXattr => f("ListXattr", M, H, true),
            K::SetXattr => f("SetXattr", M, H, false),
            K::RemoveXattr => f("RemoveXattr", M, H, false),
            K::DrainPoll => f("DrainPoll", M, H, false),
            K::CacheThrough => f("CacheThrough", M, H, false),
            K::DrainAck => f("DrainAck", M, H, false),
            K::CacheFill => f("CacheFill", M, H, false),
            K::CacheOpen => f("CacheOpen", M, H, false),
            K::CacheUse => f("CacheUse", M, H, false),
            K::CacheEvict => f("CacheEvict", M, H, false),
            K::SetLayout => f("SetLayout", M, H, false),
            K::DrainHold => f("DrainHold", M, H, false),
            K::Lock => f("Lock", M, H, false),
            K::Append => f("Append", M, H, false),
            K::Tmpfile => f("Tmpfile", M, H, false),
        }
    }
}

impl Request {
    /// The opcode carried in the frame header (see [`RequestKind`]).
    pub fn opcode(&self) -> u16 {
        self.kind().opcode()
    }

    /// The operation's name, for logs and error messages.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    pub fn facts(&self) -> Facts {
        self.kind().facts()
    }

    /// The namespace whose metadata service answers a request; `None` for other requests.
    pub fn namespace(&self) -> Option<(InstanceId, NamespaceId)> {
        match (self.facts().service, self.scope()) {
            (Service::Metadata, Scope::Namespace(instance, ns)) => Some((instance, ns)),
            _ => None,
        }
    }

    /// What a capability must cover for the request to be answered.
    pub fn scope(&self) -> Scope {
        use Request as R;
        match self {
            R::Status | R::Authenticate { .. } => Scope::Server,
            R::CreateFragment { instance, .. }
            | R::DestroyFragment { instance, .. }
            | R::Describe { instance }
            | R::FragmentUsage { instance, .. }
            | R::LocalFragment { instance, .. } => Scope::Instance(*instance),
            R::Write { instance, file, .. }
            | R::AppendObject { instance, file, .. }
            | R::Read { instance, file, .. }
            | R::TruncateObject { instance, file, .. }
            | R::RemoveObject { instance, file, .. }
            | R::SyncObject { instance, file, .. }
            | R::LocalObject { instance, file, .. }
            | R::ObjectChanged { instance, file, .. }
            | R::AllocateObject { instance, file, .. }
            | R::ObjectAllocated { instance, file, .. }
            | R::SeekObject { instance, file, .. }
            | R::ObjectLength { instance, file, .. } => Scope::Namespace(*instance, file.ns),
            R::CreateNamespace { instance, ns, .. }
            | R::DestroyNamespace { instance, ns }
            | R::Lookup { instance, ns, .. }
            | R::GetAttr { instance, ns, .. }
            | R::SetAttr { instance, ns, .. }
            | R::Create { instance, ns, .. }
            | R::Link { instance, ns, .. }
            | R::Unlink { instance, ns, .. }
            | R::Rmdir { instance, ns, .. }
            | R::Rename { instance, ns, .. }
            | R::Readlink { instance, ns, .. }
            | R::ReadDir { instance, ns, .. }
            | R::CommitWrite { instance, ns, .. }
            | R::Purge { instance, ns, .. }
            | R::NamespaceStats { instance, ns }
            | R::NamespaceBatch { instance, ns, .. }
            | R::AllocInodes { instance, ns, .. }
            | R::LeaseDir { instance, ns, .. }
            | R::WaitRecall { instance, ns, .. }
            | R::ReleaseLeases { instance, ns, .. }
            | R::GetXattr { instance, ns, .. }
            | R::ListXattr { instance, ns, .. }
            | R::SetXattr { instance, ns, .. }
            | R::RemoveXattr { instance, ns, .. }
            | R::DrainPoll { instance, ns, .. }
            | R::CacheThrough { instance, ns, .. }
            | R::DrainAck { instance, ns, .. }
            | R::CacheFill { instance, ns, .. }
            | R::CacheOpen { instance, ns, .. }
            | R::CacheUse { instance, ns, .. }
            | R::CacheEvict { instance, ns, .. }
            | R::SetLayout { instance, ns, .. }
            | R::DrainHold { instance, ns, .. }
            | R::Lock { instance, ns, .. }
            | R::Append { instance, ns, .. }
            | R::Tmpfile { instance, ns, .. }
            | R::Accessed { instance, ns, .. }
            | R::AllocatedPastEnd { instance, ns, .. }
            | R::OpenWrite { instance, ns, .. }
            | R::Recovered { instance, ns, .. }
            | R::ClaimOrphans { instance, ns, .. }
            | R::Goodbye { instance, ns } => Scope::Namespace(*instance, *ns),
        }
    }

    /// The owners the request gives nodes.
    pub fn owners(&self) -> Owners<'_> {
        use Request as R;
        match self {
            R::Create { uid, gid, .. } | R::Tmpfile { uid, gid, .. } => Owners::New {
                uid: *uid,
                gid: *gid,
            },
            R::NamespaceBatch { ops, .. } => Owners::Batch(ops),
            R::SetAttr { set, .. } => Owners::Change(set),
            // The root directory's owner is given by the manager (an admin request).
            R::CreateNamespace { .. }
            | R::Status
            | R::Authenticate { .. }
            | R::CreateFragment { .. }
            | R::DestroyFragment { .. }
            | R::DestroyNamespace { .. }
            | R::Describe { .. }
            | R::Write { .. }
            | R::AppendObject { .. }
            | R::Accessed { .. }
            | R::AllocatedPastEnd { .. }
            | R::OpenWrite { .. }
            | R::Recovered { .. }
            | R::Goodbye { .. }
            | R::ObjectLength { .. }
            | R::Read { .. }
            | R::TruncateObject { .. }
            | R::RemoveObject { .. }
            | R::SyncObject { .. }
            | R::FragmentUsage { .. }
            | R::LocalObject { .. }
            | R::LocalFragment { .. }
            | R::ObjectChanged { .. }
            | R::AllocateObject { .. }
            | R::ObjectAllocated { .. }
            | R::SeekObject { .. }
            | R::Lookup { .. }
            | R::GetAttr { .. }
            | R::Link { .. }
            | R::Unlink { .. }
            | R::Rmdir { .. }
            | R::Rename { .. }
            | R::Readlink { .. }
            | R::ReadDir { .. }
            | R::CommitWrite { .. }
            | R::Purge { .. }
            | R::NamespaceStats { .. }
            | R::AllocInodes { .. }
            | R::LeaseDir { .. }
            | R::WaitRecall { .. }
            | R::ReleaseLeases { .. }
            | R::GetXattr { .. }
            | R::ListXattr { .. }
            | R::SetXattr { .. }
            | R::RemoveXattr { .. }
            | R::DrainPoll { .. }
            | R::CacheThrough { .. }
            | R::DrainAck { .. }
            | R::CacheFill { .. }
            | R::CacheOpen { .. }
            | R::CacheUse { .. }
            | R::CacheEvict { .. }
            | R::SetLayout { .. }
            | R::DrainHold { .. }
            | R::Lock { .. }
            | R::ClaimOrphans { .. }
            | R::Append { .. } => Owners::None,
        }
    }

    /// The directories whose entries the request reads or changes.
    pub fn dirs(&self) -> Dirs<'_> {
        use Request as R;
        match self {
            R::Lookup { parent, .. } | R::Create { parent, .. } | R::Unlink { parent, .. } => {
                Dirs::Of(*parent)
            }
            R::ReadDir { ino, .. } => Dirs::Of(*ino),
            R::Link { new_parent, .. } => Dirs::Of(*new_parent),
            R::Rmdir { parent, name, .. } => Dirs::Removing {
                parent: *parent,
                name,
            },
            R::Rename {
                parent,
                new_parent,
                new_name,
                ..
            } => Dirs::Renaming {
                parent: *parent,
                new_parent: *new_parent,
                new_name,
            },
            R::NamespaceBatch { ops, .. } => Dirs::Batch(ops),
            // By inode, for attributes, data or extended attributes.
            R::GetAttr { .. }
            | R::SetAttr { .. }
            | R::Readlink { .. }
            | R::CommitWrite { .. }
            | R::Purge { .. }
            | R::GetXattr { .. }
            | R::ListXattr { .. }
            | R::SetXattr { .. }
            | R::RemoveXattr { .. }
            | R::SetLayout { .. }
            | R::Append { .. }
            // Reads the directory's attributes (default ACL, layout), no entry.
            | R::Tmpfile { .. }
            // A lease request is where leases are granted, not recalled for.
            | R::LeaseDir { .. }
            | R::WaitRecall { .. }
            | R::ClaimOrphans { .. }
            | R::ReleaseLeases { .. }
            | R::AllocInodes { .. }
            | R::NamespaceStats { .. }
            | R::DrainPoll { .. }
            | R::DrainAck { .. }
            | R::DrainHold { .. }
            | R::CacheThrough { .. }
            | R::CacheFill { .. }
            | R::CacheOpen { .. }
            | R::CacheUse { .. }
            | R::CacheEvict { .. }
            | R::Lock { .. }
            | R::Status
            | R::Authenticate { .. }
            | R::CreateFragment { .. }
            | R::DestroyFragment { .. }
            | R::CreateNamespace { .. }
            | R::DestroyNamespace { .. }
            | R::Describe { .. }
            | R::Write { .. }
            | R::AppendObject { .. }
            | R::Accessed { .. }
            | R::AllocatedPastEnd { .. }
            | R::OpenWrite { .. }
            | R::Recovered { .. }
            | R::Goodbye { .. }
            | R::ObjectLength { .. }
            | R::Read { .. }
            | R::TruncateObject { .. }
            | R::RemoveObject { .. }
            | R::SyncObject { .. }
            | R::FragmentUsage { .. }
            | R::LocalObject { .. }
            | R::LocalFragment { .. }
            | R::ObjectChanged { .. }
            | R::AllocateObject { .. }
            | R::ObjectAllocated { .. }
            | R::SeekObject { .. } => Dirs::None,
        }
    }

    /// The change of the namespace's tree the request makes, as a cache namespace's drain
    /// replays it.
    pub fn change(&self) -> Change<'_> {
        use Request as R;
        match self {
            R::Create {
                parent, name, node, ..
            } => Change::Create {
                parent: *parent,
                name,
                node,
            },
            R::Link {
                ino,
                new_parent,
                new_name,
                ..
            } => Change::Link {
                ino: *ino,
                new_parent: *new_parent,
                new_name,
            },
            R::Unlink { parent, name, .. } => Change::Unlink {
                parent: *parent,
                name,
            },
            R::Rmdir { parent, name, .. } => Change::Rmdir {
                parent: *parent,
                name,
            },
            R::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
                ..
            } => Change::Rename {
                parent: *parent,
                name,
                new_parent: *new_parent,
                new_name,
                flags: *flags,
            },
            R::SetAttr { ino, set, .. } if set.size.is_some() => Change::Data { ino: *ino },
            R::SetAttr { ino, .. } => Change::Attr { ino: *ino },
            // An access ACL sets the mode, which the drain carries to the PFS (not the ACL).
            R::SetXattr { ino, name, .. } if name == ACL_ACCESS_XATTR => Change::Attr { ino: *ino },
            R::SetXattr { .. } | R::RemoveXattr { .. } => Change::None,
            // A recovered size: the data the drain copies grew.
            R::CommitWrite { ino, .. } | R::Append { ino, .. } | R::Recovered { ino, .. } => {
                Change::Data { ino: *ino }
            }
            R::NamespaceBatch { ops, .. } => Change::Batch(ops),
            // The layout of a file not written yet, or the cache's own bookkeeping; an
            // unnamed file is not made in a cache namespace.
            R::SetLayout { .. }
            | R::Tmpfile { .. }
            | R::Purge { .. }
            | R::CacheThrough { .. }
            | R::CacheFill { .. }
            | R::CacheOpen { .. }
            | R::CacheUse { .. }
            | R::CacheEvict { .. }
            | R::DrainPoll { .. }
            | R::DrainAck { .. }
            | R::DrainHold { .. }
            | R::AllocInodes { .. }
            | R::LeaseDir { .. }
            | R::WaitRecall { .. }
            | R::ClaimOrphans { .. }
            | R::ReleaseLeases { .. }
            | R::Lock { .. }
            | R::Lookup { .. }
            | R::GetAttr { .. }
            | R::Readlink { .. }
            | R::ReadDir { .. }
            | R::NamespaceStats { .. }
            | R::GetXattr { .. }
            | R::ListXattr { .. }
            | R::Status
            | R::Authenticate { .. }
            | R::CreateFragment { .. }
            | R::DestroyFragment { .. }
            | R::CreateNamespace { .. }
            | R::DestroyNamespace { .. }
            | R::Describe { .. }
            | R::Write { .. }
            | R::AppendObject { .. }
            | R::Accessed { .. }
            | R::AllocatedPastEnd { .. }
            | R::OpenWrite { .. }
            | R::Goodbye { .. }
            | R::ObjectLength { .. }
            | R::Read { .. }
            | R::TruncateObject { .. }
            | R::RemoveObject { .. }
            | R::SyncObject { .. }
            | R::FragmentUsage { .. }
            | R::LocalObject { .. }
            | R::LocalFragment { .. }
            | R::ObjectChanged { .. }
            | R::AllocateObject { .. }
            | R::ObjectAllocated { .. }
            | R::SeekObject { .. } => Change::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::{self, Deserialize, Visitor};

    /// A deserializer that records the variant names serde's derive gives `deserialize_enum`
    /// (the declaration order, whose positions are the tags postcard writes) and stops.
    struct Variants(Option<&'static [&'static str]>);

    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    impl<'de> de::Deserializer<'de> for &mut Variants {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_enum<V: Visitor<'de>>(
            self,
            _: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(variants);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map struct
            identifier ignored_any
        }
    }

    #[test]
    fn kinds_are_the_requests_in_wire_order() {
        let mut v = Variants(None);
        assert!(Request::deserialize(&mut v).is_err());
        let wire = v.0.expect("Request deserializes as an enum");
        let kinds: Vec<&str> = RequestKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            wire,
            kinds.as_slice(),
            "RequestKind must list Request's variants in order"
        );
        for (i, k) in RequestKind::ALL.iter().enumerate() {
            assert_eq!(usize::from(k.opcode()), i);
            assert_eq!(RequestKind::from_opcode(k.opcode()), Some(*k));
        }
        assert_eq!(
            RequestKind::from_opcode(RequestKind::ALL.len() as u16),
            None
        );
    }

    #[test]
    fn an_encoded_request_begins_with_its_opcode() {
        // postcard writes the variant's position as a varint: one byte below 128.
        let reqs = [
            Request::Status,
            Request::Authenticate { token: vec![1, 2] },
            Request::Append {
                instance: InstanceId(3),
                ns: NamespaceId(0),
                ino: 9,
                len: 4,
            },
        ];
        for r in reqs {
            let bytes = crate::codec::encode(&r).expect("encodes");
            assert_eq!(u16::from(bytes[0]), r.opcode(), "{}", r.name());
        }
    }

    #[test]
    fn only_metadata_requests_name_a_metadata_service() {
        let read = Request::Read {
            instance: InstanceId(1),
            fragment: 0,
            file: surge_core::FileId {
                ns: NamespaceId(2),
                ino: 5,
            },
            offset: 0,
            len: 1,
        };
        assert_eq!(read.namespace(), None);
        assert_eq!(
            read.scope(),
            Scope::Namespace(InstanceId(1), NamespaceId(2))
        );
        let stats = Request::NamespaceStats {
            instance: InstanceId(1),
            ns: NamespaceId(2),
        };
        assert_eq!(stats.namespace(), Some((InstanceId(1), NamespaceId(2))));
        assert!(stats.facts().read_only);
        assert_eq!(Request::Status.facts().sender, Sender::Admin);
    }
}
