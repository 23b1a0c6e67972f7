//! The monitor: once a job exists, someone watches it. For every job in a shard this runner holds, it
//! publishes the lifecycle (RUNNING, then exactly one of SUCCESS, FAILURE, EXPIRED, CANCELLED, and
//! status events while it waits), enforces the expiry with warnings before it, charges in accounting
//! ticks while the job runs, tells the proxies where interactive jobs live, and cleans up exactly once.
//!
//! # Layout
//! - [`MonitorConfig`] (this file): the `[monitor]` section.
//! - [`clock`]: where "now" comes from ([`SystemClock`], or a simulated clock in tests).
//! - [`record`]: what the monitor persists on each job (last published state, outcome, status hash).
//! - [`observe`]: ranks, exit codes, start and end times, image pull failures, pending reasons.
//! - [`decide`]: the pure decision per job: observed objects + now → [`decide::Step`].
//! - [`events`]: the lifecycle events and their deterministic ids.
//! - [`cache`]: the watched objects, kept small; [`keys`]: the keys and fast maps its users share;
//!   [`slim`]: what is decoded of them (only what the monitor reads).
//! - [`peers`]: peers run together: the gate, their addresses, their ends.
//! - [`inputs`]: the forecast's snapshot ([`crate::forecast`], which replays the scheduler) read from
//!   the listed nodes, pods, PodGroups and jobs; [`telling`]: when a waiting job hears its estimate
//!   again.
//! - [`reserve`]: nodes reserved by a taint for a whole-node or large gang past its waiting time.
//! - [`timers`]: deadlines by job (in the clock's time) and retry backoff (in real time).
//! - [`waiting`]: the jobs waiting to be decided, in two lanes (the loop's hold before a decision).
//! - [`execute`]: carries a step out: publish (confirmed), then patch (resourceVersion), then delete.
//! - [`live_pods`]: the pod watch, whose lists leave finished pods out and whose watch does not.
//! - [`verify`]: the full reconciliation's check of the watches: metadata lists against the cache.
//! - [`listing`]: reads a page of a metadata list for names and versions only, without a serde tree.
//! - [`queued`]: the jobs whose QUEUED this process had confirmed (the monitor sends no copy of it).
//! - [`run`]: the loop: watches, full reconciliation, timers, shards, bounded concurrency.
//!
//! See `docs/monitor.md` for the duty and failover design and the order of effects.

pub mod cache;
pub mod clock;
pub mod decide;
pub mod end_tails;
pub mod events;
pub mod execute;
pub mod inputs;
pub mod keys;
pub mod lag;
pub mod listing;
pub mod live_pods;
pub mod maintenance;
pub mod observe;
pub mod peers;
pub mod queued;
pub mod queues;
pub mod record;
pub mod reserve;
pub mod run;
pub mod slim;
pub mod telling;
pub mod timers;
pub mod verify;
pub mod waiting;

pub use clock::{Clock, SystemClock};
pub use decide::{Observed, Settings, Step};
pub use queued::ConfirmedQueued;
pub use record::{Outcome, Published, Terminal};
pub use run::{Monitor, PassReport};

pub use crate::config::monitor::{Encoding, MonitorConfig, MonitorConfigError};
