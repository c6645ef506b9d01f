//! The directive parser, by example: every directive, every rule and every error of
//! docs/DIRECTIVES.md, on realistic scripts (tests/scripts/) and on minimal ones.

use std::collections::HashMap;
use surge_core::directives::{
    check_persistent_name, expand_dw_path, parse_script, parse_stage_list, AccessMode, CacheSpec,
    CreatePersistent, DestroyPersistent, DirectiveErrors, Directives, DirtyHigh, DwVariable,
    ExpandError, InstanceType, JobDw, PersistentDw, StageDirection, StageDirective, StageEntry,
    StageKind,
};

const GIB: u64 = 1 << 30;

mod common;
use common::{assert_says, errors, parse, the_error};

const JOBDW: &str = "#DW jobdw type=scratch access_mode=striped capacity=10GiB\n";

fn with_jobdw(rest: &str) -> String {
    format!("#!/bin/bash\n{JOBDW}{rest}")
}

fn stage(
    line: usize,
    kind: StageKind,
    source: &str,
    destination: &str,
    direction: StageDirection,
    instance: DwVariable,
) -> StageDirective {
    StageDirective {
        line,
        kind,
        source: source.to_string(),
        destination: destination.to_string(),
        direction,
        instance,
    }
}

// ---- realistic scripts ------------------------------------------------------------------------

#[test]
fn expbb_listing8_with_slurm_continuations_stages_a_directory_in_and_out() {
    let d = parse(include_str!("scripts/expbb_listing8.sh"));
    assert_eq!(
        d.jobdw,
        Some(JobDw {
            line: 14,
            kind: InstanceType::Scratch,
            access_mode: AccessMode::Striped,
            capacity: 12704 * GIB,
            pool: None,
            targets: None,
            cache: CacheSpec::default(),
        })
    );
    assert_eq!(
        d.stage_in,
        vec![stage(
            15,
            StageKind::Directory,
            "/project/k01/markomg/development/expbb",
            "$DW_JOB_STRIPED",
            StageDirection::In,
            DwVariable::JobStriped
        )]
    );
    assert_eq!(
        d.stage_out,
        vec![stage(
            17,
            StageKind::Directory,
            "$DW_JOB_STRIPED",
            "/project/k01/markomg/back2",
            StageDirection::Out,
            DwVariable::JobStriped
        )]
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn expbb_listing8_as_printed_is_rejected_because_its_continuations_lack_the_prefix() {
    let errors = errors(include_str!("scripts/expbb_listing8_as_printed.sh"));
    let shown = DirectiveErrors(errors.clone()).to_string();
    assert_eq!(errors.len(), 2, "{shown}");
    // The broken continuation, with the fix...
    assert_eq!(errors[0].line, 9, "{shown}");
    assert_says(
        &errors[0],
        &[
            "ends with `\\`",
            "line 10 (`destination=$DW_JOB_STRIPED`) is not a comment",
            "`#DW `",
        ],
    );
    // ...and the stage_out that Slurm would have dropped without a word.
    assert_eq!(errors[1].line, 11, "{shown}");
    assert_says(&errors[1], &["not a directive", "ends at line 10"]);
}

#[test]
fn bhimji_directives_take_keys_in_any_order_and_relative_pfs_paths() {
    let d = parse(include_str!("scripts/bhimji_cori.sh"));
    let jobdw = d.jobdw.expect("jobdw");
    assert_eq!(jobdw.capacity, 1_000_000_000_000);
    assert_eq!(jobdw.access_mode, AccessMode::Striped);
    assert_eq!(d.stage_in[0].source, "file.dat");
    assert_eq!(d.stage_in[0].destination, "$DW_JOB_STRIPED/");
    assert_eq!(d.stage_out[0].destination, "out");
}

#[test]
fn nersc_style_job_stages_a_file_in_and_a_directory_out() {
    let d = parse(include_str!("scripts/nersc_scratch_stage.sh"));
    assert_eq!(d.jobdw.expect("jobdw").capacity, 10_000_000_000);
    assert_eq!(d.stage_in.len(), 1);
    assert_eq!(d.stage_in[0].kind, StageKind::File);
    assert_eq!(d.stage_out[0].kind, StageKind::Directory);
    assert_eq!(d.stage_out[0].source, "$DW_JOB_STRIPED/output");
}

#[test]
fn nersc_style_persistent_lifecycle_create_use_destroy() {
    let create = parse(include_str!("scripts/nersc_persistent_create.sh"));
    assert_eq!(
        create.create_persistent,
        vec![CreatePersistent {
            line: 6,
            name: "cosmo".to_string(),
            capacity: 100_000_000_000,
            access_mode: AccessMode::Striped,
            kind: InstanceType::Scratch,
            pool: None,
            cache: CacheSpec::default(),
        }]
    );
    assert!(create.jobdw.is_none());

    let usage = parse(include_str!("scripts/nersc_persistent_use.sh"));
    assert_eq!(
        usage.persistentdw,
        vec![PersistentDw {
            line: 6,
            name: "cosmo".to_string()
        }]
    );
    let cosmo = DwVariable::PersistentStriped("cosmo".to_string());
    assert_eq!(usage.stage_in[0].instance, cosmo);
    assert_eq!(usage.stage_out[0].instance, cosmo);

    let destroy = parse(include_str!("scripts/nersc_persistent_destroy.sh"));
    assert_eq!(
        destroy.destroy_persistent,
        vec![DestroyPersistent {
            line: 6,
            name: "cosmo".to_string(),
            hurry: true
        }]
    );
}

#[test]
fn camp_private_job_attaches_its_environment_and_stages_a_list_per_node() {
    let d = parse(include_str!("scripts/camp_private.sh"));
    let jobdw = d.jobdw.expect("jobdw");
    assert_eq!(jobdw.access_mode, AccessMode::Private);
    assert_eq!(jobdw.capacity, 12800 * GIB);
    assert_eq!(jobdw.pool.as_deref(), Some("wlm_pool"));
    assert_eq!(d.persistentdw[0].name, "camp_env");
    assert_eq!(d.stage_in[0].kind, StageKind::List);
    assert_eq!(d.stage_in[0].instance, DwVariable::JobPrivate);
}

#[test]
fn a_script_with_many_errors_reports_all_of_them_in_line_order() {
    let errors = errors(include_str!("scripts/many_errors.sh"));
    let shown = DirectiveErrors(errors.clone()).to_string();
    let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
    // 3 bad unit, 4 second jobdw + cache, 5 bad name, 6 PFS destination,
    // 7 $SCRATCH + unattached persistent, 8 swap, 10 after the first command.
    assert_eq!(lines, vec![3, 4, 4, 5, 6, 7, 7, 8, 10], "{shown}");
    assert!(
        shown.starts_with("job.sh:3: `capacity=10XB`: bad capacity"),
        "{shown}"
    );
}

// ---- #DW jobdw --------------------------------------------------------------------------------

#[test]
fn jobdw_with_every_key_is_read() {
    let d = parse("#DW jobdw type=scratch access_mode=private capacity=2TiB pool=nvme\n");
    assert_eq!(
        d.jobdw,
        Some(JobDw {
            line: 1,
            kind: InstanceType::Scratch,
            access_mode: AccessMode::Private,
            capacity: 2 << 40,
            pool: Some("nvme".to_string()),
            targets: None,
            cache: CacheSpec::default(),
        })
    );
}

#[test]
fn capacity_units_are_binary_with_i_and_decimal_without() {
    let cap = |c: &str| {
        parse(&format!(
            "#DW jobdw type=scratch access_mode=striped capacity={c}\n"
        ))
        .jobdw
        .expect("jobdw")
        .capacity
    };
    assert_eq!(cap("10GiB"), 10 * GIB);
    assert_eq!(cap("10GB"), 10_000_000_000);
    assert_eq!(cap("1TiB"), 1 << 40);
    assert_eq!(cap("1TB"), 1_000_000_000_000);
    assert_eq!(cap("4096"), 4096);
}

#[test]
fn capacity_decimal_point_is_honoured_unlike_slurm() {
    let d = parse("#DW jobdw type=scratch access_mode=striped capacity=3.5TB\n");
    assert_eq!(d.jobdw.expect("jobdw").capacity, 3_500_000_000_000);
}

#[test]
fn capacity_with_an_unknown_unit_is_an_error_naming_the_units() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=10XB\n",
        1,
        "capacity=10XB",
    );
    assert_says(&e, &["bad capacity", "unknown unit 'XB'", "GiB", "GB"]);
}

#[test]
fn capacity_without_a_number_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=GiB\n",
        1,
        "capacity=GiB",
    );
    assert_says(&e, &["does not start with a number"]);
}

#[test]
fn zero_capacity_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=0GiB\n",
        1,
        "capacity=0GiB",
    );
    assert_says(&e, &["more than zero"]);
}

/// The `dirty_high` of a cache `jobdw` line with `extra` keys.
fn j_dirty_high(extra: &str) -> Option<DirtyHigh> {
    parse_script(
        "job.sh",
        &format!("#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run {extra}\n"),
    )
    .unwrap()
    .jobdw
    .unwrap()
    .cache
    .dirty_high
}

#[test]
fn type_cache_mirrors_a_pfs_directory() {
    let d = parse_script(
        "job.sh",
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run/ optimization=bandwidth\n",
    )
    .unwrap();
    let j = d.jobdw.unwrap();
    assert_eq!(j.kind, InstanceType::Cache);
    assert_eq!(j.cache.pfs.as_deref(), Some("/lus/run"));
    assert_eq!(j.cache.optimization.as_deref(), Some("bandwidth"));
    assert!(!j.cache.fsync_pfs, "fsync=tier is the default");
    let d = parse_script(
        "job.sh",
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run fsync=pfs\n",
    )
    .unwrap();
    assert!(d.jobdw.unwrap().cache.fsync_pfs);
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run fsync=disk\n",
        1,
        "fsync=disk",
    );
    assert_says(&e, &["unknown fsync `disk`", "pfs", "tier"]);
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB fsync=pfs\n",
        1,
        "fsync=pfs",
    );
    assert_says(&e, &["fsync= is for type=cache"]);
    // The dirty-data high-water mark at which writers wait for the drain.
    assert_eq!(j_dirty_high("dirty_high=50%"), Some(DirtyHigh::Percent(50)));
    assert_eq!(
        j_dirty_high("dirty_high=8GiB"),
        Some(DirtyHigh::Bytes(8 << 30))
    );
    assert_eq!(j_dirty_high("dirty_high=off"), Some(DirtyHigh::Percent(0)));
    assert_eq!(j_dirty_high(""), None, "the default: off");
    assert_eq!(DirtyHigh::DEFAULT.bytes(1000), 0);
    assert_eq!(DirtyHigh::Percent(80).bytes(1000), 800);
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run dirty_high=120%\n",
        1,
        "dirty_high=120%",
    );
    assert_says(&e, &["0% to 100%"]);
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB dirty_high=50%\n",
        1,
        "dirty_high=50%",
    );
    assert_says(&e, &["dirty_high= is for type=cache"]);
    // Kernel passthrough for cache files: on unless turned off.
    let pt = |extra: &str| {
        parse_script(
            "job.sh",
            &format!(
                "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run {extra}\n"
            ),
        )
        .unwrap()
        .jobdw
        .unwrap()
        .cache
        .passthrough
    };
    assert!(pt(""), "passthrough=on is the default");
    assert!(pt("passthrough=on"));
    assert!(!pt("passthrough=off"));
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run passthrough=yes\n",
        1,
        "passthrough=yes",
    );
    assert_says(&e, &["unknown passthrough `yes`", "on", "off"]);
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB passthrough=on\n",
        1,
        "passthrough=on",
    );
    assert_says(&e, &["passthrough= is for type=cache"]);
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB\n",
        1,
        "#DW jobdw type=cache access_mode=striped capacity=1TiB",
    );
    assert_says(&e, &["needs pfs=DIR"]);
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=run\n",
        1,
        "pfs=run",
    );
    assert_says(&e, &["not an absolute path"]);
    let e = the_error(
        "#DW jobdw type=cache access_mode=private capacity=1TiB pfs=/lus/run\n",
        1,
        "access_mode=private",
    );
    assert_says(&e, &["access_mode=striped", "$DW_JOB_STRIPED_CACHE"]);
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run\n\
         #DW stage_out type=directory source=$DW_JOB_STRIPED_CACHE/out destination=/lus/out\n",
        2,
        "source=$DW_JOB_STRIPED_CACHE/out",
    );
    assert_says(&e, &["do not apply", "pfs="]);
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/run\n\
         #DW stage_in type=directory source=/lus/in destination=$DW_JOB_STRIPED/in\n",
        2,
        "destination=$DW_JOB_STRIPED/in",
    );
    assert_says(&e, &["type=cache", "$DW_JOB_STRIPED_CACHE"]);
}

#[test]
fn unknown_type_suggests_the_closest() {
    let e = the_error(
        "#DW jobdw type=scrach access_mode=striped capacity=1TiB\n",
        1,
        "type=scrach",
    );
    assert_says(&e, &["unknown type `scrach`", "did you mean `scratch`?"]);
}

#[test]
fn access_mode_ldbalance_is_read_only_job_replicas() {
    let d = parse_script(
        "job.sh",
        "#DW jobdw type=scratch access_mode=ldbalance capacity=1GiB\n\
         #DW stage_in type=directory source=/pfs/env destination=$DW_JOB_LDBAL/env\n",
    )
    .unwrap();
    assert_eq!(d.jobdw.as_ref().unwrap().access_mode, AccessMode::Ldbalance);
    assert_eq!(d.stage_in[0].instance, DwVariable::JobLdbal);
    let e = the_error(
        "#DW jobdw type=scratch access_mode=ldbalance capacity=1GiB\n\
         #DW stage_out type=directory source=$DW_JOB_LDBAL/out destination=/pfs/out\n",
        2,
        "source=$DW_JOB_LDBAL/out",
    );
    assert_says(&e, &["read-only"]);
    let e = the_error(
        "#DW jobdw type=scratch access_mode=ldbalance capacity=1GiB\n\
         #DW stage_in type=directory source=/pfs/env destination=$DW_JOB_STRIPED/env\n",
        2,
        "destination=$DW_JOB_STRIPED/env",
    );
    assert_says(&e, &["access_mode=ldbalance", "$DW_JOB_LDBAL"]);
    let e = the_error(
        "#BB create_persistent name=env capacity=1GiB access_mode=ldbalance type=scratch\n",
        1,
        "access_mode=ldbalance",
    );
    assert_says(&e, &["job instances", "access_mode=striped"]);
}

#[test]
fn access_mode_striped_and_private_together_is_rejected_as_later_work() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped,private capacity=1TiB\n",
        1,
        "access_mode=striped,private",
    );
    assert_says(
        &e,
        &[
            "not supported yet",
            "choose access_mode=striped or access_mode=private",
        ],
    );
}

#[test]
fn unknown_access_mode_suggests_the_closest() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=stripped capacity=1TiB\n",
        1,
        "access_mode=stripped",
    );
    assert_says(&e, &["did you mean `striped`?"]);
}

#[test]
fn missing_keys_are_one_error_naming_them_all_with_an_example() {
    let e = the_error("#DW jobdw type=scratch\n", 1, "#DW jobdw type=scratch");
    assert_says(
        &e,
        &[
            "missing access_mode= and capacity=",
            "#DW jobdw type=scratch access_mode=striped capacity=100GiB",
        ],
    );
}

#[test]
fn a_key_given_twice_is_an_error_naming_the_first() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB capacity=2TiB\n",
        1,
        "capacity=2TiB",
    );
    assert_says(&e, &["given twice", "`capacity=1TiB`"]);
}

#[test]
fn an_unknown_key_is_an_error_with_a_suggestion_and_the_keys_expected() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capcity=1TiB capacity=1TiB\n",
        1,
        "capcity=1TiB",
    );
    assert_says(
        &e,
        &[
            "unknown key `capcity`",
            "did you mean `capacity`?",
            "type, access_mode, capacity, pool, pfs, optimization, fsync, dirty_high, passthrough, bandwidth, iops and metadata",
        ],
    );
}

#[test]
fn slurm_interactive_access_key_is_pointed_to_access_mode() {
    let e = the_error(
        "#DW jobdw type=scratch access=striped access_mode=striped capacity=1TiB\n",
        1,
        "access=striped",
    );
    assert_says(&e, &["did you mean `access_mode`?"]);
}

#[test]
fn datawarp_cache_options_are_named_as_cache_mode_options() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB pfs=/lus/scratch\n",
        1,
        "pfs=/lus/scratch",
    );
    assert_says(&e, &["pfs= is for type=cache"]);
    let e = the_error(
        "#DW jobdw type=cache access_mode=striped capacity=1TiB pfs=/lus/s sync_on_close=1\n",
        1,
        "sync_on_close=1",
    );
    assert_says(&e, &["cache-mode option", "drains every change"]);
}

#[test]
fn keys_are_case_sensitive_with_a_suggestion() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped Capacity=1TiB capacity=1TiB\n",
        1,
        "Capacity=1TiB",
    );
    assert_says(&e, &["did you mean `capacity`?"]);
}

#[test]
fn a_bare_word_where_a_key_is_expected_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB fast\n",
        1,
        "fast",
    );
    assert_says(&e, &["expected key=value", "jobdw takes"]);
}

#[test]
fn a_key_without_value_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity\n",
        1,
        "capacity",
    );
    assert_says(&e, &["`capacity` needs a value"]);
}

#[test]
fn an_empty_value_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=\n",
        1,
        "capacity=",
    );
    assert_says(&e, &["empty value"]);
}

#[test]
fn an_equals_sign_without_a_key_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB =nvme\n",
        1,
        "=nvme",
    );
    assert_says(&e, &["no key before it", "expected key=value"]);
}

#[test]
fn a_lone_dollar_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/a destination=$/a\n"),
        3,
        "destination=$/a",
    );
    assert_says(&e, &["followed by a variable name"]);
}

#[test]
fn a_trailing_comment_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB # for the run\n",
        1,
        "# for the run",
    );
    assert_says(&e, &["cannot end with a comment"]);
}

#[test]
fn a_bad_pool_name_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=1TiB pool=-nvme\n",
        1,
        "pool=-nvme",
    );
    assert_says(&e, &["pool name"]);
}

#[test]
fn a_second_jobdw_is_an_error_naming_the_first() {
    let e = the_error(
        &format!("{JOBDW}{JOBDW}"),
        2,
        "#DW jobdw type=scratch access_mode=striped capacity=10GiB",
    );
    assert_says(&e, &["at most one `#DW jobdw`", "line 1", "persistentdw"]);
}

// ---- #DW persistentdw -------------------------------------------------------------------------

#[test]
fn persistentdw_attaches_several_instances_in_order() {
    let d = parse("#DW persistentdw name=env\n#DW persistentdw name=db_2\n");
    let names: Vec<&str> = d.persistentdw.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["env", "db_2"]);
    assert!(d.jobdw.is_none());
}

#[test]
fn persistentdw_name_starting_with_a_digit_is_an_error() {
    let e = the_error("#DW persistentdw name=9lives\n", 1, "name=9lives");
    assert_says(
        &e,
        &[
            "does not start with a letter",
            "$DW_PERSISTENT_STRIPED_<name>",
        ],
    );
}

#[test]
fn persistentdw_name_with_a_dash_is_an_error() {
    let e = the_error("#DW persistentdw name=my-bb\n", 1, "name=my-bb");
    assert_says(&e, &["contains `-`"]);
}

#[test]
fn persistentdw_name_longer_than_64_is_an_error() {
    let long = "a".repeat(65);
    let e = the_error(
        &format!("#DW persistentdw name={long}\n"),
        1,
        &format!("name={long}"),
    );
    assert_says(&e, &["65 characters"]);
    assert!(check_persistent_name(&"a".repeat(64)).is_ok());
}

#[test]
fn persistentdw_without_name_is_an_error() {
    let e = the_error("#DW persistentdw\n", 1, "#DW persistentdw");
    assert_says(&e, &["missing name="]);
}

#[test]
fn attaching_the_same_instance_twice_is_an_error() {
    let e = the_error(
        "#DW persistentdw name=env\n#DW persistentdw name=env\n",
        2,
        "name=env",
    );
    assert_says(&e, &["attached twice", "line 1"]);
}

// ---- #DW stage_in / stage_out -----------------------------------------------------------------

#[test]
fn stage_in_of_each_type_is_read() {
    let d = parse(&with_jobdw(
        "#DW stage_in type=file source=/pfs/a.dat destination=$DW_JOB_STRIPED/a.dat\n\
         #DW stage_in type=directory source=/pfs/inputs destination=$DW_JOB_STRIPED/inputs\n\
         #DW stage_in type=list source=/pfs/inputs.list destination=$DW_JOB_STRIPED/listed\n",
    ));
    let kinds: Vec<StageKind> = d.stage_in.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [StageKind::File, StageKind::Directory, StageKind::List]
    );
    assert_eq!(d.stage_in[0].line, 3);
    assert!(d.stage_in.iter().all(|s| s.direction == StageDirection::In));
}

#[test]
fn stage_out_of_each_type_is_read() {
    let d = parse(&with_jobdw(
        "#DW stage_out type=file source=$DW_JOB_STRIPED/r.dat destination=/pfs/r.dat\n\
         #DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=/pfs/out\n\
         #DW stage_out type=list source=$DW_JOB_STRIPED/keep.list destination=/pfs/kept\n",
    ));
    let kinds: Vec<StageKind> = d.stage_out.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [StageKind::File, StageKind::Directory, StageKind::List]
    );
    assert!(d
        .stage_out
        .iter()
        .all(|s| s.direction == StageDirection::Out));
}

#[test]
fn stage_directives_may_come_before_the_jobdw() {
    let d = parse(&format!(
        "#DW stage_in type=file source=/pfs/a destination=$DW_JOB_STRIPED/a\n{JOBDW}"
    ));
    assert_eq!(d.stage_in.len(), 1);
}

#[test]
fn braced_variables_are_accepted() {
    let d = parse(&with_jobdw(
        "#DW stage_in type=file source=/pfs/a destination=${DW_JOB_STRIPED}/a\n",
    ));
    assert_eq!(d.stage_in[0].destination, "${DW_JOB_STRIPED}/a");
    assert_eq!(d.stage_in[0].instance, DwVariable::JobStriped);
}

#[test]
fn stage_into_a_private_job_instance_is_read() {
    let d = parse(
        "#DW jobdw type=scratch access_mode=private capacity=1TiB\n\
         #DW stage_in type=directory source=/pfs/in destination=$DW_JOB_PRIVATE/in\n",
    );
    assert_eq!(d.stage_in[0].instance, DwVariable::JobPrivate);
}

#[test]
fn quoted_paths_may_hold_spaces() {
    let d = parse(&with_jobdw(
        "#DW stage_in type=file source=\"/pfs/my data/in.dat\" destination='$DW_JOB_STRIPED/in put.dat'\n",
    ));
    assert_eq!(d.stage_in[0].source, "/pfs/my data/in.dat");
    assert_eq!(d.stage_in[0].destination, "$DW_JOB_STRIPED/in put.dat");
}

#[test]
fn an_unquoted_path_with_a_space_is_split_and_rejected() {
    let errors = errors(&with_jobdw(
        "#DW stage_in type=file source=/pfs/my data destination=$DW_JOB_STRIPED/x\n",
    ));
    assert_eq!(errors.len(), 1, "{}", DirectiveErrors(errors.clone()));
    assert_eq!(errors[0].text, "data");
    assert_says(&errors[0], &["expected key=value"]);
}

#[test]
fn an_unclosed_quote_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=\"/pfs/a b destination=$DW_JOB_STRIPED/x\n"),
        3,
        "source=\"/pfs/a b destination=$DW_JOB_STRIPED/x",
    );
    assert_says(&e, &["not closed"]);
}

#[test]
fn a_quote_inside_a_value_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/it's destination=$DW_JOB_STRIPED/x\n"),
        3,
        "source=/pfs/it's",
    );
    assert_says(&e, &["whole value"]);
}

#[test]
fn text_after_a_closing_quote_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=\"/pfs/a\"b destination=$DW_JOB_STRIPED/x\n"),
        3,
        "source=\"/pfs/a\"b",
    );
    assert_says(&e, &["after the closing quote"]);
}

#[test]
fn unknown_stage_type_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=dir source=/pfs/a destination=$DW_JOB_STRIPED/a\n"),
        3,
        "type=dir",
    );
    assert_says(
        &e,
        &[
            "unknown stage type",
            "type=file, type=directory or type=list",
        ],
    );
}

#[test]
fn stage_without_type_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in source=/pfs/a destination=$DW_JOB_STRIPED/a\n"),
        3,
        "#DW stage_in source=/pfs/a destination=$DW_JOB_STRIPED/a",
    );
    assert_says(&e, &["missing type="]);
}

#[test]
fn stage_in_destination_on_the_pfs_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/a destination=/pfs/b\n"),
        3,
        "destination=/pfs/b",
    );
    assert_says(
        &e,
        &["must start with $DW_JOB_STRIPED, $DW_JOB_PRIVATE or $DW_PERSISTENT_STRIPED_<name>"],
    );
}

#[test]
fn stage_in_source_in_the_burst_buffer_is_an_error() {
    let e = the_error(
        &with_jobdw(
            "#DW stage_in type=file source=$DW_JOB_STRIPED/a destination=$DW_JOB_STRIPED/b\n",
        ),
        3,
        "source=$DW_JOB_STRIPED/a",
    );
    assert_says(&e, &["cannot be in the burst buffer", "stage_out"]);
}

#[test]
fn stage_out_source_on_the_pfs_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_out type=directory source=/pfs/out destination=/pfs/back\n"),
        3,
        "source=/pfs/out",
    );
    assert_says(
        &e,
        &[
            "stage_out copies from the burst buffer",
            "must start with $DW_JOB_STRIPED",
        ],
    );
}

#[test]
fn stage_out_destination_in_the_burst_buffer_is_an_error() {
    let e = the_error(
        &with_jobdw(
            "#DW stage_out type=directory source=$DW_JOB_STRIPED/a destination=$DW_JOB_STRIPED/b\n",
        ),
        3,
        "destination=$DW_JOB_STRIPED/b",
    );
    assert_says(&e, &["cannot be in the burst buffer", "stage_in"]);
}

#[test]
fn stage_with_no_jobdw_to_stage_into_is_an_error() {
    let e = the_error(
        "#DW stage_in type=file source=/pfs/a destination=$DW_JOB_STRIPED/a\n",
        1,
        "destination=$DW_JOB_STRIPED/a",
    );
    assert_says(
        &e,
        &[
            "no `#DW jobdw`",
            "#DW jobdw type=scratch access_mode=striped",
        ],
    );
}

#[test]
fn stage_into_striped_when_the_jobdw_is_private_is_an_error() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=private capacity=1TiB\n\
         #DW stage_in type=file source=/pfs/a destination=$DW_JOB_STRIPED/a\n",
        2,
        "destination=$DW_JOB_STRIPED/a",
    );
    assert_says(&e, &["access_mode=private", "sets $DW_JOB_PRIVATE"]);
}

#[test]
fn stage_out_of_private_when_the_jobdw_is_striped_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_out type=directory source=$DW_JOB_PRIVATE/o destination=/pfs/o\n"),
        3,
        "source=$DW_JOB_PRIVATE/o",
    );
    assert_says(&e, &["access_mode=striped", "sets $DW_JOB_STRIPED"]);
}

#[test]
fn stage_into_a_persistent_instance_not_attached_is_an_error() {
    let e = the_error(
        "#DW stage_in type=directory source=/pfs/env destination=$DW_PERSISTENT_STRIPED_env/py\n",
        1,
        "destination=$DW_PERSISTENT_STRIPED_env/py",
    );
    assert_says(&e, &["add `#DW persistentdw name=env`"]);
}

#[test]
fn stage_into_a_persistent_instance_created_but_not_attached_says_so() {
    let e = the_error(
        "#BB create_persistent name=env capacity=1TiB access_mode=striped type=scratch\n\
         #DW stage_in type=directory source=/pfs/env destination=$DW_PERSISTENT_STRIPED_env/py\n",
        2,
        "destination=$DW_PERSISTENT_STRIPED_env/py",
    );
    assert_says(&e, &["line 1 creates it, which does not attach it"]);
}

#[test]
fn a_job_may_create_and_attach_the_same_persistent_instance() {
    let d = parse(
        "#BB create_persistent name=env capacity=1TiB access_mode=striped type=scratch\n\
         #DW persistentdw name=env\n\
         #DW stage_in type=directory source=/pfs/env destination=$DW_PERSISTENT_STRIPED_env\n",
    );
    assert_eq!(d.create_persistent.len(), 1);
    assert_eq!(d.persistentdw.len(), 1);
}

#[test]
fn an_erroneous_jobdw_does_not_also_make_its_stages_errors() {
    let errors = errors(
        "#DW jobdw type=scratch access_mode=striped capacity=lots\n\
         #DW stage_in type=file source=/pfs/a destination=$DW_JOB_STRIPED/a\n",
    );
    assert_eq!(errors.len(), 1, "{}", DirectiveErrors(errors.clone()));
    assert_eq!(errors[0].text, "capacity=lots");
}

#[test]
fn other_environment_variables_are_not_expanded_and_are_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=$SCRATCH/in destination=$DW_JOB_STRIPED/in\n"),
        3,
        "source=$SCRATCH/in",
    );
    assert_says(&e, &["$SCRATCH is not expanded", "write the full path"]);
}

#[test]
fn a_variable_in_the_middle_of_a_path_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/$USER/in destination=$DW_JOB_STRIPED/in\n"),
        3,
        "source=/pfs/$USER/in",
    );
    assert_says(&e, &["may only start a path"]);
}

#[test]
fn a_tilde_is_not_expanded_and_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=~/in destination=$DW_JOB_STRIPED/in\n"),
        3,
        "source=~/in",
    );
    assert_says(&e, &["`~` is not expanded"]);
}

#[test]
fn a_misspelt_dw_variable_suggests_the_right_one() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPE/in\n"),
        3,
        "destination=$DW_JOB_STRIPE/in",
    );
    assert_says(
        &e,
        &[
            "unknown variable $DW_JOB_STRIPE",
            "did you mean $DW_JOB_STRIPED?",
        ],
    );
}

#[test]
fn text_glued_to_the_variable_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/in destination=${DW_JOB_STRIPED}in\n"),
        3,
        "destination=${DW_JOB_STRIPED}in",
    );
    assert_says(&e, &["expected `/` after $DW_JOB_STRIPED"]);
}

#[test]
fn dot_dot_in_a_burst_buffer_path_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/../etc\n"),
        3,
        "destination=$DW_JOB_STRIPED/../etc",
    );
    assert_says(&e, &["`..` is not allowed"]);
}

#[test]
fn type_file_with_a_source_ending_in_slash_is_an_error() {
    let e = the_error(
        &with_jobdw("#DW stage_in type=file source=/pfs/inputs/ destination=$DW_JOB_STRIPED/x\n"),
        3,
        "source=/pfs/inputs/",
    );
    assert_says(&e, &["type=directory"]);
}

#[test]
fn file_target_puts_a_file_inside_a_directory_destination() {
    let d = parse(&with_jobdw(
        "#DW stage_in type=file source=/pfs/a.dat destination=$DW_JOB_STRIPED/\n\
         #DW stage_in type=file source=/pfs/b.dat destination=$DW_JOB_STRIPED\n\
         #DW stage_in type=file source=/pfs/c.dat destination=$DW_JOB_STRIPED/renamed.dat\n\
         #DW stage_in type=directory source=/pfs/d destination=$DW_JOB_STRIPED/d\n",
    ));
    let targets: Vec<Option<String>> = d.stage_in.iter().map(|s| s.file_target()).collect();
    assert_eq!(
        targets,
        [
            Some("$DW_JOB_STRIPED/a.dat".to_string()),
            Some("$DW_JOB_STRIPED/b.dat".to_string()),
            Some("$DW_JOB_STRIPED/renamed.dat".to_string()),
            None,
        ]
    );
}

// ---- #BB create_persistent / destroy_persistent -----------------------------------------------

#[test]
fn create_persistent_with_a_pool_is_read_and_dw_prefix_works_too() {
    let d = parse(
        "#BB create_persistent name=a capacity=1TiB access_mode=striped type=scratch pool=ssd\n\
         #DW create_persistent name=b capacity=200GiB access_mode=striped type=scratch\n",
    );
    assert_eq!(d.create_persistent.len(), 2);
    assert_eq!(d.create_persistent[0].pool.as_deref(), Some("ssd"));
    assert_eq!(d.create_persistent[1].capacity, 200 * GIB);
}

#[test]
fn create_persistent_private_is_an_error() {
    let e = the_error(
        "#BB create_persistent name=a capacity=1TiB access_mode=private type=scratch\n",
        1,
        "access_mode=private",
    );
    assert_says(&e, &["must be access_mode=striped"]);
}

#[test]
fn create_persistent_without_capacity_is_an_error() {
    let e = the_error(
        "#BB create_persistent name=a access_mode=striped type=scratch\n",
        1,
        "#BB create_persistent name=a access_mode=striped type=scratch",
    );
    assert_says(
        &e,
        &["missing capacity=", "#BB create_persistent name=myproject"],
    );
}

#[test]
fn create_persistent_with_zero_capacity_is_an_error() {
    let e = the_error(
        "#BB create_persistent name=a capacity=0 access_mode=striped type=scratch\n",
        1,
        "capacity=0",
    );
    assert_says(&e, &["more than zero"]);
}

#[test]
fn creating_the_same_instance_twice_is_an_error() {
    let line = "#BB create_persistent name=a capacity=1TiB access_mode=striped type=scratch\n";
    let e = the_error(&format!("{line}{line}"), 2, "name=a");
    assert_says(&e, &["created twice", "line 1"]);
}

#[test]
fn destroy_persistent_without_hurry_waits() {
    let d = parse("#BB destroy_persistent name=a\n#DW destroy_persistent name=b hurry\n");
    let hurry: Vec<bool> = d.destroy_persistent.iter().map(|x| x.hurry).collect();
    assert_eq!(hurry, [false, true]);
}

#[test]
fn hurry_with_a_value_is_an_error() {
    let e = the_error("#BB destroy_persistent name=a hurry=yes\n", 1, "hurry=yes");
    assert_says(&e, &["takes no value", "write just `hurry`"]);
}

#[test]
fn destroying_the_same_instance_twice_is_an_error() {
    let e = the_error(
        "#BB destroy_persistent name=a\n#BB destroy_persistent name=a\n",
        2,
        "name=a",
    );
    assert_says(&e, &["destroyed twice"]);
}

#[test]
fn creating_and_destroying_in_one_job_is_an_error() {
    let e = the_error(
        "#BB create_persistent name=a capacity=1TiB access_mode=striped type=scratch\n\
         #BB destroy_persistent name=a\n",
        2,
        "name=a",
    );
    assert_says(&e, &["both creates (line 1) and destroys", "separate jobs"]);
}

#[test]
fn attaching_and_destroying_in_one_job_is_an_error() {
    let e = the_error(
        "#DW persistentdw name=a\n#BB destroy_persistent name=a\n",
        2,
        "name=a",
    );
    assert_says(&e, &["both attaches (line 1) and destroys", "later job"]);
}

// ---- prefixes and directive names -------------------------------------------------------------

#[test]
fn swap_is_a_datawarp_directive_surge_does_not_support() {
    let e = the_error("#DW swap 4GiB\n", 1, "#DW swap 4GiB");
    assert_says(&e, &["`#DW swap`", "does not support"]);
}

#[test]
fn an_unknown_directive_suggests_the_closest() {
    let e = the_error(
        "#DW stagein type=file source=/a destination=$DW_JOB_STRIPED\n",
        1,
        "stagein",
    );
    assert_says(
        &e,
        &[
            "unknown directive `#DW stagein`",
            "did you mean `stage_in`?",
        ],
    );
}

#[test]
fn a_dw_directive_under_bb_is_an_error_giving_the_right_prefix() {
    let e = the_error(
        "#BB jobdw type=scratch access_mode=striped capacity=1TiB\n",
        1,
        "#BB jobdw type=scratch access_mode=striped capacity=1TiB",
    );
    assert_says(&e, &["write `#DW jobdw ...`"]);
}

#[test]
fn an_unknown_bb_directive_lists_the_bb_directives() {
    let e = the_error("#BB use_persistent name=a\n", 1, "use_persistent");
    assert_says(&e, &["create_persistent or destroy_persistent"]);
}

#[test]
fn surge_jobdw_reads_performance_targets_with_striped_scratch_defaults() {
    let d = parse("#SURGE jobdw bandwidth=4GiB/s metadata=50k/s capacity=100GiB pool=nvme\n");
    let j = d.jobdw.expect("a job instance");
    assert_eq!(j.kind, InstanceType::Scratch);
    assert_eq!(j.access_mode, AccessMode::Striped);
    assert_eq!(j.capacity, 100 * GIB);
    assert_eq!(j.pool.as_deref(), Some("nvme"));
    let t = j.targets.expect("targets");
    assert_eq!(t.bandwidth, Some(4 * GIB));
    assert_eq!(t.metadata, Some(50_000));
    assert_eq!(t.iops, None);
    // Targets alone: the capacity is left to what they need.
    let d = parse("#SURGE jobdw iops=200k/s access_mode=private\n");
    let j = d.jobdw.unwrap();
    assert_eq!((j.capacity, j.access_mode), (0, AccessMode::Private));
    assert_eq!(j.targets.unwrap().iops, Some(200_000));
    assert!(
        parse("#DW jobdw type=scratch access_mode=striped capacity=1GiB\n")
            .jobdw
            .unwrap()
            .targets
            .is_none()
    );
}

#[test]
fn other_surge_directives_are_unknown() {
    let e = the_error("#SURGE stagein x=1\n", 1, "#SURGE stagein x=1");
    assert_says(&e, &["unknown directive `#SURGE stagein`", "jobdw"]);
}

#[test]
fn an_empty_directive_is_an_error() {
    let e = the_error("#DW\n", 1, "#DW");
    assert_says(&e, &["empty directive"]);
}

#[test]
fn a_directive_without_a_name_is_an_error() {
    let e = the_error("#DW capacity=1TiB\n", 1, "capacity=1TiB");
    assert_says(&e, &["expected a directive name"]);
}

// ---- where directives are read ----------------------------------------------------------------

#[test]
fn directives_are_read_among_sbatch_lines_comments_and_blank_lines() {
    let d = parse(
        "#!/bin/bash\n\n#SBATCH -N 2\n# a comment\n   \n  # an indented comment\n#DW persistentdw name=env\n",
    );
    assert_eq!(d.persistentdw[0].line, 7);
}

#[test]
fn a_script_without_directives_asks_for_nothing() {
    let d = parse("#!/bin/bash\n#SBATCH -N 1\nsrun hostname\n");
    assert!(d.is_empty());
    assert!(d.warnings.is_empty());
    assert!(parse("").is_empty());
}

#[test]
fn a_directive_after_the_first_command_is_a_warning_naming_that_command() {
    let d = parse("#!/bin/bash\n#DW persistentdw name=env\ncd /tmp\n#DW persistentdw name=other\n");
    assert_eq!(d.persistentdw.len(), 1);
    assert_eq!(d.warnings.len(), 1);
    let w = &d.warnings[0];
    assert_eq!(
        (w.line, w.text.as_str()),
        (4, "#DW persistentdw name=other")
    );
    assert!(w.message.contains("ends at line 3 (`cd /tmp`)"), "{w}");
    assert_eq!(
        w.to_string(),
        format!(
            "job.sh:4: warning: `#DW persistentdw name=other`: {}",
            w.message
        )
    );
}

#[test]
fn an_indented_directive_is_a_warning() {
    let d = parse("#!/bin/bash\n  #DW persistentdw name=env\n");
    assert!(d.persistentdw.is_empty());
    assert!(
        d.warnings[0].message.contains("indented"),
        "{:?}",
        d.warnings
    );
}

#[test]
fn a_miscased_or_spaced_prefix_is_a_warning() {
    let d = parse("#dw persistentdw name=env\n# DW jobdw capacity=1TiB\n");
    assert!(d.is_empty());
    let lines: Vec<usize> = d.warnings.iter().map(|w| w.line).collect();
    assert_eq!(lines, [1, 2]);
    assert!(
        d.warnings[0].message.contains("exactly `#DW`"),
        "{:?}",
        d.warnings
    );
}

#[test]
fn a_directive_switched_off_with_a_double_hash_is_silent() {
    let d = parse("##DW jobdw type=scratch access_mode=striped capacity=1TiB\n");
    assert!(d.is_empty());
    assert!(d.warnings.is_empty());
}

#[test]
fn a_continuation_joins_lines_and_keeps_each_words_line() {
    let errors =
        errors("#DW jobdw type=scratch \\\n#DW access_mode=striped \\\n#DW capacity=1XB\n");
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].line, errors[0].text.as_str()),
        (3, "capacity=1XB")
    );
}

#[test]
fn a_continuation_onto_a_blank_line_is_an_error() {
    let e = the_error(
        "#DW persistentdw \\\n\n#SBATCH -N 1\n",
        1,
        "#DW persistentdw",
    );
    assert_says(&e, &["line 2 is blank"]);
}

#[test]
fn a_continuation_onto_another_prefix_is_an_error() {
    let errors = errors("#DW persistentdw \\\n#BB destroy_persistent name=a\n");
    assert_eq!(errors.len(), 1, "{}", DirectiveErrors(errors.clone()));
    assert_says(
        &errors[0],
        &["line 2 starts with `#BB`", "keeps its prefix"],
    );
}

#[test]
fn a_continuation_onto_a_plain_comment_is_an_error() {
    let e = the_error("#DW persistentdw \\\n# name=a\n", 1, "#DW persistentdw");
    assert_says(&e, &["line 2 is a comment"]);
}

#[test]
fn a_continuation_at_the_end_of_the_script_is_an_error() {
    let e = the_error("#DW persistentdw name=a \\", 1, "#DW persistentdw name=a");
    assert_says(&e, &["the script ends there"]);
}

#[test]
fn windows_line_endings_are_accepted() {
    let d = parse("#!/bin/bash\r\n#DW persistentdw name=env\r\nsrun a\r\n");
    assert_eq!(d.persistentdw[0].name, "env");
}

#[test]
fn warnings_are_reported_with_the_errors_of_a_rejected_script() {
    let errors = errors("#DW persistentdw name=9\nsrun a\n#DW persistentdw name=b\n");
    let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [1, 3]);
}

// ---- messages ---------------------------------------------------------------------------------

#[test]
fn an_error_displays_as_file_line_text_message() {
    let e = the_error(
        "#DW jobdw type=scratch access_mode=striped capacity=0\n",
        1,
        "capacity=0",
    );
    assert_eq!(
        e.to_string(),
        "job.sh:1: `capacity=0`: capacity must be more than zero, e.g. capacity=100GiB"
    );
}

#[test]
fn errors_display_one_per_line_and_are_a_std_error() {
    let err = parse_script(
        "run.sh",
        "#DW persistentdw name=1\n#DW persistentdw name=2\n",
    )
    .expect_err("two bad names");
    let shown = err.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    assert!(lines[0].starts_with("run.sh:1: `name=1`: "), "{shown}");
    assert!(lines[1].starts_with("run.sh:2: `name=2`: "), "{shown}");
    let _: &dyn std::error::Error = &err;
}

// ---- storing and expanding ----------------------------------------------------------------------

#[test]
fn directives_round_trip_through_json_with_datawarp_spellings() {
    let d = parse(include_str!("scripts/camp_private.sh"));
    let json = serde_json::to_string(&d).expect("serialize");
    assert!(json.contains(r#""access_mode":"private""#), "{json}");
    assert!(json.contains(r#""kind":"list""#), "{json}");
    assert!(json.contains(r#""instance":"job_private""#), "{json}");
    let back: Directives = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, d);
}

fn mounts() -> HashMap<String, String> {
    HashMap::from([
        (
            "DW_JOB_STRIPED".to_string(),
            "/mnt/surge/job42/".to_string(),
        ),
        (
            "DW_PERSISTENT_STRIPED_env".to_string(),
            "/mnt/surge/env".to_string(),
        ),
    ])
}

#[test]
fn expand_replaces_the_leading_variable_only() {
    let m = mounts();
    assert_eq!(
        expand_dw_path("$DW_JOB_STRIPED/in/a", &m).as_deref(),
        Ok("/mnt/surge/job42/in/a")
    );
    assert_eq!(
        expand_dw_path("${DW_JOB_STRIPED}", &m).as_deref(),
        Ok("/mnt/surge/job42/")
    );
    assert_eq!(
        expand_dw_path("$DW_PERSISTENT_STRIPED_env/py", &m).as_deref(),
        Ok("/mnt/surge/env/py")
    );
    assert_eq!(expand_dw_path("/pfs/a", &m).as_deref(), Ok("/pfs/a"));
}

#[test]
fn expanding_a_variable_that_is_not_set_is_an_error() {
    assert_eq!(
        expand_dw_path("$DW_JOB_PRIVATE/a", &mounts()),
        Err(ExpandError::Unset {
            variable: "DW_JOB_PRIVATE".to_string(),
            path: "$DW_JOB_PRIVATE/a".to_string()
        })
    );
    assert!(matches!(
        expand_dw_path("$HOME/a", &mounts()),
        Err(ExpandError::Invalid { .. })
    ));
}

#[test]
fn a_stage_directive_expands_both_ends() {
    let d = parse(include_str!("scripts/nersc_scratch_stage.sh"));
    let s = d.stage_out[0].expanded(&mounts()).expect("expand");
    assert_eq!(s.source, "/mnt/surge/job42/output");
    assert_eq!(s.destination, "/global/cscratch1/sd/alice/output");
}

// ---- type=list files ----------------------------------------------------------------------------

fn camp_list_stage() -> StageDirective {
    parse(include_str!("scripts/camp_private.sh")).stage_in[0].clone()
}

#[test]
fn a_list_file_gives_one_entry_per_line_relative_to_the_destination() {
    let entries = parse_stage_list(
        "swaths.list",
        include_str!("scripts/swaths.list"),
        &camp_list_stage(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        entries,
        vec![
            StageEntry {
                line: 2,
                source: "/global/cscratch1/sd/camp/MOD021KM.A2015001.h5".to_string(),
                destination: "$DW_JOB_PRIVATE/swaths/MOD021KM.A2015001.h5".to_string(),
            },
            StageEntry {
                line: 3,
                source: "/global/cscratch1/sd/camp/MOD021KM.A2015002.h5".to_string(),
                destination: "$DW_JOB_PRIVATE/swaths/2015/002.h5".to_string(),
            },
            StageEntry {
                line: 4,
                source: "/global/cscratch1/sd/camp/notes and tables.txt".to_string(),
                destination: "$DW_JOB_PRIVATE/swaths/notes.txt".to_string(),
            },
            StageEntry {
                line: 5,
                source: "/global/cscratch1/sd/camp/geometry.h5".to_string(),
                destination: "$DW_JOB_PRIVATE/geometry/geometry.h5".to_string(),
            },
        ]
    );
}

#[test]
fn a_stage_out_list_reads_instance_files_into_a_pfs_directory() {
    let d = parse(&with_jobdw(
        "#DW stage_out type=list source=$DW_JOB_STRIPED/keep.list destination=/pfs/kept\n",
    ));
    let entries = parse_stage_list(
        "keep.list",
        "$DW_JOB_STRIPED/out/a.h5 a.h5\n$DW_JOB_STRIPED/log.txt /pfs/logs/log.txt\n",
        &d.stage_out[0],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dsts: Vec<&str> = entries.iter().map(|e| e.destination.as_str()).collect();
    assert_eq!(dsts, ["/pfs/kept/a.h5", "/pfs/logs/log.txt"]);
}

#[test]
fn list_file_errors_name_the_list_file_and_are_all_reported() {
    let err = parse_stage_list(
        "swaths.list",
        "/pfs/a\n\
         $DW_JOB_PRIVATE/x y\n\
         /pfs/b ../../escape\n\
         /pfs/c /pfs/elsewhere/c\n\
         /pfs/d $DW_JOB_STRIPED/d\n\
         /pfs/e e\n\
         /pfs/f e\n\
         \"/pfs/g h\n",
        &camp_list_stage(),
    )
    .expect_err("every line is wrong but one");
    let shown = err.to_string();
    let lines: Vec<(&str, usize)> = err.0.iter().map(|e| (e.file.as_str(), e.line)).collect();
    assert_eq!(
        lines,
        [1, 2, 3, 4, 5, 7, 8].map(|l| ("swaths.list", l)),
        "{shown}"
    );
    assert!(shown.contains("expected two paths"), "{shown}");
    assert!(
        shown.contains("names files on the parallel file system"),
        "{shown}"
    );
    assert!(shown.contains("`..` is not allowed"), "{shown}");
    assert!(shown.contains("must be in the burst buffer"), "{shown}");
    assert!(
        shown.contains("the directive's instance is $DW_JOB_PRIVATE"),
        "{shown}"
    );
    assert!(shown.contains("also the destination of line 6"), "{shown}");
    assert!(shown.contains("not closed"), "{shown}");
}

#[test]
fn a_list_file_is_only_for_type_list() {
    let d = parse(include_str!("scripts/nersc_scratch_stage.sh"));
    assert!(parse_stage_list("x.list", "/a b\n", &d.stage_in[0]).is_err());
}

// ---- properties ---------------------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A line shaped like a directive (prefix, name, a few arguments, maybe a continuation),
    /// or noise, so that the generator reaches deep into the parser rather than stopping at
    /// "not a directive".
    fn line() -> impl Strategy<Value = String> {
        let prefix = prop_oneof![
            4 => Just("#DW "),
            2 => Just("#BB "),
            1 => Just("#SURGE "),
            1 => Just("  #DW "),
            1 => Just("#dw "),
            1 => Just(""),
        ];
        let word = prop_oneof![
            Just("jobdw"),
            Just("stage_in"),
            Just("stage_out"),
            Just("persistentdw"),
            Just("create_persistent"),
            Just("destroy_persistent"),
            Just("swap"),
            Just("capacity=1GiB"),
        ];
        let arg = prop_oneof![
            Just("type=scratch"),
            Just("type=cache"),
            Just("type=file"),
            Just("type=directory"),
            Just("type=list"),
            Just("access_mode=private"),
            Just("access_mode=striped"),
            Just("capacity=1.5GiB"),
            Just("capacity=0"),
            Just("pool=nvme"),
            Just("source=\"/a b\""),
            Just("source=/pfs/in"),
            Just("source=$DW_JOB_STRIPED/o"),
            Just("destination=$DW_JOB_STRIPED/x"),
            Just("destination=${DW_PERSISTENT_STRIPED_p}"),
            Just("destination=/pfs/out"),
            Just("name=p"),
            Just("name=9"),
            Just("hurry"),
            Just("'"),
            Just("="),
            Just("$"),
            Just("#"),
        ];
        let directive = (
            prefix,
            word,
            proptest::collection::vec(arg, 0..6),
            prop_oneof![4 => Just(""), 1 => Just(" \\")],
        )
            .prop_map(|(p, w, args, cont)| format!("{p}{w} {}{cont}", args.join(" ")));
        prop_oneof![
            6 => directive,
            1 => Just(String::new()),
            1 => Just("srun ./app".to_string()),
            1 => "[ -~éß\t]{0,20}",
        ]
    }

    proptest! {
        #[test]
        fn the_parser_never_panics_and_every_error_points_into_the_script(
            lines in proptest::collection::vec(line(), 0..12)
        ) {
            let text = lines.join("\n");
            let lines = text.split('\n').count();
            match parse_script("p.sh", &text) {
                Ok(d) => {
                    for w in &d.warnings {
                        prop_assert!((1..=lines).contains(&w.line), "{w}");
                    }
                }
                Err(DirectiveErrors(errors)) => {
                    prop_assert!(!errors.is_empty());
                    for e in &errors {
                        prop_assert!((1..=lines).contains(&e.line), "{e}");
                        prop_assert!(!e.message.is_empty(), "{e}");
                        prop_assert_eq!(&e.file, "p.sh");
                    }
                }
            }
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
            let _ = parse_script("p.sh", &text);
        }

        #[test]
        fn a_valid_jobdw_gives_back_the_capacity_parse_size_reads(
            n in 1u64..100_000,
            unit in prop_oneof![Just(""), Just("KiB"), Just("MB"), Just("GiB"), Just("GB"), Just("TiB")],
            private in any::<bool>(),
        ) {
            let mode = if private { "private" } else { "striped" };
            let text = format!("#DW jobdw capacity={n}{unit} access_mode={mode} type=scratch\n");
            let d = parse_script("p.sh", &text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let jobdw = d.jobdw.expect("jobdw");
            prop_assert_eq!(jobdw.capacity, surge_core::parse_size(&format!("{n}{unit}")).expect("size"));
            prop_assert_eq!(jobdw.access_mode == AccessMode::Private, private);
        }
    }
}

/// A persistent cache instance: `type=cache pfs=` on `create_persistent`, with the cache keys
/// of a jobdw line; `pfs=` is required, and the cache keys are refused on a scratch one.
#[test]
fn a_persistent_cache_instance_takes_the_cache_keys() {
    let d = parse(
        "#!/bin/bash\n#BB create_persistent name=ckpt capacity=2GiB access_mode=striped \
         type=cache pfs=/lus/run fsync=pfs passthrough=off\n",
    );
    let cp = &d.create_persistent[0];
    assert_eq!(cp.kind, InstanceType::Cache);
    assert_eq!(cp.cache.pfs.as_deref(), Some("/lus/run"));
    assert!(cp.cache.fsync_pfs && !cp.cache.passthrough);
    let e = errors(
        "#!/bin/bash\n#BB create_persistent name=ckpt capacity=2GiB access_mode=striped \
         type=cache\n",
    );
    assert!(
        e.iter()
            .any(|e| e.message.contains("type=cache needs pfs=DIR")
                && e.message.contains("create_persistent name=")),
        "{e:?}"
    );
    let e = errors(
        "#!/bin/bash\n#BB create_persistent name=ckpt capacity=2GiB access_mode=striped \
         type=scratch pfs=/lus/run\n",
    );
    assert!(
        e.iter().any(|e| e.message.contains("is for type=cache")),
        "{e:?}"
    );
}

/// Performance targets on a `#DW jobdw` line (Surge extension keys, for batch systems that
/// pass on only `#DW` lines): read as on `#SURGE jobdw`, with the line's capacity.
#[test]
fn targets_on_a_dw_jobdw_line_are_read() {
    let j = parse(
        "#DW jobdw type=scratch access_mode=striped capacity=64MiB bandwidth=1500MiB/s pool=nvme\n",
    )
    .jobdw
    .unwrap();
    assert_eq!(j.capacity, 64 << 20);
    let t = j.targets.expect("targets");
    assert_eq!(t.bandwidth, Some(1500 << 20));
    assert_eq!(t.iops, None);
    let j = parse("#DW jobdw type=scratch access_mode=striped capacity=64MiB\n")
        .jobdw
        .unwrap();
    assert!(j.targets.is_none(), "no target keys: no targets");
}
