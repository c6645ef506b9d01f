//! From a job script's stage directives to stage tasks: which instance each copy fills or
//! empties, the items to copy, and the checks that must pass before anything is allocated (every
//! stage-in source exists, the stage-in fits the job instance).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use surge_core::directives::{
    expand_dw_path, parse_stage_list, Directives, DwVariable, StageDirective, StageKind,
};
use surge_stage::{ItemKind, StageItem};

/// Copies for one instance (and one direction).
#[derive(Clone, Debug, PartialEq)]
pub struct StageGroup {
    pub instance: DwVariable,
    pub items: Vec<StageItem>,
    /// Directive lines the items come from (for messages).
    pub lines: Vec<usize>,
}

/// Path inside the instance named by the `$DW_…` variable `path` starts with.
pub fn instance_path(path: &str, var: &DwVariable) -> Result<String, String> {
    let mut vars = HashMap::new();
    vars.insert(var.env_name(), String::new());
    let p = expand_dw_path(path, &vars).map_err(|e| e.to_string())?;
    Ok(if p.is_empty() { "/".into() } else { p })
}

fn pfs_path(p: &str, cwd: &Path) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

fn push(groups: &mut Vec<StageGroup>, var: &DwVariable, item: StageItem, line: usize) {
    match groups.iter_mut().find(|g| &g.instance == var) {
        Some(g) => {
            g.items.push(item);
            g.lines.push(line);
        }
        None => groups.push(StageGroup {
            instance: var.clone(),
            items: vec![item],
            lines: vec![line],
        }),
    }
}

fn size_of(path: &Path) -> std::io::Result<u64> {
    let md = std::fs::symlink_metadata(path)?;
    if !md.is_dir() {
        return Ok(if md.is_file() { md.len() } else { 0 });
    }
    let mut total = 0;
    for e in std::fs::read_dir(path)? {
        total += size_of(&e?.path())?;
    }
    Ok(total)
}

/// What a script stages in.
#[derive(Clone, Debug, Default)]
pub struct StageIn {
    pub groups: Vec<StageGroup>,
    /// Bytes staged into each instance.
    pub bytes: HashMap<DwVariable, u64>,
}

/// Stage-in: groups per instance and the bytes staged into each, checking every source.
/// Errors name the script line and the path.
pub fn stage_in(d: &Directives, script: &str, cwd: &Path) -> Result<StageIn, Vec<String>> {
    let mut groups = Vec::new();
    let mut bytes: HashMap<DwVariable, u64> = HashMap::new();
    let mut errors = Vec::new();
    for s in &d.stage_in {
        let mut add = |src: &Path,
                       dst: &str,
                       kind: ItemKind,
                       line: usize,
                       errors: &mut Vec<String>| {
            let md = match std::fs::metadata(src) {
                Ok(md) => md,
                Err(e) => {
                    errors.push(format!(
                        "{script}:{line}: stage_in source {} is missing: {e}",
                        src.display()
                    ));
                    return;
                }
            };
            if kind == ItemKind::File && md.is_dir() {
                errors.push(format!(
                    "{script}:{line}: stage_in source {} is a directory but the directive says type=file",
                    src.display()
                ));
                return;
            }
            if kind == ItemKind::Directory && !md.is_dir() {
                errors.push(format!(
                    "{script}:{line}: stage_in source {} is not a directory but the directive says type=directory",
                    src.display()
                ));
                return;
            }
            match instance_path(dst, &s.instance) {
                Ok(p) => {
                    *bytes.entry(s.instance.clone()).or_insert(0) += size_of(src).unwrap_or(0);
                    push(
                        &mut groups,
                        &s.instance,
                        StageItem {
                            kind,
                            pfs: src.to_path_buf(),
                            instance_path: p,
                        },
                        line,
                    );
                }
                Err(e) => errors.push(format!("{script}:{line}: {e}")),
            }
        };
        match s.kind {
            StageKind::File => {
                let dst = s.file_target().unwrap_or_else(|| s.destination.clone());
                add(
                    &pfs_path(&s.source, cwd),
                    &dst,
                    ItemKind::File,
                    s.line,
                    &mut errors,
                );
            }
            StageKind::Directory => add(
                &pfs_path(&s.source, cwd),
                &s.destination,
                ItemKind::Directory,
                s.line,
                &mut errors,
            ),
            // Rabbit's copy_in: a directory's contents, or a file, as the source is.
            StageKind::Any => {
                let src = pfs_path(&s.source, cwd);
                if src.is_dir() {
                    add(
                        &src,
                        &s.destination,
                        ItemKind::Directory,
                        s.line,
                        &mut errors,
                    );
                } else {
                    let dst = s.file_target().unwrap_or_else(|| s.destination.clone());
                    add(&src, &dst, ItemKind::File, s.line, &mut errors);
                }
            }
            StageKind::List => {
                let list = pfs_path(&s.source, cwd);
                let text = match std::fs::read_to_string(&list) {
                    Ok(t) => t,
                    Err(e) => {
                        errors.push(format!(
                            "{script}:{}: stage_in list file {} cannot be read: {e}",
                            s.line,
                            list.display()
                        ));
                        continue;
                    }
                };
                match parse_stage_list(&list.display().to_string(), &text, s) {
                    Ok(entries) => {
                        for e in entries {
                            let src = pfs_path(&e.source, cwd);
                            let kind = if src.is_dir() {
                                ItemKind::Directory
                            } else {
                                ItemKind::File
                            };
                            add(&src, &e.destination, kind, s.line, &mut errors);
                        }
                    }
                    Err(errs) => errors.extend(errs.0.iter().map(|e| e.to_string())),
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(StageIn { groups, bytes })
    } else {
        Err(errors)
    }
}

/// Stage-out: groups per instance. `read_list` reads a list file that lives in an instance
/// (given its `$DW_…` path), through the job's mount.
pub fn stage_out(
    d: &Directives,
    script: &str,
    cwd: &Path,
    read_list: impl Fn(&StageDirective) -> std::io::Result<String>,
) -> Result<Vec<StageGroup>, Vec<String>> {
    let mut groups = Vec::new();
    let mut errors = Vec::new();
    for s in &d.stage_out {
        let mut add =
            |src: &str, dst: &str, kind: ItemKind, errors: &mut Vec<String>| match instance_path(
                src,
                &s.instance,
            ) {
                Ok(p) => push(
                    &mut groups,
                    &s.instance,
                    StageItem {
                        kind,
                        pfs: pfs_path(dst, cwd),
                        instance_path: p,
                    },
                    s.line,
                ),
                Err(e) => errors.push(format!("{script}:{}: {e}", s.line)),
            };
        match s.kind {
            StageKind::File => {
                let dst = s.file_target().unwrap_or_else(|| s.destination.clone());
                add(&s.source, &dst, ItemKind::File, &mut errors)
            }
            StageKind::Directory => {
                add(&s.source, &s.destination, ItemKind::Directory, &mut errors)
            }
            // Rabbit's copy_out: the stager sees what the source is.
            StageKind::Any => add(&s.source, &s.destination, ItemKind::Any, &mut errors),
            StageKind::List => match read_list(s) {
                Ok(text) => match parse_stage_list(&s.source, &text, s) {
                    Ok(entries) => {
                        for e in entries {
                            add(&e.source, &e.destination, ItemKind::File, &mut errors);
                        }
                    }
                    Err(errs) => errors.extend(errs.0.iter().map(|e| e.to_string())),
                },
                Err(e) => errors.push(format!(
                    "{script}:{}: stage_out list file {} cannot be read: {e}",
                    s.line, s.source
                )),
            },
        }
    }
    if errors.is_empty() {
        Ok(groups)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_core::directives::parse_script;

    #[test]
    fn instance_paths_drop_the_variable() {
        let v = DwVariable::JobStriped;
        assert_eq!(
            instance_path("$DW_JOB_STRIPED/in/a.dat", &v).unwrap(),
            "/in/a.dat"
        );
        assert_eq!(instance_path("$DW_JOB_STRIPED", &v).unwrap(), "/");
        assert_eq!(instance_path("${DW_JOB_STRIPED}/x", &v).unwrap(), "/x");
        let p = DwVariable::PersistentStriped("proj".into());
        assert_eq!(
            instance_path("$DW_PERSISTENT_STRIPED_proj/d", &p).unwrap(),
            "/d"
        );
    }

    #[test]
    fn missing_sources_and_wrong_types_are_reported_with_their_lines() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"12345").unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/x"), b"123").unwrap();
        let script = format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n\
             #DW stage_in type=file source={0}/f destination=$DW_JOB_STRIPED/f\n\
             #DW stage_in type=directory source={0}/d destination=$DW_JOB_STRIPED/d\n\
             #DW stage_in type=file source={0}/nope destination=$DW_JOB_STRIPED/n\n\
             #DW stage_in type=file source={0}/d destination=$DW_JOB_STRIPED/n2\n",
            t.path().display()
        );
        let d = parse_script("job.sh", &script).unwrap();
        let errs = stage_in(&d, "job.sh", t.path()).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].starts_with("job.sh:5:") && errs[0].contains("missing"),
            "{errs:?}"
        );
        assert!(
            errs[1].starts_with("job.sh:6:") && errs[1].contains("is a directory"),
            "{errs:?}"
        );
    }

    #[test]
    fn stage_in_counts_bytes_per_instance() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"12345").unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/x"), b"123").unwrap();
        let script = format!(
            "#DW jobdw type=scratch access_mode=striped capacity=1GiB\n\
             #DW stage_in type=file source={0}/f destination=$DW_JOB_STRIPED/\n\
             #DW stage_in type=directory source=d destination=$DW_JOB_STRIPED/in\n",
            t.path().display()
        );
        let d = parse_script("job.sh", &script).unwrap();
        let StageIn { groups, bytes } = stage_in(&d, "job.sh", t.path()).unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].items[0].instance_path, "/f");
        assert_eq!(groups[0].items[1].instance_path, "/in");
        assert_eq!(
            groups[0].items[1].pfs,
            t.path().join("d"),
            "relative to the submit directory"
        );
        assert_eq!(bytes[&DwVariable::JobStriped], 8);
    }
}
