//! volcano-runner: runs science-cloud jobs on Kubernetes with the Volcano batch scheduler.
//!
//! # Layout
//! - [`messages`]: the message contract (prost types from `proto/`, proto3 JSON, decoding) and
//!   [`validate`], the layer that rejects bad input with the field path and the reason.
//! - [`config`]: the one typed configuration, from TOML plus `VOLCANO_RUNNER_*` environment overrides.
//! - [`durable`]: a job's durable record on its VolcanoJob (every annotation key) and the deterministic
//!   ids of every event published about it: the one place both are defined.
//! - [`pipeline`]: the plugins that turn a validated submission into the desired Kubernetes objects
//!   (pure, no I/O), and their lifecycle hooks.
//! - [`volcano`]: the Volcano CRD types (Job, PodGroup, Queue) that the pipeline renders and the cluster
//!   layer, the monitor and the simulator read; below all of them, so the pipeline needs no cluster access.
//! - [`interval`]: spans of time (what overlaps what, the earliest of two instants), below the bookings,
//!   the maintenance windows and the forecast that share them.
//! - [`cluster`]: Kubernetes access: the client, and the applier that creates desired objects in order;
//!   the job store and the log-follow engine, shared from here by the runner and the session issuer,
//!   and by the `logs` command and proxy-sync's logs bridge.
//! - [`broker`]: RabbitMQ through lapin: topology, consumers, confirmed publishing, reconnects.
//! - [`runner`]: consumes submissions, cancels and extensions and applies them.
//! - [`forecast`]: what Volcano's scheduler will do with the waiting jobs (start times, bounds, nodes to
//!   reserve): pure functions over a snapshot, shaped like the scheduler; below the monitor.
//! - [`monitor`]: watches jobs: lifecycle events, expiry, accounting ticks, proxy events.
//! - [`ops`]: metrics, health and readiness, logs with secrets removed, W3C trace context; below the
//!   broker and the cluster layer, which report into it.
//! - [`proxy`]: the proxy-sync role: the route table of the interactive jobs, kept from the proxy events
//!   and the cluster, written as Envoy's dynamic configuration.
//! - [`routes`]: the route table of the running interactive jobs, below the proxy-sync role that keeps it
//!   and the session check that reads it.
//! - [`sessions`]: interactive sessions: ids opened by the runners on request, checked by proxy-sync on
//!   every request through the proxy.
//! - [`sim`]: the cluster simulator, a Kubernetes API server with a Volcano model.
//! - [`cli`]: the `volcano-runner` command line.
//! - [`alloc`]: the process's allocator (jemalloc) and why.
//! - [`bench`]: the end-to-end load benchmark behind `volcano-runner bench`.
//! - [`ws`]: the server side of a WebSocket handshake (the simulator's exec, the session bridges).
//!
//! No two of these modules import each other: a part two others need lives below both (the job store
//! and the log-follow engine in [`cluster`]; [`ops`] names neither the broker nor the cluster).

pub mod alloc;
pub mod bench;
pub mod broker;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod durable;
pub mod forecast;
pub mod interval;
pub mod messages;
pub mod monitor;
pub mod ops;
pub mod pipeline;
pub mod proxy;
pub mod quantity;
pub mod routes;
pub mod runner;
pub mod secret;
pub mod sessions;
pub mod sim;
pub mod validate;
pub mod volcano;
pub mod ws;
