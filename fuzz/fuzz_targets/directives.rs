//! The `#DW`/`#BB` directive parser over arbitrary job scripts (what any user submits to the
//! manager), with an arbitrary stage list file for each `type=list` directive, and the
//! `$DW_...` path expansion.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use surge_core::directives::{expand_dw_path, parse_script, parse_stage_list, StageKind};

fuzz_target!(|data: &[u8]| {
    // Script, then (after a NUL byte) the content of the stage list files.
    let (script, list) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let script = String::from_utf8_lossy(script);
    let list = String::from_utf8_lossy(list);
    if let Ok(d) = parse_script("job.sh", &script) {
        for s in d.stage_in.iter().chain(&d.stage_out) {
            if s.kind == StageKind::List {
                let _ = parse_stage_list("list.txt", &list, s);
            }
        }
    }
    let vars: HashMap<String, String> = [
        ("DW_JOB_STRIPED", "/mnt/job"),
        ("DW_PERSISTENT_STRIPED_x", "/mnt/x"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for line in script.lines().take(64) {
        let _ = expand_dw_path(line, &vars);
    }
});
