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
//! ([`crate::cluster::maintenance::holding`]). A job created while one was in the way carries the
//! scheduling gate `<prefix>maintenance` on its pods and `<prefix>maintenanceHeld` on itself (the
//! submit path puts them there); the monitor tells it once per window until when it waits
//! ([`waiting`]; a later start the replay of [`super::estimate_windows`] expects is told as a change), and
//! removes the gate once no window is in the way (the window over, cancelled, or
//! the job short enough to end before the next one). A job queued before the window was scheduled
//! cannot be held back any more (a pod's gates can only be removed after its creation): it is told once
//! what the window will do to it. Everything is decided from the windows and the pods as they are, so a
//! runner that dies holding a job leaves its release to whoever monitors the job next.

use std::collections::BTreeSet;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;

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

/// How a job that has not started stands towards the window in the way of its time allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting<'a> {
    /// Its pods are gated: it does not start before the window's end.
    Held(&'a Window),
    /// It was queued before the window was scheduled and its pods are not gated: it may start, and the
    /// window then ends it like any running job.
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
    use crate::cluster::maintenance::holding;
    if !gated {
        return holding(windows, now, max_time).map(Waiting::NotHeld);
    }
    holding(windows, now, max_time)
        .or_else(|| holding(windows, expected.filter(|e| *e > now)?, max_time))
        .map(Waiting::Held)
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
                "The maintenance window {} was scheduled after the job was queued, when it could no longer be held back: if the job starts before {} and runs on a node the window takes, it is stopped at {} (at once during the window)",
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
