//! `surge stage copy` as a command (run_copy), against real in-process servers.

mod common;

use clap::Parser;
use common::*;
use surge_stage::cli::{run_copy, CopyArgs};

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    copy: CopyArgs,
}

fn copy_args(server: &str, instance: u64, rest: &[&str]) -> CopyArgs {
    let id = instance.to_string();
    let key = surge_testkit::key_file().to_str().unwrap().to_string();
    let mut v = vec![
        "copy",
        "--server",
        server,
        "--instance",
        &id,
        "--key-file",
        &key,
    ];
    v.extend_from_slice(rest);
    Cli::try_parse_from(v).expect("arguments").copy
}

#[test]
fn copy_in_and_out_exits_zero_and_a_missing_source_is_an_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = rt.block_on(Cluster::start("cli", 2, 64 << 20, 1 << 20));
    let server = c.servers[0].tcp_addr().to_string();
    let src = c.path().join("src");
    make_tree(&src, 1 << 20);
    let _ = snapshot(&src);
    let before = snapshot(&src);
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();

    let code = run_copy(copy_args(
        &server,
        c.instance.0,
        &[
            "--in",
            "--directory",
            "--chunk-size",
            "1MiB",
            &s(&src),
            "/in",
        ],
    ))
    .unwrap();
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );
    let out = c.path().join("out");
    let code = run_copy(copy_args(
        &server,
        c.instance.0,
        &[
            "--out",
            "--directory",
            "--checksum",
            "--json",
            "/in",
            &s(&out),
        ],
    ))
    .unwrap();
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );
    let d = diff(&before, &snapshot(&out));
    assert!(d.is_empty(), "{}", d.join("\n"));

    // A file into a directory (DST ending in /), then back.
    let code = run_copy(copy_args(
        &server,
        c.instance.0,
        &["--in", &s(&src.join("multi.bin")), "/files/"],
    ))
    .unwrap();
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );
    let back = c.path().join("multi.back");
    run_copy(copy_args(
        &server,
        c.instance.0,
        &["--out", "/files/multi.bin", &s(&back)],
    ))
    .unwrap();
    assert!(std::fs::read(&back).unwrap() == std::fs::read(src.join("multi.bin")).unwrap());

    let e = run_copy(copy_args(
        &server,
        c.instance.0,
        &["--in", "--directory", &s(&c.path().join("nothing")), "/x"],
    ))
    .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    drop(c);
}
