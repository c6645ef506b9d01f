// Upstream fuser picks a mount implementation here (pure Rust on Linux, libfuse elsewhere).
// Surge runs on Linux only, so the fork always takes the pure-Rust one.
fn main() {
    println!(
        "cargo::rustc-check-cfg=cfg(fuser_mount_impl, values(\"pure-rust\", \"libfuse2\", \"libfuse3\", \"macos-no-mount\"))"
    );
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    assert!(
        target_os == "linux",
        "surge-fuse supports Linux only (target os: {target_os})"
    );
    println!("cargo::rustc-cfg=fuser_mount_impl=\"pure-rust\"");
}
