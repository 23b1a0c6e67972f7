//! The plugin pipeline: turns a validated [`SubmitJob`] plus the configuration into the exact Kubernetes
//! objects for that job ([`render`]), and owns the lifecycle hooks that later keep the job within its
//! time allocation, charge for it and route to it ([`hooks`]).
//!
//! Everything here is pure: no I/O and no clock (time comes in as an argument). The runner applies what
//! [`render`] returns; the monitor executes what the hooks return. That is what makes the output
//! printable (`volcano-runner render`), golden-tested and benchmarked.
//!
//! # Layout
//! - [`PipelineConfig`] (this file): the `[pipeline]` section, one sub-section per concern.
//! - [`names`]: Kubernetes names (job, pods, hostnames, owner namespaces, queues).
//! - [`desired`]: [`DesiredJob`], the objects for one job in apply order.
//! - [`plugins`]: one file per plugin and the ordered [`plugins::REGISTRY`].
//! - [`facts`]: what the monitor observes ([`facts::JobFacts`]), what a hook sees and the actions it
//!   returns: the plugins' side of the hooks.
//! - [`hooks`]: runs every plugin's hook and merges their actions into one plan (re-exports [`facts`]).

pub mod config;
pub mod desired;
pub mod facts;
pub mod hooks;
pub mod kept;
pub mod located;
pub mod mounts;
pub mod names;
pub mod plugins;
pub mod sealed;

pub mod context;
pub mod draft;

use serde::Deserialize;

use crate::durable::AnnotationKeys;

pub use config::*;
pub use context::fingerprint;
pub use desired::{Companion, DesiredJob, DesiredObject, OwnerNamespace, owner_reference};
pub use draft::Draft;
pub use plugins::accounting::{Horizon, Tick, TickCursor, TickSchedule};
pub use plugins::{Plugin, PluginId, REGISTRY};

use crate::messages::v1::SubmitJob;

/// The `[pipeline]` section of the configuration: how jobs are rendered and which plugins run.
/// Every sub-section has documented defaults; see `deploy/config.d/pipeline.toml`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Prefix of every annotation and label volcano-runner writes (`ucloud.dk/` keeps UCloud's keys, so
    /// existing tooling that reads `ucloud.dk/maxTime` keeps working). Must end with `/`.
    pub annotation_prefix: String,
    /// The cluster's DNS domain, for the fully qualified names peers are reached under.
    pub cluster_domain: String,
    /// Which plugins run. Order is fixed by the registry; only on/off is configurable.
    pub plugins: PluginSwitches,
    /// Where jobs run: one namespace per owner (FairShare) or one shared namespace.
    pub namespace: NamespaceConfig,
    /// The storage every file mount comes from.
    pub storage: StorageConfig,
    /// Scheduler, queue, Volcano policies and node placement (Task and FairShare plugins).
    pub scheduling: SchedulingConfig,
    /// The `/etc/ucloud` scaffolding (MultiNode plugin).
    pub multi_node: MultiNodeConfig,
    /// Pod bandwidth caps, only where configured (NetworkLimit plugin).
    pub network_limit: NetworkLimitConfig,
    /// The network policies every job gets (FairShare and ConnectToJob plugins).
    pub network_policy: NetworkPolicyConfig,
    /// Kata Containers for selected products (KataContainer plugin).
    pub kata: KataConfig,
    /// Time allocation warnings (Expiry plugin).
    pub expiry: ExpiryConfig,
    /// Charging cadence (Accounting plugin).
    pub accounting: AccountingConfig,
    /// Where interactive jobs are published (Proxy plugin).
    pub proxy: ProxyConfig,
    /// How public IPs reach a job's pod, or that they are refused (NetworkIp plugin).
    pub public_ip: plugins::network_ip::PublicIpConfig,
    /// What a whole node (`exclusiveNodes`) is charged and how many one owner may hold (Task plugin,
    /// runner).
    pub whole_nodes: WholeNodesConfig,
    /// Every rank's output kept in the job's output folder (FileMount plugin).
    pub output: plugins::output_files::OutputConfig,
    /// Jobs whose system calls are recorded besides those that ask, and how (FileMount plugin).
    pub traced: plugins::traced::TracedConfig,
    /// Which jobs the operator seals, and whether the proxy may reach them ([`sealed`]).
    pub sealed: sealed::SealedConfig,
    /// The annotation keys for `annotation_prefix`, built once (every render and hook needs them).
    #[serde(skip)]
    keys: KeyCache,
}

/// A cache, not configuration: never part of equality.
#[derive(Clone, Default)]
struct KeyCache(std::sync::OnceLock<AnnotationKeys>);

impl PartialEq for KeyCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyCache")
    }
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            annotation_prefix: "ucloud.dk/".into(),
            cluster_domain: "cluster.local".into(),
            plugins: PluginSwitches::default(),
            namespace: NamespaceConfig::default(),
            storage: StorageConfig::default(),
            scheduling: SchedulingConfig::default(),
            multi_node: MultiNodeConfig::default(),
            network_limit: NetworkLimitConfig::default(),
            network_policy: NetworkPolicyConfig::default(),
            kata: KataConfig::default(),
            expiry: ExpiryConfig::default(),
            accounting: AccountingConfig::default(),
            proxy: ProxyConfig::default(),
            public_ip: Default::default(),
            whole_nodes: WholeNodesConfig::default(),
            output: plugins::output_files::OutputConfig::default(),
            traced: plugins::traced::TracedConfig::default(),
            sealed: sealed::SealedConfig::default(),
            keys: KeyCache::default(),
        }
    }
}

/// What rendering a job reads, and nothing more: the `[pipeline]` section and the license servers the
/// Parameter plugin resolves ids against. (The whole configuration converts into it, so callers pass
/// `&config`.)
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    pub pipeline: &'a PipelineConfig,
    pub licenses: &'a std::collections::BTreeMap<String, LicenseServer>,
}

impl AsRef<PipelineConfig> for PipelineConfig {
    fn as_ref(&self) -> &PipelineConfig {
        self
    }
}

impl PipelineConfig {
    /// The annotation keys under `annotation_prefix`, built on first use and kept.
    pub fn keys(&self) -> std::borrow::Cow<'_, AnnotationKeys> {
        let keys = self
            .keys
            .0
            .get_or_init(|| AnnotationKeys::new(&self.annotation_prefix));
        if keys.prefix == self.annotation_prefix {
            std::borrow::Cow::Borrowed(keys)
        } else {
            // The prefix was changed after the keys were built (tests do that): build them afresh.
            std::borrow::Cow::Owned(AnnotationKeys::new(&self.annotation_prefix))
        }
    }
}

/// Why a job could not be rendered. Every variant is permanent: rendering is pure, so trying again
/// gives the same answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// The submission asks for something the pipeline cannot build; `field` is a path into the
    /// SubmitJob such as `parameters.threads` or `resources[2].peer.hostname`.
    #[error("{field}: {message}")]
    Invalid {
        /// A path into the SubmitJob.
        field: String,
        /// What is wrong, for the user.
        message: String,
    },
    /// The submission is well-formed but asks for something this cluster's operator does not offer
    /// (a public IP where no way to attach one is configured); `field` as for `Invalid`.
    #[error("{field}: {message}")]
    NotOffered {
        /// A path into the SubmitJob.
        field: String,
        /// What is not offered and what the user can do, for the user.
        message: String,
    },
    /// The configuration cannot produce a valid object; `key` is a path below `[pipeline]`.
    #[error("configuration pipeline.{key}: {message}")]
    Config {
        /// A path below `[pipeline]`.
        key: String,
        /// What is wrong, for the operator.
        message: String,
    },
}

impl PipelineError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    pub(crate) fn not_offered(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::NotOffered {
            field: field.into(),
            message: message.into(),
        }
    }

    pub(crate) fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Config {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The SubmitJob field (or `pipeline.<key>` for configuration errors) the error is about.
    pub fn field(&self) -> String {
        match self {
            Self::Invalid { field, .. } | Self::NotOffered { field, .. } => field.clone(),
            Self::Config { key, .. } => format!("pipeline.{key}"),
        }
    }

    /// What is wrong, without the field.
    pub fn message(&self) -> &str {
        match self {
            Self::Invalid { message, .. }
            | Self::NotOffered { message, .. }
            | Self::Config { message, .. } => message,
        }
    }

    /// The short code the rejection carries (dead-letter header, FAILURE `reason`): `invalid_field` for the
    /// submission's fault, `not_offered` for something the operator does not offer (a public IP without a
    /// configured way to attach it), `runner_configuration` when the runner's own settings cannot build the object.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid_field",
            Self::NotOffered { .. } => "not_offered",
            Self::Config { .. } => "runner_configuration",
        }
    }

    /// Rendering is pure: retrying never helps. A caller rejects (dead-letters) the message.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Renders one job: every Kubernetes object it needs, in apply order.
///
/// `job` is assumed validated (`validate::submit`), but bad input never panics: it gives a
/// [`PipelineError`] naming the field. `now` is only recorded (the `acceptedAt` annotation); nothing
/// else depends on the clock, so the same input always renders the same objects.
pub fn render<'a>(
    job: &'a SubmitJob,
    settings: impl Into<Settings<'a>>,
    now: jiff::Timestamp,
) -> Result<DesiredJob, PipelineError> {
    let settings = settings.into();
    let cx = context::Context::new(job, settings, now)?;
    let sealed = sealed::check(&cx)?;
    let mut draft = draft::Draft::new(&cx);
    for plugin in REGISTRY {
        if settings.pipeline.plugins.is_on(plugin.id()) {
            plugin.build(&cx, &mut draft)?;
        }
    }
    if let Some(why) = &sealed {
        sealed::seal(&cx, &mut draft, why)?;
    }
    // A public IP is attached or refused, never dropped: with the NetworkIp plugin off nothing attaches it.
    if let Some(first) = cx.network_ips.first()
        && !settings.pipeline.plugins.is_on(PluginId::NetworkIp)
    {
        return Err(plugins::network_ip::not_offered(
            &first.origin.field("networkIp"),
        ));
    }
    Ok(draft.finish(&cx))
}
