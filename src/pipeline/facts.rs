//! What the lifecycle hooks read and return, apart from running them: the facts a job's VolcanoJob
//! records ([`JobFacts`]), what one hook sees ([`HookContext`]) and asks for ([`HookActions`]), and why
//! it could not decide ([`HookError`]). The plugins implement their hooks against these types alone, and
//! [`super::hooks`] runs the plugins over them; [`super::hooks`] re-exports them, so that paths through
//! it stay as they were.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;

use super::PipelineConfig;
use super::names;
use crate::durable::annotations::{AnnotationKeys, parse_millis};
use crate::messages::v1::{AccountingTick, JobEvent, ProxyEvent};
use crate::volcano::VolcanoJob;

/// Why a job was deleted, persisted as `terminationCause` before the delete so whoever sees the deletion
/// reports the right state (W11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminationCause {
    /// The time allocation ran out.
    Expired,
    /// The orchestrator cancelled the job.
    Cancelled,
    /// Anything else, e.g. `insufficient_funds`, `node_drain`.
    Other(String),
}

impl TerminationCause {
    /// The annotation value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
            Self::Other(other) => other,
        }
    }

    /// From the annotation value; unknown causes are kept as `Other`.
    pub fn parse(value: &str) -> Self {
        match value {
            "expired" => Self::Expired,
            "cancelled" => Self::Cancelled,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// A message to publish.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    /// To the events exchange, key `job.lifecycle`.
    Lifecycle(JobEvent),
    /// To the events exchange, key `job.accounting`.
    Accounting(AccountingTick),
    /// To the proxy fanout exchange.
    Proxy(ProxyEvent),
}

/// A job annotation that is missing or unreadable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("VolcanoJob {job}: annotation {key}: {reason}")]
pub struct FactsError {
    /// The VolcanoJob's name.
    pub job: String,
    /// The annotation (or field) at fault.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Why one plugin's hook could not decide. Isolated to that plugin and job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// The job's annotations are unreadable.
    #[error("{0}")]
    Facts(#[from] FactsError),
    /// The persisted values cannot be used (e.g. out of range).
    #[error("{0}")]
    Invalid(String),
    /// Two plugins disagree about an annotation.
    #[error("annotation {key} set to two different values by two plugins")]
    Conflict {
        /// The annotation.
        key: String,
    },
}

/// The owner of a job, as persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerFacts {
    /// Who launched the job.
    pub user: String,
    /// The project charged, if any.
    pub project: Option<String>,
}

/// The product of a job, as persisted (per replica).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductFacts {
    /// Product id, as charged.
    pub id: String,
    /// Product category.
    pub category: String,
    /// vCPUs per replica.
    pub cpu: u32,
    /// Memory per replica, GiB.
    pub memory_gib: u32,
    /// GPUs per replica.
    pub gpu: u32,
}

/// The last expiry warning sent: for which expiry, and how long before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpiryWarned {
    /// The expiry the warning was for (an extension starts warnings over).
    pub expiry: Timestamp,
    /// How long before that expiry.
    pub before: SignedDuration,
}

/// What the proxy needs to know about an interactive job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyFacts {
    /// The port of the web or VNC server in every rank; 0 for a terminal-only job (bridges only).
    pub port: u32,
    /// Public links bound to the job.
    pub domains: Vec<String>,
    /// Generation of the last published targets, if any were published.
    pub generation: Option<String>,
    /// The `sequence` of the last published CREATE or UPDATE; 0 before the first. A job whose targets
    /// were published by a runner that predates the sequence (a generation, no sequence) counts as 1.
    pub sequence: u64,
}

/// Everything durable about a job, read from its VolcanoJob's annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFacts {
    /// The job id (`j-<jobId>` without `j-`).
    pub job_id: String,
    /// The VolcanoJob's name.
    pub name: String,
    /// The VolcanoJob's namespace.
    pub namespace: String,
    /// The version the facts were read from; patches are guarded by it.
    pub resource_version: Option<String>,
    /// Who to charge.
    pub owner: OwnerFacts,
    /// What to charge for.
    pub product: ProductFacts,
    /// Number of ranks.
    pub replicas: u32,
    /// Each rank holds a whole node (`exclusiveNodes`).
    pub exclusive_nodes: bool,
    /// What one whole node is charged, for a whole-node job created with a `[pipeline.whole_nodes]`
    /// charge; its ticks carry this instead of the product.
    pub whole_node: Option<crate::pipeline::WholeNodeCharge>,
    /// The time allocation; `None`: the job never expires.
    pub max_time: Option<SignedDuration>,
    /// When the job first ran, once known.
    pub start: Option<Timestamp>,
    /// `start + max_time` (plus extensions), once started.
    pub expiry: Option<Timestamp>,
    /// Request ids of the extensions already applied, oldest first.
    pub extensions: Vec<String>,
    /// The last expiry warning sent.
    pub expiry_warned: Option<ExpiryWarned>,
    /// Tick length of this job.
    pub accounting_period: SignedDuration,
    /// Ticks published so far (the next tick's index).
    pub accounted_ticks: u64,
    /// Whether the final tick was published.
    pub accounting_final: bool,
    /// Routing facts, for interactive jobs.
    pub proxy: Option<ProxyFacts>,
    /// Why the job was deleted, when it was by volcano-runner.
    pub termination_cause: Option<TerminationCause>,
}

impl JobFacts {
    /// Reads the facts. Fails, naming the annotation, when a required one is missing or one is
    /// malformed: that job is skipped and reported, the others go on.
    pub fn read(
        vcjob: &VolcanoJob,
        keys: &AnnotationKeys,
        config: &(impl AsRef<PipelineConfig> + ?Sized),
    ) -> Result<Self, FactsError> {
        let name = vcjob.metadata.name.clone().unwrap_or_default();
        let job_id = names::job_id_from_vcjob_name(&name)
            .ok_or_else(|| FactsError {
                job: name.clone(),
                key: "metadata.name".into(),
                reason: "is not `j-<jobId>`".into(),
            })?
            .to_owned();
        let empty = BTreeMap::new();
        let a = Annotations {
            job: &name,
            map: vcjob.metadata.annotations.as_ref().unwrap_or(&empty),
        };
        let extensions = match a.get(&keys.extensions) {
            Some(v) => serde_json::from_str::<Vec<String>>(v)
                .map_err(|_| a.err(&keys.extensions, "is not a JSON array of strings"))?,
            None => Vec::new(),
        };
        let expiry_warned = a.expiry_warned(&keys.expiry_warned)?;
        let proxy = a.proxy(keys)?;
        let replicas = match a.number(&keys.replicas)? {
            Some(r) => u32::try_from(r).map_err(|_| a.err(&keys.replicas, "is too large"))?,
            None => vcjob
                .spec
                .tasks
                .first()
                .map(|t| t.replicas.max(1) as u32)
                .unwrap_or(1),
        };
        let whole_node = a
            .get(&keys.whole_node_charge)
            .map(|v| {
                serde_json::from_str(v).map_err(|_| {
                    a.err(
                        &keys.whole_node_charge,
                        "is not a JSON {product, cpu, memoryGib, gpu}",
                    )
                })
            })
            .transpose()?;
        let accounting_period = a
            .millis(&keys.accounting_period)?
            .filter(|p| p.is_positive())
            .unwrap_or(config.as_ref().accounting.period);

        Ok(Self {
            job_id,
            namespace: vcjob.metadata.namespace.clone().unwrap_or_default(),
            resource_version: vcjob.metadata.resource_version.clone(),
            owner: OwnerFacts {
                user: a.required(&keys.owner_user)?.to_owned(),
                project: a.get(&keys.owner_project).map(str::to_owned),
            },
            product: ProductFacts {
                id: a.required(&keys.product_id)?.to_owned(),
                category: a.get(&keys.product_category).unwrap_or_default().to_owned(),
                cpu: a.small(&keys.product_cpu)?,
                memory_gib: a.small(&keys.product_memory_gib)?,
                gpu: a.small(&keys.product_gpu)?,
            },
            replicas,
            exclusive_nodes: a.get(&keys.exclusive_nodes) == Some("true"),
            whole_node,
            max_time: a.millis(&keys.max_time)?,
            start: a.time(&keys.job_start)?,
            expiry: a.time(&keys.expiry)?,
            extensions,
            expiry_warned,
            accounting_period,
            accounted_ticks: a.number(&keys.accounted_ticks)?.unwrap_or(0),
            accounting_final: a.get(&keys.accounting_final) == Some("true"),
            proxy,
            termination_cause: a.get(&keys.termination_cause).map(TerminationCause::parse),
            name,
        })
    }
}

/// What a hook sees.
#[derive(Debug, Clone, Copy)]
pub struct HookContext<'a> {
    /// The job's persisted facts.
    pub facts: &'a JobFacts,
    /// The VolcanoJob as observed.
    pub vcjob: &'a VolcanoJob,
    /// The job's pods, as listed by `volcano.sh/job-name=j-<jobId>`.
    pub pods: &'a [Pod],
    /// The `[pipeline]` section.
    pub pipeline: &'a PipelineConfig,
    /// The annotation keys.
    pub keys: &'a AnnotationKeys,
    /// The instant of the decision.
    pub now: Timestamp,
    /// The job's real end, in [`super::hooks::on_completion`] only.
    pub ended_at: Option<Timestamp>,
}

/// What one plugin's hook asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookActions {
    /// Annotations to set.
    pub set: BTreeMap<String, String>,
    /// Annotations to remove.
    pub remove: BTreeSet<String>,
    /// Messages to publish, in order.
    pub publish: Vec<Outbound>,
    /// End the VolcanoJob (Volcano's `TerminateJob` command), for this reason.
    pub delete: Option<TerminationCause>,
    /// Call [`super::hooks::on_monitoring`] again at this instant at the latest (the earliest of all plugins wins).
    pub next_check: Option<Timestamp>,
}

impl HookActions {
    /// Asks for a monitoring call no later than `at`.
    pub fn check_at(&mut self, at: Timestamp) {
        self.next_check = Some(self.next_check.map_or(at, |t| t.min(at)));
    }
}

/// A job's annotations as [`JobFacts::read`] parses them: a value's problem is an error naming the job
/// and the key.
struct Annotations<'a> {
    job: &'a str,
    map: &'a BTreeMap<String, String>,
}

impl<'a> Annotations<'a> {
    fn err(&self, key: &str, reason: &str) -> FactsError {
        FactsError {
            job: self.job.to_owned(),
            key: key.to_owned(),
            reason: reason.to_owned(),
        }
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.map.get(key).map(String::as_str)
    }

    fn required(&self, key: &str) -> Result<&'a str, FactsError> {
        self.get(key).ok_or_else(|| self.err(key, "is missing"))
    }

    fn number(&self, key: &str) -> Result<Option<u64>, FactsError> {
        self.get(key)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| self.err(key, "is not a whole number"))
            })
            .transpose()
    }

    fn small(&self, key: &str) -> Result<u32, FactsError> {
        self.number(key)?
            .map(|v| u32::try_from(v).map_err(|_| self.err(key, "is too large")))
            .transpose()
            .map(Option::unwrap_or_default)
    }

    fn time(&self, key: &str) -> Result<Option<Timestamp>, FactsError> {
        self.get(key)
            .map(|v| parse_millis(v).ok_or_else(|| self.err(key, "is not epoch milliseconds")))
            .transpose()
    }

    fn millis(&self, key: &str) -> Result<Option<SignedDuration>, FactsError> {
        self.number(key)?
            .map(|v| {
                i64::try_from(v)
                    .map(SignedDuration::from_millis)
                    .map_err(|_| self.err(key, "is too large"))
            })
            .transpose()
    }

    /// The expiry warning already given: `<expiry ms>/<seconds before>`.
    fn expiry_warned(&self, key: &str) -> Result<Option<ExpiryWarned>, FactsError> {
        self.get(key)
            .map(|v| {
                let (expiry, before) = v
                    .split_once('/')
                    .ok_or_else(|| self.err(key, "is not `<ms>/<s>`"))?;
                let expiry =
                    parse_millis(expiry).ok_or_else(|| self.err(key, "is not `<ms>/<s>`"))?;
                let before: i64 = before
                    .parse()
                    .map_err(|_| self.err(key, "is not `<ms>/<s>`"))?;
                Ok(ExpiryWarned {
                    expiry,
                    before: SignedDuration::from_secs(before),
                })
            })
            .transpose()
    }

    /// What the Proxy plugin published: its port, domains and the generation and sequence of the last
    /// proxy event.
    fn proxy(&self, keys: &AnnotationKeys) -> Result<Option<ProxyFacts>, FactsError> {
        let Some(port) = self.number(&keys.proxy_port)? else {
            return Ok(None);
        };
        Ok(Some(ProxyFacts {
            port: u32::try_from(port).map_err(|_| self.err(&keys.proxy_port, "is too large"))?,
            domains: self
                .get(&keys.proxy_domains)
                .map(|d| {
                    d.split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            generation: self.get(&keys.proxy_generation).map(str::to_owned),
            sequence: match self.number(&keys.proxy_sequence)? {
                Some(n) => n,
                None => u64::from(self.get(&keys.proxy_generation).is_some()),
            },
        }))
    }
}
