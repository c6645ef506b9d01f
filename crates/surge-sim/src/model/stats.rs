//! What the simulation measures: time series binned every `sample` simulated seconds (Liu's
//! Figures 5 and 6 use 10 s), and per-application I/O phases for the perceived bandwidth.
//!
//! Bytes are counted when they leave the compute node (writes) or arrive at it (reads), and
//! when a LUN finishes them (storage); a transfer unit is counted whole in the bin where it
//! finishes, so a bin can show slightly more than a link's bandwidth when a unit straddles it.

use crate::engine::SimTime;
use serde::Serialize;

/// Per-bin counters of the whole machine.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Bin {
    pub cn_write_bytes: u64,
    pub cn_read_bytes: u64,
    pub storage_write_bytes: u64,
    pub storage_read_bytes: u64,
    /// Data written into the SSDs (absorbed).
    pub bb_in_bytes: u64,
    /// Data read out of the SSDs (drain and reads served by the burst buffer).
    pub bb_out_bytes: u64,
    /// Sum of LUN service time in this bin (ns), for utilisation.
    pub lun_busy_ns: u64,
    /// Highest burst-buffer occupancy (all IONs, reserved + dirty) seen in the bin.
    pub bb_occupancy_bytes: u64,
}

/// Most bins a series keeps; beyond this, neighbouring bins are merged and the sample doubles,
/// so memory stays bounded however long the simulated span (1 Mi bins of 10 s are 121 days).
pub const MAX_BINS: usize = 1 << 20;

/// Time series of one run.
#[derive(Clone, Debug)]
pub struct Series {
    pub sample_ns: SimTime,
    pub bins: Vec<Bin>,
    /// Bytes each application moved at its compute nodes (write + read), per bin:
    /// `app_cn[bin * apps + app]`.
    pub app_cn: Vec<u64>,
    pub apps: usize,
    occupancy_now: u64,
    occupancy_bin: usize,
}

impl Series {
    pub fn new(sample_ns: SimTime, apps: usize) -> Self {
        Series {
            sample_ns: sample_ns.max(1),
            bins: Vec::new(),
            app_cn: Vec::new(),
            apps,
            occupancy_now: 0,
            occupancy_bin: 0,
        }
    }

    /// Index of the bin holding `t`, growing (or coarsening) the series as needed.
    #[inline]
    fn index(&mut self, t: SimTime) -> usize {
        let b = (t / self.sample_ns) as usize;
        if b < self.bins.len() {
            return b;
        }
        self.grow(b);
        (t / self.sample_ns) as usize
    }

    #[cold]
    fn grow(&mut self, b: usize) {
        if b >= MAX_BINS {
            self.coarsen();
            // `b` was computed with the old sample; callers recompute their index.
            return self.grow(b / 2);
        }
        self.bins.resize(b + 1, Bin::default());
        self.app_cn.resize((b + 1) * self.apps, 0);
    }

    /// Merges bins pairwise and doubles the sample width.
    fn coarsen(&mut self) {
        let n = self.bins.len().div_ceil(2);
        for i in 0..n {
            let a = self.bins[2 * i];
            let b = self.bins.get(2 * i + 1).copied().unwrap_or_default();
            self.bins[i] = Bin {
                cn_write_bytes: a.cn_write_bytes + b.cn_write_bytes,
                cn_read_bytes: a.cn_read_bytes + b.cn_read_bytes,
                storage_write_bytes: a.storage_write_bytes + b.storage_write_bytes,
                storage_read_bytes: a.storage_read_bytes + b.storage_read_bytes,
                bb_in_bytes: a.bb_in_bytes + b.bb_in_bytes,
                bb_out_bytes: a.bb_out_bytes + b.bb_out_bytes,
                lun_busy_ns: a.lun_busy_ns + b.lun_busy_ns,
                bb_occupancy_bytes: a.bb_occupancy_bytes.max(b.bb_occupancy_bytes),
            };
            for app in 0..self.apps {
                let x = self.app_cn[2 * i * self.apps + app];
                let y = self
                    .app_cn
                    .get((2 * i + 1) * self.apps + app)
                    .copied()
                    .unwrap_or(0);
                self.app_cn[i * self.apps + app] = x + y;
            }
        }
        self.bins.truncate(n);
        self.app_cn.truncate(n * self.apps);
        self.sample_ns *= 2;
        self.occupancy_bin /= 2;
    }

    #[inline]
    pub fn cn(&mut self, t: SimTime, app: usize, bytes: u64, read: bool) {
        let b = self.index(t);
        let bin = &mut self.bins[b];
        if read {
            bin.cn_read_bytes += bytes;
        } else {
            bin.cn_write_bytes += bytes;
        }
        self.app_cn[b * self.apps + app] += bytes;
    }

    #[inline]
    pub fn storage(&mut self, t: SimTime, bytes: u64, read: bool, busy: SimTime) {
        let b = self.index(t);
        let bin = &mut self.bins[b];
        if read {
            bin.storage_read_bytes += bytes;
        } else {
            bin.storage_write_bytes += bytes;
        }
        bin.lun_busy_ns += busy;
    }

    #[inline]
    pub fn bb(&mut self, t: SimTime, bytes: u64, read: bool) {
        let b = self.index(t);
        let bin = &mut self.bins[b];
        if read {
            bin.bb_out_bytes += bytes;
        } else {
            bin.bb_in_bytes += bytes;
        }
    }

    /// Records the total burst-buffer occupancy after a change at `t`.
    pub fn occupancy(&mut self, t: SimTime, now_bytes: u64) {
        let b = self.index(t);
        // Bins since the last change held the previous level throughout.
        let prev = self.occupancy_now;
        for bin in &mut self.bins[self.occupancy_bin + 1..=b.max(self.occupancy_bin)] {
            bin.bb_occupancy_bytes = bin.bb_occupancy_bytes.max(prev);
        }
        let bin = &mut self.bins[b];
        bin.bb_occupancy_bytes = bin.bb_occupancy_bytes.max(now_bytes).max(prev);
        self.occupancy_now = now_bytes;
        self.occupancy_bin = b;
    }

    /// Extends the series to `end` (so a quiet tail shows as zeros, not as missing data).
    pub fn close(&mut self, end: SimTime) {
        self.index(end.saturating_sub(1));
        let t = (self.bins.len() as u64 - 1) * self.sample_ns;
        let level = self.occupancy_now;
        self.occupancy(t, level);
    }
}

/// One I/O phase of an application: the k-th write or read statement every process executes.
#[derive(Clone, Copy, Debug)]
pub struct Phase {
    pub write: bool,
    /// Where the phase's region of the file starts.
    pub base: u64,
    pub start: SimTime,
    pub end: SimTime,
    pub bytes: u64,
    pub done: u32,
}

/// Length of the union of intervals, so overlapping phases are not counted twice.
pub fn union_length(mut spans: Vec<(SimTime, SimTime)>) -> SimTime {
    spans.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(SimTime, SimTime)> = None;
    for (s, e) in spans {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_of_intervals() {
        assert_eq!(union_length(vec![]), 0);
        assert_eq!(union_length(vec![(0, 10), (5, 15), (20, 25)]), 20);
        assert_eq!(union_length(vec![(20, 25), (0, 10), (2, 3)]), 15);
    }

    #[test]
    fn bytes_land_in_their_bins() {
        let mut s = Series::new(10, 2);
        s.cn(5, 0, 100, false);
        s.cn(15, 1, 50, true);
        s.storage(29, 7, false, 3);
        assert_eq!(s.bins.len(), 3);
        assert_eq!(s.bins[0].cn_write_bytes, 100);
        assert_eq!(s.bins[1].cn_read_bytes, 50);
        assert_eq!(s.app_cn, vec![100, 0, 0, 50, 0, 0]);
        assert_eq!(s.bins[2].storage_write_bytes, 7);
        assert_eq!(s.bins[2].lun_busy_ns, 3);
    }

    #[test]
    fn long_spans_coarsen_instead_of_growing_without_bound() {
        let mut s = Series::new(10, 1);
        s.cn(5, 0, 1, false);
        s.cn(15, 0, 2, false);
        s.occupancy(25, 9);
        // A byte far in the future: the series halves its resolution until it fits.
        let far = 10 * MAX_BINS as u64 * 3;
        s.cn(far, 0, 4, false);
        assert!(s.bins.len() <= MAX_BINS);
        assert_eq!(s.sample_ns, 40);
        assert_eq!(s.bins[0].cn_write_bytes, 3, "bins 0 and 1 merged");
        assert_eq!(s.bins[0].bb_occupancy_bytes, 9);
        let total: u64 = s.bins.iter().map(|b| b.cn_write_bytes).sum();
        assert_eq!(total, 7, "no byte lost");
        assert_eq!(s.app_cn.iter().sum::<u64>(), 7);
    }

    #[test]
    fn occupancy_is_carried_through_quiet_bins() {
        let mut s = Series::new(10, 1);
        s.occupancy(3, 500);
        s.occupancy(45, 100);
        s.close(70);
        let occ: Vec<u64> = s.bins.iter().map(|b| b.bb_occupancy_bytes).collect();
        assert_eq!(occ, vec![500, 500, 500, 500, 500, 100, 100]);
    }
}
