//! Volcano's `nodeorder` plugin (least requested): which of the nodes a rank may go to it goes to.

use crate::forecast::plugins::predicates::Access;
use crate::forecast::snapshot::{Node, Pending, Resources};

/// Where one more rank of the gang goes now, and what it holds there: the first untouched node for an
/// exclusive gang (all of it), else the least taken node it fits.
pub(crate) fn rank_node(
    job: &Pending,
    free: &[Resources],
    nodes: &[Node],
    access: Access<'_>,
) -> Option<(usize, Resources)> {
    if job.exclusive {
        (0..free.len())
            .find(|&i| {
                access.may(i) && free[i] == nodes[i].allocatable && job.per_rank.fits_in(&free[i])
            })
            .map(|i| (i, nodes[i].allocatable))
    } else {
        least_taken(&job.per_rank, free, nodes, access).map(|i| (i, job.per_rank))
    }
}

/// The node where `rank` fits whose CPU is least taken (the first of equals).
pub(crate) fn least_taken(
    rank: &Resources,
    free: &[Resources],
    nodes: &[Node],
    access: Access<'_>,
) -> Option<usize> {
    // Taken fractions compared without division: taken_i / cap_i < taken_j / cap_j.
    let mut best: Option<(usize, u128, u128)> = None;
    for (i, f) in free.iter().enumerate() {
        if !access.may(i) || !rank.fits_in(f) {
            continue;
        }
        let cap = nodes[i].allocatable.cpu_milli.max(1);
        let (t, c) = (u128::from(cap.saturating_sub(f.cpu_milli)), u128::from(cap));
        if best.is_none_or(|(_, bt, bc)| t * bc < bt * c) {
            best = Some((i, t, c));
        }
    }
    best.map(|(i, _, _)| i)
}

/// The most any one node has free of each resource: a rank that does not fit in it fits nowhere.
pub(crate) fn roomiest(free: &[Resources]) -> Resources {
    free.iter().fold(Resources::default(), |m, f| Resources {
        cpu_milli: m.cpu_milli.max(f.cpu_milli),
        memory_mib: m.memory_mib.max(f.memory_mib),
        gpu: m.gpu.max(f.gpu),
    })
}
