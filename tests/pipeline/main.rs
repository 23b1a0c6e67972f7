//! The plugin pipeline: golden files of rendered objects and property tests.
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../pipeline_support/mod.rs"]
mod pipeline_support;

mod golden;
mod props;
mod public_ip;
mod sealed;
