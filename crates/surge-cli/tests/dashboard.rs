//! The web dashboard (issue 19), in a real headless Chromium: a manager with its HTTP API, two
//! servers, and a `surge run` job that staged a file and is still running. The page, rendered
//! by Chromium with its script, must show the job's session and instance and its stage task
//! with its progress, with the structure a keyboard or screen-reader user needs; a screenshot is
//! written for people to look at.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Chromium, headless, on `url`, with `args` (`--dump-dom`, `--screenshot=...`).
fn headless(browser: &str, url: &str, args: &[&str]) -> std::process::Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1280,1800",
            // Lets the page's script fetch the API and render before the DOM or picture is taken.
            "--virtual-time-budget=9000",
        ])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium")
}

#[test]
fn the_dashboard_shows_a_running_jobs_instance_and_stage_progress() {
    if skip_without_fuse("the_dashboard_shows_a_running_jobs_instance_and_stage_progress") {
        return;
    }
    let Some(browser) = chromium() else {
        skip_without(
            "the_dashboard_shows_a_running_jobs_instance_and_stage_progress",
            "Chromium is not installed",
        );
        return;
    };
    let s = Scratch::new("dash");
    let c = cluster(2, "1GiB");
    let manager = Manager::start(s.path());
    manager.register(&c);
    let (grpc, http) = (manager.grpc.clone(), manager.http.clone());

    // A job that stages 12 MiB in, then waits until the test is done looking.
    let work = Scratch::new("dashjob");
    std::fs::write(work.path().join("big.dat"), vec![5u8; 12 << 20]).unwrap();
    std::fs::write(
        work.path().join("dashjob.sh"),
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\nset -e\n\
         surge stage in --wait big.dat $DW_JOB_STRIPED/big.dat > /dev/null\n\
         touch started\n\
         for i in $(seq 600); do [ -e stop ] && exit 0; sleep 0.1; done\nexit 3\n",
    )
    .unwrap();
    let mut job = ChildGuard(
        Command::new(SURGE)
            .current_dir(work.path())
            .env("SURGE_MANAGER", &grpc)
            .env("SURGE_MUNGE_SOCKET", surge_testkit::munge_socket())
            .args(["run", "dashjob.sh"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.path().join("run.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for("the job to stage in", Duration::from_secs(30), || {
        work.path().join("started").exists().then_some(())
    });
    let sessions: serde_json::Value =
        serde_json::from_str(&surge(&["session", "ls", "--json", "--manager", &grpc])).unwrap();
    let instance = sessions[0]["job_instance"].as_u64().unwrap().to_string();

    // Without a view token the page shows pools and servers, not the job, and says why.
    let anonymous = headless(browser, &format!("http://{http}/"), &["--dump-dom"]);
    let anonymous = String::from_utf8_lossy(&anonymous.stdout).to_string();
    assert!(
        !anonymous.contains("dashjob.sh") && anonymous.contains("Your jobs are not shown"),
        "{anonymous}"
    );
    // `surge dashboard` prints the URL with the caller's view token.
    let url = surge(&["dashboard", "--manager", &grpc]).trim().to_string();
    assert!(url.starts_with(&format!("http://{http}/#token=")), "{url}");
    let dom = headless(browser, &url, &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&dom.stdout).to_string();
    let shown = |what: &str| assert!(dom.contains(what), "the page shows {what:?}:\n{dom}");
    // The running job: its session (phase) and its instance with its use.
    shown("dashjob.sh");
    shown("<td class=\"state-active\">active</td>");
    shown(&format!("<td class=\"num\">{instance}</td>"));
    shown("12 MiB");
    // Its stage task, done, with a progress bar at its end.
    shown("<td class=\"state-done\">done</td>");
    shown("<progress max=\"12582912\" value=\"12582912\" aria-label=\"100% of 12 MiB\">");
    shown("1 active session(s)");
    // Servers up, with a use gauge and the bandwidth plot described in words.
    assert_eq!(
        dom.matches("<td class=\"state-up\">up</td>").count(),
        2,
        "{dom}"
    );
    assert_eq!(
        dom.matches("<polyline ").count(),
        2,
        "one bandwidth line per server: {dom}"
    );
    shown("B/s now</desc>");
    // What a keyboard or screen-reader user relies on.
    assert_eq!(
        dom.matches("<caption>").count(),
        5,
        "every table has a caption"
    );
    shown("role=\"status\" aria-live=\"polite\"");
    shown("<button id=\"pause\" type=\"button\" aria-pressed=\"false\">");
    shown("class=\"skip\" href=\"#main\"");
    shown("role=\"img\" aria-labelledby=\"plot-title plot-desc\"");

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let o = headless(
        browser,
        &url,
        &[&format!("--screenshot={}", shot.display())],
    );
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot ({e}): {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let width = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
    assert_eq!(width, 1280, "the window's width");
    assert!(
        png.len() > 20_000,
        "a rendered page, not a blank one: {} bytes",
        png.len()
    );
    eprintln!("dashboard screenshot: {}", shot.display());

    std::fs::write(work.path().join("stop"), "").unwrap();
    let status = job.0.wait().unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(work.path().join("run.log")).unwrap_or_default()
    );
}
