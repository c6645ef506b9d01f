//! Importers: profiles from what people already have. `strace -f -T -tt` logs ([`strace`]) and
//! Darshan logs ([`darshan`]: `darshan-parser` text, or a binary log read through
//! `darshan-parser` if installed, else PyDarshan). A saved `surge.profile/1` JSON loads as is.

pub mod darshan;
pub mod strace;

use crate::model::{Profile, PROFILE_SCHEMA};
use anyhow::Context;
use std::path::Path;

/// The formats `--from` understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Decide from the content.
    Auto,
    /// A profile saved by `surge profile` (surge.profile/1 JSON).
    Profile,
    /// `strace -f -T -tt` (or -ttt) output.
    Strace,
    /// `darshan-parser` text output.
    DarshanText,
    /// A binary Darshan log (.darshan).
    Darshan,
}

/// Darshan's binary logs start with their format version as a NUL-terminated string ("3.41").
fn looks_like_darshan_log(bytes: &[u8]) -> bool {
    bytes.len() > 8 && bytes[0].is_ascii_digit() && bytes[1] == b'.' && bytes[2..8].contains(&0)
}

fn detect(path: &Path, head: &[u8]) -> Format {
    let text = String::from_utf8_lossy(head);
    let t = text.trim_start();
    // JSON: a saved profile (its schema tag is checked when it is read).
    if t.starts_with('{') {
        return Format::Profile;
    }
    if text.contains("# darshan log version") || text.contains("#<module>\t<rank>") {
        return Format::DarshanText;
    }
    if path.extension().is_some_and(|e| e == "darshan") || looks_like_darshan_log(head) {
        return Format::Darshan;
    }
    Format::Strace
}

/// Loads a profile from any supported file.
pub fn load(path: &Path, format: Format, stage: &str) -> anyhow::Result<Profile> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let format = match format {
        Format::Auto => detect(path, &bytes[..bytes.len().min(4096)]),
        f => f,
    };
    tracing::debug!(?format, "loading {}", path.display());
    let file = path.display().to_string();
    match format {
        Format::Profile => {
            let p: Profile = serde_json::from_slice(&bytes)
                .with_context(|| format!("{file} is not a valid surge profile"))?;
            if p.schema != PROFILE_SCHEMA {
                anyhow::bail!(
                    "{file} has schema '{}', expected '{PROFILE_SCHEMA}'",
                    p.schema
                );
            }
            Ok(p)
        }
        // (Auto was resolved by detect(), which never answers Auto.)
        Format::Strace | Format::Auto => {
            let text = String::from_utf8_lossy(&bytes);
            Ok(strace::parse(&text, stage, &file)?)
        }
        Format::DarshanText => {
            let text = String::from_utf8_lossy(&bytes);
            Ok(darshan::parse_text(
                &text,
                stage,
                &file,
                "darshan-parser text",
            )?)
        }
        Format::Darshan => darshan::load_binary(path, stage),
    }
}
