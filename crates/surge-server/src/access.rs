//! What a connection may do (docs/SECURITY.md): nothing until it presents a capability signed
//! with the cluster key ([`surge_auth::Token`], see [`authenticate`]), then only what the
//! capability covers ([`allowed`]): one instance (or one namespace of it) for one user, or
//! everything for the manager and administrators. A user's creates carry their own uid and one
//! of their groups; only root gives files away.

use surge_auth::{Claims, Key, Rights, Token};
use surge_proto::{BatchOp, ErrorCode, ErrorReply, Owners, Request, Scope, Sender};

fn denied(msg: impl Into<String>) -> ErrorReply {
    ErrorReply::new(ErrorCode::Denied, msg)
}

/// Checks a capability presented with `Authenticate` (`surge_auth::Token::present`) on a
/// connection whose channel binding is `binding`: signed with the cluster key, presented for
/// this very connection, not expired, and (see [`not_revoked`]) for an instance this server
/// holds now.
pub fn authenticate(
    reg: &crate::registry::Registry,
    presented: &[u8],
    binding: &[u8],
) -> Result<Claims, ErrorReply> {
    let claims = check(&reg.key, presented, binding)?;
    not_revoked(reg, Some(&claims))?;
    Ok(claims)
}

/// The signature, channel and expiry checks of [`authenticate`].
fn check(key: &Key, presented: &[u8], binding: &[u8]) -> Result<Claims, ErrorReply> {
    let claims = Token::verify_presented(key, presented, binding, surge_auth::token::now())
        .map_err(|e| denied(e.to_string()))?;
    if claims.rights == Rights::View {
        return Err(denied(
            "a view token is for the manager's HTTP API, not for the servers",
        ));
    }
    Ok(claims)
}

/// Refuses a capability issued for an instance this server no longer holds in the same
/// generation: destroyed (its capabilities are revoked at once, on open connections too), or
/// destroyed and made again under the same id. Capabilities bound to no generation (made
/// with the cluster key by hand, admin ones) pass.
pub fn not_revoked(
    reg: &crate::registry::Registry,
    grant: Option<&Claims>,
) -> Result<(), ErrorReply> {
    let Some(c) = grant else { return Ok(()) };
    if c.rights != Rights::Instance || c.generation == 0 {
        return Ok(());
    }
    match reg.generation(surge_core::InstanceId(c.instance)) {
        Some(g) if g == c.generation => Ok(()),
        Some(_) => Err(denied(format!(
            "capability revoked: instance {} was destroyed and made again",
            c.instance
        ))),
        None => Err(denied(format!(
            "capability revoked: instance {} does not exist here (destroyed)",
            c.instance
        ))),
    }
}

/// The instance and namespace a request is about (`None` for the server as a whole).
fn scope(req: &Request) -> Option<(u64, Option<u32>)> {
    match req.scope() {
        Scope::Server => None,
        Scope::Instance(instance) => Some((instance.0, None)),
        Scope::Namespace(instance, ns) => Some((instance.0, Some(ns.0))),
    }
}

/// The user `grant` acts for may make a node owned by `uid` and `gid`.
fn may_own(grant: &Claims, uid: u32, gid: u32) -> Result<(), ErrorReply> {
    let c = &grant.caller;
    if c.is_root() || grant.rights == Rights::Admin {
        return Ok(());
    }
    if uid != c.uid {
        return Err(denied(format!(
            "uid {} may not make files owned by uid {uid}",
            c.uid
        )));
    }
    if !c.in_group(gid) {
        return Err(denied(format!("uid {} is not in group {gid}", c.uid)));
    }
    Ok(())
}

/// Whether a connection holding `grant` may send `req`.
pub fn allowed(grant: Option<&Claims>, req: &Request) -> Result<(), ErrorReply> {
    let Some(grant) = grant else {
        return Err(denied(format!(
            "{}: this connection has not presented a capability (Authenticate first; `surge` \
             gets one from the manager, or makes one with the cluster key)",
            req.name()
        )));
    };
    // A request about the server as a whole covers no instance; who may send it is the
    // sender check below.
    if let Some((instance, ns)) = scope(req) {
        if !grant.covers(instance, ns) {
            return Err(denied(format!(
                "{} of instance {instance}{}: the capability is for instance {}{}",
                req.name(),
                ns.map(|n| format!(" namespace {n}")).unwrap_or_default(),
                grant.instance,
                grant
                    .ns
                    .map(|n| format!(" namespace {n}"))
                    .unwrap_or_default(),
            )));
        }
    }
    if req.facts().sender == Sender::Admin && grant.rights != Rights::Admin {
        return Err(denied(format!(
            "{} is for the manager and administrators",
            req.name()
        )));
    }
    match req.owners() {
        Owners::None => Ok(()),
        Owners::New { uid, gid } => may_own(grant, uid, gid),
        Owners::Batch(ops) => ops.iter().try_for_each(|op| match op {
            BatchOp::CreateFile { uid, gid, .. } => may_own(grant, *uid, *gid),
            BatchOp::Unlink { .. } | BatchOp::Rmdir { .. } => Ok(()),
        }),
        Owners::Change(set) => {
            let c = &grant.caller;
            if c.is_root() || grant.rights == Rights::Admin {
                return Ok(());
            }
            if set.uid.is_some_and(|u| u != c.uid) {
                return Err(denied("only root gives files to another user"));
            }
            match set.gid {
                Some(g) if !c.in_group(g) => {
                    Err(denied(format!("uid {} is not in group {g}", c.uid)))
                }
                _ => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_auth::Caller;
    use surge_core::{FileId, Ino, InstanceId, NamespaceId};

    fn user(instance: u64, ns: Option<u32>) -> Claims {
        Claims {
            instance,
            ns,
            caller: Caller {
                uid: 1001,
                gid: 1001,
                groups: vec![1001, 50],
            },
            rights: Rights::Instance,
            expires: i64::MAX,
            generation: 0,
        }
    }

    fn read(instance: u64) -> Request {
        Request::Read {
            instance: InstanceId(instance),
            fragment: 0,
            file: FileId {
                ns: NamespaceId(0),
                ino: 5 as Ino,
            },
            offset: 0,
            len: 10,
        }
    }

    fn create(uid: u32, gid: u32) -> Request {
        Request::Create {
            instance: InstanceId(7),
            ns: NamespaceId(0),
            parent: 1,
            name: b"f".to_vec(),
            node: surge_proto::NewNode::File,
            perm: 0o644,
            umask: 0o022,
            uid,
            gid,
            layout: Default::default(),
        }
    }

    #[test]
    fn nothing_without_a_capability_and_only_the_instance_it_names() {
        assert_eq!(allowed(None, &read(7)).unwrap_err().code, ErrorCode::Denied);
        let g = user(7, None);
        assert!(allowed(Some(&g), &read(7)).is_ok());
        assert!(allowed(Some(&g), &read(8)).is_err(), "another instance");
        assert!(
            allowed(Some(&g), &Request::Status).is_err(),
            "administration"
        );
        let admin = Claims {
            rights: Rights::Admin,
            ..user(0, None)
        };
        assert!(allowed(Some(&admin), &Request::Status).is_ok());
        assert!(allowed(Some(&admin), &read(8)).is_ok());
        let one_ns = user(7, Some(1));
        assert!(
            allowed(Some(&one_ns), &read(7)).is_err(),
            "namespace 0's file"
        );
    }

    #[test]
    fn a_user_creates_files_of_their_own_only() {
        let g = user(7, None);
        assert!(allowed(Some(&g), &create(1001, 1001)).is_ok());
        assert!(
            allowed(Some(&g), &create(1001, 50)).is_ok(),
            "a group of theirs"
        );
        assert!(allowed(Some(&g), &create(0, 0)).is_err(), "owner spoofed");
        assert!(
            allowed(Some(&g), &create(1001, 0)).is_err(),
            "group spoofed"
        );
    }

    #[test]
    fn a_key_signs_what_servers_accept() {
        let k = Key::generate().unwrap();
        let t = Token::mint(&k, &user(7, None));
        assert_eq!(check(&k, &t.present(b"c"), b"c").unwrap(), user(7, None));
        let other = Key::generate().unwrap();
        assert!(check(&other, &t.present(b"c"), b"c").is_err());
        assert!(check(&k, &t.present(b"c"), b"another channel").is_err());
        assert!(check(&k, t.bytes(), b"c").is_err(), "the token itself");
        assert!(check(&k, b"garbage", b"c").is_err());
    }
}
