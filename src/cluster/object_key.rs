//! [`ObjectKey`]: which object a step of a plan is. Below both the applier that creates the objects
//! and the namespace cache it asks what exists, which keys its entries by it.

use std::fmt;

use kube::api::{DynamicObject, ObjectMeta};
use kube::core::ApiResource;

/// The identity of an object: what it is and where.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub api_version: String,
    pub kind: String,
    /// `None` for cluster-scoped objects (namespaces).
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    /// The key of `object`, a `resource`.
    pub fn of(resource: &ApiResource, object: &DynamicObject) -> Self {
        Self::of_meta(resource, &object.metadata)
    }

    /// The key of the object of `metadata`, a `resource`.
    pub fn of_meta(resource: &ApiResource, metadata: &ObjectMeta) -> Self {
        Self {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            namespace: metadata.namespace.clone(),
            name: metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}
