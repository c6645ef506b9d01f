//! The job lifecycle's phases (`surge_run::lifecycle`, what `surge run` and `surge bb` both
//! call) against the embedded manager and servers, without FUSE: every byte moves as a manager
//! stage task (run as the job's owner by `surge stage worker`), every change to a cache is
//! made through the native client, and each test checks what the manager says of the
//! session, its instances and its stage tasks, and the bytes on the "PFS".

mod common;
use common::*;
use std::path::{Path, PathBuf};
use surge_api::v1 as api;
use surge_run::embedded::{Embedded, EmbeddedOptions};
use surge_run::jobplan;
use surge_run::lifecycle::{self, Alloc, Event, Job, NoMounts, Report, Teardown};

/// One embedded manager at a time (2 cores; and every one shares the test kit's munged).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// An embedded manager with 2 servers of 1 GiB (64 MiB fragments) in a directory of its own,
/// the "PFS" beside it, and a runtime for the phases.
struct Bed {
    emb: Option<Embedded>,
    dir: Scratch,
    rt: tokio::runtime::Runtime,
}

impl Bed {
    fn start(tag: &str) -> Bed {
        static MUNGE: std::sync::Once = std::sync::Once::new();
        // Before any embedded manager starts: they all authenticate with the test kit's munged.
        MUNGE.call_once(|| {
            std::env::set_var(surge_auth::munge::SOCKET_ENV, surge_testkit::munge_socket())
        });
        let dir = Scratch::new(&format!("lifecycle-{tag}"));
        let opts = EmbeddedOptions {
            fast_dir: dir.path().join("fast"),
            state_dir: dir.path().join("state"),
            servers: 2,
            server_capacity: Some(1 << 30),
            granularity: 64 << 20,
        };
        let emb = Embedded::start(&opts, Path::new(SURGE)).expect("embedded manager");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        std::fs::create_dir_all(dir.path().join("pfs")).unwrap();
        Bed {
            emb: Some(emb),
            dir,
            rt,
        }
    }

    fn pfs(&self, rel: &str) -> PathBuf {
        self.dir.path().join("pfs").join(rel)
    }

    fn manager(&self) -> surge_api::Client {
        let addr = self.emb.as_ref().expect("running").manager.clone();
        self.rt
            .block_on(surge_api::connect(&addr))
            .expect("connect")
    }

    /// The job `id` (external id `test:<id>`) of `script`, for this user on one node.
    fn job(&self, id: &str, script: &str) -> Job {
        let directives = surge_core::directives::parse_script("job.sh", script).expect("script");
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Job {
            script: "job.sh".into(),
            directives,
            external_id: format!("test:{id}"),
            label: format!("test job {id}"),
            manager: self.emb.as_ref().expect("running").manager.clone(),
            alloc: Some(Alloc {
                uid,
                gid,
                nodes: 1,
                ..Alloc::default()
            }),
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some(e) = self.emb.take() {
            e.stop();
        }
    }
}

/// Keeps what the phases said, as text.
#[derive(Default)]
struct Said(Vec<String>);

impl Report for Said {
    fn event(&mut self, e: Event<'_>) {
        self.0.push(format!("{e:?}"));
    }
}

impl Said {
    fn any(&self, prefix: &str) -> bool {
        self.0.iter().any(|e| e.starts_with(prefix))
    }
}

fn tasks(m: &mut surge_api::Client, rt: &tokio::runtime::Runtime, s: u64) -> Vec<api::StageTask> {
    rt.block_on(m.list_stages(api::ListStagesRequest { session: s }))
        .expect("stages")
        .into_inner()
        .tasks
}

fn instances(m: &mut surge_api::Client, rt: &tokio::runtime::Runtime) -> Vec<api::Instance> {
    rt.block_on(m.list_instances(api::Empty {}))
        .expect("instances")
        .into_inner()
        .instances
}

fn sessions(m: &mut surge_api::Client, rt: &tokio::runtime::Runtime) -> Vec<api::Session> {
    rt.block_on(m.list_sessions(api::Empty {}))
        .expect("sessions")
        .into_inner()
        .sessions
}

/// Writes `body` to `name` in the root of instance `i` through the native client, committed
/// as a mount's close commits it (the change is journaled when `i` is a cache).
async fn write(m: &mut surge_api::Client, i: &api::Instance, name: &str, body: &[u8]) {
    let c = lifecycle::instance_client(m, i, 0).await.expect("client");
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let a = c
        .create(
            1,
            name.as_bytes(),
            surge_proto::NewNode::File,
            0o644,
            uid,
            gid,
        )
        .await
        .expect("create");
    c.write(a.ino, 0, body).await.expect("write");
    c.commit_write(a.ino, body.len() as u64, surge_proto::TimeSet::Now, false)
        .await
        .expect("commit");
}

/// A scratch job: setup allocates (and a second setup finds the same session), data_in stages
/// every input in as one stage task, data_out stages the results out byte for byte, teardown
/// ends the session and destroys the job instance; a second teardown finds nothing to do.
#[test]
fn a_scratch_jobs_phases_stage_through_manager_tasks_and_leave_nothing() {
    let _one = ONE_AT_A_TIME.lock();
    let bed = Bed::start("scratch");
    let input: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::create_dir_all(bed.pfs("in/sub")).unwrap();
    std::fs::write(bed.pfs("in/a.dat"), &input).unwrap();
    std::fs::write(bed.pfs("in/sub/b.txt"), b"bee\n").unwrap();
    let job = bed.job(
        "1",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\n\
         #DW stage_in type=directory source=in destination=$DW_JOB_STRIPED/data\n\
         #DW stage_out type=directory source=$DW_JOB_STRIPED/data destination=out\n",
    );
    let workdir = bed.pfs("");
    let plan = jobplan::stage_in(&job.directives, &job.script, &workdir).expect("plan");
    let mut m = bed.manager();
    let rt = &bed.rt;
    let mut said = Said::default();

    let s = rt
        .block_on(lifecycle::setup(&mut m, &job, &mut said))
        .expect("setup");
    assert_eq!((s.state.as_str(), s.phase.as_str()), ("active", "setup"));
    assert!(s.instances.iter().any(|i| i.id == s.job_instance));
    let again = rt
        .block_on(lifecycle::setup(&mut m, &job, &mut said))
        .expect("setup again");
    assert_eq!(again.id, s.id, "a setup run again finds the job's session");
    assert!(said.any("AlreadySetUp"), "{:?}", said.0);

    rt.block_on(lifecycle::data_in(&mut m, &job, &plan, &mut said))
        .expect("data_in");
    let ins: Vec<api::StageTask> = tasks(&mut m, rt, s.id)
        .into_iter()
        .filter(|t| t.direction == "in")
        .collect();
    assert_eq!(ins.len(), 1, "{ins:?}");
    assert_eq!(ins[0].state, "done");
    assert_eq!(ins[0].origin, "data_in");
    assert_eq!(ins[0].files_done, 2);
    assert_eq!(ins[0].bytes_done, input.len() as u64 + 4);
    // Run again: the stage-in done is not done twice.
    rt.block_on(lifecycle::data_in(&mut m, &job, &plan, &mut said))
        .expect("data_in again");
    let in_count = tasks(&mut m, rt, s.id)
        .iter()
        .filter(|t| t.direction == "in")
        .count();
    assert_eq!(in_count, 1);

    let failures = rt
        .block_on(lifecycle::data_out(&mut m, &job, &workdir, &mut said))
        .expect("data_out");
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(std::fs::read(bed.pfs("out/a.dat")).unwrap(), input);
    assert_eq!(std::fs::read(bed.pfs("out/sub/b.txt")).unwrap(), b"bee\n");

    // A session is ended only in a state that says it ended: "active" (or a misspelling)
    // would leave it listed as running with its job instance destroyed.
    for bad in ["active", "creating", "drain-pending", "done"] {
        let e = rt
            .block_on(m.end_session(api::EndSessionRequest {
                id: s.id,
                keep_job_instance: false,
                state: bad.into(),
            }))
            .expect_err(bad);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e}");
        assert!(e.message().contains(&format!("'{bad}'")), "{e}");
    }
    let still = sessions(&mut m, rt);
    assert!(
        still.iter().any(|x| x.id == s.id && x.is_active()),
        "{still:?}"
    );

    let how = Teardown {
        hurry: false,
        state: surge_api::states::SessionState::Ended,
        destroy: true,
    };
    let ended = rt
        .block_on(lifecycle::teardown(
            &mut m,
            &job,
            &mut NoMounts,
            &how,
            &mut said,
        ))
        .expect("teardown");
    let e = ended.session.expect("the session");
    assert_eq!(e.state, "ended");
    assert_eq!(ended.kept, None);
    assert!(
        !instances(&mut m, rt).iter().any(|i| i.id == s.job_instance),
        "the job instance is destroyed"
    );
    let mut again = Said::default();
    let ended = rt
        .block_on(lifecycle::teardown(
            &mut m,
            &job,
            &mut NoMounts,
            &how,
            &mut again,
        ))
        .expect("teardown again");
    assert!(ended.failures.is_empty() && ended.kept.is_none());
    assert!(!again.any("Ended"), "nothing ends twice: {:?}", again.0);
}

/// A persistent cache: the job that creates it has it filled (a `fill` task: its PFS file is
/// left on the PFS, read lazily) and drained (a `drain` task while the job runs, `drain_all`
/// after); a change made after the job is drained by the teardown of a job that only
/// destroys it, in a session of its own, before the instance goes.
#[test]
fn a_persistent_cache_is_filled_drained_and_drained_again_before_a_later_job_destroys_it() {
    let _one = ONE_AT_A_TIME.lock();
    let bed = Bed::start("pcache");
    let cache = bed.pfs("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let old: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(cache.join("old.dat"), &old).unwrap();
    let create = bed.job(
        "2",
        &format!(
            "#!/bin/bash\n#BB create_persistent name=lc capacity=64MiB access_mode=striped \
             type=cache pfs={}\ntrue\n",
            cache.display()
        ),
    );
    let mut m = bed.manager();
    let rt = &bed.rt;
    let mut said = Said::default();
    let s = rt
        .block_on(lifecycle::setup(&mut m, &create, &mut said))
        .expect("setup");
    let lc = s
        .instances
        .iter()
        .find(|i| i.name == "lc")
        .expect("the session attaches the cache it creates")
        .clone();
    rt.block_on(lifecycle::data_in(
        &mut m,
        &create,
        &jobplan::StageIn::default(),
        &mut said,
    ))
    .expect("data_in");
    let t = tasks(&mut m, rt, s.id);
    let fill = t
        .iter()
        .find(|t| t.direction == "fill")
        .expect("a fill task");
    assert_eq!(fill.state, "done");
    assert!(
        said.0.iter().any(|e| e.starts_with("Filled")
            && e.contains("lazy_files: 1")
            && e.contains("lazy_bytes: 2000000")
            && e.contains("copied_files: 0")),
        "{:?}",
        said.0
    );
    assert!(
        t.iter()
            .any(|t| t.direction == "drain" && t.state == "running"),
        "{t:?}"
    );
    // The job's change, through the native client.
    rt.block_on(write(&mut m, &lc, "new.txt", b"from the job\n"));
    let failures = rt
        .block_on(lifecycle::data_out(
            &mut m,
            &create,
            &bed.pfs(""),
            &mut said,
        ))
        .expect("data_out");
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        std::fs::read(cache.join("new.txt")).unwrap(),
        b"from the job\n"
    );
    let t = tasks(&mut m, rt, s.id);
    assert!(t
        .iter()
        .any(|t| t.direction == "drain_all" && t.state == "done"));
    assert!(!t.iter().any(|t| t.state == "running"), "{t:?}");
    let how = Teardown {
        hurry: false,
        state: surge_api::states::SessionState::Ended,
        destroy: true,
    };
    rt.block_on(lifecycle::teardown(
        &mut m,
        &create,
        &mut NoMounts,
        &how,
        &mut said,
    ))
    .expect("teardown");
    assert!(instances(&mut m, rt).iter().any(|i| i.name == "lc"));

    // A change nobody drained (made outside any job), then a job that only destroys it.
    rt.block_on(write(&mut m, &lc, "late.txt", b"after the job\n"));
    let destroy = bed.job("3", "#!/bin/bash\n#BB destroy_persistent name=lc\ntrue\n");
    let mut said = Said::default();
    let s3 = rt
        .block_on(lifecycle::setup(&mut m, &destroy, &mut said))
        .expect("setup");
    assert!(s3.instances.is_empty());
    let ended = rt
        .block_on(lifecycle::teardown(
            &mut m,
            &destroy,
            &mut NoMounts,
            &how,
            &mut said,
        ))
        .expect("teardown");
    assert!(ended.failures.is_empty(), "{:?}", ended.failures);
    assert_eq!(
        std::fs::read(cache.join("late.txt")).unwrap(),
        b"after the job\n",
        "drained before it went: {:?}",
        said.0
    );
    assert!(said.any("Drained"), "{:?}", said.0);
    assert!(said.0.iter().any(|e| e.starts_with("Destroyed")
        && e.contains("existed: true")
        && e.contains("ok: true")));
    assert!(!instances(&mut m, rt).iter().any(|i| i.name == "lc"));
    // The drain ran in a session of the job's own, ended.
    let mine: Vec<api::Session> = sessions(&mut m, rt)
        .into_iter()
        .filter(|x| x.external_id == "test:3")
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert!(mine.iter().all(|x| x.state == "ended"), "{mine:?}");
    assert!(!cache.join(".surge-through").exists());
    assert_eq!(std::fs::read(cache.join("old.dat")).unwrap(), old);
}

/// A `#BB create_persistent` run again (the instance is there, its owner's) is taken as it is,
/// by asking the manager for the instance, not by reading its message; the same name for
/// another owner is refused, naming the owner.
#[test]
fn setup_takes_a_persistent_instance_of_the_same_owner_and_refuses_another_owners() {
    let _one = ONE_AT_A_TIME.lock();
    let bed = Bed::start("owner");
    let script = "#!/bin/bash\n#BB create_persistent name=mine capacity=64MiB access_mode=striped \
         type=scratch\ntrue\n";
    let mut m = bed.manager();
    let rt = &bed.rt;
    let mut said = Said::default();
    let first = bed.job("4", script);
    rt.block_on(lifecycle::setup(&mut m, &first, &mut said))
        .expect("setup");
    assert!(said
        .0
        .iter()
        .any(|e| e.starts_with("Persistent") && e.contains("created: true")));
    let id = instances(&mut m, rt)
        .into_iter()
        .find(|i| i.name == "mine")
        .expect("made")
        .id;

    let mut said = Said::default();
    let second = bed.job("5", script);
    rt.block_on(lifecycle::setup(&mut m, &second, &mut said))
        .expect("a second setup of the same owner");
    assert!(
        said.0
            .iter()
            .any(|e| e.starts_with("Persistent") && e.contains("created: false")),
        "{:?}",
        said.0
    );
    let same: Vec<u64> = instances(&mut m, rt)
        .into_iter()
        .filter(|i| i.name == "mine")
        .map(|i| i.id)
        .collect();
    assert_eq!(same, vec![id]);

    let mut other = bed.job("6", script);
    if let Some(a) = other.alloc.as_mut() {
        a.uid = 4242;
        a.gid = 4242;
    }
    let err = rt
        .block_on(lifecycle::setup(&mut m, &other, &mut Said::default()))
        .expect_err("another owner's name");
    let msg = format!("{err:#}");
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    assert!(
        msg.contains("name=mine") && msg.contains(&format!("belongs to uid {me}")),
        "{msg}"
    );
}
