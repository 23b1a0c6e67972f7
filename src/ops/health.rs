//! Readiness: whether this runner can do its work right now.
//!
//! A runner is ready when the AMQP connection is up, the API server answers, and its consumer loops are
//! running. Each of these is a check registered by the part that knows: the process registers the
//! broker and the cluster, and each consumer loop holds a [`RunningGuard`] from its [`ReadyFlag`] for as
//! long as it runs (a loop that ended, or panicked, drops the guard and the flag goes down).
//!
//! Liveness (`/healthz`) is deliberately not tied to these: a broker outage must not make the kubelet
//! restart every runner, it only takes them out of readiness until the broker is back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::Metrics;

/// The outcome of one check: `Err` says why it fails, in words for the `/readyz` body.
pub type CheckResult = Result<(), String>;

/// Says why a loop takes no work right now; `None` when it does.
type NoteFn = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// A named flag that a long-running loop holds up while it runs.
#[derive(Clone)]
pub struct ReadyFlag {
    name: Arc<str>,
    up: Arc<AtomicBool>,
    /// Why the loop takes no work right now (e.g. `paused: maintenance`), asked at every probe and
    /// shown after `ok`, so that `/readyz` never says a consumer consumes when it does not.
    note: Arc<Mutex<Option<NoteFn>>>,
    /// Why the loop, although running, does no work (e.g. its handlers hang); asked at every probe, and the
    /// check fails with it.
    failing: Arc<Mutex<Option<NoteFn>>>,
    /// A consumer: it takes nothing while the broker connection is down, whatever its loop does.
    needs_broker: bool,
}

impl ReadyFlag {
    /// Marks the loop as running until the guard is dropped.
    pub fn running(&self) -> RunningGuard {
        self.up.store(true, Ordering::SeqCst);
        RunningGuard {
            up: self.up.clone(),
        }
    }

    /// Whether a guard is alive.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// The check's name in `/readyz`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// From now on `/readyz` asks `why_idle` whether, and why, the loop takes no work (`None`: it does).
    /// The check stays `ok` then: a paused or capped runner is doing what it was told, and must not be
    /// taken out of a rollout for it.
    pub fn explain_with(&self, why_idle: impl Fn() -> Option<String> + Send + Sync + 'static) {
        *self.note.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(why_idle));
    }

    /// From now on `/readyz` asks `why_failing` whether the loop, although it runs, makes no progress; the
    /// check fails with its answer (a runner whose handlers hang must not look ready).
    pub fn fail_when(&self, why_failing: impl Fn() -> Option<String> + Send + Sync + 'static) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(why_failing));
    }

    fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|why| why())
    }

    fn note(&self) -> Option<String> {
        self.note
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|why_idle| why_idle())
    }
}

impl std::fmt::Debug for ReadyFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyFlag")
            .field("name", &self.name)
            .field("up", &self.is_up())
            .field("needs_broker", &self.needs_broker)
            .finish()
    }
}

/// Keeps its [`ReadyFlag`] up; dropping it (the loop ended, or unwound) takes the flag down.
#[must_use = "the flag is up only while this guard lives"]
#[derive(Debug)]
pub struct RunningGuard {
    up: Arc<AtomicBool>,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.up.store(false, Ordering::SeqCst);
    }
}

/// What readiness and the metrics read of the broker connection. [`crate::broker::Broker`] implements it:
/// ops sits below the broker (the broker reports into [`super::Metrics`]), so it names no broker type.
pub trait BrokerConnection: Send + Sync + 'static {
    /// Whether a connection is up right now.
    fn is_connected(&self) -> bool;
    /// How often the connection was re-established since start.
    fn reconnects(&self) -> u64;
}

/// Where the broker goes once connected (see [`Readiness::expect_broker`]).
#[derive(Clone)]
pub struct BrokerSlot {
    slot: Arc<std::sync::OnceLock<Arc<dyn BrokerConnection>>>,
}

impl std::fmt::Debug for BrokerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerSlot")
            .field("filled", &self.slot.get().is_some())
            .finish()
    }
}

impl BrokerSlot {
    /// The check follows `broker` from now on (a second fill is ignored).
    pub fn fill(&self, broker: impl BrokerConnection) {
        let _ = self.slot.set(Arc::new(broker));
    }
}

/// The API server answers `/version` within the timeout. A success is reused for `ttl`.
struct ClusterCheck {
    client: kube::Client,
    timeout: Duration,
    ttl: Duration,
    last_ok: Mutex<Option<Instant>>,
}

impl ClusterCheck {
    async fn check(&self) -> CheckResult {
        let fresh = self
            .last_ok
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < self.ttl);
        if fresh {
            return Ok(());
        }
        let answer = tokio::time::timeout(self.timeout, self.client.apiserver_version()).await;
        let result = match answer {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("the API server did not answer: {e}")),
            Err(_) => Err(format!(
                "no answer from the API server within {:?}",
                self.timeout
            )),
        };
        *self.last_ok.lock().unwrap_or_else(|e| e.into_inner()) = result.is_ok().then(Instant::now);
        result
    }
}

enum Check {
    /// Filled once the broker is connected for the first time; until then, not ready.
    Broker(Arc<std::sync::OnceLock<Arc<dyn BrokerConnection>>>),
    Cluster(ClusterCheck),
    Flag(ReadyFlag),
    Condition(Condition),
}

/// A condition that a part of the runner sets as it learns it (e.g. whether its own namespace exists):
/// failing, with the reason, until set otherwise.
#[derive(Debug, Clone)]
pub struct Condition {
    name: Arc<str>,
    state: Arc<Mutex<CheckResult>>,
}

impl Condition {
    /// Sets the outcome `/readyz` reports.
    pub fn set(&self, result: CheckResult) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = result;
    }

    fn get(&self) -> CheckResult {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The reason it fails, if it does.
    pub fn get_err(&self) -> Option<String> {
        self.get().err()
    }
}

impl Check {
    fn name(&self) -> &str {
        match self {
            Check::Broker(_) => "broker",
            Check::Cluster(_) => "cluster",
            Check::Flag(flag) => flag.name(),
            Check::Condition(c) => &c.name,
        }
    }

    /// The outcome; `broker_up` is whether the broker connection is up now (for consumers).
    async fn check(&self, broker_up: bool) -> CheckResult {
        match self {
            Check::Broker(slot) => match slot.get() {
                Some(broker) if broker.is_connected() => Ok(()),
                Some(_) => Err("not connected to RabbitMQ (reconnecting)".into()),
                None => Err("not connected to RabbitMQ yet".into()),
            },
            Check::Cluster(cluster) => cluster.check().await,
            Check::Condition(c) => c.get(),
            Check::Flag(flag) if !flag.is_up() => Err("not running".into()),
            Check::Flag(flag) if flag.needs_broker && !broker_up => {
                Err("not consuming: the broker connection is down".into())
            }
            Check::Flag(flag) => flag.failing().map_or(Ok(()), Err),
        }
    }

    /// How the check is named in the report: a flag's note follows its name.
    fn label(&self) -> String {
        match self {
            Check::Flag(flag) => match flag.note() {
                Some(note) => format!("{}: {note}", flag.name()),
                None => flag.name().to_owned(),
            },
            other => other.name().to_owned(),
        }
    }
}

/// The readiness checks of this process. Cheap to clone; clones share the checks.
///
/// Checks are registered by the parts that start one after the other, so a process is not ready before
/// [`seal`](Readiness::seal) says that every check is there: otherwise a probe between two
/// registrations would see only the first ones pass.
#[derive(Clone)]
pub struct Readiness {
    checks: Arc<Mutex<Vec<Arc<Check>>>>,
    metrics: Metrics,
    sealed: Arc<AtomicBool>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let checks = self.snapshot();
        f.debug_list()
            .entries(checks.iter().map(|c| c.name().to_owned()))
            .finish()
    }
}

/// What `/readyz` found: every check with its outcome, in registration order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessReport {
    pub checks: Vec<(String, CheckResult)>,
}

impl ReadinessReport {
    /// Ready when every check passes.
    pub fn is_ready(&self) -> bool {
        self.checks.iter().all(|(_, r)| r.is_ok())
    }

    /// One line per check: `ok broker` or `failed cluster: why`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (name, result) in &self.checks {
            match result {
                Ok(()) => out.push_str(&format!("ok {name}\n")),
                Err(why) => out.push_str(&format!("failed {name}: {why}\n")),
            }
        }
        if self.checks.is_empty() {
            out.push_str("ok (no checks registered)\n");
        }
        out
    }
}

impl Readiness {
    /// No checks yet; each outcome is also reported as `volcano_runner_ready{check}` on `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            checks: Arc::default(),
            metrics,
            sealed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Every check is registered: from now on the checks alone decide.
    pub fn seal(&self) {
        self.sealed.store(true, Ordering::SeqCst);
    }

    /// Ready only while the AMQP connection is up.
    pub fn add_broker(&self, broker: impl BrokerConnection) {
        self.expect_broker().fill(broker);
    }

    /// A broker check that fails until the broker is handed over with [`BrokerSlot::fill`]: register it
    /// before connecting, so the process is not ready while the first connection is being made.
    pub fn expect_broker(&self) -> BrokerSlot {
        let slot = Arc::new(std::sync::OnceLock::new());
        self.push(Check::Broker(slot.clone()));
        BrokerSlot { slot }
    }

    /// Ready only while the API server answers within `timeout`; a success counts for `ttl`.
    pub fn add_cluster(&self, client: kube::Client, timeout: Duration, ttl: Duration) {
        self.push(Check::Cluster(ClusterCheck {
            client,
            timeout,
            ttl,
            last_ok: Mutex::new(None),
        }));
    }

    /// A flag for a loop (e.g. the monitor): ready only while the loop holds it up. Down until then.
    pub fn flag(&self, name: &str) -> ReadyFlag {
        self.add_flag(name, false)
    }

    /// A flag for a consumer loop (e.g. `submit consumer`): like [`flag`](Self::flag), and failing too
    /// while the broker connection is down (a consumer then takes nothing, whatever its loop does).
    pub fn consumer_flag(&self, name: &str) -> ReadyFlag {
        self.add_flag(name, true)
    }

    fn add_flag(&self, name: &str, needs_broker: bool) -> ReadyFlag {
        let flag = ReadyFlag {
            name: name.into(),
            up: Arc::new(AtomicBool::new(false)),
            note: Arc::new(Mutex::new(None)),
            failing: Arc::new(Mutex::new(None)),
            needs_broker,
        };
        self.push(Check::Flag(flag.clone()));
        flag
    }

    /// A condition named `name`, failing with `initially` until it is set.
    pub fn condition(&self, name: &str, initially: &str) -> Condition {
        let condition = Condition {
            name: name.into(),
            state: Arc::new(Mutex::new(Err(initially.to_owned()))),
        };
        self.push(Check::Condition(condition.clone()));
        condition
    }

    /// Runs every check.
    pub async fn evaluate(&self) -> ReadinessReport {
        let checks = self.snapshot();
        let mut report = ReadinessReport { checks: Vec::new() };
        if !self.sealed.load(Ordering::SeqCst) {
            report
                .checks
                .push(("startup".into(), Err("still starting".into())));
        }
        // Without a broker check (a process that consumes nothing) consumers are not held to one.
        let broker_up = checks.iter().all(|c| match c.as_ref() {
            Check::Broker(slot) => slot.get().is_some_and(|b| b.is_connected()),
            _ => true,
        });
        for check in checks {
            let result = check.check(broker_up).await;
            self.metrics.set_ready(check.name(), result.is_ok());
            report.checks.push((check.label(), result));
        }
        report
    }

    fn push(&self, check: Check) {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(check));
    }

    fn snapshot(&self) -> Vec<Arc<Check>> {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::metrics::Samples;

    #[tokio::test]
    async fn flags_follow_their_guards() {
        let metrics = Metrics::new();
        let readiness = Readiness::new(metrics.clone());
        let submit = readiness.flag("submit consumer");
        let control = readiness.flag("control consumer");
        readiness.seal();
        let report = readiness.evaluate().await;
        assert!(!report.is_ready());
        assert_eq!(
            report.text(),
            "failed submit consumer: not running\nfailed control consumer: not running\n"
        );
        let _s = submit.running();
        let c = control.running();
        assert!(readiness.evaluate().await.is_ready());
        let s = Samples::parse(&metrics.encode()).unwrap();
        assert_eq!(
            s.get("volcano_runner_ready", &[("check", "control consumer")]),
            Some(1.0)
        );
        drop(c);
        let report = readiness.evaluate().await;
        assert!(!report.is_ready());
        assert_eq!(report.checks[0].1, Ok(()));
        let s = Samples::parse(&metrics.encode()).unwrap();
        assert_eq!(
            s.get("volcano_runner_ready", &[("check", "control consumer")]),
            Some(0.0)
        );
    }

    #[tokio::test]
    async fn a_running_loop_that_makes_no_progress_is_not_ready() {
        let readiness = Readiness::new(Metrics::new());
        let flag = readiness.consumer_flag("submit consumer");
        readiness.seal();
        let stuck = Arc::new(AtomicBool::new(false));
        flag.fail_when({
            let stuck = stuck.clone();
            move || {
                stuck
                    .load(Ordering::SeqCst)
                    .then(|| "stalled: a message has been in hand for 700 s".to_owned())
            }
        });
        let _running = flag.running();
        // No broker registered: the consumer's broker condition is read as up.
        assert!(readiness.evaluate().await.is_ready());
        stuck.store(true, Ordering::SeqCst);
        let report = readiness.evaluate().await;
        assert!(!report.is_ready());
        assert_eq!(
            report.text(),
            "failed submit consumer: stalled: a message has been in hand for 700 s\n"
        );
        stuck.store(false, Ordering::SeqCst);
        assert!(readiness.evaluate().await.is_ready());
    }

    #[tokio::test]
    async fn a_loop_that_panics_takes_its_flag_down() {
        let readiness = Readiness::new(Metrics::new());
        let flag = readiness.flag("worker");
        readiness.seal();
        let task = tokio::spawn({
            let flag = flag.clone();
            async move {
                let _running = flag.running();
                panic!("the loop broke");
            }
        });
        assert!(task.await.is_err());
        assert!(!flag.is_up());
        assert!(!readiness.evaluate().await.is_ready());
    }

    #[tokio::test]
    async fn an_unreachable_cluster_is_not_ready() {
        let readiness = Readiness::new(Metrics::new());
        // Port 1 on loopback: refused at once.
        let client = crate::cluster::connect_url(
            "http://127.0.0.1:1".parse().unwrap(),
            &crate::cluster::ClusterConfig::default(),
        )
        .unwrap();
        readiness.add_cluster(client, Duration::from_secs(2), Duration::from_secs(5));
        readiness.seal();
        let report = readiness.evaluate().await;
        assert!(!report.is_ready());
        assert!(
            report
                .text()
                .starts_with("failed cluster: the API server did not answer")
        );
    }

    #[tokio::test]
    async fn sealed_without_checks_is_ready_and_unsealed_is_not() {
        let readiness = Readiness::new(Metrics::new());
        let report = readiness.evaluate().await;
        assert!(!report.is_ready());
        assert_eq!(report.text(), "failed startup: still starting\n");
        readiness.seal();
        let report = readiness.evaluate().await;
        assert!(report.is_ready());
        assert_eq!(report.text(), "ok (no checks registered)\n");
    }
}
