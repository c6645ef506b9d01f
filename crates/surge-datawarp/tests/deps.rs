//! `libdatawarp.so` is linked into users' programs: it must carry the client side only, not
//! the control plane (issue 33 item 4: it linked SQLite, axum, the tuner and the benchmarks
//! through surge-run for one module).

#[test]
fn libdatawarp_links_no_control_plane() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            "surge-datawarp",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && tree.contains("surge-datawarp"),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for forbidden in [
        "rusqlite",
        "axum",
        "surge-manager",
        "surge-run",
        "surge-tune",
        "surge-bench",
    ] {
        assert!(
            !names.contains(&forbidden),
            "libdatawarp depends on {forbidden}:\n{tree}"
        );
    }
}
