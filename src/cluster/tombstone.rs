//! Tombstones: durable records of cancels, so a submit that arrives after its cancel is not started.
//!
//! Cancels and submits travel on different queues (so a cancel never waits behind a backlog), which
//! means a cancel can overtake its submit. The cancel leaves a tombstone; the submit checks for one
//! before creating the job and publishes CANCELLED instead.
//!
//! **Storage.** One ConfigMap per cancelled job in the runner's namespace, named `tombstone-<jobId>`
//! (or `tombstone-<hash>` for an id that is not a valid name), labelled
//! `app.kubernetes.io/component=tombstone`, with the job id, the reason, when it was cancelled and when
//! the record expires. One object per job makes recording a single create (no read-modify-write, no
//! contention between runners) and the check a single GET by name; a sweeper lists by label and deletes
//! expired ones. An expired tombstone is ignored by the check even before the sweeper gets to it.
//!
//! **Protocol (for the runner).** A cancel records the tombstone *first* and then deletes the job; a
//! submit checks before creating the job *and again after creating it* (deleting the job if a tombstone
//! appeared meanwhile). With that order every interleaving of a cancel and its submit ends with no job.
//! Recording on every cancel, not only when the job is missing, also stops a duplicate submit that
//! arrives after the job was cancelled.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use kube::runtime::watcher;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams};

use super::ClusterConfig;
use super::error::{ClusterError, KubeResultExt};
use super::labels::{COMPONENT, FIELD_MANAGER, MANAGED_BY, MANAGER};
use super::records::{ConfigMapRecords, Deleted};
use super::view::WatchView;

/// `app.kubernetes.io/component` of a tombstone.
pub const COMPONENT_TOMBSTONE: &str = "tombstone";

const KEY_JOB_ID: &str = "jobId";
const KEY_REASON: &str = "reason";
const KEY_CANCELLED_AT: &str = "cancelledAt";
const KEY_EXPIRES_AT: &str = "expiresAt";

/// A cancel that has been recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    pub job_id: String,
    /// The cancel's reason, for the CANCELLED event of the late submit.
    pub reason: String,
    pub cancelled_at: Timestamp,
    /// After this instant the tombstone no longer stops a submit and may be swept.
    pub expires_at: Timestamp,
}

impl Tombstone {
    /// A tombstone recorded at `now`, kept for `ttl`.
    pub fn new(job_id: &str, reason: &str, now: Timestamp, ttl: Duration) -> Self {
        let ttl = jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::MAX);
        Self {
            job_id: job_id.to_owned(),
            reason: reason.to_owned(),
            cancelled_at: now,
            expires_at: now.checked_add(ttl).unwrap_or(Timestamp::MAX),
        }
    }

    /// Whether it no longer counts at `now`.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// The ConfigMap that stores it.
    fn to_configmap(&self, namespace: &str) -> ConfigMap {
        let data = BTreeMap::from([
            (KEY_JOB_ID.to_owned(), self.job_id.clone()),
            (KEY_REASON.to_owned(), self.reason.clone()),
            (KEY_CANCELLED_AT.to_owned(), self.cancelled_at.to_string()),
            (KEY_EXPIRES_AT.to_owned(), self.expires_at.to_string()),
        ]);
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name_for(&self.job_id)),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    (COMPONENT.to_owned(), COMPONENT_TOMBSTONE.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        }
    }

    /// Reads a tombstone back. An unreadable one counts as a cancel that never expires by its own
    /// record (the sweeper removes it by age): stopping a job wrongly is better than running a
    /// cancelled one.
    fn from_configmap(cm: &ConfigMap, ttl: Duration) -> Self {
        let data = cm.data.clone().unwrap_or_default();
        let get = |k: &str| data.get(k).map(String::as_str);
        let parse = |k: &str| get(k).and_then(|v| v.parse::<Timestamp>().ok());
        let created = cm.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let cancelled_at = parse(KEY_CANCELLED_AT)
            .or(created)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let expires_at = parse(KEY_EXPIRES_AT)
            .unwrap_or_else(|| Tombstone::new("", "", cancelled_at, ttl).expires_at);
        Self {
            job_id: get(KEY_JOB_ID).unwrap_or_default().to_owned(),
            reason: get(KEY_REASON).unwrap_or("cancelled").to_owned(),
            cancelled_at,
            expires_at,
        }
    }
}

/// The ConfigMap name of a job's tombstone: `tombstone-<jobId>` when that is a valid name, else
/// `tombstone-<first 40 hex digits of sha256(jobId)>`.
pub fn name_for(job_id: &str) -> String {
    let readable = format!("tombstone-{job_id}");
    if is_dns_subdomain(&readable) {
        return readable;
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(job_id.as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("tombstone-{hex}")
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.')
            .all(|part| super::labels::check_dns_label(part).is_ok())
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub deleted: usize,
    pub kept: usize,
}

/// Records, checks and sweeps tombstones in the runner's namespace.
#[derive(Clone)]
pub struct Tombstones {
    records: ConfigMapRecords,
    ttl: Duration,
    /// The tombstones a watch of the runner's namespace has seen, and those this runner recorded: a
    /// cache for the check before a submission creates anything. It may lag behind another runner's
    /// cancel; that check is only there to skip needless work, and the authoritative check after the
    /// create ([`Tombstones::check`], a GET) decides.
    view: WatchView<Tombstone>,
}

impl std::fmt::Debug for Tombstones {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tombstones")
            .field("namespace", &self.records.namespace())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Tombstones {
    /// Tombstones in `config.namespace`, kept for `config.tombstone_ttl`.
    pub fn new(client: kube::Client, config: &ClusterConfig) -> Self {
        Self {
            records: ConfigMapRecords::new(client, config),
            ttl: config.tombstone_ttl,
            view: WatchView::default(),
        }
    }

    /// The live tombstone of `job_id` as the watch ([`Tombstones::follow`]) has it, without a request;
    /// before the watch has listed, [`Tombstones::check`]. A `None` here may be a tombstone recorded a
    /// moment ago: callers that must not miss one use [`Tombstones::check`].
    pub async fn check_cached(
        &self,
        job_id: &str,
        now: Timestamp,
    ) -> Result<Option<Tombstone>, ClusterError> {
        let name = name_for(job_id);
        let cached = self.view.read(|live| {
            live.get(&(name, self.records.namespace().to_owned()))
                .filter(|t| !t.is_expired(now))
                .cloned()
        });
        if let Some(cached) = cached {
            return Ok(cached);
        }
        self.check(job_id, now).await
    }

    /// Whether the watch's view has a live tombstone of `job_id`, without a request: `None` while the
    /// view cannot answer (not listed yet, or since a watch error). For a check that only spares an
    /// effect in the wrong order (a monitor's QUEUED after the CANCELLED of a cancel that overtook the
    /// submission), never for one that must not miss a cancel.
    pub fn seen(&self, job_id: &str, now: Timestamp) -> Option<bool> {
        let name = name_for(job_id);
        self.view.read(|live| {
            live.get(&(name, self.records.namespace().to_owned()))
                .is_some_and(|t| !t.is_expired(now))
        })
    }

    /// Keeps the view of [`Tombstones::check_cached`] with a watch of the tombstones (label selected)
    /// in the runner's namespace, until `shutdown`. A watch error makes the view unusable (every check
    /// then reads) until the watch has listed again.
    pub async fn follow(&self, shutdown: impl Future<Output = ()>) {
        let selector = format!("{MANAGED_BY}={MANAGER},{COMPONENT}={COMPONENT_TOMBSTONE}");
        let ttl = self.ttl;
        self.view
            .follow(
                self.records.api().clone(),
                watcher::Config::default().labels(&selector),
                "tombstones",
                |cm| Tombstone::from_configmap(cm, ttl),
                shutdown,
            )
            .await;
    }

    /// Records a cancel of `job_id` at `now`. Idempotent: if a live tombstone exists, it is kept (the
    /// first cancel's reason wins) and returned; an expired one is replaced.
    pub async fn record(
        &self,
        job_id: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<Tombstone, ClusterError> {
        let tombstone = Tombstone::new(job_id, reason, now, self.ttl);
        let cm = tombstone.to_configmap(self.records.namespace());
        let name = name_for(job_id);
        let recorded = self
            .records
            .retry()
            .run(&self.records.op("record", WHAT, &name), || async {
                if self.records.create_once(WHAT, &cm).await? {
                    Ok(tombstone.clone())
                } else {
                    self.keep_or_replace(&name, &cm, now).await
                }
            })
            .await?;
        // A submission this runner handles next finds it in the view at once, without waiting for the
        // watch: a late submission of a job this runner has cancelled creates nothing.
        self.view.wrote(
            (name, self.records.namespace().to_owned()),
            recorded.clone(),
        );
        Ok(recorded)
    }

    /// An existing tombstone: returned if live, replaced if expired (conditional on its
    /// resourceVersion; a Conflict is retried by the caller's policy).
    async fn keep_or_replace(
        &self,
        name: &str,
        fresh: &ConfigMap,
        now: Timestamp,
    ) -> Result<Tombstone, ClusterError> {
        let op = || self.records.op("replace", WHAT, name);
        let api = self.records.api();
        let Some(existing) = api.get_opt(name).await.classify(op)? else {
            // Swept between our create and our read: a conflict, so the policy tries the create again.
            return Err(ClusterError::Conflict {
                op: op(),
                message: "it vanished while being read".into(),
            });
        };
        let current = Tombstone::from_configmap(&existing, self.ttl);
        if !current.is_expired(now) {
            return Ok(current);
        }
        let mut replacement = fresh.clone();
        replacement.metadata.resource_version = existing.metadata.resource_version.clone();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let stored = api
            .replace(name, &params, &replacement)
            .await
            .classify(op)?;
        Ok(Tombstone::from_configmap(&stored, self.ttl))
    }

    /// The live tombstone of `job_id` at `now`, if any.
    pub async fn check(
        &self,
        job_id: &str,
        now: Timestamp,
    ) -> Result<Option<Tombstone>, ClusterError> {
        let found = self.records.get(WHAT, &name_for(job_id)).await?;
        Ok(found
            .map(|cm| Tombstone::from_configmap(&cm, self.ttl))
            .filter(|t| !t.is_expired(now)))
    }

    /// Deletes expired tombstones. Each delete is conditional on the resourceVersion that was judged
    /// expired, so a tombstone re-recorded meanwhile survives.
    pub async fn sweep(&self, now: Timestamp) -> Result<SweepReport, ClusterError> {
        let selector = format!("{MANAGED_BY}={MANAGER},{COMPONENT}={COMPONENT_TOMBSTONE}");
        let params = ListParams::default().labels(&selector);
        let list = self.records.list("tombstones", &params).await?;
        let mut report = SweepReport::default();
        for cm in list.items {
            if !Tombstone::from_configmap(&cm, self.ttl).is_expired(now) {
                report.kept += 1;
                continue;
            }
            let name = cm.metadata.name.clone().unwrap_or_default();
            let version = cm.metadata.resource_version.clone();
            match self.records.delete(WHAT, &name, version).await? {
                Deleted::Deleted => report.deleted += 1,
                Deleted::Gone => {}
                Deleted::Changed => report.kept += 1,
            }
        }
        Ok(report)
    }

    /// Sweeps every `interval` until `shutdown` completes. `now` gives the time (the wall clock, or a
    /// simulated one). A failed sweep is logged and tried again at the next interval.
    pub async fn run_sweeper(
        &self,
        interval: Duration,
        now: impl Fn() -> Timestamp,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticks.tick() => {}
            }
            match self.sweep(now()).await {
                Ok(report) if report.deleted > 0 => {
                    tracing::info!(
                        deleted = report.deleted,
                        kept = report.kept,
                        "Swept expired tombstones."
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "Tombstone sweep failed; trying again later."),
            }
        }
    }
}

/// The record kind, in the operations errors name.
const WHAT: &str = "tombstone";

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn names_are_readable_when_they_can_be() {
        assert_eq!(name_for("42"), "tombstone-42");
        assert_eq!(name_for("job-7.b"), "tombstone-job-7.b");
        let hashed = name_for("Job 42/ä");
        assert!(hashed.starts_with("tombstone-"), "{hashed}");
        assert_eq!(hashed.len(), "tombstone-".len() + 40);
        assert_ne!(name_for("A"), name_for("B"));
        assert_eq!(name_for("A"), name_for("A"));
    }

    #[test]
    fn a_tombstone_survives_the_round_trip() {
        let t = Tombstone::new(
            "42",
            "user asked",
            ts("2026-01-01T00:00:00Z"),
            Duration::from_secs(3600),
        );
        assert_eq!(t.expires_at, ts("2026-01-01T01:00:00Z"));
        let cm = t.to_configmap("ops");
        assert_eq!(cm.metadata.name.as_deref(), Some("tombstone-42"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("ops"));
        assert_eq!(
            cm.metadata.labels.as_ref().unwrap()[COMPONENT],
            COMPONENT_TOMBSTONE
        );
        assert_eq!(Tombstone::from_configmap(&cm, Duration::from_secs(1)), t);
    }

    #[test]
    fn expiry_is_inclusive() {
        let t = Tombstone::new(
            "1",
            "r",
            ts("2026-01-01T00:00:00Z"),
            Duration::from_secs(60),
        );
        assert!(!t.is_expired(ts("2026-01-01T00:00:59Z")));
        assert!(t.is_expired(ts("2026-01-01T00:01:00Z")));
    }

    #[test]
    fn an_unreadable_tombstone_still_cancels_until_it_is_old() {
        let mut cm = Tombstone::new(
            "1",
            "r",
            ts("2026-01-01T00:00:00Z"),
            Duration::from_secs(60),
        )
        .to_configmap("ops");
        cm.data = Some(BTreeMap::from([(
            KEY_EXPIRES_AT.to_owned(),
            "soon".to_owned(),
        )]));
        cm.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts("2026-01-01T00:00:00Z")),
        );
        let t = Tombstone::from_configmap(&cm, Duration::from_secs(600));
        assert_eq!(t.reason, "cancelled");
        assert!(!t.is_expired(ts("2026-01-01T00:09:59Z")));
        assert!(t.is_expired(ts("2026-01-01T00:10:00Z")));
    }
}
