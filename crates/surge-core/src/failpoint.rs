//! Failpoints: named places where a process can be made to die on purpose, so tests can
//! crash a daemon at the exact step a real crash would cut (FoundationDB's and TiKV's `fail`
//! are the models). `SURGE_FAILPOINTS=name[,name...]` in a process's environment makes it
//! abort (as `kill -9` would stop it: nothing is flushed or cleaned up) the first time it
//! reaches one of them. Unset, a failpoint costs one load of a cached empty list.

use std::sync::OnceLock;

fn armed() -> &'static [String] {
    static ARMED: OnceLock<Vec<String>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var("SURGE_FAILPOINTS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    })
}

/// Dies here if `name` is armed.
pub fn hit(name: &str) {
    if armed().iter().any(|a| a == name) {
        eprintln!("failpoint {name}: aborting (SURGE_FAILPOINTS)");
        std::process::abort();
    }
}
