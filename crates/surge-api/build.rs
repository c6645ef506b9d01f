fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/surge.proto");
    tonic_prost_build::configure().compile_protos(&["proto/surge.proto"], &["proto"])?;
    Ok(())
}
