//! Durations as users write them (`300s`, `5min`, `2h`, `15us`) and the typed size, rate and
//! duration values of the system file. Sizes and rates are parsed by `surge-core` (one parser for
//! all of Surge); durations live here because only the simulator needs them so far.

use crate::engine::{SimTime, NS_PER_S};
use serde::{Deserialize, Deserializer};
use std::fmt;

const DURATION_UNITS: &[(&str, f64)] = &[
    ("ns", 1.0),
    ("us", 1e3),
    ("µs", 1e3),
    ("ms", 1e6),
    ("s", 1e9),
    ("sec", 1e9),
    ("min", 60e9),
    ("m", 60e9),
    ("h", 3600e9),
    ("d", 86400e9),
];

/// Parses a duration such as `300s`, `5min`, `2h`, `1.5ms`, `15us` into nanoseconds. A unit is
/// required (a bare `0` is allowed): `300` alone is ambiguous between seconds and microseconds.
pub fn parse_duration(text: &str) -> Result<SimTime, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(0);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| {
            format!("'{text}' has no unit (expected e.g. 300s, 5min, 2h, 1.5ms, 15us)")
        })?;
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' does not start with a number (expected e.g. 300s)"))?;
    let mult = DURATION_UNITS
        .iter()
        .find(|(u, _)| *u == unit.trim())
        .map(|(_, m)| *m)
        .ok_or_else(|| {
            format!(
                "'{text}' has an unknown time unit '{unit}' (expected ns, us, ms, s, min, h, d)"
            )
        })?;
    let ns = value * mult;
    // 2^61 ns is 73 years: far beyond any run, and sums of such durations cannot overflow.
    if !ns.is_finite() || ns > (1u64 << 61) as f64 {
        return Err(format!("'{text}' is too long (at most 73 years)"));
    }
    Ok(ns.round() as SimTime)
}

/// Formats nanoseconds compactly: `850ns`, `15us`, `2.5ms`, `42.3s`, `1h23m`.
pub fn format_duration(ns: SimTime) -> String {
    let s = ns as f64 / NS_PER_S as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{}us", trim_float(ns as f64 / 1e3))
    } else if ns < NS_PER_S {
        format!("{}ms", trim_float(ns as f64 / 1e6))
    } else if s < 600.0 {
        format!("{s:.1}s")
    } else {
        let total = s.round() as u64;
        let (h, m, sec) = (total / 3600, (total % 3600) / 60, total % 60);
        if h > 0 {
            format!("{h}h{m:02}m{sec:02}s")
        } else {
            format!("{m}m{sec:02}s")
        }
    }
}

/// `15.000` -> `15`, `2.500` -> `2.5`.
fn trim_float(v: f64) -> String {
    format!("{v:.3}")
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_string()
}

/// Formats a rate in bytes/s as GiB/s or MiB/s.
pub fn format_rate(bytes_per_s: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if bytes_per_s >= GIB {
        format!("{:.2} GiB/s", bytes_per_s / GIB)
    } else {
        format!("{:.1} MiB/s", bytes_per_s / MIB)
    }
}

/// A size in the system file: `"4MiB"`, `"400GiB"` or a plain integer (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

/// A bandwidth in the system file: `"700MiB/s"`, `"1.3GiB/s"`, or `"unlimited"` (`None`: the
/// component is never a bottleneck and is left out of the event path).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate(pub Option<f64>);

/// A duration in the system file: `"15us"`, `"1ms"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Duration(pub SimTime);

#[derive(Deserialize)]
#[serde(untagged)]
enum TextOrInt {
    Text(String),
    Int(i64),
    Float(f64),
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match TextOrInt::deserialize(d)? {
            TextOrInt::Text(s) => surge_core::parse_size(&s)
                .map(Size)
                .map_err(serde::de::Error::custom),
            TextOrInt::Int(i) if i >= 0 => Ok(Size(i as u64)),
            TextOrInt::Float(f) => Err(serde::de::Error::custom(format!(
                "{f} is not a whole number of bytes; write a size with a unit such as \"1.5GiB\""
            ))),
            TextOrInt::Int(i) => Err(serde::de::Error::custom(format!(
                "{i} is negative; expected a size such as \"4MiB\" or a number of bytes"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match TextOrInt::deserialize(d)? {
            TextOrInt::Text(s) if s.trim().eq_ignore_ascii_case("unlimited") => Ok(Rate(None)),
            TextOrInt::Text(s) => {
                let v = surge_core::parse_rate(&s).map_err(serde::de::Error::custom)?;
                if v == 0 {
                    return Err(serde::de::Error::custom(format!(
                        "'{s}' is zero; a component with no bandwidth would never finish (use \"unlimited\" to leave it out)"
                    )));
                }
                Ok(Rate(Some(v as f64)))
            }
            TextOrInt::Int(i) => Err(serde::de::Error::custom(format!(
                "{i} has no unit; expected a rate such as \"700MiB/s\" or \"unlimited\""
            ))),
            TextOrInt::Float(f) => Err(serde::de::Error::custom(format!(
                "{f} has no unit; expected a rate such as \"1.3GiB/s\" or \"unlimited\""
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match TextOrInt::deserialize(d)? {
            TextOrInt::Text(s) => parse_duration(&s)
                .map(Duration)
                .map_err(serde::de::Error::custom),
            TextOrInt::Int(0) => Ok(Duration(0)),
            TextOrInt::Int(i) => Err(serde::de::Error::custom(format!(
                "{i} has no unit; expected a duration such as \"15us\" or \"1ms\""
            ))),
            TextOrInt::Float(f) => Err(serde::de::Error::custom(format!(
                "{f} has no unit; expected a duration such as \"1.5ms\""
            ))),
        }
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&surge_core::format_bytes(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("300s").unwrap(), 300 * NS_PER_S);
        assert_eq!(parse_duration("5min").unwrap(), 300 * NS_PER_S);
        assert_eq!(parse_duration("2h").unwrap(), 7200 * NS_PER_S);
        assert_eq!(parse_duration("1.5ms").unwrap(), 1_500_000);
        assert_eq!(parse_duration("15us").unwrap(), 15_000);
        assert_eq!(parse_duration("15µs").unwrap(), 15_000);
        assert_eq!(parse_duration("70s").unwrap(), 70 * NS_PER_S);
        assert_eq!(parse_duration("0").unwrap(), 0);
    }

    #[test]
    fn durations_need_a_known_unit() {
        assert!(parse_duration("300").unwrap_err().contains("no unit"));
        assert!(parse_duration("3 parsecs")
            .unwrap_err()
            .contains("unknown time unit"));
        assert!(parse_duration("s").unwrap_err().contains("number"));
    }

    #[test]
    fn durations_format_compactly() {
        assert_eq!(format_duration(850), "850ns");
        assert_eq!(format_duration(15_000), "15us");
        assert_eq!(format_duration(2_500_000), "2.5ms");
        assert_eq!(format_duration(42_300_000_000), "42.3s");
        assert_eq!(
            format_duration(5 * 3600 * NS_PER_S + 60 * NS_PER_S),
            "5h01m00s"
        );
    }
}
