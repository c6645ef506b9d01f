//! An install a site runs (docs/INSTALL.md): the systemd units name real `surge` subcommands
//! and flags, the example configuration file gives every daemon a command line it accepts, a
//! manager and a server started from a configuration file pass `surge doctor`, which names
//! each fault of a broken host (a key file others can read, munged not answering, a port
//! another program holds, a device others can read), and `packaging/deb/build.sh` (what `make
//! deb` runs) builds a package that installs (in a private overlay of /etc, /usr and /var),
//! creates the service user and its directories, and purges.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `(status ok, stdout + stderr)` of a command.
fn output(c: &mut Command) -> (bool, String) {
    let o = c.output().expect("run a command");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// The example configuration, runnable on this host: its admin group is the service user's,
/// which a host without the package lacks (the manager looks it up when it starts).
fn example_config(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("contrib/surge.toml")).unwrap();
    assert!(text.contains("admin_group = \"surge\""));
    let text = if Command::new("getent")
        .args(["group", "surge"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        text
    } else {
        eprintln!("no group surge on this host: the example's admin_group is root here");
        text.replace("admin_group = \"surge\"", "admin_group = \"root\"")
    };
    let p = dir.join("surge.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The units' ExecStart lines: the executable and its arguments.
fn units() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(repo().join("contrib/systemd")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "service") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let exec: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("ExecStart="))
            .collect();
        assert_eq!(exec.len(), 1, "{}: one ExecStart", p.display());
        let words: Vec<String> = exec[0].split_whitespace().map(String::from).collect();
        assert_eq!(
            words[0],
            "/usr/local/bin/surge",
            "{}: make install and the package rewrite this path",
            p.display()
        );
        assert!(text.contains("[Install]\nWantedBy=multi-user.target"));
        out.push((
            p.file_name().unwrap().to_string_lossy().into_owned(),
            words[1..].to_vec(),
        ));
    }
    out.sort();
    out
}

#[test]
fn the_units_run_real_subcommands_with_flags_the_example_configuration_completes() {
    let dir = Scratch::new("units");
    let cfg = example_config(dir.path());
    let units = units();
    let names: Vec<&str> = units.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "surge-agent.service",
            "surge-manager.service",
            "surge-mover.service",
            "surge-passthrough-helper.service",
            "surge-server.service"
        ]
    );
    let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    for (unit, args) in &units {
        // The unit's own arguments with this test's copy of the configuration file, through
        // the daemon's own flag parser (`surge config show` starts nothing).
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if a == "/etc/surge/surge.toml" {
                    cfg.display().to_string()
                } else {
                    a.clone()
                }
            })
            .collect();
        let (good, out) = output(Command::new(SURGE).args(["config", "show"]).args(&args));
        assert!(
            good,
            "{unit}: `surge config show {}`:\n{out}",
            args.join(" ")
        );
        let sub = args[0].as_str();
        assert!(
            out.lines()
                .next()
                .unwrap_or("")
                .contains(&format!("surge {sub} ")),
            "{unit}: {out}"
        );
        if unit != "surge-passthrough-helper.service" {
            assert!(
                args.windows(2)
                    .any(|w| w[0] == "--config" && w[1] == cfg.display().to_string()),
                "{unit} reads the configuration file"
            );
        }
        let want: &[&str] = match sub {
            "manager" => &[
                "--state /var/lib/surge/manager.db",
                "--listen 0.0.0.0:7060",
                "--pool nvme",
                "--key-file /etc/surge/surge.key",
                "--stage-on auto",
            ],
            "server" => &[
                "--device /nvme0/surge",
                "--capacity 3TiB",
                "--manager mgr:7060",
                "--pool nvme",
            ],
            "agent" | "mover" => &["--manager mgr:7060"],
            _ => &["--socket /run/surge/passthrough.sock"],
        };
        for w in want {
            assert!(out.contains(w), "{unit}: no `{w}` in:\n{out}");
        }
        if sub == "server" {
            let adv = format!("--advertise {host}:7070");
            assert!(out.contains(&adv), "%h is the host: no `{adv}` in:\n{out}");
        }
    }
    // Every section of the example, at once, and a flag the unit's daemon does not have.
    let (good, out) = output(Command::new(SURGE).args(["config", "check"]).arg(&cfg));
    assert!(good, "{out}");
    for s in ["manager", "server", "agent", "mover", "passthrough_helper"] {
        assert!(out.contains(&format!("OK    [{s}]")), "{out}");
    }
    let (good, out) = output(
        Command::new(SURGE)
            .args(["config", "show", "agent", "--config"])
            .arg(&cfg)
            .arg("--slots=4"),
    );
    assert!(!good && out.contains("--slots"), "{out}");

    // systemd's own reading of the units, with this build as the executable.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        for (unit, _) in &units {
            let text = std::fs::read_to_string(repo().join("contrib/systemd").join(unit))
                .unwrap()
                .replace("/usr/local/bin/surge", SURGE)
                .replace("User=surge", "User=root")
                .replace("Group=surge", "Group=root");
            let p = dir.path().join(unit);
            std::fs::write(&p, text).unwrap();
            let (good, out) = output(
                Command::new("systemd-analyze")
                    .args(["verify", "--man=no"])
                    .arg(&p),
            );
            let problems: Vec<&str> = out
                .lines()
                .filter(|l| {
                    l.contains(unit)
                        && !l.contains("munge.service")
                        && !l.contains("slurmd.service")
                })
                .collect();
            assert!(
                good || problems.is_empty(),
                "systemd-analyze verify {unit}:\n{out}"
            );
            assert!(problems.is_empty(), "systemd-analyze verify {unit}:\n{out}");
        }
    } else {
        eprintln!("no systemd-analyze: the units' syntax is not checked by systemd");
    }
}

/// A free TCP port on loopback (bound, then released for the daemon).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn doctor(role: &str, config: &Path, extra: &[&str]) -> (bool, String) {
    output(
        Command::new(SURGE)
            .env_remove("SURGE_KEY_FILE")
            .env_remove(surge_auth::munge::SOCKET_ENV)
            .env_remove("SURGE_MANAGER")
            .args(["doctor", "--role", role, "--config"])
            .arg(config)
            .args(extra),
    )
}

#[test]
fn a_host_configured_by_the_file_passes_the_doctor_and_each_fault_is_named() {
    let dir = Scratch::new("doctor");
    let d = dir.path();
    // As the package installs it: the manager runs as root, the server as the service user,
    // which owns the cluster key and the device and registers as a member of the manager's
    // admin group (its own group).
    let svc = "surge-svctest";
    let (svc_uid, svc_gid) = system_user(svc);
    let key = d.join("surge.key");
    std::fs::copy(surge_testkit::key_file(), &key).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&key, Some(svc_uid), Some(svc_gid)).unwrap();
    let munge = surge_testkit::munge_socket();
    let device = d.join("dev0");
    std::fs::create_dir(&device).unwrap();
    std::fs::set_permissions(&device, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&device, Some(svc_uid), Some(svc_gid)).unwrap();
    let (mport, sport) = (free_port(), free_port());
    let cfg_text = format!(
        "[cluster]\nmanager = \"127.0.0.1:{mport}\"\nkey_file = \"{key}\"\nmunge_socket = \"{munge}\"\npool = \"nvme\"\n\n\
         [manager]\nstate = \"{state}\"\nlisten = \"127.0.0.1:{mport}\"\ngranularity = \"64MiB\"\n\
         liveness_interval = 0.2\nadmin_group = {svc_gid}\nstage_on = \"local\"\n\n\
         [server]\ndevices = [\"{device}\"]\ncapacity = \"256MiB\"\nlisten = \"127.0.0.1:{sport}\"\n",
        key = key.display(),
        munge = munge.display(),
        state = d.join("state/manager.db").display(),
        device = device.display(),
    );
    let cfg = d.join("surge.toml");
    std::fs::write(&cfg, &cfg_text).unwrap();

    // Before the daemons run: the ports are free, the manager does not answer.
    let (good, out) = doctor("manager", &cfg, &[]);
    assert!(!good, "{out}");
    assert!(out.contains(&format!("127.0.0.1:{mport} is free")), "{out}");
    assert!(out.contains("FAIL  manager"), "{out}");

    // The daemons, started from the file alone (plus where to say they are ready).
    let daemon = |sub: &str, log: &str, uid: u32, gid: u32| {
        use std::os::unix::process::CommandExt;
        ChildGuard(
            Command::new(SURGE)
                .uid(uid)
                .gid(gid)
                .env_remove("SURGE_KEY_FILE")
                .env_remove(surge_auth::munge::SOCKET_ENV)
                .env_remove("SURGE_MANAGER")
                .args([sub, "--config"])
                .arg(&cfg)
                .stderr(std::fs::File::create(d.join(log)).unwrap())
                .spawn()
                .unwrap(),
        )
    };
    let _manager = daemon("manager", "manager.log", 0, 0);
    let _server = daemon("server", "server.log", svc_uid, svc_gid);
    wait_for(
        "the server up in pool nvme",
        Duration::from_secs(30),
        || {
            let o = surge_command()
                .args([
                    "pool",
                    "ls",
                    "--json",
                    "--manager",
                    &format!("127.0.0.1:{mport}"),
                ])
                .output()
                .ok()?;
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            v.as_array()?
                .iter()
                .any(|p| p["name"] == "nvme" && p["servers_up"] == 1)
                .then_some(())
        },
    );

    let (good, out) = doctor("manager", &cfg, &[]);
    assert!(good, "{out}");
    let admin = match accounts_has("slurm") {
        // SlurmUser exists here and is not in the test's admin group: said, not a failure.
        true => format!("WARN  admin      slurm is not in the admin group {svc}"),
        false => format!("OK    admin      admin group {svc} (gid {svc_gid})"),
    };
    for want in [
        "OK    munge",
        &format!(
            "OK    key        {} (0600, {svc} (uid {svc_uid}))",
            key.display()
        ),
        &format!("127.0.0.1:{mport} is bound by surge manager (pid"),
        "nvme (1/1 servers up)",
        &admin,
    ] {
        assert!(out.contains(want), "no `{want}` in:\n{out}");
    }
    let (good, out) = doctor("server", &cfg, &[]);
    assert!(
        good && out.contains("is bound by surge server (pid")
            && out.contains(&format!("{svc} (uid {svc_uid})")),
        "the doctor finds the server's user from the running server: {out}"
    );
    let (good, out) = doctor("server", &cfg, &["--json"]);
    assert!(good, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["failed"], 0, "{out}");
    let status = |name: &str| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["check"] == name)
            .map(|c| c["status"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    for c in [
        "config",
        "munge",
        "key",
        "device",
        "port",
        "manager",
        "registered",
    ] {
        assert_eq!(status(c), ["ok"], "{c}: {out}");
    }

    // A key file others can read.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (good, out) = doctor("server", &cfg, &[]);
    assert!(!good, "{out}");
    assert!(
        out.contains(&format!(
            "FAIL  key        {}: mode 0644: other users can read it",
            key.display()
        )) && out.contains(&format!("fix: chmod 600 {}", key.display())),
        "{out}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Owned by another user than the one the daemon runs as.
    let (good, out) = doctor("server", &cfg, &["--as", "nobody"]);
    assert!(!good, "{out}");
    assert!(
        out.contains(&format!(
            "owned by {svc} (uid {svc_uid}), but the daemon runs as nobody"
        )) && out.contains(&format!("chown nobody: {}", key.display())),
        "{out}"
    );
    // A key in a directory the daemon's user cannot enter (`surge key create` makes a missing
    // one 0700).
    let locked = d.join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::copy(&key, locked.join("surge.key")).unwrap();
    let broken = d.join("broken-keydir.toml");
    std::fs::write(
        &broken,
        cfg_text.replace(
            &key.display().to_string(),
            &locked.join("surge.key").display().to_string(),
        ),
    )
    .unwrap();
    let (good, out) = doctor("server", &broken, &["--as", "nobody"]);
    assert!(!good, "{out}");
    assert!(
        out.contains(&format!(
            "its directory {} is 0700: nobody cannot reach it",
            locked.display()
        )) && out.contains(&format!("chmod 755 {}", locked.display())),
        "{out}"
    );
    // A device others can read.
    std::fs::set_permissions(&device, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (good, out) = doctor("server", &cfg, &[]);
    assert!(!good, "{out}");
    assert!(
        out.contains(&format!("FAIL  device     {}: mode 0755", device.display())),
        "{out}"
    );
    std::fs::set_permissions(&device, std::fs::Permissions::from_mode(0o700)).unwrap();

    // munged not answering: a socket file no munged serves any more.
    let dead = d.join("dead-munge");
    {
        let daemon = surge_auth::munge::Daemon::start(&dead).expect("a munged of our own");
        assert!(surge_auth::munge::answers(&daemon.socket));
    }
    let dead_socket = dead.join("munge.socket");
    let broken = d.join("broken-munge.toml");
    std::fs::write(
        &broken,
        cfg_text.replace(
            &munge.display().to_string(),
            &dead_socket.display().to_string(),
        ),
    )
    .unwrap();
    let (good, out) = doctor("server", &broken, &[]);
    assert!(!good, "{out}");
    assert!(
        out.contains(&format!("FAIL  munge      {}", dead_socket.display())),
        "{out}"
    );

    // The manager's port held by another program (this test).
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let broken = d.join("broken-port.toml");
    std::fs::write(
        &broken,
        cfg_text.replace(
            &format!("listen = \"127.0.0.1:{mport}\""),
            &format!("listen = \"127.0.0.1:{taken}\""),
        ),
    )
    .unwrap();
    let (good, out) = doctor("manager", &broken, &[]);
    assert!(!good, "{out}");
    assert!(
        out.contains(&format!(
            "FAIL  port       127.0.0.1:{taken} is bound by another program: pid {}",
            std::process::id()
        )),
        "{out}"
    );
    drop(squatter);

    // A mistake in the file: the doctor and the daemon name the line.
    let broken = d.join("broken-size.toml");
    std::fs::write(&broken, cfg_text.replace("\"256MiB\"", "\"256MB!\"")).unwrap();
    let (good, out) = doctor("server", &broken, &[]);
    assert!(
        !good && out.contains("FAIL  config") && out.contains("256MB!"),
        "{out}"
    );
    let (good, out) = output(
        Command::new(SURGE)
            .args(["server", "--config"])
            .arg(&broken),
    );
    assert!(!good, "{out}");
    assert!(
        out.contains(&broken.display().to_string())
            && out.contains("line 17")
            && out.contains("256MB!"),
        "{out}"
    );
}

#[test]
fn the_package_installs_the_binary_library_units_and_configuration_and_purges() {
    for tool in ["dpkg-deb", "dpkg-shlibdeps", "unshare"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .status()
                .unwrap()
                .success(),
            "{tool} is missing (apt install dpkg-dev util-linux)"
        );
    }
    let dir = Scratch::new("deb");
    let d = dir.path();
    let bin = Path::new(SURGE);
    // Built by cargo with this test (surge-datawarp is a dev-dependency), as libdatawarp.rs finds it.
    let debug = bin.parent().unwrap();
    let lib = [
        debug.join("libdatawarp.so"),
        debug.join("deps/libdatawarp.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("no libdatawarp.so in {} or its deps/", debug.display()));
    // Built by cargo with the workspace's tests (crates/surge-preload/tests/exports.rs).
    let preload = debug.join("deps/libsurge_preload.so");
    assert!(preload.exists(), "{} is missing", preload.display());
    let t = std::time::Instant::now();
    let (good, out) = output(
        Command::new(repo().join("packaging/deb/build.sh"))
            .args(["--fast", "--surge"])
            .arg(bin)
            .arg("--libdatawarp")
            .arg(&lib)
            .arg("--preload")
            .arg(&preload)
            .arg("--out")
            .arg(d),
    );
    assert!(good, "{out}");
    let deb = PathBuf::from(out.lines().last().unwrap().trim());
    eprintln!(
        "built {} in {:.1} s",
        deb.display(),
        t.elapsed().as_secs_f64()
    );

    let (good, list) = output(Command::new("dpkg-deb").arg("-c").arg(&deb));
    assert!(good, "{list}");
    for f in [
        "./usr/bin/surge",
        "./usr/lib/libdatawarp.so",
        "./usr/lib/surge/libsurge_preload.so",
        "./usr/include/datawarp.h",
        "./lib/systemd/system/surge-manager.service",
        "./lib/systemd/system/surge-server.service",
        "./lib/systemd/system/surge-agent.service",
        "./lib/systemd/system/surge-mover.service",
        "./lib/systemd/system/surge-passthrough-helper.service",
        "./etc/surge/surge.toml",
        "./usr/share/doc/surge/INSTALL.md",
        "./usr/share/surge/slurm/job_submit.lua",
    ] {
        assert!(
            list.lines().any(|l| l.ends_with(f)),
            "{f} is not in the package:\n{list}"
        );
    }
    let field = |f: &str| output(Command::new("dpkg-deb").args(["-f"]).arg(&deb).arg(f)).1;
    let depends = field("Depends");
    for dep in ["libc6", "fuse3", "munge"] {
        assert!(depends.contains(dep), "Depends: {depends}");
    }
    let (_, conffiles) = output(
        Command::new("dpkg-deb")
            .args(["-I"])
            .arg(&deb)
            .arg("conffiles"),
    );
    assert_eq!(conffiles.trim(), "/etc/surge/surge.toml");

    let host_before = host_state();
    // Install it for real, in a mount namespace whose /etc, /usr and /var are overlays (the
    // host's own stay untouched): the post-install makes the service user and directories.
    let script = format!(
        r#"set -e
for t in etc usr var; do
    mkdir -p {d}/ov/$t-up {d}/ov/$t-work
    mount -t overlay overlay -o lowerdir=/$t,upperdir={d}/ov/$t-up,workdir={d}/ov/$t-work /$t
done
# No systemd of the host's is told anything from here.
if [ -d /run/systemd ]; then mount -t tmpfs tmpfs /run/systemd; fi
getent passwd surge >/dev/null && userdel surge || true
getent group surge >/dev/null && groupdel surge || true
dpkg -i {deb}
echo "user: $(getent passwd surge | cut -d: -f1,6,7)"
echo "etc: $(stat -c '%a %U %G' /etc/surge)"
echo "state: $(stat -c '%a %U %G' /var/lib/surge)"
echo "unit: $(grep ^ExecStart= /lib/systemd/system/surge-server.service)"
echo "user-of-server: $(grep ^User= /lib/systemd/system/surge-server.service)"
echo "lib: $(ldconfig -p | grep -c libdatawarp.so)"
echo "slurm: $(grep -h '^local SURGE = ' /usr/share/surge/slurm/*.lua | sort -u)"
/usr/bin/surge config show server --config /etc/surge/surge.toml | head -1
dpkg --purge surge
echo "after purge: $(ls /usr/bin/surge /etc/surge/surge.toml 2>&1 | grep -c 'No such file')"
"#,
        d = d.display(),
        deb = deb.display()
    );
    let (good, out) = output(Command::new("unshare").args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]));
    assert!(good, "{out}");
    for want in [
        "user: surge:/var/lib/surge:/usr/sbin/nologin",
        "etc: 755 root root",
        "state: 750 root surge",
        "unit: ExecStart=/usr/bin/surge server --config /etc/surge/surge.toml",
        "user-of-server: User=surge",
        "lib: 1",
        "slurm: local SURGE = \"/usr/bin/surge\"",
        "surge server --device /nvme0/surge",
        "surge key create --key-file /etc/surge/surge.key",
        "after purge: 2",
    ] {
        assert!(out.contains(want), "no `{want}` in:\n{out}");
    }
    assert_eq!(host_state(), host_before, "the host itself is as it was");
}

/// What an install would change on this host: the service user, the binary, the file.
fn host_state() -> (bool, bool, bool) {
    (
        Command::new("getent")
            .args(["passwd", "surge"])
            .output()
            .is_ok_and(|o| o.status.success()),
        Path::new("/usr/bin/surge").exists(),
        Path::new("/etc/surge/surge.toml").exists(),
    )
}

fn accounts_has(user: &str) -> bool {
    Command::new("id")
        .arg(user)
        .output()
        .is_ok_and(|o| o.status.success())
}
