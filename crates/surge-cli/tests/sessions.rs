//! `surge session end`: a session whose job is gone is ended by hand, its job instance
//! destroyed (or kept with --keep-instance); ending it again does nothing and says so.

mod common;
use common::*;

fn session(m: &Manager, job: &str) -> (u64, u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut api = surge_api::connect_with(&m.grpc, surge_testkit::munge_socket().to_path_buf())
            .await
            .unwrap();
        let s = api
            .create_session(surge_api::v1::CreateSessionRequest {
                job: job.into(),
                job_instance: Some(surge_api::v1::CreateInstanceRequest {
                    capacity: 64 << 20,
                    access_mode: "striped".into(),
                    nodes: 1,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        (s.id, s.job_instance)
    })
}

fn instances(m: &Manager) -> Vec<u64> {
    let v: serde_json::Value =
        serde_json::from_str(&surge(&["instance", "ls", "--json", "--manager", &m.grpc])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_session_is_ended_by_hand_with_or_without_its_instance() {
    let dir = Scratch::new("sessions");
    let c = cluster(2, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);

    let (gone, gone_inst) = session(&m, "gone.sh");
    let (kept, kept_inst) = session(&m, "kept.sh");
    assert!(instances(&m).contains(&gone_inst) && instances(&m).contains(&kept_inst));

    let out = surge(&["session", "end", &gone.to_string(), "--manager", &m.grpc]);
    assert!(out.contains("ended"), "{out}");
    let out = surge(&[
        "session",
        "end",
        &kept.to_string(),
        "--keep-instance",
        "--manager",
        &m.grpc,
    ]);
    assert!(
        out.contains(&format!("job instance {kept_inst} kept")),
        "{out}"
    );
    let left = instances(&m);
    assert!(
        !left.contains(&gone_inst) && left.contains(&kept_inst),
        "{left:?}"
    );
    let ls = surge(&["session", "ls", "--manager", &m.grpc]);
    assert!(!ls.contains("gone.sh") && !ls.contains("kept.sh"), "{ls}");

    // Again: nothing to do, said so (a teardown re-run after a crash must not fail).
    let out = surge(&["session", "end", &gone.to_string(), "--manager", &m.grpc]);
    assert!(out.contains("already ended"), "{out}");
}
