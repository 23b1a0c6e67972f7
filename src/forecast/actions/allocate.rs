//! Volcano's `allocate` action: a gang's ranks placed one at a time on the nodes the plugins allow and
//! order (`predicates`, `nodeorder`), all of them (the `gang` rule) or, for a gang past its waiting
//! time, what fits (the `sla` plugin keeps it for the rest of the session).

use crate::forecast::plugins::nodeorder::rank_node;
use crate::forecast::plugins::predicates::Access;
use crate::forecast::snapshot::{Node, Pending, Resources};

/// Places every rank of the gang, one at a time, on the node with room whose CPU is least taken (ties:
/// the first), as Volcano's `nodeorder` plugin (least requested) and the simulator spread ranks, and
/// takes what it places from `free`; `None`, with `free` as it was, when the gang does not fit now.
/// Following the scheduler's spreading matters: packing where it spreads would promise a whole free node
/// that the real placement has split between two jobs.
/// A rank of an exclusive job goes to the first untouched node it fits and holds all of it.
pub(crate) fn place(
    job: &Pending,
    free: &mut [Resources],
    nodes: &[Node],
    access: Access<'_>,
) -> Option<Vec<(usize, Resources)>> {
    let mut placement = Vec::with_capacity(job.replicas as usize);
    for _ in 0..job.replicas {
        let found = rank_node(job, free, nodes, access);
        let Some((node, held)) = found else {
            for (node, r) in &placement {
                Resources::give_back(r, &mut free[*node]);
            }
            return None;
        };
        held.take_from(&mut free[node]);
        placement.push((node, held));
    }
    Some(placement)
}

/// Places what ranks of the gang fit now, as [`place`] would, and takes them from `free`: what a gang
/// past its `sla-waiting-time` keeps for the rest of a session although it cannot start.
pub(crate) fn place_some(
    job: &Pending,
    free: &mut [Resources],
    nodes: &[Node],
    access: Access<'_>,
) -> Vec<(usize, Resources)> {
    let mut placement = Vec::new();
    for _ in 0..job.replicas {
        let found = rank_node(job, free, nodes, access);
        let Some((node, held)) = found else {
            break;
        };
        held.take_from(&mut free[node]);
        placement.push((node, held));
    }
    placement
}
