//! Volcano's `sla` plugin: a gang past its `sla-waiting-time` is served first and keeps what it can
//! place in a session; the nodes volcano-runner reserves by a taint for a gang that needs most of a
//! node (or several ranks at once), which the plugin alone does not keep for it (`monitor::reserve`
//! writes the taints the forecast chooses here).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use jiff::Timestamp;

use crate::forecast::snapshot::{Node, Pending, Resources, node_ranks, node_types, ranks_in};
use crate::forecast::state::End;

/// Whether only reserved nodes make the gang's start a bound ([`Pending::bound`]): whole nodes, ranks
/// that take more than half of some resource of a node they fit on (that node holds one, not two), or
/// more than one rank. There the room the gang needs at once appears only once most of what runs on a
/// node (or on several) has ended, and smaller jobs refill it first: the `sla` plugin keeps, in a
/// session, only the idle room a rank fits in, which a stream of smaller jobs retakes before the room
/// for the whole gang is there (measured: `tests/sim/starve.rs`, four ranks of 6 CPUs on 16-CPU nodes,
/// passed by 189 small jobs, 1,200 s past the bound the `sla` plugin alone gave). A single small rank
/// finds room as jobs end, and the `sla` plugin keeps it for it once it is there; reserving nodes for
/// it would hold idle what it does not use (docs/estimates.md, *Keeping gangs from starving*).
pub fn needs_reservation(job: &Pending, nodes: &[Node]) -> bool {
    needs_reservation_in(job, &node_types(nodes))
}

/// [`needs_reservation`] from the node types: a handful, where the nodes may be thousands.
pub(crate) fn needs_reservation_in(job: &Pending, types: &[(Resources, u64)]) -> bool {
    job.exclusive
        || job.replicas > 1
        || types
            .iter()
            .any(|(room, _)| ranks_in(&job.per_rank, room) == 1)
}

/// What [`choose_nodes`] looks at: the replay's state at the session.
#[derive(Clone, Copy)]
pub(crate) struct Room<'a> {
    pub(crate) free: &'a [Resources],
    pub(crate) nodes: &'a [Node],
    pub(crate) reserved: &'a [Option<usize>],
    pub(crate) busy_until: &'a [Timestamp],
    pub(crate) ends: &'a BinaryHeap<Reverse<End>>,
    pub(crate) holdings: &'a [Vec<(usize, Resources)>],
}

/// The nodes a gang that [`needs_reservation`] reserves, enough for `want` of its ranks: of the nodes
/// reserved for no waiting gang that can hold one of its ranks when empty and whose holders all have a
/// time limit, those with room for a rank first (ties: the node listed first). For a whole-node gang
/// that is when the node is untouched (now, or when the last job on it ends at its deadline); for
/// another, when enough of what runs there has ended, at the deadlines, for one rank to fit; a node
/// counts for as many ranks as it holds when empty (the replay then places them, which is what the
/// bound is). None when there are not enough: a partial reservation would hold nodes idle for a gang
/// that cannot start on them.
pub(crate) fn choose_nodes(
    job: &Pending,
    want: u64,
    room: Room<'_>,
    cursor: Timestamp,
) -> Vec<usize> {
    let Room {
        free,
        nodes,
        reserved,
        busy_until,
        ends,
        holdings,
    } = room;
    // What comes back on each node, and when (for ranks that need less than a whole node).
    let mut back: Vec<Vec<(Timestamp, Resources)>> = Vec::new();
    if !job.exclusive {
        back = vec![Vec::new(); nodes.len()];
        for Reverse(end) in ends.iter() {
            for (node, r) in &holdings[end.holding] {
                if let Some(b) = back.get_mut(*node) {
                    b.push((end.at, *r));
                }
            }
        }
    }
    let mut candidates: Vec<(Timestamp, usize)> = (0..nodes.len())
        .filter(|&n| {
            reserved[n].is_none()
                && job.per_rank.fits_in(&nodes[n].allocatable)
                && busy_until[n] < Timestamp::MAX
        })
        .filter_map(|n| {
            let at = if job.exclusive {
                if free[n] == nodes[n].allocatable {
                    cursor
                } else {
                    busy_until[n].max(cursor)
                }
            } else {
                let mut room = free[n];
                let mut at = cursor;
                back[n].sort_unstable_by_key(|(when, _)| *when);
                for (when, r) in &back[n] {
                    if job.per_rank.fits_in(&room) {
                        break;
                    }
                    r.give_back(&mut room);
                    at = (*when).max(cursor);
                }
                if !job.per_rank.fits_in(&room) {
                    return None;
                }
                at
            };
            (at < Timestamp::MAX).then_some((at, n))
        })
        .collect();
    candidates.sort_unstable();
    let mut chosen = Vec::new();
    let mut ranks = 0u64;
    for (_, n) in candidates {
        if ranks >= want {
            break;
        }
        ranks = ranks.saturating_add(node_ranks(job, &nodes[n]));
        chosen.push(n);
    }
    if ranks < want {
        return Vec::new();
    }
    chosen
}
