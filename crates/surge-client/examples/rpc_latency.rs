//! Round-trip latency of metadata requests through the native client, without FUSE: what one
//! `stat` or `create` costs on the wire and in the metadata service.
//!
//! cargo run --release -p surge-client --example rpc_latency -- SERVER_ADDR INSTANCE_ID [N]
//! (with the cluster key readable: $SURGE_KEY_FILE or /etc/surge/surge.key)

use std::time::Instant;
use surge_client::InstanceClient;
use surge_core::{InstanceId, NamespaceId};
use surge_proto::{KeepOpen, NewNode};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() >= 3,
        "usage: rpc_latency SERVER_ADDR INSTANCE_ID [N]"
    );
    let n: u64 = args
        .get(3)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);
    let instance: u64 = args[2].parse()?;
    let token = surge_client::auth::for_instance(None, instance, None)?;
    let c = InstanceClient::connect(&args[1], InstanceId(instance), NamespaceId(0), token).await?;
    c.getattr(1).await?;
    println!("through the async pool:");
    run(&c, n).await?;
    println!("from the calling thread (as FUSE threads do):");
    surge_client::blocking::inline(|| {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(run(&c, n)))
    })?;
    Ok(())
}

async fn run(c: &InstanceClient, n: u64) -> anyhow::Result<()> {
    let t = Instant::now();
    for _ in 0..n {
        c.getattr(1).await?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("getattr: {us:.1} us/op ({:.0} ops/s)", 1e6 / us);
    let t = Instant::now();
    for i in 0..n {
        c.create(1, format!("lat-{i}").as_bytes(), NewNode::File, 0o644, 0, 0)
            .await?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("create:  {us:.1} us/op ({:.0} ops/s)", 1e6 / us);
    let t = Instant::now();
    for i in 0..n {
        c.unlink(1, format!("lat-{i}").as_bytes(), KeepOpen::Only(vec![]))
            .await?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("unlink:  {us:.1} us/op ({:.0} ops/s)", 1e6 / us);
    Ok(())
}
