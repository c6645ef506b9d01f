//! The discrete-event engine: a priority queue of timestamped events and a seeded random number
//! generator. It knows nothing about storage; the model in [`crate::model`] gives it events.
//!
//! Determinism is the contract: events pop in (time, insertion sequence) order, so two events at
//! the same simulated nanosecond are handled in the order they were scheduled, and the only
//! source of randomness is [`Rng`] seeded by the user. The same inputs and seed give the same
//! event trace, bit for bit, on any machine.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Simulated time in nanoseconds since the start of the run. 2^64 ns is 584 years, and integer
/// time keeps ties exact (two flows finishing "at the same time" really tie).
pub type SimTime = u64;

/// Nanoseconds per second, for conversions at the edges.
pub const NS_PER_S: u64 = 1_000_000_000;

/// Seconds as a float, for reports.
pub fn secs(t: SimTime) -> f64 {
    t as f64 / NS_PER_S as f64
}

struct Entry<E> {
    time: SimTime,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    // `BinaryHeap` is a max-heap: reverse so the earliest (time, seq) is on top.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// The future event list. Events scheduled for the same time pop in scheduling order.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_seq: u64,
    now: SimTime,
    popped: u64,
    peak_len: usize,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    pub fn new() -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(1 << 16),
            next_seq: 0,
            now: 0,
            popped: 0,
            peak_len: 0,
        }
    }

    /// Schedules `event` at time `at`. An event in the past is a model bug; it is run "now"
    /// rather than breaking causality (and trips a debug assertion).
    pub fn schedule(&mut self, at: SimTime, event: E) {
        debug_assert!(at >= self.now, "event scheduled in the past: {at} < {}", self.now);
        let time = at.max(self.now);
        self.heap.push(Entry {
            time,
            seq: self.next_seq,
            event,
        });
        self.next_seq += 1;
        if self.heap.len() > self.peak_len {
            self.peak_len = self.heap.len();
        }
    }

    /// Removes the earliest event and advances the clock to its time.
    pub fn pop(&mut self) -> Option<(SimTime, E)> {
        let e = self.heap.pop()?;
        self.now = e.time;
        self.popped += 1;
        Some((e.time, e.event))
    }

    /// Time of the earliest pending event, without removing it.
    pub fn peek_time(&self) -> Option<SimTime> {
        self.heap.peek().map(|e| e.time)
    }

    /// The current simulated time: the time of the last event popped.
    pub fn now(&self) -> SimTime {
        self.now
    }

    /// Events handled so far.
    pub fn processed(&self) -> u64 {
        self.popped
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The largest number of events that were ever waiting at once.
    pub fn peak_len(&self) -> usize {
        self.peak_len
    }
}

/// SplitMix64 (Steele, Lea and Flood 2014): tiny, fast, and fully specified, so a seed gives the
/// same stream on every platform and every version of Surge (a crate's generator may change).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The SplitMix64 finaliser: a stateless hash of one word, used to place files on servers
/// deterministically from the seed.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_in_time_order() {
        let mut q = EventQueue::new();
        for (t, id) in [(30, 'c'), (10, 'a'), (20, 'b'), (5, 'z')] {
            q.schedule(t, id);
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(5, 'z'), (10, 'a'), (20, 'b'), (30, 'c')]);
        assert_eq!(q.now(), 30);
        assert_eq!(q.processed(), 4);
    }

    #[test]
    fn ties_pop_in_scheduling_order() {
        let mut q = EventQueue::new();
        for i in 0..1000u32 {
            q.schedule(7, i);
        }
        q.schedule(3, 9999);
        assert_eq!(q.pop(), Some((3, 9999)));
        for i in 0..1000u32 {
            assert_eq!(q.pop(), Some((7, i)));
        }
        assert!(q.is_empty());
    }

    #[test]
    fn events_scheduled_while_running_respect_order() {
        // An event scheduled "now" from a handler runs after everything already due now.
        let mut q = EventQueue::new();
        q.schedule(10, 1);
        q.schedule(10, 2);
        let (t, e) = q.pop().unwrap();
        assert_eq!((t, e), (10, 1));
        q.schedule(10, 3);
        q.schedule(11, 4);
        let rest: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(rest, vec![2, 3, 4]);
    }

    #[test]
    fn rng_is_reproducible_and_seed_dependent() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(43);
            (0..5).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The published SplitMix64 stream for seed 0 starts with this value.
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn rng_floats_are_in_unit_interval_and_spread() {
        let mut r = Rng::new(7);
        let xs: Vec<f64> = (0..10_000).map(|_| r.next_f64()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }
}
