//! The capacity view: how many VolcanoJobs managed by volcano-runner are active, for the optional
//! cluster-wide `max_active_jobs` cap.
//!
//! The count comes from a watch of the VolcanoJobs that match `[cluster] managed_selector`, in every
//! namespace. Only a key and an "active" flag are kept per job, so 10,000 jobs cost a few hundred KiB.
//! A job is active until its Volcano phase is terminal (`Completed`, `Failed`, `Terminated`, `Aborted`)
//! or it is being deleted.
//!
//! A watch lags behind our own creates by a moment, and several handlers of one runner may be creating
//! jobs at the same instant. So a handler *reserves* a slot before it applies a job
//! ([`SubmitGate::try_reserve`](super::SubmitGate::try_reserve)) and *commits* it with the job's name
//! after the create; a committed job counts at once, until the watch reports it. Within one runner the
//! cap is exact. Across runners each runner counts the others' jobs as soon as its watch sees them, so
//! the cap can be overshot by the submissions that were being applied on other runners in the same
//! instant (at most their in-flight limit); it is a soft cap across runners.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams};
use kube::core::ApiResource;
use kube::runtime::watcher::Event;
use tokio::time::Instant;

use super::ClusterConfig;
use super::error::{ClusterError, KubeResultExt};
use super::retry::RetryPolicy;

/// Volcano phases after which a job holds no resources.
const TERMINAL_PHASES: [&str; 4] = ["Completed", "Failed", "Terminated", "Aborted"];

/// How long a committed job counts without the watch having seen it. Longer than any watch lag; a job
/// that was created and deleted before the watch saw it stops counting after this.
pub(crate) const PENDING_GRACE: Duration = Duration::from_secs(120);

/// `batch.volcano.sh/v1alpha1` `Job` (plural `jobs`), as an untyped resource.
pub fn volcano_job_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("batch.volcano.sh", "v1alpha1", "Job"),
        "jobs",
    )
}

/// Whether a VolcanoJob still occupies capacity.
pub fn is_active(job: &DynamicObject) -> bool {
    if job.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let phase = job.data["status"]["state"]["phase"].as_str();
    !phase.is_some_and(|p| TERMINAL_PHASES.contains(&p))
}

/// `namespace/name` of a job.
pub(crate) type JobKey = (String, String);

pub(crate) fn key_of(job: &DynamicObject) -> JobKey {
    (
        job.metadata.namespace.clone().unwrap_or_default(),
        job.metadata.name.clone().unwrap_or_default(),
    )
}

/// The counting state, fed by watch events and by permits. Pure (time comes in as an argument).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Jobs the watch reported, with their active flag.
    jobs: HashMap<JobKey, bool>,
    /// How many of `jobs` are active, kept up to date on every change so an event costs O(1), not a
    /// recount (10,000 jobs listed at start would otherwise cost 10,000 recounts).
    active_seen: usize,
    /// The listing in progress after an `Init` (replaces `jobs` at `InitDone`).
    listing: Option<HashMap<JobKey, bool>>,
    /// Jobs committed by a permit that the watch has not reported yet, with when.
    pending: HashMap<JobKey, Instant>,
    /// Slots reserved by handlers that are applying a job now.
    pub(crate) reserved: usize,
    /// Whether a full listing has completed at least once.
    synced: bool,
}

impl Counts {
    /// Applies a watch event.
    pub(crate) fn observe(&mut self, event: Event<DynamicObject>) {
        match event {
            Event::Init => self.listing = Some(HashMap::new()),
            Event::InitApply(job) => {
                let key = key_of(&job);
                self.pending.remove(&key);
                self.listing
                    .get_or_insert_with(HashMap::new)
                    .insert(key, is_active(&job));
            }
            Event::InitDone => {
                self.jobs = self.listing.take().unwrap_or_default();
                self.active_seen = self.jobs.values().filter(|active| **active).count();
                self.synced = true;
            }
            Event::Apply(job) => {
                let key = key_of(&job);
                self.pending.remove(&key);
                let active = is_active(&job);
                if self.jobs.insert(key, active) == Some(true) {
                    self.active_seen -= 1;
                }
                if active {
                    self.active_seen += 1;
                }
            }
            Event::Delete(job) => {
                let key = key_of(&job);
                self.pending.remove(&key);
                if self.jobs.remove(&key) == Some(true) {
                    self.active_seen -= 1;
                }
            }
        }
    }

    /// Counts a job this runner has just created.
    pub(crate) fn commit(&mut self, key: JobKey, now: Instant) {
        if !self.jobs.contains_key(&key) {
            self.pending.insert(key, now);
        }
    }

    /// Active jobs at `now`, or `None` before the first full listing.
    pub(crate) fn active(&mut self, now: Instant) -> Option<usize> {
        self.pending
            .retain(|_, since| now.saturating_duration_since(*since) < PENDING_GRACE);
        if !self.synced {
            return None;
        }
        let unseen = self
            .pending
            .keys()
            .filter(|k| !self.jobs.contains_key(*k))
            .count();
        Some(self.active_seen + unseen)
    }
}

/// Counts active managed VolcanoJobs with one list (for `admin status`; runners use the watch).
pub async fn count_active(
    client: &kube::Client,
    config: &ClusterConfig,
) -> Result<usize, ClusterError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &volcano_job_resource());
    let params = ListParams::default().labels(&config.managed_selector);
    let op = "list VolcanoJobs for the capacity count".to_owned();
    let list = RetryPolicy::from_config(config)
        .run(&op, || async {
            api.list(&params).await.classify(|| op.clone())
        })
        .await?;
    Ok(list.items.iter().filter(|j| is_active(j)).count())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job(ns: &str, name: &str, phase: Option<&str>) -> DynamicObject {
        let mut job = DynamicObject::new(name, &volcano_job_resource()).within(ns);
        if let Some(phase) = phase {
            job.data = json!({"status": {"state": {"phase": phase}}});
        }
        job
    }

    #[test]
    fn terminal_and_deleted_jobs_are_not_active() {
        assert!(is_active(&job("a", "j-1", None)));
        assert!(is_active(&job("a", "j-1", Some("Pending"))));
        assert!(is_active(&job("a", "j-1", Some("Running"))));
        assert!(is_active(&job("a", "j-1", Some("Terminating"))));
        for phase in TERMINAL_PHASES {
            assert!(!is_active(&job("a", "j-1", Some(phase))), "{phase}");
        }
        let mut deleting = job("a", "j-1", Some("Running"));
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert!(!is_active(&deleting));
    }

    #[test]
    fn nothing_is_known_before_the_first_listing() {
        let mut c = Counts::default();
        let now = Instant::now();
        assert_eq!(c.active(now), None);
        c.observe(Event::Init);
        c.observe(Event::InitApply(job("a", "j-1", Some("Running"))));
        assert_eq!(c.active(now), None);
        c.observe(Event::InitDone);
        assert_eq!(c.active(now), Some(1));
    }

    #[test]
    fn events_move_the_count() {
        let mut c = Counts::default();
        let now = Instant::now();
        c.observe(Event::Init);
        c.observe(Event::InitDone);
        assert_eq!(c.active(now), Some(0));
        c.observe(Event::Apply(job("a", "j-1", None)));
        c.observe(Event::Apply(job("b", "j-1", Some("Running"))));
        assert_eq!(c.active(now), Some(2));
        c.observe(Event::Apply(job("a", "j-1", Some("Completed"))));
        assert_eq!(c.active(now), Some(1));
        c.observe(Event::Delete(job("b", "j-1", Some("Running"))));
        assert_eq!(c.active(now), Some(0));
    }

    #[test]
    fn repeated_updates_of_one_job_count_it_once() {
        let mut c = Counts::default();
        let now = Instant::now();
        c.observe(Event::Init);
        c.observe(Event::InitDone);
        for _ in 0..3 {
            c.observe(Event::Apply(job("a", "j-1", Some("Running"))));
        }
        assert_eq!(c.active(now), Some(1));
        c.observe(Event::Apply(job("a", "j-1", Some("Failed"))));
        c.observe(Event::Apply(job("a", "j-1", Some("Failed"))));
        assert_eq!(c.active(now), Some(0));
        c.observe(Event::Delete(job("a", "j-1", Some("Failed"))));
        c.observe(Event::Delete(job("a", "never-seen", None)));
        assert_eq!(c.active(now), Some(0));
    }

    #[test]
    fn a_relist_replaces_what_was_known() {
        let mut c = Counts::default();
        let now = Instant::now();
        c.observe(Event::Init);
        c.observe(Event::InitApply(job("a", "gone", None)));
        c.observe(Event::InitDone);
        c.observe(Event::Init);
        // While the new listing runs the old count stands.
        assert_eq!(c.active(now), Some(1));
        c.observe(Event::InitApply(job("a", "new", None)));
        c.observe(Event::InitApply(job("a", "new2", None)));
        c.observe(Event::InitDone);
        assert_eq!(c.active(now), Some(2));
    }

    #[test]
    fn committed_jobs_count_until_seen_or_stale() {
        let mut c = Counts::default();
        let start = Instant::now();
        c.observe(Event::Init);
        c.observe(Event::InitDone);
        c.commit(("a".into(), "j-1".into()), start);
        c.commit(("a".into(), "j-2".into()), start);
        assert_eq!(c.active(start), Some(2));
        // The watch reports j-1: it is counted once, not twice.
        c.observe(Event::Apply(job("a", "j-1", None)));
        assert_eq!(c.active(start), Some(2));
        // j-2 is never reported (created and deleted before the watch saw it): it stops counting.
        assert_eq!(c.active(start + PENDING_GRACE), Some(1));
    }
}
