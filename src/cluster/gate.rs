//! The submission gate: "may this runner take submissions now?", from the pause switch and the capacity
//! view, as a `tokio::sync::watch` the submit consumer follows.
//!
//! [`SubmitGate::new`] returns the gate and a [`GateDriver`]; the caller runs the driver (it owns the two
//! watches) with its shutdown future. The submit consumer waits with
//! `gate.subscribe().wait_for(GateState::accepts_submissions)`, and reserves a capacity slot per job
//! with [`SubmitGate::try_reserve`]. Cancels and extensions never look at the gate.
//!
//! Until the driver has heard from the cluster the gate is closed: a runner that cannot read the pause
//! switch does not know it is allowed to take work (and could not apply it anyway).
//!
//! Both watches are `kube::runtime::watcher` streams with backoff, restarted every
//! `[cluster] relist_interval` so a watch that went quiet without an error is caught (W1).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::time::Instant;

use super::ClusterConfig;
use super::capacity::{Counts, volcano_job_resource};
use super::pause::PauseState;

/// What the gate knows. Published on every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateState {
    /// The pause switch, `None` until first read.
    pub pause: Option<PauseState>,
    /// Active managed VolcanoJobs (including this runner's committed, not yet watched ones). `None`
    /// until first counted, and always `None` without a cap.
    pub active_jobs: Option<usize>,
    /// Slots reserved by handlers applying a job right now.
    pub reserved: usize,
    /// The configured cap.
    pub max_active_jobs: Option<u32>,
}

impl GateState {
    /// Whether the submit consumer may take a message: not paused, and below the cap if there is one.
    pub fn accepts_submissions(&self) -> bool {
        self.closed_because().is_none()
    }

    /// Why the gate is closed, in words for a log line or `admin status`; `None` when open.
    pub fn closed_because(&self) -> Option<String> {
        match &self.pause {
            None => return Some("the pause switch has not been read yet".into()),
            Some(p) if p.paused => {
                return Some(match &p.reason {
                    Some(reason) => format!("paused: {reason}"),
                    None => "paused".into(),
                });
            }
            Some(_) => {}
        }
        let max = self.max_active_jobs?;
        match self.active_jobs {
            None => Some("active jobs have not been counted yet".into()),
            Some(active) if active + self.reserved >= max as usize => Some(format!(
                "at capacity: {active} active jobs and {} being created, cap {max}",
                self.reserved
            )),
            Some(_) => None,
        }
    }
}

/// What the gate tracks, behind one lock. Never held across an `.await`.
#[derive(Debug, Default)]
struct Inner {
    pause: Option<PauseState>,
    counts: Counts,
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    tx: watch::Sender<GateState>,
    max: Option<u32>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means a panic elsewhere mid-update; the counts are still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the state under the lock and publishes it if it changed. Publishing under the lock keeps
    /// concurrent updates in order.
    fn update<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut inner = self.lock();
        let out = f(&mut inner);
        let state = self.state_of(&mut inner);
        self.tx.send_if_modified(|current| {
            let changed = *current != state;
            if changed {
                *current = state;
            }
            changed
        });
        out
    }

    fn state_of(&self, inner: &mut Inner) -> GateState {
        GateState {
            pause: inner.pause.clone(),
            active_jobs: self.max.and_then(|_| inner.counts.active(Instant::now())),
            reserved: inner.counts.reserved,
            max_active_jobs: self.max,
        }
    }
}

/// The gate the submit consumer follows. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SubmitGate {
    shared: Arc<Shared>,
}

impl SubmitGate {
    /// A closed gate and the driver that opens it from the cluster's state.
    pub fn new(client: kube::Client, config: &ClusterConfig) -> (Self, GateDriver) {
        let max = config.max_active_jobs;
        let (tx, _) = watch::channel(GateState {
            max_active_jobs: max,
            ..GateState::default()
        });
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            tx,
            max,
        });
        let driver = GateDriver {
            shared: shared.clone(),
            client,
            namespace: config.namespace.clone(),
            pause_name: config.pause_configmap.clone(),
            selector: config.managed_selector.clone(),
            relist: config.relist_interval,
        };
        (Self { shared }, driver)
    }

    /// A receiver of every change of the gate's state.
    pub fn subscribe(&self) -> watch::Receiver<GateState> {
        self.shared.tx.subscribe()
    }

    /// The current state.
    pub fn state(&self) -> GateState {
        self.shared.tx.borrow().clone()
    }

    /// Reserves a capacity slot for one submission. `None` when the cap is reached (including slots
    /// reserved by other handlers) or the jobs have not been counted yet. Without a cap it always
    /// succeeds. The pause switch is not checked here: the consumer checks it before taking a message.
    pub fn try_reserve(&self) -> Option<CapacityPermit> {
        let reserved = self.shared.update(|inner| {
            if let Some(max) = self.shared.max {
                let active = inner.counts.active(Instant::now())?;
                if active + inner.counts.reserved >= max as usize {
                    return None;
                }
            }
            inner.counts.reserved += 1;
            Some(())
        });
        reserved.map(|()| CapacityPermit {
            shared: self.shared.clone(),
            released: false,
        })
    }
}

/// A reserved capacity slot. [`commit`](Self::commit) it once the job exists; dropping it without a
/// commit (the apply failed, the job was a duplicate) frees the slot.
#[derive(Debug)]
pub struct CapacityPermit {
    shared: Arc<Shared>,
    released: bool,
}

impl CapacityPermit {
    /// The job `namespace/name` was created: it counts as active from now on.
    pub fn commit(mut self, namespace: &str, name: &str) {
        self.released = true;
        let key = (namespace.to_owned(), name.to_owned());
        self.shared.update(|inner| {
            inner.counts.reserved = inner.counts.reserved.saturating_sub(1);
            inner.counts.commit(key, Instant::now());
        });
    }
}

impl Drop for CapacityPermit {
    fn drop(&mut self) {
        if !self.released {
            self.shared.update(|inner| {
                inner.counts.reserved = inner.counts.reserved.saturating_sub(1);
            });
        }
    }
}

/// Runs the watches behind a [`SubmitGate`]. Owned by the caller, which runs it until shutdown.
pub struct GateDriver {
    shared: Arc<Shared>,
    client: kube::Client,
    namespace: String,
    pause_name: String,
    selector: String,
    relist: Duration,
}

impl GateDriver {
    /// Follows the pause switch and (with a cap) the active jobs until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let pause = self.follow_pause();
        let capacity = async {
            if self.shared.max.is_some() {
                self.follow_capacity().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = shutdown => {}
            () = pause => {}
            () = capacity => {}
        }
    }

    async fn follow_pause(&self) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", self.pause_name));
        let mut listed: Option<PauseState> = None;
        loop {
            let stream = watcher::watcher(api.clone(), config.clone()).default_backoff();
            let handle = |event: Event<ConfigMap>| match event {
                Event::Init => listed = Some(PauseState::default()),
                Event::InitApply(cm) => listed = Some(PauseState::from_configmap(Some(&cm))),
                Event::InitDone => {
                    let state = listed.take().unwrap_or_default();
                    self.shared.update(|inner| inner.pause = Some(state));
                }
                Event::Apply(cm) => {
                    let state = PauseState::from_configmap(Some(&cm));
                    self.shared.update(|inner| inner.pause = Some(state));
                }
                Event::Delete(_) => {
                    self.shared
                        .update(|inner| inner.pause = Some(PauseState::default()));
                }
            };
            drive_until(stream, self.relist, "pause switch", handle).await;
        }
    }

    async fn follow_capacity(&self) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &volcano_job_resource());
        let config = watcher::Config::default().labels(&self.selector);
        loop {
            let stream = watcher::watcher(api.clone(), config.clone()).default_backoff();
            let handle = |event: Event<DynamicObject>| {
                self.shared.update(|inner| inner.counts.observe(event));
            };
            drive_until(stream, self.relist, "active jobs", handle).await;
        }
    }
}

/// Feeds a watch stream's events to `handle` for `relist`, then returns so the caller starts over with a
/// fresh listing. Errors are logged; the stream's backoff paces the retries.
async fn drive_until<K, S>(
    stream: S,
    relist: Duration,
    what: &str,
    mut handle: impl FnMut(Event<K>),
) where
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::sleep(relist);
    let mut deadline = std::pin::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return,
            next = stream.next() => match next {
                Some(Ok(event)) => handle(event),
                Some(Err(e)) => tracing::warn!(watch = what, error = %e, "Watch failed; retrying."),
                None => return,
            },
        }
    }
}

/// Reports the submission gate (pause switch, capacity) as it changes, until `shutdown`.
pub async fn follow_gate(
    mut gate: tokio::sync::watch::Receiver<GateState>,
    metrics: crate::ops::Metrics,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        {
            let state = gate.borrow_and_update();
            metrics.set_paused(state.pause.as_ref().is_some_and(|p| p.paused));
            metrics.set_gate_open(state.accepts_submissions());
            metrics.set_capacity(state.active_jobs.map(|a| a as u64), state.max_active_jobs);
        }
        tokio::select! {
            changed = gate.changed() => if changed.is_err() { return },
            () = &mut shutdown => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(
        paused: Option<bool>,
        active: Option<usize>,
        reserved: usize,
        max: Option<u32>,
    ) -> GateState {
        GateState {
            pause: paused.map(|paused| PauseState {
                paused,
                reason: paused.then(|| "upgrade".to_owned()),
                ..PauseState::default()
            }),
            active_jobs: active,
            reserved,
            max_active_jobs: max,
        }
    }

    #[test]
    fn the_gate_opens_only_when_everything_is_known_and_fine() {
        assert!(!state(None, None, 0, None).accepts_submissions());
        assert!(state(Some(false), None, 0, None).accepts_submissions());
        let paused = state(Some(true), None, 0, None);
        assert_eq!(paused.closed_because().as_deref(), Some("paused: upgrade"));
        assert!(!state(Some(false), None, 0, Some(3)).accepts_submissions());
        assert!(state(Some(false), Some(2), 0, Some(3)).accepts_submissions());
        assert!(!state(Some(false), Some(3), 0, Some(3)).accepts_submissions());
        let full = state(Some(false), Some(2), 1, Some(3));
        assert!(
            full.closed_because().unwrap().contains("at capacity"),
            "{full:?}"
        );
    }

    fn gate(max: Option<u32>) -> SubmitGate {
        let (tx, _) = watch::channel(GateState::default());
        SubmitGate {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner::default()),
                tx,
                max,
            }),
        }
    }

    fn listed(gate: &SubmitGate) {
        gate.shared.update(|inner| {
            inner.pause = Some(PauseState::default());
            inner.counts.observe(Event::Init);
            inner.counts.observe(Event::InitDone);
        });
    }

    #[test]
    fn reservations_hold_the_cap_within_a_runner() {
        let gate = gate(Some(2));
        assert!(gate.try_reserve().is_none(), "not counted yet");
        listed(&gate);
        let a = gate.try_reserve().expect("first slot");
        let b = gate.try_reserve().expect("second slot");
        assert!(gate.try_reserve().is_none(), "cap reached by reservations");
        assert!(!gate.state().accepts_submissions());
        drop(b);
        assert!(
            gate.state().accepts_submissions(),
            "a dropped permit frees its slot"
        );
        a.commit("alice", "j-1");
        let state = gate.state();
        assert_eq!((state.active_jobs, state.reserved), (Some(1), 0));
        let c = gate.try_reserve().expect("one slot left");
        assert!(gate.try_reserve().is_none());
        c.commit("alice", "j-2");
        assert_eq!(gate.state().active_jobs, Some(2));
        assert!(!gate.state().accepts_submissions());
    }

    #[test]
    fn without_a_cap_reservations_always_succeed() {
        let gate = gate(None);
        let permits: Vec<_> = (0..100).filter_map(|_| gate.try_reserve()).collect();
        assert_eq!(permits.len(), 100);
        assert_eq!(gate.state().active_jobs, None);
    }

    #[tokio::test]
    async fn subscribers_see_changes() {
        let gate = gate(None);
        let mut rx = gate.subscribe();
        assert!(!rx.borrow_and_update().accepts_submissions());
        gate.shared
            .update(|inner| inner.pause = Some(PauseState::default()));
        rx.changed().await.unwrap();
        assert!(rx.borrow_and_update().accepts_submissions());
        gate.shared.update(|inner| {
            inner.pause = Some(PauseState {
                paused: true,
                ..PauseState::default()
            })
        });
        rx.changed().await.unwrap();
        assert!(!rx.borrow().accepts_submissions());
    }
}
