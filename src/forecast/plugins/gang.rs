//! Volcano's `gang` plugin: a job starts only when all of its ranks fit at once, and one that cannot
//! fit even an empty cluster never will.

use crate::forecast::plugins::predicates::Access;
use crate::forecast::snapshot::{Node, Pending, Resources, ranks_in};

/// Why the job can never run on these nodes, even all empty. Ranks are alike, so the gang fits an empty
/// cluster exactly when the nodes together hold `replicas` of them (one per node for whole nodes),
/// whatever the order of placement.
pub(crate) fn never(
    job: &Pending,
    types: &[(Resources, u64)],
    largest: &Resources,
) -> Option<String> {
    if job.replicas == 0 {
        return None;
    }
    let holds = |(room, count): &(Resources, u64)| {
        let each = ranks_in(&job.per_rank, room);
        let each = if job.exclusive { each.min(1) } else { each };
        each.saturating_mul(*count)
    };
    if !types.iter().any(|t| holds(t) > 0) {
        let what = job.per_rank.shortage(largest).unwrap_or("resources");
        return Some(format!(
            "no node has enough {what} for one rank ({} mCPU, {} MiB, {} GPUs)",
            job.per_rank.cpu_milli, job.per_rank.memory_mib, job.per_rank.gpu
        ));
    }
    let held = types
        .iter()
        .fold(0u64, |sum, t| sum.saturating_add(holds(t)));
    if held < u64::from(job.replicas) {
        return Some(format!(
            "the cluster cannot hold all {} ranks at once, even when empty",
            job.replicas
        ));
    }
    None
}

/// Whether the gang can fit now, counted without placing: every node's room for ranks of this size
/// together. Cheaper than a placement that fails, and exact (ranks are alike).
pub(crate) fn gang_fits(
    job: &Pending,
    free: &[Resources],
    nodes: &[Node],
    access: Access<'_>,
) -> bool {
    let want = u64::from(job.replicas);
    let mut held = 0u64;
    for (i, f) in free
        .iter()
        .enumerate()
        .filter(|(i, f)| access.may(*i) && job.per_rank.fits_in(f))
    {
        let room = if job.exclusive {
            u64::from(*f == nodes[i].allocatable)
        } else {
            ranks_in(&job.per_rank, f)
        };
        held = held.saturating_add(room);
        if held >= want {
            return true;
        }
    }
    false
}
