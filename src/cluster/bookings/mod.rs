//! Booked starts: one ConfigMap in the runner's namespace (`[bookings] configmap`, default
//! `volcano-runner-bookings`) holds every booking, as JSON under the key `bookings`. Every change is a
//! read, a decision ([`decide`]) and a write conditional on the `resourceVersion` read, so two runners
//! booking the last capacity at the same instant cannot both win: the second's write conflicts, it
//! reads again, and decides against the first's booking (refused, with the next window).
//!
//! What a booking sets aside is kept by node marks: every node a booking has a rank on carries the
//! taint `<prefix>booked=<latest end ms>:NoSchedule` until its bookings' end, which only booked jobs
//! tolerate, and the label `<prefix>booked-<jobId>=yes` per booking, which the booked job's pods select
//! (the submit path renders the toleration and the selector). A waiting job is therefore never placed
//! on a booked node, whatever its allocation, and a booked job only on its own booked nodes; running
//! jobs stay (they were counted until their expiry when the booking was decided). The taints are written from the record alone ([`Bookings::sync_taints`]),
//! so whoever writes next puts right what a runner killed half-way left.
//!
//! The decision reads the cluster afresh each time (nodes, bound pods, the managed jobs' expiries):
//! never a cache, because a cache behind by a second could promise capacity a pod has just taken.

pub mod decide;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Taint};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::Deserialize;

use super::ClusterConfig;
use super::error::{ClusterError, KubeResultExt};
use super::labels::{COMPONENT, FIELD_MANAGER, MANAGED_BY, MANAGER};
use super::records::ConfigMapRecords;
use crate::durable::AnnotationKeys;
use crate::durable::annotations::parse_millis;
use crate::volcano::{LABEL_JOB_NAME, VolcanoJob};

pub use decide::{Amount, Answer, BookedRank, Booking, Holding, Limits, NodeRoom, Request};

/// `app.kubernetes.io/component` of the bookings' ConfigMap.
pub const COMPONENT_BOOKINGS: &str = "bookings";
/// The key of the ConfigMap's data that holds the bookings.
const KEY_BOOKINGS: &str = "bookings";
/// What the record is called in errors.
const WHAT: &str = "bookings";
/// How often the nodes are listed and written again after a conflict.
const TAINT_ROUNDS: usize = 5;
/// How often a booking is decided again when a pod took its room before its taints were written.
const CHECK_ATTEMPTS: usize = 3;
/// The effect of a booking's taint: nothing new is placed, nothing running is evicted.
pub const TAINT_EFFECT: &str = "NoSchedule";

mod duration {
    pub use jiff::fmt::serde::unsigned_duration::friendly::compact::required;
}

/// The `[bookings]` section: how far ahead and how much of the cluster may be booked.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BookingsConfig {
    /// Whether submissions with a start window are booked. Off: they are refused (`booking_refused`)
    /// naming this key, never run at another time than asked.
    pub enabled: bool,
    /// How far ahead of now a booked start may lie. The further ahead, the longer the capacity is kept
    /// from the jobs that would otherwise use it in between.
    #[serde(with = "duration::required")]
    pub horizon: Duration,
    /// The share (0 to 1) of the cluster's CPU and GPUs that all bookings overlapping one another may
    /// set aside together: the rest stays for the queue.
    pub max_share: f64,
    /// The same share for the bookings of one owner (a user, or a project): one class cannot take
    /// everything bookable.
    pub max_share_per_owner: f64,
    /// The ConfigMap (in `[cluster] namespace`) that holds every booking.
    pub configmap: String,
    /// How often every runner drops the bookings that are over and puts the booked nodes' taints right
    /// (a booking's taints go within this of its end).
    #[serde(with = "duration::required")]
    pub check_interval: Duration,
}

impl Default for BookingsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            horizon: Duration::from_secs(14 * 24 * 3600),
            max_share: 0.5,
            max_share_per_owner: 0.25,
            configmap: "volcano-runner-bookings".to_owned(),
            check_interval: Duration::from_secs(30),
        }
    }
}

/// A `[bookings]` value out of range: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct BookingsConfigError {
    pub key: String,
    pub reason: String,
}

impl BookingsConfig {
    /// Shares are fractions of the cluster; a horizon must leave room to book.
    pub fn validate(&self) -> Result<(), BookingsConfigError> {
        let bad = |key: &str, reason: &str| BookingsConfigError {
            key: format!("bookings.{key}"),
            reason: reason.to_owned(),
        };
        for (key, v) in [
            ("max_share", self.max_share),
            ("max_share_per_owner", self.max_share_per_owner),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(bad(key, "must be a share above 0 and at most 1"));
            }
        }
        if self.check_interval.is_zero() {
            return Err(bad("check_interval", "must be longer than 0"));
        }
        if self.horizon.is_zero() {
            return Err(bad("horizon", "must be longer than 0"));
        }
        if self.configmap.trim().is_empty() {
            return Err(bad("configmap", "must name a ConfigMap"));
        }
        Ok(())
    }

    /// The decision's bounds.
    pub fn limits(&self) -> Limits {
        Limits {
            horizon: SignedDuration::try_from(self.horizon).unwrap_or(SignedDuration::MAX),
            max_share: self.max_share,
            max_share_per_owner: self.max_share_per_owner,
        }
    }
}

/// The taint on every booked node, `<prefix>booked`, valued with the latest end of its bookings (ms):
/// only booked jobs tolerate it, so no other job is placed there, and the forecast reads from it until
/// when.
pub fn taint_key(keys: &AnnotationKeys) -> String {
    format!("{}booked", keys.prefix)
}

/// The label that marks a booking's nodes, `<prefix>booked-<jobId>=yes`: the booked job's pods select
/// it (`nodeSelector`), so they go only where their own room is set aside. A label, not a node name,
/// because a booking moved to other nodes moves its labels, while a job's pod template cannot change.
pub fn label_key(keys: &AnnotationKeys, job_id: &str) -> String {
    format!("{}booked-{job_id}", keys.prefix)
}

/// The value of [`label_key`].
pub const LABEL_VALUE: &str = "yes";

/// Until when a node is booked, from its taint.
pub fn booked_until(keys: &AnnotationKeys, taints: &[Taint]) -> Option<Timestamp> {
    let key = taint_key(keys);
    let t = taints.iter().find(|t| t.key == key)?;
    parse_millis(t.value.as_deref()?)
}

/// Whether `key` is a booking's label.
fn is_booking_label(keys: &AnnotationKeys, key: &str) -> bool {
    key.starts_with(&format!("{}booked-", keys.prefix))
}

/// The bookings in a ConfigMap's data; a record that cannot be read counts as none but says so in the
/// error, so that no runner overwrites what it cannot read.
fn read_record(cm: &ConfigMap) -> Result<Vec<Booking>, String> {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(KEY_BOOKINGS)) else {
        return Ok(Vec::new());
    };
    serde_json::from_str(text).map_err(|e| format!("the bookings record is not readable: {e}"))
}

/// What a change of the record does.
enum Change {
    /// Add (or keep, for a redelivery) this booking.
    Book(Request),
    /// Remove the job's booking.
    Cancel(String),
    /// Drop what is over; move (or drop) what a lost node or a maintenance window broke.
    Tidy,
}

/// The cluster as a decision reads it.
struct Seen {
    rooms: Vec<NodeRoom>,
    holdings: Vec<Holding>,
    windows: Vec<super::Window>,
    /// The nodes that exist and are not cordoned.
    present: BTreeSet<String>,
}

impl Seen {
    fn inputs<'a>(
        &'a self,
        all: &'a [Booking],
        limits: Limits,
        now: Timestamp,
    ) -> decide::Inputs<'a> {
        decide::Inputs {
            nodes: &self.rooms,
            holdings: &self.holdings,
            bookings: all,
            windows: &self.windows,
            limits,
            now,
        }
    }

    /// Why `booking`'s room went, if it did: a node of it gone or cordoned, or a maintenance window
    /// over one of its nodes during it.
    fn broken(&self, booking: &Booking) -> Option<String> {
        let mut nodes = booking.nodes();
        nodes.dedup();
        if let Some(gone) = nodes.iter().find(|n| !self.present.contains(*n)) {
            return Some(format!("node {gone} was lost or cordoned"));
        }
        self.windows
            .iter()
            .find(|w| w.overlaps(booking.start, booking.end) && nodes.iter().any(|n| w.covers(n)))
            .map(|w| {
                format!(
                    "the maintenance window {} takes its node away",
                    w.describe()
                )
            })
    }
}

/// What a change of the record answers.
enum Outcome {
    Nothing,
    Answer(Answer),
    Fates(Vec<Fate>),
}

/// What became of a booking whose room went (its node lost or cordoned, a maintenance window forced over
/// it), found by [`Bookings::tidy`].
#[derive(Debug, Clone, PartialEq)]
pub enum Fate {
    /// Booked again at the same start, on other room.
    Moved {
        old: Booking,
        new: Booking,
        why: String,
    },
    /// No other room at its start: removed from the record.
    Cancelled { old: Booking, why: String },
}

/// The bookings' record and the taints that keep its capacity free.
#[derive(Clone)]
pub struct Bookings {
    records: ConfigMapRecords,
    client: kube::Client,
    name: String,
    keys: AnnotationKeys,
    managed_selector: String,
    limits: Limits,
    windows: super::MaintenanceWindows,
}

impl std::fmt::Debug for Bookings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bookings")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Bookings {
    /// The record `config.configmap` in `cluster.namespace`.
    pub fn new(
        client: kube::Client,
        cluster: &ClusterConfig,
        config: &BookingsConfig,
        keys: &AnnotationKeys,
    ) -> Self {
        Self {
            records: ConfigMapRecords::new(client.clone(), cluster),
            client: client.clone(),
            name: config.configmap.clone(),
            keys: keys.clone(),
            managed_selector: cluster.managed_selector.clone(),
            limits: config.limits(),
            windows: super::MaintenanceWindows::new(client.clone(), cluster),
        }
    }

    /// Every booking, as the record holds it now.
    pub async fn list(&self) -> Result<Vec<Booking>, ClusterError> {
        let cm = self.records.get(WHAT, &self.name).await?;
        match cm {
            None => Ok(Vec::new()),
            Some(cm) => read_record(&cm).map_err(|m| self.unreadable(m)),
        }
    }

    /// Books `request`, or says why not and when instead. A redelivery of the same submission finds
    /// its booking and gets the same answer. The taints of the booked nodes are written before the
    /// answer is given.
    pub async fn book(
        &self,
        request: &Request,
        now: impl Fn() -> Timestamp,
    ) -> Result<Answer, ClusterError> {
        let op = self.records.op("book", WHAT, &self.name);
        let change = Change::Book(request.clone());
        for _ in 0..CHECK_ATTEMPTS {
            let (outcome, all) = self
                .records
                .retry()
                .run(&op, || self.change_once(&change, now()))
                .await?;
            self.sync_taints(&all, now()).await?;
            let booking = match outcome {
                Outcome::Answer(Answer::Booked(booking)) => booking,
                Outcome::Answer(refused) => return Ok(refused),
                _ => unreachable!("a booking change answers"),
            };
            // A pod bound between the decision and the taint is counted now; where it took the room,
            // the booking goes and is decided again.
            if self.still_fits(&booking, &all, now()).await? {
                return Ok(Answer::Booked(booking));
            }
            tracing::info!(job_id = %booking.job_id, "A pod took a booking's room before its taint: deciding again.");
            self.cancel(&booking.job_id, now()).await?;
        }
        Err(ClusterError::Conflict {
            op,
            message: "the booked room was taken before its taints were written, every time".into(),
        })
    }

    async fn still_fits(
        &self,
        booking: &Booking,
        all: &[Booking],
        now: Timestamp,
    ) -> Result<bool, ClusterError> {
        let seen = self.read_cluster(now).await?;
        Ok(decide::still_fits(
            booking,
            seen.inputs(all, self.limits, now),
        ))
    }

    /// Removes the job's booking, if it has one: its capacity is free at once (its taints go before
    /// this returns). Returns the booking removed.
    pub async fn cancel(
        &self,
        job_id: &str,
        now: Timestamp,
    ) -> Result<Option<Booking>, ClusterError> {
        let before = self.list().await?;
        let Some(found) = before.iter().find(|b| b.job_id == job_id).cloned() else {
            return Ok(None);
        };
        let op = self.records.op("cancel a booking in", WHAT, &self.name);
        let change = Change::Cancel(job_id.to_owned());
        let (_, all) = self
            .records
            .retry()
            .run(&op, || self.change_once(&change, now))
            .await?;
        self.sync_taints(&all, now).await?;
        Ok(Some(found))
    }

    /// Drops the bookings that are over from the record, moves to other room at the same start (or
    /// removes) those whose room went: a node gone or cordoned, a maintenance window over it (scheduled
    /// with `--force`); then puts the nodes' taints right. Run by every runner every
    /// `[bookings] check_interval`, so that a booking's taints go at its end even when nobody books or
    /// cancels, and what a runner killed half-way left is finished. Returns what became of the broken
    /// bookings, for their users to be told; only the runner whose write took them returns them.
    pub async fn tidy(&self, now: Timestamp) -> Result<Vec<Fate>, ClusterError> {
        let op = self.records.op("tidy", WHAT, &self.name);
        let (outcome, all) = self
            .records
            .retry()
            .run(&op, || self.change_once(&Change::Tidy, now))
            .await?;
        self.sync_taints(&all, now).await?;
        Ok(match outcome {
            Outcome::Fates(fates) => fates,
            _ => Vec::new(),
        })
    }

    /// One read, decision and conditional write. A conflict (another runner wrote meanwhile) is an
    /// error the retry policy tries again, from a new read.
    async fn change_once(
        &self,
        change: &Change,
        now: Timestamp,
    ) -> Result<(Outcome, Vec<Booking>), ClusterError> {
        let cm = self
            .records
            .api()
            .get_opt(&self.name)
            .await
            .classify(|| self.records.op("get", WHAT, &self.name))?;
        let mut all = match &cm {
            Some(cm) => read_record(cm).map_err(|m| self.unreadable(m))?,
            None => Vec::new(),
        };
        let version = cm
            .as_ref()
            .and_then(|c| c.metadata.resource_version.clone());
        let before = all.clone();
        // What is over sets nothing aside any more.
        all.retain(|b| b.end > now);
        let outcome = match change {
            Change::Cancel(job_id) => {
                all.retain(|b| &b.job_id != job_id);
                Outcome::Nothing
            }
            Change::Tidy => Outcome::Fates(self.rebook_broken(&mut all, now).await?),
            Change::Book(request) => {
                if let Some(mine) = all
                    .iter()
                    .find(|b| b.job_id == request.job_id && b.fingerprint == request.fingerprint)
                {
                    return Ok((Outcome::Answer(Answer::Booked(mine.clone())), all));
                }
                let seen = self.read_cluster(now).await?;
                let answer = decide::decide(request, seen.inputs(&all, self.limits, now));
                if let Answer::Booked(b) = &answer {
                    all.retain(|o| o.job_id != request.job_id);
                    all.push(b.clone());
                }
                Outcome::Answer(answer)
            }
        };
        if all != before {
            self.write(&all, version).await?;
        }
        Ok((outcome, all))
    }

    /// Moves or removes, in `all`, the bookings not started whose room went.
    async fn rebook_broken(
        &self,
        all: &mut Vec<Booking>,
        now: Timestamp,
    ) -> Result<Vec<Fate>, ClusterError> {
        if !all.iter().any(|b| b.start > now) {
            return Ok(Vec::new());
        }
        let seen = self.read_cluster(now).await?;
        let waiting: Vec<Booking> = all.iter().filter(|b| b.start > now).cloned().collect();
        let mut fates = Vec::new();
        for b in waiting {
            let Some(why) = seen.broken(&b) else {
                continue;
            };
            all.retain(|o| o.job_id != b.job_id);
            let again = Request {
                job_id: b.job_id.clone(),
                owner: b.owner.clone(),
                fingerprint: b.fingerprint.clone(),
                earliest: b.start,
                latest: b.start,
                runs_for: b.end.duration_since(b.start),
                replicas: u32::try_from(b.ranks.len()).unwrap_or(u32::MAX),
                per_rank: b.ranks.first().map(|r| r.amount).unwrap_or_default(),
            };
            match decide::decide(&again, seen.inputs(all, self.limits, now)) {
                Answer::Booked(new) => {
                    all.push(new.clone());
                    fates.push(Fate::Moved { old: b, new, why });
                }
                Answer::Refused { why: none, .. } => fates.push(Fate::Cancelled {
                    old: b,
                    why: format!("{why}, and no other room at its start: {none}"),
                }),
            }
        }
        Ok(fates)
    }

    /// Writes the record: a create when there was none, else a replace conditional on `version`.
    async fn write(&self, all: &[Booking], version: Option<String>) -> Result<(), ClusterError> {
        let mut sorted = all.to_vec();
        sorted.sort_by(|a, b| (a.start, &a.job_id).cmp(&(b.start, &b.job_id)));
        let text = serde_json::to_string(&sorted).unwrap_or_else(|_| "[]".into());
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.records.namespace().to_owned()),
                resource_version: version.clone(),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    (COMPONENT.to_owned(), COMPONENT_BOOKINGS.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(KEY_BOOKINGS.to_owned(), text)])),
            ..ConfigMap::default()
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let op = || self.records.op("write", WHAT, &self.name);
        let api = self.records.api();
        match version {
            Some(_) => api.replace(&self.name, &params, &cm).await.classify(op)?,
            None => match api.create(&params, &cm).await.classify(op) {
                // Another runner made the record first: read it and decide again.
                Err(e) if e.is_already_exists() => {
                    return Err(ClusterError::Conflict {
                        op: op(),
                        message: "created concurrently".into(),
                    });
                }
                other => other?,
            },
        };
        Ok(())
    }

    fn unreadable(&self, message: String) -> ClusterError {
        ClusterError::Internal {
            op: self.records.op("read", WHAT, &self.name),
            message,
        }
    }

    /// The nodes, what holds them until when, and the maintenance windows: read now, from the API.
    async fn read_cluster(&self, now: Timestamp) -> Result<Seen, ClusterError> {
        let list = ListParams::default();
        let managed = ListParams::default().labels(&self.managed_selector);
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&list)
            .await
            .classify(|| "list nodes (bookings)".to_owned())?;
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&list)
            .await
            .classify(|| "list pods (bookings)".to_owned())?;
        let jobs = Api::<VolcanoJob>::all(self.client.clone())
            .list(&managed)
            .await
            .classify(|| "list jobs (bookings)".to_owned())?;
        let (windows, _) = self.windows.list().await?;
        let rooms = nodes
            .items
            .iter()
            .filter_map(|n| bookable(n, &self.keys))
            .collect();
        let present = nodes
            .items
            .iter()
            .filter(|n| {
                !n.spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false)
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        Ok(Seen {
            rooms,
            holdings: holdings(&pods.items, &jobs.items, &self.keys, now),
            windows,
            present,
        })
    }

    /// Marks every node as the bookings not over at `now` want it: the taint [`taint_key`] while any
    /// booking has a rank there, the label [`label_key`] of each such booking; and takes off what a
    /// booking over or gone left. Each node is written conditional on the version listed; after a
    /// conflict the nodes are listed again (a list, not a get: the runner's grant on nodes is list,
    /// watch and patch).
    pub async fn sync_taints(&self, all: &[Booking], now: Timestamp) -> Result<(), ClusterError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        for _ in 0..TAINT_ROUNDS {
            let nodes = api
                .list(&ListParams::default())
                .await
                .classify(|| "list nodes (booking taints)".to_owned())?;
            let mut conflicted = false;
            for node in &nodes.items {
                let Some(mut patch) = wanted_marks(node, all, &self.keys, now) else {
                    continue;
                };
                let name = node.metadata.name.clone().unwrap_or_default();
                patch["metadata"]["resourceVersion"] =
                    serde_json::json!(node.metadata.resource_version);
                match api
                    .patch(&name, &params, &Patch::Merge(&patch))
                    .await
                    .classify(|| format!("patch nodes {name} (booking taints)"))
                {
                    Ok(_) => {}
                    Err(e) if e.is_conflict() => conflicted = true,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
            if !conflicted {
                return Ok(());
            }
        }
        Err(ClusterError::Conflict {
            op: "patch nodes (booking taints)".into(),
            message: "the nodes kept changing while the bookings' taints were written".into(),
        })
    }
}

/// The merge patch that marks `node` as `all` wants it (its taints whole, its booking labels set or
/// removed); `None` when it is so already.
fn wanted_marks(
    node: &Node,
    all: &[Booking],
    keys: &AnnotationKeys,
    now: Timestamp,
) -> Option<serde_json::Value> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let mine: Vec<&Booking> = all
        .iter()
        .filter(|b| b.end > now && b.ranks.iter().any(|r| r.node == name))
        .collect();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let key = taint_key(keys);
    let wanted_taint = mine
        .iter()
        .map(|b| b.end)
        .max()
        .map(|end| end.as_millisecond().to_string());
    let have_taint = taints
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.value.clone().unwrap_or_default());
    let wanted_labels: BTreeSet<String> = mine.iter().map(|b| label_key(keys, &b.job_id)).collect();
    let have_labels: BTreeSet<String> = node
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| is_booking_label(keys, k))
        .map(|(k, _)| k.clone())
        .collect();
    if wanted_taint == have_taint && wanted_labels == have_labels {
        return None;
    }
    let mut out: Vec<Taint> = taints.into_iter().filter(|t| t.key != key).collect();
    out.extend(wanted_taint.map(|value| Taint {
        key: key.clone(),
        value: Some(value),
        effect: TAINT_EFFECT.to_owned(),
        time_added: None,
    }));
    let mut labels = serde_json::Map::new();
    for gone in have_labels.difference(&wanted_labels) {
        labels.insert(gone.clone(), serde_json::Value::Null);
    }
    for new in &wanted_labels {
        labels.insert(new.clone(), serde_json::json!(LABEL_VALUE));
    }
    Some(serde_json::json!({"metadata": {"labels": labels}, "spec": {"taints": out}}))
}

/// A node a booked job could be placed on: schedulable, and without a taint that keeps new pods off
/// but the bookings'.
fn bookable(node: &Node, keys: &AnnotationKeys) -> Option<NodeRoom> {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return None;
    }
    let blocked = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|t| (t.effect == "NoSchedule" || t.effect == "NoExecute") && t.key != taint_key(keys));
    if blocked {
        return None;
    }
    let allocatable = node.status.as_ref()?.allocatable.as_ref()?;
    Some(NodeRoom {
        name: node.metadata.name.clone()?,
        allocatable: amount_of(allocatable),
    })
}

/// What every bound pod that has not ended holds, until its job's expiry: a job of ours that has
/// started has one; one bound but not started yet holds until now plus its allocation; anything else
/// (no limit, or not our job) for good.
fn holdings(
    pods: &[Pod],
    jobs: &[VolcanoJob],
    keys: &AnnotationKeys,
    now: Timestamp,
) -> Vec<Holding> {
    let by_name: BTreeMap<(String, String), &VolcanoJob> = jobs
        .iter()
        .map(|j| {
            (
                (
                    j.metadata.namespace.clone().unwrap_or_default(),
                    j.metadata.name.clone().unwrap_or_default(),
                ),
                j,
            )
        })
        .collect();
    let mut out = Vec::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let job = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_JOB_NAME))
            .and_then(|name| {
                by_name.get(&(
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    name.clone(),
                ))
            });
        let annotation = |key: &str| {
            job.and_then(|j| j.metadata.annotations.as_ref())
                .and_then(|a| a.get(key))
        };
        let until = match annotation(&keys.expiry).and_then(|v| parse_millis(v)) {
            Some(expiry) => Some(expiry),
            None => annotation(&keys.max_time)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .map(|ms| now + SignedDuration::from_millis(ms)),
        };
        let job_id = job
            .and_then(|j| j.metadata.name.as_deref())
            .and_then(|n| n.strip_prefix("j-"))
            .map(str::to_owned);
        out.push(Holding {
            node,
            uses: pod_requests(pod),
            until,
            job_id,
        });
    }
    out
}

/// CPU in millicores, memory in MiB (rounded up) and `nvidia.com/gpu` of a quantity map.
fn amount_of(
    map: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Amount {
    let milli = |name: &str| {
        map.get(name)
            .and_then(|q| crate::quantity::parse_milli(&q.0))
            .unwrap_or(0)
            .max(0)
    };
    let mib: i128 = 1024 * 1024 * 1000;
    Amount {
        cpu_milli: u64::try_from(milli("cpu")).unwrap_or(u64::MAX),
        memory_mib: u64::try_from((milli("memory") + mib - 1) / mib).unwrap_or(u64::MAX),
        gpu: u64::try_from((milli("nvidia.com/gpu") + 999) / 1000).unwrap_or(u64::MAX),
    }
}

/// What a pod's containers request (their limits where a request is missing), added up.
fn pod_requests(pod: &Pod) -> Amount {
    pod.spec.as_ref().map(pod_spec_requests).unwrap_or_default()
}

/// [`pod_requests`] of a pod spec (a job's template, before its pods exist).
pub fn pod_spec_requests(spec: &k8s_openapi::api::core::v1::PodSpec) -> Amount {
    let mut total = Amount::default();
    for c in &spec.containers {
        let mut map = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        if let Some(requests) = c.resources.as_ref().and_then(|r| r.requests.as_ref()) {
            map.extend(requests.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let a = amount_of(&map);
        total.cpu_milli += a.cpu_milli;
        total.memory_mib += a.memory_mib;
        total.gpu += a.gpu;
    }
    total
}

/// The owner a booking's share is counted against: the project, else the user.
pub fn owner_of(user: &str, project: Option<&str>) -> String {
    match project.filter(|p| !p.is_empty()) {
        Some(p) => format!("project {p}"),
        None => format!("user {user}"),
    }
}

/// The nodes named by `all`'s bookings, for a view of them.
pub fn booked_nodes(all: &[Booking]) -> BTreeSet<String> {
    all.iter().flat_map(Booking::nodes).collect()
}

/// The booking an extension of a running job would run into: one of another job on a node the job
/// runs on, that starts before the new expiry and may count on the job's room (it was decided with the
/// job ending by its start). A booking decided while the job ran past its start did not count on it.
pub fn in_the_way<'a>(
    all: &'a [Booking],
    job_id: &str,
    nodes: &BTreeSet<String>,
    old_expiry: Timestamp,
    new_expiry: Timestamp,
) -> Option<&'a Booking> {
    all.iter()
        .filter(|b| b.job_id != job_id)
        .filter(|b| b.start < new_expiry && old_expiry <= b.start)
        .filter(|b| b.ranks.iter().any(|r| nodes.contains(&r.node)))
        .min_by_key(|b| b.start)
}

/// The bookings (not over at `now`) a maintenance window would break: during it, on a node it takes.
/// `admin maintenance schedule` refuses such a window unless forced.
pub fn under_window<'a>(
    all: &'a [Booking],
    window: &super::Window,
    now: Timestamp,
) -> Vec<&'a Booking> {
    all.iter()
        .filter(|b| b.end > now && window.overlaps(b.start, b.end))
        .filter(|b| b.ranks.iter().any(|r| window.covers(&r.node)))
        .collect()
}

/// The nodes `job_id`'s pods are bound to, read now.
pub async fn nodes_of(
    client: &kube::Client,
    namespace: &str,
    job_id: &str,
) -> Result<BTreeSet<String>, ClusterError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{LABEL_JOB_NAME}=j-{job_id}");
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .classify(|| format!("list pods of {namespace}/j-{job_id}"))?;
    Ok(list
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn booking(job: &str, node: &str, start: i64) -> Booking {
        Booking {
            job_id: job.into(),
            owner: "user a".into(),
            fingerprint: "f".into(),
            start: Timestamp::from_second(start).unwrap(),
            end: Timestamp::from_second(start + 3600).unwrap(),
            ranks: vec![BookedRank {
                node: node.into(),
                amount: Amount::default(),
            }],
        }
    }

    /// An extension runs into a booking on its node that starts before the new expiry and counted on
    /// the job ending by then; not into one elsewhere, later, or decided while it ran past the start.
    #[test]
    fn an_extension_runs_into_a_booking_that_counted_on_its_room() {
        let at = |s| Timestamp::from_second(s).unwrap();
        let all = [booking("b", "n1", 1000)];
        let n1 = BTreeSet::from(["n1".to_owned()]);
        let n2 = BTreeSet::from(["n2".to_owned()]);
        assert!(in_the_way(&all, "j", &n1, at(900), at(1100)).is_some());
        assert!(in_the_way(&all, "j", &n2, at(900), at(1100)).is_none());
        assert!(in_the_way(&all, "j", &n1, at(900), at(1000)).is_none());
        assert!(in_the_way(&all, "j", &n1, at(1200), at(1300)).is_none());
        assert!(in_the_way(&all, "b", &n1, at(900), at(1100)).is_none());
    }

    /// A window breaks the bookings during it on its nodes, not those before, after or elsewhere.
    #[test]
    fn a_window_breaks_the_bookings_during_it_on_its_nodes() {
        let at = |s| Timestamp::from_second(s).unwrap();
        let all = [
            booking("during", "n1", 1000),
            booking("elsewhere", "n2", 1000),
            booking("after", "n1", 9000),
        ];
        let w = crate::cluster::Window::new(
            at(1500),
            at(3000),
            ["n1".to_owned()].into(),
            None,
            "op",
            at(0),
        )
        .unwrap();
        let broken: Vec<&str> = under_window(&all, &w, at(0))
            .iter()
            .map(|b| b.job_id.as_str())
            .collect();
        assert_eq!(broken, ["during"]);
        assert!(under_window(&all, &w, at(5000)).is_empty(), "over by then");
    }

    /// Only the bookings' taint and labels change, and only when they differ from what the record
    /// wants; a booking over takes both off.
    #[test]
    fn marks_follow_the_record() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![Taint {
                key: "ucloud.dk/maintenance".into(),
                value: Some("w".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        });
        let now = Timestamp::from_second(0).unwrap();
        let all = [booking("b", "n1", 1000), booking("c", "n1", 2000)];
        let patch = wanted_marks(&node, &all, &keys, now).expect("a change");
        assert_eq!(
            patch["spec"]["taints"],
            serde_json::json!([
                {"key": "ucloud.dk/maintenance", "value": "w", "effect": "NoSchedule"},
                {"key": "ucloud.dk/booked", "value": "5600000", "effect": "NoSchedule"},
            ])
        );
        assert_eq!(
            patch["metadata"]["labels"],
            serde_json::json!({"ucloud.dk/booked-b": "yes", "ucloud.dk/booked-c": "yes"})
        );
        let patched: Node = {
            let mut n = serde_json::to_value(&node).unwrap();
            n["spec"]["taints"] = patch["spec"]["taints"].clone();
            n["metadata"]["labels"] = patch["metadata"]["labels"].clone();
            serde_json::from_value(n).unwrap()
        };
        assert_eq!(wanted_marks(&patched, &all, &keys, now), None);
        assert_eq!(
            booked_until(
                &keys,
                patched.spec.as_ref().unwrap().taints.as_ref().unwrap()
            ),
            Some(Timestamp::from_second(5600).unwrap())
        );
        let over = Timestamp::from_second(9000).unwrap();
        let patch = wanted_marks(&patched, &all, &keys, over).expect("the bookings are over");
        assert_eq!(patch["spec"]["taints"].as_array().unwrap().len(), 1);
        assert_eq!(
            patch["metadata"]["labels"],
            serde_json::json!({"ucloud.dk/booked-b": null, "ucloud.dk/booked-c": null})
        );
    }
}
