//! The plugins, one file each, and their one ordered [`REGISTRY`].
//!
//! Order matters as in UCloud: Task first (it fills the container the others change), Parameter next (it
//! sets `command` and `env` outright), the rest append. Each plugin builds its part of the job
//! ([`Plugin::build`]) and may react to the job's life ([`Plugin::on_start`], ...); configuration switches
//! each one on or off ([`super::PluginSwitches`]).

pub mod accounting;
pub mod connect_to_job;
pub mod expiry;
pub mod fair_share;
pub mod file_mount;
pub mod ingress;
pub mod kata_container;
pub mod minikube;
pub mod miscellaneous;
pub mod multi_node;
pub mod network_ip;
pub mod network_limit;
pub mod output_files;
pub mod parameter;
pub mod proxy;
pub mod shared_memory;
pub mod task;
pub mod traced;

use std::fmt;

use super::PipelineError;
use super::context::Context;
use super::draft::Draft;
use super::facts::{HookActions, HookContext, HookError};

/// Names a plugin, for switches, logs and hook failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PluginId {
    /// See [`task`].
    Task,
    /// See [`parameter`].
    Parameter,
    /// See [`file_mount`].
    FileMount,
    /// See [`multi_node`].
    MultiNode,
    /// See [`shared_memory`].
    SharedMemory,
    /// See [`expiry`].
    Expiry,
    /// See [`accounting`].
    Accounting,
    /// See [`miscellaneous`].
    Miscellaneous,
    /// See [`network_limit`].
    NetworkLimit,
    /// See [`fair_share`].
    FairShare,
    /// See [`minikube`].
    Minikube,
    /// See [`connect_to_job`].
    ConnectToJob,
    /// See [`ingress`].
    Ingress,
    /// See [`network_ip`].
    NetworkIp,
    /// See [`kata_container`].
    KataContainer,
    /// See [`proxy`].
    Proxy,
}

impl PluginId {
    /// The name UCloud used, e.g. `FileMount`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Task => "Task",
            Self::Parameter => "Parameter",
            Self::FileMount => "FileMount",
            Self::MultiNode => "MultiNode",
            Self::SharedMemory => "SharedMemory",
            Self::Expiry => "Expiry",
            Self::Accounting => "Accounting",
            Self::Miscellaneous => "Miscellaneous",
            Self::NetworkLimit => "NetworkLimit",
            Self::FairShare => "FairShare",
            Self::Minikube => "Minikube",
            Self::ConnectToJob => "ConnectToJob",
            Self::Ingress => "Ingress",
            Self::NetworkIp => "NetworkIp",
            Self::KataContainer => "KataContainer",
            Self::Proxy => "Proxy",
        }
    }
}

impl fmt::Display for PluginId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One step of the pipeline. Building is pure; hooks are pure functions of what was observed. The hooks
/// have empty defaults: most plugins only build.
pub trait Plugin: Sync {
    /// Which plugin this is.
    fn id(&self) -> PluginId;

    /// Adds this plugin's part of the job. An error names the SubmitJob field (or configuration key) at
    /// fault; it rejects the whole job.
    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError>;

    /// The job is running (possibly observed again after a restart: must be idempotent).
    fn on_start(&self, _cx: &HookContext<'_>, _out: &mut HookActions) -> Result<(), HookError> {
        Ok(())
    }

    /// Periodic check while the job runs.
    fn on_monitoring(
        &self,
        _cx: &HookContext<'_>,
        _out: &mut HookActions,
    ) -> Result<(), HookError> {
        Ok(())
    }

    /// The job finished; `cx.ended_at` is its real end.
    fn on_completion(
        &self,
        _cx: &HookContext<'_>,
        _out: &mut HookActions,
    ) -> Result<(), HookError> {
        Ok(())
    }

    /// The job is gone.
    fn on_cleanup(&self, _cx: &HookContext<'_>, _out: &mut HookActions) -> Result<(), HookError> {
        Ok(())
    }
}

/// Every plugin, in the order they run.
pub static REGISTRY: [&dyn Plugin; 16] = [
    &task::Task,
    &parameter::Parameter,
    &file_mount::FileMount,
    &multi_node::MultiNode,
    &shared_memory::SharedMemory,
    &expiry::Expiry,
    &accounting::Accounting,
    &miscellaneous::Miscellaneous,
    &network_limit::NetworkLimit,
    &fair_share::FairShare,
    &minikube::Minikube,
    &connect_to_job::ConnectToJob,
    &ingress::Ingress,
    &network_ip::NetworkIp,
    &kata_container::KataContainer,
    &proxy::Proxy,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_starts_with_task_then_parameter_and_has_each_plugin_once() {
        let ids: Vec<PluginId> = REGISTRY.iter().map(|p| p.id()).collect();
        assert_eq!(ids[0], PluginId::Task);
        assert_eq!(ids[1], PluginId::Parameter);
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        assert_eq!(ids.last(), Some(&PluginId::Proxy));
    }
}
