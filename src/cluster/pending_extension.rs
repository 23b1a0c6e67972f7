//! Pending extensions: durable records of extensions that arrived before their job existed, so an
//! extension of a submission that still waits in its queue (a pause, a backlog) is not lost.
//!
//! Extensions and submissions travel on different queues, so an `ExtendJob` can overtake its
//! `SubmitJob`, and while submissions are paused it always does. The extension is recorded, and applied
//! once the job exists, by the usual guarded write keyed by its request id (so recording or applying it
//! twice extends once).
//!
//! **Storage.** One ConfigMap per (job, request id) in the runner's namespace, named
//! `extension-<first 40 hex digits of sha256(jobId "/" requestId)>`, labelled
//! `app.kubernetes.io/component=pending-extension`, with the job id, the request id, the extension, the
//! request's time and trace context, and when the record expires (`[cluster] tombstone_ttl` after it was
//! made, like a tombstone: it must outlive the longest wait of a submission). One object per request
//! makes recording a single create (no read-modify-write between runners).
//!
//! **Protocol (for the runner).** An extension of a job that does not exist records itself *first* and
//! then looks for the job again; found, it is applied at once. Every runner lists the records every
//! `[cluster] pending_extension_interval` and applies those whose job now exists, then deletes them; an
//! expired record whose job never came gets the answer `unknown_job` and is deleted. With that order an
//! extension and its job's creation end with the extension applied, whichever comes first.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta};

use super::ClusterConfig;
use super::error::ClusterError;
use super::labels::{COMPONENT, MANAGED_BY, MANAGER};
use super::records::ConfigMapRecords;

/// `app.kubernetes.io/component` of a pending extension.
pub const COMPONENT_PENDING_EXTENSION: &str = "pending-extension";

const KEY_JOB_ID: &str = "jobId";
const KEY_REQUEST_ID: &str = "requestId";
const KEY_SECONDS: &str = "extensionSeconds";
const KEY_NANOS: &str = "extensionNanos";
const KEY_SENT_AT: &str = "sentAt";
const KEY_TRACEPARENT: &str = "traceparent";
const KEY_RECORDED_AT: &str = "recordedAt";
const KEY_EXPIRES_AT: &str = "expiresAt";

/// An extension waiting for its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingExtension {
    pub job_id: String,
    pub request_id: String,
    /// The extension as the request gave it (a protobuf duration: seconds and nanoseconds).
    pub seconds: i64,
    pub nanos: i32,
    /// The request's own time (its AMQP timestamp), so the answer is the one its delivery would have
    /// published.
    pub sent_at: Option<Timestamp>,
    /// The request's W3C trace context.
    pub traceparent: Option<String>,
    pub recorded_at: Timestamp,
    /// After this instant the job is taken never to come: the answer is `unknown_job`.
    pub expires_at: Timestamp,
    /// The stored object's resourceVersion (`None` before it is stored).
    pub resource_version: Option<String>,
}

impl PendingExtension {
    /// Whether it no longer waits at `now`.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    fn to_configmap(&self, namespace: &str) -> ConfigMap {
        let mut data = BTreeMap::from([
            (KEY_JOB_ID.to_owned(), self.job_id.clone()),
            (KEY_REQUEST_ID.to_owned(), self.request_id.clone()),
            (KEY_SECONDS.to_owned(), self.seconds.to_string()),
            (KEY_NANOS.to_owned(), self.nanos.to_string()),
            (KEY_RECORDED_AT.to_owned(), self.recorded_at.to_string()),
            (KEY_EXPIRES_AT.to_owned(), self.expires_at.to_string()),
        ]);
        if let Some(at) = self.sent_at {
            data.insert(KEY_SENT_AT.to_owned(), at.to_string());
        }
        if let Some(tp) = &self.traceparent {
            data.insert(KEY_TRACEPARENT.to_owned(), tp.clone());
        }
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name_for(&self.job_id, &self.request_id)),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    (COMPONENT.to_owned(), COMPONENT_PENDING_EXTENSION.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        }
    }

    /// Reads a record back; `None` for a ConfigMap that is not a readable record (it is left alone).
    fn from_configmap(cm: &ConfigMap) -> Option<Self> {
        let data = cm.data.as_ref()?;
        let text = |k: &str| data.get(k).cloned();
        let time = |k: &str| text(k).and_then(|v| v.parse::<Timestamp>().ok());
        Some(Self {
            job_id: text(KEY_JOB_ID)?,
            request_id: text(KEY_REQUEST_ID)?,
            seconds: text(KEY_SECONDS)?.parse().ok()?,
            nanos: text(KEY_NANOS)?.parse().ok()?,
            sent_at: time(KEY_SENT_AT),
            traceparent: text(KEY_TRACEPARENT),
            recorded_at: time(KEY_RECORDED_AT)?,
            expires_at: time(KEY_EXPIRES_AT)?,
            resource_version: cm.metadata.resource_version.clone(),
        })
    }
}

/// The ConfigMap name of a pending extension: `extension-<first 40 hex digits of
/// sha256(jobId "/" requestId)>` (request ids are the orchestrator's and may be anything).
pub fn name_for(job_id: &str, request_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(job_id.as_bytes());
    hasher.update(b"/");
    hasher.update(request_id.as_bytes());
    let hex: String = hasher
        .finalize()
        .iter()
        .take(20)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("extension-{hex}")
}

/// Records, lists and deletes pending extensions in the runner's namespace.
#[derive(Clone)]
pub struct PendingExtensions {
    records: ConfigMapRecords,
    ttl: Duration,
}

impl std::fmt::Debug for PendingExtensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingExtensions")
            .field("namespace", &self.records.namespace())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl PendingExtensions {
    /// Records in `config.namespace`, kept for `config.tombstone_ttl`.
    pub fn new(client: kube::Client, config: &ClusterConfig) -> Self {
        Self {
            records: ConfigMapRecords::new(client, config),
            ttl: config.tombstone_ttl,
        }
    }

    /// A record of this request, made at `now` (not yet stored).
    pub fn draft(
        &self,
        job_id: &str,
        request_id: &str,
        (seconds, nanos): (i64, i32),
        sent_at: Option<Timestamp>,
        traceparent: Option<String>,
        now: Timestamp,
    ) -> PendingExtension {
        let ttl = jiff::SignedDuration::try_from(self.ttl).unwrap_or(jiff::SignedDuration::MAX);
        PendingExtension {
            job_id: job_id.to_owned(),
            request_id: request_id.to_owned(),
            seconds,
            nanos,
            sent_at,
            traceparent,
            recorded_at: now,
            expires_at: now.checked_add(ttl).unwrap_or(Timestamp::MAX),
            resource_version: None,
        }
    }

    /// Stores `record`. Idempotent: a record of the same job and request id that exists is kept (a
    /// redelivery of the request).
    pub async fn record(&self, record: &PendingExtension) -> Result<(), ClusterError> {
        let cm = record.to_configmap(self.records.namespace());
        self.records.create(WHAT, &cm).await.map(|_| ())
    }

    /// Every readable record.
    pub async fn list(&self) -> Result<Vec<PendingExtension>, ClusterError> {
        let selector = format!("{MANAGED_BY}={MANAGER},{COMPONENT}={COMPONENT_PENDING_EXTENSION}");
        let params = ListParams::default().labels(&selector);
        let list = self.records.list("pending extensions", &params).await?;
        Ok(list
            .items
            .iter()
            .filter_map(PendingExtension::from_configmap)
            .collect())
    }

    /// Deletes a record once it is answered, conditional on the version that was read (a record
    /// re-made meanwhile survives). Gone already counts as done.
    pub async fn delete(&self, record: &PendingExtension) -> Result<(), ClusterError> {
        let name = name_for(&record.job_id, &record.request_id);
        self.records
            .delete(WHAT, &name, record.resource_version.clone())
            .await
            .map(|_| ())
    }
}

/// The record kind, in the operations errors name.
const WHAT: &str = "pending extension";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let record = PendingExtension {
            job_id: "42".into(),
            request_id: "req/1 with spaces".into(),
            seconds: 600,
            nanos: 5,
            sent_at: Some("2024-05-01T12:00:00Z".parse().unwrap()),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            recorded_at: "2024-05-01T12:00:01Z".parse().unwrap(),
            expires_at: "2024-05-02T12:00:01Z".parse().unwrap(),
            resource_version: None,
        };
        let mut cm = record.to_configmap("volcano-runner");
        cm.metadata.resource_version = Some("7".into());
        let back = PendingExtension::from_configmap(&cm).unwrap();
        assert_eq!(
            back,
            PendingExtension {
                resource_version: Some("7".into()),
                ..record.clone()
            }
        );
        let name = cm.metadata.name.unwrap();
        assert!(name.starts_with("extension-") && name.len() == 50, "{name}");
        assert_ne!(name, name_for("42", "req/2"));
        assert!(!record.is_expired("2024-05-02T12:00:00Z".parse().unwrap()));
        assert!(record.is_expired("2024-05-02T12:00:01Z".parse().unwrap()));
    }
}
