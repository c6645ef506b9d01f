//! The leader's copy of what it keeps in etcd, so that reads cost no round trip.
//!
//! Only the leader writes (every write is fenced on the leader key), so what it wrote is what
//! etcd holds, as long as it still leads. The copy is kept *by revision*: every value carries
//! the etcd revision it was read or written at, and an older one never replaces a newer one (a
//! read that started before a write and ended after it cannot undo the write). Deleted keys
//! are remembered as tombstones for the same reason.
//!
//! Two kinds of keys:
//! - **whole prefixes** ([`WHOLE`]): the live state (pools, servers, instances, open sessions,
//!   open tasks, ids, quotas), loaded whole at takeover and kept by this leader's writes; a
//!   key missing under one is known absent, and a listing is answered from here;
//! - **loose keys** (session and task rows, job-id lookups): learnt as they are read or
//!   written, at most [`LOOSE_MAX`] of them (the history is not held in memory); listings of
//!   their prefixes go to etcd.

use std::collections::BTreeMap;
use std::ops::Bound;

/// Prefixes (under the store's own prefix) held whole by a warm cache.
pub const WHOLE: &[&str] = &[
    "ids/",
    "instances/",
    "peaks/",
    "persistent/",
    "pools/",
    "quotas/",
    "servers/",
    "sessions-open/",
    "stage-totals/",
    "stages-open/",
];

/// Loose keys (rows of the history) held at most; past it they are all forgotten.
pub const LOOSE_MAX: usize = 50_000;

/// A change to a key, as written in one transaction.
#[derive(Clone, Debug)]
pub enum Change {
    Put(String, Vec<u8>),
    Delete(String),
    DeletePrefix(String),
}

#[derive(Default)]
pub struct Cache {
    /// key -> (revision, value; `None`: deleted).
    rows: BTreeMap<String, (i64, Option<Vec<u8>>)>,
    /// The full prefixes of [`WHOLE`] (with the store's prefix), once loaded.
    whole: Vec<String>,
    loose: usize,
    /// Nothing read at a revision below this is learnt (loose keys were forgotten at it).
    floor: i64,
    /// The highest revision seen.
    top: i64,
}

impl Cache {
    /// Marks `prefix` loaded with `rows` (read at `revision`).
    pub fn load(&mut self, prefix: &str, rows: Vec<(String, Vec<u8>)>, revision: i64) {
        for (k, v) in rows {
            self.rows.insert(k, (revision, Some(v)));
        }
        self.top = self.top.max(revision);
        if !self.whole.iter().any(|w| w == prefix) {
            self.whole.push(prefix.to_string());
        }
    }

    fn is_whole(&self, key: &str) -> bool {
        self.whole.iter().any(|w| key.starts_with(w.as_str()))
    }

    /// What the cache knows of `key`: `Some(None)` if known absent, `None` if not known.
    pub fn get(&self, key: &str) -> Option<Option<Vec<u8>>> {
        match self.rows.get(key) {
            Some((_, v)) => Some(v.clone()),
            None if self.is_whole(key) => Some(None),
            None => None,
        }
    }

    /// Records `value` of `key` as read or written at `revision` (ignored if the cache knows
    /// a newer one).
    pub fn learn(&mut self, key: &str, revision: i64, value: Option<Vec<u8>>) {
        if revision < self.floor {
            return;
        }
        self.top = self.top.max(revision);
        let whole = self.is_whole(key);
        match self.rows.get_mut(key) {
            Some((r, _)) if *r > revision => {}
            Some(slot) => {
                if whole && value.is_none() {
                    self.rows.remove(key);
                } else {
                    *slot = (revision, value);
                }
            }
            None => {
                // A whole prefix keeps no tombstones: only this leader writes it, and no read
                // of it goes to etcd while the cache is warm.
                if whole && value.is_none() {
                    return;
                }
                self.rows.insert(key.to_string(), (revision, value));
                if !whole {
                    self.loose += 1;
                    if self.loose > LOOSE_MAX {
                        self.forget_loose();
                    }
                }
            }
        }
    }

    /// [`Self::learn`] for a value read from etcd: only of a loose key (a whole prefix is
    /// never read from etcd while warm, and keeps no tombstones a late read could pass).
    pub fn learn_read(&mut self, key: &str, revision: i64, value: Option<Vec<u8>>) {
        if !self.is_whole(key) {
            self.learn(key, revision, value);
        }
    }

    fn forget_loose(&mut self) {
        let whole = std::mem::take(&mut self.whole);
        self.rows
            .retain(|k, _| whole.iter().any(|w| k.starts_with(w.as_str())));
        self.whole = whole;
        self.loose = 0;
        self.floor = self.top + 1;
    }

    /// Applies the changes of a transaction committed at `revision`.
    pub fn apply(&mut self, changes: &[Change], revision: i64) {
        for c in changes {
            match c {
                Change::Put(k, v) => self.learn(k, revision, Some(v.clone())),
                Change::Delete(k) => self.learn(k, revision, None),
                Change::DeletePrefix(p) => {
                    let keys: Vec<String> = self
                        .rows
                        .range::<str, _>((Bound::Included(p.as_str()), Bound::Unbounded))
                        .take_while(|(k, _)| k.starts_with(p.as_str()))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in keys {
                        self.learn(&k, revision, None);
                    }
                }
            }
        }
    }

    /// Every (key, value) under `prefix` in key order, if the cache holds that prefix whole.
    pub fn range(&self, prefix: &str) -> Option<Vec<(String, Vec<u8>)>> {
        if !self.is_whole(prefix) {
            return None;
        }
        Some(
            self.rows
                .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix))
                .filter_map(|(k, (_, v))| v.as_ref().map(|v| (k.clone(), v.clone())))
                .collect(),
        )
    }

    /// At most `limit` keys under `prefix` below `before` (all when `None`), highest first, if
    /// the cache holds that prefix whole.
    pub fn range_desc(
        &self,
        prefix: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Option<Vec<(String, Vec<u8>)>> {
        if !self.is_whole(prefix) {
            return None;
        }
        let upper = match before {
            Some(b) => Bound::Excluded(b),
            None => Bound::Unbounded,
        };
        Some(
            self.rows
                .range::<str, _>((Bound::Included(prefix), upper))
                .rev()
                .filter(|(k, _)| k.starts_with(prefix))
                .filter_map(|(k, (_, v))| v.as_ref().map(|v| (k.clone(), v.clone())))
                .take(limit)
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warm() -> Cache {
        let mut c = Cache::default();
        c.load(
            "/s/instances/",
            vec![("/s/instances/1".into(), b"a".to_vec())],
            10,
        );
        c
    }

    #[test]
    fn an_older_read_never_replaces_a_newer_write() {
        let mut c = warm();
        c.apply(&[Change::Put("/s/sessions/7".into(), b"new".to_vec())], 20);
        c.learn("/s/sessions/7", 15, Some(b"old".to_vec()));
        assert_eq!(c.get("/s/sessions/7"), Some(Some(b"new".to_vec())));
        c.apply(&[Change::Delete("/s/sessions/7".into())], 21);
        c.learn("/s/sessions/7", 20, Some(b"new".to_vec()));
        assert_eq!(c.get("/s/sessions/7"), Some(None), "a tombstone holds");
    }

    #[test]
    fn a_whole_prefix_answers_absent_keys_and_listings() {
        let mut c = warm();
        assert_eq!(c.get("/s/instances/2"), Some(None));
        assert_eq!(c.get("/s/sessions/2"), None, "loose keys are asked of etcd");
        c.apply(&[Change::Put("/s/instances/2".into(), b"b".to_vec())], 11);
        let keys = |v: Vec<(String, Vec<u8>)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            keys(c.range("/s/instances/").unwrap_or_default()),
            ["/s/instances/1", "/s/instances/2"]
        );
        assert_eq!(
            keys(
                c.range_desc("/s/instances/", Some("/s/instances/2"), 5)
                    .unwrap_or_default()
            ),
            ["/s/instances/1"]
        );
        c.apply(&[Change::DeletePrefix("/s/instances/".into())], 12);
        assert_eq!(c.range("/s/instances/"), Some(vec![]));
        assert!(c.range("/s/sessions/").is_none());
    }

    #[test]
    fn the_history_is_forgotten_past_its_bound_and_stale_reads_stay_out() {
        let mut c = warm();
        for i in 0..=LOOSE_MAX as i64 {
            c.learn(&format!("/s/sessions/{i}"), 100 + i, Some(vec![]));
        }
        assert_eq!(c.get("/s/sessions/1"), None);
        assert_eq!(c.get("/s/instances/1"), Some(Some(b"a".to_vec())));
        c.learn("/s/sessions/1", 50, Some(vec![]));
        assert_eq!(c.get("/s/sessions/1"), None, "read before the forgetting");
    }
}
