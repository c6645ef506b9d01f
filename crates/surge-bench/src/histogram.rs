//! Latency histogram in the manner of HDR Histogram: log-linear buckets (32 per power of two,
//! so any recorded value is known within 3%), fixed size, O(1) to record, cheap to merge across
//! processes and repetitions, and sent between processes as a sparse list of counts.

use serde::{Deserialize, Serialize};

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Indices 0..2*SUB are exact; each further power of two has SUB buckets.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// Per-operation latencies in nanoseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

#[inline]
fn index_of(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let sub = (v >> (e - SUB_BITS)) - SUB;
    ((e - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// Smallest value that lands in bucket `i`, and the bucket's width.
fn bucket_bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < 2 * SUB {
        return (i, 1);
    }
    let e = i / SUB + SUB_BITS as u64 - 1;
    let sub = i % SUB;
    let shift = e - SUB_BITS as u64;
    ((SUB + sub) << shift, 1u64 << shift)
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[index_of(ns)] += 1;
        self.count += 1;
        self.sum += u128::from(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The value below which a fraction `q` (0..=1) of recorded values fall, within the bucket
    /// precision (the middle of the bucket, clamped to the exact min and max).
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, width) = bucket_bounds(i);
                let mid = low + (width - 1) / 2;
                return Some(mid.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    /// The usual summary: min, mean, p50, p90, p99, p99.9, max, in microseconds.
    pub fn summary(&self) -> LatencySummary {
        let us = |v: Option<u64>| v.map(|ns| ns as f64 / 1e3).unwrap_or(0.0);
        LatencySummary {
            ops: self.count,
            min_us: us(self.min()),
            mean_us: self.mean().map(|ns| ns / 1e3).unwrap_or(0.0),
            p50_us: us(self.quantile(0.50)),
            p90_us: us(self.quantile(0.90)),
            p99_us: us(self.quantile(0.99)),
            p999_us: us(self.quantile(0.999)),
            max_us: us(self.max()),
        }
    }
}

/// Latency percentiles of a phase, microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub ops: u64,
    pub min_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// Wire form: only the non-empty buckets.
#[derive(Serialize, Deserialize)]
struct SparseHistogram {
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
    buckets: Vec<(u32, u64)>,
}

impl Serialize for Histogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SparseHistogram {
            count: self.count,
            sum: self.sum,
            min: self.min,
            max: self.max,
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| (i as u32, c))
                .collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Histogram {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let sp = SparseHistogram::deserialize(d)?;
        let mut h = Histogram::new();
        for (i, c) in sp.buckets {
            let slot = h
                .counts
                .get_mut(i as usize)
                .ok_or_else(|| serde::de::Error::custom(format!("bucket {i} out of range")))?;
            *slot = c;
        }
        h.count = sp.count;
        h.sum = sp.sum;
        h.min = sp.min;
        h.max = sp.max;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_within_three_percent() {
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 12345, u64::MAX / 3, u64::MAX]) {
            let i = index_of(v);
            assert!(i < BUCKETS, "{v}");
            let (low, width) = bucket_bounds(i);
            assert!(
                low <= v && v - low < width,
                "v={v} i={i} low={low} width={width}"
            );
            assert!(width as f64 <= (low as f64 / 32.0).max(1.0), "v={v}");
        }
    }

    #[test]
    fn quantiles_of_a_uniform_series() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000); // 1 us .. 1 ms
        }
        assert_eq!(h.count(), 1000);
        assert_eq!(h.min(), Some(1000));
        assert_eq!(h.max(), Some(1_000_000));
        let p50 = h.quantile(0.5).unwrap() as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.03, "{p50}");
        let p99 = h.quantile(0.99).unwrap() as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.03, "{p99}");
        assert_eq!(h.quantile(1.0), Some(1_000_000));
        assert!((h.mean().unwrap() - 500_500.0).abs() < 1e-6);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let (mut a, mut b, mut all) = (Histogram::new(), Histogram::new(), Histogram::new());
        for v in 0..3000u64 {
            let x = v * v % 77_777;
            if v % 2 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            all.record(x);
        }
        a.merge(&b);
        assert_eq!(a, all);
    }

    #[test]
    fn serde_round_trip_is_sparse_and_exact() {
        let mut h = Histogram::new();
        for v in [5u64, 5, 900, 1_000_000, 42_000_000_000] {
            h.record(v);
        }
        let text = serde_json::to_string(&h).unwrap();
        assert!(text.len() < 200, "{text}");
        let back: Histogram = serde_json::from_str(&text).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn empty_histogram_has_no_quantiles() {
        let h = Histogram::new();
        assert_eq!(h.quantile(0.5), None);
        assert_eq!(h.summary().p99_us, 0.0);
    }
}
