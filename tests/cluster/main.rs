//! Cluster access tests: the real kube client against the in-process simulator.
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../common/cluster.rs"]
mod common;

mod apply;
mod lease;
mod rendered;
mod switches;
mod tombstone;
