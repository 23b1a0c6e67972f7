//! The runner for real: RabbitMQ, the in-process simulator and runners started as a library.
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../common/busy_workload.rs"]
mod busy_workload;
#[path = "../common/runner.rs"]
mod harness;
#[path = "../common/ports.rs"]
mod ports;
#[path = "../common/rabbit.rs"]
mod rabbit;
#[path = "../common/raw_amqp.rs"]
mod raw_amqp;

mod bad_input;
mod bench;
mod busy_runners;
mod chaos;
mod control;
mod edges;
mod events_once;
mod exactly_once;
mod faults;
mod gate;
mod hostile;
mod invalid_utf8;
mod peers;
mod public_ip;
mod queued_by;
mod refusals;
mod scale;
mod sealed;
mod shutdown;
mod sim_clock;
mod submit;
mod whole_nodes;
