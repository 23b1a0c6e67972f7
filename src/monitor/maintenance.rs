//! What a maintenance window ([`crate::cluster::maintenance`]) means for a running job: a warning
//! `[monitor] maintenance_warn_before` ahead of the window's start, then the end at the start, with its
//! own reason (`maintenance`) and charged up to the start only.
//!
//! A job is cut by a window that is not over, that covers one of the nodes its ranks run on (or every
//! node), and that starts before the job would expire anyway. The end is decided like the expiry's:
//! from the clock against a deadline, and once decided it is durable on the job (`maintenanceCut`, the
//! instant charged up to, written with `terminationCause=maintenance` before the delete), so a runner
//! killed at the window's start leaves the next one the same end and the same final tick, even if the
//! window has been cancelled meanwhile.
//!
//! A job that has not started is held back by a window in the way of its time allocation
//! ([`crate::cluster::maintenance::holding`]), in one of two ways:
//! - A job created while one was in the way carries the scheduling gate `<prefix>maintenance` on its
//!   pods and `<prefix>maintenanceHeld` on itself (the submit path puts them there); the monitor removes
//!   the gate once no window is in the way (the window over, cancelled, or the job short enough to end
//!   before the next one).
//! - Every other job (one queued before the window was scheduled, whose pods exist without the gate,
//!   which can only be removed after a pod's creation) is held by the node taint
//!   `<prefix>maintenance=<window id>:NoSchedule` the monitor puts on the window's nodes (every node for
//!   a window of all nodes) from when the window is listed until it is over or cancelled; a node covered
//!   by several carries the id of the one that starts first ([`plan_taints`]). Kubernetes lets
//!   tolerations be added to a pod after its creation (additions only), so the monitor adds to the pods
//!   that wait the toleration (`<prefix>maintenance=<window id>`) of each window that is not in the way
//!   of their job ([`pending`]); a job a window is in the way of gets none, and the
//!   scheduler keeps it off the window's nodes until the taint goes. A toleration, like a removed gate,
//!   cannot be taken back: it is added under the same rule by which a gate is removed (the window not in
//!   the way now nor at the start the replay expects).
//!
//! Either way the monitor tells the job once per window until when it waits ([`Waiting::Held`]; a later
//! start the replay of [`super::estimate_windows`] expects is told as a change). Where the monitor may
//! not write the taints (the node patch refused), a job without the gate cannot be held: it is told
//! once what the window will do to it ([`Waiting::NotHeld`]). Everything is decided from the windows,
//! the nodes' taints and the pods as they are, so a runner that dies holding a job leaves its release
//! to whoever monitors the job next.

use std::collections::BTreeSet;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use crate::cluster::Window;
use crate::messages::proto_timestamp;
use crate::messages::v1::{JobEvent, JobState};

/// The reason of the end (FAILURE) and of the warning's status event's family.
pub const REASON: &str = "maintenance";
/// The reason of the warning before the end.
pub const WARNING_REASON: &str = "maintenance_warning";
/// The `terminationCause` the monitor records before it deletes a job for a window.
pub const CAUSE: &str = "maintenance";

/// The nodes the job's ranks are bound to.
fn nodes_of(pods: &[Pod]) -> BTreeSet<&str> {
    pods.iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
        .collect()
}

/// The window that will cut a job running on `pods`: the earliest one not over at `now` that covers a
/// node of the job and starts before its `expiry`.
pub fn cutting<'a>(
    windows: &'a [Window],
    pods: &[Pod],
    expiry: Option<Timestamp>,
    now: Timestamp,
) -> Option<&'a Window> {
    let nodes = nodes_of(pods);
    windows
        .iter()
        .filter(|w| w.end > now)
        .filter(|w| expiry.is_none_or(|e| w.start < e))
        .filter(|w| w.all_nodes() || nodes.iter().any(|n| w.covers(n)))
        .min_by_key(|w| (w.start, w.id.clone()))
}

/// What the monitor does about the window that cuts a running job.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'a> {
    /// The window has begun: end the job, charged up to `at`.
    End { window: &'a Window, at: Timestamp },
    /// Tell the user (once per window and start) and look again at the window's start.
    Warn {
        window: &'a Window,
        event: Box<JobEvent>,
    },
    /// Nothing to say yet: look again at `next_check`.
    Wait { next_check: Timestamp },
}

/// The decision for a running job that `window` will cut, given what was warned already.
pub fn decide<'a>(
    job_id: &str,
    window: &'a Window,
    started: Option<Timestamp>,
    warned: Option<&str>,
    warn_before: SignedDuration,
    now: Timestamp,
) -> Decision<'a> {
    if now >= window.start {
        // Never before the job's start: a job that started on a window's node after its start (the
        // window was scheduled later) is charged nothing it did not run.
        let at = started.map_or(window.start, |s| s.max(window.start));
        return Decision::End { window, at };
    }
    let warn_at = window
        .start
        .checked_sub(warn_before)
        .unwrap_or(window.start);
    let token = warned_token(window);
    if warn_before.is_positive() && now >= warn_at && warned != Some(token.as_str()) {
        return Decision::Warn {
            window,
            event: Box::new(warning(job_id, window, warn_at)),
        };
    }
    let next_check = if warn_before.is_positive() && now < warn_at {
        warn_at
    } else {
        window.start
    };
    Decision::Wait { next_check }
}

/// What `maintenanceWarned` says once the warning for `window` is out.
pub fn warned_token(window: &Window) -> String {
    format!("{}/{}", window.id, window.start.as_millisecond())
}

/// The warning, `<jobId>/maintenance/<window id>/<start ms>/warning`. Its time is when its threshold
/// was crossed, or when the window was scheduled if that was later: both read from the window, so every
/// runner publishes the same message.
fn warning(job_id: &str, window: &Window, warn_at: Timestamp) -> JobEvent {
    let at = window.created_at.map_or(warn_at, |c| c.max(warn_at));
    JobEvent {
        event_id: crate::durable::ids::maintenance_warning(
            job_id,
            &window.id,
            window.start.as_millisecond(),
        ),
        job_id: job_id.to_owned(),
        state: JobState::Unspecified as i32,
        status: format!(
            "The job will be stopped at {} for the maintenance window {}; it is charged up to then",
            window.start,
            window.describe()
        ),
        reason: WARNING_REASON.to_owned(),
        timestamp: Some(proto_timestamp(at)),
        ..JobEvent::default()
    }
}

/// Whether a job that has not started is held back by the maintenance gate: its pods carry it, or it was
/// created held (`<prefix>maintenanceHeld`) and Volcano has not made its pods yet. The one rule the
/// monitor's decision and both replays (the monitor's and `admin queue`'s) read.
pub fn held_back(created_held: bool, no_pods: bool, any_gated: bool) -> bool {
    any_gated || (created_held && no_pods)
}

/// The effect of the maintenance taints: nothing new is placed on the window's nodes, nothing running
/// there is evicted (a window cuts what runs at its start, see [`cutting`]).
pub const TAINT_EFFECT: &str = "NoSchedule";

/// The taint that keeps what does not tolerate window `id` off its nodes: key `key`
/// (`<prefix>maintenance`, [`crate::durable::AnnotationKeys::maintenance_taint`]), value the id.
pub fn taint(key: &str, id: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        value: Some(id.to_owned()),
        effect: TAINT_EFFECT.to_owned(),
        time_added: None,
    }
}

/// The toleration of window `id`'s taint, as the monitor adds it to a waiting pod: `key=id`, `Equal`.
pub fn toleration(key: &str, id: &str) -> Toleration {
    Toleration {
        key: Some(key.to_owned()),
        operator: Some("Equal".to_owned()),
        value: Some(id.to_owned()),
        effect: Some(TAINT_EFFECT.to_owned()),
        toleration_seconds: None,
    }
}

/// Whether `pod` tolerates window `id`'s taint (`key=id:NoSchedule`), under the scheduler's rules: an
/// `Exists` toleration of its key (or of every key), or an `Equal` one (the default operator) of its
/// key and value, with the `NoSchedule` effect or none.
pub fn tolerates(pod: &Pod, key: &str, id: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| {
            let effect = t.effect.as_deref().unwrap_or_default();
            let t_key = t.key.as_deref().unwrap_or_default();
            if !(effect.is_empty() || effect == TAINT_EFFECT) {
                return false;
            }
            match t.operator.as_deref() {
                Some("Exists") => t_key.is_empty() || t_key == key,
                None | Some("Equal") => t_key == key && t.value.as_deref() == Some(id),
                Some(_) => false,
            }
        })
}

/// The pods of a job that the scheduler has yet to place (a pod's tolerations matter only until then).
pub fn unbound(pods: &[Pod]) -> impl Iterator<Item = &Pod> {
    pods.iter().filter(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_none()
    })
}

/// Whether a job whose pods are `pods` tolerates window `id`: it has pods and each that is not placed
/// yet tolerates its taint (`key=id`). A job without pods does not (Volcano makes them from the job's
/// template, which tolerates no window), and one whose pods are all placed does (nothing is left to
/// keep away).
pub fn job_tolerates(pods: &[Pod], key: &str, id: &str) -> bool {
    !pods.is_empty() && unbound(pods).all(|p| tolerates(p, key, id))
}

/// Whether a job that has not started is held back by a window, for the replay and the monitor alike:
/// the maintenance gate holds it ([`held_back`]), or, with the taints written (`taints`), a window that
/// is not over at `now` and that it does not tolerate (`tolerated`) keeps it off that window's nodes.
pub fn held_by_window(
    windows: &[Window],
    gate_holds: bool,
    taints: bool,
    tolerated: impl Fn(&Window) -> bool,
    now: Timestamp,
) -> bool {
    gate_holds || (taints && windows.iter().any(|w| w.end > now && !tolerated(w)))
}

/// One node's new taints, when the maintenance windows call for a change.
#[derive(Debug, Clone, PartialEq)]
pub struct TaintChange {
    /// The index of the node in the list planned for.
    pub node: usize,
    /// Its whole new list: its other taints as they were, and the maintenance taint if a window covers
    /// it.
    pub taints: Vec<Taint>,
    /// The window whose id the taint carries now (for the log); empty once none does.
    pub windows: Vec<String>,
}

/// The window whose id a node's maintenance taint carries: the earliest-starting (then least id) window
/// not over at `now` that covers the node. A job that ends before it starts ends before every later
/// one, so a job that tolerates it (let go for it) is in the way of none on that node, and one it is in
/// the way of is kept off the node by it; when it ends or is cancelled, the value moves on to the next.
pub fn node_window<'a>(windows: &'a [Window], node: &str, now: Timestamp) -> Option<&'a Window> {
    windows
        .iter()
        .filter(|w| w.end > now && w.covers(node))
        .min_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)))
}

/// Whether `t` is a maintenance taint: the key `key`, or one of the per-window keys `<key>-<id>` an
/// earlier version of the monitor wrote (removed like the taint of a window that is over).
fn maintenance_taint(t: &Taint, key: &str) -> bool {
    t.key == key
        || t.key
            .strip_prefix(key)
            .is_some_and(|rest| rest.starts_with('-'))
}

/// What to change on the nodes so that each carries one maintenance taint, `key=<id>:NoSchedule`,
/// while a window not over at `now` covers it (the id of [`node_window`]), and no other (of a window
/// over, cancelled, or no longer listed). Decided from the windows and the taints alone: a runner
/// killed between two nodes leaves the next pass the rest to do.
pub fn plan_taints(
    nodes: &[super::reserve::NodeTaints],
    windows: &[Window],
    key: &str,
    now: Timestamp,
) -> Vec<TaintChange> {
    let mut out = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let wanted = node_window(windows, &node.name, now).map(|w| taint(key, &w.id));
        let current: Vec<&Taint> = node
            .taints
            .iter()
            .filter(|t| maintenance_taint(t, key))
            .collect();
        let same = match (&wanted, current.as_slice()) {
            (None, []) => true,
            (Some(w), [c]) => (&c.key, &c.value, &c.effect) == (&w.key, &w.value, &w.effect),
            _ => false,
        };
        if same {
            continue;
        }
        let mut taints: Vec<Taint> = node
            .taints
            .iter()
            .filter(|t| !maintenance_taint(t, key))
            .cloned()
            .collect();
        let windows_now = wanted.iter().filter_map(|t| t.value.clone()).collect();
        taints.extend(wanted);
        out.push(TaintChange {
            node: i,
            taints,
            windows: windows_now,
        });
    }
    out
}

/// How a job that has not started stands towards the windows, and the windows whose taint its waiting
/// pods are to tolerate from now on.
///
/// - `gated`: its pods are (or will be) held back by the maintenance gate ([`held_back`]). Held while a
///   window is in the way now or at its `expected` start (see [`waiting`]); once none is, the gate goes,
///   and with the taints written (`taints`) its pods tolerate every window not over.
/// - not gated, with the taints written: held by the earliest window in its way (now or at its
///   expected start) that it does not tolerate (`tolerated`); a window in its way now that it tolerates
///   already (let go earlier, it has waited since) cannot be taken back: told what it will do to it. Its
///   pods tolerate every window not over that is not in its way.
/// - not gated, no taints (the node patch refused): judged by now alone, and told what the window will
///   do to it: whatever is told, it may start.
pub fn pending<'a>(
    windows: &'a [Window],
    gated: bool,
    taints: bool,
    tolerated: impl Fn(&Window) -> bool,
    max_time: Option<SignedDuration>,
    expected: Option<Timestamp>,
    now: Timestamp,
) -> (Option<Waiting<'a>>, Vec<&'a Window>) {
    let d = decide_pending(
        windows,
        gated,
        taints,
        tolerated,
        |_| true,
        max_time,
        expected,
        now,
    );
    (d.waiting, d.tolerate)
}

/// What [`decide_pending`] decides for a job that has not started.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingDecision<'a> {
    /// How it stands towards the windows, to be told.
    pub waiting: Option<Waiting<'a>>,
    /// The windows whose taint its waiting pods are to tolerate from now on.
    pub tolerate: Vec<&'a Window>,
    /// A window holds it by its taint, which is not on the nodes yet: nothing is told until it is (nor
    /// that it cannot be held, should the node patch be refused).
    pub until_tainted: bool,
}

/// [`pending`], knowing which windows' taints are on the nodes (`tainted`): a job is told it is held
/// by a window's taint only once the taint is there.
#[allow(clippy::too_many_arguments)]
pub fn decide_pending<'a>(
    windows: &'a [Window],
    gated: bool,
    taints: bool,
    tolerated: impl Fn(&Window) -> bool,
    tainted: impl Fn(&Window) -> bool,
    max_time: Option<SignedDuration>,
    expected: Option<Timestamp>,
    now: Timestamp,
) -> PendingDecision<'a> {
    let (waiting, tolerate) =
        pending_windows(windows, gated, taints, &tolerated, max_time, expected, now);
    let until_tainted = !gated && matches!(waiting, Some(Waiting::Held(w)) if !tainted(w));
    PendingDecision {
        waiting: waiting.filter(|_| !until_tainted),
        tolerate,
        until_tainted,
    }
}

fn pending_windows<'a>(
    windows: &'a [Window],
    gated: bool,
    taints: bool,
    tolerated: &impl Fn(&Window) -> bool,
    max_time: Option<SignedDuration>,
    expected: Option<Timestamp>,
    now: Timestamp,
) -> (Option<Waiting<'a>>, Vec<&'a Window>) {
    let expected = expected.filter(|e| *e > now);
    let in_way_now = |w: &Window| w.in_the_way(now, max_time);
    let in_way = |w: &Window| in_way_now(w) || expected.is_some_and(|e| w.in_the_way(e, max_time));
    let live = || windows.iter().filter(|w| w.end > now);
    let earliest = |it: &mut dyn Iterator<Item = &'a Window>| {
        it.min_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)))
    };
    if gated {
        if let Some(w) = earliest(&mut live().filter(|w| in_way(w))) {
            return (Some(Waiting::Held(w)), Vec::new());
        }
        let tolerate = if taints {
            live().filter(|w| !tolerated(w)).collect()
        } else {
            Vec::new()
        };
        return (None, tolerate);
    }
    if !taints {
        let queued = crate::cluster::maintenance::holding(windows, now, max_time);
        return (queued.map(Waiting::NotHeld), Vec::new());
    }
    let waiting = earliest(&mut live().filter(|w| in_way(w) && !tolerated(w)))
        .map(Waiting::Held)
        .or_else(|| earliest(&mut live().filter(|w| in_way_now(w))).map(Waiting::NotHeld));
    let tolerate = live().filter(|w| !in_way(w) && !tolerated(w)).collect();
    (waiting, tolerate)
}

/// How a job that has not started stands towards the window in the way of its time allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting<'a> {
    /// Its pods are gated: it does not start before the window's end.
    Held(&'a Window),
    /// Nothing keeps it off the window's nodes (queued before the window was scheduled, and the node
    /// taint not written, or tolerated already): it may start, and the window then ends it like any
    /// running job.
    NotHeld(&'a Window),
}

/// How the job that has not started stands towards the windows: `gated`, whether its pods are (or will
/// be: no pods yet and the job created held) held back by the maintenance gate; `expected`, when the
/// start-time estimate expects it to start.
///
/// A gated job stays held while a window is in the way now, or at its expected start: a job that waits
/// for room would otherwise be let go before a window and start into it once room is made (a gate
/// cannot be put back). A job without a gate is judged by now alone: whatever is told, it may start.
pub fn waiting<'a>(
    windows: &'a [Window],
    gated: bool,
    max_time: Option<SignedDuration>,
    expected: Option<Timestamp>,
    now: Timestamp,
) -> Option<Waiting<'a>> {
    pending(windows, gated, false, |_| false, max_time, expected, now).0
}

impl<'a> Waiting<'a> {
    pub fn window(&self) -> &'a Window {
        match self {
            Self::Held(w) | Self::NotHeld(w) => w,
        }
    }

    /// What the job is told, once per window.
    pub fn text(&self) -> String {
        match self {
            Self::Held(w) => format!(
                "The job waits for the maintenance window {} until {}",
                w.id, w.end
            ),
            Self::NotHeld(w) => format!(
                "The job can no longer be held back for the maintenance window {}: if the job starts before {} and runs on a node the window takes, it is stopped at {} (at once during the window)",
                w.describe(),
                w.end,
                w.start
            ),
        }
    }

    /// The status event, `<jobId>/maintenance/<window id>/<start ms>/held` (or `/queued`): its id and
    /// time are functions of the job and the window, so every runner tells the same message. Its time
    /// is when the job began waiting for the window: its creation, or the window's if later.
    pub fn event(&self, job_id: &str, created: Option<Timestamp>) -> JobEvent {
        let w = self.window();
        let at = match (created, w.created_at) {
            (Some(c), Some(w)) => c.max(w),
            (c, w) => c.or(w).unwrap_or(self.window().start),
        };
        JobEvent {
            event_id: crate::durable::ids::maintenance_held(
                job_id,
                &w.id,
                w.start.as_millisecond(),
                matches!(self, Self::Held(_)),
            ),
            job_id: job_id.to_owned(),
            state: JobState::Unspecified as i32,
            status: self.text(),
            reason: REASON.to_owned(),
            timestamp: Some(proto_timestamp(at)),
            ..JobEvent::default()
        }
    }
}

/// The terminal status of a job ended for `window`.
pub fn end_status(window: &Window) -> String {
    format!(
        "The job was stopped at the start of the maintenance window {}",
        window.describe()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn window(id: &str, start: i64, end: i64, nodes: &[&str]) -> Window {
        Window {
            id: id.into(),
            start: ts(start),
            end: ts(end),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            reason: None,
            created_at: Some(ts(0)),
            created_by: None,
        }
    }

    fn on(node: &str) -> Pod {
        Pod {
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn only_windows_over_the_jobs_nodes_and_before_its_expiry_cut_it() {
        let windows = [
            window("other-node", 100, 200, &["n2"]),
            window("after-expiry", 5000, 6000, &[]),
            window("over", 10, 20, &[]),
            window("mine", 300, 400, &["n1"]),
            window("all", 500, 600, &[]),
        ];
        let pods = [on("n1")];
        let w = cutting(&windows, &pods, Some(ts(4000)), ts(50)).unwrap();
        assert_eq!(w.id, "mine");
        let w = cutting(&windows, &[on("n3")], Some(ts(4000)), ts(50)).unwrap();
        assert_eq!(w.id, "all");
        assert!(cutting(&windows, &[on("n3")], Some(ts(450)), ts(50)).is_none());
    }

    #[test]
    fn a_job_waits_for_a_window_in_the_way_and_is_told_the_same_by_every_runner() {
        let windows = [window("w", 7200, 9000, &[])];
        let hour = Some(SignedDuration::from_hours(1));
        // Ends before the window starts: not held.
        assert_eq!(waiting(&windows, true, hour, None, ts(0)), None);
        assert_eq!(waiting(&windows, true, hour, Some(ts(100)), ts(0)), None);
        // ... unless it is expected to start so late that it would run into it (held while gated; a
        // job without the gate may start whenever room is made).
        assert_eq!(
            waiting(&windows, true, hour, Some(ts(5000)), ts(0)),
            Some(Waiting::Held(&windows[0]))
        );
        assert_eq!(waiting(&windows, false, hour, Some(ts(5000)), ts(0)), None);
        assert_eq!(waiting(&windows, true, hour, Some(ts(9000)), ts(0)), None);
        // Would run into it.
        let held = waiting(&windows, true, hour, None, ts(3700)).unwrap();
        assert_eq!(held, Waiting::Held(&windows[0]));
        let event = held.event("7", Some(ts(3600)));
        assert_eq!(event.event_id, "7/maintenance/w/1800007200000/held");
        assert_eq!(event.reason, REASON);
        assert_eq!(
            event.status,
            format!(
                "The job waits for the maintenance window w until {}",
                ts(9000)
            )
        );
        assert_eq!(event.timestamp.unwrap().seconds, ts(3600).as_second());
        // Created before the window was: told from the window's creation.
        assert_eq!(
            held.event("7", Some(ts(-50))).timestamp.unwrap().seconds,
            ts(0).as_second()
        );
        // Not gated: told what will happen instead, under another id.
        let queued = waiting(&windows, false, None, None, ts(100)).unwrap();
        assert_eq!(queued, Waiting::NotHeld(&windows[0]));
        assert!(queued.event("7", None).event_id.ends_with("/queued"));
        // Over: nothing holds it.
        assert_eq!(waiting(&windows, true, None, None, ts(9000)), None);
    }

    const KEY: &str = "ucloud.dk/maintenance";

    fn waiting_pod(tolerating: &[&str]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                tolerations: Some(tolerating.iter().map(|w| toleration(KEY, w)).collect()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn tolerations_count_as_the_scheduler_counts_them() {
        let pod = waiting_pod(&["w1"]);
        assert!(tolerates(&pod, KEY, "w1"));
        assert!(!tolerates(&pod, KEY, "w2"));
        let with = |t: Toleration| Pod {
            spec: Some(PodSpec {
                tolerations: Some(vec![t]),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let exists = Toleration {
            key: Some(KEY.into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        };
        assert!(tolerates(&with(exists.clone()), KEY, "w2"));
        let everything = Toleration {
            operator: Some("Exists".into()),
            ..Toleration::default()
        };
        assert!(tolerates(&with(everything), KEY, "w2"));
        let no_execute = Toleration {
            effect: Some("NoExecute".into()),
            ..exists
        };
        assert!(!tolerates(&with(no_execute), KEY, "w2"));
        let wrong_value = Toleration {
            value: Some("w3".into()),
            ..toleration(KEY, "w2")
        };
        assert!(!tolerates(&with(wrong_value), KEY, "w2"));
        // A job: every pod not placed yet must tolerate it; one without pods does not.
        assert!(!job_tolerates(&[], KEY, "w1"));
        assert!(job_tolerates(&[pod.clone(), on("n1")], KEY, "w1"));
        assert!(!job_tolerates(&[pod, waiting_pod(&[])], KEY, "w1"));
        assert!(job_tolerates(&[on("n1")], KEY, "w1"));
    }

    #[test]
    fn each_node_carries_one_taint_valued_with_the_earliest_window_over_it() {
        use super::super::reserve::NodeTaints;
        let windows = [
            window("all", 100, 200, &[]),
            window("n1-only", 50, 300, &["n1"]),
            window("over", -100, -10, &[]),
        ];
        let other = Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        let node = |name: &str, taints: Vec<Taint>| NodeTaints {
            name: name.into(),
            resource_version: Some("3".into()),
            taints,
        };
        let legacy = Taint {
            key: format!("{KEY}-cancelled"),
            ..taint(KEY, "cancelled")
        };
        let nodes = [
            // Carries a per-window taint of an earlier version, and another's.
            node("n1", vec![other.clone(), legacy]),
            // Has what it needs.
            node("n2", vec![taint(KEY, "all")]),
            node("n3", vec![]),
        ];
        let changes = plan_taints(&nodes, &windows, KEY, ts(0));
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert_eq!(changes[0].node, 0);
        assert_eq!(
            changes[0].taints,
            vec![other.clone(), taint(KEY, "n1-only")],
            "two windows over one node: one taint, the earliest's"
        );
        assert_eq!(changes[1].node, 2);
        assert_eq!(changes[1].windows, vec!["all".to_owned()]);
        assert_eq!(changes[1].taints, vec![taint(KEY, "all")]);
        // Planned again on what was written: nothing more to do.
        let written: Vec<NodeTaints> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match changes.iter().find(|c| c.node == i) {
                Some(c) => node(&n.name, c.taints.clone()),
                None => n.clone(),
            })
            .collect();
        assert!(plan_taints(&written, &windows, KEY, ts(0)).is_empty());
        // The earliest cancelled: the value moves on to the next.
        let moved = plan_taints(&written, &windows[..1], KEY, ts(0));
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(moved[0].taints, vec![other.clone(), taint(KEY, "all")]);
        // Once over, the taint goes where no other window covers the node.
        let later = plan_taints(&written, &windows, KEY, ts(250));
        assert_eq!(later.len(), 2, "{later:?}");
        assert_eq!((later[0].node, later[1].node), (1, 2));
        assert!(later[0].taints.is_empty() && later[0].windows.is_empty());
        let all_over = plan_taints(&written, &windows, KEY, ts(300));
        assert_eq!(all_over.len(), 3, "{all_over:?}");
        assert_eq!(all_over[0].taints, vec![other]);
    }

    #[test]
    fn with_the_taints_a_queued_job_is_held_by_a_window_in_its_way_and_tolerates_the_others() {
        let windows = [
            window("soon", 7200, 9000, &[]),
            window("later", 20000, 21000, &["n1"]),
        ];
        let hour = Some(SignedDuration::from_hours(1));
        let four = Some(SignedDuration::from_hours(4));
        let none = |_: &Window| false;
        // A long job: held by the first window, tolerates only the one it ends before.
        let (waiting, tolerate) = pending(&windows, false, true, none, four, None, ts(0));
        assert_eq!(waiting, Some(Waiting::Held(&windows[0])));
        assert_eq!(tolerate, vec![&windows[1]], "it ends before the other");
        // A short one: tolerates both, nothing holds it.
        let (waiting, tolerate) = pending(&windows, false, true, none, hour, None, ts(0));
        assert_eq!(waiting, None);
        assert_eq!(tolerate, vec![&windows[0], &windows[1]]);
        // ... unless it is expected to start into one: held by it, and tolerates the other.
        let (waiting, tolerate) = pending(&windows, false, true, none, hour, Some(ts(5000)), ts(0));
        assert_eq!(waiting, Some(Waiting::Held(&windows[0])));
        assert_eq!(tolerate, vec![&windows[1]]);
        // Let go before (it tolerates the window) and waited since: it cannot be held any more.
        let tolerated = |w: &Window| w.id == "soon";
        let (waiting, tolerate) = pending(&windows, false, true, tolerated, hour, None, ts(7000));
        assert_eq!(waiting, Some(Waiting::NotHeld(&windows[0])));
        assert_eq!(tolerate, vec![&windows[1]]);
        // Without the taints (the node patch refused): only told.
        let (waiting, tolerate) = pending(&windows, false, false, none, four, None, ts(0));
        assert_eq!(waiting, Some(Waiting::NotHeld(&windows[0])));
        assert!(tolerate.is_empty());
        // A gated job, once no window is in its way, tolerates every window not over.
        let (waiting, tolerate) = pending(&windows, true, true, none, hour, None, ts(9000));
        assert_eq!(waiting, None);
        assert_eq!(tolerate, vec![&windows[1]]);
        let (waiting, tolerate) = pending(&windows, true, true, none, four, None, ts(0));
        assert_eq!(waiting, Some(Waiting::Held(&windows[0])));
        assert!(tolerate.is_empty());
        // Told it is held only once the taint that holds it is on the nodes.
        let d = decide_pending(&windows, false, true, none, |_| false, four, None, ts(0));
        assert!(d.until_tainted && d.waiting.is_none(), "{d:?}");
        assert_eq!(d.tolerate, vec![&windows[1]]);
        let d = decide_pending(&windows, false, true, none, |_| true, four, None, ts(0));
        assert!(!d.until_tainted);
        assert_eq!(d.waiting, Some(Waiting::Held(&windows[0])));
        // The replay's rule: held while a window not over is not tolerated.
        assert!(held_by_window(&windows, false, true, none, ts(0)));
        assert!(!held_by_window(&windows, false, true, |_| true, ts(0)));
        assert!(!held_by_window(&windows, false, false, none, ts(0)));
        assert!(!held_by_window(&windows, false, true, none, ts(21000)));
        assert!(held_by_window(&windows, true, false, none, ts(21000)));
    }

    #[test]
    fn warn_once_ahead_then_end_at_the_start() {
        let w = window("w", 7200, 9000, &[]);
        let lead = SignedDuration::from_hours(1);
        assert_eq!(
            decide("7", &w, Some(ts(0)), None, lead, ts(100)),
            Decision::Wait {
                next_check: ts(3600)
            }
        );
        let Decision::Warn { event, .. } = decide("7", &w, Some(ts(0)), None, lead, ts(3700))
        else {
            panic!("a warning is due");
        };
        assert_eq!(event.reason, WARNING_REASON);
        assert_eq!(event.timestamp.unwrap().seconds, ts(3600).as_second());
        let token = warned_token(&w);
        assert_eq!(
            decide("7", &w, Some(ts(0)), Some(&token), lead, ts(3700)),
            Decision::Wait {
                next_check: ts(7200)
            }
        );
        assert_eq!(
            decide("7", &w, Some(ts(0)), Some(&token), lead, ts(7260)),
            Decision::End {
                window: &w,
                at: ts(7200)
            }
        );
        // Started after the window's start (on a node the window was put on later): charged nothing.
        assert_eq!(
            decide("7", &w, Some(ts(7230)), None, lead, ts(7260)),
            Decision::End {
                window: &w,
                at: ts(7230)
            }
        );
    }
}
