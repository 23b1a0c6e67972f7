//! What the forecast looks at: the nodes, the running jobs with their allocations and deadlines, the
//! waiting gangs in their queues' order (with their waiting times and reservations). Plain data,
//! read by the monitor from its watches and by `admin queue` from a listing; the forecast never reads
//! the cluster itself.

use jiff::{SignedDuration, Timestamp};

/// Resources of one rank, or what a node can hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: u64,
}

impl Resources {
    pub(crate) fn fits_in(&self, free: &Resources) -> bool {
        self.cpu_milli <= free.cpu_milli
            && self.memory_mib <= free.memory_mib
            && self.gpu <= free.gpu
    }

    /// `n` of these together.
    pub(crate) fn times(&self, n: u32) -> Resources {
        let n = u64::from(n);
        Resources {
            cpu_milli: self.cpu_milli.saturating_mul(n),
            memory_mib: self.memory_mib.saturating_mul(n),
            gpu: self.gpu.saturating_mul(n),
        }
    }

    pub(crate) fn take_from(&self, free: &mut Resources) {
        free.cpu_milli -= self.cpu_milli;
        free.memory_mib -= self.memory_mib;
        free.gpu -= self.gpu;
    }

    pub(crate) fn give_back(&self, free: &mut Resources) {
        free.cpu_milli += self.cpu_milli;
        free.memory_mib += self.memory_mib;
        free.gpu += self.gpu;
    }

    /// What is short on `free` for one rank, for a plain-language reason.
    pub(crate) fn shortage(&self, largest: &Resources) -> Option<&'static str> {
        if self.gpu > largest.gpu {
            Some("GPUs")
        } else if self.cpu_milli > largest.cpu_milli {
            Some("CPU")
        } else if self.memory_mib > largest.memory_mib {
            Some("memory")
        } else {
            None
        }
    }
}

/// A node that can run ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub allocatable: Resources,
    /// The job whose gang this node is reserved for (the value of its `<prefix>reserved` taint, see
    /// `monitor::reserve`): only that gang's pods tolerate the taint, so nothing else is placed here
    /// while it waits. `None`: not reserved.
    pub reserved_for: Option<String>,
}

/// A running job: its ranks on their nodes (indices into the node list) and its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub ranks: Vec<(usize, Resources)>,
    /// Its expiry. `None`: no time limit, so it holds its resources for as long as the replay looks.
    pub ends_by: Option<Timestamp>,
}

/// A pending job, in its queue's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub job_id: String,
    pub replicas: u32,
    pub per_rank: Resources,
    /// Its time allocation. `None`: no time limit.
    pub runs_for: Option<SignedDuration>,
    /// Whole nodes: each rank needs a node nobody else uses and holds all of it.
    pub exclusive: bool,
    /// Its Volcano queue.
    pub queue: String,
    /// Its queue lets no later job of the queue start while it waits (`dequeueStrategy: fifo`); in a
    /// `traverse` queue (Volcano's default) a later job that fits in a gap starts first.
    pub fifo: bool,
    /// When the scheduler starts reserving for it: its PodGroup's creation plus its job's
    /// `sla-waiting-time` (Volcano's `sla` plugin). `None`: never.
    pub reserved_from: Option<Timestamp>,
    /// Its PodGroup is `Inqueue`: admitted, its `minResources` already counted against what later
    /// gangs may be admitted.
    pub inqueue: bool,
    /// The job id whose `<prefix>reserved` taint its pods tolerate, when the monitor may reserve nodes
    /// for it (`[monitor] reserve_nodes`, a job with a `sla-waiting-time`, whose ranks the pipeline
    /// renders tolerating it). The replay reserves only for a gang that [`needs_reservation`](crate::forecast::needs_reservation): past its
    /// waiting time it is given the nodes that first have room for its ranks, and nothing else is
    /// placed on them until it starts. `None`: nodes are not reserved for it.
    pub reserves: Option<String>,
    /// When the runner fails it if it has not started by then (its job's creation plus `[monitor]
    /// queue_timeout`). The replay takes it out of the queue at that instant (a `fifo` queue behind it
    /// moves on), and a gang the replay would start later is told that it will be failed, never a start
    /// after its failure. `None`: no such deadline.
    pub gives_up_at: Option<Timestamp>,
}

impl Pending {
    /// What the whole gang asks for (its PodGroup's `minResources`).
    pub(crate) fn minimum(&self) -> Resources {
        self.per_rank.times(self.replicas)
    }

    /// Whether the scheduler keeps the replay's order for it, so that its estimate is an upper bound:
    /// past its `sla-waiting-time` nothing placed after it takes what it can use (a `fifo` queue is not
    /// enough: the other queues still pass it). A gang that `needs_reservation` ([`needs_reservation`](crate::forecast::needs_reservation):
    /// whole nodes, more than one rank, or a rank of which some node type it fits on holds only one)
    /// is the exception: what it waits for is most of a node, or the room of several ranks at once, and
    /// the `sla` plugin keeps only the room one rank fits in, so smaller jobs can keep filling the room
    /// it waits for; it gets a bound only once the nodes
    /// tainted for it hold all of its ranks (`reserved_ranks`: how many they hold when empty): then
    /// nothing else lands on them, and they empty by the deadlines of what runs there.
    pub fn bound(&self, needs_reservation: bool, reserved_ranks: u64) -> bool {
        self.reserved_from.is_some()
            && (!needs_reservation
                || (self.reserves.is_some() && reserved_ranks >= u64::from(self.replicas)))
    }
}

/// The distinct node sizes and how many nodes have each: a cluster has a handful of node types, so "can
/// it ever fit" is answered per type, not per node.
pub(crate) fn node_types(nodes: &[Node]) -> Vec<(Resources, u64)> {
    let mut types: Vec<(Resources, u64)> = Vec::new();
    for n in nodes {
        match types.iter_mut().find(|(r, _)| *r == n.allocatable) {
            Some((_, count)) => *count += 1,
            None => types.push((n.allocatable, 1)),
        }
    }
    types
}

/// How many ranks of this size a node with `room` holds at once (`u64::MAX` for a rank that asks for
/// nothing).
pub(crate) fn ranks_in(rank: &Resources, room: &Resources) -> u64 {
    let per = |want: u64, have: u64| have.checked_div(want).unwrap_or(u64::MAX);
    per(rank.cpu_milli, room.cpu_milli)
        .min(per(rank.memory_mib, room.memory_mib))
        .min(per(rank.gpu, room.gpu))
}

/// The most a single node offers of each resource (for "can it ever fit"), from the node types.
pub(crate) fn largest_node(types: &[(Resources, u64)]) -> Resources {
    types
        .iter()
        .fold(Resources::default(), |m, (n, _)| Resources {
            cpu_milli: m.cpu_milli.max(n.cpu_milli),
            memory_mib: m.memory_mib.max(n.memory_mib),
            gpu: m.gpu.max(n.gpu),
        })
}

/// How many of the gang's ranks a node holds when nothing else runs there: one for whole nodes.
pub(crate) fn node_ranks(job: &Pending, node: &Node) -> u64 {
    let each = ranks_in(&job.per_rank, &node.allocatable);
    if job.exclusive { each.min(1) } else { each }
}
