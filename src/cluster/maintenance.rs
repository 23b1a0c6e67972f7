//! Maintenance windows: one ConfigMap per window in the runner's namespace, so every runner follows them
//! through one watch (no API read per decision) and an operator sees them with `kubectl get cm -l
//! app.kubernetes.io/component=maintenance-window` as well as with `volcano-runner admin status`.
//!
//! A window (`volcano-runner-maintenance-<id>`) holds `start` and `end` (RFC 3339), `nodes` (comma
//! separated; empty means every node), `reason`, `createdAt` and `createdBy`. Scheduling creates it,
//! cancelling deletes it: nothing is read-modify-written, and two admins scheduling the same window get
//! the same id (it is a function of the window), so the second finds the first's.
//!
//! What the monitor does with the windows is in [`crate::monitor::maintenance`] and docs/ops.md.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::ClusterConfig;
use super::error::ClusterError;
use super::labels::{COMPONENT, MANAGED_BY, MANAGER};
use super::records::{ConfigMapRecords, Deleted};
use crate::interval::Span;

/// `app.kubernetes.io/component` of a maintenance window's ConfigMap.
pub const COMPONENT_MAINTENANCE: &str = "maintenance-window";
/// Name of a window's ConfigMap: this, then `-<id>`.
pub const NAME_PREFIX: &str = "volcano-runner-maintenance";
/// Label carrying the window's id, so `cancel` needs no name arithmetic from an operator.
pub const LABEL_ID: &str = "volcano-runner/maintenance-window";

const KEY_START: &str = "start";
const KEY_END: &str = "end";
const KEY_NODES: &str = "nodes";
const KEY_REASON: &str = "reason";
const KEY_CREATED_AT: &str = "createdAt";
const KEY_CREATED_BY: &str = "createdBy";

/// One maintenance window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub id: String,
    pub start: Timestamp,
    pub end: Timestamp,
    /// The nodes it takes away; empty: every node.
    pub nodes: BTreeSet<String>,
    pub reason: Option<String>,
    pub created_at: Option<Timestamp>,
    pub created_by: Option<String>,
}

/// What is wrong with a window an operator asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error(
        "{what}: {text:?} is neither an RFC 3339 time (2026-12-01T06:00:00Z) nor `now` or `+<duration>` (+2h, +30m)"
    )]
    BadTime { what: &'static str, text: String },
    #[error("the window ends ({end}) before it starts ({start})")]
    EndsBeforeStart { start: Timestamp, end: Timestamp },
    #[error("the window has already ended ({end})")]
    InThePast { end: Timestamp },
    #[error("node name {0:?} is empty or not a Kubernetes name")]
    BadNode(String),
    /// `--nodes ""` (an empty shell variable): not "every node", which is said by leaving `--nodes` out.
    #[error(
        "--nodes: the node list is empty or has an empty entry ({0:?}); name the nodes (`n1,n2`), or leave --nodes out to take every node away"
    )]
    EmptyNodes(String),
}

impl WindowError {
    /// None of these heal by trying again: the operator must ask differently.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Reads `--start` / `--end`: RFC 3339, `now`, or `+<duration>` from `now` (`+2h`, `+1h30m`, `+90s`).
pub fn parse_time(
    what: &'static str,
    text: &str,
    now: Timestamp,
) -> Result<Timestamp, WindowError> {
    let bad = || WindowError::BadTime {
        what,
        text: text.to_owned(),
    };
    let t = text.trim();
    if t.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    if let Some(rel) = t.strip_prefix('+') {
        let d: SignedDuration = rel.parse().map_err(|_| bad())?;
        if d.is_negative() {
            return Err(bad());
        }
        return now.checked_add(d).map_err(|_| bad());
    }
    t.parse::<Timestamp>().map_err(|_| bad())
}

/// The nodes of `--nodes` as clap splits them at commas: no flag (`[]`) is every node; an empty list or
/// an empty entry (`--nodes ""`, `--nodes "n1,,n2"`) is refused, never read as every node.
pub fn node_list(given: &[String]) -> Result<BTreeSet<String>, WindowError> {
    let mut nodes = BTreeSet::new();
    for n in given {
        let n = n.trim();
        if n.is_empty() {
            return Err(WindowError::EmptyNodes(given.join(",")));
        }
        nodes.insert(n.to_owned());
    }
    Ok(nodes)
}

/// The rules every window obeys, whoever wrote it (the CLI, or an operator's hand-written ConfigMap):
/// it ends after it starts, and names nodes by Kubernetes names.
fn check(start: Timestamp, end: Timestamp, nodes: &BTreeSet<String>) -> Result<(), WindowError> {
    if end <= start {
        return Err(WindowError::EndsBeforeStart { start, end });
    }
    for n in nodes {
        let name_like = n.len() <= 253
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if n.is_empty() || !name_like {
            return Err(WindowError::BadNode(n.clone()));
        }
    }
    Ok(())
}

impl Window {
    /// A window as an operator asks for it. Its id is a function of its start, end and nodes, so the
    /// same request twice is the same window. A start in the past is moved to `now`: what ran before
    /// was not in maintenance, and nothing is charged or ended retroactively.
    pub fn new(
        start: Timestamp,
        end: Timestamp,
        nodes: BTreeSet<String>,
        reason: Option<String>,
        by: &str,
        now: Timestamp,
    ) -> Result<Self, WindowError> {
        check(start, end, &nodes)?;
        if end <= now {
            return Err(WindowError::InThePast { end });
        }
        let start = start.max(now);
        let mut hash = Sha256::new();
        hash.update(start.as_millisecond().to_be_bytes());
        hash.update(end.as_millisecond().to_be_bytes());
        for n in &nodes {
            hash.update(n.as_bytes());
            hash.update([0]);
        }
        let digest = hash.finalize();
        let id = format!(
            "{}-{}",
            start.strftime("%Y%m%d%H%M"),
            digest[..3]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        Ok(Self {
            id,
            start,
            end,
            nodes,
            reason: reason.filter(|r| !r.trim().is_empty()),
            created_at: Some(now),
            created_by: Some(by.to_owned()),
        })
    }

    /// Whether it takes every node away (nothing can run during it).
    pub fn all_nodes(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether it takes `node` away.
    pub fn covers(&self, node: &str) -> bool {
        self.all_nodes() || self.nodes.contains(node)
    }

    /// `[start, end)`.
    pub fn span(&self) -> Span<Timestamp> {
        Span::new(self.start, self.end)
    }

    /// Whether `[from, until)` overlaps it.
    pub fn overlaps(&self, from: Timestamp, until: Timestamp) -> bool {
        self.span().overlaps(&Span::new(from, until))
    }

    /// Whether a job that started at `now` with the time allocation `max_time` (`None`: no limit) would
    /// still run when it begins: the window is not over and starts before the allocation ends.
    pub fn in_the_way(&self, now: Timestamp, max_time: Option<SignedDuration>) -> bool {
        self.span().overlaps(&Span::lasting(now, max_time))
    }

    /// `from S to E on n1, n2: reason`, for events, logs and `admin status`.
    pub fn describe(&self) -> String {
        let mut text = format!("{} from {} to {}", self.id, self.start, self.end);
        if !self.all_nodes() {
            let nodes: Vec<&str> = self.nodes.iter().map(String::as_str).collect();
            text.push_str(&format!(" on {}", nodes.join(", ")));
        } else {
            text.push_str(" on every node");
        }
        if let Some(r) = &self.reason {
            text.push_str(&format!(": {r}"));
        }
        text
    }

    /// Reads a window from its ConfigMap; `None` when it is not one. See [`Window::read_configmap`].
    pub fn from_configmap(cm: &ConfigMap) -> Option<Self> {
        Self::read_configmap(cm).ok()
    }

    /// Reads a window from its ConfigMap, checked as strictly as `admin maintenance schedule` checks
    /// one (it ends after it starts, its nodes are Kubernetes names, an empty entry is no node): a
    /// window an operator wrote or broke by hand is left out rather than guessed at, and the error says
    /// why (`admin maintenance list` and `admin status` print it, a runner logs it). An empty `nodes` is
    /// every node, as the CLI writes it.
    pub fn read_configmap(cm: &ConfigMap) -> Result<Self, String> {
        let id = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_ID))
            .filter(|id| !id.trim().is_empty())
            .ok_or_else(|| format!("no {LABEL_ID} label"))?
            .clone();
        let data = cm.data.as_ref().ok_or("no data")?;
        let text = |k: &str| {
            data.get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let time = |k: &str| -> Result<Timestamp, String> {
            let v = text(k).ok_or_else(|| format!("no `{k}`"))?;
            v.parse()
                .map_err(|_| format!("`{k}` {v:?} is not an RFC 3339 time"))
        };
        let start = time(KEY_START)?;
        let end = time(KEY_END)?;
        let nodes = match text(KEY_NODES) {
            None => BTreeSet::new(),
            Some(v) => {
                let given: Vec<String> = v.split(',').map(str::to_owned).collect();
                node_list(&given).map_err(|_| format!("`nodes` {v:?} has an empty entry"))?
            }
        };
        check(start, end, &nodes).map_err(|e| e.to_string())?;
        Ok(Self {
            id,
            start,
            end,
            nodes,
            reason: text(KEY_REASON),
            created_at: text(KEY_CREATED_AT).and_then(|v| v.parse().ok()),
            created_by: text(KEY_CREATED_BY),
        })
    }

    /// The ConfigMap's name.
    pub fn configmap_name(&self) -> String {
        format!("{NAME_PREFIX}-{}", self.id)
    }

    fn to_configmap(&self, namespace: &str) -> ConfigMap {
        let mut data = BTreeMap::from([
            (KEY_START.to_owned(), self.start.to_string()),
            (KEY_END.to_owned(), self.end.to_string()),
            (
                KEY_NODES.to_owned(),
                self.nodes.iter().cloned().collect::<Vec<_>>().join(","),
            ),
            (
                KEY_REASON.to_owned(),
                self.reason.clone().unwrap_or_default(),
            ),
        ]);
        if let Some(at) = self.created_at {
            data.insert(KEY_CREATED_AT.to_owned(), at.to_string());
        }
        if let Some(by) = &self.created_by {
            data.insert(KEY_CREATED_BY.to_owned(), by.clone());
        }
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.configmap_name()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    (COMPONENT.to_owned(), COMPONENT_MAINTENANCE.to_owned()),
                    (LABEL_ID.to_owned(), self.id.clone()),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        }
    }
}

/// The label selector of every window.
pub fn selector() -> String {
    format!("{COMPONENT}={COMPONENT_MAINTENANCE}")
}

/// The window that holds back a job that would start at `now` with the time allocation `max_time`: the
/// earliest-starting one [`Window::in_the_way`]. Windows of some nodes hold it back too: Volcano, not
/// the runner, picks the nodes, and a pod's placement can only be narrowed after its creation, never
/// widened again, so a rule that kept it off the window's nodes would outlive the window (docs/ops.md).
pub fn holding(
    windows: &[Window],
    now: Timestamp,
    max_time: Option<SignedDuration>,
) -> Option<&Window> {
    windows
        .iter()
        .filter(|w| w.in_the_way(now, max_time))
        .min_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)))
}

/// Schedules, lists and cancels windows (the operator's side, `volcano-runner admin maintenance`).
#[derive(Clone, Debug)]
pub struct MaintenanceWindows {
    records: ConfigMapRecords,
}

impl MaintenanceWindows {
    pub fn new(client: kube::Client, config: &ClusterConfig) -> Self {
        Self {
            records: ConfigMapRecords::new(client, config),
        }
    }

    /// Stores the window; the same window scheduled twice is stored once (`false`: it was there).
    pub async fn schedule(&self, window: &Window) -> Result<bool, ClusterError> {
        let cm = window.to_configmap(self.records.namespace());
        self.records.create(WHAT, &cm).await
    }

    /// Every window, earliest start first, with the ConfigMaps that carry the label but are not a valid
    /// window: `<name> (<why>)`.
    pub async fn list(&self) -> Result<(Vec<Window>, Vec<String>), ClusterError> {
        let params = ListParams::default().labels(&selector());
        let list = self.records.list("maintenance windows", &params).await?;
        let mut windows = Vec::new();
        let mut broken = Vec::new();
        for cm in &list.items {
            match Window::read_configmap(cm) {
                Ok(w) => windows.push(w),
                Err(why) => broken.push(format!(
                    "{} ({why})",
                    cm.metadata.name.clone().unwrap_or_default()
                )),
            }
        }
        windows.sort_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)));
        Ok((windows, broken))
    }

    /// Deletes the window `id`; `false` when there was none.
    pub async fn cancel(&self, id: &str) -> Result<bool, ClusterError> {
        let name = format!("{NAME_PREFIX}-{id}");
        let deleted = self.records.delete(WHAT, &name, None).await?;
        Ok(deleted == Deleted::Deleted)
    }
}

/// The record kind, in the operations errors name.
const WHAT: &str = "maintenance window";

/// The windows as a runner knows them, from its watch: earliest start first. Cheap to clone.
pub type Windows = Arc<Vec<Window>>;

/// Follows the windows of `namespace` with a watch and publishes every change on `tx` (the monitor and
/// the submit path read the receiver; nothing is read from the API per decision). Runs until dropped;
/// the watch starts over with a fresh list every `relist`, so a watch that went quiet is caught.
pub async fn follow(
    client: kube::Client,
    namespace: String,
    relist: Duration,
    tx: watch::Sender<Option<Windows>>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&selector());
    loop {
        let mut known: BTreeMap<String, Window> = BTreeMap::new();
        let mut listing: Option<BTreeMap<String, Window>> = None;
        let stream = watcher::watcher(api.clone(), config.clone()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let deadline = tokio::time::sleep(relist);
        let mut deadline = std::pin::pin!(deadline);
        let publish = |known: &BTreeMap<String, Window>| {
            let mut windows: Vec<Window> = known.values().cloned().collect();
            windows.sort_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)));
            tx.send_if_modified(|current| {
                let changed = current.as_deref() != Some(&windows);
                if changed {
                    *current = Some(Arc::new(windows));
                }
                changed
            });
        };
        loop {
            tokio::select! {
                () = &mut deadline => break,
                next = stream.next() => match next {
                    Some(Ok(event)) => match event {
                        Event::Init => listing = Some(BTreeMap::new()),
                        Event::InitApply(cm) => {
                            if let (Some(l), Some(w)) = (listing.as_mut(), readable(&cm)) {
                                l.insert(cm.metadata.name.clone().unwrap_or_default(), w);
                            }
                        }
                        Event::InitDone => {
                            known = listing.take().unwrap_or_default();
                            publish(&known);
                        }
                        Event::Apply(cm) => {
                            let name = cm.metadata.name.clone().unwrap_or_default();
                            match readable(&cm) {
                                Some(w) => known.insert(name, w),
                                None => known.remove(&name),
                            };
                            publish(&known);
                        }
                        Event::Delete(cm) => {
                            known.remove(&cm.metadata.name.clone().unwrap_or_default());
                            publish(&known);
                        }
                    },
                    Some(Err(e)) => tracing::warn!(error = %e, "The maintenance windows' watch failed; retrying."),
                    None => break,
                },
            }
        }
    }
}

/// The window a ConfigMap holds; `None`, with a warning naming it and why, when it is not a valid one
/// (it is then no window at all: nothing is held back or cut for it).
fn readable(cm: &ConfigMap) -> Option<Window> {
    Window::read_configmap(cm)
        .inspect_err(|why| {
            tracing::warn!(
                configmap = cm.metadata.name.as_deref().unwrap_or_default(),
                why,
                "A ConfigMap labelled as a maintenance window is not a valid one; it is ignored (fix or delete it)."
            );
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn times_are_absolute_or_relative_to_now() {
        let now = ts("2026-12-01T06:00:00Z");
        assert_eq!(parse_time("--start", "now", now).unwrap(), now);
        assert_eq!(
            parse_time("--start", "+2h", now).unwrap(),
            ts("2026-12-01T08:00:00Z")
        );
        assert_eq!(
            parse_time("--end", "+1h30m", now).unwrap(),
            ts("2026-12-01T07:30:00Z")
        );
        assert_eq!(
            parse_time("--end", "2026-12-02T00:00:00Z", now).unwrap(),
            ts("2026-12-02T00:00:00Z")
        );
        assert!(parse_time("--end", "tomorrow", now).is_err());
        assert!(parse_time("--end", "+-1h", now).is_err());
    }

    #[test]
    fn a_window_round_trips_and_its_id_is_a_function_of_it() {
        let now = ts("2026-12-01T06:00:00Z");
        let nodes: BTreeSet<String> = ["n2".to_owned(), "n1".to_owned()].into();
        let w = Window::new(
            ts("2026-12-01T08:00:00Z"),
            ts("2026-12-01T10:00:00Z"),
            nodes.clone(),
            Some("kernel update".into()),
            "alice@host",
            now,
        )
        .unwrap();
        let again = Window::new(w.start, w.end, nodes, None, "bob@host", now).unwrap();
        assert_eq!(w.id, again.id);
        assert!(w.id.starts_with("202612010800-"), "{}", w.id);
        let back = Window::from_configmap(&w.to_configmap("ns")).unwrap();
        assert_eq!(back, w);
        assert!(back.covers("n1") && !back.covers("n3"));
    }

    #[test]
    fn a_window_holds_back_the_jobs_whose_allocation_it_would_cut() {
        let now = ts("2026-12-01T06:00:00Z");
        let w = |s: &str, e: &str, id: &str| Window {
            id: id.into(),
            start: ts(s),
            end: ts(e),
            nodes: BTreeSet::new(),
            reason: None,
            created_at: None,
            created_by: None,
        };
        let windows = [
            w("2026-12-01T04:00:00Z", "2026-12-01T05:00:00Z", "over"),
            w("2026-12-01T08:00:00Z", "2026-12-01T10:00:00Z", "early"),
            w("2026-12-01T09:00:00Z", "2026-12-01T12:00:00Z", "late"),
        ];
        let h = |hours: i64| SignedDuration::from_hours(hours);
        // Ends before the first window that is not over: nothing holds it.
        assert_eq!(holding(&windows, now, Some(h(2))), None);
        assert_eq!(holding(&windows, now, Some(h(3))).unwrap().id, "early");
        // No time limit: every window not over is in the way.
        assert_eq!(holding(&windows, now, None).unwrap().id, "early");
        // During a window, any job waits for it.
        let during = ts("2026-12-01T08:30:00Z");
        assert_eq!(
            holding(&windows, during, Some(SignedDuration::from_mins(1)))
                .unwrap()
                .id,
            "early"
        );
        // Past the first, the second still holds.
        let after = ts("2026-12-01T10:00:00Z");
        assert_eq!(holding(&windows, after, Some(h(1))).unwrap().id, "late");
        assert_eq!(holding(&windows, ts("2026-12-01T12:00:00Z"), None), None);
    }

    #[test]
    fn windows_that_cannot_be_are_refused() {
        let now = ts("2026-12-01T06:00:00Z");
        let w = |s: &str, e: &str| {
            Window::new(ts(s), ts(e), BTreeSet::new(), None, "a", now).map(|w| w.start)
        };
        assert!(matches!(
            w("2026-12-01T08:00:00Z", "2026-12-01T07:00:00Z"),
            Err(WindowError::EndsBeforeStart { .. })
        ));
        assert!(matches!(
            w("2026-12-01T04:00:00Z", "2026-12-01T05:00:00Z"),
            Err(WindowError::InThePast { .. })
        ));
        // Begun already: it starts now, nothing is ended or charged retroactively.
        assert_eq!(w("2026-12-01T05:00:00Z", "2026-12-01T07:00:00Z"), Ok(now));
    }

    /// `--nodes ""` (an empty shell variable) is not every node; leaving the flag out is.
    #[test]
    fn an_empty_node_list_is_refused() {
        assert_eq!(node_list(&[]), Ok(BTreeSet::new()));
        assert!(matches!(
            node_list(&[String::new()]),
            Err(WindowError::EmptyNodes(_))
        ));
        assert!(matches!(
            node_list(&["n1".into(), " ".into()]),
            Err(WindowError::EmptyNodes(_))
        ));
        assert_eq!(
            node_list(&["n1".into(), " n2".into()]).unwrap(),
            BTreeSet::from(["n1".to_owned(), "n2".to_owned()])
        );
    }

    /// A hand-written window is held to the CLI's rules: one that ends before it starts, or names a node
    /// that cannot be one, is no window, and says why.
    #[test]
    fn a_hand_written_window_is_checked_as_the_cli_checks_one() {
        let now = ts("2026-12-01T06:00:00Z");
        let good = Window::new(
            ts("2026-12-01T08:00:00Z"),
            ts("2026-12-01T10:00:00Z"),
            BTreeSet::new(),
            None,
            "a",
            now,
        )
        .unwrap();
        let edit = |key: &str, value: &str| {
            let mut cm = good.to_configmap("ns");
            cm.data
                .as_mut()
                .unwrap()
                .insert(key.to_owned(), value.to_owned());
            Window::read_configmap(&cm)
        };
        assert_eq!(edit(KEY_NODES, "").unwrap(), good, "empty: every node");
        let inverted = edit(KEY_END, "2026-12-01T07:00:00Z").unwrap_err();
        assert!(inverted.contains("ends"), "{inverted}");
        assert!(edit(KEY_START, "2026-12-01T10:00:00Z").is_err(), "empty");
        assert!(
            edit(KEY_NODES, "n1,,n2")
                .unwrap_err()
                .contains("empty entry")
        );
        assert!(edit(KEY_NODES, "Node_1").unwrap_err().contains("Node_1"));
        assert!(
            edit(KEY_START, "tomorrow")
                .unwrap_err()
                .contains("RFC 3339")
        );
    }
}
