//! The cluster simulator through the real kube client and kubectl.
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../common/busy_workload.rs"]
mod busy_workload;
#[path = "../common/sim.rs"]
mod sim_support;

mod api;
mod bad_input;
mod busy;
mod commands;
mod estimates;
mod exclusive;
mod faults;
mod fifo;
mod interactive;
mod kubectl;
mod logs;
mod promise;
mod queue_status;
mod queues;
mod retention;
mod sla;
mod starve;
mod volcano;
mod watch;
