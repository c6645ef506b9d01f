//! POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`) as the Linux kernel hands
//! them to a FUSE file system: the xattr format (`posix_acl_xattr_header`: a little-endian
//! version 2, then entries of tag u16, perm u16, id u32), and the rules a file system with ACLs
//! keeps itself (`fs/posix_acl.c`): an access ACL sets the mode's permission bits, `chmod`
//! changes the access ACL (`posix_acl_chmod`), a new node in a directory with a default ACL
//! takes it, masked by the create mode (`posix_acl_create`).
//!
//! The kernel checks permissions with the ACLs (FUSE_POSIX_ACL), reading them through
//! getxattr; the metadata server only keeps them (it checks no mode bits of its own).

use surge_proto::{ErrorCode, ErrorReply};

/// The attribute of a node's access ACL.
pub const ACCESS: &[u8] = surge_proto::ACL_ACCESS_XATTR;
/// The attribute of a directory's default ACL.
pub const DEFAULT: &[u8] = surge_proto::ACL_DEFAULT_XATTR;

const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;
/// The most entries an ACL may have here: what fits in an xattr value of the largest size.
pub const MAX_ENTRIES: usize = (surge_proto::XATTR_SIZE_MAX - HEADER) / ENTRY;
/// The id of entries that name nobody (`ACL_UNDEFINED_ID`).
const NO_ID: u32 = u32::MAX;

/// The tag of an entry (`ACL_USER_OBJ` ... `ACL_OTHER`), in the order a valid ACL keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    UserObj,
    User,
    GroupObj,
    Group,
    Mask,
    Other,
}

impl Tag {
    fn code(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }

    fn from_code(code: u16) -> Option<Tag> {
        Some(match code {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    fn named(self) -> bool {
        matches!(self, Tag::User | Tag::Group)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    /// `rwx` bits (0..=7).
    pub perm: u16,
    /// The user or group of a named entry; [`NO_ID`] for the others.
    pub id: u32,
}

/// A valid ACL: one owner, owning group and other entry, a mask when it names anyone, named
/// entries in increasing id order without repeats (`posix_acl_valid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

fn invalid(msg: impl Into<String>) -> ErrorReply {
    ErrorReply::new(ErrorCode::Invalid, msg)
}

impl Acl {
    /// Decodes and checks an ACL in the kernel's xattr format.
    pub fn decode(value: &[u8]) -> Result<Acl, ErrorReply> {
        let (header, body) = value
            .split_first_chunk::<HEADER>()
            .ok_or_else(|| invalid(format!("ACL of {} bytes: no header", value.len())))?;
        let version = u32::from_le_bytes(*header);
        if version != VERSION {
            return Err(invalid(format!("ACL version {version} (only 2 is known)")));
        }
        if body.len() % ENTRY != 0 {
            return Err(invalid(format!(
                "ACL of {} bytes: not a whole number of {ENTRY}-byte entries",
                value.len()
            )));
        }
        let mut entries = Vec::with_capacity(body.len() / ENTRY);
        for e in body.chunks_exact(ENTRY) {
            let code = u16::from_le_bytes([e[0], e[1]]);
            let tag = Tag::from_code(code)
                .ok_or_else(|| invalid(format!("ACL entry with unknown tag {code:#x}")))?;
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            entries.push(Entry {
                tag,
                perm,
                id: if tag.named() { id } else { NO_ID },
            });
        }
        Acl::new(entries)
    }

    /// An ACL of `entries`, checked.
    pub fn new(entries: Vec<Entry>) -> Result<Acl, ErrorReply> {
        if entries.is_empty() || entries.len() > MAX_ENTRIES {
            return Err(invalid(format!(
                "ACL of {} entries (1 to {MAX_ENTRIES})",
                entries.len()
            )));
        }
        let mut named = false;
        for (i, e) in entries.iter().enumerate() {
            if e.perm & !7 != 0 {
                return Err(invalid(format!("ACL entry with permissions {:#o}", e.perm)));
            }
            named |= e.tag.named();
            if let Some(prev) = i.checked_sub(1).map(|p| entries[p]) {
                let in_order = match (prev.tag.cmp(&e.tag), e.tag.named()) {
                    (std::cmp::Ordering::Less, _) => true,
                    (std::cmp::Ordering::Equal, true) => prev.id < e.id,
                    _ => false,
                };
                if !in_order {
                    return Err(invalid(
                        "ACL entries out of order or repeated (owner, users by id, group, \
                         groups by id, mask, other)",
                    ));
                }
            }
        }
        let has = |t: Tag| entries.iter().any(|e| e.tag == t);
        if !has(Tag::UserObj) || !has(Tag::GroupObj) || !has(Tag::Other) {
            return Err(invalid("ACL without an owner, owning group or other entry"));
        }
        if named && !has(Tag::Mask) {
            return Err(invalid("ACL with named entries and no mask"));
        }
        Ok(Acl { entries })
    }

    /// The ACL the permission bits of `mode` stand for (three entries).
    pub fn from_mode(mode: u16) -> Acl {
        let e = |tag, shift: u16| Entry {
            tag,
            perm: (mode >> shift) & 7,
            id: NO_ID,
        };
        Acl {
            entries: vec![e(Tag::UserObj, 6), e(Tag::GroupObj, 3), e(Tag::Other, 0)],
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The ACL in the kernel's xattr format.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.code().to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    fn get(&self, tag: Tag) -> Option<&Entry> {
        self.entries.iter().find(|e| e.tag == tag)
    }

    fn get_mut(&mut self, tag: Tag) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.tag == tag)
    }

    /// True when the mode alone says what the ACL says, so it need not be kept
    /// (`posix_acl_equiv_mode`): only the owner, owning group and other entries (a mask keeps
    /// the owning group's entry apart from the mode's group bits).
    pub fn is_mode(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.tag, Tag::UserObj | Tag::GroupObj | Tag::Other))
    }

    /// `mode` with its permission bits set from the ACL: owner from the owner entry, group
    /// from the mask (the owning group's entry when there is none), other from other.
    pub fn apply_to_mode(&self, mode: u16) -> u16 {
        let bits = |t: Tag| self.get(t).map_or(0, |e| e.perm & 7);
        let group = self
            .get(Tag::Mask)
            .map_or_else(|| bits(Tag::GroupObj), |e| e.perm & 7);
        (mode & !0o777) | bits(Tag::UserObj) << 6 | group << 3 | bits(Tag::Other)
    }

    /// The ACL after `chmod` to `mode` (`posix_acl_chmod`): the owner, the mask (the owning
    /// group's entry when there is none) and other take the new bits; named entries stay.
    pub fn chmod(&mut self, mode: u16) {
        let group = if self.get(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        };
        for (tag, shift) in [(Tag::UserObj, 6), (group, 3), (Tag::Other, 0)] {
            if let Some(e) = self.get_mut(tag) {
                e.perm = (mode >> shift) & 7;
            }
        }
    }

    /// The access ACL of a node made with `mode` in a directory whose default ACL this is,
    /// and the node's mode (`posix_acl_create_masq`): each entry that maps to mode bits keeps
    /// only what `mode` allows and the mode only what the ACL grants; the umask is not used.
    pub fn create_masked(&self, mode: u16) -> (Acl, u16) {
        let mut acl = self.clone();
        let mut mode = mode;
        for e in acl.entries.iter_mut() {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= (mode >> 6) & 7;
                    mode &= (e.perm << 6) | !0o700;
                }
                Tag::Other => {
                    e.perm &= mode & 7;
                    mode &= e.perm | !0o007;
                }
                Tag::User | Tag::Group | Tag::GroupObj | Tag::Mask => {}
            }
        }
        let group = if acl.get(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        };
        if let Some(e) = acl.get_mut(group) {
            e.perm &= (mode >> 3) & 7;
            mode &= (e.perm << 3) | !0o070;
        }
        (acl, mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: Tag, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    /// `user::rw-, user:1001:rwx, group::r--, mask::rwx, other::---`
    fn named_user() -> Acl {
        Acl::new(vec![
            e(Tag::UserObj, 6, NO_ID),
            e(Tag::User, 7, 1001),
            e(Tag::GroupObj, 4, NO_ID),
            e(Tag::Mask, 7, NO_ID),
            e(Tag::Other, 0, NO_ID),
        ])
        .expect("valid")
    }

    #[test]
    fn an_acl_round_trips_through_the_kernels_xattr_format() {
        let acl = named_user();
        let bytes = acl.encode();
        assert_eq!(bytes.len(), 4 + 5 * 8);
        assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
        // user:1001:rwx, little endian: tag 2, perm 7, id 1001.
        assert_eq!(&bytes[12..20], &[2, 0, 7, 0, 0xe9, 0x03, 0, 0]);
        assert_eq!(Acl::decode(&bytes).expect("decodes"), acl);
    }

    #[test]
    fn malformed_acls_are_refused_as_invalid() {
        let good = named_user().encode();
        let code = |v: &[u8]| Acl::decode(v).map(|_| ()).map_err(|e| e.code);
        assert_eq!(code(&good), Ok(()));
        let mut bad_version = good.clone();
        bad_version[0] = 1;
        let mut bad_tag = good.clone();
        bad_tag[4] = 0x40;
        let mut bad_perm = good.clone();
        bad_perm[6] = 8;
        // Other before mask.
        let swapped = Acl {
            entries: vec![
                e(Tag::UserObj, 6, NO_ID),
                e(Tag::GroupObj, 4, NO_ID),
                e(Tag::Other, 0, NO_ID),
                e(Tag::Mask, 7, NO_ID),
            ],
        }
        .encode();
        let twice = Acl {
            entries: vec![
                e(Tag::UserObj, 6, NO_ID),
                e(Tag::User, 7, 5),
                e(Tag::User, 7, 5),
                e(Tag::GroupObj, 4, NO_ID),
                e(Tag::Mask, 7, NO_ID),
                e(Tag::Other, 0, NO_ID),
            ],
        }
        .encode();
        let no_mask = Acl {
            entries: vec![
                e(Tag::UserObj, 6, NO_ID),
                e(Tag::User, 7, 5),
                e(Tag::GroupObj, 4, NO_ID),
                e(Tag::Other, 0, NO_ID),
            ],
        }
        .encode();
        let no_other = &good[..good.len() - 8];
        for v in [
            &good[..3],
            &good[..good.len() - 1],
            &bad_version[..],
            &bad_tag[..],
            &bad_perm[..],
            &swapped[..],
            &twice[..],
            &no_mask[..],
            no_other,
            &[2, 0, 0, 0][..],
        ] {
            assert_eq!(code(v), Err(ErrorCode::Invalid), "{v:?}");
        }
    }

    #[test]
    fn an_access_acl_sets_the_mode_from_owner_mask_and_other() {
        let acl = named_user();
        assert!(!acl.is_mode());
        // The group bits are the mask's, not the owning group's.
        assert_eq!(acl.apply_to_mode(0o4000), 0o4670);
        let plain = Acl::from_mode(0o751);
        assert!(plain.is_mode());
        assert_eq!(plain.apply_to_mode(0o100), 0o751);
        // A mask without named entries still says more than the mode (generic/529).
        let masked = Acl::new(vec![
            e(Tag::UserObj, 0, NO_ID),
            e(Tag::GroupObj, 0, NO_ID),
            e(Tag::Mask, 4, NO_ID),
            e(Tag::Other, 0, NO_ID),
        ])
        .expect("valid");
        assert!(!masked.is_mode());
        assert_eq!(masked.apply_to_mode(0o644), 0o040);
    }

    #[test]
    fn chmod_changes_the_mask_or_the_group_entry_when_there_is_none() {
        let mut acl = named_user();
        acl.chmod(0o640);
        let perms: Vec<_> = acl.entries().iter().map(|e| e.perm).collect();
        // owner rw, named user keeps rwx, owning group keeps r, mask r, other none.
        assert_eq!(perms, [6, 7, 4, 4, 0]);
        let mut plain = Acl::from_mode(0o777);
        plain.chmod(0o750);
        assert_eq!(plain, Acl::from_mode(0o750));
    }

    #[test]
    fn a_default_acl_is_inherited_masked_by_the_create_mode_not_the_umask() {
        let default = named_user();
        // creat(0666): owner rw (of rw), mask rw (of rwx), other none.
        let (acl, mode) = default.create_masked(0o666);
        assert_eq!(mode, 0o660);
        let perms: Vec<_> = acl.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, [6, 7, 4, 6, 0]);
        // mkdir(0777) with a default granting everything gives 0777 whatever the umask.
        let (acl, mode) = Acl::from_mode(0o777).create_masked(0o777);
        assert_eq!((acl, mode), (Acl::from_mode(0o777), 0o777));
        // Without a mask the owning group's entry is masked.
        let (acl, mode) = Acl::from_mode(0o755).create_masked(0o640);
        assert_eq!((acl, mode), (Acl::from_mode(0o640), 0o640));
    }
}
