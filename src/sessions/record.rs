//! A session as stored in the cluster: one ConfigMap per session in the runner's own namespace, named
//! `session-<sha256 of the id, hex>`, labelled with its job, rank, kind and expiry (epoch seconds), so an
//! operator can see and delete them with kubectl and the sweep can find them. The id itself is nowhere:
//! the name and the `hash` key hold its SHA-256.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta};

use super::Kind;
use super::token::Hash;
use crate::cluster::labels::{COMPONENT, MANAGED_BY, MANAGER};
use crate::cluster::records::ConfigMapRecords;
use crate::cluster::{ClusterConfig, ClusterError};

/// `app.kubernetes.io/component` of a session record.
pub const COMPONENT_SESSION: &str = "session";
/// Label: the session's job id.
pub const LABEL_JOB: &str = "volcano-runner/session-job";
/// Label: the session's rank.
pub const LABEL_RANK: &str = "volcano-runner/session-rank";
/// Label: the session's kind (`web`, `vnc`, `terminal`).
pub const LABEL_KIND: &str = "volcano-runner/session-kind";
/// Label: when the session expires, in epoch seconds.
pub const LABEL_EXPIRES: &str = "volcano-runner/session-expires";

const KEY_HASH: &str = "hash";
const KEY_ISSUED_AT: &str = "issuedAt";
const KEY_EXPIRES_AT: &str = "expiresAt";

/// The label selector of every session record.
pub fn selector() -> String {
    format!("{MANAGED_BY}={MANAGER},{COMPONENT}={COMPONENT_SESSION}")
}

/// The ConfigMap name of the session whose id hashes to `hash`.
pub fn name_for(hash: &Hash) -> String {
    format!("session-{}", hash.hex())
}

/// One session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub hash: Hash,
    pub job_id: String,
    pub rank: u32,
    pub kind: Kind,
    pub issued_at: Timestamp,
    pub expires_at: Timestamp,
}

impl SessionRecord {
    /// Whether it no longer opens anything at `now`.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// The ConfigMap that stores it.
    pub fn to_configmap(&self, namespace: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name_for(&self.hash)),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    (COMPONENT.to_owned(), COMPONENT_SESSION.to_owned()),
                    (LABEL_JOB.to_owned(), self.job_id.clone()),
                    (LABEL_RANK.to_owned(), self.rank.to_string()),
                    (LABEL_KIND.to_owned(), self.kind.as_str().to_owned()),
                    (
                        LABEL_EXPIRES.to_owned(),
                        self.expires_at.as_second().to_string(),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (KEY_HASH.to_owned(), self.hash.hex()),
                (KEY_ISSUED_AT.to_owned(), self.issued_at.to_string()),
                (KEY_EXPIRES_AT.to_owned(), self.expires_at.to_string()),
            ])),
            ..ConfigMap::default()
        }
    }

    /// Reads a record back; `None` for anything that is not a whole, consistent record (its name and
    /// its `hash` must agree), which then opens nothing.
    pub fn from_configmap(cm: &ConfigMap) -> Option<SessionRecord> {
        let labels = cm.metadata.labels.as_ref()?;
        let data = cm.data.as_ref()?;
        let hash = Hash::from_hex(data.get(KEY_HASH)?)?;
        if cm.metadata.name.as_deref() != Some(name_for(&hash).as_str()) {
            return None;
        }
        Some(SessionRecord {
            hash,
            job_id: labels.get(LABEL_JOB)?.clone(),
            rank: labels.get(LABEL_RANK)?.parse().ok()?,
            kind: Kind::parse(labels.get(LABEL_KIND)?)?,
            issued_at: data
                .get(KEY_ISSUED_AT)
                .and_then(|t| t.parse().ok())
                .unwrap_or(Timestamp::UNIX_EPOCH),
            expires_at: data.get(KEY_EXPIRES_AT)?.parse().ok()?,
        })
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Records looked at.
    pub seen: usize,
    /// Records deleted (expired, or their job ended).
    pub deleted: usize,
}

/// The session records of the runner's namespace.
#[derive(Clone, Debug)]
pub struct SessionStore {
    records: ConfigMapRecords,
}

impl SessionStore {
    /// Records in `config.namespace`.
    pub fn new(client: kube::Client, config: &ClusterConfig) -> Self {
        Self {
            records: ConfigMapRecords::new(client, config).showing_names(short_name),
        }
    }

    /// The namespace the records live in.
    pub fn namespace(&self) -> &str {
        self.records.namespace()
    }

    /// The API of the records, for a watch.
    pub fn api(&self) -> Api<ConfigMap> {
        self.records.api().clone()
    }

    /// Stores a new session. The id is random, so its name is new: an existing object of that name
    /// (only from a retried create that had landed) is the same session.
    pub async fn create(&self, record: &SessionRecord) -> Result<(), ClusterError> {
        let cm = record.to_configmap(self.records.namespace());
        self.records.create(WHAT, &cm).await.map(|_| ())
    }

    /// One page of at most `limit` records, from `token` (a list's continue token; `None`: the first
    /// page). Returns the records (unreadable ones as `None`, with their names) and the next token.
    pub async fn page(
        &self,
        limit: u32,
        token: Option<&str>,
    ) -> Result<(Vec<(String, Option<SessionRecord>)>, Option<String>), ClusterError> {
        let mut params = ListParams::default().labels(&selector()).limit(limit);
        if let Some(token) = token {
            params = params.continue_token(token);
        }
        let list = self.records.list("sessions", &params).await?;
        let next = list.metadata.continue_.filter(|c| !c.is_empty());
        let items = list
            .items
            .iter()
            .map(|cm| {
                (
                    cm.metadata.name.clone().unwrap_or_default(),
                    SessionRecord::from_configmap(cm),
                )
            })
            .collect();
        Ok((items, next))
    }

    /// Deletes one record by name; a record already gone is fine.
    pub async fn delete(&self, name: &str) -> Result<(), ClusterError> {
        self.records
            .delete("session record", name, None)
            .await
            .map(|_| ())
    }
}

/// The record kind, in the operations errors name.
const WHAT: &str = "session";

/// A record's name shortened for logs (`session-<12 hex digits>…`).
fn short_name(name: &str) -> String {
    name.chars().take("session-".len() + 12).collect::<String>() + "…"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_tampered_one_is_refused() {
        let r = SessionRecord {
            hash: Hash::of("x"),
            job_id: "4818".into(),
            rank: 1,
            kind: Kind::Vnc,
            issued_at: "2026-11-27T01:00:00Z".parse().unwrap(),
            expires_at: "2026-11-27T09:00:00Z".parse().unwrap(),
        };
        let cm = r.to_configmap("volcano-runner");
        assert_eq!(SessionRecord::from_configmap(&cm), Some(r.clone()));
        let labels = cm.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_EXPIRES], r.expires_at.as_second().to_string());
        let mut renamed = cm.clone();
        renamed.metadata.name = Some(name_for(&Hash::of("y")));
        assert_eq!(SessionRecord::from_configmap(&renamed), None);
        assert!(r.is_expired(r.expires_at));
        assert!(!r.is_expired(r.issued_at));
    }
}
