//! ConfigMaps as durable records in the runner's namespace: the one way every record kind (tombstones,
//! pending extensions, session records, maintenance windows, the pause switch) is created, read, listed
//! and deleted, with the retry policy and the answers that mean "done already" settled once.
//!
//! Each kind keeps one object per fact, so recording is a single create and the races between runners
//! come down to three answers this type turns into values instead of errors: AlreadyExists on a create
//! (the same fact recorded by another runner, or by a retried create that had landed), NotFound on a
//! delete (deleted already) and a Conflict on a delete conditional on a version (the record was made again
//! meanwhile, and that newer record must survive).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectList, PostParams, Preconditions};

use super::ClusterConfig;
use super::error::{ClusterError, KubeResultExt};
use super::labels::FIELD_MANAGER;
use super::retry::RetryPolicy;

/// What a delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// It was there and is gone now.
    Deleted,
    /// Nothing of that name was there.
    Gone,
    /// It was there in another version than the one the delete was conditional on, and was kept.
    Changed,
}

/// The ConfigMaps of the runner's namespace, each request under the cluster's retry policy. `what` in
/// every call names the record kind in the operation an error carries (`record tombstone ns/name`).
#[derive(Clone)]
pub struct ConfigMapRecords {
    api: Api<ConfigMap>,
    namespace: String,
    retry: RetryPolicy,
    /// How a record's name appears in an operation (and so in errors and logs).
    show: fn(&str) -> String,
}

impl std::fmt::Debug for ConfigMapRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigMapRecords")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl ConfigMapRecords {
    /// Records in `config.namespace`.
    pub fn new(client: kube::Client, config: &ClusterConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            namespace: config.namespace.clone(),
            retry: RetryPolicy::from_config(config),
            show: str::to_owned,
        }
    }

    /// Names records in errors and logs as `show` writes them: for names that must not appear whole
    /// (a session record's name is the hash its bearer is looked up by).
    pub fn showing_names(mut self, show: fn(&str) -> String) -> Self {
        self.show = show;
        self
    }

    /// The namespace the records live in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The API of the namespace's ConfigMaps, for a watch or a request this type does not make.
    pub fn api(&self) -> &Api<ConfigMap> {
        &self.api
    }

    /// The retry policy every request here runs under.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The operation an error names: `<verb> <what> <namespace>/<name>`.
    pub fn op(&self, verb: &str, what: &str, name: &str) -> String {
        format!("{verb} {what} {}/{}", self.namespace, (self.show)(name))
    }

    /// Creates `cm` once, without retrying: `false` when an object of its name exists (the caller
    /// decides what that means, inside its own retry).
    pub async fn create_once(&self, what: &str, cm: &ConfigMap) -> Result<bool, ClusterError> {
        let name = cm.metadata.name.as_deref().unwrap_or_default();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        match self
            .api
            .create(&params, cm)
            .await
            .classify(|| self.op("record", what, name))
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_already_exists() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates `cm`: `true` when this call created it, `false` when it was there already.
    pub async fn create(&self, what: &str, cm: &ConfigMap) -> Result<bool, ClusterError> {
        let name = cm.metadata.name.as_deref().unwrap_or_default();
        self.retry
            .run(&self.op("record", what, name), || {
                self.create_once(what, cm)
            })
            .await
    }

    /// The record `name`, if there is one.
    pub async fn get(&self, what: &str, name: &str) -> Result<Option<ConfigMap>, ClusterError> {
        let op = self.op("get", what, name);
        self.retry
            .run(&op, || async {
                self.api.get_opt(name).await.classify(|| op.clone())
            })
            .await
    }

    /// The records `params` selects (`what` in the plural names them in an error).
    pub async fn list(
        &self,
        what: &str,
        params: &ListParams,
    ) -> Result<ObjectList<ConfigMap>, ClusterError> {
        let op = format!("list {what} in {}", self.namespace);
        self.retry
            .run(&op, || async {
                self.api.list(params).await.classify(|| op.clone())
            })
            .await
    }

    /// Deletes the record `name`, conditional on `resource_version` when one is given (a record made
    /// again since it was read survives: [`Deleted::Changed`]).
    pub async fn delete(
        &self,
        what: &str,
        name: &str,
        resource_version: Option<String>,
    ) -> Result<Deleted, ClusterError> {
        let conditional = resource_version.is_some();
        let params = DeleteParams {
            preconditions: resource_version.map(|v| Preconditions {
                resource_version: Some(v),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let op = self.op("delete", what, name);
        let deleted = self
            .retry
            .run(&op, || async {
                self.api.delete(name, &params).await.classify(|| op.clone())
            })
            .await;
        match deleted {
            Ok(_) => Ok(Deleted::Deleted),
            Err(e) if e.is_not_found() => Ok(Deleted::Gone),
            Err(e) if conditional && e.is_conflict() => Ok(Deleted::Changed),
            Err(e) => Err(e),
        }
    }
}
