//! Shortest paths over the link-state graph.

use crate::rmt::Address;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// A directed graph: `edges[u][v]` is the cost of the link from `u` to `v`.
pub type Graph = BTreeMap<Address, BTreeMap<Address, u32>>;

/// The shortest route from the source to one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Total cost of the path (sum of link costs; a cost of 0 counts as 1).
    pub cost: u64,
    /// The source's neighbours that start a shortest path, in address order.
    /// With equal-cost multipath off this holds one address, the lowest.
    pub first_hops: Vec<Address>,
}

/// Dijkstra from `src` over `graph`. Returns a route to every reachable
/// address except `src` itself.
///
/// Link costs of 0 are counted as 1, so every path has a positive cost and
/// the equal-cost sets are exact. Ties are broken by address: nodes of equal
/// distance are settled in address order, and without `ecmp` the lowest
/// first-hop address of the equal-cost set is kept. The result depends only
/// on the graph, never on insertion order.
pub fn shortest_paths(src: Address, graph: &Graph, ecmp: bool) -> BTreeMap<Address, Route> {
    let mut dist: BTreeMap<Address, u64> = BTreeMap::new();
    let mut hops: BTreeMap<Address, BTreeSet<Address>> = BTreeMap::new();
    let mut done: BTreeSet<Address> = BTreeSet::new();
    let mut heap = BinaryHeap::new();
    dist.insert(src, 0);
    heap.push(Reverse((0u64, src)));
    while let Some(Reverse((d, u))) = heap.pop() {
        if !done.insert(u) {
            continue;
        }
        let Some(out) = graph.get(&u) else { continue };
        let via: BTreeSet<Address> = hops.get(&u).cloned().unwrap_or_default();
        for (&v, &c) in out {
            if v == src || done.contains(&v) {
                continue;
            }
            let nd = d + u64::from(c.max(1));
            let first: BTreeSet<Address> = if u == src {
                BTreeSet::from([v])
            } else {
                via.clone()
            };
            match dist.get(&v) {
                Some(&old) if nd > old => {}
                Some(&old) if nd == old => {
                    hops.entry(v).or_default().extend(first);
                }
                _ => {
                    dist.insert(v, nd);
                    hops.insert(v, first);
                    heap.push(Reverse((nd, v)));
                }
            }
        }
    }
    hops.into_iter()
        .filter(|(a, h)| *a != src && !h.is_empty())
        .map(|(a, h)| {
            let first_hops: Vec<Address> = if ecmp {
                h.into_iter().collect()
            } else {
                h.into_iter().take(1).collect()
            };
            (
                a,
                Route {
                    cost: dist[&a],
                    first_hops,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(Address, Address, u32)]) -> Graph {
        let mut g = Graph::new();
        for &(a, b, c) in edges {
            g.entry(a).or_default().insert(b, c);
            g.entry(b).or_default().insert(a, c);
        }
        g
    }

    #[test]
    fn square_has_two_equal_cost_paths() {
        // 1 - 2
        // |   |
        // 3 - 4
        let g = graph(&[(1, 2, 1), (1, 3, 1), (2, 4, 1), (3, 4, 1)]);
        let r = shortest_paths(1, &g, true);
        assert_eq!(r[&4].cost, 2);
        assert_eq!(r[&4].first_hops, vec![2, 3]);
        let r = shortest_paths(1, &g, false);
        assert_eq!(r[&4].first_hops, vec![2]);
        assert!(!r.contains_key(&1));
    }

    #[test]
    fn cheaper_longer_path_wins() {
        let g = graph(&[(1, 2, 10), (1, 3, 1), (3, 4, 1), (4, 2, 1)]);
        let r = shortest_paths(1, &g, true);
        assert_eq!(r[&2].cost, 3);
        assert_eq!(r[&2].first_hops, vec![3]);
    }

    #[test]
    fn zero_cost_counts_as_one_and_unreachable_is_absent() {
        let g = graph(&[(1, 2, 0), (2, 3, 0), (7, 8, 1)]);
        let r = shortest_paths(1, &g, true);
        assert_eq!(r[&3].cost, 2);
        assert!(!r.contains_key(&7));
    }
}
