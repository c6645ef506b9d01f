//! `surge stage`: staging from inside a running job (the libdatawarp calls
//! `dw_stage_file_in`, `dw_query_file_stage`, `dw_wait_file_stage` are the model), and `surge
//! stage copy` for direct copies by hand.

use crate::job_stage::{self, JobItem, JobStager, When};
use crate::progress::wait_stage;
use std::path::PathBuf;
use std::process::ExitCode;
use surge_api::states::TaskState;
use surge_core::format_bytes;
use surge_manager::cli::runtime;
use surge_manager::views;
use surge_stage::{Direction, ItemKind};

/// Copy between the PFS and a burst-buffer instance.
///
/// Inside a job (`surge run` sets $SURGE_RUN_DIR and $SURGE_MANAGER), `in` and `out` start a
/// copy run by the manager and print its task id at once; `status` and `wait` follow tasks.
///
/// Examples:
///   surge stage in  /pfs/proj/big.dat $DW_JOB_STRIPED/big.dat
///   surge stage out --directory $DW_JOB_STRIPED/results /pfs/proj/results --wait
///   surge stage out --at-job-end $DW_JOB_STRIPED/checkpoint.h5 /pfs/proj/checkpoint.h5
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
        /// Task ids (default: every task of this job).
        tasks: Vec<u64>,
        /// Print the tasks as JSON (the format of the manager's `/v1/stages`).
        #[arg(long)]
        json: bool,
    },
    /// Wait for stage tasks of this job (all, or the given ids); fails if any failed.
    /// Deferred tasks (`out --at-job-end`) and the drains of cache instances are not waited
    /// for: they run until the job ends (`--drained` waits for what the drains have to copy).
    Wait {
        /// Task ids (default: every task of this job).
        tasks: Vec<u64>,
        /// Also wait until the job's cache instances (type=cache) have drained every change
        /// made so far (files closed or fsynced) to their PFS directory: a barrier before
        /// reading the results on the PFS from elsewhere.
        #[arg(long)]
        drained: bool,
    },
    /// Terminate stage tasks: a deferred one never runs, a running one stops (files not
    /// finished are removed).
    Cancel {
        /// Task ids.
        #[arg(required = true)]
        tasks: Vec<u64>,
    },
    /// Copy directly between the PFS and an instance (by hand: no job, no manager).
    Copy(surge_stage::cli::CopyArgs),
    /// Replay a cache instance's journal on its PFS directory (by hand).
    Drain(surge_stage::cli::DrainArgs),
    /// Run one stage task given as JSON on stdin, reporting as JSON lines (what the manager
    /// starts, as the task's owner, for each stage task).
    #[command(hide = true)]
    Worker,
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
    #[arg(long, conflicts_with = "at_job_end")]
    pub wait: bool,
    /// Stage-out only: copy when the job ends (after its script exits, before its instances
    /// are released) instead of now; DataWarp's DW_STAGE_AT_JOB_END.
    #[arg(long)]
    pub at_job_end: bool,
    /// Print the task as JSON instead of its id.
    #[arg(long)]
    pub json: bool,
}

pub fn run_stage(args: StageArgs) -> anyhow::Result<ExitCode> {
    if let StageCommand::Worker = args.command {
        return surge_stage::worker::run();
    }
    if let StageCommand::Copy(a) = args.command {
        return surge_stage::cli::run_copy(a);
    }
    if let StageCommand::Drain(a) = args.command {
        return surge_stage::cli::run_drain(a);
    }
    runtime()?.block_on(async move {
        let mut js = JobStager::from_env().await?;
        let selected = |all: Vec<surge_api::v1::StageTask>, ids: &[u64]| -> Vec<_> {
            all.into_iter()
                .filter(|t| ids.is_empty() || ids.contains(&t.id))
                .collect()
        };
        match args.command {
            StageCommand::In(a) => return start(&mut js, Direction::In, a).await,
            StageCommand::Out(a) => return start(&mut js, Direction::Out, a).await,
            StageCommand::Status { tasks, json } => {
                let shown = selected(js.tasks().await?, &tasks);
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&serde_json::Value::Array(
                            shown.iter().map(views::stage_json).collect()
                        ))?
                    );
                } else {
                    println!(
                        "{:>6} {:<4} {:<9} {:>14} {:>22} {:>8}  error",
                        "task", "dir", "state", "files", "bytes", "seconds"
                    );
                    for t in shown {
                        println!(
                            "{:>6} {:<4} {:<9} {:>14} {:>22} {:>8.2}  {}",
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
            StageCommand::Wait { tasks, drained } => {
                if drained {
                    wait_drained(&mut js).await?;
                }
                let mut failed = 0;
                for t in selected(js.tasks().await?, &tasks) {
                    if t.state == "deferred" || t.state == "cancelled" {
                        continue;
                    }
                    // A cache's drain runs until the job ends (`--drained` waits for what it
                    // has to copy); only a wait that names it waits for its end.
                    if t.direction == "drain" && tasks.is_empty() {
                        continue;
                    }
                    let label = format!("stage {} task {}", t.direction, t.id);
                    let done = wait_stage(js.manager(), t, &label, false, || false).await?;
                    if done.task_state() != Some(TaskState::Done) {
                        failed += 1;
                        eprintln!(
                            "surge stage: task {} failed: {}",
                            done.id,
                            job_stage::failure_message(&done)
                        );
                    }
                }
                if failed > 0 {
                    return Ok(ExitCode::FAILURE);
                }
            }
            StageCommand::Cancel { tasks } => {
                for id in tasks {
                    let t = js.cancel(id).await?;
                    println!("task {} {}", t.id, t.state);
                }
            }
            StageCommand::Copy(_) | StageCommand::Drain(_) | StageCommand::Worker => {
                unreachable!("handled above")
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

async fn start(js: &mut JobStager, direction: Direction, a: InOut) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !(a.at_job_end && direction == Direction::In),
        "--at-job-end is for stage-outs: a stage-in at the end of the job would be lost"
    );
    let (bb, pfs) = match direction {
        Direction::In => (a.destination, a.source),
        Direction::Out => (a.source, a.destination),
    };
    let item = JobItem {
        kind: if a.directory {
            ItemKind::Directory
        } else {
            ItemKind::File
        },
        bb,
        pfs,
    };
    let when = if a.at_job_end {
        When::AtJobEnd
    } else {
        When::Now
    };
    let mut tasks = js.start(direction, &[item], when, 0).await?;
    let t = tasks
        .pop()
        .ok_or_else(|| anyhow::anyhow!("the manager started no task"))?;
    let t = if a.wait {
        wait_stage(
            js.manager(),
            t,
            &format!("stage {}", direction.as_str()),
            false,
            || false,
        )
        .await?
    } else {
        t
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&views::stage_json(&t))?);
    } else if t.task_state() == Some(TaskState::Failed) {
        eprintln!(
            "surge stage: task {} failed: {}",
            t.id,
            job_stage::failure_message(&t)
        );
    } else {
        println!("{}", t.id);
    }
    Ok(if t.task_state() == Some(TaskState::Failed) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Waits until every change made so far in every cache instance the job has mounted is on
/// its PFS directory.
async fn wait_drained(js: &mut JobStager) -> anyhow::Result<()> {
    let ids: std::collections::BTreeSet<u64> = js
        .nodes()
        .nodes
        .iter()
        .flat_map(|n| n.mounts.iter().map(|m| m.instance))
        .collect();
    for id in ids {
        wait_instance_drained(js.manager(), id, None, "surge stage").await?;
    }
    Ok(())
}

/// Waits until every change journaled in cache instance `id` when the wait began is on its PFS
/// directory (later changes are not waited for, so a busy job cannot hold the caller forever);
/// `timeout`: give up (error) after it. A scratch instance has nothing to wait for.
pub async fn wait_instance_drained(
    m: &mut surge_api::Client,
    id: u64,
    timeout: Option<std::time::Duration>,
    who: &str,
) -> anyhow::Result<()> {
    use anyhow::Context;
    // The capability comes with the instance's descriptor.
    let cap = m
        .get_capability(surge_api::v1::GetCapabilityRequest {
            instance: id,
            persistent_name: String::new(),
            namespace: 0,
            all_namespaces: false,
        })
        .await
        .map_err(surge_manager::cli::status_err)?
        .into_inner();
    let desc: surge_proto::InstanceDescriptor = serde_json::from_str(&cap.descriptor_json)
        .with_context(|| format!("instance {id}: bad descriptor"))?;
    let Some(pfs) = desc.cache_pfs.clone() else {
        return Ok(());
    };
    let client = surge_client::InstanceClient::new(
        desc,
        surge_core::NamespaceId(0),
        surge_auth::Token::from_text(&cap.token)?,
    )?;
    let t = std::time::Instant::now();
    let target = client.drain_progress().await?.newest;
    let mut told = false;
    client
        .wait_drained(target, |p| -> anyhow::Result<()> {
            if let Some(limit) = timeout {
                anyhow::ensure!(
                    t.elapsed() < limit,
                    "instance {id}: {} change(s) still not on {pfs} after {} s",
                    p.pending,
                    limit.as_secs()
                );
            }
            if !told && t.elapsed() > std::time::Duration::from_secs(1) {
                eprintln!("{who}: waiting for {} change(s) to reach {pfs}", p.pending);
                told = true;
            }
            Ok(())
        })
        .await?;
    eprintln!(
        "{who}: instance {id} drained to {pfs} ({:.2} s)",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
