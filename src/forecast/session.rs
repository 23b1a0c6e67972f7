//! Start-time estimates for pending jobs: a replay of the placement forward in time from what is known
//! for certain. Pure: no I/O, no clock; the caller gives `now`.
//!
//! What the replay rests on:
//! - every node's allocatable resources;
//! - every running job's ranks, where they run, and its deadline (its expiry): a job may end earlier,
//!   never later;
//! - the pending jobs of a Volcano queue in the queue's order, each with its ranks' resources and its time
//!   allocation;
//! - the maintenance windows ([`estimate_with`], [`crate::forecast::windows`]): they cut the jobs on their
//!   nodes at their start, and keep a gang they hold back from starting while one is in the way.
//!
//! The replay runs the scheduler's sessions at every instant resources come back or a waiting time
//! runs out, as Volcano's `enqueue` and `allocate` actions do: gangs past their `sla-waiting-time`
//! first, then in order; a Pending gang is admitted only within the over-commit room; an admitted gang
//! starts when all of its ranks fit at once (Volcano's gang rule), each rank on the least-requested
//! node; one that does not fit lets the gangs behind it try (backfill; in a `fifo` queue nothing of its
//! queue), and one past its waiting time keeps what it could place for the rest of the session (the
//! `sla` plugin). Each started gang holds its resources for its whole time allocation.
//!
//! Since running jobs end at their deadline at the latest and pending ones run for their allocation at
//! most, that is the schedule if every job runs to its limit. When jobs end early, the scheduler can
//! start a job behind in a gap the replay did not foresee, and it then holds its resources past the
//! instant the replay freed them: only a job the scheduler reserves for ([`Pending::bound`]) gets a
//! bound; the others get an expectation ([`Estimate::At`]`::bound`). So does one the replay starts in a
//! gap before a gang ahead of it that could use its nodes: the `sla` order serves that gang first
//! wherever it fits, and early ends can let it fit sooner than foreseen and take the gap. A gang placed
//! at an instant is told it starts `start_margin` later ([`replay_with`]): the time the job controller
//! and the scheduler take to place it.
//!
//! Cost: a session tries the gangs still waiting (cheap checks first: the roomiest node, the total
//! free, a gang size that already failed in the session) until [`BACKFILL_DEPTH`] of them in a row
//! could not start; past that it only admits (Volcano's `enqueue`, whose effect on later sessions must
//! stay exact) and stops once every gang is admitted. So a replay costs about
//! `O(instants × BACKFILL_DEPTH)` plus a placement of every rank over the nodes, where trying every
//! gang in every session took over a minute for ten thousand waiting jobs on a thousand nodes (debug
//! build). What the limit gives up: a gang further back than that behind gangs that cannot start is
//! not foreseen to start in a gap of that session; it starts later in the replay than the scheduler
//! may start it, so its estimate errs late (a bound stays a bound); and the gap it would take is left
//! to the gangs ahead, which only matters for expectations: a bound's gang, past its waiting time,
//! keeps what it can place before any gang behind it is tried.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use jiff::{SignedDuration, Timestamp};

use crate::cluster::Window;
use crate::forecast::plugins::gang::never;
use crate::forecast::plugins::sla::needs_reservation_in;
use crate::forecast::snapshot::{
    Node, Pending, Resources, Running, largest_node, node_ranks, node_types,
};
use crate::forecast::windows::Maintenance;
use crate::interval::earliest;

use crate::forecast::answer::LATER_ONLY;
pub use crate::forecast::answer::{Estimate, ExpectationRecord};
use crate::forecast::state::End;

/// How many gangs in a row that cannot start a session tries before it stops looking for gaps (see
/// the module documentation, "Cost"). Far more than a queue a person reads: the busy workload's
/// sessions never reach it.
pub const BACKFILL_DEPTH: usize = 256;

/// What a replay gives: an estimate per pending gang, and the nodes to reserve now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub estimates: Vec<Estimate>,
    /// Gangs (indices into `pending`) that reserve nodes (indices into `nodes`) in the session at `now`:
    /// past their waiting time, with [`Pending::reserves`] and [`needs_reservation`](crate::forecast::needs_reservation), holding reserved
    /// nodes for fewer ranks than they have, and not fitting now. The monitor taints these nodes for
    /// them (`monitor::reserve`).
    pub reserve_now: Vec<(usize, Vec<usize>)>,
}

/// Estimates a start for every job of `pending` (every queue's waiting gangs, in the order the scheduler
/// lists them: created first). See the module documentation.
pub fn estimate(
    nodes: &[Node],
    running: &[Running],
    pending: &[Pending],
    now: Timestamp,
) -> Vec<Estimate> {
    replay(nodes, running, pending, now).estimates
}

/// [`estimate`] with the maintenance windows: running and started jobs end at the start of a window
/// that cuts them, and a gang a window holds back starts only when none is in the way (see
/// [`crate::forecast::windows`]).
pub fn estimate_with(
    nodes: &[Node],
    running: &[Running],
    pending: &[Pending],
    maintenance: &Maintenance,
    now: Timestamp,
) -> Vec<Estimate> {
    replay_with(
        nodes,
        running,
        pending,
        maintenance,
        SignedDuration::ZERO,
        now,
    )
    .estimates
}

/// [`estimate`], with the nodes to reserve now.
pub fn replay(nodes: &[Node], running: &[Running], pending: &[Pending], now: Timestamp) -> Replay {
    replay_with(
        nodes,
        running,
        pending,
        &Maintenance::default(),
        SignedDuration::ZERO,
        now,
    )
}

/// [`replay`] with the maintenance windows (see [`estimate_with`]) and a start margin: a gang the
/// replay places at an instant is told it starts `start_margin` later, and holds what it gets until its
/// allocation runs out from then (`[monitor] start_margin`: the time the job controller and the
/// scheduler take to place a gang whose resources are free; a bound of "now" is broken by that much).
pub fn replay_with(
    nodes: &[Node],
    running: &[Running],
    pending: &[Pending],
    maintenance: &Maintenance,
    start_margin: SignedDuration,
    now: Timestamp,
) -> Replay {
    let mut session = Session::open(nodes, running, pending, maintenance, start_margin, now);
    loop {
        session.allocate();
        if session.left == 0 {
            break;
        }
        if !session.advance() {
            break;
        }
    }
    session.close()
}

/// The replay's state from one scheduling session to the next (Volcano's `framework.Session`, kept
/// open across the replay): the snapshot it starts from, what is free and held, and what each gang
/// has been told so far. The `allocate` action runs on it ([`crate::forecast::actions::allocate`]).
pub(crate) struct Session<'a> {
    pub(crate) nodes: &'a [Node],
    pub(crate) running: &'a [Running],
    pub(crate) pending: &'a [Pending],
    pub(crate) maintenance: &'a Maintenance,
    pub(crate) start_margin: SignedDuration,
    pub(crate) now: Timestamp,
    pub(crate) free: Vec<Resources>,
    /// What each job holds (running first, then pending ones as they are placed) and when it ends.
    pub(crate) holdings: Vec<Vec<(usize, Resources)>>,
    pub(crate) ends: BinaryHeap<Reverse<End>>,
    /// Jobs that hold resources without an end.
    pub(crate) forever: usize,
    /// When each node is untouched at the latest (the last end of what holds it; `MAX`: never), for
    /// the choice of nodes to reserve.
    pub(crate) busy_until: Vec<Timestamp>,
    pub(crate) running_with_end: usize,
    pub(crate) total: Resources,
    pub(crate) out: Vec<Option<Estimate>>,
    /// The gangs still waiting in the replay, in the scheduler's list order.
    pub(crate) waiting: Vec<usize>,
    /// Gangs that never fit still take part in admission: once admitted (past their waiting time, at
    /// the latest), what they ask for counts against every later gang's admission for as long as they
    /// wait. (Kept in the order for as long as they wait: admitted, one also blocks a `fifo` queue.)
    pub(crate) unfit: Vec<usize>,
    /// Gangs still waiting in the replay, and entries of `order` that started since it was last cut
    /// down: cut when they are half of it, not after every session (that cost O(waiting) per session).
    pub(crate) left: usize,
    pub(crate) stale: usize,
    pub(crate) cursor: Timestamp,
    pub(crate) released_running: usize,
    pub(crate) started: usize,
    pub(crate) order: Vec<(u8, Timestamp, usize)>,
    pub(crate) rebuild: bool,
    pub(crate) failed: HashSet<(u64, u64, u64, u32, bool)>,
    /// Every instant a waiting time runs out, in order, and the next one to come.
    pub(crate) reserves: Vec<Timestamp>,
    pub(crate) next_reserve: usize,
    pub(crate) locked: Vec<(usize, Resources)>,
    pub(crate) blocked: Vec<&'a str>,
    /// Admitted gangs (Volcano's `enqueue` action) and what they ask for together.
    pub(crate) inqueue: Vec<bool>,
    pub(crate) admitted: Resources,
    /// The window that held each gang back when it was last tried (for its basis).
    pub(crate) held_by: Vec<Option<&'a Window>>,
    /// Gangs not admitted yet: while there are some, a session past its depth still admits.
    pub(crate) to_admit: usize,
    /// Reserved nodes: for which waiting gang (index into `pending`). A node reserved for a job that
    /// no longer waits is free (the monitor removes its taint at its next pass).
    pub(crate) reserved: Vec<Option<usize>>,
    /// Whether each gang needs nodes reserved for a bound.
    pub(crate) needs: Vec<bool>,
    pub(crate) bound_of: Vec<bool>,
    pub(crate) reserve_now: Vec<(usize, Vec<usize>)>,
    /// The rank shapes of the gangs ahead in the session that could not start: a gang placed now on
    /// a node one of them could use starts in a gap (backfill), which that gang may claim first if
    /// early ends let it fit sooner.
    pub(crate) waits_ahead: Vec<Resources>,
    // What one session keeps while it runs (set again at its start, see `allocate`).
    pub(crate) any_reserved: bool,
    /// A gang past its waiting time ahead of this one in the session still waits: a gang reserves
    /// nodes only when none does, so that its reservation never takes what the `sla` order gives a
    /// gang ahead of it (whose bound was told before the reservation was made).
    pub(crate) overdue_ahead: bool,
    pub(crate) roomiest: Resources,
    pub(crate) placed_now: bool,
    pub(crate) locked_total: Resources,
    /// Gangs in a row (not past their waiting time) that could not start in this session.
    pub(crate) misses: usize,
    /// Every gang's `[monitor] queue_timeout` deadline, in order, the next one to come, and the gangs
    /// gone at theirs ([`crate::forecast::timeout`]).
    pub(crate) gives_up: Vec<(Timestamp, usize)>,
    pub(crate) next_give_up: usize,
    pub(crate) gone: Vec<bool>,
    /// The `fifo` queues in which a gang ahead started without a bound (or left at its deadline when
    /// it could have started): what waits behind it there can be later than the replay foresees.
    pub(crate) fifo_unbound: HashSet<&'a str>,
}

impl<'a> Session<'a> {
    /// Opens the replay on the snapshot: what runs holds its nodes until it ends, the gangs that can
    /// never run are told so, the admitted gangs and the nodes reserved for gangs as they are now.
    fn open(
        nodes: &'a [Node],
        running: &'a [Running],
        pending: &'a [Pending],
        maintenance: &'a Maintenance,
        start_margin: SignedDuration,
        now: Timestamp,
    ) -> Self {
        let types = node_types(nodes);
        let largest = largest_node(&types);
        let mut s = Session {
            nodes,
            running,
            pending,
            maintenance,
            start_margin,
            now,
            free: nodes.iter().map(|n| n.allocatable).collect(),
            holdings: Vec::with_capacity(running.len() + pending.len()),
            ends: BinaryHeap::new(),
            forever: 0,
            busy_until: vec![Timestamp::MIN; nodes.len()],
            running_with_end: 0,
            total: Resources::default(),
            out: vec![None; pending.len()],
            waiting: Vec::with_capacity(pending.len()),
            unfit: Vec::new(),
            left: 0,
            stale: 0,
            cursor: now,
            released_running: 0,
            started: 0,
            order: Vec::new(),
            rebuild: true,
            failed: HashSet::new(),
            reserves: Vec::new(),
            next_reserve: 0,
            locked: Vec::new(),
            blocked: Vec::new(),
            inqueue: Vec::new(),
            admitted: Resources::default(),
            held_by: vec![None; pending.len()],
            to_admit: 0,
            reserved: Vec::new(),
            needs: Vec::new(),
            bound_of: Vec::new(),
            reserve_now: Vec::new(),
            waits_ahead: Vec::new(),
            any_reserved: false,
            overdue_ahead: false,
            roomiest: Resources::default(),
            placed_now: false,
            locked_total: Resources::default(),
            misses: 0,
            gives_up: Vec::new(),
            next_give_up: 0,
            gone: Vec::new(),
            fifo_unbound: HashSet::new(),
        };
        s.deadlines();
        s.hold_running();
        s.sort_out_never(&types, &largest);
        s.enqueued_now();
        s.reserved_now(&types);
        s
    }

    /// What runs holds its nodes until its deadline, or a window that cuts it.
    fn hold_running(&mut self) {
        let (nodes, now) = (self.nodes, self.now);
        for (r, job) in self.running.iter().enumerate() {
            // A window that cuts it ends it at the window's start at the latest.
            let end = self
                .maintenance
                .end_of_running(r, nodes, &job.ranks, now, job.ends_by);
            for (node, r) in &job.ranks {
                if let Some(b) = self.busy_until.get_mut(*node) {
                    *b = (*b).max(end.unwrap_or(Timestamp::MAX));
                }
                if let Some(f) = self.free.get_mut(*node) {
                    // A node overcommitted by what the cluster reports counts as full, not negative.
                    f.cpu_milli = f.cpu_milli.saturating_sub(r.cpu_milli);
                    f.memory_mib = f.memory_mib.saturating_sub(r.memory_mib);
                    f.gpu = f.gpu.saturating_sub(r.gpu);
                }
            }
            match end {
                Some(at) => {
                    let holding = self.holdings.len();
                    self.holdings.push(job.ranks.clone());
                    self.ends.push(Reverse(End {
                        at: at.max(now),
                        holding,
                    }));
                }
                None => self.forever += 1,
            }
        }
        self.running_with_end = self.ends.len();
        self.total = self.free.iter().fold(Resources::default(), |mut t, f| {
            f.give_back(&mut t);
            t
        });
    }

    /// The gangs that can never run here (the `gang` plugin) are told so; the others wait.
    fn sort_out_never(&mut self, types: &[(Resources, u64)], largest: &Resources) {
        for (i, job) in self.pending.iter().enumerate() {
            match never(job, types, largest) {
                Some(why) => {
                    self.out[i] = Some(Estimate::Never { why });
                    self.unfit.push(i);
                }
                None => self.waiting.push(i),
            }
        }
        self.left = self.waiting.len();
        self.order = Vec::with_capacity(self.waiting.len());
        self.reserves = self
            .pending
            .iter()
            .filter_map(|p| p.reserved_from)
            .collect();
        self.reserves.sort_unstable();
    }

    /// The gangs admitted already (Volcano's `enqueue` action), and what they ask for together.
    fn enqueued_now(&mut self) {
        self.inqueue = self.pending.iter().map(|p| p.inqueue).collect();
        for (i, job) in self.pending.iter().enumerate() {
            if self.inqueue[i] {
                job.minimum().give_back(&mut self.admitted);
            }
        }
        self.to_admit = self.inqueue.iter().filter(|admitted| !**admitted).count();
    }

    /// The nodes reserved for gangs now (their taints), and which gangs that makes a bound's.
    fn reserved_now(&mut self, types: &[(Resources, u64)]) {
        let (nodes, pending) = (self.nodes, self.pending);
        self.reserved = nodes
            .iter()
            .map(|n| {
                let id = n.reserved_for.as_deref()?;
                pending
                    .iter()
                    .position(|p| p.reserves.as_deref() == Some(id))
            })
            .collect();
        self.needs = pending
            .iter()
            .map(|p| needs_reservation_in(p, types))
            .collect();
        // What the taints give each gang now, counted in one pass over the nodes.
        let mut held_at_start = vec![0u64; pending.len()];
        for (n, g) in self.reserved.iter().enumerate() {
            if let Some(i) = *g {
                held_at_start[i] =
                    held_at_start[i].saturating_add(node_ranks(&pending[i], &nodes[n]));
            }
        }
        self.bound_of = pending
            .iter()
            .enumerate()
            .map(|(i, p)| p.bound(self.needs[i], held_at_start[i]))
            .collect();
    }

    /// How many of gang `i`'s ranks the nodes reserved for it hold.
    pub(crate) fn held_ranks(&self, i: usize) -> u64 {
        self.reserved
            .iter()
            .enumerate()
            .filter(|(_, g)| **g == Some(i))
            .map(|(n, _)| node_ranks(&self.pending[i], &self.nodes[n]))
            .fold(0u64, u64::saturating_add)
    }

    /// What gang `i`, placed at the cursor on `placement`, is told: the basis, whether it is a bound,
    /// and when it starts.
    pub(crate) fn tell(
        &self,
        i: usize,
        holds: bool,
        placement: &[(usize, Resources)],
        off: &Option<(Vec<bool>, &Window)>,
    ) -> (String, bool, Timestamp) {
        let job = &self.pending[i];
        let (nodes, cursor) = (self.nodes, self.cursor);
        // (Looked at only for a gang that would otherwise be told a bound.)
        let passes = self.bound_of[i]
            && !holds
            && placement.iter().any(|(n, _)| {
                self.waits_ahead
                    .iter()
                    .any(|r| r.fits_in(&nodes[*n].allocatable))
            });
        // In a `fifo` queue it waits for every gang ahead of it there: one told no bound can start
        // later than foreseen, and this one with it.
        let behind = job.fifo && self.fifo_unbound.contains(job.queue.as_str());
        let bound = self.bound_of[i] && !passes && !behind;
        // Placed at `cursor`, it starts once the job controller and the scheduler have placed its
        // pods: told `start_margin` later, and it runs its allocation from then.
        let starts = cursor.checked_add(self.start_margin).unwrap_or(cursor);
        let promise = match (bound, self.bound_of[i]) {
            (true, _) => Promise::Bound,
            (false, true) if behind => Promise::BehindInFifo,
            (false, true) => Promise::InAGap,
            (false, false) => Promise::Expected,
        };
        let mut basis = basis(
            (cursor, starts),
            self.now,
            self.released_running,
            self.running.len(),
            self.started,
            promise,
        );
        if !self.bound_of[i] && self.needs[i] && job.reserved_from.is_some() && cursor > self.now {
            basis.push_str(
                "; it needs most of a node, or several ranks at once, which smaller jobs can \
                 keep filling while no nodes are reserved for it",
            );
        }
        if let Some(w) = self.held_by[i] {
            basis.push_str(&format!(
                "; held back by the maintenance window {} until {}",
                w.id, w.end
            ));
        }
        if let Some((_, w)) = off {
            basis.push_str(&format!(
                "; not on the nodes of the maintenance window {} before {}",
                w.id, w.end
            ));
        }
        (basis, bound, starts)
    }

    /// Moves the cursor to the next session that can differ: when resources come back, or when a
    /// waiting gang's waiting time runs out (it goes first and keeps what it can place). False when
    /// nothing more comes.
    fn advance(&mut self) -> bool {
        let cursor = self.cursor;
        while self
            .reserves
            .get(self.next_reserve)
            .is_some_and(|at| *at <= cursor)
        {
            self.next_reserve += 1;
        }
        let next_reserve_at = self.reserves.get(self.next_reserve).copied();
        let next_end = self.ends.peek().map(|Reverse(e)| e.at);
        // A window's end lets the gangs it held back go.
        let next_end = earliest(next_end, self.maintenance.next_end(cursor));
        // A deadline of `[monitor] queue_timeout` takes a gang out of the queue.
        let next_reserve_at_or_deadline = earliest(next_reserve_at, self.next_deadline());
        let Some(next) = earliest(next_end, next_reserve_at_or_deadline) else {
            return false;
        };
        self.cursor = self.cursor.max(next);
        self.rebuild = next_reserve_at.is_some_and(|at| at <= self.cursor);
        // Everything that comes back at that instant comes back together, as a session finds it.
        while let Some(Reverse(end)) = self.ends.peek()
            && end.at <= self.cursor
        {
            let holding = end.holding;
            self.ends.pop();
            for (node, r) in &self.holdings[holding] {
                r.give_back(&mut self.free[*node]);
                r.give_back(&mut self.total);
            }
            if holding < self.running_with_end {
                self.released_running += 1;
            }
        }
        true
    }

    /// The answer: what is still waiting when nothing more comes back waits for something without a
    /// time limit.
    fn close(self) -> Replay {
        let why = format!(
            "{} running job(s) without a time limit hold the resources it needs",
            self.forever.max(1)
        );
        let estimates = self
            .out
            .into_iter()
            .map(|e| e.unwrap_or_else(|| Estimate::Unbounded { why: why.clone() }))
            .collect();
        Replay {
            estimates,
            reserve_now: self.reserve_now,
        }
    }
}

/// Why a job the scheduler reserves for gets an expectation all the same: it starts before a gang
/// ahead of it in the `sla` order (backfill), which goes first wherever it fits once it does.
const IN_A_GAP: &str = "it starts in a gap before a job ahead of it that can use the same nodes, which goes \
     first if jobs that end early let it start sooner";

/// Which kind of estimate a basis explains.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Promise {
    /// A bound ([`Pending::bound`], not in a gap).
    Bound,
    /// The scheduler reserves for it, but it starts in a gap before a gang ahead of it ([`IN_A_GAP`]).
    InAGap,
    /// The scheduler does not reserve for it.
    Expected,
    /// The scheduler reserves for it, but a gang ahead of it in its `fifo` queue has no bound
    /// ([`BEHIND_IN_FIFO`]).
    BehindInFifo,
}

/// Why a job the scheduler reserves for gets an expectation all the same in a `fifo` queue: it starts
/// only after the gangs ahead of it there, and one of them has no bound.
const BEHIND_IN_FIFO: &str = "it waits in a fifo queue behind a job whose start is not promised";

/// The one-line basis of an estimate: the gang is placed at `placed` and told `start` (the start
/// margin later).
fn basis(
    (placed, start): (Timestamp, Timestamp),
    now: Timestamp,
    released: usize,
    running: usize,
    ahead: usize,
    promise: Promise,
) -> String {
    let bound = promise == Promise::Bound;
    let backfill = promise == Promise::InAGap;
    let why_not = match promise {
        Promise::InAGap => IN_A_GAP,
        _ => BEHIND_IN_FIFO,
    };
    if placed <= now {
        return match (start <= now, bound) {
            _ if backfill || promise == Promise::BehindInFifo => {
                format!("its resources are free now, but {why_not}")
            }
            (true, _) => "its resources are free now".to_owned(),
            (false, true) => format!(
                "its resources are free now (by {start} at the latest: the time the scheduler takes to place it)"
            ),
            (false, false) => format!(
                "its resources are free now (expected by {start}: the time the scheduler takes to place it)"
            ),
        };
    }
    let ahead = match ahead {
        0 => String::new(),
        1 => ", after 1 other waiting job has started".to_owned(),
        n => format!(", after {n} other waiting jobs have started"),
    };
    if bound {
        format!(
            "by {start} at the latest: {released} of {running} running jobs end by then at their time limits{ahead}{LATER_ONLY}"
        )
    } else if backfill || promise == Promise::BehindInFifo {
        format!(
            "expected by {start}, not promised: {released} of {running} running jobs end by then at their time \
             limits{ahead}, and {why_not}"
        )
    } else {
        format!(
            "expected by {start}, not promised: {released} of {running} running jobs end by then at their time \
             limits{ahead}, but the scheduler does not reserve for it, and a job that starts in a gap first \
             can delay it"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forecast::actions::allocate::place;
    use crate::forecast::plugins::predicates::Access;
    use crate::forecast::{across_queues, needs_reservation};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn under_proportion_a_bound_is_a_bound_only_while_one_queue_has_jobs() {
        let at = |bound| Estimate::At {
            start: t(60),
            basis: "free now".into(),
            bound,
            record: None,
        };
        let never = Estimate::Never {
            why: "too big".into(),
        };
        let mut one = vec![at(true), at(false), never.clone()];
        across_queues(&mut one, 1);
        assert_eq!(one, vec![at(true), at(false), never.clone()]);
        let mut two = vec![at(true), at(false), never.clone()];
        across_queues(&mut two, 2);
        let Estimate::At { bound, basis, .. } = &two[0] else {
            panic!("{:?}", two[0]);
        };
        assert!(!bound);
        assert!(
            basis.ends_with("jobs of 2 queues wait or run, and Volcano's proportion plugin may serve another queue first"),
            "{basis}"
        );
        assert_eq!(two[1..], [at(false), never]);
    }

    fn res(cpu: u64, gpu: u64) -> Resources {
        Resources {
            cpu_milli: cpu * 1000,
            memory_mib: cpu * 4096,
            gpu,
        }
    }

    fn nodes(n: usize, cpu: u64, gpu: u64) -> Vec<Node> {
        (0..n)
            .map(|i| Node {
                name: format!("n{i}"),
                allocatable: res(cpu, gpu),
                reserved_for: None,
            })
            .collect()
    }

    fn pending(id: &str, replicas: u32, per_rank: Resources, secs: i64) -> Pending {
        Pending {
            exclusive: false,
            job_id: id.into(),
            replicas,
            per_rank,
            runs_for: Some(SignedDuration::from_secs(secs)),
            queue: "q".into(),
            fifo: false,
            reserved_from: None,
            inqueue: true,
            reserves: None,
            gives_up_at: None,
        }
    }

    fn start(e: &Estimate) -> Timestamp {
        match e {
            Estimate::At { start, .. } => *start,
            other => panic!("not an estimate: {other:?}"),
        }
    }

    #[test]
    fn a_session_stops_looking_for_gaps_past_its_depth() {
        // One node with 4 CPUs free; ahead, more gangs than the depth that need 8 CPUs each (they
        // start one after another, each when the one before ends), then a 1-CPU job that would fit now.
        let mut jobs: Vec<Pending> = (0..BACKFILL_DEPTH + 1)
            .map(|k| pending(&format!("big-{k}"), 1, res(8, 0), 10))
            .collect();
        let running = [Running {
            ranks: vec![(0, res(12, 0))],
            ends_by: Some(t(100)),
        }];
        jobs.push(pending("small", 1, res(1, 0), 10));
        let e = estimate(&nodes(1, 16, 0), &running, &jobs, t(0));
        assert_ne!(
            start(&e[BACKFILL_DEPTH + 1]),
            t(0),
            "past the depth, the gap is not foreseen"
        );
        // Within the depth it is.
        let near: Vec<Pending> = jobs[BACKFILL_DEPTH - 2..].to_vec();
        let e = estimate(&nodes(1, 16, 0), &running, &near, t(0));
        assert_eq!(
            start(e.last().unwrap()),
            t(0),
            "a gap near the front is foreseen"
        );
    }

    #[test]
    fn an_exclusive_gang_waits_for_untouched_nodes_and_holds_them_whole() {
        // One CPU in use on node 0 until 100 s; 31 of 32 CPUs are free, but not two whole nodes.
        let running = [Running {
            ranks: vec![(0, res(1, 0))],
            ends_by: Some(t(100)),
        }];
        // A fifo queue: the small job does not start in the gap beside the running one.
        let mut whole = pending("whole", 2, res(1, 0), 50);
        whole.exclusive = true;
        whole.fifo = true;
        let mut small = pending("small", 1, res(1, 0), 10);
        small.fifo = true;
        let e = estimate(
            &nodes(2, 16, 0),
            &running,
            &[whole.clone(), small.clone()],
            t(0),
        );
        assert_eq!(start(&e[0]), t(100), "both nodes untouched only at 100 s");
        assert_eq!(
            start(&e[1]),
            t(150),
            "nothing joins a whole node while it runs"
        );
        // The same gang without the flag starts at once, and the small job beside it.
        let mut shared = whole.clone();
        shared.exclusive = false;
        let e = estimate(&nodes(2, 16, 0), &running, &[shared, small], t(0));
        assert_eq!((start(&e[0]), start(&e[1])), (t(0), t(0)));
        // More whole nodes than the cluster has: never.
        let mut three = whole;
        three.replicas = 3;
        assert!(matches!(
            &estimate(&nodes(2, 16, 0), &[], &[three], t(0))[0],
            Estimate::Never { why } if why.contains("all 3 ranks")
        ));
    }

    #[test]
    fn a_job_that_fits_now_starts_now() {
        let e = estimate(
            &nodes(2, 16, 0),
            &[],
            &[pending("a", 1, res(4, 0), 60)],
            t(0),
        );
        assert_eq!(start(&e[0]), t(0));
        assert!(
            matches!(&e[0], Estimate::At { basis, .. } if basis == "its resources are free now")
        );
    }

    #[test]
    fn a_gang_waits_until_enough_running_jobs_have_ended_by_their_deadlines() {
        // Two nodes of 16 CPUs, each full with a running job ending at 100 and 200.
        let running = vec![
            Running {
                ranks: vec![(0, res(16, 0))],
                ends_by: Some(t(100)),
            },
            Running {
                ranks: vec![(1, res(16, 0))],
                ends_by: Some(t(200)),
            },
        ];
        let jobs = [
            pending("one-node", 1, res(16, 0), 50),
            pending("two-nodes", 2, res(16, 0), 60),
        ];
        let e = estimate(&nodes(2, 16, 0), &running, &jobs, t(0));
        assert_eq!(start(&e[0]), t(100), "the first node frees at 100");
        // The gang needs both nodes at once: node 1 at 200, node 0 once the job ahead ends at 150.
        assert_eq!(start(&e[1]), t(200));
        let Estimate::At { basis, .. } = &e[1] else {
            unreachable!()
        };
        assert!(basis.contains("2 of 2 running jobs"), "{basis}");
        assert!(basis.contains("after 1 other waiting job"), "{basis}");
    }

    #[test]
    fn a_fifo_queue_keeps_its_order_a_traverse_queue_lets_a_small_job_start_in_the_gap() {
        let running = vec![Running {
            ranks: vec![(0, res(8, 0))],
            ends_by: Some(t(300)),
        }];
        let mut jobs = [
            pending("big", 1, res(16, 0), 60),
            pending("small", 1, res(4, 0), 400),
        ];
        let e = estimate(&nodes(1, 16, 0), &running, &jobs, t(0));
        assert_eq!(start(&e[1]), t(0), "the small job fits in the gap now");
        assert_eq!(
            start(&e[0]),
            t(400),
            "and the big one waits for it as well as for the running job"
        );
        for j in &mut jobs {
            j.fifo = true;
        }
        let e = estimate(&nodes(1, 16, 0), &running, &jobs, t(0));
        assert_eq!(start(&e[0]), t(300));
        assert_eq!(
            start(&e[1]),
            t(360),
            "after the job ahead, which takes the whole node"
        );
    }

    /// Every estimate's words follow its flag: a bound never reads "expected", an expectation never
    /// "at the latest".
    fn words_match(e: &[Estimate]) {
        for e in e {
            if let Estimate::At { bound, basis, .. } = e {
                if *bound {
                    assert!(!basis.contains("expected"), "a bound: {basis}");
                } else {
                    assert!(!basis.contains("at the latest"), "an expectation: {basis}");
                }
            }
        }
    }

    /// A fifo queue whose head can never fit blocks it until the runner fails the head at its
    /// `queue_timeout`: the small job behind it starts then (with the margin), told a bound, and the
    /// head is told when it fails. Without the deadline the small job waits for good.
    #[test]
    fn a_fifo_queue_moves_on_at_its_heads_queue_timeout_and_the_job_behind_is_told_a_bound() {
        let fifo = |p: Pending| Pending {
            fifo: true,
            reserved_from: Some(t(-60)),
            ..p
        };
        // Two nodes of 16 CPUs, nothing running, a start margin of 10 s.
        let replay = |jobs: &[Pending]| {
            replay_with(
                &nodes(2, 16, 0),
                &[],
                jobs,
                &Maintenance::default(),
                SignedDuration::from_secs(10),
                t(0),
            )
            .estimates
        };
        let mut jobs = vec![
            fifo(pending("head", 3, res(16, 0), 600)),
            fifo(pending("small", 1, res(2, 0), 600)),
        ];
        let e = replay(&jobs);
        assert!(matches!(e[0], Estimate::Never { .. }), "{e:?}");
        assert!(matches!(e[1], Estimate::Unbounded { .. }), "{e:?}");
        jobs[0].gives_up_at = Some(t(300));
        jobs[1].gives_up_at = Some(t(3600));
        let e = replay(&jobs);
        assert!(matches!(e[0], Estimate::Never { .. }), "{e:?}");
        let Estimate::At { start, bound, .. } = &e[1] else {
            panic!("{e:?}")
        };
        assert_eq!(*start, t(310));
        assert!(bound, "the head can never start before it is failed: {e:?}");
        words_match(&e);
    }

    /// A job the replay starts only after its `queue_timeout` is told when it fails, never a start
    /// after that; and a job behind one that leaves that way in a fifo queue is told no bound (the one
    /// ahead could start early and hold what it was promised).
    #[test]
    fn a_job_that_times_out_first_is_told_so_and_nothing_behind_it_in_fifo_is_promised() {
        let running = [Running {
            ranks: vec![(0, res(16, 0))],
            ends_by: Some(t(1000)),
        }];
        let fifo = |p: Pending| Pending {
            fifo: true,
            reserved_from: Some(t(-60)),
            ..p
        };
        let mut jobs = vec![
            fifo(pending("ahead", 1, res(16, 0), 600)),
            fifo(pending("behind", 1, res(2, 0), 600)),
        ];
        jobs[0].gives_up_at = Some(t(500));
        let e = estimate(&nodes(1, 16, 0), &running, &jobs, t(0));
        let Estimate::TimesOut { at, why } = &e[0] else {
            panic!("{e:?}")
        };
        assert_eq!(*at, t(500));
        assert!(why.contains("queue_timeout"), "{why}");
        let Estimate::At {
            start,
            bound,
            basis,
            ..
        } = &e[1]
        else {
            panic!("{e:?}")
        };
        assert_eq!(*start, t(1000), "after the running job, the one ahead gone");
        assert!(!bound, "{basis}");
        assert!(basis.contains("fifo queue"), "{basis}");
        words_match(&e);
        // Placed at its deadline: the margin would start it after its failure.
        jobs[0].gives_up_at = Some(t(1005));
        let e = replay_with(
            &nodes(1, 16, 0),
            &running,
            &jobs[..1],
            &Maintenance::default(),
            SignedDuration::from_secs(10),
            t(0),
        )
        .estimates;
        assert!(matches!(e[0], Estimate::TimesOut { .. }), "{e:?}");
    }

    /// In a fifo queue, a job behind a gang told only an expectation is told one too, in words that
    /// say so; behind gangs told bounds it keeps its own.
    #[test]
    fn in_a_fifo_queue_a_bound_holds_only_behind_bounds() {
        let running = [Running {
            ranks: vec![(0, res(8, 0))],
            ends_by: Some(t(300)),
        }];
        let fifo = |p: Pending, sla: bool| Pending {
            fifo: true,
            reserved_from: sla.then(|| t(-60)),
            ..p
        };
        // Ahead, a gang of two ranks without reserved nodes: an expectation (smaller jobs of other
        // queues can keep filling what it waits for).
        let jobs = [
            fifo(pending("first", 2, res(8, 0), 100), true),
            fifo(pending("second", 1, res(8, 0), 100), true),
        ];
        let e = estimate(&nodes(1, 16, 0), &running, &jobs, t(0));
        words_match(&e);
        let told = |e: &Estimate| match e {
            Estimate::At { bound, .. } => *bound,
            other => panic!("{other:?}"),
        };
        assert!(
            !told(&e[0]),
            "a gang without reserved nodes: an expectation"
        );
        assert_eq!(start(&e[1]), t(400), "after the gang: {e:?}");
        assert!(!told(&e[1]), "behind an expectation in fifo: {e:?}");
        let jobs = [
            fifo(pending("first", 1, res(8, 0), 100), true),
            fifo(pending("second", 1, res(8, 0), 100), true),
        ];
        let e = estimate(&nodes(1, 16, 0), &running, &jobs, t(0));
        assert!(told(&e[0]) && told(&e[1]), "{e:?}");
        words_match(&e);
    }

    #[test]
    fn a_gang_past_its_sla_waiting_time_keeps_what_it_can_place_and_is_not_passed() {
        // Two 16-CPU nodes: node 0 busy until 100 s. A two-node gang waits; a small long job behind it.
        let running = vec![Running {
            ranks: vec![(0, res(16, 0))],
            ends_by: Some(t(100)),
        }];
        let mut gang = pending("gang", 2, res(16, 0), 60);
        let small = pending("small", 1, res(4, 0), 500);
        let e = estimate(
            &nodes(2, 16, 0),
            &running,
            &[gang.clone(), small.clone()],
            t(0),
        );
        assert_eq!(
            (start(&e[0]), start(&e[1])),
            (t(500), t(0)),
            "without a waiting time the small job takes the idle node first"
        );
        // Past its waiting time the gang keeps the idle node: the small job waits for the gang.
        gang.reserved_from = Some(t(-1));
        let e = estimate(
            &nodes(2, 16, 0),
            &running,
            &[gang.clone(), small.clone()],
            t(0),
        );
        assert_eq!((start(&e[0]), start(&e[1])), (t(100), t(160)));
        // Reserving from 30 s on: the small job arrived first and is not moved.
        gang.reserved_from = Some(t(30));
        let e = estimate(&nodes(2, 16, 0), &running, &[gang, small], t(0));
        assert_eq!((start(&e[0]), start(&e[1])), (t(500), t(0)));
    }

    fn is_bound(e: &Estimate) -> bool {
        matches!(e, Estimate::At { bound: true, .. })
    }

    /// Traced in the busy workload (seed 1): a small job told a bound in a gap before a gang ahead of
    /// it started late, because jobs that ended early let the gang ahead fit sooner and take the gap
    /// first (the `sla` order serves it first). Such a start is an expectation; one on a node the
    /// gangs ahead cannot use stays a bound.
    #[test]
    fn a_job_in_a_gap_before_a_job_ahead_that_could_use_its_node_is_not_promised() {
        let gib = |cpu: u64, mem: u64| Resources {
            cpu_milli: cpu * 1000,
            memory_mib: mem * 1024,
            gpu: 0,
        };
        let overdue = |mut p: Pending| {
            p.reserved_from = Some(t(-1));
            p
        };
        let ahead = overdue(pending("ahead", 1, gib(4, 30), 60));
        let small = overdue(pending("small", 1, gib(2, 1), 60));
        // One node of 8 CPUs, 6 held until 100 s: the small job fits in the gap now, the one ahead at 100 s.
        let node = |name: &str, r: Resources| Node {
            name: name.into(),
            allocatable: r,
            reserved_for: None,
        };
        let running = vec![Running {
            ranks: vec![(0, gib(6, 2))],
            ends_by: Some(t(100)),
        }];
        // (Memory enough that the job ahead is no large gang: half a node or less.)
        let one = [node("n0", gib(8, 64))];
        let e = estimate(&one, &running, &[ahead.clone(), small.clone()], t(0));
        assert_eq!((start(&e[0]), start(&e[1])), (t(100), t(0)));
        assert!(is_bound(&e[0]));
        assert!(!is_bound(&e[1]), "{:?}", e[1]);
        let Estimate::At { basis, .. } = &e[1] else {
            unreachable!()
        };
        assert!(
            basis.contains("in a gap before a job ahead of it"),
            "{basis}"
        );
        // A second node with too little memory for the job ahead: the small job goes there (the least
        // taken), where the job ahead can never start, and is promised.
        let two = [node("n0", gib(8, 64)), node("n1", gib(8, 8))];
        let e = estimate(&two, &running, &[ahead, small], t(0));
        assert_eq!((start(&e[0]), start(&e[1])), (t(100), t(0)));
        assert!(is_bound(&e[0]) && is_bound(&e[1]), "{e:?}");
    }

    /// `[monitor] start_margin`: a job placed when its resources are free is told it starts that much
    /// later, and runs its allocation from then, so what waits for it waits the margin too.
    #[test]
    fn a_start_is_told_the_start_margin_after_its_resources_are_free() {
        // The first job takes half the node (no large gang: its start is a bound), the second all of it.
        let running = vec![Running {
            ranks: vec![(0, res(16, 0))],
            ends_by: Some(t(100)),
        }];
        let mut first = pending("first", 1, res(8, 0), 60);
        first.reserved_from = Some(t(-1));
        let second = pending("second", 1, res(16, 0), 60);
        let margin = SignedDuration::from_secs(10);
        let e = replay_with(
            &nodes(1, 16, 0),
            &running,
            &[first.clone(), second.clone()],
            &Maintenance::default(),
            margin,
            t(0),
        )
        .estimates;
        assert_eq!((start(&e[0]), start(&e[1])), (t(110), t(180)));
        // Free now: told now plus the margin, and why.
        let e = replay_with(
            &nodes(1, 16, 0),
            &[],
            &[first],
            &Maintenance::default(),
            margin,
            t(0),
        )
        .estimates;
        let Estimate::At {
            start,
            basis,
            bound,
            ..
        } = &e[0]
        else {
            panic!("{e:?}");
        };
        assert_eq!(*start, t(10));
        assert!(*bound);
        assert!(
            basis.starts_with("its resources are free now (by ")
                && basis.ends_with("at the latest: the time the scheduler takes to place it)"),
            "{basis}"
        );
    }

    #[test]
    fn a_whole_node_gang_past_its_waiting_time_reserves_the_nodes_that_empty_first_and_is_then_bound()
     {
        // Three 16-CPU nodes, each with a 1-CPU job until 100, 200 and 300 s; a whole-node gang of two
        // past its waiting time, and small long jobs behind it that fit in the gaps now.
        let running: Vec<Running> = [100, 200, 300]
            .iter()
            .enumerate()
            .map(|(n, end)| Running {
                ranks: vec![(n, res(1, 0))],
                ends_by: Some(t(*end)),
            })
            .collect();
        let mut gang = pending("gang", 2, res(8, 0), 50);
        gang.exclusive = true;
        gang.reserved_from = Some(t(-10));
        let mut jobs = vec![gang];
        jobs.extend((0..3).map(|k| pending(&format!("small-{k}"), 1, res(1, 0), 1000)));
        // Without reservations the small jobs take a gap on every node: the gang waits for them.
        let r = replay(&nodes(3, 16, 0), &running, &jobs, t(0));
        assert!(start(&r.estimates[0]) >= t(1000), "{r:?}");
        assert!(r.reserve_now.is_empty());
        // With them: the two nodes that empty first are reserved now, the small jobs start on the third.
        jobs[0].reserves = Some("g".into());
        let r = replay(&nodes(3, 16, 0), &running, &jobs, t(0));
        assert_eq!(r.reserve_now, vec![(0, vec![0, 1])]);
        assert_eq!(start(&r.estimates[0]), t(200));
        assert!(
            matches!(r.estimates[0], Estimate::At { bound: false, .. }),
            "not a bound before the nodes are reserved"
        );
        assert!(r.estimates[1..].iter().all(|e| start(e) == t(0)));
        // Once the taints are there: a bound, and nothing more to reserve.
        let mut cluster = nodes(3, 16, 0);
        cluster[0].reserved_for = Some("g".into());
        cluster[1].reserved_for = Some("g".into());
        let r = replay(&cluster, &running, &jobs, t(0));
        assert!(r.reserve_now.is_empty(), "{r:?}");
        assert!(
            matches!(r.estimates[0], Estimate::At { start, bound: true, .. } if start == t(200)),
            "{r:?}"
        );
        // A gang past its waiting time ahead of it that cannot start yet goes first: nothing is
        // reserved before it has started.
        let mut ahead = pending("ahead", 3, res(16, 0), 10);
        ahead.reserved_from = Some(t(-20));
        let mut behind = vec![ahead];
        behind.extend(jobs.iter().cloned());
        let r = replay(&nodes(3, 16, 0), &running, &behind, t(0));
        assert!(r.reserve_now.is_empty(), "{r:?}");
        // A node reserved for a job that no longer waits is free to all.
        let mut stale = nodes(3, 16, 0);
        stale[2].reserved_for = Some("gone".into());
        let r = replay(&stale, &running, &jobs, t(0));
        assert!(r.estimates[1..].iter().all(|e| start(e) == t(0)), "{r:?}");
    }

    #[test]
    fn a_large_gang_that_is_not_whole_node_reserves_the_nodes_with_room_first_and_is_then_bound() {
        // Three 16-CPU nodes, each with a 6-CPU job until 100, 200 and 300 s: 10 CPUs free on each,
        // short of a 12-CPU rank. Small long 5-CPU jobs behind fit in the gaps now.
        let running: Vec<Running> = [100, 200, 300]
            .iter()
            .enumerate()
            .map(|(n, end)| Running {
                ranks: vec![(n, res(6, 0))],
                ends_by: Some(t(*end)),
            })
            .collect();
        let mut gang = pending("gang", 2, res(12, 0), 50);
        gang.reserved_from = Some(t(-10));
        let mut jobs = vec![gang];
        jobs.extend((0..2).map(|k| pending(&format!("small-{k}"), 1, res(5, 0), 1000)));
        assert!(needs_reservation(&jobs[0], &nodes(3, 16, 0)));
        // Without reservations the small jobs take 5 CPUs on two nodes: the gang waits for them, and
        // what it is told is an expectation that says why.
        let r = replay(&nodes(3, 16, 0), &running, &jobs, t(0));
        assert!(start(&r.estimates[0]) >= t(1000), "{r:?}");
        assert!(r.reserve_now.is_empty());
        assert!(
            matches!(&r.estimates[0], Estimate::At { bound: false, basis, .. }
                if basis.contains("needs most of a node, or several ranks at once")),
            "{r:?}"
        );
        // With them: the two nodes where a rank fits first are reserved now, the small jobs start on
        // the third.
        jobs[0].reserves = Some("g".into());
        let r = replay(&nodes(3, 16, 0), &running, &jobs, t(0));
        assert_eq!(r.reserve_now, vec![(0, vec![0, 1])]);
        assert_eq!(start(&r.estimates[0]), t(200));
        assert!(matches!(r.estimates[0], Estimate::At { bound: false, .. }));
        assert!(r.estimates[1..].iter().all(|e| start(e) == t(0)));
        // Once the taints are there: a bound.
        let mut cluster = nodes(3, 16, 0);
        cluster[0].reserved_for = Some("g".into());
        cluster[1].reserved_for = Some("g".into());
        let r = replay(&cluster, &running, &jobs, t(0));
        assert!(r.reserve_now.is_empty(), "{r:?}");
        assert!(
            matches!(r.estimates[0], Estimate::At { start, bound: true, .. } if start == t(200)),
            "{r:?}"
        );
        // Four ranks of 8 CPUs (two to a node) must start at once: a reservation too, and without
        // one an expectation.
        let mut half = jobs.clone();
        half[0].per_rank = res(8, 0);
        half[0].replicas = 4;
        half[0].reserves = None;
        assert!(needs_reservation(&half[0], &nodes(3, 16, 0)));
        let r = replay(&nodes(3, 16, 0), &running, &half, t(0));
        assert!(r.reserve_now.is_empty(), "{r:?}");
        assert!(matches!(r.estimates[0], Estimate::At { bound: false, .. }));
        // One rank of 8 CPUs needs none: nothing is reserved, and the `sla` plugin's locking makes
        // its start a bound.
        let mut single = half.clone();
        single[0].replicas = 1;
        assert!(!needs_reservation(&single[0], &nodes(3, 16, 0)));
        let r = replay(&nodes(3, 16, 0), &running, &single, t(0));
        assert!(r.reserve_now.is_empty(), "{r:?}");
        assert!(matches!(r.estimates[0], Estimate::At { bound: true, .. }));
        // A job of one 12-CPU rank is a large gang of one: the node with room first is reserved.
        let mut one = jobs.clone();
        one[0].replicas = 1;
        let r = replay(&nodes(3, 16, 0), &running, &one, t(0));
        assert_eq!(r.reserve_now, vec![(0, vec![0])]);
        assert_eq!(start(&r.estimates[0]), t(100));
    }

    #[test]
    fn a_node_that_holds_several_ranks_of_a_large_gang_counts_for_them() {
        // A 16-CPU node (one 12-CPU rank) with 6 CPUs taken until 100 s, a 32-CPU node (two ranks) with
        // 10 taken until 200 s. A gang of three 12-CPU ranks past its waiting time needs both.
        let mut cluster = nodes(1, 16, 0);
        cluster.extend(nodes(1, 32, 0).into_iter().map(|mut n| {
            n.name = "big".into();
            n
        }));
        let running = vec![
            Running {
                ranks: vec![(0, res(6, 0))],
                ends_by: Some(t(100)),
            },
            Running {
                ranks: vec![(1, res(10, 0))],
                ends_by: Some(t(200)),
            },
        ];
        let mut gang = pending("gang", 3, res(12, 0), 50);
        gang.reserved_from = Some(t(-10));
        gang.reserves = Some("g".into());
        assert!(needs_reservation(&gang, &cluster));
        let r = replay(&cluster, &running, std::slice::from_ref(&gang), t(0));
        // The big node has room for a rank now, the small one at 100 s.
        assert_eq!(r.reserve_now, vec![(0, vec![1, 0])]);
        for n in &mut cluster {
            n.reserved_for = Some("g".into());
        }
        let r = replay(&cluster, &running, std::slice::from_ref(&gang), t(0));
        assert!(
            matches!(r.estimates[0], Estimate::At { start, bound: true, .. } if start == t(200)),
            "{r:?}"
        );
        // The big node alone holds two of its three ranks: no bound.
        cluster[0].reserved_for = None;
        let r = replay(&cluster, &running, &[gang], t(0));
        assert!(matches!(r.estimates[0], Estimate::At { bound: false, .. }));
    }

    #[test]
    fn gpus_are_what_a_gpu_job_waits_for() {
        let mut cluster = nodes(2, 16, 0);
        cluster.push(Node {
            name: "gpu".into(),
            allocatable: res(16, 4),
            reserved_for: None,
        });
        let running = vec![Running {
            ranks: vec![(2, res(2, 4))],
            ends_by: Some(t(500)),
        }];
        let e = estimate(&cluster, &running, &[pending("g", 1, res(2, 2), 60)], t(0));
        assert_eq!(start(&e[0]), t(500), "CPU nodes are free, the GPUs are not");
    }

    #[test]
    fn a_job_too_large_for_any_node_says_so_at_once() {
        let e = estimate(
            &nodes(4, 16, 0),
            &[],
            &[pending("huge", 1, res(32, 0), 60)],
            t(0),
        );
        assert!(
            matches!(&e[0], Estimate::Never { why } if why.contains("CPU")),
            "{e:?}"
        );
        let e = estimate(
            &nodes(2, 16, 0),
            &[],
            &[pending("gang", 3, res(16, 0), 60)],
            t(0),
        );
        assert!(
            matches!(&e[0], Estimate::Never { why } if why.contains("all 3 ranks")),
            "{e:?}"
        );
        let e = estimate(
            &nodes(2, 16, 0),
            &[],
            &[pending("gpu", 1, res(1, 1), 60)],
            t(0),
        );
        assert!(
            matches!(&e[0], Estimate::Never { why } if why.contains("GPUs")),
            "{e:?}"
        );
    }

    #[test]
    fn without_time_limits_there_is_no_bound() {
        let running = vec![Running {
            ranks: vec![(0, res(16, 0))],
            ends_by: None,
        }];
        let jobs = [
            pending("a", 1, res(16, 0), 60),
            pending("b", 1, res(1, 0), 60),
        ];
        let e = estimate(&nodes(1, 16, 0), &running, &jobs, t(0));
        assert!(matches!(e[0], Estimate::Unbounded { .. }));
        assert!(
            matches!(e[1], Estimate::Unbounded { .. }),
            "nor for the jobs behind it"
        );
    }

    #[test]
    fn a_deadline_in_the_past_counts_as_now() {
        let running = vec![Running {
            ranks: vec![(0, res(16, 0))],
            ends_by: Some(t(-30)),
        }];
        let e = estimate(
            &nodes(1, 16, 0),
            &running,
            &[pending("a", 1, res(16, 0), 60)],
            t(0),
        );
        assert_eq!(start(&e[0]), t(0));
    }

    /// Replaying the estimate's own placement with every job running exactly its allocation never has
    /// a job start later than its estimate (checked with a simple time-stepped simulation of the same
    /// rules).
    #[test]
    fn estimates_are_upper_bounds_for_jobs_that_run_their_whole_allocation_or_less() {
        let cluster = nodes(3, 8, 0);
        let running = vec![
            Running {
                ranks: vec![(0, res(8, 0))],
                ends_by: Some(t(40)),
            },
            Running {
                ranks: vec![(1, res(4, 0)), (2, res(4, 0))],
                ends_by: Some(t(70)),
            },
        ];
        // A fifo queue: the simulation below keeps the order.
        let jobs: Vec<Pending> = (0..12)
            .map(|i| Pending {
                fifo: true,
                ..pending(
                    &format!("j{i}"),
                    1 + (i % 3),
                    res(2 + u64::from(i % 4), 0),
                    20 + 10 * i64::from(i % 5),
                )
            })
            .collect();
        let estimates = estimate(&cluster, &running, &jobs, t(0));
        // Every job ends early (at half its allocation): in-order gang placement with one-second steps.
        let mut free: Vec<Resources> = cluster.iter().map(|n| n.allocatable).collect();
        let mut holding: Vec<(i64, Vec<(usize, Resources)>)> = Vec::new();
        for r in &running {
            for (n, x) in &r.ranks {
                x.take_from(&mut free[*n]);
            }
            holding.push((
                (r.ends_by.unwrap().as_second() - t(0).as_second()) / 2,
                r.ranks.clone(),
            ));
        }
        let mut next = 0;
        for second in 0..10_000i64 {
            holding.retain(|(end, ranks)| {
                if *end <= second {
                    for (n, x) in ranks {
                        x.give_back(&mut free[*n]);
                    }
                    false
                } else {
                    true
                }
            });
            while next < jobs.len() {
                let access = Access {
                    reserved: &[],
                    me: next,
                    own_only: false,
                    off: None,
                };
                let Some(p) = place(&jobs[next], &mut free, &cluster, access) else {
                    break;
                };
                assert!(
                    t(second) <= start(&estimates[next]),
                    "{} started at {second}, after its estimate {:?}",
                    jobs[next].job_id,
                    estimates[next]
                );
                let runs = jobs[next].runs_for.unwrap().as_secs() / 2;
                holding.push((second + runs.max(1), p));
                next += 1;
            }
            if next == jobs.len() {
                break;
            }
        }
        assert_eq!(next, jobs.len(), "every job started");
    }

    /// What a job holds: `(node, resources)` per rank.
    type Ranks = Vec<(usize, Resources)>;

    /// One snapshot for the property below: `slots` ranks fit on each of the nodes, every running job
    /// holds whole slots on nodes with room (with its deadline in seconds), and every waiting gang is
    /// one rank past its `sla-waiting-time` (so it is told a bound), with its allocation in seconds.
    #[derive(Debug, Clone)]
    struct Case {
        nodes: usize,
        slots: u64,
        running: Vec<(usize, u64, i64)>,
        waiting: Vec<i64>,
        /// Per running job then per waiting gang: the share of its time it really runs (0 to 1).
        early: Vec<f64>,
    }

    fn any_case() -> impl proptest::strategy::Strategy<Value = Case> {
        use proptest::prelude::*;
        (1usize..4, 2u64..4)
            .prop_flat_map(|(nodes, slots)| {
                (
                    Just(nodes),
                    Just(slots),
                    proptest::collection::vec((0..nodes, 1..=slots, 1i64..120), 0..8),
                    proptest::collection::vec(1i64..120, 1..10),
                    proptest::collection::vec(0.0f64..=1.0, 20),
                )
            })
            .prop_map(|(nodes, slots, running, waiting, early)| Case {
                nodes,
                slots,
                running,
                waiting,
                early,
            })
    }

    /// What really happens to a snapshot, replayed: running jobs and started gangs end early (at the
    /// case's share of their time), and at every second the scheduler (the forecast's own session,
    /// on what then runs and waits, with the deadlines it knows) starts what it places then. The start
    /// of each gang, in seconds from the snapshot.
    fn replayed_starts(case: &Case, cluster: &[Node], rank: Resources) -> Vec<i64> {
        let mut early = case.early.iter().copied().cycle();
        // (ranks, deadline told to the forecast, real end)
        let mut running: Vec<(Ranks, i64, i64)> = Vec::new();
        let mut free: Vec<Resources> = cluster.iter().map(|n| n.allocatable).collect();
        for &(node, ranks, secs) in &case.running {
            let mut held = Vec::new();
            for _ in 0..ranks {
                if rank.fits_in(&free[node]) {
                    rank.take_from(&mut free[node]);
                    held.push((node, rank));
                }
            }
            let end = (secs as f64 * early.next().unwrap_or(1.0)).floor() as i64;
            if !held.is_empty() {
                running.push((held, secs, end));
            }
        }
        let mut waiting: Vec<usize> = (0..case.waiting.len()).collect();
        let mut starts = vec![i64::MAX; case.waiting.len()];
        for second in 0..10_000i64 {
            running.retain(|(ranks, _, end)| {
                *end > second || {
                    ranks.iter().for_each(|(n, r)| r.give_back(&mut free[*n]));
                    false
                }
            });
            if waiting.is_empty() {
                break;
            }
            let snapshot: Vec<Running> = running
                .iter()
                .map(|(ranks, deadline, _)| Running {
                    ranks: ranks.clone(),
                    ends_by: Some(t(*deadline)),
                })
                .collect();
            let gangs: Vec<Pending> = waiting.iter().map(|&i| gang(case, i, rank)).collect();
            let told = estimate(cluster, &snapshot, &gangs, t(second));
            let mut still = Vec::new();
            for (k, &i) in waiting.iter().enumerate() {
                if !matches!(told[k], Estimate::At { start, .. } if start <= t(second)) {
                    still.push(i);
                    continue;
                }
                let access = Access {
                    reserved: &[],
                    me: k,
                    own_only: false,
                    off: None,
                };
                let placed = place(&gangs[k], &mut free, cluster, access)
                    .expect("the session places what it starts now");
                let runs = case.waiting[i];
                let end = second + ((runs as f64) * early.next().unwrap_or(1.0)).floor() as i64;
                running.push((placed, second + runs, end.max(second + 1)));
                starts[i] = second;
            }
            waiting = still;
        }
        starts
    }

    fn gang(case: &Case, i: usize, rank: Resources) -> Pending {
        Pending {
            reserved_from: Some(t(-1)),
            ..pending(&format!("g{i}"), 1, rank, case.waiting[i])
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// The forecast never tells a bound that the replay of the same snapshot breaks: no gang told
        /// "by B at the latest" starts after B when every job ends at its deadline or earlier.
        #[test]
        fn a_bound_is_never_broken_by_jobs_that_end_early(case in any_case()) {
            let rank = res(2, 0);
            let cluster: Vec<Node> = (0..case.nodes)
                .map(|i| Node {
                    name: format!("n{i}"),
                    allocatable: rank.times(case.slots as u32),
                    reserved_for: None,
                })
                .collect();
            // The snapshot as the forecast sees it: every running job to its deadline.
            let mut free: Vec<Resources> = cluster.iter().map(|n| n.allocatable).collect();
            let mut running = Vec::new();
            for &(node, ranks, secs) in &case.running {
                let mut held = Vec::new();
                for _ in 0..ranks {
                    if rank.fits_in(&free[node]) {
                        rank.take_from(&mut free[node]);
                        held.push((node, rank));
                    }
                }
                if !held.is_empty() {
                    running.push(Running { ranks: held, ends_by: Some(t(secs)) });
                }
            }
            let gangs: Vec<Pending> = (0..case.waiting.len()).map(|i| gang(&case, i, rank)).collect();
            let told = estimate(&cluster, &running, &gangs, t(0));
            let starts = replayed_starts(&case, &cluster, rank);
            for (i, e) in told.iter().enumerate() {
                let Estimate::At { start, bound, .. } = e else {
                    proptest::prop_assert!(false, "gang {i} got no start: {e:?}");
                    continue;
                };
                proptest::prop_assert!(*bound, "gang {i} is past its waiting time: {e:?}");
                proptest::prop_assert!(
                    t(starts[i]) <= *start,
                    "gang {i} started at {} after its bound {start}: {case:?}",
                    starts[i]
                );
            }
        }
    }
}
