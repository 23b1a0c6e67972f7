//! Volcano's `allocate` action: a gang's ranks placed one at a time on the nodes the plugins allow and
//! order (`predicates`, `nodeorder`), all of them (the `gang` rule) or, for a gang past its waiting
//! time, what fits (the `sla` plugin keeps it for the rest of the session).

use std::cmp::Reverse;

use jiff::Timestamp;

use crate::cluster::Window;
use crate::forecast::answer::Estimate;
use crate::forecast::plugins::gang::gang_fits;
use crate::forecast::plugins::nodeorder::{rank_node, roomiest};
use crate::forecast::plugins::overcommit::admissible;
use crate::forecast::plugins::predicates::Access;
use crate::forecast::plugins::sla::{Room, choose_nodes};
use crate::forecast::session::{BACKFILL_DEPTH, Session};
use crate::forecast::snapshot::{Node, Pending, Resources};
use crate::forecast::state::End;

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

impl<'a> Session<'a> {
    /// One scheduling session at the cursor, as the scheduler's `allocate` action runs it: gangs past
    /// their waiting time first (the earlier deadline first), then the others in list order; each gang
    /// that fits whole starts; one that does not lets the gangs behind it try (backfill), unless its
    /// queue is `fifo`; one past its waiting time keeps the ranks it could place for the rest of the
    /// session (the `sla` plugin's pipelining).
    pub(crate) fn allocate(&mut self) {
        if self.rebuild {
            self.order_gangs();
        }
        self.blocked.clear();
        self.failed.clear();
        self.any_reserved = self.reserved.iter().any(Option::is_some);
        self.overdue_ahead = false;
        self.waits_ahead.clear();
        self.roomiest = roomiest(&self.free);
        self.placed_now = false;
        self.locked_total = Resources::default();
        self.misses = 0;
        self.give_up_due();
        for k in 0..self.order.len() {
            let (overdue, _, i) = self.order[k];
            if !self.try_gang(overdue, i) {
                break;
            }
        }
        for (node, held) in self.locked.drain(..) {
            held.give_back(&mut self.free[node]);
            held.give_back(&mut self.total);
        }
        if self.placed_now && self.stale * 2 > self.order.len() {
            let out = &self.out;
            self.order.retain(|&(_, _, i)| {
                !matches!(
                    out[i],
                    Some(Estimate::At { .. } | Estimate::TimesOut { .. })
                )
            });
            self.stale = 0;
        }
    }

    /// The order changes only when a waiting time runs out: sorted again then, not every session.
    fn order_gangs(&mut self) {
        let (pending, cursor) = (self.pending, self.cursor);
        self.order.clear();
        let out = &self.out;
        self.waiting.retain(|&i| out[i].is_none());
        self.stale = 0;
        self.order
            .extend(self.waiting.iter().chain(&self.unfit).map(
                |&i| match pending[i].reserved_from {
                    Some(at) if at <= cursor => (0, at, i),
                    _ => (1, Timestamp::MAX, i),
                },
            ));
        self.order.sort_unstable();
    }

    /// Gang `i` in the session (`overdue` 0: past its waiting time). False: the session stops here.
    fn try_gang(&mut self, overdue: u8, i: usize) -> bool {
        let pending: &'a [Pending] = self.pending;
        let job = &pending[i];
        if matches!(
            self.out[i],
            Some(Estimate::At { .. } | Estimate::TimesOut { .. })
        ) || self.gone[i]
        {
            return true;
        }
        let deep = overdue != 0 && self.misses >= BACKFILL_DEPTH;
        if deep && (self.to_admit == 0 || self.inqueue[i]) {
            return self.to_admit != 0;
        }
        if job.fifo && self.blocked.contains(&job.queue.as_str()) {
            self.overdue_ahead |= overdue == 0;
            return true;
        }
        if !self.inqueue[i] && !self.enqueue(overdue, i) {
            return true;
        }
        if deep {
            return true;
        }
        if matches!(self.out[i], Some(Estimate::Never { .. })) {
            if job.fifo {
                self.blocked.push(&job.queue);
            }
            return true;
        }
        // Held back by a window in the way of its allocation now: its pods are gated, the scheduler
        // does not see them.
        // (Its allocation runs from when it starts: `start_margin` after it is placed.)
        let runs_from = self
            .cursor
            .checked_add(self.start_margin)
            .unwrap_or(self.cursor);
        if let Some(w) = self.maintenance.holding(i, runs_from, job.runs_for) {
            self.held_by[i] = Some(w);
            return true;
        }
        // Kept off the nodes of a window of some nodes in its way (its taint): placed elsewhere.
        let off = self
            .maintenance
            .off_nodes(i, runs_from, job.runs_for, self.nodes);
        self.place_gang(overdue, i, off);
        true
    }

    /// Admission (Volcano's `enqueue` action): what it asks for must fit in the idle resources times
    /// the over-commit factor, less what the admitted gangs that wait ask for; one past its waiting
    /// time is admitted whatever that says (the `sla` plugin). False: not admitted.
    fn enqueue(&mut self, overdue: u8, i: usize) -> bool {
        let pending: &'a [Pending] = self.pending;
        let job = &pending[i];
        let mut idle = self.total;
        self.locked_total.give_back(&mut idle);
        if overdue == 0 || admissible(&job.minimum(), &idle, &self.admitted) {
            self.inqueue[i] = true;
            self.to_admit -= 1;
            job.minimum().give_back(&mut self.admitted);
            true
        } else {
            if job.fifo {
                self.blocked.push(&job.queue);
            }
            false
        }
    }

    /// Places gang `i` whole if it fits (the `gang` rule), and starts it; else it waits.
    fn place_gang(&mut self, overdue: u8, i: usize, off: Option<(Vec<bool>, &'a Window)>) {
        let (pending, nodes) = (self.pending, self.nodes);
        let job = &pending[i];
        // What is free only shrinks within a session: a gang of a size that did not fit fails again,
        // and counting its room over every node again is what would make a session cost O(nodes)
        // per waiting gang.
        let shape = (
            job.per_rank.cpu_milli,
            job.per_rank.memory_mib,
            job.per_rank.gpu,
            job.replicas,
            job.exclusive,
        );
        let holds = job.reserves.is_some() && self.reserved.contains(&Some(i));
        let access = Access {
            reserved: &self.reserved,
            me: i,
            own_only: holds,
            off: off.as_ref().map(|(o, _)| o.as_slice()),
        };
        // A gang with nodes of its own (or any gang while some are reserved, or one kept off some
        // nodes) is no shape like another's: its nodes differ.
        let shared = !holds && !self.any_reserved && off.is_none();
        let placement = if job.per_rank.fits_in(&self.roomiest)
            && job.per_rank.times(job.replicas).fits_in(&self.total)
            && (job.replicas == 1
                || (!(shared && self.failed.contains(&shape))
                    && gang_fits(job, &self.free, nodes, access)))
        {
            place(job, &mut self.free, nodes, access)
        } else {
            None
        };
        if placement.is_none() && job.replicas > 1 && shared {
            self.failed.insert(shape);
        }
        match placement {
            Some(placement) => self.start(i, holds, placement, &off),
            None => self.cannot_start(overdue, i, &off),
        }
    }

    /// Gang `i` does not fit now: it waits; past its waiting time, nodes may be reserved for it and
    /// it keeps what it can place for the rest of the session (the `sla` plugin).
    fn cannot_start(&mut self, overdue: u8, i: usize, off: &Option<(Vec<bool>, &'a Window)>) {
        let (pending, nodes) = (self.pending, self.nodes);
        let job = &pending[i];
        if !self.waits_ahead.contains(&job.per_rank) {
            self.waits_ahead.push(job.per_rank);
        }
        if overdue != 0 {
            self.misses += 1;
        }
        if overdue == 0 && job.reserves.is_some() && self.needs[i] && !self.overdue_ahead {
            self.reserve_for(i);
        }
        if overdue == 0 {
            self.overdue_ahead = true;
            let access = Access {
                reserved: &self.reserved,
                me: i,
                own_only: job.reserves.is_some() && self.reserved.contains(&Some(i)),
                off: off.as_ref().map(|(o, _)| o.as_slice()),
            };
            for (node, held) in place_some(job, &mut self.free, nodes, access) {
                held.take_from(&mut self.total);
                held.give_back(&mut self.locked_total);
                self.locked.push((node, held));
            }
            self.roomiest = roomiest(&self.free);
        }
        if job.fifo {
            self.blocked.push(&job.queue);
        }
    }

    /// Reserves nodes for gang `i`, past its waiting time, for the ranks the nodes reserved for it do
    /// not hold yet (the `sla` plugin's choice, [`choose_nodes`]).
    fn reserve_for(&mut self, i: usize) {
        let job = &self.pending[i];
        let want = u64::from(job.replicas).saturating_sub(self.held_ranks(i));
        if want > 0 {
            let room = Room {
                free: &self.free,
                nodes: self.nodes,
                reserved: &self.reserved,
                busy_until: &self.busy_until,
                ends: &self.ends,
                holdings: &self.holdings,
            };
            let chosen = choose_nodes(job, want, room, self.cursor);
            if !chosen.is_empty() {
                for n in &chosen {
                    self.reserved[*n] = Some(i);
                }
                self.any_reserved = true;
                if self.cursor == self.now {
                    self.reserve_now.push((i, chosen));
                }
            }
        }
    }

    /// Gang `i` starts on `placement`: it holds what it got until its allocation runs out, or a
    /// window cuts it, and is told when it starts.
    fn start(
        &mut self,
        i: usize,
        holds: bool,
        placement: Vec<(usize, Resources)>,
        off: &Option<(Vec<bool>, &'a Window)>,
    ) {
        let (pending, nodes) = (self.pending, self.nodes);
        let job = &pending[i];
        self.placed_now = true;
        self.misses = 0;
        self.left -= 1;
        self.stale += 1;
        for (_, r) in &placement {
            r.take_from(&mut self.total);
        }
        let minimum = job.minimum();
        let admitted = &mut self.admitted;
        admitted.cpu_milli = admitted.cpu_milli.saturating_sub(minimum.cpu_milli);
        admitted.memory_mib = admitted.memory_mib.saturating_sub(minimum.memory_mib);
        admitted.gpu = admitted.gpu.saturating_sub(minimum.gpu);
        let (basis, bound, starts) = self.tell(i, holds, &placement, off);
        if job.fifo && !bound {
            self.fifo_unbound.insert(job.queue.as_str());
        }
        if job.reserves.is_some() {
            for r in self.reserved.iter_mut().filter(|g| **g == Some(i)) {
                *r = None;
            }
        }
        // Until its allocation runs out, or a window cuts it.
        let ends_by = job
            .runs_for
            .map(|d| starts.checked_add(d).unwrap_or(Timestamp::MAX));
        let end = self.maintenance.end_of(nodes, &placement, starts, ends_by);
        for (node, _) in &placement {
            self.busy_until[*node] = self.busy_until[*node].max(end.unwrap_or(Timestamp::MAX));
        }
        // Placed, but its pods would start after the runner fails it: told when it fails. (It still
        // holds what it was placed on: the scheduler may bind it before the failure.)
        self.out[i] = Some(match job.gives_up_at {
            Some(at) if starts > at => crate::forecast::timeout::times_out(at, Some(starts)),
            _ => Estimate::At {
                start: starts,
                basis,
                bound,
                record: None,
            },
        });
        self.started += 1;
        match end {
            Some(at) => {
                let holding = self.holdings.len();
                self.holdings.push(placement);
                self.ends.push(Reverse(End { at, holding }));
            }
            None => self.forever += 1,
        }
    }
}
