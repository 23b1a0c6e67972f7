//! The monitor: lifecycle events, accounting ticks, expiry and shard failover.
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../common/busy_workload.rs"]
mod busy_workload;
#[path = "../common/monitor.rs"]
mod monitor_support;
#[path = "../common/rabbit.rs"]
mod rabbit;

mod bookings;
mod cost;
mod defer;
mod disruption;
mod ended;
mod failover;
mod fifo;
mod handover;
mod lifecycle;
mod maintenance;
mod output_files;
mod peers;
mod promise;
mod refund;
mod starve;
mod traced;
mod whole_nodes;
