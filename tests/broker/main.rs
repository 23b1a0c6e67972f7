//! Broker tests against the real RabbitMQ (a vhost per test).
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../common/rabbit.rs"]
mod rabbit;

mod messaging;
mod topology;
