//! The monitor's test world: a cluster simulator with a stopped clock, a RabbitMQ vhost of its own, a
//! follower of every outbound event, and runners (shard leases + monitor) that tests start, stop and kill.
//!
//! Jobs are created the way the runner creates them (pipeline render, the runner's plan with the cleanup
//! finalizer, the cluster applier). Simulated time moves only when a test calls [`World::advance`]; the
//! monitor reads the same clock.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, EventsFollower, FollowedEvent, OutboundEvent};
use volcano_runner::cluster::{Applier, LeaseHandle, RetryPolicy, ShardLeases};
use volcano_runner::config::Config;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::messages::v1::{
    AccountingTick, ApplicationType, InvocationParameter, JobEvent, JobState, ProxyEvent,
    SubmitJob, WordInvocation, invocation_parameter,
};
use volcano_runner::monitor::{Clock, ConfirmedQueued, Monitor};
use volcano_runner::runner::RunnerKeys;
use volcano_runner::runner::plan::{self, Decorations};
use volcano_runner::sim::{SimConfig, SimHandle, Simulator};

use super::rabbit::TestVhost;

/// Bounds every wait on something another task does, so a broken behaviour fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(40);

/// The simulator's clock, as the monitor sees it: it moves only when the test advances it.
pub struct SimClock(pub Arc<SimHandle>);

impl std::fmt::Debug for SimClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SimClock").field(&self.0.now()).finish()
    }
}

impl Clock for SimClock {
    fn now(&self) -> jiff::Timestamp {
        self.0.now()
    }

    fn real_until(&self, _at: jiff::Timestamp) -> Option<Duration> {
        None
    }
}

/// One runner's monitoring duty: its shard leases and its monitor, on a broker connection of its own.
pub struct TestRunner {
    pub identity: String,
    pub leases: LeaseHandle,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    broker: Broker,
    /// The monitor's pass reports.
    pub reports: tokio::sync::watch::Receiver<volcano_runner::monitor::PassReport>,
}

impl TestRunner {
    /// Waits until this runner holds `n` shards.
    pub async fn holds(&self, n: usize) {
        let mut rx = self.leases.subscribe();
        tokio::time::timeout(PATIENCE, rx.wait_for(|h| h.held().len() >= n))
            .await
            .unwrap_or_else(|_| panic!("{} did not get {n} shards", self.identity))
            .expect("the leases run");
    }

    /// A crash: every task stops where it is, nothing is released, the broker connection just goes.
    pub async fn kill(self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        self.broker.close().await;
    }

    /// A clean stop: the monitor finishes, the leases are released.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(PATIENCE, t).await;
        }
        self.broker.close().await;
    }
}

/// A runner's consuming side (the submit path, for real), judging time by the simulator's clock.
pub struct TestConsumer {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl TestConsumer {
    /// A clean stop: in-flight messages finish, the consumers close.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(PATIENCE, self.task).await;
    }
}

/// Everything published, by kind.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub lifecycle: Vec<JobEvent>,
    pub ticks: Vec<AccountingTick>,
    pub proxy: Vec<ProxyEvent>,
}

impl Seen {
    pub fn of(&self, job_id: &str) -> Seen {
        Seen {
            lifecycle: self
                .lifecycle
                .iter()
                .filter(|e| e.job_id == job_id)
                .cloned()
                .collect(),
            ticks: self
                .ticks
                .iter()
                .filter(|e| e.job_id == job_id)
                .cloned()
                .collect(),
            proxy: self
                .proxy
                .iter()
                .filter(|e| e.job_id == job_id)
                .cloned()
                .collect(),
        }
    }

    /// The lifecycle event with this id, if published.
    pub fn event(&self, id: &str) -> Option<&JobEvent> {
        self.lifecycle.iter().find(|e| e.event_id == id)
    }

    /// The transitions (not status events), first publication of each id, in order.
    pub fn transitions(&self) -> Vec<&JobEvent> {
        let mut seen = std::collections::BTreeSet::new();
        self.lifecycle
            .iter()
            .filter(|e| e.state != JobState::Unspecified as i32)
            .filter(|e| seen.insert(e.event_id.clone()))
            .collect()
    }

    /// Ticks, one per id (duplicates must be identical: checked), sorted by sequence.
    pub fn unique_ticks(&self) -> Vec<AccountingTick> {
        let mut by_id: BTreeMap<String, AccountingTick> = BTreeMap::new();
        for t in &self.ticks {
            if let Some(old) = by_id.get(&t.tick_id) {
                assert_eq!(
                    old, t,
                    "tick {} published twice with different content",
                    t.tick_id
                );
            } else {
                by_id.insert(t.tick_id.clone(), t.clone());
            }
        }
        let mut ticks: Vec<AccountingTick> = by_id.into_values().collect();
        ticks.sort_by_key(|t| t.sequence);
        ticks
    }

    /// The final tick and every tick before it have arrived. Ticks of one catch-up may be confirmed
    /// together and reach the consumer in another order, so the final one alone does not say the rest
    /// are in (a test that checked only it read a gap under load).
    pub fn has_final_tick(&self) -> bool {
        let Some(last) = self.ticks.iter().find(|t| t.r#final) else {
            return false;
        };
        let seen: std::collections::BTreeSet<u64> = self.ticks.iter().map(|t| t.sequence).collect();
        (0..=last.sequence).all(|n| seen.contains(&n))
    }
}

/// Milliseconds of a protobuf timestamp.
pub fn ms(t: &Option<pbjson_types::Timestamp>) -> i64 {
    let t = t.as_ref().expect("a timestamp");
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

/// Checks the accounting invariants for one job: ids `<jobId>/<n>` for n = 0.. without gaps, each tick
/// starting where the previous ended, exactly one final tick (the last), and the sum of durations equal
/// to `end - start`. Returns the sum in ms.
pub fn check_ticks(job_id: &str, ticks: &[AccountingTick], start_ms: i64, end_ms: i64) -> i64 {
    assert!(!ticks.is_empty(), "no ticks for {job_id}");
    let mut cursor = start_ms;
    let mut sum = 0;
    for (n, t) in ticks.iter().enumerate() {
        assert_eq!(
            t.tick_id,
            format!("{job_id}/{n}"),
            "ticks are numbered without gaps"
        );
        assert_eq!(t.sequence, n as u64);
        assert_eq!(
            ms(&t.interval_start),
            cursor,
            "tick {n} starts where the last one ended"
        );
        let end = ms(&t.interval_end);
        assert_eq!(
            t.duration_ms,
            end - cursor,
            "tick {n}'s duration matches its interval"
        );
        assert_eq!(
            t.r#final,
            n + 1 == ticks.len(),
            "only the last tick is final"
        );
        sum += t.duration_ms;
        cursor = end;
    }
    assert_eq!(cursor, end_ms, "the final tick ends at the real end");
    assert_eq!(sum, end_ms - start_ms, "ticks add up to the real run time");
    sum
}

/// The world of one test.
pub struct World {
    pub sim: Arc<SimHandle>,
    pub client: kube::Client,
    pub vhost: TestVhost,
    pub config: Arc<Config>,
    pub keys: AnnotationKeys,
    follower: EventsFollower,
    follower_broker: Broker,
    pub seen: Seen,
    /// Every event as it arrived, with its message id, for checks on publication order.
    pub raw: Vec<FollowedEvent>,
}

impl World {
    /// A world with test defaults, changed by `f` (runner config) and `s` (simulator config).
    pub async fn start(
        label: &str,
        f: impl FnOnce(&mut Config),
        s: impl FnOnce(&mut SimConfig),
    ) -> World {
        // `RUST_LOG=volcano_runner=debug cargo test ...` shows what the monitor does.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let mut sim_config = SimConfig::for_tests();
        sim_config.start_time = "2026-11-22T08:00:00Z".into();
        // The MultiNode init script is not a command the simulated kubelet understands: let it take 1 s.
        sim_config.default_run = Duration::from_secs(1);
        s(&mut sim_config);
        let sim = Arc::new(
            Simulator::start(sim_config)
                .await
                .expect("the simulator starts"),
        );
        let client = sim.client().expect("a client");
        let vhost = TestVhost::new(label).await;
        let mut config = Config::default();
        config.broker = vhost.config();
        config.cluster.lease.shards = 4;
        config.cluster.lease.duration = Duration::from_secs(4);
        config.cluster.lease.renew_interval = Duration::from_millis(500);
        config.cluster.lease.safety_margin = Duration::from_secs(1);
        config.cluster.retry.max_elapsed = Duration::from_secs(5);
        config.cluster.retry.min_delay = Duration::from_millis(50);
        config.cluster.retry.max_delay = Duration::from_millis(500);
        config.monitor.reconcile_interval = Duration::from_secs(60);
        config.monitor.retry_min_delay = Duration::from_millis(100);
        config.monitor.retry_max_delay = Duration::from_secs(1);
        f(&mut config);
        let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
        ensure_namespace(&client, &config.cluster.namespace).await;
        let follower_broker = Broker::connect(config.broker.clone(), CancellationToken::new())
            .await
            .expect("RabbitMQ is reachable");
        let follower = follower_broker
            .follow_events()
            .await
            .expect("the follower binds");
        World {
            sim,
            client,
            vhost,
            config: Arc::new(config),
            keys,
            follower,
            follower_broker,
            seen: Seen::default(),
            raw: Vec::new(),
        }
    }

    /// Starts a runner's monitoring duty named `identity`.
    pub async fn runner(&self, identity: &str) -> TestRunner {
        self.runner_with(identity, |m| m).await
    }

    /// Like [`World::runner`], with the monitor changed by `f` before it runs.
    pub async fn runner_with(
        &self,
        identity: &str,
        f: impl FnOnce(Monitor) -> Monitor,
    ) -> TestRunner {
        self.runner_carrying(identity, f, None).await
    }

    /// Like [`World::runner_with`], and the monitor carries the records of confirmed QUEUEDs as a whole
    /// runner's does: the test plays the runner's submit path with the returned set (`carry` once the
    /// QUEUED is confirmed), and the shard leases list what it carries and take on what a lease taken
    /// over lists.
    pub async fn carrying_runner_with(
        &self,
        identity: &str,
        f: impl FnOnce(Monitor) -> Monitor,
    ) -> (TestRunner, ConfirmedQueued) {
        let confirmed = ConfirmedQueued::default();
        let runner = self
            .runner_carrying(identity, f, Some(confirmed.clone()))
            .await;
        (runner, confirmed)
    }

    async fn runner_carrying(
        &self,
        identity: &str,
        f: impl FnOnce(Monitor) -> Monitor,
        carried: Option<ConfirmedQueued>,
    ) -> TestRunner {
        let mut config = (*self.config).clone();
        config.cluster.lease.identity = Some(identity.to_owned());
        let shutdown = CancellationToken::new();
        let broker = Broker::connect(config.broker.clone(), CancellationToken::new())
            .await
            .expect("RabbitMQ is reachable");
        let (mut leases, handle) = ShardLeases::new(self.client.clone(), &config.cluster);
        if let Some(confirmed) = &carried {
            leases = leases.with_carried_records(Arc::new(confirmed.clone()));
            confirmed.attach(handle.subscribe());
        }
        let monitor = Monitor::new(
            self.client.clone(),
            broker.publisher(),
            Arc::new(config),
            identity.to_owned(),
            handle.subscribe(),
        )
        .with_clock(
            Arc::new(SimClock(self.sim.clone())),
            Duration::from_millis(20),
        );
        let monitor = match carried {
            Some(confirmed) => monitor.with_confirmed_queued(confirmed),
            None => monitor,
        };
        let monitor = f(monitor);
        let reports = monitor.reports();
        let stop = shutdown.clone();
        let leases_task = tokio::spawn(async move { leases.run(stop.cancelled_owned()).await });
        let monitor_task = tokio::spawn(monitor.run(shutdown.clone()));
        TestRunner {
            identity: identity.to_owned(),
            leases: handle,
            shutdown,
            tasks: vec![monitor_task, leases_task],
            broker,
            reports,
        }
    }

    /// Starts a runner's consuming side named `identity` (no monitor: start one with
    /// [`World::runner`]), and waits until it consumes submissions.
    pub async fn consumer(&self, identity: &str) -> TestConsumer {
        let shutdown = CancellationToken::new();
        let broker = Broker::connect(self.config.broker.clone(), shutdown.clone())
            .await
            .expect("RabbitMQ is reachable");
        let runner = volcano_runner::runner::Runner::new(
            (*self.config).clone(),
            self.client.clone(),
            broker,
            identity.to_owned(),
        )
        .expect("a runner")
        .with_clock(Arc::new(SimClock(self.sim.clone())));
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            runner.run(token).await.expect("the runner consumes");
        });
        TestConsumer { shutdown, task }
    }

    /// Publishes a submission to the jobs exchange, as an orchestrator does (for a [`World::consumer`]).
    pub async fn publish_submit(&self, job: &SubmitJob) {
        let message = volcano_runner::broker::Outbound::submit(
            job,
            volcano_runner::messages::Format::Json,
            &self.config.broker,
        );
        tokio::time::timeout(PATIENCE, self.follower_broker.publisher().publish(&message))
            .await
            .expect("published in time")
            .expect("the broker confirms");
    }

    /// Moves simulated time forward; the model has settled when this returns.
    pub fn advance(&self, secs: u64) {
        self.sim.advance(Duration::from_secs(secs));
    }

    /// Moves simulated time forward to the instant `at_ms` (epoch ms); a no-op when it has passed.
    pub fn advance_to_ms(&self, at_ms: i64) {
        let now = self.sim.now().as_millisecond();
        if at_ms > now {
            self.sim.advance(Duration::from_millis(
                u64::try_from(at_ms - now).unwrap_or(0),
            ));
        }
    }

    /// Creates the job as the runner does: rendered, decorated with the cleanup finalizer, applied.
    pub async fn submit(&self, job: &SubmitJob) {
        self.submit_edited(job, |_| {}).await
    }

    /// Like [`World::submit`], with a change to the VolcanoJob before it is created.
    pub async fn submit_edited(
        &self,
        job: &SubmitJob,
        edit: impl FnOnce(&mut volcano_runner::volcano::VolcanoJob),
    ) {
        let meta = self.create_edited(job, edit).await;
        // As the submit path goes on: QUEUED, confirmed, then the record of it on the job (the monitor
        // sends no copy of a QUEUED recorded as confirmed).
        self.tell_queued(&job.job_id, &meta).await;
        let key = volcano_runner::monitor::queued::annotation_key(&self.keys.prefix);
        let api: kube::Api<volcano_runner::volcano::VolcanoJob> = kube::Api::namespaced(
            self.client.clone(),
            meta.namespace.as_deref().unwrap_or_default(),
        );
        api.patch(
            meta.name.as_deref().unwrap_or_default(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {key: "true"}}}),
            ),
        )
        .await
        .expect("the record of QUEUED is written");
    }

    /// Publishes the QUEUED of `job_id`, created as `meta`, as the submit path does (the same message
    /// the monitor would publish), and waits for the broker's confirm.
    pub async fn tell_queued(&self, job_id: &str, meta: &kube::api::ObjectMeta) {
        let created = meta
            .creation_timestamp
            .as_ref()
            .map_or(jiff::Timestamp::UNIX_EPOCH, |t| t.0);
        let queued = volcano_runner::durable::queued_event(job_id, created, "test-runner");
        self.follower_broker
            .publisher()
            .publish(&volcano_runner::broker::Outbound::job_event(
                &queued,
                volcano_runner::messages::Format::Json,
                &self.config.broker,
            ))
            .await
            .expect("QUEUED is confirmed");
    }

    /// Creates the job as the runner's submit path does, and nothing more: no QUEUED, no record of it
    /// (as a runner that leaves the job's QUEUED to its monitor, with `edit` adding the annotation).
    pub async fn create_edited(
        &self,
        job: &SubmitJob,
        edit: impl FnOnce(&mut volcano_runner::volcano::VolcanoJob),
    ) -> kube::api::ObjectMeta {
        let mut desired =
            volcano_runner::pipeline::render(job, &self.config, self.sim.now()).expect("renders");
        edit(&mut desired.vcjob);
        let steps = plan::build(
            desired,
            &self.keys,
            &RunnerKeys::new(&self.keys),
            Decorations {
                runner_id: "test-runner",
                traceparent: None,
                finalizer: true,
                retention: Some(self.config.cluster.ended_job_retention),
            },
        )
        .expect("a plan");
        let applier = Applier::new(
            self.client.clone(),
            RetryPolicy::from_config(&self.config.cluster),
            self.keys.submission_hash.clone(),
        );
        let outcome = applier.apply(&steps).await.expect("the job is created");
        outcome.primary
    }

    /// The namespace the pipeline puts `job`'s objects in.
    pub fn namespace_of(&self, job: &SubmitJob) -> String {
        volcano_runner::pipeline::render(job, &self.config, self.sim.now())
            .expect("renders")
            .vcjob
            .metadata
            .namespace
            .unwrap_or_default()
    }

    /// The VolcanoJob as the simulator holds it (`None` once it is gone).
    pub fn vcjob(&self, namespace: &str, job_id: &str) -> Option<serde_json::Value> {
        self.sim.object(
            "batch.volcano.sh",
            "v1alpha1",
            "jobs",
            namespace,
            &format!("j-{job_id}"),
        )
    }

    /// The requests the simulator has answered so far whose kind starts with `kind` (`"patch
    /// jobs.batch.volcano.sh"`: every job patch, whatever its subresource).
    pub fn served(&self, kind: &str) -> u64 {
        self.sim
            .request_counts()
            .iter()
            .filter(|(k, _)| k.starts_with(kind))
            .map(|(_, v)| *v)
            .sum()
    }

    /// An annotation of the VolcanoJob as the simulator holds it (`None`: not there, or no job).
    pub fn annotation(&self, namespace: &str, job_id: &str, key: &str) -> Option<String> {
        self.vcjob(namespace, job_id)?["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_owned)
    }

    /// Waits until the job records `state` as its published lifecycle state (`lifecycleState`).
    pub async fn until_recorded(&self, namespace: &str, job_id: &str, state: &str) {
        let key = &self.keys.lifecycle_state;
        let recorded = async {
            while self.annotation(namespace, job_id, key).as_deref() != Some(state) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, recorded)
            .await
            .unwrap_or_else(|_| panic!("{job_id} never recorded {state}"));
    }

    /// Whether the job was asked to end: Volcano is terminating it or has (a `TerminateJob` command), or
    /// it is being deleted.
    pub fn is_ending(&self, namespace: &str, job_id: &str) -> bool {
        self.vcjob(namespace, job_id).is_some_and(|j| {
            j.pointer("/metadata/deletionTimestamp").is_some()
                || matches!(
                    j.pointer("/status/state/phase").and_then(|p| p.as_str()),
                    Some("Terminating" | "Terminated")
                )
        })
    }

    /// Waits until the job was asked to end ([`World::is_ending`]).
    pub async fn until_ending(&self, namespace: &str, job_id: &str) {
        let ending = async {
            while !self.is_ending(namespace, job_id) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, ending)
            .await
            .unwrap_or_else(|_| panic!("{job_id} is terminated"));
    }

    /// A pod as the simulator holds it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        self.sim.object("", "v1", "pods", namespace, name)
    }

    /// After its end is published: the VolcanoJob stays as the record of its submission, as Volcano keeps
    /// a finished job: not being deleted (no deletionTimestamp: `kubectl get vcjob` shows no
    /// `Terminating`), in a finished phase, without our cleanup finalizer (nothing holds the TTL's
    /// deletion), and without its Services; its running pods are gone. Once `ended_job_retention`
    /// (its `ttlSecondsAfterFinished`) has passed in simulated time, Volcano's garbage collector
    /// deletes it, and the garbage collector its NetworkPolicy (owned by the job).
    pub async fn released_then_gone(&mut self, namespace: &str, job_id: &str) {
        let name = format!("j-{job_id}");
        let finalizer = self.keys.cleanup_finalizer();
        let released = async {
            loop {
                let kept = self.vcjob(namespace, job_id).is_some_and(|j| {
                    j.pointer("/metadata/deletionTimestamp").is_none()
                        && j.pointer("/metadata/finalizers")
                            .and_then(|f| f.as_array())
                            .is_none_or(|f| f.iter().all(|f| f.as_str() != Some(&finalizer)))
                        && matches!(
                            j.pointer("/status/state/phase").and_then(|p| p.as_str()),
                            Some("Completed" | "Failed" | "Terminated")
                        )
                });
                let pod_runs = self
                    .pod(namespace, &format!("{name}-job-0"))
                    .is_some_and(|p| {
                        !matches!(
                            p.pointer("/status/phase").and_then(|p| p.as_str()),
                            Some("Succeeded" | "Failed")
                        )
                    });
                let services = self
                    .companions(namespace, &name)
                    .await
                    .into_iter()
                    .filter(|c| c.starts_with("Service/"))
                    .count();
                if kept && !pod_runs && services == 0 {
                    return;
                }
                // Pods that still run take their termination grace period, in simulated time.
                self.advance(1);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(PATIENCE, released).await.is_err() {
            panic!(
                "the ended job is kept, not being deleted, finished, without our finalizer, pods or \
                 companions: {:#?}, companions {:?}",
                self.vcjob(namespace, job_id).map(|j| (
                    j.pointer("/metadata").cloned(),
                    j.pointer("/status/state").cloned()
                )),
                self.companions(namespace, &name).await
            );
        }
        // Kept until the retention has passed, counted from the end.
        self.settle(Duration::from_millis(300)).await;
        let kept = self
            .vcjob(namespace, job_id)
            .expect("kept during the retention");
        assert!(kept.pointer("/metadata/deletionTimestamp").is_none());
        self.advance(self.config.cluster.ended_job_retention.as_secs() + 1);
        let gone = async {
            while self.vcjob(namespace, job_id).is_some() {
                self.advance(1);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(PATIENCE, gone)
            .await
            .expect("the record goes once the retention (its TTL) has passed");
        let collected = async {
            while !self.companions(namespace, &name).await.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(PATIENCE, collected).await.expect(
            "its NetworkPolicy goes with it (the garbage collector, by its ownerReference)",
        );
    }

    /// The Services and NetworkPolicies the runner created beside the job `name` (by their label) that
    /// still exist, as `kind/name`.
    pub async fn companions(&self, namespace: &str, name: &str) -> Vec<String> {
        use k8s_openapi::api::core::v1::Service;
        use k8s_openapi::api::networking::v1::NetworkPolicy;
        let params =
            kube::api::ListParams::default().labels(&format!("{}job={name}", self.keys.prefix));
        let mut out = Vec::new();
        let services = kube::Api::<Service>::namespaced(self.client.clone(), namespace)
            .list_metadata(&params)
            .await
            .expect("services listed");
        out.extend(
            services
                .items
                .into_iter()
                .map(|o| format!("Service/{}", o.metadata.name.unwrap_or_default())),
        );
        let policies = kube::Api::<NetworkPolicy>::namespaced(self.client.clone(), namespace)
            .list_metadata(&params)
            .await
            .expect("network policies listed");
        out.extend(
            policies
                .items
                .into_iter()
                .map(|o| format!("NetworkPolicy/{}", o.metadata.name.unwrap_or_default())),
        );
        out
    }

    fn vcjob_uid(&self, namespace: &str, job_id: &str) -> String {
        self.vcjob(namespace, job_id)
            .and_then(|j| {
                j.pointer("/metadata/uid")
                    .and_then(|u| u.as_str())
                    .map(String::from)
            })
            .unwrap_or_default()
    }

    /// Receives events until `done` holds for what was seen, or panics after [`PATIENCE`] with what was
    /// seen.
    pub async fn until(&mut self, what: &str, done: impl Fn(&Seen) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.follower.next()).await {
                Ok(Some(event)) => self.record(event),
                Ok(None) => panic!("the follower stopped while waiting for {what}"),
                Err(_) => panic!(
                    "timed out waiting for {what}; seen: {:#?}\n{}",
                    summary(&self.seen),
                    self.dump().await
                ),
            }
        }
    }

    /// The jobs and pods in the simulator, for failure messages.
    pub async fn dump(&self) -> String {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
        let jobs = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("batch.volcano.sh", "v1alpha1", "Job"),
            "jobs",
        );
        let jobs: kube::Api<DynamicObject> = kube::Api::all_with(self.client.clone(), &jobs);
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(self.client.clone());
        let mut out = format!("now {}\n", self.sim.now());
        for j in jobs
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            out.push_str(&format!(
                "job {} annotations={} status={}\n",
                j.metadata.name.clone().unwrap_or_default(),
                serde_json::to_string(&j.metadata.annotations).unwrap_or_default(),
                j.data.get("status").cloned().unwrap_or_default()
            ));
        }
        for p in pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            out.push_str(&format!(
                "pod {} status={}\n",
                p.metadata.name.clone().unwrap_or_default(),
                serde_json::to_string(&p.status).unwrap_or_default()
            ));
        }
        out
    }

    /// Takes whatever arrives within `quiet` (real time), to check that nothing more comes.
    pub async fn settle(&mut self, quiet: Duration) {
        while let Ok(Some(event)) = tokio::time::timeout(quiet, self.follower.next()).await {
            self.record(event);
        }
    }

    fn record(&mut self, event: FollowedEvent) {
        match &event.event {
            Ok(OutboundEvent::Job(e)) => self.seen.lifecycle.push(e.clone()),
            Ok(OutboundEvent::Accounting(t)) => self.seen.ticks.push(t.clone()),
            Ok(OutboundEvent::Proxy(p)) => self.seen.proxy.push(p.clone()),
            Err(e) => panic!("an event that does not decode: {e}"),
        }
        self.raw.push(event);
    }

    pub async fn close(self) {
        self.follower.close().await;
        self.follower_broker.close().await;
    }
}

/// A short summary of what was seen, for failure messages.
pub fn summary(seen: &Seen) -> Vec<String> {
    let mut out: Vec<String> = seen
        .lifecycle
        .iter()
        .map(|e| format!("{} {:?} {}", e.event_id, e.reason, e.status))
        .collect();
    out.extend(
        seen.ticks
            .iter()
            .map(|t| format!("tick {} {}ms final={}", t.tick_id, t.duration_ms, t.r#final)),
    );
    out.extend(seen.proxy.iter().map(|p| p.event_id.clone()));
    out
}

async fn ensure_namespace(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    match api.create(&Default::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

/// A job that runs `script` under `sh -c` in the simulator (whose kubelet reads `sleep N` and `exit N`).
pub fn job(job_id: &str, script: &str) -> SubmitJob {
    let mut job: SubmitJob = serde_json::from_str(include_str!(
        "../../schemas/examples/submit-job.figlet.json"
    ))
    .expect("the example parses");
    job.job_id = job_id.to_owned();
    let word = |w: &str| InvocationParameter {
        kind: Some(invocation_parameter::Kind::Word(WordInvocation {
            word: w.to_owned(),
        })),
    };
    if let Some(app) = job.application.as_mut() {
        app.invocation = vec![word("sh"), word("-c"), word(script)];
    }
    job
}

/// [`job`] on a product of `cpu` CPUs (2 GiB each) with a time allocation of `limit_s` seconds: the
/// jobs of the estimate and queue tests, sized to fill nodes.
pub fn sized(job_id: &str, script: &str, cpu: u32, limit_s: i64) -> SubmitJob {
    resized(job(job_id, script), cpu, limit_s)
}

/// `j` on a product of `cpu` CPUs (2 GiB each) with a time allocation of `limit_s` seconds.
pub fn resized(mut j: SubmitJob, cpu: u32, limit_s: i64) -> SubmitJob {
    j.product = Some(volcano_runner::messages::v1::Product {
        id: format!("u1-standard-{cpu}"),
        cpu,
        memory_gib: 2 * cpu,
        ..j.product.clone().unwrap()
    });
    j.time_allocation = Some(pbjson_types::Duration {
        seconds: limit_s,
        nanos: 0,
    });
    j
}

/// A web job with `replicas` ranks serving on port 8080.
pub fn web_job(job_id: &str, replicas: u32, script: &str) -> SubmitJob {
    let mut job = job(job_id, script);
    job.replicas = replicas;
    if let Some(app) = job.application.as_mut() {
        app.application_type = ApplicationType::Web as i32;
        app.web_port = Some(8080);
    }
    job
}
