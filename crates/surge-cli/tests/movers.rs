//! Data movers (`surge mover`): with `--stage-on movers` the manager copies nothing itself;
//! every stage task of a job runs in a worker the mover starts, and the copies are whole.

mod common;
use common::*;

#[test]
fn stage_tasks_run_on_a_data_mover() {
    if skip_without_fuse("stage_tasks_run_on_a_data_mover") {
        return;
    }
    let dir = Scratch::new("movers");
    let c = cluster(2, "1GiB");
    let m = Manager::start_with(dir.path(), &["--stage-on", "movers"]);
    m.register(&c);
    let _mover = ChildGuard(
        surge_command()
            .args([
                "mover",
                "--manager",
                &m.grpc,
                "--host",
                "mover-test",
                "--slots",
                "2",
            ])
            .stderr(std::fs::File::create(dir.path().join("mover.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let mut data = vec![0u8; 3 << 20];
    Rng(seed() | 1).fill(&mut data);
    std::fs::write(input.join("a"), &data).unwrap();
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\n\
             #DW stage_in type=directory source={in_} destination=$DW_JOB_STRIPED/in\n\
             #DW stage_out type=directory source=$DW_JOB_STRIPED/in destination={out}\n\
             test -s $DW_JOB_STRIPED/in/a\n",
            in_ = input.display(),
            out = dir.path().join("out").display()
        ),
    )
    .unwrap();
    let out = surge_command()
        .args(["run", "--quiet", "--manager", &m.grpc])
        .arg(&script)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let log = std::fs::read_to_string(dir.path().join("manager.log")).unwrap();
    assert!(
        out.status.success(),
        "{}\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(dir.path().join("out/a")).unwrap(), data);
    assert_eq!(
        log.matches("runs on data mover mover-test").count(),
        2,
        "both tasks on the mover:\n{log}"
    );
    let mlog = std::fs::read_to_string(dir.path().join("mover.log")).unwrap();
    assert!(mlog.contains("worker exit status: 0"), "{mlog}");
}
