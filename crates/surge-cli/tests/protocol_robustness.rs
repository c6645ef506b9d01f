//! A malformed or truncated frame, an unknown instance, an oversized frame or a stalled peer gets
//! an error reply or a closed connection, never a crash or a hang of the server.

mod common;
use common::wire::{alive, closed, connect, error_code, read_response};
use common::*;
use std::io::{Read, Write};
use surge_core::{FileId, InstanceId, NamespaceId};
use surge_proto::codec::{encode, frame_prefix};
use surge_proto::frame::{Header, MAX_PAYLOAD};
use surge_proto::{ErrorCode, Request, Response};

#[test]
fn malformed_frames_get_errors_or_closed_connections_and_the_server_lives_on() {
    let mut c = cluster(1, "1GiB");
    let addr = c.servers[0].addr.clone();

    // Not our protocol at all.
    let mut s = connect(&addr);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef0123")
        .unwrap();
    assert!(read_response(&mut s).is_none() || closed(&mut s));
    alive(&addr);

    // A header of another protocol version: typed error, then close.
    let mut s = connect(&addr);
    let mut h = Header::request(1, 5, 0, 0);
    h.version = 99;
    s.write_all(&h.encode()).unwrap();
    let r = read_response(&mut s);
    assert_eq!(r.as_ref().map(|r| r.0.request_id), Some(5));
    assert_eq!(error_code(r), ErrorCode::Version);
    assert!(closed(&mut s));

    // A payload larger than the limit: refused before reading it.
    let mut s = connect(&addr);
    s.write_all(&Header::request(16, 6, 0, MAX_PAYLOAD + 1).encode())
        .unwrap();
    assert_eq!(error_code(read_response(&mut s)), ErrorCode::TooLarge);

    // A valid header whose message is garbage.
    let mut s = connect(&addr);
    s.write_all(&frame_prefix(16, 7, &[0xff; 40], 0)).unwrap();
    assert_eq!(error_code(read_response(&mut s)), ErrorCode::Malformed);

    // A frame cut off in the middle, then the peer goes away.
    let mut s = connect(&addr);
    let req = Request::Write {
        instance: InstanceId(1),
        fragment: 0,
        file: FileId {
            ns: NamespaceId(0),
            ino: 2,
        },
        offset: 0,
    };
    let meta = encode(&req).expect("encodes");
    let wire = frame_prefix(req.opcode(), 8, &meta, 1 << 20);
    s.write_all(&wire).unwrap();
    s.write_all(&[1u8; 1000]).unwrap();
    drop(s);

    // A peer that stalls in the middle of a frame does not block anyone else.
    let mut stalled = connect(&addr);
    stalled.write_all(&wire[..10]).unwrap();
    alive(&addr);

    // Requests for instances, fragments and namespaces the server does not hold: typed errors
    // on a connection that stays usable.
    let mut s = connect(&addr);
    let meta = encode(&req).expect("encodes");
    let mut w = frame_prefix(req.opcode(), 9, &meta, 3);
    w.extend_from_slice(b"abc");
    s.write_all(&w).unwrap();
    assert_eq!(
        error_code(read_response(&mut s)),
        ErrorCode::UnknownInstance
    );
    let look = Request::Lookup {
        instance: InstanceId(1),
        ns: NamespaceId(0),
        parent: 1,
        name: b"x".to_vec(),
    };
    s.write_all(&frame_prefix(
        look.opcode(),
        10,
        &encode(&look).expect("encodes"),
        0,
    ))
    .unwrap();
    assert_eq!(
        error_code(read_response(&mut s)),
        ErrorCode::UnknownInstance
    );
    let id = c.create_instance("64MiB", "1MiB", &[]);
    let frag = Request::FragmentUsage {
        instance: InstanceId(id),
        fragment: 3,
    };
    s.write_all(&frame_prefix(
        frag.opcode(),
        11,
        &encode(&frag).expect("encodes"),
        0,
    ))
    .unwrap();
    assert_eq!(
        error_code(read_response(&mut s)),
        ErrorCode::UnknownFragment
    );
    let ns = Request::GetAttr {
        instance: InstanceId(id),
        ns: NamespaceId(4),
        ino: 1,
    };
    s.write_all(&frame_prefix(
        ns.opcode(),
        12,
        &encode(&ns).expect("encodes"),
        0,
    ))
    .unwrap();
    assert_eq!(
        error_code(read_response(&mut s)),
        ErrorCode::UnknownNamespace
    );
    // A metadata request with a bad name gets a typed error too.
    let bad = Request::Create {
        instance: InstanceId(id),
        ns: NamespaceId(0),
        parent: 1,
        name: b"a/b".to_vec(),
        node: surge_proto::NewNode::File,
        perm: 0o644,
        umask: 0o022,
        uid: 0,
        gid: 0,
        layout: Default::default(),
    };
    s.write_all(&frame_prefix(
        bad.opcode(),
        13,
        &encode(&bad).expect("encodes"),
        0,
    ))
    .unwrap();
    assert_eq!(error_code(read_response(&mut s)), ErrorCode::Invalid);
    let st = Request::Status;
    s.write_all(&frame_prefix(
        st.opcode(),
        14,
        &encode(&st).expect("encodes"),
        0,
    ))
    .unwrap();
    assert!(matches!(
        read_response(&mut s),
        Some((_, Response::Status(_)))
    ));

    drop(stalled);
    assert!(
        c.servers[0].is_running(),
        "server crashed:\n{}",
        c.server_logs()
    );
    let logs = c.server_logs();
    assert!(
        logs.contains("closing connection"),
        "malformed frames are logged:\n{logs}"
    );
}

#[test]
fn fuzzed_frames_never_crash_the_server() {
    let mut c = cluster(1, "1GiB");
    let addr = c.servers[0].addr.clone();
    let id = c.create_instance("64MiB", "1MiB", &[]);
    let mut rng = Rng(seed());
    let valid = [
        Request::Status,
        Request::GetAttr {
            instance: InstanceId(id),
            ns: NamespaceId(0),
            ino: 1,
        },
        Request::Read {
            instance: InstanceId(id),
            fragment: 0,
            file: FileId {
                ns: NamespaceId(0),
                ino: 2,
            },
            offset: 0,
            len: 10,
        },
    ];
    for round in 0..300 {
        let mut s = connect(&addr);
        let req = &valid[round % valid.len()];
        let meta = encode(req).expect("encodes");
        let mut wire = frame_prefix(req.opcode(), round as u64, &meta, 0);
        // Flip a few bytes anywhere in the frame (header included), or cut it short.
        for _ in 0..1 + rng.below(3) {
            let i = rng.below(wire.len() as u64) as usize;
            wire[i] ^= 1 << rng.below(8);
        }
        if rng.below(4) == 0 {
            wire.truncate(rng.below(wire.len() as u64) as usize);
        }
        let _ = s.write_all(&wire);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    alive(&addr);
    assert!(
        c.servers[0].is_running(),
        "server crashed:\n{}",
        c.server_logs()
    );
}

/// What a stranger on the network gets: connections that present no capability, a forged one,
/// an expired one or one for another instance are refused on every request, and a large frame
/// before a capability is refused before it is read.
#[test]
fn strangers_get_nothing_without_a_valid_capability() {
    use common::wire::{authenticate, call, connect_anonymous};
    let c = cluster(1, "1GiB");
    let addr = c.servers[0].addr.clone();
    let id = c.create_instance("64MiB", "1MiB", &[]);
    let other = c.create_instance("64MiB", "1MiB", &[]);
    let getattr = |instance: u64| Request::GetAttr {
        instance: InstanceId(instance),
        ns: NamespaceId(0),
        ino: 1,
    };
    let denied = |r: Response| match r {
        Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::Denied, "{e}");
            e.message
        }
        other => panic!("expected a refusal, got {other:?}"),
    };

    // Nothing presented: every request refused, Status too.
    let mut s = connect_anonymous(&addr);
    let m = denied(call(&mut s, 1, &getattr(id), &[]).0);
    assert!(m.contains("Authenticate"), "{m}");
    denied(call(&mut s, 2, &Request::Status, &[]).0);

    // A capability signed with another key, one that expired, one whose bytes were changed.
    let claims = surge_auth::Claims {
        instance: id,
        ns: None,
        caller: surge_auth::Caller::me(),
        rights: surge_auth::Rights::Admin,
        expires: surge_auth::token::now() + 3600,
        generation: 0,
    };
    let scratch = Scratch::new("keys");
    let foreign = surge_auth::Key::create(&scratch.path().join("k")).unwrap();
    let expired = surge_auth::Claims {
        expires: surge_auth::token::now() - 1,
        ..claims.clone()
    };
    let mut tampered = surge_testkit::instance_token(id).present(b"");
    let n = tampered.len();
    tampered[n / 2] ^= 1;
    for (what, token) in [
        (
            "foreign key",
            surge_auth::Token::mint(&foreign, &claims).present(b""),
        ),
        (
            "expired",
            surge_auth::Token::mint(&surge_testkit::key(), &expired).present(b""),
        ),
        ("tampered", tampered),
    ] {
        let mut s = connect_anonymous(&addr);
        let r = call(&mut s, 1, &Request::Authenticate { token }, &[]).0;
        let m = denied(r);
        eprintln!("{what}: {m}");
        denied(call(&mut s, 2, &getattr(id), &[]).0);
    }

    // A valid capability for one instance: that instance answers, the other does not, and
    // administration is refused.
    let mut s = connect_anonymous(&addr);
    authenticate(&mut s, &surge_testkit::instance_token(id));
    assert!(matches!(
        call(&mut s, 1, &getattr(id), &[]).0,
        Response::Attr(_)
    ));
    denied(call(&mut s, 2, &getattr(other), &[]).0);
    denied(call(&mut s, 3, &Request::Status, &[]).0);

    // A 1 MiB write frame before any capability: refused from its header, connection closed.
    let mut s = connect_anonymous(&addr);
    let req = Request::Write {
        instance: InstanceId(id),
        fragment: 0,
        file: FileId {
            ns: NamespaceId(0),
            ino: 2,
        },
        offset: 0,
    };
    s.write_all(&frame_prefix(
        req.opcode(),
        9,
        &encode(&req).expect("encodes"),
        1 << 20,
    ))
    .unwrap();
    // The server stops reading after the header: the payload may not all go out.
    let _ = s.write_all(&[7u8; 64 << 10]);
    let r = read_response(&mut s);
    assert_eq!(r.as_ref().map(|r| r.0.request_id), Some(9));
    assert_eq!(error_code(r), ErrorCode::Denied);
    alive(&addr);
}
