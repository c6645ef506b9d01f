//! `surge exec --node K -- CMD`: run a command on emulated compute node K of the running job
//! (what `srun` does on a cluster): same working directory, the node's mounts in
//! `$DW_JOB_STRIPED`/`$DW_JOB_PRIVATE`/`$DW_PERSISTENT_STRIPED_<name>`, `$SURGE_NODE=K`.

use crate::embedded::child_setup;
use crate::nodes::NodesFile;
use anyhow::Context;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;

/// Run a command on an emulated compute node of the job started by `surge run`.
///
/// Example (inside a job script run with `surge run --nodes 4`):
///   surge exec --node 2 -- ./worker $DW_JOB_PRIVATE/in
///   surge exec --all -- hostname
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ExecArgs {
    /// The node to run on (0 is the node the script runs on).
    #[arg(long, required_unless_present = "all", conflicts_with = "all")]
    pub node: Option<u32>,
    /// Run on every node at once and wait for all; exits with the first non-zero status.
    #[arg(long)]
    pub all: bool,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

pub fn run_exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let nodes = NodesFile::from_env()?;
    let targets: Vec<u32> = match args.node {
        Some(n) => vec![n],
        None => nodes.nodes.iter().map(|n| n.node).collect(),
    };
    let (prog, rest) = args.command.split_first().context("no command given")?;
    let mut children = Vec::new();
    for k in targets {
        let node = nodes.nodes.iter().find(|n| n.node == k).with_context(|| {
            format!(
                "node {k} does not exist: the job has {} node(s)",
                nodes.nodes.len()
            )
        })?;
        let mut cmd = std::process::Command::new(prog);
        cmd.args(rest).envs(&node.env);
        child_setup(&mut cmd, false);
        children.push((
            k,
            cmd.spawn()
                .with_context(|| format!("cannot run {prog} on node {k}"))?,
        ));
    }
    let mut code = 0;
    for (k, mut c) in children {
        let st = c.wait()?;
        let s = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
        if s != 0 {
            eprintln!("surge exec: node {k}: {prog} exited with status {s}");
            if code == 0 {
                code = s;
            }
        }
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}
