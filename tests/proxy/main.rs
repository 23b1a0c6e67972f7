//! The proxy-sync role: the route table built from the cluster and kept from the proxy events (real
//! RabbitMQ, the simulator, the runner's monitor publishing), and the Envoy files it writes, loaded with
//! Envoy's own API definitions; and interactive jobs below the proxy: the simulator's interactive pods
//! and the session bridges (VNC, terminal, logs).
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../common/monitor.rs"]
mod monitor_support;
#[path = "../common/ports.rs"]
mod ports;
#[path = "../common/rabbit.rs"]
mod rabbit;

mod caddy;
mod cdp;
mod cli;
mod envoy;
mod hijack;
mod interactive;
mod live;
mod measure;
mod per_request;
mod sessions;
mod support;
mod sync;
