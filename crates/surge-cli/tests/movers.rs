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

    // `surge stage cancel` of a copy running on the mover stops it at its next file. The
    // mover takes its signals with a signal thread (SIGTERM blocked), and its workers inherit
    // that mask: a worker that did not unblock it ran every copy to its end.
    let n = 6000;
    std::fs::create_dir_all(dir.path().join("many")).unwrap();
    for i in 0..n {
        std::fs::write(dir.path().join(format!("many/f{i:05}")), [i as u8; 512]).unwrap();
    }
    std::fs::write(
        &script,
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\nset -e\n\
         id=$(surge stage in --directory many $DW_JOB_STRIPED/many)\n\
         for i in $(seq 400); do\n\
           surge stage status --json $id > st.json\n\
           grep -q '\"files_done\": *[1-9]' st.json && break\n\
           sleep 0.05\n\
         done\n\
         surge stage cancel $id > cancel.out\n\
         surge stage status --json $id > status.json\n\
         ls $DW_JOB_STRIPED/many | wc -l > landed\n\
         ls -a $DW_JOB_STRIPED/many | grep -c surge-stage > temps || true\n",
    )
    .unwrap();
    let out = surge_command()
        .args(["run", "--quiet", "--manager", &m.grpc])
        .arg(&script)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = std::fs::read_to_string(dir.path().join("status.json")).unwrap();
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st[0]["state"], "cancelled", "{st}");
    let landed: u64 = std::fs::read_to_string(dir.path().join("landed"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        landed > 0 && landed < n,
        "the copy stopped part way: {landed} of {n} files in the instance ({st})"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("temps"))
            .unwrap()
            .trim(),
        "0",
        "no temporary left behind"
    );
}
