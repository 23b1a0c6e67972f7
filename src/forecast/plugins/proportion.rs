//! Volcano's `proportion` plugin: the queues' shares, and what they do to a bound.

use crate::forecast::answer::{Estimate, as_expectation};

/// Under Volcano's `proportion` plugin the scheduler serves the queue with the lowest share first and
/// skips an overused one, so the replay's one order over all queues holds only while one queue has jobs
/// (waiting or running): with `queues_in_use` above one, every bound becomes an expectation, its basis
/// saying why. Ended jobs early change what each queue holds and so the queues' order, which no replay
/// from deadlines foresees (docs/estimates.md, *Between queues*, measured).
pub fn across_queues(estimates: &mut [Estimate], queues_in_use: usize) {
    if queues_in_use <= 1 {
        return;
    }
    for e in estimates {
        if let Estimate::At { basis, bound, .. } = e
            && *bound
        {
            *bound = false;
            *basis = as_expectation(basis);
            basis.push_str(&format!(
                "; jobs of {queues_in_use} queues wait or run, and Volcano's proportion plugin may serve another queue first"
            ));
        }
    }
}
