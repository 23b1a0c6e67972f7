//! [`DesiredJob`]: every object one job needs, in apply order, ready for the one place that applies them.
//!
//! Apply order: the owner's queue, namespace, baseline policies and storage claim (shared by all the
//! owner's jobs: create if absent, never deleted with a job), then the VolcanoJob, then its companions.
//! Companions are created after the VolcanoJob so they can carry an ownerReference to it
//! ([`DesiredJob::set_owner_uid`]) and the cluster garbage-collects them with the job (W14: nothing leaks
//! when a job goes away).

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;

use crate::volcano::{Queue, VolcanoJob};

/// The objects of one job, in apply order (see [`DesiredJob::objects`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredJob {
    /// The Volcano queue of the job's project, when per-project queues are on. Shared; create if absent.
    pub queue: Option<Queue>,
    /// The owner's namespace with its baseline NetworkPolicies, when per-owner namespaces are on.
    /// Shared; create if absent.
    pub namespace: Option<OwnerNamespace>,
    /// The job itself.
    pub vcjob: VolcanoJob,
    /// Objects that live and die with the job: its NetworkPolicy, Services.
    pub companions: Vec<Companion>,
}

/// An owner's namespace and the policies every pod in it gets.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerNamespace {
    /// The namespace itself, labelled with the owner kind and annotated with the owner's exact name.
    pub namespace: Namespace,
    /// The baseline every pod in it gets (ingress from the proxy; DNS and internet egress).
    pub network_policies: Vec<NetworkPolicy>,
    /// The storage claim, when `storage.owner_claim` is configured (a PVC is namespaced, so every owner
    /// namespace needs its own).
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
}

/// An object that belongs to one job and is deleted with it.
#[derive(Debug, Clone, PartialEq)]
pub enum Companion {
    /// The job's own policy, `policy-<jobId>` (boxed, like a Service: a companion moves around in plans).
    NetworkPolicy(Box<NetworkPolicy>),
    /// Boxed: a Service is much larger than the other kinds.
    Service(Box<Service>),
}

impl Companion {
    /// Its `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NetworkPolicy(_) => "NetworkPolicy",
            Self::Service(_) => "Service",
        }
    }

    /// The companion's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::NetworkPolicy(o) => &o.metadata,
            Self::Service(o) => &o.metadata,
        }
    }

    /// The companion's metadata, to set owner references or labels.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::NetworkPolicy(o) => &mut o.metadata,
            Self::Service(o) => &mut o.metadata,
        }
    }

    /// Replaces the ownerReferences with `owner` (the VolcanoJob).
    pub fn set_owner(&mut self, owner: OwnerReference) {
        self.metadata_mut().owner_references = Some(vec![owner]);
    }

    fn object(&self) -> ObjectRef<'_> {
        match self {
            Self::NetworkPolicy(o) => ObjectRef::NetworkPolicy(o),
            Self::Service(o) => ObjectRef::Service(o),
        }
    }
}

/// How the applier treats an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Shared by all jobs of an owner: create if absent (409 is success), never update, never delete.
    Shared,
    /// The VolcanoJob: create; an existing one with the same submission hash is a duplicate delivery.
    Job,
    /// Owned by the VolcanoJob through an ownerReference: create after it, roll back with it.
    Companion,
}

/// A borrowed typed object.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ObjectRef<'a> {
    /// A Volcano queue (cluster-scoped).
    Queue(&'a Queue),
    /// A namespace (cluster-scoped).
    Namespace(&'a Namespace),
    /// A NetworkPolicy.
    NetworkPolicy(&'a NetworkPolicy),
    /// A PersistentVolumeClaim.
    PersistentVolumeClaim(&'a PersistentVolumeClaim),
    /// The Volcano Job.
    VolcanoJob(&'a VolcanoJob),
    /// A Service.
    Service(&'a Service),
}

/// One object of a [`DesiredJob`] with its role.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DesiredObject<'a> {
    /// How to apply it.
    pub role: Role,
    /// The object.
    pub object: ObjectRef<'a>,
}

impl DesiredObject<'_> {
    /// `apiVersion` of the object.
    pub fn api_version(&self) -> &'static str {
        use k8s_openapi::Resource;
        match self.object {
            ObjectRef::Queue(_) => Queue::API_VERSION,
            ObjectRef::Namespace(_) => Namespace::API_VERSION,
            ObjectRef::NetworkPolicy(_) => NetworkPolicy::API_VERSION,
            ObjectRef::PersistentVolumeClaim(_) => PersistentVolumeClaim::API_VERSION,
            ObjectRef::VolcanoJob(_) => VolcanoJob::API_VERSION,
            ObjectRef::Service(_) => Service::API_VERSION,
        }
    }

    /// `kind` of the object.
    pub fn kind(&self) -> &'static str {
        use k8s_openapi::Resource;
        match self.object {
            ObjectRef::Queue(_) => Queue::KIND,
            ObjectRef::Namespace(_) => Namespace::KIND,
            ObjectRef::NetworkPolicy(_) => NetworkPolicy::KIND,
            ObjectRef::PersistentVolumeClaim(_) => PersistentVolumeClaim::KIND,
            ObjectRef::VolcanoJob(_) => VolcanoJob::KIND,
            ObjectRef::Service(_) => Service::KIND,
        }
    }

    /// The object's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self.object {
            ObjectRef::Queue(o) => &o.metadata,
            ObjectRef::Namespace(o) => &o.metadata,
            ObjectRef::NetworkPolicy(o) => &o.metadata,
            ObjectRef::PersistentVolumeClaim(o) => &o.metadata,
            ObjectRef::VolcanoJob(o) => &o.metadata,
            ObjectRef::Service(o) => &o.metadata,
        }
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }

    /// `metadata.namespace`, `None` for cluster-scoped objects.
    pub fn namespace(&self) -> Option<&str> {
        self.metadata().namespace.as_deref()
    }
}

/// The object as its type writes it, `apiVersion` and `kind` first: what `volcano-runner render` prints
/// and what a step sends ([`crate::runner::plan`]); tests read it as JSON with `serde_json::to_value`.
impl Serialize for DesiredObject<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.object {
            ObjectRef::Queue(o) => o.serialize(serializer),
            ObjectRef::Namespace(o) => o.serialize(serializer),
            ObjectRef::NetworkPolicy(o) => o.serialize(serializer),
            ObjectRef::PersistentVolumeClaim(o) => o.serialize(serializer),
            ObjectRef::VolcanoJob(o) => o.serialize(serializer),
            ObjectRef::Service(o) => o.serialize(serializer),
        }
    }
}

impl DesiredJob {
    /// Every object in apply order: queue, namespace, baseline policies, storage claim, VolcanoJob,
    /// companions.
    pub fn objects(&self) -> Vec<DesiredObject<'_>> {
        let shared = |object| DesiredObject {
            role: Role::Shared,
            object,
        };
        let mut out = Vec::with_capacity(3 + self.companions.len());
        if let Some(queue) = &self.queue {
            out.push(shared(ObjectRef::Queue(queue)));
        }
        if let Some(ns) = &self.namespace {
            out.push(shared(ObjectRef::Namespace(&ns.namespace)));
            out.extend(
                ns.network_policies
                    .iter()
                    .map(|p| shared(ObjectRef::NetworkPolicy(p))),
            );
            out.extend(
                ns.persistent_volume_claims
                    .iter()
                    .map(|c| shared(ObjectRef::PersistentVolumeClaim(c))),
            );
        }
        out.push(DesiredObject {
            role: Role::Job,
            object: ObjectRef::VolcanoJob(&self.vcjob),
        });
        out.extend(self.companions.iter().map(|c| DesiredObject {
            role: Role::Companion,
            object: c.object(),
        }));
        out
    }

    /// The VolcanoJob's name, `j-<jobId>`.
    pub fn name(&self) -> &str {
        self.vcjob.metadata.name.as_deref().unwrap_or_default()
    }

    /// The namespace the job and its companions live in.
    pub fn job_namespace(&self) -> &str {
        self.vcjob.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// Points every companion at the created VolcanoJob (call with the uid the API server returned), so
    /// the garbage collector deletes them with the job.
    pub fn set_owner_uid(&mut self, uid: &str) {
        let owner = owner_reference(self.name(), uid);
        for companion in &mut self.companions {
            companion.set_owner(owner.clone());
        }
    }

    /// Records the W3C trace context of the submission on the VolcanoJob (`<prefix>traceparent`), so the
    /// monitor's events continue the trace. Not part of the submission hash.
    pub fn set_traceparent(&mut self, keys: &crate::durable::AnnotationKeys, traceparent: &str) {
        self.vcjob
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(keys.traceparent.clone(), traceparent.to_owned());
    }
}

/// The ownerReference that ties a companion to the VolcanoJob `name` with `uid`: controller, and
/// blocking the owner's foreground deletion until the companion is gone.
pub fn owner_reference(name: &str, uid: &str) -> OwnerReference {
    use k8s_openapi::Resource;
    OwnerReference {
        api_version: VolcanoJob::API_VERSION.to_owned(),
        kind: VolcanoJob::KIND.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}
