//! The forecast: what Volcano's scheduler will do with the jobs that wait. From a snapshot of the
//! cluster (nodes, running jobs with their allocations and deadlines, waiting gangs in their queues'
//! order, the nodes reserved for gangs, the maintenance windows) it answers when each waiting job will
//! start, whether that is a bound or an expectation, and which nodes must be reserved now.
//!
//! Pure: no I/O and no clock of its own (the caller gives `now`), and nothing of the monitor: the
//! monitor (its watch cache) and `admin queue` (a listing) build the snapshot and call it. The
//! simulator keeps its own, independent model of Volcano on purpose: it plays the real scheduler in
//! the tests, and a shared model would make the tests agree with themselves.
//!
//! # Layout, as Volcano's scheduler is laid out
//! - [`snapshot`]: the input: [`Node`], [`Running`], [`Pending`], [`Resources`].
//! - [`windows`]: the maintenance windows as the replay sees them ([`Maintenance`]).
//! - [`answer`]: what it tells of a job ([`Estimate`]); [`state`]: the replay's bookkeeping.
//! - [`session`]: the replay itself, one scheduling session after another at every instant resources
//!   come back or a waiting time runs out ([`replay_with`]).
//! - [`actions`]: what a session does: [`actions::allocate`] places the gangs (with backfill: one
//!   that does not fit lets the gangs behind it try).
//! - [`plugins`]: the rules that order and filter, each where Volcano keeps it: [`plugins::gang`]
//!   (all ranks at once), [`plugins::sla`] (waiting times, and the nodes reserved for a starving
//!   gang), [`plugins::overcommit`] (admission by the `enqueue` action), [`plugins::proportion`]
//!   (several queues: a bound becomes an expectation), [`plugins::predicates`] (reserved nodes and
//!   windows' taints), [`plugins::nodeorder`] (least requested node first).
//!
//! See docs/estimates.md for what the estimates promise and why.

pub mod actions;
pub mod answer;
pub mod plugins;
pub mod session;
pub mod snapshot;
pub mod state;
pub mod timeout;
pub mod windows;

pub use answer::{Estimate, ExpectationRecord};
pub use plugins::proportion::across_queues;
pub use plugins::sla::needs_reservation;
pub use session::{BACKFILL_DEPTH, Replay, estimate, estimate_with, replay, replay_with};
pub use snapshot::{Node, Pending, Resources, Running};
pub use windows::Maintenance;
