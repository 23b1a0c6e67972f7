//! The sub-sections of `[pipeline]`. Each field's doc says why it exists; defaults are in the `Default`
//! impls and in `deploy/config.d/pipeline.toml`.

use std::collections::BTreeMap;

use jiff::SignedDuration;
use serde::Deserialize;

use super::PipelineConfig;
use super::names;
use super::plugins::PluginId;
use crate::volcano::PolicyAction;

/// One switch per plugin. Order is fixed by the registry; only on/off is configurable.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PluginSwitches {
    /// Image, resources, gang and Volcano policies. Cannot be switched off: without it there is no
    /// container to run.
    pub task: bool,
    /// The command line and environment from the application's templates.
    pub parameter: bool,
    /// Input files, folders and the output folder from the storage.
    pub file_mount: bool,
    /// `/etc/ucloud` rank and host files.
    pub multi_node: bool,
    /// A memory-backed `/dev/shm`.
    pub shared_memory: bool,
    /// The time allocation, its enforcement and extensions.
    pub expiry: bool,
    /// Accounting ticks while the job runs.
    pub accounting: bool,
    /// Pod hygiene: restart policy, security context, working directory.
    pub miscellaneous: bool,
    /// Bandwidth annotations.
    pub network_limit: bool,
    /// Per-owner namespaces with their baseline policies, optional per-project queues. Off means every
    /// job goes to `namespace.name`.
    pub fair_share: bool,
    /// A LoadBalancer Service per job, for development clusters without the proxy.
    pub minikube: bool,
    /// The job's NetworkPolicy (same-job and peer traffic) and peer hostnames.
    pub connect_to_job: bool,
    /// Public links: rejects them with more than one replica.
    pub ingress: bool,
    /// Public IPs: rejects them with more than one replica.
    pub network_ip: bool,
    /// Kata runtime class and overhead for configured products.
    pub kata_container: bool,
    /// Proxy events for interactive jobs.
    pub proxy: bool,
}

impl Default for PluginSwitches {
    fn default() -> Self {
        Self {
            task: true,
            parameter: true,
            file_mount: true,
            multi_node: true,
            shared_memory: true,
            expiry: true,
            accounting: true,
            miscellaneous: true,
            network_limit: true,
            fair_share: true,
            minikube: false,
            connect_to_job: true,
            ingress: true,
            network_ip: true,
            kata_container: true,
            proxy: true,
        }
    }
}

impl PluginSwitches {
    /// Whether the plugin runs.
    pub fn is_on(&self, id: PluginId) -> bool {
        match id {
            PluginId::Task => self.task,
            PluginId::Parameter => self.parameter,
            PluginId::FileMount => self.file_mount,
            PluginId::MultiNode => self.multi_node,
            PluginId::SharedMemory => self.shared_memory,
            PluginId::Expiry => self.expiry,
            PluginId::Accounting => self.accounting,
            PluginId::Miscellaneous => self.miscellaneous,
            PluginId::NetworkLimit => self.network_limit,
            PluginId::FairShare => self.fair_share,
            PluginId::Minikube => self.minikube,
            PluginId::ConnectToJob => self.connect_to_job,
            PluginId::Ingress => self.ingress,
            PluginId::NetworkIp => self.network_ip,
            PluginId::KataContainer => self.kata_container,
            PluginId::Proxy => self.proxy,
        }
    }
}

/// How jobs are spread over namespaces.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum NamespaceMode {
    /// One namespace per owner (project, or user without a project), created on demand with its baseline
    /// NetworkPolicies. Volcano's fair share tells owners apart by namespace.
    PerOwner,
    /// Every job in `namespace.name`, as UCloud ran. The operator provides that namespace.
    Single,
}

/// `[pipeline.namespace]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NamespaceConfig {
    /// Per owner (the default, FairShare's design) or one shared namespace.
    pub mode: NamespaceMode,
    /// The shared namespace in `single` mode (and when the FairShare plugin is off).
    pub name: String,
    /// Prefix of per-owner namespaces: `<prefix>u-<user>-<hash>` and `<prefix>p-<project>-<hash>`, and
    /// of per-project queues. Keeps the runner's namespaces recognisable and apart from others.
    pub prefix: String,
}

impl Default for NamespaceConfig {
    fn default() -> Self {
        Self {
            mode: NamespaceMode::PerOwner,
            name: "app-kubernetes".into(),
            prefix: "app-".into(),
        }
    }
}

/// `[pipeline.storage]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// The PVC that holds the whole storage (UCloud: one CephFS claim). It must exist in every namespace
    /// jobs run in.
    pub claim_name: String,
    /// Folder inside the claim that storage paths are relative to (`/prod/` in a shared CephFS).
    pub subfolder: String,
    /// In per-owner mode, declare the claim in every owner namespace from this template (a PVC is
    /// namespaced). None: the operator provides the claim in each namespace.
    pub owner_claim: Option<OwnerClaimConfig>,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            claim_name: "cephfs".into(),
            subfolder: String::new(),
            owner_claim: None,
        }
    }
}

/// `[pipeline.storage.owner_claim]`: the PVC declared in each owner namespace.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OwnerClaimConfig {
    /// The StorageClass that provisions (or binds) the shared storage; none: the cluster default.
    pub storage_class_name: Option<String>,
    /// Requested size (shared file systems usually ignore it, but it is required).
    pub size: String,
    /// Access modes; jobs of one owner mount it from many nodes at once.
    pub access_modes: Vec<String>,
    /// Bind to this pre-provisioned PersistentVolume; `{namespace}` is replaced by the owner namespace.
    pub volume_name: Option<String>,
}

impl Default for OwnerClaimConfig {
    fn default() -> Self {
        Self {
            storage_class_name: None,
            size: "1Ti".into(),
            access_modes: vec!["ReadWriteMany".into()],
            volume_name: None,
        }
    }
}

/// A toleration every job pod gets, e.g. for nodes tainted for user jobs.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TolerationConfig {
    /// The taint's key.
    pub key: String,
    /// `Equal` (with a value) or `Exists`.
    #[serde(default = "default_toleration_operator")]
    pub operator: String,
    /// The taint's value, for `Equal`.
    #[serde(default)]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    #[serde(default = "default_toleration_effect")]
    pub effect: String,
}

fn default_toleration_operator() -> String {
    "Equal".into()
}

fn default_toleration_effect() -> String {
    "NoSchedule".into()
}

/// What Volcano does when a pod fails or is evicted, or `none` for Volcano's default (the job keeps
/// running until every pod has ended).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum PolicyChoice {
    /// The whole job ends (phase Terminated); nothing restarts.
    TerminateJob,
    /// Every pod is killed and started again; counts against `max_retry`.
    RestartJob,
    /// The job is stopped and can be resumed.
    AbortJob,
    /// Unfinished pods are killed and the job is Completed.
    CompleteJob,
    /// No policy for this event.
    #[serde(rename = "none")]
    Nothing,
}

impl PolicyChoice {
    /// The Volcano action, or `None` for no policy.
    pub fn action(self) -> Option<PolicyAction> {
        match self {
            Self::TerminateJob => Some(PolicyAction::TerminateJob),
            Self::RestartJob => Some(PolicyAction::RestartJob),
            Self::AbortJob => Some(PolicyAction::AbortJob),
            Self::CompleteJob => Some(PolicyAction::CompleteJob),
            Self::Nothing => None,
        }
    }
}

/// `[pipeline.scheduling]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulingConfig {
    /// The scheduler that gang-schedules the pods.
    pub scheduler_name: String,
    /// The Volcano queue every job goes to (unless `queue_per_project` picks another). Must exist and be
    /// Open.
    pub queue: String,
    /// A Volcano queue per project (`<namespace.prefix>p-<project>-<hash>`), declared with the job, so
    /// that Volcano shares the cluster fairly between projects.
    pub queue_per_project: bool,
    /// Weight of each per-project queue.
    pub project_queue_weight: i32,
    /// Attempts in total (the first run included) before a job that keeps being evicted goes Failed.
    /// Must be at least 1: Volcano's admission webhook silently turns 0 into 3.
    pub max_retry: i32,
    /// What happens when a pod exits non-zero: by default the whole job ends, so a multi-node job never
    /// waits forever for a dead rank.
    pub on_pod_failed: PolicyChoice,
    /// What happens when a pod is evicted (node loss, drain): by default the job restarts, bounded by
    /// `max_retry`.
    pub on_pod_evicted: PolicyChoice,
    /// Optional PriorityClass of every job.
    pub priority_class_name: Option<String>,
    /// Written on every job as Volcano's `sla-waiting-time` annotation: once a job has waited this long,
    /// the scheduler's `sla` plugin (which must be enabled) enqueues it, tries it before the others and
    /// keeps the resources it could place its ranks on, so later jobs stop passing it
    /// (docs/estimates.md). Every rank then also tolerates its own job's node reservation
    /// (`[monitor] reserve_nodes`). Unset: neither is written.
    pub sla_waiting_time: Option<SignedDuration>,
    /// The Volcano queue interactive jobs (web, VNC and terminal applications) go to instead of the
    /// others' (and of their project's): a `fifo` one, first come first served, so that with their own
    /// waiting time each is told a start it can count on (docs/estimates.md, *Interactive jobs: a
    /// promise by design*). Declared with the job when missing (FairShare), as deploy/scheduling
    /// declares it. Default `volcano-runner-interactive`; `""` (unset): they go where the others go.
    #[serde(deserialize_with = "empty_is_none")]
    pub interactive_queue: Option<String>,
    /// The `sla-waiting-time` of interactive jobs, in place of `sla_waiting_time` (default `0s`: the
    /// `sla` plugin, which deploy/scheduling's scheduler configuration runs, tries them before every
    /// job without a waiting time from their creation on). `""` (unset): `sla_waiting_time`.
    #[serde(deserialize_with = "empty_duration_is_none")]
    pub interactive_sla_waiting_time: Option<SignedDuration>,
    /// Tolerations every job pod gets (UCloud: `sducloud=apps:NoSchedule`).
    pub tolerations: Vec<TolerationConfig>,
    /// Node label that selects nodes by product category (UCloud: `ucloud.dk/machine`); none means no
    /// node selector.
    pub node_selector_label: Option<String>,
    /// Label value per product category; a category without an entry uses its own name.
    pub node_selector_by_category: BTreeMap<String, String>,
}

/// The interactive queue of the defaults: deploy/scheduling declares it (`fifo`), and the runner
/// declares it with an interactive job when it is missing.
pub const DEFAULT_INTERACTIVE_QUEUE: &str = "volcano-runner-interactive";

/// `""` switches a key with a default off: TOML has no null, and an environment variable
/// (`VOLCANO_RUNNER_PIPELINE__SCHEDULING__INTERACTIVE_QUEUE=`) can say no less than empty.
fn empty_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.filter(|s| !s.is_empty()))
}

/// [`empty_is_none`] for a duration (`"0s"`, `"1m"`, ISO 8601).
fn empty_duration_is_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SignedDuration>, D::Error> {
    match Option::<String>::deserialize(d)?.as_deref() {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self {
            scheduler_name: "volcano".into(),
            queue: "default".into(),
            queue_per_project: false,
            project_queue_weight: 1,
            max_retry: 3,
            on_pod_failed: PolicyChoice::TerminateJob,
            on_pod_evicted: PolicyChoice::RestartJob,
            priority_class_name: None,
            sla_waiting_time: None,
            interactive_queue: Some(DEFAULT_INTERACTIVE_QUEUE.into()),
            interactive_sla_waiting_time: Some(SignedDuration::ZERO),
            tolerations: Vec::new(),
            node_selector_label: None,
            node_selector_by_category: BTreeMap::new(),
        }
    }
}

/// `[pipeline.multi_node]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct MultiNodeConfig {
    /// The image of the init container that writes `/etc/ucloud/rank.txt`: any image with a POSIX
    /// `/bin/sh` and `cp`. Pinned by tag or digest (`latest` is refused) so every job runs the same.
    pub init_image: String,
    /// CPU request and limit of the init container.
    pub init_cpu: String,
    /// Memory request and limit of the init container.
    pub init_memory: String,
    /// The uid the init container runs as (non-root).
    pub init_run_as_user: i64,
}

impl Default for MultiNodeConfig {
    fn default() -> Self {
        Self {
            init_image: "docker.io/library/busybox:1.36.1".into(),
            init_cpu: "50m".into(),
            init_memory: "16Mi".into(),
            init_run_as_user: 65534,
        }
    }
}

/// `[pipeline.network_limit]`. Values are Kubernetes quantities in bits per second; they need a CNI with
/// the bandwidth plugin. No cap unless configured: a default cap throttles the traffic between the ranks
/// of an MPI job, which is what a multi-node job is for (UCloud never capped either).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkLimitConfig {
    /// `kubernetes.io/ingress-bandwidth` of every job pod whose product has no entry in `products`;
    /// none means unlimited.
    pub ingress_bandwidth: Option<String>,
    /// `kubernetes.io/egress-bandwidth` of every job pod whose product has no entry in `products`;
    /// none means unlimited.
    pub egress_bandwidth: Option<String>,
    /// Caps by product id or category (an id's entry wins over its category's). An entry replaces the
    /// global caps for that product: a direction it leaves out is unlimited, so an empty entry exempts
    /// the product from a global cap.
    pub products: BTreeMap<String, BandwidthCaps>,
}

/// One entry of `[pipeline.network_limit.products]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct BandwidthCaps {
    /// `kubernetes.io/ingress-bandwidth`; none means unlimited.
    pub ingress_bandwidth: Option<String>,
    /// `kubernetes.io/egress-bandwidth`; none means unlimited.
    pub egress_bandwidth: Option<String>,
}

impl NetworkLimitConfig {
    /// The caps of a job of product `id` in `category`: the id's entry, else the category's, else the
    /// global caps.
    pub fn caps_for(&self, id: &str, category: &str) -> BandwidthCaps {
        self.products
            .get(id)
            .or_else(|| self.products.get(category))
            .cloned()
            .unwrap_or_else(|| BandwidthCaps {
                ingress_bandwidth: self.ingress_bandwidth.clone(),
                egress_bandwidth: self.egress_bandwidth.clone(),
            })
    }

    /// Every configured value with its key, for validation.
    fn values(&self) -> Vec<(String, &String)> {
        let global = std::iter::once((
            String::new(),
            self.ingress_bandwidth.as_ref(),
            self.egress_bandwidth.as_ref(),
        ));
        let products = self.products.iter().map(|(product, caps)| {
            (
                format!("products.{product}."),
                caps.ingress_bandwidth.as_ref(),
                caps.egress_bandwidth.as_ref(),
            )
        });
        let mut out = Vec::new();
        for (prefix, ingress, egress) in global.chain(products) {
            for (name, value) in [("ingress_bandwidth", ingress), ("egress_bandwidth", egress)] {
                if let Some(value) = value {
                    out.push((format!("network_limit.{prefix}{name}"), value));
                }
            }
        }
        out
    }
}

/// `[pipeline.network_policy]`: the baseline every job pod gets (per-owner namespaces declare it as
/// namespace-wide policies; in single mode it is part of each job's own policy).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkPolicyConfig {
    /// The namespace the proxy pods run in; the only source of ingress besides the job itself and its
    /// peers.
    pub proxy_namespace: String,
    /// Labels of the proxy pods.
    pub proxy_pod_labels: BTreeMap<String, String>,
    /// Allow DNS (port 53, TCP and UDP) to anywhere, so names resolve even though the cluster DNS lives
    /// in a private range.
    pub allow_dns: bool,
    /// Egress to the internet: these CIDRs...
    pub egress_cidrs: Vec<String>,
    /// ...except these (private ranges, so jobs cannot reach cluster-internal services).
    pub egress_except: Vec<String>,
    /// Internal CIDRs jobs may reach anyway (license servers, mirrors).
    pub extra_egress_cidrs: Vec<String>,
}

impl Default for NetworkPolicyConfig {
    fn default() -> Self {
        Self {
            proxy_namespace: "volcano-runner".into(),
            proxy_pod_labels: BTreeMap::from([("app".into(), "volcano-runner-proxy".into())]),
            allow_dns: true,
            egress_cidrs: vec!["0.0.0.0/0".into()],
            egress_except: vec![
                "10.0.0.0/8".into(),
                "172.16.0.0/12".into(),
                "192.168.0.0/16".into(),
            ],
            extra_egress_cidrs: Vec::new(),
        }
    }
}

/// `[pipeline.kata]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct KataConfig {
    /// The RuntimeClass that selects Kata Containers (not the legacy untrusted-workload annotation).
    pub runtime_class_name: String,
    /// Product ids or categories that run in Kata. Empty means no job does.
    pub products: Vec<String>,
    /// CPU the VM itself needs, taken off the container's share (UCloud: one vCPU).
    pub cpu_overhead_millis: u64,
    /// Memory the VM boots with, taken off the container's share (UCloud: 6 GiB).
    pub memory_overhead_mib: u64,
    /// Never give the container less CPU than this.
    pub min_cpu_millis: u64,
    /// Never give the container less memory than this.
    pub min_memory_mib: u64,
}

impl Default for KataConfig {
    fn default() -> Self {
        Self {
            runtime_class_name: "kata".into(),
            products: Vec::new(),
            cpu_overhead_millis: 1000,
            memory_overhead_mib: 6 * 1024,
            min_cpu_millis: 1000,
            min_memory_mib: 1024,
        }
    }
}

/// `[pipeline.expiry]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ExpiryConfig {
    /// Tell the user this long before the job expires (a status event per threshold). The monitor
    /// publishes them; an extension moves every one.
    pub warn_before: Vec<SignedDuration>,
    /// Remember at most this many applied extension request ids per job (oldest dropped first).
    pub max_remembered_extensions: usize,
}

impl Default for ExpiryConfig {
    fn default() -> Self {
        Self {
            warn_before: vec![SignedDuration::from_mins(15), SignedDuration::from_mins(5)],
            max_remembered_extensions: 256,
        }
    }
}

/// `[pipeline.accounting]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AccountingConfig {
    /// Length of one accounting tick. Persisted on each job at creation, so a change only affects new
    /// jobs and ticks of a running job never overlap.
    pub period: SignedDuration,
    /// How long after a tick's end the monitor waits before charging it. A kubelet reports a container's
    /// end a moment late, so a job that ended just before a boundary still looks running just after it;
    /// charging at the boundary itself would charge past the real end. After this delay the cluster's
    /// view has passed the boundary, and the tick is decided from the containers' real start and end.
    pub settle: SignedDuration,
    /// Report the run time of an attempt that a lost node or an eviction ended (Volcano restarted the
    /// job) as refundable: a refund event `<jobId>/refund/<attempt>` with `refundableMs`. The ticks
    /// charge that time like any other; the orchestrator decides whether to give it back.
    pub refund_lost_attempts: bool,
}

impl Default for AccountingConfig {
    fn default() -> Self {
        Self {
            period: SignedDuration::from_secs(60),
            settle: SignedDuration::from_secs(10),
            refund_lost_attempts: true,
        }
    }
}

/// `[pipeline.whole_nodes]`: what a rank that holds a whole node (`exclusiveNodes`) is charged, and how
/// many whole nodes one owner may hold at once.
///
/// A whole-node rank keeps every other job's pod off its node while it runs, so it must be charged for
/// the node, not for the product it is placed by. The charge is the operator's: the pipeline is pure and
/// does not see the nodes, and a charge fixed at create (persisted on the job) makes every tick of the
/// job, published by whichever runner, the same message. A product with no entry is refused whole nodes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct WholeNodesConfig {
    /// Whole nodes one owner (the project, else the user) may hold at once, every product together: the
    /// ranks of its whole-node jobs that have not ended, waiting ones included. `None`: no such limit.
    pub max_per_owner: Option<u32>,
    /// By the id or the category of the product a submission asks for (an id entry wins): what one whole
    /// node is charged, and the limit per owner for it.
    pub products: BTreeMap<String, WholeNodeProduct>,
}

/// One entry of `[pipeline.whole_nodes.products]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WholeNodeProduct {
    /// The product id the ticks carry for one whole node (a product the orchestrator prices).
    pub product: String,
    /// vCPUs charged per whole node (per rank).
    pub cpu: u32,
    /// Memory charged per whole node, GiB.
    pub memory_gib: u32,
    /// GPUs charged per whole node.
    #[serde(default)]
    pub gpu: u32,
    /// Whole nodes charged as `product` one owner may hold at once. `None`: only `max_per_owner`.
    #[serde(default)]
    pub max_per_owner: Option<u32>,
}

/// What one whole node is charged, as persisted on a whole-node job (annotation `wholeNodeCharge`, JSON)
/// and carried by its ticks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WholeNodeCharge {
    /// The product id charged.
    pub product: String,
    /// vCPUs per rank.
    pub cpu: u32,
    /// GiB of memory per rank.
    pub memory_gib: u32,
    /// GPUs per rank.
    pub gpu: u32,
}

impl WholeNodeProduct {
    /// The charge of one whole node of this entry.
    pub fn charge(&self) -> WholeNodeCharge {
        WholeNodeCharge {
            product: self.product.clone(),
            cpu: self.cpu,
            memory_gib: self.memory_gib,
            gpu: self.gpu,
        }
    }
}

impl WholeNodesConfig {
    /// The entry for a product: by its id, else by its category; `None`: no whole nodes for it.
    pub fn entry(&self, product_id: &str, category: &str) -> Option<&WholeNodeProduct> {
        self.products
            .get(product_id)
            .or_else(|| self.products.get(category))
    }
}

/// `[pipeline.proxy]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Domain under which ranks are published: `<prefix><jobId>-<rank>.<domain>`.
    pub domain: String,
    /// Host prefix of published ranks.
    pub prefix: String,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            domain: "cloud.sdu.dk".into(),
            prefix: "app-".into(),
        }
    }
}

impl ProxyConfig {
    /// The host a rank is published under when the job has no public link, e.g. `app-42-0.cloud.sdu.dk`.
    pub fn rank_host(&self, job_id: &str, rank: u32) -> String {
        format!("{}{job_id}-{rank}.{}", self.prefix, self.domain)
    }
}

impl PipelineConfig {
    /// Checks what serde cannot: values Kubernetes or Volcano would reject or silently change. Called
    /// once at start, so a bad configuration stops the process instead of failing every job. The first
    /// bad value is the error, section by section.
    pub fn validate(&self) -> Result<(), PipelineConfigError> {
        self.check_names()?;
        self.check_storage()?;
        self.check_scheduling()?;
        self.check_multi_node()?;
        self.check_network()?;
        if !names::is_dns1123_subdomain(&self.kata.runtime_class_name) {
            return Err(invalid(
                "kata.runtime_class_name",
                "must be a RuntimeClass name".into(),
            ));
        }
        if self.accounting.period < SignedDuration::from_secs(1) {
            return Err(invalid(
                "accounting.period",
                "must be at least one second".into(),
            ));
        }
        self.check_whole_nodes()?;
        if let Some(bad) = self
            .expiry
            .warn_before
            .iter()
            .find(|d| d.is_negative() || d.is_zero())
        {
            return Err(invalid(
                "expiry.warn_before",
                format!("{bad} is not a positive duration"),
            ));
        }
        if let Err((key, reason)) = self.public_ip.validate() {
            return Err(invalid(key, reason.into()));
        }
        if let Err((key, reason)) = self.sealed.validate() {
            return Err(invalid(key, reason.into()));
        }
        Ok(())
    }

    /// The Task plugin, the annotation prefix, the cluster domain and the namespaces: names Kubernetes
    /// must accept.
    fn check_names(&self) -> Result<(), PipelineConfigError> {
        if !self.plugins.task {
            return Err(invalid(
                "plugins.task",
                "the Task plugin builds the container and cannot be switched off".into(),
            ));
        }
        let prefix = self.annotation_prefix.strip_suffix('/').ok_or_else(|| {
            invalid(
                "annotation_prefix",
                "must end with '/', like `ucloud.dk/`".into(),
            )
        })?;
        if !names::is_dns1123_subdomain(prefix) {
            return Err(invalid(
                "annotation_prefix",
                format!("`{prefix}` is not a DNS subdomain"),
            ));
        }
        if !names::is_dns1123_subdomain(&self.cluster_domain) {
            return Err(invalid("cluster_domain", "must be a DNS subdomain".into()));
        }
        if !names::is_dns1123_label(&self.namespace.name) {
            return Err(invalid("namespace.name", "must be a DNS-1123 label".into()));
        }
        let p = &self.namespace.prefix;
        if p.len() > 20 || !(p.is_empty() || names::is_dns1123_label(p.trim_end_matches('-'))) {
            return Err(invalid(
                "namespace.prefix",
                "must be at most 20 lowercase letters, digits and '-', starting with a letter or digit"
                    .into(),
            ));
        }
        Ok(())
    }

    /// `[pipeline.storage]`: the claim's name, the owner claim's size and access modes, the subfolder.
    fn check_storage(&self) -> Result<(), PipelineConfigError> {
        if self.storage.claim_name.is_empty()
            || !names::is_dns1123_subdomain(&self.storage.claim_name)
        {
            return Err(invalid("storage.claim_name", "must be a PVC name".into()));
        }
        if let Some(claim) = &self.storage.owner_claim {
            if !names::is_quantity(&claim.size) {
                return Err(invalid(
                    "storage.owner_claim.size",
                    format!("`{}` is not a quantity", claim.size),
                ));
            }
            const MODES: [&str; 4] = [
                "ReadWriteOnce",
                "ReadOnlyMany",
                "ReadWriteMany",
                "ReadWriteOncePod",
            ];
            if claim.access_modes.is_empty()
                || claim
                    .access_modes
                    .iter()
                    .any(|m| !MODES.contains(&m.as_str()))
            {
                return Err(invalid(
                    "storage.owner_claim.access_modes",
                    format!("must be some of {MODES:?}"),
                ));
            }
        }
        if self.storage.subfolder.split('/').any(|c| c == "..") {
            return Err(invalid("storage.subfolder", "must not contain `..`".into()));
        }
        Ok(())
    }

    /// `[pipeline.scheduling]`: what Volcano would reject or silently change.
    fn check_scheduling(&self) -> Result<(), PipelineConfigError> {
        let s = &self.scheduling;
        if s.max_retry < 1 {
            return Err(invalid(
                "scheduling.max_retry",
                format!(
                    "{} is not allowed: Volcano turns 0 into 3; use 1 for a single attempt",
                    s.max_retry
                ),
            ));
        }
        if s.sla_waiting_time.is_some_and(|d| d.is_negative()) {
            return Err(invalid(
                "scheduling.sla_waiting_time",
                "must not be negative: it is how long a job waits before Volcano reserves for it"
                    .into(),
            ));
        }
        if s.interactive_sla_waiting_time
            .is_some_and(|d| d.is_negative())
        {
            return Err(invalid(
                "scheduling.interactive_sla_waiting_time",
                "must not be negative: it is how long an interactive job waits before Volcano \
                 reserves for it"
                    .into(),
            ));
        }
        if s.interactive_queue
            .as_deref()
            .is_some_and(|q| !names::is_dns1123_subdomain(q))
        {
            return Err(invalid(
                "scheduling.interactive_queue",
                "must be a DNS subdomain".into(),
            ));
        }
        if s.scheduler_name.is_empty() || s.scheduler_name.len() > 63 {
            return Err(invalid(
                "scheduling.scheduler_name",
                "must be 1 to 63 characters".into(),
            ));
        }
        if !names::is_dns1123_subdomain(&s.queue) {
            return Err(invalid(
                "scheduling.queue",
                "must be a DNS subdomain".into(),
            ));
        }
        if s.project_queue_weight < 1 {
            return Err(invalid(
                "scheduling.project_queue_weight",
                "must be at least 1".into(),
            ));
        }
        if let Some(label) = &s.node_selector_label
            && !names::is_qualified_name(label)
        {
            return Err(invalid(
                "scheduling.node_selector_label",
                "must be a label key".into(),
            ));
        }
        for (category, value) in &s.node_selector_by_category {
            if !names::is_label_value(value) {
                return Err(invalid(
                    &format!("scheduling.node_selector_by_category.{category}"),
                    "must be a label value".into(),
                ));
            }
        }
        Ok(())
    }

    /// `[pipeline.multi_node]`: a pinned init image and quantities.
    fn check_multi_node(&self) -> Result<(), PipelineConfigError> {
        let m = &self.multi_node;
        let reference = m.init_image.rsplit('/').next().unwrap_or_default();
        if !(m.init_image.contains('@') || reference.contains(':'))
            || reference.ends_with(":latest")
        {
            return Err(invalid(
                "multi_node.init_image",
                "must be pinned by a tag other than `latest` or by a digest".into(),
            ));
        }
        for (key, value) in [
            ("multi_node.init_cpu", &m.init_cpu),
            ("multi_node.init_memory", &m.init_memory),
        ] {
            if !names::is_quantity(value) {
                return Err(invalid(
                    key,
                    format!("`{value}` is not a Kubernetes quantity"),
                ));
            }
        }
        Ok(())
    }

    /// `[pipeline.network_limit]` and `[pipeline.network_policy]`: quantities, CIDRs, the proxy's namespace.
    fn check_network(&self) -> Result<(), PipelineConfigError> {
        for (key, value) in self.network_limit.values() {
            if !names::is_quantity(value) {
                return Err(invalid(
                    &key,
                    format!("`{value}` is not a Kubernetes quantity"),
                ));
            }
        }
        let n = &self.network_policy;
        for (key, list) in [
            ("network_policy.egress_cidrs", &n.egress_cidrs),
            ("network_policy.egress_except", &n.egress_except),
            ("network_policy.extra_egress_cidrs", &n.extra_egress_cidrs),
        ] {
            if let Some(bad) = list.iter().find(|c| !names::is_cidr(c)) {
                return Err(invalid(key, format!("`{bad}` is not a CIDR")));
            }
        }
        if !names::is_dns1123_label(&n.proxy_namespace) {
            return Err(invalid(
                "network_policy.proxy_namespace",
                "must be a namespace name".into(),
            ));
        }
        Ok(())
    }

    /// `[pipeline.whole_nodes]`: limits of at least one, and each product entry.
    fn check_whole_nodes(&self) -> Result<(), PipelineConfigError> {
        let w = &self.whole_nodes;
        if w.max_per_owner == Some(0) {
            return Err(invalid(
                "whole_nodes.max_per_owner",
                "must be at least 1 (to offer no whole nodes, list no products)".into(),
            ));
        }
        for (key, entry) in &w.products {
            let at = |field: &str| format!("whole_nodes.products.{key}.{field}");
            if entry.product.trim().is_empty() || entry.product.len() > 255 {
                return Err(invalid(
                    &at("product"),
                    "must be a product id of 1 to 255 characters".into(),
                ));
            }
            if entry.cpu == 0 {
                return Err(invalid(
                    &at("cpu"),
                    "must be at least 1: a whole node has CPUs".into(),
                ));
            }
            if entry.max_per_owner == Some(0) {
                return Err(invalid(
                    &at("max_per_owner"),
                    "must be at least 1 (to offer no whole nodes of it, remove the entry)".into(),
                ));
            }
        }
        Ok(())
    }
}

/// A `[pipeline]` error at `key` (under `pipeline.`).
fn invalid(key: &str, reason: String) -> PipelineConfigError {
    PipelineConfigError {
        key: format!("pipeline.{key}"),
        reason,
    }
}

/// A `[pipeline]` setting that cannot work: the key (e.g. `pipeline.annotation_prefix`) and what is wrong. This
/// section's own error, so the section does not depend on the configuration module that composes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration {key}: {reason}")]
pub struct PipelineConfigError {
    pub key: String,
    pub reason: String,
}
/// Where a license server lives. The argument a program receives is `address:port/license`, or
/// `address:port` without a key.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LicenseServer {
    pub address: String,
    pub port: u16,
    /// The license key, a secret: never logged.
    #[serde(default)]
    pub license: Option<crate::secret::Secret>,
}
