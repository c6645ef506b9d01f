//! `surge quota`: what one user or group may hold at once (capacity, instances, sessions,
//! stage tasks not ended), set by an administrator, listed with what each holds. The manager
//! refuses what would go past a quota, naming it.

use crate::accounts;
use std::process::ExitCode;
use surge_api::v1 as api;
use surge_core::format_bytes;
use surge_manager::cli::{connect, status_err, ManagerAddr};

/// Quotas per user and group (administrators set them; anyone lists them).
///
/// Examples:
///   surge quota set --default --capacity 2TiB --instances 10 --sessions 20 --stage-tasks 64
///   surge quota set --user alice --capacity 20TiB
///   surge quota set --group astro --capacity 100TiB
///   surge quota set --user alice --clear
///   surge quota ls --json
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct QuotaArgs {
    #[command(flatten)]
    pub addr: ManagerAddr,
    #[command(subcommand)]
    pub command: QuotaCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum QuotaCommand {
    /// Set (or --clear) the quota of a user, a group, or the default for every user without
    /// one of their own (root has none unless given one). A limit left out is no limit.
    Set {
        /// A user, by name or uid.
        #[arg(long, group = "who")]
        user: Option<String>,
        /// A group, by name or gid.
        #[arg(long, group = "who")]
        group: Option<String>,
        /// The default of every user without a quota of their own.
        #[arg(long, group = "who")]
        default: bool,
        /// Capacity held at once (instances being created included).
        #[arg(long, value_parser = surge_core::sys::size_arg)]
        capacity: Option<u64>,
        /// Instances held at once (job and persistent).
        #[arg(long)]
        instances: Option<u32>,
        /// Sessions (jobs) open at once.
        #[arg(long)]
        sessions: Option<u32>,
        /// Stage tasks not ended (deferred, queued, running) at once.
        #[arg(long)]
        stage_tasks: Option<u32>,
        /// Remove the quota.
        #[arg(long)]
        clear: bool,
    },
    /// List the quotas with what each user or group holds now.
    Ls {
        /// As JSON: [{"kind", "id", "name", "capacity", ..., "used_capacity", ...}].
        #[arg(long)]
        json: bool,
    },
}

fn uid_of(s: &str) -> anyhow::Result<u32> {
    match s.parse::<u32>() {
        Ok(n) => Ok(n),
        Err(_) => accounts::user_by_name(s)
            .map(|u| u.uid)
            .ok_or_else(|| anyhow::anyhow!("--user {s}: no such user on this host")),
    }
}

fn gid_of(s: &str) -> anyhow::Result<u32> {
    match s.parse::<u32>() {
        Ok(n) => Ok(n),
        Err(_) => accounts::group_by_name(s)
            .ok_or_else(|| anyhow::anyhow!("--group {s}: no such group on this host")),
    }
}

fn name_of(q: &api::Quota) -> String {
    match q.kind.as_str() {
        "default" => "(every other user)".into(),
        "group" => accounts::group_name(q.id).unwrap_or_else(|| q.id.to_string()),
        _ => accounts::user_by_uid(q.id)
            .map(|u| u.name)
            .unwrap_or_else(|| q.id.to_string()),
    }
}

fn limit(n: u64, show: impl Fn(u64) -> String) -> String {
    if n == 0 {
        "-".into()
    } else {
        show(n)
    }
}

pub fn run(args: QuotaArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut c = connect(args.addr.get()?).await?;
        match args.command {
            QuotaCommand::Set {
                user,
                group,
                default,
                capacity,
                instances,
                sessions,
                stage_tasks,
                clear,
            } => {
                let (kind, id) = match (user, group, default) {
                    (Some(u), _, _) => ("user", uid_of(&u)?),
                    (_, Some(g), _) => ("group", gid_of(&g)?),
                    (_, _, true) => ("default", 0),
                    _ => anyhow::bail!("name whose quota: --user, --group or --default"),
                };
                let q = c
                    .set_quota(api::Quota {
                        kind: kind.into(),
                        id,
                        capacity: capacity.unwrap_or(0),
                        instances: instances.unwrap_or(0),
                        sessions: sessions.unwrap_or(0),
                        stage_tasks: stage_tasks.unwrap_or(0),
                        clear,
                        ..Default::default()
                    })
                    .await
                    .map_err(status_err)?
                    .into_inner();
                println!(
                    "quota of {kind} {}: {}",
                    name_of(&q),
                    if clear { "removed" } else { "set" }
                );
            }
            QuotaCommand::Ls { json } => {
                let list = c
                    .list_quotas(api::Empty {})
                    .await
                    .map_err(status_err)?
                    .into_inner()
                    .quotas;
                if json {
                    let v: Vec<serde_json::Value> = list
                        .iter()
                        .map(|q| {
                            serde_json::json!({
                                "kind": q.kind, "id": q.id, "name": name_of(q),
                                "capacity": q.capacity, "instances": q.instances,
                                "sessions": q.sessions, "stage_tasks": q.stage_tasks,
                                "used_capacity": q.used_capacity,
                                "used_instances": q.used_instances,
                                "used_sessions": q.used_sessions,
                                "used_stage_tasks": q.used_stage_tasks,
                            })
                        })
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                    return Ok(ExitCode::SUCCESS);
                }
                if list.is_empty() {
                    println!("(no quotas: nothing limits a user but the pool)");
                    return Ok(ExitCode::SUCCESS);
                }
                println!(
                    "{:<8} {:<20} {:>22} {:>12} {:>12} {:>14}",
                    "kind", "who", "capacity (held)", "instances", "sessions", "stage tasks"
                );
                for q in &list {
                    let pair = |held: u64, lim: String| format!("{held}/{lim}");
                    println!(
                        "{:<8} {:<20} {:>22} {:>12} {:>12} {:>14}",
                        q.kind,
                        name_of(q),
                        format!(
                            "{} / {}",
                            format_bytes(q.used_capacity),
                            limit(q.capacity, format_bytes)
                        ),
                        pair(
                            q.used_instances.into(),
                            limit(q.instances.into(), |n| n.to_string())
                        ),
                        pair(
                            q.used_sessions.into(),
                            limit(q.sessions.into(), |n| n.to_string())
                        ),
                        pair(
                            q.used_stage_tasks.into(),
                            limit(q.stage_tasks.into(), |n| n.to_string())
                        ),
                    );
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
