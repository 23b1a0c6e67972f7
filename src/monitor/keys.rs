//! Keys and fast hash collections shared by the monitor's files: a job (or any namespaced object) by
//! namespace and name, and the job a pod or PodGroup belongs to. At the bottom of the monitor's layers,
//! so that the cache, the forecast's inputs and the loop can share them without importing each other.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::volcano::PodGroup;

/// Maps hashed quickly (foldhash, with a random seed per map): the monitor looks keys up tens of
/// thousands of times per reconciliation, and SipHash was a tenth of a pass.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// See [`FastMap`].
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// A VolcanoJob by namespace and name (and, as [`ObjectKey`], any namespaced object).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey {
    /// Shared, not owned: a job's key is held by several maps at once (the cache's jobs, pods, groups and
    /// disruptions, the loop's queues and timers), and a clone is a count, not two allocations.
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// A pod or PodGroup by namespace and name.
pub type ObjectKey = JobKey;

/// A namespace and name, however held: lets the maps keyed by [`JobKey`] be searched with borrowed
/// strings (the reconciliation looks up every listed object, and building an owned key for each was
/// two allocations apiece).
pub trait KeyParts {
    fn parts(&self) -> (&str, &str);
}

impl KeyParts for JobKey {
    fn parts(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

impl KeyParts for (&str, &str) {
    fn parts(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl std::hash::Hash for dyn KeyParts + '_ {
    /// As `JobKey`'s derived hash: its two fields in order.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let (namespace, name) = self.parts();
        namespace.hash(state);
        name.hash(state);
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl<'a> std::borrow::Borrow<dyn KeyParts + 'a> for JobKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl JobKey {
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The job id (`j-<jobId>`), when the name has that shape.
    pub fn job_id(&self) -> Option<&str> {
        crate::pipeline::names::job_id_from_vcjob_name(&self.name)
    }
}

impl std::fmt::Display for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The job a pod belongs to (Volcano's job-name label, read by [`crate::volcano::job_of_pod`]).
pub fn job_of_pod(pod: &Pod) -> Option<JobKey> {
    let (namespace, name) = crate::volcano::job_of_pod(pod)?;
    Some(JobKey::new(namespace, name))
}

/// The job a PodGroup belongs to (its controlling Volcano Job).
pub fn job_of_group(pg: &PodGroup) -> Option<JobKey> {
    let owner = pg
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Job" && o.api_version.starts_with("batch.volcano.sh/"))?;
    Some(JobKey::new(
        pg.metadata.namespace.as_deref().unwrap_or_default(),
        &owner.name,
    ))
}
