//! Fragment placement (DESIGN §2, Daley §2.2): the capacity is rounded up to the pool's
//! granularity, one fragment per server where possible, least-used servers first, so an
//! instance's bandwidth grows with its capacity. Pure functions, tested without servers.

use thiserror::Error;

/// A server that can receive fragments.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub id: String,
    /// Capacity the server offers.
    pub capacity: u64,
    /// Capacity already promised to fragments.
    pub reserved: u64,
    /// Namespaces (metadata services) it already serves.
    pub namespaces: u32,
}

/// Where an instance goes: indexes into the candidate list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// One entry per fragment, in layout order: (candidate index, fragment capacity).
    pub fragments: Vec<(usize, u64)>,
    /// Metadata server of each namespace (namespace i on entry i).
    pub namespaces: Vec<usize>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("capacity must be positive")]
    ZeroCapacity,
    #[error("the pool has no server that is up")]
    NoServers,
    #[error(
        "{needed} fragments asked: an instance has at most {} (a larger granularity makes fewer)",
        surge_core::limits::MAX_INSTANCE_FRAGMENTS
    )]
    TooManyFragments { needed: u64 },
    #[error(
        "{namespaces} namespaces asked: an instance has at most {} (one per compute node)",
        surge_core::limits::MAX_JOB_NODES
    )]
    TooManyNamespaces { namespaces: u32 },
    #[error(
        "not enough space: {needed} fragments of {} ({}) are needed but the pool's servers can \
         take only {placed} more (free per server: {})",
        surge_core::format_bytes(*granularity),
        surge_core::format_bytes(needed.saturating_mul(*granularity)),
        human_list(free)
    )]
    NoSpace {
        needed: u64,
        placed: u64,
        granularity: u64,
        free: Vec<u64>,
    },
}

/// `4.5 GiB, 0 B, ...`: byte counts as a reader wants them.
fn human_list(v: &[u64]) -> String {
    v.iter()
        .map(|b| surge_core::format_bytes(*b))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Number of fragments for `capacity` at `granularity` (rounded up).
pub fn fragments_for(capacity: u64, granularity: u64) -> u64 {
    capacity.div_ceil(granularity.max(1))
}

/// Places `capacity` bytes in fragments of `granularity` on `servers`, with `namespaces`
/// metadata services (1 for striped, one per node for private).
pub fn place(
    capacity: u64,
    granularity: u64,
    servers: &[Candidate],
    namespaces: u32,
) -> Result<Placement, PlacementError> {
    if capacity == 0 {
        return Err(PlacementError::ZeroCapacity);
    }
    if servers.is_empty() {
        return Err(PlacementError::NoServers);
    }
    let needed = fragments_for(capacity, granularity);
    // Whether it fits is known before anything is sized by the request: a capacity of
    // 1000 PiB must be an answer, not a vector of 4 billion fragments (issue 31).
    let free_fragments = servers
        .iter()
        .map(|s| s.capacity.saturating_sub(s.reserved) / granularity.max(1))
        .fold(0u64, u64::saturating_add);
    if needed > free_fragments {
        return Err(PlacementError::NoSpace {
            needed,
            placed: free_fragments,
            granularity,
            free: servers
                .iter()
                .map(|s| s.capacity.saturating_sub(s.reserved))
                .collect(),
        });
    }
    if needed > surge_core::limits::MAX_INSTANCE_FRAGMENTS {
        return Err(PlacementError::TooManyFragments { needed });
    }
    if namespaces > surge_core::limits::MAX_JOB_NODES {
        return Err(PlacementError::TooManyNamespaces { namespaces });
    }
    let mut free: Vec<u64> = servers
        .iter()
        .map(|s| s.capacity.saturating_sub(s.reserved))
        .collect();
    let mut reserved: Vec<u64> = servers.iter().map(|s| s.reserved).collect();
    let mut mine = vec![0u32; servers.len()];
    let mut fragments = Vec::with_capacity(needed as usize);
    for _ in 0..needed {
        // Fewest fragments of this instance first (spread), then least reserved (least used),
        // then the id for a stable choice.
        let best = (0..servers.len())
            .filter(|&i| free[i] >= granularity)
            .min_by(|&a, &b| {
                (mine[a], reserved[a], &servers[a].id).cmp(&(mine[b], reserved[b], &servers[b].id))
            });
        let Some(i) = best else {
            return Err(PlacementError::NoSpace {
                needed,
                placed: fragments.len() as u64,
                granularity,
                free: servers
                    .iter()
                    .map(|s| s.capacity.saturating_sub(s.reserved))
                    .collect(),
            });
        };
        free[i] -= granularity;
        reserved[i] += granularity;
        mine[i] += 1;
        fragments.push((i, granularity));
    }
    // Metadata services go on the instance's own servers, fewest namespaces first.
    let mut chosen: Vec<usize> = fragments.iter().map(|f| f.0).collect();
    chosen.sort_unstable();
    chosen.dedup();
    let mut ns_load: Vec<u32> = servers.iter().map(|s| s.namespaces).collect();
    let mut ns = Vec::with_capacity(namespaces as usize);
    for _ in 0..namespaces.max(1) {
        let Some(&i) = chosen.iter().min_by(|&&a, &&b| {
            (ns_load[a], reserved[a], &servers[a].id).cmp(&(
                ns_load[b],
                reserved[b],
                &servers[b].id,
            ))
        }) else {
            return Err(PlacementError::NoServers);
        };
        ns_load[i] += 1;
        ns.push(i);
    }
    Ok(Placement {
        fragments,
        namespaces: ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 100;

    fn servers(reserved: &[u64]) -> Vec<Candidate> {
        reserved
            .iter()
            .enumerate()
            .map(|(i, r)| Candidate {
                id: format!("s{i}"),
                capacity: 1000,
                reserved: *r,
                namespaces: 0,
            })
            .collect()
    }

    #[test]
    fn capacity_is_rounded_up_to_the_granularity() {
        let p = place(250, G, &servers(&[0, 0, 0, 0]), 1).unwrap();
        assert_eq!(p.fragments.len(), 3);
        assert!(p.fragments.iter().all(|f| f.1 == G));
    }

    #[test]
    fn one_fragment_per_server_least_used_first() {
        let p = place(300, G, &servers(&[500, 0, 200, 100]), 1).unwrap();
        let chosen: Vec<usize> = p.fragments.iter().map(|f| f.0).collect();
        assert_eq!(
            chosen,
            vec![1, 3, 2],
            "least reserved first, each server once"
        );
    }

    #[test]
    fn more_fragments_than_servers_wrap_around_evenly() {
        let p = place(700, G, &servers(&[0, 0, 0]), 1).unwrap();
        let mut per = [0; 3];
        for f in &p.fragments {
            per[f.0] += 1;
        }
        assert_eq!(per.iter().sum::<i32>(), 7);
        assert!(per.iter().all(|n| (2..=3).contains(n)), "{per:?}");
    }

    #[test]
    fn full_servers_are_skipped_and_no_space_is_an_error_naming_the_numbers() {
        let p = place(200, G, &servers(&[1000, 0, 950]), 1).unwrap();
        assert!(p.fragments.iter().all(|f| f.0 == 1));
        let e = place(2000, G, &servers(&[1000, 0, 950]), 1).unwrap_err();
        match e {
            PlacementError::NoSpace { needed, placed, .. } => {
                assert_eq!((needed, placed), (20, 10))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_no_space_error_speaks_in_human_units() {
        let e = PlacementError::NoSpace {
            needed: 409600,
            placed: 72,
            granularity: 256 << 20,
            free: vec![4831838208, 0],
        };
        assert_eq!(
            e.to_string(),
            "not enough space: 409600 fragments of 256 MiB (100 TiB) are needed but the pool's \
             servers can take only 72 more (free per server: 4.50 GiB, 0 B)"
        );
    }

    #[test]
    fn private_namespaces_spread_over_the_instance_servers() {
        let p = place(300, G, &servers(&[0, 0, 0, 0]), 6).unwrap();
        assert_eq!(p.namespaces.len(), 6);
        let chosen: Vec<usize> = p.fragments.iter().map(|f| f.0).collect();
        for n in &p.namespaces {
            assert!(chosen.contains(n), "metadata on a server of the instance");
        }
        let mut per = std::collections::HashMap::new();
        for n in &p.namespaces {
            *per.entry(n).or_insert(0) += 1;
        }
        assert!(per.values().all(|v| *v == 2), "{per:?}");
    }

    #[test]
    fn a_huge_request_is_refused_before_anything_is_sized_by_it() {
        // 1000 PiB in 100-byte fragments: 10^16 fragments; a vector for them would abort.
        let e = place(1000 << 50, G, &servers(&[0, 0]), 1).unwrap_err();
        match e {
            PlacementError::NoSpace { needed, placed, .. } => {
                assert_eq!((needed, placed), ((1000u64 << 50).div_ceil(G), 20))
            }
            other => panic!("{other:?}"),
        }
        let e = place(100, G, &servers(&[0]), 4_000_000_000).unwrap_err();
        assert!(
            matches!(e, PlacementError::TooManyNamespaces { .. }),
            "{e:?}"
        );
    }

    #[test]
    fn zero_capacity_and_empty_pool_are_errors() {
        assert_eq!(
            place(0, G, &servers(&[0]), 1),
            Err(PlacementError::ZeroCapacity)
        );
        assert_eq!(place(10, G, &[], 1), Err(PlacementError::NoServers));
    }
}
