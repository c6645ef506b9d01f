//! Compiles the LD_PRELOAD shim (shim/surge_shim.c) into a shared library in OUT_DIR; the crate
//! embeds it with `include_bytes!`, so `cargo build` is all a user needs (plus a C compiler).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=shim/surge_shim.c");
    println!("cargo:rerun-if-changed=shim/surge_shim.h");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libsurge_shim.so");
    // The cc crate finds the C compiler the same way for every target and honours CC/CFLAGS;
    // it builds static archives only, so the shared-library link is one explicit command.
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .opt_level(2)
        .pic(true)
        .warnings(true)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-shared",
        "-fvisibility=hidden",
        "-fno-delete-null-pointer-checks",
        "-Wall",
        "-Wextra",
        "-o",
    ])
    .arg(&so)
    .arg("shim/surge_shim.c")
    .args(["-ldl", "-lpthread"]);
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run the C compiler for the profiling shim ({e}); install gcc (scripts/setup.sh)")
    });
    if !status.success() {
        panic!("compiling shim/surge_shim.c failed ({status}); see the compiler output above");
    }
}
