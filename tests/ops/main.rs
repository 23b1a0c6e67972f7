//! Operations: deployment manifests, metrics, RBAC, readiness and redaction of the CLI.
//!
//! One test binary per area: each binary links the whole dependency tree, so fewer binaries
//! keep the build quick to link and small on disk.

#[path = "../ops_common/mod.rs"]
mod ops_common;

mod cli_client;
mod dead_letters;
mod demo;
mod deploy;
mod job_cmd;
mod metrics;
mod monitoring;
mod nested_headers;
mod proxy_deploy;
mod rbac;
mod readiness;
mod readme;
mod redaction_cli;
mod run_cmd;
mod status;
mod unroutable;
