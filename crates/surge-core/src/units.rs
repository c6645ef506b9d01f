//! Sizes and rates as users write them, parsed once for all of Surge.
//!
//! Sizes follow Slurm's reading of burst-buffer capacities: `KiB`, `MiB`, `GiB`, `TiB`, `PiB` are
//! powers of 1024 and `KB`, `MB`, `GB`, `TB`, `PB` powers of 1000. A bare `K`/`M`/`G`/`T`/`P` is
//! a power of 1024 (Slurm's habit), a bare number is bytes. Unlike Slurm 22.05 (which reads
//! `3.5TB` as `3`), a decimal point is honoured: `3.5TB` is 3.5e12 bytes, rounded up to a byte.
//!
//! Rates are a size or a count followed by `/s`: `4GiB/s` (bytes per second), `50k/s` (operations
//! per second, `k`/`M` meaning 1e3/1e6 for counts).

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseUnitError {
    #[error("empty value, expected a size such as 10GiB")]
    Empty,
    #[error("'{0}' does not start with a number (expected e.g. 10GiB, 500GB, 8MiB)")]
    NoNumber(String),
    #[error("'{text}' has an unknown unit '{unit}' (expected one of B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB)")]
    UnknownUnit { text: String, unit: String },
    #[error("'{0}' is too large")]
    Overflow(String),
    #[error("'{0}' is not a rate (expected e.g. 4GiB/s or 50k/s)")]
    NotARate(String),
}

const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("B", 1),
    ("K", 1 << 10),
    ("KiB", 1 << 10),
    ("KB", 1_000),
    ("M", 1 << 20),
    ("MiB", 1 << 20),
    ("MB", 1_000_000),
    ("G", 1 << 30),
    ("GiB", 1 << 30),
    ("GB", 1_000_000_000),
    ("T", 1 << 40),
    ("TiB", 1 << 40),
    ("TB", 1_000_000_000_000),
    ("P", 1 << 50),
    ("PiB", 1 << 50),
    ("PB", 1_000_000_000_000_000),
];

/// Splits "3.5TB" into ("3", "5", "TB"): integer digits, fraction digits, unit.
fn split_number(text: &str) -> Result<(&str, &str, &str), ParseUnitError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ParseUnitError::Empty);
    }
    let int_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (int, rest) = t.split_at(int_end);
    let (frac, unit) = match rest.strip_prefix('.') {
        Some(after) => {
            let frac_end = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            after.split_at(frac_end)
        }
        None => ("", rest),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(ParseUnitError::NoNumber(text.to_string()));
    }
    Ok((int, frac, unit.trim()))
}

/// `int.frac * mult`, rounded up, exactly (no floating point).
fn scale(text: &str, int: &str, frac: &str, mult: u64) -> Result<u64, ParseUnitError> {
    let overflow = || ParseUnitError::Overflow(text.to_string());
    let int_v: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| overflow())?
    };
    let mut total = int_v.checked_mul(u128::from(mult)).ok_or_else(overflow)?;
    if !frac.is_empty() {
        let frac = &frac[..frac.len().min(30)];
        let frac_v: u128 = frac.parse().map_err(|_| overflow())?;
        let denom = 10u128.checked_pow(frac.len() as u32).ok_or_else(overflow)?;
        let num = frac_v.checked_mul(u128::from(mult)).ok_or_else(overflow)?;
        total = total
            .checked_add(num.div_ceil(denom))
            .ok_or_else(overflow)?;
    }
    u64::try_from(total).map_err(|_| overflow())
}

/// Parses a size in bytes: `10GiB`, `500GB`, `8MiB`, `3.5TB`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, ParseUnitError> {
    let (int, frac, unit) = split_number(text)?;
    let mult = SIZE_UNITS
        .iter()
        .find(|(u, _)| u.eq_ignore_ascii_case(unit))
        .map(|(_, m)| *m)
        .ok_or_else(|| ParseUnitError::UnknownUnit {
            text: text.to_string(),
            unit: unit.to_string(),
        })?;
    // Case-insensitive: "gib" is GiB and "gb" is GB (the 'i' is what tells them apart).
    scale(text, int, frac, mult)
}

/// Parses a rate: `4GiB/s` gives bytes per second, `50k/s` operations per second.
/// Returns the value per second.
pub fn parse_rate(text: &str) -> Result<u64, ParseUnitError> {
    let t = text.trim();
    let Some(body) = t.strip_suffix("/s") else {
        return Err(ParseUnitError::NotARate(text.to_string()));
    };
    let (int, frac, unit) = split_number(body)?;
    // Counts: k = 1e3, M = 1e6 (an operation rate is never a power of two).
    let count_mult = match unit {
        "k" => Some(1_000),
        "m" | "M" if !body.ends_with("MB") && !body.ends_with("MiB") => Some(1_000_000),
        _ => None,
    };
    if let Some(m) = count_mult {
        return scale(text, int, frac, m);
    }
    parse_size(body)
}

/// Formats a byte count as a directive capacity that [`parse_size`] reads back exactly (or
/// rounded up to a MiB): `200GiB`, `1792MiB`.
pub fn capacity_text(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    let bytes = bytes.max(1);
    if bytes.is_multiple_of(GIB) {
        format!("{}GiB", bytes / GIB)
    } else {
        format!("{}MiB", bytes.div_ceil(MIB))
    }
}

/// Formats bytes with binary units, e.g. `1.5 GiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const NAMES: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < NAMES.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else if v >= 100.0 || (v - v.round()).abs() < 0.005 {
        format!("{v:.0} {}", NAMES[i])
    } else {
        format!("{v:.2} {}", NAMES[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units_are_distinct() {
        assert_eq!(parse_size("1KiB").unwrap(), 1024);
        assert_eq!(parse_size("1KB").unwrap(), 1000);
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("10GB").unwrap(), 10_000_000_000);
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        assert_eq!(parse_size("2TB").unwrap(), 2_000_000_000_000);
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("8MB").unwrap(), 8_000_000);
    }

    #[test]
    fn bare_number_is_bytes_and_bare_letter_is_binary() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4096B").unwrap(), 4096);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
    }

    #[test]
    fn decimal_point_is_honoured_unlike_slurm() {
        assert_eq!(parse_size("3.5TB").unwrap(), 3_500_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size(".5KiB").unwrap(), 512);
        // Rounded up to a whole byte.
        assert_eq!(parse_size("1.0001KB").unwrap(), 1001);
    }

    #[test]
    fn errors_name_the_text() {
        let e = parse_size("10XB").unwrap_err();
        assert!(e.to_string().contains("10XB"), "{e}");
        assert!(matches!(
            parse_size("GiB"),
            Err(ParseUnitError::NoNumber(_))
        ));
        assert!(matches!(parse_size(""), Err(ParseUnitError::Empty)));
        assert!(matches!(
            parse_size("99999PiB"),
            Err(ParseUnitError::Overflow(_))
        ));
        assert!(matches!(
            parse_size("10 N"),
            Err(ParseUnitError::UnknownUnit { .. })
        ));
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("4GiB/s").unwrap(), 4 << 30);
        assert_eq!(parse_rate("50k/s").unwrap(), 50_000);
        assert_eq!(parse_rate("1.5M/s").unwrap(), 1_500_000);
        assert_eq!(parse_rate("100MB/s").unwrap(), 100_000_000);
        assert!(matches!(
            parse_rate("4GiB"),
            Err(ParseUnitError::NotARate(_))
        ));
    }

    #[test]
    fn format() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1 << 30), "1 GiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    }
}
