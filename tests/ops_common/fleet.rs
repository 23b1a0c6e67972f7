//! A whole runner process for the ops tests, started as `volcano-runner run` starts it ([`Service`] with
//! an [`Ops`]): RabbitMQ on a vhost of the test's own, the cluster simulator in this process with its
//! clock stopped (the test moves it), the runner's kube client built with a recording [`KubeCallLayer`],
//! and an orchestrator connection that publishes inbound messages and follows the events.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, EventsFollower, FollowedEvent, Outbound, OutboundEvent};
use volcano_runner::cluster::{ClusterTarget, client};
use volcano_runner::config::Config;
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::{CancelJob, ExtendJob, JobEvent, JobState, SubmitJob};
use volcano_runner::monitor::Clock;
use volcano_runner::ops::{CallRecorder, KubeCallLayer, Ops};
use volcano_runner::runner::RunnerError;
use volcano_runner::runner::service::Service;
use volcano_runner::sim::{SimConfig, SimHandle, Simulator};

use super::rabbit::{PATIENCE, TestVhost};

/// The simulator's clock as the monitor's: it moves only when the test advances it.
pub struct SimTime(pub Arc<SimHandle>);

impl std::fmt::Debug for SimTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimTime({})", self.0.url())
    }
}

impl Clock for SimTime {
    fn now(&self) -> jiff::Timestamp {
        self.0.now()
    }

    fn real_until(&self, _at: jiff::Timestamp) -> Option<Duration> {
        None
    }
}

/// One runner process under test and the world around it.
pub struct Fleet {
    pub vhost: TestVhost,
    pub sim: Arc<SimHandle>,
    /// A client that is not recorded: the test's (and an operator's) own calls.
    pub admin: kube::Client,
    pub recorder: CallRecorder,
    pub ops: Ops,
    pub config: Config,
    pub orchestrator: Broker,
    orchestrator_token: CancellationToken,
    events: EventsFollower,
    /// Every event seen so far.
    pub seen: Vec<FollowedEvent>,
    label: String,
    runner_client: kube::Client,
    /// Runner processes started so far.
    runs: u32,
    token: CancellationToken,
    task: Option<JoinHandle<Result<(), RunnerError>>>,
}

/// The test configuration: the defaults, on the test's vhost and simulator, with waits short enough for a
/// test (leases of one second, a tombstone kept for one second).
pub fn test_config(vhost: &TestVhost, sim: &SimHandle) -> Config {
    let mut config = Config::default();
    config.broker = vhost.config();
    config.cluster.target = ClusterTarget::Url(sim.url().parse().unwrap());
    config.cluster.retry.max_elapsed = Duration::from_secs(2);
    config.cluster.retry.min_delay = Duration::from_millis(50);
    config.cluster.retry.max_delay = Duration::from_millis(400);
    config.cluster.request_timeout = Duration::from_secs(5);
    config.cluster.lease.shards = 2;
    config.cluster.lease.duration = Duration::from_millis(1500);
    config.cluster.lease.renew_interval = Duration::from_millis(300);
    config.cluster.lease.safety_margin = Duration::from_millis(300);
    config.runner.requeue_delay = Duration::from_millis(100);
    config.runner.shutdown_grace = Duration::from_secs(5);
    config
}

impl Fleet {
    /// Starts everything; `tweak` changes the configuration the runner gets (and `ops` is what it reports
    /// into).
    pub async fn start(label: &str, ops: Ops, tweak: impl FnOnce(&mut Config)) -> Self {
        Self::start_on(TestVhost::new(label).await, label, ops, tweak).await
    }

    /// [`Fleet::start`] on a vhost the test made (e.g. with a user of its own).
    pub async fn start_on(
        vhost: TestVhost,
        label: &str,
        ops: Ops,
        tweak: impl FnOnce(&mut Config),
    ) -> Self {
        let sim = Arc::new(
            Simulator::start(SimConfig::for_tests())
                .await
                .expect("the simulator starts"),
        );
        let admin = sim.client().expect("a client");
        let mut config = test_config(&vhost, &sim);
        tweak(&mut config);
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(config.cluster.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .expect("the runner's namespace (the deploy manifests create it)");

        let orchestrator_token = CancellationToken::new();
        let mut orchestrator_config = vhost.config();
        orchestrator_config.connection_name = format!("orchestrator-{label}");
        let orchestrator = Broker::connect(orchestrator_config, orchestrator_token.clone())
            .await
            .expect("the orchestrator connects");
        let events = orchestrator.follow_events().await.expect("follow events");

        let recorder = CallRecorder::new();
        let layer = KubeCallLayer::new()
            .with_metrics(ops.metrics.clone())
            .with_recorder(recorder.clone());
        let runner_client =
            client::connect_url_with(sim.url().parse().unwrap(), &config.cluster, &layer)
                .expect("the runner's client");
        ops.readiness.add_cluster(
            runner_client.clone(),
            config.ops.cluster_check_timeout,
            config.ops.cluster_check_ttl,
        );
        let mut fleet = Self {
            vhost,
            sim,
            admin,
            recorder,
            ops,
            config,
            orchestrator,
            orchestrator_token,
            events,
            seen: Vec::new(),
            label: label.to_owned(),
            runner_client,
            runs: 0,
            token: CancellationToken::new(),
            task: None,
        };
        fleet.spawn();
        fleet
    }

    /// Starts a runner process (`Service::run_with_ops`, as `volcano-runner run` does) with the fleet's
    /// configuration, client and ops.
    fn spawn(&mut self) {
        self.runs += 1;
        let service = Service {
            config: self.config.clone(),
            client: self.runner_client.clone(),
            runner_id: format!("runner-{}-{}", self.label, self.runs),
            monitor: true,
            monitor_clock: Some((
                Arc::new(SimTime(self.sim.clone())) as Arc<dyn Clock>,
                Duration::from_millis(50),
            )),
        };
        self.token = CancellationToken::new();
        self.task = Some(tokio::spawn(
            service.run_with_ops(self.token.clone(), self.ops.clone()),
        ));
    }

    /// Stops the runner as SIGTERM does, changes its configuration, and starts a new runner process
    /// (same client, same recorder, same ops).
    pub async fn restart(&mut self, tweak: impl FnOnce(&mut Config)) {
        self.stop_runner().await;
        tweak(&mut self.config);
        self.spawn();
    }

    async fn stop_runner(&mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("the runner stops within the test's patience")
                .expect("the runner task")
                .expect("the runner ran without error");
        }
    }

    /// Publishes as the orchestrator does, with a `traceparent` when given.
    pub async fn publish(&self, message: Outbound, traceparent: Option<&str>) {
        let message = match traceparent {
            Some(tp) => message.with_traceparent(tp),
            None => message,
        };
        self.orchestrator
            .publisher()
            .publish(&message)
            .await
            .expect("the orchestrator publishes");
    }

    pub async fn submit(&self, job: &SubmitJob) {
        self.publish(
            Outbound::submit(job, Format::Json, &self.config.broker),
            None,
        )
        .await;
    }

    pub async fn cancel(&self, job_id: &str) {
        let cancel = CancelJob {
            job_id: job_id.into(),
            reason: Some("the user cancelled it".into()),
        };
        self.publish(
            Outbound::cancel(&cancel, Format::Json, &self.config.broker),
            None,
        )
        .await;
    }

    pub async fn extend(&self, job_id: &str, request_id: &str, by: Duration) {
        let extend = ExtendJob {
            job_id: job_id.into(),
            request_id: request_id.into(),
            extension: Some(pbjson_types::Duration {
                seconds: by.as_secs() as i64,
                nanos: 0,
            }),
        };
        self.publish(
            Outbound::extend(&extend, Format::Json, &self.config.broker),
            None,
        )
        .await;
    }

    /// Waits for an event that `wanted` accepts (among those seen before, too). With `step`, the
    /// simulator's clock moves on by `step` whenever nothing arrives for a moment, so jobs run and time
    /// passes for the monitor.
    pub async fn wait_for(
        &mut self,
        what: &str,
        step: Option<Duration>,
        wanted: impl Fn(&FollowedEvent) -> bool,
    ) -> FollowedEvent {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(found) = self.seen.iter().find(|e| wanted(e)) {
                return found.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; seen: {:#?}",
                self.seen
                    .iter()
                    .map(|e| match &e.event {
                        Ok(OutboundEvent::Job(j)) => format!(
                            "{} {} {}",
                            e.message_id.clone().unwrap_or_default(),
                            j.reason,
                            j.status
                        ),
                        _ => e.message_id.clone().unwrap_or_default(),
                    })
                    .collect::<Vec<_>>()
            );
            match tokio::time::timeout(Duration::from_millis(150), self.events.next()).await {
                Ok(Some(event)) => self.seen.push(event),
                Ok(None) => panic!("the events follower stopped"),
                Err(_) => {
                    if let Some(step) = step {
                        self.sim.advance(step);
                    }
                }
            }
        }
    }

    /// How many times an event with this message id was seen.
    pub fn count(&self, message_id: &str) -> usize {
        self.seen
            .iter()
            .filter(|e| e.message_id.as_deref() == Some(message_id))
            .count()
    }

    /// Takes in whatever events arrive within `for_`.
    pub async fn collect(&mut self, for_: Duration) {
        let deadline = tokio::time::Instant::now() + for_;
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, self.events.next()).await {
            self.seen.push(event);
        }
    }

    /// Waits until `done` holds for what has been seen, taking in events meanwhile.
    pub async fn wait_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !done(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; seen: {:?}",
                self.seen
                    .iter()
                    .map(|e| e.message_id.clone().unwrap_or_default())
                    .collect::<Vec<_>>()
            );
            self.collect(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the lifecycle event `state` of `job_id`.
    pub async fn wait_state(
        &mut self,
        job_id: &str,
        state: JobState,
        step: Option<Duration>,
    ) -> JobEvent {
        let what = format!("{job_id} {state:?}");
        let found = self
            .wait_for(&what, step, |e| {
                matches!(&e.event, Ok(OutboundEvent::Job(j)) if j.job_id == job_id && j.state == state as i32)
            })
            .await;
        match found.event {
            Ok(OutboundEvent::Job(j)) => j,
            _ => unreachable!(),
        }
    }

    /// Stops the runner (as SIGTERM does) and waits until it has shut down; then the orchestrator.
    pub async fn stop(&mut self) {
        self.stop_runner().await;
        self.orchestrator_token.cancel();
        self.orchestrator.close().await;
    }
}

/// A SubmitJob from the figlet example that runs `sleep <seconds>` (the simulator runs a container for
/// as long as its `sleep` says), with a time allocation.
pub fn sleeping_job(job_id: &str, seconds: u64, allocation: Option<Duration>) -> SubmitJob {
    let path = super::root().join("schemas/examples/submit-job.figlet.json");
    let mut job: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    job["jobId"] = job_id.into();
    job["application"]["invocation"] =
        serde_json::json!([{"word": {"word": "sleep"}}, {"word": {"word": seconds.to_string()}}]);
    job["application"]["parameters"] = serde_json::json!([]);
    job["parameters"] = serde_json::json!({});
    match allocation {
        Some(a) => job["timeAllocation"] = format!("{}s", a.as_secs()).into(),
        None => {
            job.as_object_mut().unwrap().remove("timeAllocation");
        }
    }
    serde_json::from_value(job).expect("a SubmitJob")
}
