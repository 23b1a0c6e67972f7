//! The proxy-sync role (`volcano-runner proxy-sync`): every instance keeps the routes of every running
//! interactive job, from the `ProxyEvent`s on the proxy fanout exchange and from the cluster, and writes
//! them as Envoy's dynamic configuration and, when configured, to Caddy through its admin API. docs/proxy.md describes the role for operators.
//!
//! # Layout
//! - [`table`]: [`RouteTable`], the routes by job (in [`crate::routes`], below the session check that
//!   reads it too).
//! - [`snapshot`]: the routes of the running interactive jobs, read from the cluster.
//! - [`envoy`]: the Envoy files (listener, routes, clusters, bootstrap), written atomically.
//! - [`caddy`]: Caddy's configuration, pushed through its admin API.
//! - [`sync`]: [`ProxySync`], the loop: bind first, then build from the cluster, then apply events.
//! - [`bridge`]: the session bridges (VNC, terminal, logs) on `[proxy_sync] bridge_listen`.
//!
//! Its configuration section is `[proxy_sync]` ([`crate::config::ProxySyncConfig`]).

pub mod bridge;
pub mod caddy;
pub mod envoy;
pub mod snapshot;
pub mod sync;

pub use crate::config::ProxySyncConfig;
pub use crate::routes::table;
pub use crate::routes::{
    Applied, Backend, HostNaming, JobRoutes, JobUpdate, Route, RouteTable, Routes, Stamp,
};
pub use sync::{ProxySync, ProxySyncError};
