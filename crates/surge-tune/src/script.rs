//! A configuration applied to a job script. The result is an ordinary job script: `#DW` lines
//! the parser accepts, and a short shell block (marked `# surge tune:`) after the directive
//! block, so the tuned script runs under `surge run` or Slurm without the tuner.
//!
//! - **fragments / access mode**: the `#DW jobdw` line is rewritten (capacity = fragments x
//!   granularity); a change of access mode renames `$DW_JOB_STRIPED` <-> `$DW_JOB_PRIVATE`
//!   (and `SURGE_JOB_*`) throughout the script, since both name the job instance.
//! - **hybrid placement**: a stage_in whose source stays on the PFS is dropped, and the block
//!   links its instance path to the PFS path (`ln -sfn`), so the job's paths still work.
//! - **PFS only**: no `#DW jobdw` and no stage directives of the job instance; the job's
//!   variable names a directory on the PFS, every staged input is linked, and each stage_out
//!   becomes a copy made when the job exits (a `trap ... EXIT`).
//! - **MPI-IO hints**: a ROMIO hints file written by the block and named by `ROMIO_HINTS`; with
//!   Open MPI, `OMPI_MCA_io` selects its ROMIO component (its default, OMPIO, ignores the file).
//! - **layout**: the block's first command sets the default layout of the instance's root
//!   (`surge layout set "$DW_JOB_STRIPED" --stripe-count N`; `surge` is on a job's PATH under
//!   `surge run`), before anything the job makes. Directories already staged in have no
//!   default of their own (a directory takes its parent's when it is made), so with staged
//!   directories every directory of the instance gets it (`find ... -type d -exec`); in
//!   private mode under `surge run --nodes N`, every node's namespace (`surge exec --all`). A
//!   layout that cannot be set ends the job: a run measured with another layout would be
//!   recorded as this one.

use crate::space::{instance_rest, pfs_side, Config, Layout};
use std::path::Path;
use surge_core::directives::{parse_script, Directives, DwVariable, StageDirection, StageKind};

/// What rendering needs besides the configuration.
#[derive(Clone, Debug)]
pub struct RenderContext<'a> {
    /// The script's name in messages.
    pub name: &'a str,
    pub granularity: u64,
    /// Directory relative PFS paths are taken in (where the job is submitted from).
    pub cwd: &'a Path,
    /// PFS directory standing in for the job instance in PFS-only runs.
    pub pfs_dir: &'a Path,
    /// Open MPI's ROMIO component name (`romio321`), when Open MPI is installed.
    pub ompi_romio: Option<&'a str>,
    /// Comment lines put at the top of the tune block.
    pub banner: &'a [String],
}

/// Single-quotes a word for the shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn swap_job_var(text: &str, to: &str) -> String {
    let (from_a, from_b, to_a, to_b) = if to == "private" {
        (
            "DW_JOB_STRIPED",
            "SURGE_JOB_STRIPED",
            "DW_JOB_PRIVATE",
            "SURGE_JOB_PRIVATE",
        )
    } else {
        (
            "DW_JOB_PRIVATE",
            "SURGE_JOB_PRIVATE",
            "DW_JOB_STRIPED",
            "SURGE_JOB_STRIPED",
        )
    };
    text.replace(from_b, to_b).replace(from_a, to_a)
}

/// Lines (0-based) a directive starting at `line` (1-based) spans, with its continuations.
fn span(lines: &[&str], line: usize) -> std::ops::Range<usize> {
    let start = line.saturating_sub(1);
    let mut end = start;
    while end < lines.len() {
        let cont = lines[end].trim_end().ends_with('\\');
        end += 1;
        if !cont {
            break;
        }
    }
    start..end
}

/// Index of the first line after the directive block (the first command), or the end.
fn block_end(lines: &[&str]) -> usize {
    for (i, l) in lines.iter().enumerate() {
        if i == 0 && l.starts_with("#!") {
            continue;
        }
        let t = l.trim();
        if !t.is_empty() && !t.starts_with('#') {
            return i;
        }
    }
    lines.len()
}

fn absolute(p: &str, cwd: &Path) -> String {
    let path = Path::new(p);
    if path.is_absolute() {
        p.to_string()
    } else {
        cwd.join(path).display().to_string()
    }
}

/// Shell lines putting a symlink to the PFS side where a stage_in would have copied.
fn link_lines(s: &surge_core::directives::StageDirective, var: &str, cwd: &Path) -> Vec<String> {
    let pfs = absolute(pfs_side(s), cwd);
    let inst = format!("\"${{{var}}}\"/{}", sh_quote(&instance_rest(s)));
    vec![format!(
        "mkdir -p \"$(dirname {inst})\" && ln -sfn {} {inst}",
        sh_quote(&pfs)
    )]
}

/// The copy a stage_out would have made, as a shell command run when the job exits (PFS
/// only: the job writes into the PFS directory standing in for the instance).
fn copy_out(s: &surge_core::directives::StageDirective, var: &str, cwd: &Path) -> String {
    let pfs = absolute(pfs_side(s), cwd);
    let inst = format!("\"${{{var}}}\"/{}", sh_quote(&instance_rest(s)));
    if s.kind == StageKind::Directory {
        format!("mkdir -p {0} && cp -a {inst}/. {0}/", sh_quote(&pfs))
    } else {
        let dir = Path::new(&pfs)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "/".into());
        format!(
            "mkdir -p {} && cp -a {inst} {}",
            sh_quote(&dir),
            sh_quote(&pfs)
        )
    }
}

/// The shell lines setting `layout` as the default of the instance named by `var` (and of the
/// directories `d` stages into it, when it stages any there: they were made before the line
/// runs). A private instance has a namespace per node: under `surge run --nodes N` the others
/// are set through `surge exec --all`.
fn layout_lines(layout: &Layout, d: &Directives, config: &Config, var: &str) -> Vec<String> {
    let staged_dirs = d.stage_in.iter().any(|s| {
        is_job_instance(&s.instance)
            && s.kind == StageKind::Directory
            && !config.on_pfs.contains(pfs_side(s))
    });
    let (set, why) = if staged_dirs {
        (
            format!(
                "find \"${var}\" -type d -exec surge layout set {} {{}} +",
                layout.set_args()
            ),
            format!("files the job makes get layout {layout}, also in the staged directories"),
        )
    } else {
        (
            format!("surge layout set \"${var}\" {}", layout.set_args()),
            format!("files the job makes get layout {layout}"),
        )
    };
    let mut lines = vec![format!("{set} || exit 1  # surge tune: {why}")];
    if var == "DW_JOB_PRIVATE" {
        lines.push(format!(
            "[ \"${{SURGE_NODES:-1}}\" -le 1 ] || surge exec --all -- sh -c {} || exit 1  \
             # surge tune: and in every node's namespace",
            sh_quote(&set)
        ));
    }
    lines
}

fn job_var(mode: &str) -> &'static str {
    if mode == "private" {
        "DW_JOB_PRIVATE"
    } else {
        "DW_JOB_STRIPED"
    }
}

fn is_job_instance(v: &DwVariable) -> bool {
    matches!(v, DwVariable::JobStriped | DwVariable::JobPrivate)
}

/// The job script for `config`. Fails if the script does not parse (it was checked before
/// tuning, so this means a bug) or has no `#DW jobdw`.
pub fn render(text: &str, config: &Config, ctx: &RenderContext) -> anyhow::Result<String> {
    let original = parse_script(ctx.name, text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(j0) = &original.jobdw else {
        anyhow::bail!("{}: no `#DW jobdw` to tune", ctx.name);
    };
    let written_mode = j0.access_mode.as_str();
    let mode = if config.pfs_only() {
        written_mode
    } else {
        config.mode.as_str()
    };
    let text = if mode != written_mode {
        swap_job_var(text, mode)
    } else {
        text.to_string()
    };
    // Renaming the variable keeps every line where it was: the original's line numbers and
    // paths (read without their variable) still describe the text.
    let d: &Directives = &original;
    let j = j0;
    let lines: Vec<&str> = text.lines().collect();
    let mut drop = vec![false; lines.len()];
    let mut replace: Vec<Option<String>> = vec![None; lines.len()];
    let var = job_var(mode);
    let mut block = Vec::new();
    block.extend(ctx.banner.iter().map(|b| format!("# surge tune: {b}")));

    let jspan = span(&lines, j.line);
    for i in jspan.clone() {
        drop[i] = true;
    }
    if config.pfs_only() {
        block.push(format!(
            "export {var}={}  # PFS only: no burst buffer",
            sh_quote(&ctx.pfs_dir.display().to_string())
        ));
        block.push(format!("mkdir -p \"${var}\""));
    } else {
        // First, so the directories the block and the job make inherit it.
        if let Some(l) = &config.layout {
            block.extend(layout_lines(l, d, config, var));
        }
        replace[jspan.start] = Some(format!(
            "#DW jobdw type=scratch access_mode={mode} capacity={}{}",
            surge_core::capacity_text(config.fragments.saturating_mul(ctx.granularity)),
            j.pool
                .as_ref()
                .map(|p| format!(" pool={p}"))
                .unwrap_or_default()
        ));
    }
    let mut at_exit = Vec::new();
    for s in d.stage_in.iter().chain(d.stage_out.iter()) {
        if !is_job_instance(&s.instance) {
            continue;
        }
        let out = s.direction == StageDirection::Out;
        if config.pfs_only() || (!out && config.on_pfs.contains(pfs_side(s))) {
            for i in span(&lines, s.line) {
                drop[i] = true;
            }
            if out {
                at_exit.push(copy_out(s, var, ctx.cwd));
            } else {
                block.extend(link_lines(s, var, ctx.cwd));
            }
        }
    }
    if !at_exit.is_empty() {
        // stage_out's copy, when the job ends (as stage_out: also after a failure).
        let cmds = at_exit.join("; ");
        block.push(format!("trap {} EXIT", sh_quote(&cmds)));
    }
    if !config.hints.is_empty() {
        block.push("export ROMIO_HINTS=\"${TMPDIR:-/tmp}/surge-tune-romio-hints.$$\"".to_string());
        let hints: Vec<String> = config
            .hints
            .iter()
            .map(|(k, v)| sh_quote(&format!("{k} {v}")))
            .collect();
        block.push(format!(
            "printf '%s\\n' {} > \"$ROMIO_HINTS\"",
            hints.join(" ")
        ));
        if let Some(romio) = ctx.ompi_romio {
            block.push(format!(
                "export OMPI_MCA_io={romio}  # Open MPI: its ROMIO component reads ROMIO_HINTS"
            ));
        }
    }

    let end = block_end(&lines);
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        if i == end {
            for b in &block {
                out.push_str(b);
                out.push('\n');
            }
        }
        if let Some(r) = &replace[i] {
            out.push_str(r);
            out.push('\n');
        } else if !drop[i] {
            out.push_str(l);
            out.push('\n');
        }
    }
    if end == lines.len() {
        for b in &block {
            out.push_str(b);
            out.push('\n');
        }
    }
    // What we print must parse, as the advice does.
    parse_script(ctx.name, &out).map_err(|e| {
        anyhow::anyhow!("surge tune made a script its parser refuses (a bug): {e}\n{out}")
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::StripeCount;
    use std::collections::{BTreeMap, BTreeSet};

    const JOB: &str = "#!/bin/bash\n\
#SBATCH -N 1\n\
#DW jobdw type=scratch access_mode=striped capacity=1GiB\n\
#DW stage_in type=directory source=inputs destination=$DW_JOB_STRIPED/in\n\
#DW stage_in type=file source=/pfs/namelist destination=$DW_JOB_STRIPED/\n\
#DW stage_out type=directory source=$DW_JOB_STRIPED/out \\\n\
#DW destination=/pfs/results\n\
set -e\n\
./app $DW_JOB_STRIPED/in $DW_JOB_STRIPED/namelist $DW_JOB_STRIPED/out\n";

    fn ctx<'a>(banner: &'a [String]) -> RenderContext<'a> {
        RenderContext {
            name: "job.sh",
            granularity: 256 << 20,
            cwd: Path::new("/home/u"),
            pfs_dir: Path::new("/pfs/scratch"),
            ompi_romio: Some("romio321"),
            banner,
        }
    }

    fn config(f: u64, mode: &str) -> Config {
        Config {
            fragments: f,
            mode: mode.into(),
            on_pfs: BTreeSet::new(),
            hints: BTreeMap::new(),
            layout: None,
        }
    }

    #[test]
    fn fragments_and_mode_rewrite_the_jobdw_and_the_variables() {
        let out = render(JOB, &config(3, "private"), &ctx(&[])).unwrap();
        assert!(out.contains("#DW jobdw type=scratch access_mode=private capacity=768MiB\n"));
        assert!(!out.contains("DW_JOB_STRIPED"), "{out}");
        assert!(out.contains("./app $DW_JOB_PRIVATE/in"));
        let d = parse_script("job.sh", &out).unwrap();
        assert_eq!(d.stage_in.len(), 2);
        assert_eq!(d.stage_out.len(), 1);
    }

    #[test]
    fn hybrid_drops_the_stage_and_links_the_pfs_path() {
        let mut c = config(1, "striped");
        c.on_pfs.insert("/pfs/namelist".into());
        c.hints.insert("romio_cb_write".into(), "enable".into());
        let banner = vec!["fragments=1".to_string()];
        let out = render(JOB, &c, &ctx(&banner)).unwrap();
        let d = parse_script("job.sh", &out).unwrap();
        assert_eq!(d.stage_in.len(), 1, "{out}");
        assert!(out.contains(
            "mkdir -p \"$(dirname \"${DW_JOB_STRIPED}\"/'namelist')\" && ln -sfn '/pfs/namelist' \"${DW_JOB_STRIPED}\"/'namelist'"
        ), "{out}");
        assert!(out.contains("printf '%s\\n' 'romio_cb_write enable' > \"$ROMIO_HINTS\""));
        assert!(out.contains("export OMPI_MCA_io=romio321"));
        // The block sits after the directives, before the first command.
        let block = out.find("# surge tune: fragments=1").unwrap();
        assert!(block > out.find("#DW stage_out").unwrap() && block < out.find("set -e").unwrap());
    }

    #[test]
    fn pfs_only_has_no_burst_buffer_and_links_every_staged_path() {
        let out = render(JOB, &config(0, "striped"), &ctx(&[])).unwrap();
        let d = parse_script("job.sh", &out).unwrap();
        assert!(d.is_empty(), "{out}");
        assert!(out.contains("export DW_JOB_STRIPED='/pfs/scratch'"));
        assert!(
            out.contains("ln -sfn '/home/u/inputs' \"${DW_JOB_STRIPED}\"/'in'"),
            "{out}"
        );
        // The stage_out is a copy when the job exits.
        assert!(
            out.contains(
                "trap 'mkdir -p '\\''/pfs/results'\\'' && cp -a \"${DW_JOB_STRIPED}\"/'\\''out'\\''/. '\\''/pfs/results'\\''/' EXIT"
            ),
            "{out}"
        );
    }

    const FILE_JOB: &str = "#!/bin/bash\n\
#DW jobdw type=scratch access_mode=striped capacity=1GiB\n\
#DW stage_in type=file source=/pfs/namelist destination=$DW_JOB_STRIPED/namelist\n\
\n\
./app $DW_JOB_STRIPED/namelist $DW_JOB_STRIPED/out\n";

    fn with_layout(mut c: Config, count: StripeCount, size: Option<u64>) -> Config {
        c.layout = Some(Layout {
            stripe_count: count,
            stripe_size: size,
        });
        c
    }

    #[test]
    fn a_layout_is_set_on_the_instance_root_before_the_first_command() {
        let c = with_layout(config(4, "striped"), StripeCount::All, Some(1 << 20));
        let banner = vec!["fragments=4".to_string()];
        let out = render(FILE_JOB, &c, &ctx(&banner)).unwrap();
        let line =
            "surge layout set \"$DW_JOB_STRIPED\" --stripe-count all --stripe-size 1MiB || exit 1";
        let at = out.find(line).unwrap_or_else(|| panic!("{out}"));
        // After the directives and the banner, before the job's first command.
        assert!(at > out.find("# surge tune: fragments=4").unwrap(), "{out}");
        assert!(at < out.find("./app").unwrap(), "{out}");
        assert_eq!(out.matches("surge layout set").count(), 1, "{out}");
        assert!(!out.contains("surge exec"), "{out}");
        assert!(parse_script("job.sh", &out).is_ok());
    }

    #[test]
    fn the_mounts_choice_sets_no_layout() {
        let out = render(FILE_JOB, &config(4, "striped"), &ctx(&[])).unwrap();
        assert!(!out.contains("surge layout"), "{out}");
    }

    #[test]
    fn a_layout_follows_the_access_mode_and_reaches_the_staged_directories() {
        // JOB stages a directory in: it was made before the line runs and has no default, so
        // every directory of the instance gets the layout.
        let c = with_layout(config(2, "private"), StripeCount::Count(1), None);
        let out = render(JOB, &c, &ctx(&[])).unwrap();
        assert!(
            out.contains(
                "find \"$DW_JOB_PRIVATE\" -type d -exec surge layout set --stripe-count 1 {} + || exit 1"
            ),
            "{out}"
        );
        // Every node has a namespace of its own: under surge run --nodes N, all are set.
        assert!(
            out.contains(
                "[ \"${SURGE_NODES:-1}\" -le 1 ] || surge exec --all -- sh -c 'find \"$DW_JOB_PRIVATE\" -type d -exec surge layout set --stripe-count 1 {} +' || exit 1"
            ),
            "{out}"
        );
        // The staged directory left on the PFS is a link: then only the root needs it.
        let mut c = c;
        c.on_pfs.insert("inputs".into());
        let out = render(JOB, &c, &ctx(&[])).unwrap();
        assert!(
            out.contains("surge layout set \"$DW_JOB_PRIVATE\" --stripe-count 1 || exit 1"),
            "{out}"
        );
        // The layout comes before the links the block makes (their directories inherit it).
        assert!(out.find("surge layout set").unwrap() < out.find("ln -sfn").unwrap());
    }

    #[test]
    fn pfs_only_has_no_layout_to_set() {
        let c = with_layout(config(0, "striped"), StripeCount::All, None);
        let out = render(JOB, &c, &ctx(&[])).unwrap();
        assert!(!out.contains("surge layout"), "{out}");
    }
}
