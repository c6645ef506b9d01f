//! What the directive tests share: parse a script expecting success, or expecting errors, and
//! check an error's line, text and message.

#![allow(dead_code)]

use surge_core::directives::{parse_script, DirectiveError, DirectiveErrors, Directives};

pub fn parse(text: &str) -> Directives {
    parse_script("job.sh", text).unwrap_or_else(|e| panic!("unexpected errors:\n{e}"))
}

pub fn errors(text: &str) -> Vec<DirectiveError> {
    match parse_script("job.sh", text) {
        Ok(d) => panic!("expected errors, got {d:#?}"),
        Err(DirectiveErrors(errors)) => errors,
    }
}

/// The single error of `text`, checked to be on `line` and about `offending`.
pub fn the_error(text: &str, line: usize, offending: &str) -> DirectiveError {
    let errors = errors(text);
    assert_eq!(
        errors.len(),
        1,
        "expected one error, got:\n{}",
        DirectiveErrors(errors.clone())
    );
    let e = errors.into_iter().next().expect("one error");
    assert_eq!((e.line, e.text.as_str()), (line, offending), "{e}");
    e
}

pub fn assert_says(e: &DirectiveError, words: &[&str]) {
    for w in words {
        assert!(e.message.contains(w), "message lacks {w:?}: {e}");
    }
}
