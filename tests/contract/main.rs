//! The message contract, its validation, the `validate` CLI and the configuration example.
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../support/mod.rs"]
mod support;

mod cli_validate;
mod codec;
mod config_example;
mod layout;
mod props;
mod refund;
