//! The examples of docs/DIRECTIVES.md are run, so the reference cannot drift from the parser:
//! - a ` ```sh ` block is a script that parses with no error and no warning;
//! - a ` ```sh error ` block is a script that is rejected, and the ` ```text ` block after it
//!   is exactly what the errors display (the file being `job.sh`);
//! - a ` ```sh warning ` block parses, and the ` ```text ` block after it is its warnings;
//! - a ` ```list ` block is a stage list file that `parse_stage_list` accepts.

use surge_core::directives::{parse_script, parse_stage_list, DirectiveErrors};

const DOC: &str = include_str!("../../../docs/DIRECTIVES.md");

/// Fenced blocks: (line of the opening fence, info string, body).
fn blocks(doc: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    for (i, line) in doc.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((i + 1, info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some((_, _, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(
        open.is_none(),
        "docs/DIRECTIVES.md has an unclosed code block"
    );
    out
}

#[test]
fn every_example_in_the_directives_reference_behaves_as_shown() {
    let blocks = blocks(DOC);
    let mut checked = 0;
    for (k, (line, info, body)) in blocks.iter().enumerate() {
        let expected = || match blocks.get(k + 1) {
            Some((_, next_info, text)) if next_info == "text" => text.trim_end().to_string(),
            _ => panic!(
                "DIRECTIVES.md:{line}: a ```{info} block must be followed by a ```text block"
            ),
        };
        match info.as_str() {
            "sh" => {
                let d = parse_script("job.sh", body)
                    .unwrap_or_else(|e| panic!("DIRECTIVES.md:{line}: example rejected:\n{e}"));
                assert!(
                    d.warnings.is_empty(),
                    "DIRECTIVES.md:{line}: warnings: {:?}",
                    d.warnings
                );
            }
            "sh error" => {
                let shown = match parse_script("job.sh", body) {
                    Ok(d) => panic!("DIRECTIVES.md:{line}: example accepted: {d:#?}"),
                    Err(e) => e.to_string(),
                };
                assert_eq!(
                    shown,
                    expected(),
                    "DIRECTIVES.md:{line}: errors differ; actual:\n{shown}"
                );
            }
            "sh warning" => {
                let d = parse_script("job.sh", body)
                    .unwrap_or_else(|e| panic!("DIRECTIVES.md:{line}: example rejected:\n{e}"));
                let shown: Vec<String> = d.warnings.iter().map(|w| w.to_string()).collect();
                let shown = shown.join("\n");
                assert_eq!(
                    shown,
                    expected(),
                    "DIRECTIVES.md:{line}: warnings differ; actual:\n{shown}"
                );
            }
            "list" => {
                let script = "#DW jobdw type=scratch access_mode=striped capacity=1TiB\n\
                              #DW stage_in type=list source=/pfs/today.list destination=$DW_JOB_STRIPED/today\n";
                let stage = &parse_script("job.sh", script)
                    .expect("list directive")
                    .stage_in[0];
                parse_stage_list("today.list", body, stage).unwrap_or_else(|DirectiveErrors(e)| {
                    panic!("DIRECTIVES.md:{line}: list rejected: {e:#?}")
                });
            }
            _ => continue,
        }
        checked += 1;
    }
    // Guards the harness itself: a broken fence parser would check nothing and pass.
    assert!(
        checked >= 12,
        "only {checked} examples found in docs/DIRECTIVES.md"
    );
}
