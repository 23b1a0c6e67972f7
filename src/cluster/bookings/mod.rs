//! Booked starts: one ConfigMap in the runner's namespace (`[bookings] configmap`, default
//! `volcano-runner-bookings`) holds every booking, as JSON under the key `bookings`. Every change is a
//! read, a decision ([`decide`]) and a write conditional on the `resourceVersion` read, so two runners
//! booking the last capacity at the same instant cannot both win: the second's write conflicts, it
//! reads again, and decides against the first's booking (refused, with the next window).
//!
//! What a booking sets aside is kept by node marks: every node a booking has a rank on carries the
//! taint `<prefix>booked=<until>_<from>_<cutoff>:NoSchedule` ([`BookedTaint`]) until its bookings'
//! end (or their jobs'), which booked jobs tolerate, and the label `<prefix>booked-<jobId>=yes` per
//! booking, which the booked job's pods select (the submit path renders the toleration and the
//! selector). A waiting job is placed on a booked node only when it is let on just in time
//! ([`Bookings::admit_just_in_time`]: it ends before the node's first booked start), and a booked job
//! only on its own booked nodes; running jobs stay (they were counted until their expiry when the
//! booking was decided). The marks are written from the record alone ([`Bookings::sync_taints`]), so
//! whoever writes next puts right what a runner killed half-way left; so is the news of what became of
//! a booking ([`News`]), told by whoever finds it untold.
//!
//! The decision reads the cluster afresh each time (nodes, bound pods, the managed jobs' expiries):
//! never a cache, because a cache behind by a second could promise capacity a pod has just taken.

pub mod decide;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Taint, Toleration};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};

use super::ClusterConfig;
use super::error::{ClusterError, KubeResultExt};
use super::labels::{COMPONENT, FIELD_MANAGER, MANAGED_BY, MANAGER};
use super::records::ConfigMapRecords;
use crate::durable::AnnotationKeys;
use crate::durable::annotations::parse_millis;
use crate::interval::Span;
use crate::volcano::{LABEL_JOB_NAME, VolcanoJob, job_of_pod};

pub use decide::{Amount, Answer, BookedRank, Booking, Holding, Limits, NodeRoom, Request};

/// `app.kubernetes.io/component` of the bookings' ConfigMap.
pub const COMPONENT_BOOKINGS: &str = "bookings";
/// The key of the ConfigMap's data that holds the bookings.
const KEY_BOOKINGS: &str = "bookings";
/// The key of the ConfigMap's data that holds the news not told yet ([`News`]).
const KEY_NEWS: &str = "news";
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

/// What a booked node's taint says, as its value `<until>_<from>_<cutoff>` (epoch ms each, a valid
/// taint value): until when the node is booked (the latest end of its bookings: the forecast holds
/// the node's free room until then), from when (the earliest start of its bookings not over), and until
/// when a job let onto it just in time may still be placed ([`Bookings::admit_just_in_time`]). The
/// cutoff moves on every [`Bookings`] admission step, and with it the value, so a toleration of an
/// older value no longer lets a pod onto the node: a job let on is placed by the cutoff or not at all,
/// and ends by its allocation after it, before `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookedTaint {
    pub until: Timestamp,
    pub from: Timestamp,
    pub cutoff: Timestamp,
}

impl BookedTaint {
    /// The taint's value.
    pub fn value(&self) -> String {
        format!(
            "{}_{}_{}",
            self.until.as_millisecond(),
            self.from.as_millisecond(),
            self.cutoff.as_millisecond()
        )
    }

    /// A value read back; a bare `<until>` (written by an older runner) admits nobody early.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.split('_');
        let until = parse_millis(parts.next()?)?;
        let (from, cutoff) = match (parts.next(), parts.next(), parts.next()) {
            (Some(f), Some(c), None) => (parse_millis(f)?, parse_millis(c)?),
            (None, None, None) => (Timestamp::UNIX_EPOCH, Timestamp::UNIX_EPOCH),
            _ => return None,
        };
        Some(Self {
            until,
            from,
            cutoff,
        })
    }

    /// Whether a job of allocation `max_time`, let onto the node now, ends before `from` even when it
    /// is placed only at the cutoff, and the value is moved on only a `step` after it.
    pub fn admits(&self, max_time: SignedDuration, step: SignedDuration, now: Timestamp) -> bool {
        self.cutoff > now
            && self
                .cutoff
                .checked_add(step)
                .and_then(|t| t.checked_add(max_time))
                .is_ok_and(|end| end <= self.from)
    }
}

/// The booked taint of a node, read from its taints.
pub fn booked_taint(keys: &AnnotationKeys, taints: &[Taint]) -> Option<BookedTaint> {
    let key = taint_key(keys);
    let t = taints.iter().find(|t| t.key == key)?;
    BookedTaint::parse(t.value.as_deref()?)
}

/// Until when a node is booked, from its taint.
pub fn booked_until(keys: &AnnotationKeys, taints: &[Taint]) -> Option<Timestamp> {
    booked_taint(keys, taints).map(|t| t.until)
}

/// The next instant after `now` that is a whole multiple of `step` since the epoch: the cutoff of the
/// booked taints' values, the same on every runner whose clock agrees.
fn next_cutoff(now: Timestamp, step: SignedDuration) -> Timestamp {
    let step_ms = step.as_millis().max(1);
    let now_ms = i128::from(now.as_millisecond());
    let next = (now_ms.div_euclid(step_ms) + 1) * step_ms;
    i64::try_from(next)
        .ok()
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Whether `key` is a booking's label.
fn is_booking_label(keys: &AnnotationKeys, key: &str) -> bool {
    key.starts_with(&format!("{}booked-", keys.prefix))
}

/// How often the booked taints' cutoff moves on ([`BookedTaint`]): four tidy passes (each runner's
/// tidy writes the new value), at least a minute, so that a node's taint is written about once a
/// minute at most, and a pod let onto booked capacity has a pass or two to be placed.
pub fn admission_step(config: &BookingsConfig) -> SignedDuration {
    let step = config
        .check_interval
        .saturating_mul(4)
        .max(Duration::from_secs(60));
    SignedDuration::try_from(step).unwrap_or(SignedDuration::MAX)
}

/// The bookings in a ConfigMap's data; a record that cannot be read counts as none but says so in the
/// error, so that no runner overwrites what it cannot read.
fn read_record(cm: &ConfigMap) -> Result<Vec<Booking>, String> {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(KEY_BOOKINGS)) else {
        return Ok(Vec::new());
    };
    serde_json::from_str(text).map_err(|e| format!("the bookings record is not readable: {e}"))
}

/// The news not told yet in a ConfigMap's data (none when the key is missing: a record written by an
/// older runner).
fn read_news(cm: &ConfigMap) -> Result<Vec<News>, String> {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(KEY_NEWS)) else {
        return Ok(Vec::new());
    };
    serde_json::from_str(text).map_err(|e| format!("the bookings' news is not readable: {e}"))
}

/// What a change of the record does.
enum Change {
    /// Add (or keep, for a redelivery) this booking.
    Book(Request),
    /// Remove the job's booking; with a teller (an orchestrator's cancel), record the news that it was
    /// freed, claimed by that runner, or claim such news left untold (a redelivered cancel).
    Cancel {
        job_id: String,
        teller: Option<String>,
    },
    /// Drop what is over or whose job has ended; move (or drop) what a lost node or a maintenance window
    /// broke, recording the news claimed by `teller`; claim the news whose teller's lease ran out.
    Tidy { teller: String },
    /// Remove news that has been told.
    Told(Vec<NewsKey>),
}

/// What a booking's user is still to be told, kept in the record (`news`) from the write that decided
/// it until the event is out: a runner that dies in between leaves it to the next [`Bookings::tidy`]
/// of any runner once its claim is older than the lease, so the user is told even then. Every telling
/// of one news is the same event (id, content and time come from here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct News {
    pub fate: Fate,
    /// When it was decided: the event's time, whoever tells it.
    #[serde(with = "decide::millis")]
    pub at: Timestamp,
    /// The runner telling it.
    pub teller: String,
    /// When that runner took it on: after [`Bookings::lease`] another may take it over.
    #[serde(with = "decide::millis")]
    pub claimed_at: Timestamp,
}

/// Which news: the job, the booked start (ms) and what became of it.
pub type NewsKey = (String, i64, &'static str);

impl News {
    pub fn key(&self) -> NewsKey {
        let old = self.fate.old();
        (
            old.job_id.clone(),
            old.start.as_millisecond(),
            self.fate.what(),
        )
    }
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
    /// News this runner is to tell now.
    Tell(Vec<News>),
}

/// What became of a booking: its room went (its node lost or cordoned, a maintenance window forced
/// over it), found by [`Bookings::tidy`], or its job was cancelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Fate {
    /// Booked again at the same start, on other room.
    Moved {
        old: Booking,
        new: Booking,
        why: String,
    },
    /// No other room at its start: removed from the record (its job is to be cancelled).
    Cancelled { old: Booking, why: String },
    /// Freed by a cancel of its job.
    Freed { old: Booking },
}

impl Fate {
    /// The booking as it was.
    pub fn old(&self) -> &Booking {
        match self {
            Self::Moved { old, .. } | Self::Cancelled { old, .. } | Self::Freed { old } => old,
        }
    }

    /// The last part of its event's id: `moved` or `cancelled`.
    pub fn what(&self) -> &'static str {
        match self {
            Self::Moved { .. } => "moved",
            Self::Cancelled { .. } | Self::Freed { .. } => "cancelled",
        }
    }
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
    lease: SignedDuration,
    step: SignedDuration,
    /// Held by a booking of this runner from its read to its write: this runner's bookings are decided
    /// one at a time, so a hundred submitted together do not conflict on the record with one another
    /// (each conflict is a read of the whole cluster again; under load they ran out of deliveries).
    /// Other runners' are kept apart by the conditional write, as before.
    booking: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Bookings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bookings")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The record as read: the bookings and the news not told yet.
#[derive(Debug, Clone, Default, PartialEq)]
struct Record {
    bookings: Vec<Booking>,
    news: Vec<News>,
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
            lease: Self::lease_of(config),
            step: admission_step(config),
            booking: std::sync::Arc::default(),
        }
    }

    /// How long a runner's claim on news lasts before another runner's tidy takes it over: three
    /// tidy passes, at least 30 s, so that a live teller (a publish and perhaps a cancel) is never
    /// overtaken, and a dead one is within a few passes.
    fn lease_of(config: &BookingsConfig) -> SignedDuration {
        let lease = config
            .check_interval
            .saturating_mul(3)
            .max(Duration::from_secs(30));
        SignedDuration::try_from(lease).unwrap_or(SignedDuration::MAX)
    }

    /// How often the booked taints' cutoff moves on ([`BookedTaint`]).
    pub fn step(&self) -> SignedDuration {
        self.step
    }

    /// Every booking, as the record holds it now.
    pub async fn list(&self) -> Result<Vec<Booking>, ClusterError> {
        let cm = self.records.get(WHAT, &self.name).await?;
        match cm {
            None => Ok(Vec::new()),
            Some(cm) => read_record(&cm).map_err(|m| self.unreadable(m)),
        }
    }

    /// The news not told yet, as the record holds it now.
    pub async fn news(&self) -> Result<Vec<News>, ClusterError> {
        let cm = self.records.get(WHAT, &self.name).await?;
        match cm {
            None => Ok(Vec::new()),
            Some(cm) => read_news(&cm).map_err(|m| self.unreadable(m)),
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
        let _one_at_a_time = self.booking.lock().await;
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

    /// Removes the job's booking, if it has one, telling nobody (a booking taken back before it was
    /// answered): its capacity is free at once (its taints go before this returns).
    pub async fn cancel(&self, job_id: &str, now: Timestamp) -> Result<(), ClusterError> {
        self.free(job_id, now, None).await.map(|_| ())
    }

    /// Removes the job's booking for an orchestrator's cancel, recording in the same write the news
    /// that it was freed, claimed by `teller`, who tells it and then calls [`Bookings::told`]. A
    /// redelivered cancel whose first delivery removed the booking but did not tell finds that news
    /// and takes it on. Returns the news to tell, if any.
    pub async fn cancel_and_tell(
        &self,
        job_id: &str,
        now: Timestamp,
        teller: &str,
    ) -> Result<Option<News>, ClusterError> {
        self.free(job_id, now, Some(teller.to_owned())).await
    }

    async fn free(
        &self,
        job_id: &str,
        now: Timestamp,
        teller: Option<String>,
    ) -> Result<Option<News>, ClusterError> {
        // One read decides whether there is anything to change (most cancelled jobs were not booked).
        let Some(cm) = self.records.get(WHAT, &self.name).await? else {
            return Ok(None);
        };
        let mine = read_record(&cm)
            .map_err(|m| self.unreadable(m))?
            .iter()
            .any(|b| b.job_id == job_id);
        let untold = teller.is_some()
            && read_news(&cm)
                .map_err(|m| self.unreadable(m))?
                .iter()
                .any(|n| n.fate.old().job_id == job_id && matches!(n.fate, Fate::Freed { .. }));
        if !mine && !untold {
            return Ok(None);
        }
        let op = self.records.op("cancel a booking in", WHAT, &self.name);
        let change = Change::Cancel {
            job_id: job_id.to_owned(),
            teller,
        };
        let (outcome, all) = self
            .records
            .retry()
            .run(&op, || self.change_once(&change, now))
            .await?;
        self.sync_taints(&all, now).await?;
        Ok(match outcome {
            Outcome::Tell(mut news) => news.pop(),
            _ => None,
        })
    }

    /// Drops the bookings that are over, and those whose job has ended (their capacity is free from
    /// then on, not only from their end), from the record; moves to other room at the same start (or
    /// removes) those whose room went: a node gone or cordoned, a maintenance window over it
    /// (scheduled with `--force`); then puts the nodes' taints right. Run by every runner every
    /// `[bookings] check_interval`, so that a booking's taints go at its end even when nobody books or
    /// cancels, and what a runner killed half-way left is finished. Returns the news `teller` is to
    /// tell (then [`Bookings::told`]): what became of the bookings broken now, recorded in the same
    /// write that moved or removed them, and any news whose teller's claim is older than the lease (a
    /// runner that died before it told).
    pub async fn tidy(&self, now: Timestamp, teller: &str) -> Result<Vec<News>, ClusterError> {
        let op = self.records.op("tidy", WHAT, &self.name);
        let change = Change::Tidy {
            teller: teller.to_owned(),
        };
        let (outcome, all) = self
            .records
            .retry()
            .run(&op, || self.change_once(&change, now))
            .await?;
        self.sync_taints(&all, now).await?;
        Ok(match outcome {
            Outcome::Tell(news) => news,
            _ => Vec::new(),
        })
    }

    /// Just in time, as for maintenance windows: the waiting pods of jobs whose allocation ends
    /// before a booked node's first booked start are let onto the node, by the toleration of its
    /// booked taint's value as it is now ([`BookedTaint::admits`]: placed by the cutoff, they end before
    /// the start), when they fit in what is free on it now (so they are placed at once, long before
    /// the cutoff, even should the value not be moved on in time). A job without a time limit, a booked job, and a pod held by a scheduling gate are
    /// let onto no booked node; a pod is given at most [`JUST_IN_TIME_TOLERATIONS`] such tolerations
    /// over its wait (each lasts a step), so one that waits long does not grow without bound. Each
    /// pod is written conditional on the version listed; a conflict is left to the next pass.
    /// Returns how many pods were let on.
    pub async fn admit_just_in_time(&self, now: Timestamp) -> Result<usize, ClusterError> {
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .classify(|| "list nodes (booked admission)".to_owned())?;
        let mut booked: Vec<(String, BookedTaint, Amount)> = nodes
            .items
            .iter()
            .filter_map(|n| {
                let taint = booked_taint(&self.keys, n.spec.as_ref()?.taints.as_deref()?)?;
                let room = amount_of(n.status.as_ref()?.allocatable.as_ref()?);
                Some((n.metadata.name.clone()?, taint, room))
            })
            .filter(|(_, t, _)| t.admits(SignedDuration::ZERO, self.step, now))
            .collect();
        if booked.is_empty() {
            return Ok(0);
        }
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .classify(|| "list pods (booked admission)".to_owned())?;
        // What is free on each booked node now: a pod is let on only where it fits at once, so that it
        // is placed well before the cutoff.
        for pod in &pods.items {
            let (Some(node), phase) = (
                pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            ) else {
                continue;
            };
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            if let Some((_, _, room)) = booked.iter_mut().find(|(n, _, _)| n == node) {
                *room = room.minus(&pod_requests(pod));
            }
        }
        let selector = format!("{},!{}", self.managed_selector, super::labels::ENDED);
        let jobs = Api::<VolcanoJob>::all(self.client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .classify(|| "list jobs (booked admission)".to_owned())?;
        let max_times: BTreeMap<(String, String), SignedDuration> = jobs
            .items
            .iter()
            .filter(|j| !crate::cluster::jobs::is_over(j, &self.keys))
            .filter_map(|j| {
                let annotations = j.metadata.annotations.as_ref()?;
                if annotations.contains_key(&self.keys.booked_start) {
                    return None;
                }
                let ms = annotations.get(&self.keys.max_time)?.trim().parse().ok()?;
                Some((
                    (j.metadata.namespace.clone()?, j.metadata.name.clone()?),
                    SignedDuration::from_millis(ms),
                ))
            })
            .collect();
        let key = taint_key(&self.keys);
        let mut let_on = 0;
        for pod in pods
            .items
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()))
        {
            let Some(max_time) = job_of(pod).and_then(|key| max_times.get(&key)) else {
                continue;
            };
            let fits: Vec<BookedTaint> = booked
                .iter()
                .filter(|(_, _, room)| pod_requests(pod).fits_in(room))
                .map(|(_, t, _)| *t)
                .collect();
            let Some(tolerations) = just_in_time(pod, &key, &fits, *max_time, self.step, now)
            else {
                continue;
            };
            if self.tolerate(pod, tolerations).await? {
                let_on += 1;
            }
        }
        Ok(let_on)
    }

    /// Adds `tolerations` to the pod's, conditional on the version listed. `false`: it changed or went
    /// meanwhile (the next pass looks again).
    async fn tolerate(
        &self,
        pod: &Pod,
        tolerations: Vec<Toleration>,
    ) -> Result<bool, ClusterError> {
        let (Some(ns), Some(name)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
        ) else {
            return Ok(false);
        };
        let body = serde_json::json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "spec": {"tolerations": tolerations},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match Api::<Pod>::namespaced(self.client.clone(), ns)
            .patch(name, &params, &Patch::Merge(&body))
            .await
            .classify(|| format!("patch pods {ns}/{name} (booked admission)"))
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() || e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes told news from the record.
    pub async fn told(&self, news: &[News], now: Timestamp) -> Result<(), ClusterError> {
        if news.is_empty() {
            return Ok(());
        }
        let op = self.records.op("remove told news from", WHAT, &self.name);
        let change = Change::Told(news.iter().map(News::key).collect());
        self.records
            .retry()
            .run(&op, || self.change_once(&change, now))
            .await?;
        Ok(())
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
        let before = match &cm {
            Some(cm) => Record {
                bookings: read_record(cm).map_err(|m| self.unreadable(m))?,
                news: read_news(cm).map_err(|m| self.unreadable(m))?,
            },
            None => Record::default(),
        };
        let version = cm
            .as_ref()
            .and_then(|c| c.metadata.resource_version.clone());
        let mut record = before.clone();
        // What is over sets nothing aside any more.
        record.bookings.retain(|b| b.end > now);
        let outcome = match change {
            Change::Cancel { job_id, teller } => self.cancel_in(&mut record, job_id, teller, now),
            Change::Tidy { teller } => self.tidy_in(&mut record, teller, now).await?,
            Change::Told(keys) => {
                record.news.retain(|n| !keys.contains(&n.key()));
                Outcome::Nothing
            }
            Change::Book(request) => {
                if let Some(mine) = record
                    .bookings
                    .iter()
                    .find(|b| b.job_id == request.job_id && b.fingerprint == request.fingerprint)
                {
                    return Ok((
                        Outcome::Answer(Answer::Booked(mine.clone())),
                        record.bookings,
                    ));
                }
                let seen = self.read_cluster(now).await?;
                let answer =
                    decide::decide(request, seen.inputs(&record.bookings, self.limits, now));
                if let Answer::Booked(b) = &answer {
                    record.bookings.retain(|o| o.job_id != request.job_id);
                    record.bookings.push(b.clone());
                }
                Outcome::Answer(answer)
            }
        };
        if record != before {
            self.write(&record, version).await?;
        }
        Ok((outcome, record.bookings))
    }

    /// [`Change::Cancel`] on the record read.
    fn cancel_in(
        &self,
        record: &mut Record,
        job_id: &str,
        teller: &Option<String>,
        now: Timestamp,
    ) -> Outcome {
        let removed = record.bookings.iter().position(|b| b.job_id == job_id);
        let removed = removed.map(|i| record.bookings.remove(i));
        let Some(teller) = teller else {
            return Outcome::Nothing;
        };
        if let Some(old) = removed {
            let news = News {
                fate: Fate::Freed { old },
                at: now,
                teller: teller.clone(),
                claimed_at: now,
            };
            record.news.push(news.clone());
            return Outcome::Tell(vec![news]);
        }
        // Freed by an earlier delivery of this cancel that did not tell.
        let left = record
            .news
            .iter_mut()
            .find(|n| n.fate.old().job_id == job_id && matches!(n.fate, Fate::Freed { .. }));
        match left {
            Some(n) => {
                n.teller = teller.clone();
                n.claimed_at = now;
                Outcome::Tell(vec![n.clone()])
            }
            None => Outcome::Nothing,
        }
    }

    /// [`Change::Tidy`] on the record read.
    async fn tidy_in(
        &self,
        record: &mut Record,
        teller: &str,
        now: Timestamp,
    ) -> Result<Outcome, ClusterError> {
        // A started booking whose job has ended sets nothing aside any more; nor does one whose job is
        // gone a lease after the start (it was created when it was booked, but not listed at once).
        if record.bookings.iter().any(|b| b.start <= now) {
            let jobs = self.unlabelled_jobs().await?;
            record.bookings.retain(|b| match jobs.get(&b.job_id) {
                _ if b.start > now => true,
                Some(over) => !over,
                None => b.start + self.lease > now,
            });
        }
        // A teller that has not removed its news within the lease is taken to be gone.
        let mut tell = Vec::new();
        for n in &mut record.news {
            if n.claimed_at + self.lease <= now {
                n.teller = teller.to_owned();
                n.claimed_at = now;
                tell.push(n.clone());
            }
        }
        for fate in self.rebook_broken(&mut record.bookings, now).await? {
            let news = News {
                fate,
                at: now,
                teller: teller.to_owned(),
                claimed_at: now,
            };
            record.news.push(news.clone());
            tell.push(news);
        }
        Ok(Outcome::Tell(tell))
    }

    /// The jobs volcano-runner manages, but those kept for the retention after their end and labelled
    /// so ([`crate::cluster::labels::ENDED`]): by id, whether each is over (its end recorded, not
    /// labelled yet).
    async fn unlabelled_jobs(&self) -> Result<BTreeMap<String, bool>, ClusterError> {
        let selector = format!("{},!{}", self.managed_selector, super::labels::ENDED);
        let jobs = Api::<VolcanoJob>::all(self.client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .classify(|| "list jobs (bookings)".to_owned())?;
        Ok(jobs
            .items
            .iter()
            .filter_map(|j| {
                let id = j.metadata.name.as_deref()?.strip_prefix("j-")?;
                Some((id.to_owned(), crate::cluster::jobs::is_over(j, &self.keys)))
            })
            .collect())
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
    async fn write(&self, record: &Record, version: Option<String>) -> Result<(), ClusterError> {
        let mut sorted = record.bookings.clone();
        sorted.sort_by(|a, b| (a.start, &a.job_id).cmp(&(b.start, &b.job_id)));
        let text = serde_json::to_string(&sorted).unwrap_or_else(|_| "[]".into());
        let mut data = BTreeMap::from([(KEY_BOOKINGS.to_owned(), text)]);
        if !record.news.is_empty() {
            let news = serde_json::to_string(&record.news).unwrap_or_else(|_| "[]".into());
            data.insert(KEY_NEWS.to_owned(), news);
        }
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
            data: Some(data),
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
                let Some(mut patch) = wanted_marks(node, all, &self.keys, now, self.step) else {
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

/// How many tolerations of booked taints a waiting pod is given at most over its wait.
pub const JUST_IN_TIME_TOLERATIONS: usize = 8;

/// The pod's tolerations with those of the `booked` taints that admit it added (its whole list, for a
/// merge patch); `None` when none is to be added: it is placed, gated, a booked job's (it tolerates
/// every booked taint), has had its share, or tolerates every one that admits it already.
fn just_in_time(
    pod: &Pod,
    key: &str,
    booked: &[BookedTaint],
    max_time: SignedDuration,
    step: SignedDuration,
    now: Timestamp,
) -> Option<Vec<Toleration>> {
    let spec = pod.spec.as_ref()?;
    if spec.node_name.is_some()
        || spec
            .scheduling_gates
            .as_ref()
            .is_some_and(|g| !g.is_empty())
    {
        return None;
    }
    let had = spec.tolerations.clone().unwrap_or_default();
    let of_key = |t: &&Toleration| t.key.as_deref() == Some(key);
    if had
        .iter()
        .filter(of_key)
        .any(|t| t.operator.as_deref() == Some("Exists"))
        || had.iter().filter(of_key).count() >= JUST_IN_TIME_TOLERATIONS
    {
        return None;
    }
    let mut out = had.clone();
    for t in booked.iter().filter(|t| t.admits(max_time, step, now)) {
        let toleration = Toleration {
            key: Some(key.to_owned()),
            operator: Some("Equal".to_owned()),
            value: Some(t.value()),
            effect: Some(TAINT_EFFECT.to_owned()),
            toleration_seconds: None,
        };
        if !out.contains(&toleration) {
            out.push(toleration);
        }
    }
    (out.len() > had.len()).then_some(out)
}

/// The merge patch that marks `node` as `all` wants it (its taints whole, its booking labels set or
/// removed); `None` when it is so already.
fn wanted_marks(
    node: &Node,
    all: &[Booking],
    keys: &AnnotationKeys,
    now: Timestamp,
    step: SignedDuration,
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
    let wanted_taint = mine.iter().map(|b| b.end).max().map(|until| {
        BookedTaint {
            until,
            from: mine.iter().map(|b| b.start).min().unwrap_or(until),
            cutoff: next_cutoff(now, step),
        }
        .value()
    });
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

/// The (namespace, name) of the VolcanoJob a pod belongs to, owned, as the maps of jobs below are keyed
/// ([`crate::volcano::job_of_pod`] reads it).
fn job_of(pod: &Pod) -> Option<(String, String)> {
    let (namespace, name) = job_of_pod(pod)?;
    Some((namespace.to_owned(), name.to_owned()))
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
        let job = job_of(pod).and_then(|key| by_name.get(&key));
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
    let (cpu_milli, memory_mib, gpu) = crate::quantity::cpu_memory_gpu(map);
    Amount {
        cpu_milli,
        memory_mib,
        gpu,
    }
}

/// What a pod asks for, as the scheduler counts it (init containers and sidecars included).
fn pod_requests(pod: &Pod) -> Amount {
    pod.spec.as_ref().map(pod_spec_requests).unwrap_or_default()
}

/// [`pod_requests`] of a pod spec (a job's template, before its pods exist):
/// [`crate::quantity::pod_cpu_memory_gpu`], the reading the monitor's estimates use too.
pub fn pod_spec_requests(spec: &k8s_openapi::api::core::v1::PodSpec) -> Amount {
    let (cpu_milli, memory_mib, gpu) = crate::quantity::pod_cpu_memory_gpu(spec);
    Amount {
        cpu_milli,
        memory_mib,
        gpu,
    }
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
        .filter(|b| Span::new(old_expiry, new_expiry).contains(b.start))
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
        .filter(|b| b.end > now && window.span().overlaps(&b.span()))
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

    /// A job is let onto a booked node only if, placed as late as the cutoff, it ends before the
    /// node's first booked start with a step to spare; not once the cutoff has passed; an older
    /// runner's bare value admits nobody.
    #[test]
    fn the_taint_admits_what_ends_before_the_booked_start() {
        let at = |s| Timestamp::from_second(s).unwrap();
        let taint = BookedTaint {
            until: at(9000),
            from: at(5000),
            cutoff: at(1060),
        };
        assert_eq!(BookedTaint::parse(&taint.value()), Some(taint));
        let step = SignedDuration::from_secs(60);
        let mins = SignedDuration::from_mins;
        assert!(
            taint.admits(mins(60), step, at(1000)),
            "1060 + 60 + 3600 <= 5000"
        );
        assert!(
            !taint.admits(mins(65), step, at(1000)),
            "ends after the start"
        );
        assert!(
            !taint.admits(mins(1), step, at(1060)),
            "the cutoff has passed"
        );
        let old = BookedTaint::parse("9000000").unwrap();
        assert_eq!(old.until, at(9000));
        assert!(!old.admits(mins(1), step, at(1000)));
        assert_eq!(BookedTaint::parse("1_2"), None);
        assert_eq!(next_cutoff(at(1000), step), at(1020));
        assert_eq!(next_cutoff(at(1020), step), at(1080));
    }

    /// A pod bound on a booked node holds what the scheduler counts for it: an init container that
    /// requests more than the pod's containers sets its share, and a job's template asks for as much.
    #[test]
    fn a_bound_pod_holds_its_init_containers_request() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "nodeName": "n1",
                "initContainers": [{"name": "fetch", "resources": {"requests": {"cpu": "8", "memory": "16Gi"}}}],
                "containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]
            },
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let keys = AnnotationKeys::new("ucloud.dk/");
        let held = holdings(
            std::slice::from_ref(&pod),
            &[],
            &keys,
            Timestamp::from_second(0).unwrap(),
        );
        let want = Amount {
            cpu_milli: 8000,
            memory_mib: 16384,
            gpu: 0,
        };
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].node, "n1");
        assert_eq!(held[0].uses, want, "the init container, not just `main`");
        assert_eq!(pod_spec_requests(pod.spec.as_ref().unwrap()), want);
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
        let step = SignedDuration::from_secs(60);
        let patch = wanted_marks(&node, &all, &keys, now, step).expect("a change");
        assert_eq!(
            patch["spec"]["taints"],
            serde_json::json!([
                {"key": "ucloud.dk/maintenance", "value": "w", "effect": "NoSchedule"},
                {"key": "ucloud.dk/booked", "value": "5600000_1000000_60000", "effect": "NoSchedule"},
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
        assert_eq!(wanted_marks(&patched, &all, &keys, now, step), None);
        // A step later the cutoff moves on, and with it the value (older tolerations match no more).
        let later = wanted_marks(
            &patched,
            &all,
            &keys,
            Timestamp::from_second(61).unwrap(),
            step,
        )
        .expect("the cutoff moved");
        assert_eq!(
            later["spec"]["taints"][1]["value"],
            serde_json::json!("5600000_1000000_120000")
        );
        assert_eq!(
            booked_until(
                &keys,
                patched.spec.as_ref().unwrap().taints.as_ref().unwrap()
            ),
            Some(Timestamp::from_second(5600).unwrap())
        );
        let over = Timestamp::from_second(9000).unwrap();
        let patch = wanted_marks(&patched, &all, &keys, over, step).expect("the bookings are over");
        assert_eq!(patch["spec"]["taints"].as_array().unwrap().len(), 1);
        assert_eq!(
            patch["metadata"]["labels"],
            serde_json::json!({"ucloud.dk/booked-b": null, "ucloud.dk/booked-c": null})
        );
    }
}
