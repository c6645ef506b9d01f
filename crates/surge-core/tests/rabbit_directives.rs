//! HPE Rabbit's (DWS) dialect beside DataWarp's: named `#DW jobdw ... name=` allocations,
//! `#DW copy_in` / `#DW copy_out`, `$DW_JOB_<name>` and `$DW_PERSISTENT_<name>`, and the clear
//! refusals of what Surge does not do (docs/DIRECTIVES.md, "Rabbit").

use std::collections::HashMap;
use surge_core::directives::{
    expand_dw_path, AccessMode, DwVariable, JobAllocation, RabbitFs, StageDirection, StageKind,
};

const GIB: u64 = 1 << 30;

mod common;
use common::{assert_says, parse, the_error};

const TWO: &str = "#!/bin/bash\n\
#DW jobdw type=xfs capacity=10GiB name=node-local\n\
#DW jobdw type=lustre capacity=1TiB name=shared\n";

#[test]
fn two_named_allocations_are_two_instances_with_their_own_variables() {
    let d = parse(TWO);
    assert!(d.jobdw.is_none(), "no DataWarp job instance");
    assert_eq!(
        d.allocations,
        vec![
            JobAllocation {
                line: 2,
                name: "node-local".into(),
                fs: RabbitFs::Xfs,
                capacity: 10 * GIB,
                pool: None,
            },
            JobAllocation {
                line: 3,
                name: "shared".into(),
                fs: RabbitFs::Lustre,
                capacity: 1024 * GIB,
                pool: None,
            },
        ]
    );
    assert_eq!(
        d.allocations[0].var(),
        DwVariable::JobNamed("node_local".into())
    );
    assert_eq!(d.allocations[0].var().env_name(), "DW_JOB_node_local");
    assert_eq!(d.allocations[1].var().env_name(), "DW_JOB_shared");
}

#[test]
fn xfs_and_gfs2_are_private_per_node_and_lustre_striped_for_the_job() {
    let d = parse(
        "#DW jobdw type=xfs capacity=10GiB name=a\n\
         #DW jobdw type=gfs2 capacity=10GiB name=b\n\
         #DW jobdw type=lustre capacity=10GiB name=c\n",
    );
    let modes: Vec<AccessMode> = d.allocations.iter().map(|a| a.access_mode()).collect();
    assert_eq!(
        modes,
        [
            AccessMode::Private,
            AccessMode::Private,
            AccessMode::Striped
        ]
    );
    // Rabbit's capacity is per compute node for xfs and gfs2, for the job for lustre.
    assert_eq!(d.allocations[0].capacity_for(4), 40 * GIB);
    assert_eq!(d.allocations[1].capacity_for(4), 40 * GIB);
    assert_eq!(d.allocations[2].capacity_for(4), 10 * GIB);
}

#[test]
fn copy_in_and_copy_out_are_stages_of_any_kind_on_the_named_allocation() {
    let d = parse(&format!(
        "{TWO}#DW copy_in source=/lus/in destination=$DW_JOB_node_local/data\n\
         #DW copy_out source=$DW_JOB_shared/out destination=/lus/out\n"
    ));
    assert_eq!(d.stage_in.len(), 1);
    assert_eq!(d.stage_out.len(), 1);
    let i = &d.stage_in[0];
    assert_eq!(
        (i.line, i.kind, i.direction, &i.instance),
        (
            4,
            StageKind::Any,
            StageDirection::In,
            &DwVariable::JobNamed("node_local".into())
        )
    );
    let o = &d.stage_out[0];
    assert_eq!(
        (o.kind, o.direction, &o.instance),
        (
            StageKind::Any,
            StageDirection::Out,
            &DwVariable::JobNamed("shared".into())
        )
    );
    let vars = HashMap::from([("DW_JOB_node_local".to_string(), "/mnt/a".to_string())]);
    assert_eq!(
        expand_dw_path(&i.destination, &vars).unwrap(),
        "/mnt/a/data"
    );
}

#[test]
fn a_copy_into_a_bare_variable_or_a_slash_keeps_the_file_name() {
    let d = parse(
        "#DW jobdw type=xfs capacity=1GiB name=x\n\
         #DW copy_in source=/lus/a.dat destination=$DW_JOB_x\n\
         #DW copy_in source=/lus/b.dat destination=$DW_JOB_x/in/\n\
         #DW copy_in source=/lus/c.dat destination=$DW_JOB_x/c2.dat\n",
    );
    let t: Vec<String> = d
        .stage_in
        .iter()
        .map(|s| s.file_target().unwrap())
        .collect();
    assert_eq!(
        t,
        ["$DW_JOB_x/a.dat", "$DW_JOB_x/in/b.dat", "$DW_JOB_x/c2.dat"]
    );
}

#[test]
fn persistentdw_is_reached_by_rabbits_variable_too() {
    let d = parse(
        "#DW persistentdw name=shared_data\n\
         #DW jobdw type=lustre capacity=1TiB name=fast\n\
         #DW copy_out source=$DW_PERSISTENT_shared_data/a destination=/lus/a\n",
    );
    assert_eq!(
        d.stage_out[0].instance,
        DwVariable::PersistentStriped("shared_data".into())
    );
}

#[test]
fn datawarp_scripts_are_read_as_before() {
    let d = parse(
        "#DW jobdw type=scratch access_mode=striped capacity=10GiB\n\
         #DW stage_in type=file source=/p/a destination=$DW_JOB_STRIPED/a\n",
    );
    assert!(d.allocations.is_empty());
    assert_eq!(d.jobdw.unwrap().access_mode, AccessMode::Striped);
    assert_eq!(d.stage_in[0].kind, StageKind::File);
}

#[test]
fn a_datawarp_job_instance_and_rabbit_allocations_may_share_a_script() {
    let d = parse(
        "#DW jobdw type=scratch access_mode=striped capacity=10GiB\n\
         #DW jobdw type=xfs capacity=1GiB name=local\n\
         #DW stage_in type=file source=/p/a destination=$DW_JOB_STRIPED/a\n\
         #DW copy_in source=/p/b destination=$DW_JOB_local/b\n",
    );
    assert!(d.jobdw.is_some());
    assert_eq!(d.allocations.len(), 1);
}

#[test]
fn type_raw_is_refused_naming_the_line_and_value() {
    let e = the_error(
        "#!/bin/bash\n#DW jobdw type=raw capacity=10GiB name=blk\n",
        2,
        "type=raw",
    );
    assert_says(&e, &["block device", "type=xfs"]);
}

#[test]
fn an_unknown_rabbit_type_gets_a_did_you_mean() {
    let e = the_error(
        "#DW jobdw type=gfs3 capacity=10GiB name=a\n",
        1,
        "type=gfs3",
    );
    assert_says(
        &e,
        &[
            "unknown type `gfs3`",
            "did you mean `gfs2`",
            "xfs, gfs2 or lustre",
        ],
    );
    let e = the_error(
        "#DW jobdw type=lustr capacity=10GiB name=a\n",
        1,
        "type=lustr",
    );
    assert_says(&e, &["did you mean `lustre`"]);
}

#[test]
fn a_datawarp_type_with_a_name_says_which_dialect_it_mixed() {
    let e = the_error(
        "#DW jobdw type=scratch capacity=10GiB name=a\n",
        1,
        "type=scratch",
    );
    assert_says(&e, &["DataWarp's", "name=", "xfs"]);
}

#[test]
fn access_mode_on_a_rabbit_jobdw_is_refused() {
    let e = the_error(
        "#DW jobdw type=xfs access_mode=striped capacity=10GiB name=a\n",
        1,
        "access_mode=striped",
    );
    assert_says(&e, &["Rabbit's", "drop `access_mode=`"]);
}

#[test]
fn container_is_refused() {
    let e = the_error(
        "#DW jobdw type=xfs capacity=10GiB name=fast\n\
         #DW container name=backup profile=automatic-backup DW_JOB_source=fast\n",
        2,
        "#DW container name=backup profile=automatic-backup DW_JOB_source=fast",
    );
    assert_says(&e, &["user containers", "not"]);
}

#[test]
fn two_allocations_of_one_name_are_refused() {
    let e = the_error(
        "#DW jobdw type=xfs capacity=10GiB name=scratch\n\
         #DW jobdw type=lustre capacity=10GiB name=scratch\n",
        2,
        "name=scratch",
    );
    assert_says(&e, &["first on line 1", "unique"]);
}

#[test]
fn a_copy_naming_an_undefined_allocation_is_refused_with_a_did_you_mean() {
    let e = the_error(
        "#DW jobdw type=xfs capacity=10GiB name=scratch\n\
         #DW copy_in source=/lus/in destination=$DW_JOB_scrach/in\n",
        2,
        "destination=$DW_JOB_scrach/in",
    );
    assert_says(
        &e,
        &[
            "$DW_JOB_scrach names no job allocation",
            "did you mean $DW_JOB_scratch?",
        ],
    );
}

#[test]
fn a_bad_allocation_name_is_refused() {
    let e = the_error(
        "#DW jobdw type=xfs capacity=1GiB name=Big_One\n",
        1,
        "name=Big_One",
    );
    assert_says(&e, &["lower-case letter"]);
    let e = the_error("#DW jobdw type=xfs capacity=1GiB name=a_b\n", 1, "name=a_b");
    assert_says(&e, &["contains `_`"]);
}

#[test]
fn name_and_capacity_are_required() {
    let e = the_error(
        "#DW jobdw type=xfs name=a\n",
        1,
        "#DW jobdw type=xfs name=a",
    );
    assert_says(&e, &["missing capacity="]);
    let e = the_error(
        "#DW jobdw type=xfs capacity=1GiB\n",
        1,
        "#DW jobdw type=xfs capacity=1GiB",
    );
    assert_says(&e, &["missing name="]);
}

#[test]
fn profiles_are_refused_and_copy_offload_is_accepted() {
    let e = the_error(
        "#DW jobdw type=lustre capacity=1TiB name=t profile=high-metadata\n",
        1,
        "profile=high-metadata",
    );
    assert_says(&e, &["profiles"]);
    parse("#DW jobdw type=gfs2 capacity=50GB name=checkpoint requires=copy-offload\n");
    let e = the_error(
        "#DW jobdw type=xfs capacity=1GiB name=a\n\
         #DW copy_in source=/l/a destination=$DW_JOB_a/a profile=no-xattr\n",
        2,
        "profile=no-xattr",
    );
    assert_says(&e, &["profiles"]);
}

#[test]
fn a_copy_between_two_allocations_is_refused() {
    let e = the_error(
        "#DW persistentdw name=p\n\
         #DW jobdw type=xfs capacity=1GiB name=a\n\
         #DW copy_in source=$DW_PERSISTENT_p/ destination=$DW_JOB_a/data\n",
        3,
        "source=$DW_PERSISTENT_p/",
    );
    assert_says(&e, &["both ends are in the burst buffer"]);
}

#[test]
fn a_copy_in_must_go_into_the_burst_buffer() {
    let e = the_error(
        "#DW jobdw type=xfs capacity=1GiB name=a\n#DW copy_in source=/l/a destination=/l/b\n",
        2,
        "destination=/l/b",
    );
    assert_says(
        &e,
        &["copy_in copies into the burst buffer", "$DW_JOB_<name>"],
    );
}

#[test]
fn datawarp_variables_without_a_datawarp_jobdw_point_to_the_named_ones() {
    let e = the_error(
        "#DW jobdw type=xfs capacity=1GiB name=a\n\
         #DW copy_in source=/l/a destination=$DW_JOB_STRIPED/a\n",
        2,
        "destination=$DW_JOB_STRIPED/a",
    );
    assert_says(&e, &["Rabbit's named allocations", "$DW_JOB_<name>"]);
}

#[test]
fn copy_in_with_bb_prefix_is_refused() {
    let e = the_error(
        "#DW jobdw type=xfs capacity=1GiB name=a\n#BB copy_in source=/l/a destination=$DW_JOB_a/a\n",
        2,
        "#BB copy_in source=/l/a destination=$DW_JOB_a/a",
    );
    assert_says(&e, &["`#DW copy_in"]);
}

#[test]
fn rabbits_create_persistent_is_refused_pointing_to_datawarps() {
    let e = the_error(
        "#DW create_persistent type=lustre capacity=10TiB name=shared-data\n",
        1,
        "type=lustre",
    );
    assert_says(
        &e,
        &[
            "Rabbit's",
            "#BB create_persistent name=NAME",
            "access_mode=striped",
        ],
    );
}

#[test]
fn a_persistent_name_with_a_dash_is_refused_as_before() {
    let e = the_error("#DW persistentdw name=shared-data\n", 1, "name=shared-data");
    assert_says(&e, &["contains `-`"]);
}
