//! The interposition library, compiled by `build.rs` and embedded in the binary, written out to
//! a cache directory the first time it is needed (`$XDG_CACHE_HOME/surge/shim/`, else
//! `~/.cache/surge/shim/`, else the temp dir). The file name carries a hash of the bytes, so
//! two surge versions never overwrite each other's shim while one of them is in use.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The shim's bytes.
pub const SHIM_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libsurge_shim.so"));

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("surge/shim");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".cache/surge/shim");
    }
    std::env::temp_dir().join(format!("surge-shim-{}", surge_core::sys::user_name()))
}

/// Writes the shim out (once) and returns its path. The directory must be this user's own
/// (the shim is preloaded into every profiled process: a file planted there by another user
/// would run as this one).
pub fn install() -> anyhow::Result<PathBuf> {
    let dir = cache_dir();
    surge_core::private_dir::ensure_all(&dir)
        .map_err(|e| anyhow::anyhow!("the profiler's shim directory: {e}"))?;
    install_in(&dir)
}

/// Like [`install`], into a given directory.
pub fn install_in(dir: &Path) -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    let path = dir.join(format!("libsurge_shim-{:016x}.so", fnv1a(SHIM_SO)));
    // The same bytes, not just the same length: what is loaded is what this binary carries.
    if std::fs::read(&path).is_ok_and(|b| b == SHIM_SO) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the shim cache directory {}", dir.display()))?;
    // Write to a temporary name and rename, so a concurrent surge never loads half a file.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(SHIM_SO)
        .with_context(|| format!("cannot write the shim into {}", dir.display()))?;
    tmp.persist(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn installs_once_and_reuses_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = super::install_in(dir.path()).unwrap();
        let b = super::install_in(dir.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(std::fs::read(&a).unwrap(), super::SHIM_SO);
        assert_eq!(&super::SHIM_SO[..4], b"\x7fELF");
    }
}
