//! Writes the seed inputs of the `frame` and `json_inputs` targets into `seeds/` (real frames of
//! every kind of request, real documents), so the fuzzer starts from what peers and users send.
//! Run from `fuzz/`: `cargo run --example seeds`.

use std::path::Path;
use surge_core::{FileId, InstanceId, NamespaceId};
use surge_proto::codec::{encode, frame_prefix};
use surge_proto::*;

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("seed directory");
    std::fs::write(dir.join(name), bytes).expect("seed file");
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let (instance, ns, file) = (
        InstanceId(42),
        NamespaceId(0),
        FileId {
            ns: NamespaceId(0),
            ino: 2,
        },
    );
    let server = ServerRef {
        id: "bb1".into(),
        addrs: vec!["127.0.0.1:7001".into(), "unix:/run/surge/bb1.sock".into()],
    };
    let desc = InstanceDescriptor {
        instance,
        name: "job-42".into(),
        access_mode: "striped".into(),
        capacity: 1 << 30,
        stripe_size: 8 << 20,
        fragments: vec![FragmentRef {
            index: 0,
            server: server.clone(),
            capacity: 1 << 30,
        }],
        namespaces: vec![NamespaceRef { ns, server }],
    };
    let requests = [
        (Request::Status, &b""[..]),
        (
            Request::Write {
                instance,
                fragment: 0,
                file,
                offset: 4096,
            },
            b"hello",
        ),
        (
            Request::Read {
                instance,
                fragment: 0,
                file,
                offset: 0,
                len: 65536,
            },
            b"",
        ),
        (
            Request::Lookup {
                instance,
                ns,
                parent: 1,
                name: b"a.dat".to_vec(),
            },
            b"",
        ),
        (
            Request::Create {
                instance,
                ns,
                parent: 1,
                name: b"out".to_vec(),
                node: NewNode::Symlink {
                    target: b"../in".to_vec(),
                },
                perm: 0o755,
                uid: 1000,
                gid: 1000,
            },
            b"",
        ),
        (
            Request::NamespaceBatch {
                instance,
                ns,
                ops: vec![
                    BatchOp::CreateFile {
                        parent: 1,
                        name: b"f".to_vec(),
                        ino: 100,
                        perm: 0o644,
                        uid: 0,
                        gid: 0,
                        time: Timestamp::default(),
                    },
                    BatchOp::Unlink {
                        parent: 1,
                        name: b"g".to_vec(),
                        ino: 101,
                    },
                ],
            },
            b"",
        ),
        (
            Request::SetXattr {
                instance,
                ns,
                ino: 1,
                name: b"user.k".to_vec(),
                value: b"v".to_vec(),
                flags: 1,
            },
            b"",
        ),
        (
            Request::CreateNamespace {
                instance,
                ns,
                descriptor: desc.clone(),
                root_uid: 0,
                root_gid: 0,
                root_perm: 0o755,
            },
            b"",
        ),
    ];
    let frames = root.join("frame");
    let mut stream = Vec::new();
    for (i, (req, payload)) in requests.iter().enumerate() {
        let mut w = frame_prefix(req.opcode(), i as u64 + 1, &encode(req), payload.len());
        w.extend_from_slice(payload);
        write(&frames, &format!("{}.bin", req.name()), &w);
        stream.extend_from_slice(&w);
    }
    write(&frames, "pipelined.bin", &stream);
    let reply = Response::Dir {
        entries: vec![DirEntry {
            name: b"x".to_vec(),
            ino: 3,
            kind: FileKind::File,
            cursor: 1,
            attr: None,
        }],
        done: true,
    };
    let mut w = frame_prefix(41 | surge_proto::frame::RESPONSE_BIT, 9, &encode(&reply), 0);
    w.extend_from_slice(&encode(&reply));
    write(&frames, "response-dir.bin", &w);

    let json = root.join("json_inputs");
    let with_tag = |tag: u8, text: String| [vec![tag], text.into_bytes()].concat();
    let d = serde_json::to_string_pretty(&desc).expect("descriptor JSON");
    write(&json, "descriptor.json", &with_tag(0, d));
    let items = r#"[{"kind":"file","pfs":"/scratch/in/a.dat","instance_path":"/in/a.dat"},
 {"kind":"directory","pfs":"/scratch/in","instance_path":"/"}]"#;
    write(&json, "stage-items.json", &with_tag(1, items.to_string()));
    let peaks = r#"{"schema":"surge.peaks/1","path":"/dev/shm","host":"bb1",
 "measured_at":"2026-11-24T10:00:00Z","read_bw":4.2e9,"write_bw":6.4e9,"read_iops":7.0e5,
 "write_iops":6.0e5,"metadata_ops":1.0e4,
 "procs_at_peak":{"read_bw":2,"write_bw":2,"read_iops":2,"write_iops":2,"metadata_ops":1},
 "metadata_detail":{"create":1.0e4,"stat":4.0e5,"open_close":2.0e4,"remove":2.0e4}}"#;
    write(&json, "peaks.json", &with_tag(2, peaks.to_string()));
    println!("seeds written under {}", root.display());
}
