//! The cluster key: 32 random bytes shared by the manager and its servers, which sign and check
//! capabilities with it. It lives in a file readable by the service user only (0600; a key
//! file others can read is refused), created at install (`surge key create`) or by `surge run`
//! for its embedded manager and servers.

use crate::AuthError;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Where the key is when nothing says otherwise.
pub const DEFAULT_PATH: &str = "/etc/surge/surge.key";
/// The environment variable naming the key file.
pub const ENV: &str = "SURGE_KEY_FILE";
const LEN: usize = 32;

#[derive(Clone)]
pub struct Key([u8; LEN]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

fn err(path: &Path, message: impl Into<String>) -> AuthError {
    AuthError::Key {
        path: path.display().to_string(),
        message: message.into(),
    }
}

impl Key {
    /// The key file named by `SURGE_KEY_FILE`, else the default path.
    pub fn default_path() -> std::path::PathBuf {
        std::env::var_os(ENV)
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| DEFAULT_PATH.into())
    }

    /// A new random key.
    pub fn generate() -> Result<Key, AuthError> {
        let mut k = [0u8; LEN];
        getrandom::fill(&mut k).map_err(|e| AuthError::Key {
            path: String::new(),
            message: format!("no randomness: {e}"),
        })?;
        Ok(Key(k))
    }

    /// Writes the key to a new file at `path` (0600; its directory is made 0700 if missing).
    /// An existing file is never overwritten.
    pub fn create(path: &Path) -> Result<Key, AuthError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| err(path, format!("cannot create its directory: {e}")))?;
            }
        }
        let key = Key::generate()?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| err(path, format!("cannot create: {e}")))?;
        f.write_all(&key.0)
            .and_then(|_| f.sync_all())
            .map_err(|e| err(path, format!("cannot write: {e}")))?;
        Ok(key)
    }

    /// Reads the key at `path`, refusing a file other users could read or write.
    pub fn load(path: &Path) -> Result<Key, AuthError> {
        let md = std::fs::metadata(path).map_err(|e| {
            err(
                path,
                format!(
                    "{e} (the manager and servers need the cluster key: create it with \
                     `surge key create`, or name it with --key-file or {ENV})"
                ),
            )
        })?;
        if md.permissions().mode() & 0o077 != 0 {
            return Err(err(
                path,
                format!(
                    "mode {:o}: other users could read it; `chmod 600 {}`",
                    md.permissions().mode() & 0o777,
                    path.display()
                ),
            ));
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if md.uid() != me && me != 0 {
            return Err(err(
                path,
                format!("owned by uid {}, not by this user", md.uid()),
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| err(path, e.to_string()))?;
        let k: [u8; LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| err(path, format!("{} bytes, not {LEN}", bytes.len())))?;
        Ok(Key(k))
    }

    /// Loads the key at `path`, creating it first if it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Key, AuthError> {
        match Key::create(path) {
            Ok(k) => Ok(k),
            Err(_) if path.exists() => Key::load(path),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_private_and_a_readable_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k/surge.key");
        let k = Key::create(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(Key::load(&p).unwrap().bytes(), k.bytes());
        assert!(Key::create(&p).is_err(), "never overwritten");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Key::load(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }
}
