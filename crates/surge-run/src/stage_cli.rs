//! `surge stage`: staging from inside a running job (the libdatawarp calls
//! `dw_stage_file_in`, `dw_query_file_stage`, `dw_wait_file_stage` are the model), and `surge
//! stage copy` for direct copies by hand.

use crate::nodes::NodesFile;
use crate::progress::wait_stage;
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use surge_api::v1 as api;
use surge_core::format_bytes;
use surge_manager::cli::{connect, runtime, status_err};
use surge_manager::views;
use surge_stage::{ItemKind, StageItem};

/// Copy between the PFS and a burst-buffer instance.
///
/// Inside a job (`surge run` sets $SURGE_RUN_DIR and $SURGE_MANAGER), `in` and `out` start a
/// copy run by the manager and print its task id at once; `status` and `wait` follow tasks.
///
/// Examples:
///   surge stage in  /pfs/proj/big.dat $DW_JOB_STRIPED/big.dat
///   surge stage out --directory $DW_JOB_STRIPED/results /pfs/proj/results --wait
///   surge stage wait
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct StageArgs {
    #[command(subcommand)]
    pub command: StageCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum StageCommand {
    /// Copy a file or directory from the PFS into an instance mounted in this job.
    In(InOut),
    /// Copy a file or directory from an instance mounted in this job to the PFS.
    Out(InOut),
    /// Show stage tasks of this job (all, or the given ids).
    Status {
        tasks: Vec<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Wait for stage tasks of this job (all, or the given ids); fails if any failed.
    Wait { tasks: Vec<u64> },
    /// Copy directly between the PFS and an instance (by hand: no job, no manager).
    Copy(surge_stage::cli::CopyArgs),
}

#[derive(clap::Args, Debug)]
pub struct InOut {
    /// Source: a PFS path (in) or a path in a mounted instance (out).
    pub source: PathBuf,
    /// Destination: a path in a mounted instance (in) or a PFS path (out).
    pub destination: PathBuf,
    /// Copy a directory's contents (DataWarp's type=directory) instead of one file.
    #[arg(long)]
    pub directory: bool,
    /// Wait for the copy to finish (with progress) instead of returning its task id.
    #[arg(long)]
    pub wait: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run_stage(args: StageArgs) -> anyhow::Result<ExitCode> {
    if let StageCommand::Copy(a) = args.command {
        return surge_stage::cli::run_copy(a);
    }
    let nodes = NodesFile::from_env()?;
    runtime()?.block_on(async move {
        let mut c = connect(&nodes.manager).await?;
        match args.command {
            StageCommand::In(a) => return start(&mut c, &nodes, "in", a).await,
            StageCommand::Out(a) => return start(&mut c, &nodes, "out", a).await,
            StageCommand::Status { tasks, json } => {
                let all = c
                    .list_stages(api::ListStagesRequest {
                        session: nodes.session,
                    })
                    .await
                    .map_err(status_err)?
                    .into_inner()
                    .tasks;
                let shown: Vec<_> = all
                    .into_iter()
                    .filter(|t| tasks.is_empty() || tasks.contains(&t.id))
                    .collect();
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&serde_json::Value::Array(
                            shown.iter().map(views::stage_json).collect()
                        ))?
                    );
                } else {
                    println!(
                        "{:>6} {:<4} {:<8} {:>14} {:>22} {:>8}  error",
                        "task", "dir", "state", "files", "bytes", "seconds"
                    );
                    for t in shown {
                        println!(
                            "{:>6} {:<4} {:<8} {:>14} {:>22} {:>8.2}  {}",
                            t.id,
                            t.direction,
                            t.state,
                            format!("{}/{}", t.files_done, t.files_total),
                            format!(
                                "{}/{}",
                                format_bytes(t.bytes_done),
                                format_bytes(t.bytes_total)
                            ),
                            t.seconds,
                            t.error
                        );
                    }
                }
            }
            StageCommand::Wait { tasks } => {
                let all = c
                    .list_stages(api::ListStagesRequest {
                        session: nodes.session,
                    })
                    .await
                    .map_err(status_err)?
                    .into_inner()
                    .tasks;
                let mut failed = 0;
                for t in all
                    .into_iter()
                    .filter(|t| tasks.is_empty() || tasks.contains(&t.id))
                {
                    let label = format!("stage {} task {}", t.direction, t.id);
                    let done = wait_stage(&mut c, t, &label, false, || false).await?;
                    if done.state != "done" {
                        failed += 1;
                        eprintln!("surge stage: task {} failed: {}", done.id, done.error);
                    }
                }
                if failed > 0 {
                    return Ok(ExitCode::FAILURE);
                }
            }
            StageCommand::Copy(_) => unreachable!("handled above"),
        }
        Ok(ExitCode::SUCCESS)
    })
}

async fn start(
    c: &mut surge_api::v1::manager_client::ManagerClient<tonic::transport::Channel>,
    nodes: &NodesFile,
    direction: &str,
    a: InOut,
) -> anyhow::Result<ExitCode> {
    let (inst_side, pfs_side) = if direction == "in" {
        (&a.destination, &a.source)
    } else {
        (&a.source, &a.destination)
    };
    let (mount, inner) = nodes.locate(inst_side).with_context(|| {
        format!(
            "{} is not in a burst-buffer mount of this job (mounts: {})",
            inst_side.display(),
            nodes
                .nodes
                .iter()
                .flat_map(|n| n.mounts.iter().map(|m| m.path.display().to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let pfs = std::path::absolute(pfs_side)
        .with_context(|| format!("bad path {}", pfs_side.display()))?;
    let item = StageItem {
        kind: if a.directory {
            ItemKind::Directory
        } else {
            ItemKind::File
        },
        pfs,
        instance_path: inner,
    };
    let t = c
        .start_stage(api::StartStageRequest {
            session: nodes.session,
            instance: mount.instance,
            namespace: mount.ns,
            direction: direction.into(),
            items_json: serde_json::to_string(&[item])?,
            workers: 0,
            checksum: false,
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let t = if a.wait {
        wait_stage(c, t, &format!("stage {direction}"), false, || false).await?
    } else {
        t
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&views::stage_json(&t))?);
    } else if t.state == "failed" {
        eprintln!("surge stage: task {} failed: {}", t.id, t.error);
    } else {
        println!("{}", t.id);
    }
    Ok(if t.state == "failed" {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
