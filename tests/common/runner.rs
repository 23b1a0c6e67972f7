//! The runner under test, for real: RabbitMQ on a vhost of the test's own, the cluster simulator in this
//! process, and runners started as a library ([`Service`]) exactly as `volcano-runner run` starts them.
//!
//! Include next to `rabbit.rs`:
//! ```ignore
//! #[path = "common/rabbit.rs"] mod rabbit;
//! #[path = "common/runner.rs"] mod harness;
//! ```

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use lapin::BasicProperties;
use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, Outbound};
use volcano_runner::cluster::ClusterTarget;
use volcano_runner::config::Config;
use volcano_runner::messages::v1::{CancelJob, ExtendJob, JobEvent, SubmitJob};
use volcano_runner::messages::{Format, decode};
use volcano_runner::runner::RunnerError;
use volcano_runner::runner::service::Service;
use volcano_runner::sim::{SimConfig, SimHandle, Simulator};
use volcano_runner::volcano::VolcanoJob;

use crate::rabbit::{PATIENCE, TestVhost};

/// The queue the harness binds to the events and proxy exchanges, to see what runners publish.
pub const EVENTS_QUEUE: &str = "test.events";

/// One captured event message.
#[derive(Debug, Clone)]
pub struct Captured {
    pub message_id: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub traceparent: Option<String>,
    pub event: Option<JobEvent>,
    /// The message's `app_id` (`[broker] app_id` of whoever published it).
    pub app_id: Option<String>,
}

/// A vhost, a simulator and the configuration runners get.
pub struct Harness {
    pub vhost: TestVhost,
    pub sim: SimHandle,
    pub client: kube::Client,
    pub config: Config,
    /// The orchestrator's side: publishes submissions, cancels and extensions.
    pub orchestrator: Broker,
    orchestrator_token: CancellationToken,
    captured: Mutex<Vec<Captured>>,
    /// Messages published with `publish`, by routing key: what `wait_all_acked` waits for.
    published: Mutex<BTreeMap<String, u64>>,
}

impl Harness {
    /// A fresh vhost (with the topology and an events queue) and a fresh simulator with its clock
    /// stopped, so no job moves on unless the test advances it.
    pub async fn new(label: &str) -> Self {
        Self::with_sim(label, SimConfig::for_tests()).await
    }

    pub async fn with_sim(label: &str, sim_config: SimConfig) -> Self {
        // VOLCANO_RUNNER_TEST_LOG=debug shows what the runners do, for a test that fails.
        if let Ok(filter) = std::env::var("VOLCANO_RUNNER_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
        let vhost = TestVhost::new(label).await;
        let sim = Simulator::start(sim_config)
            .await
            .expect("the simulator starts");
        let client = sim.client().expect("a client for the simulator");
        let mut config = Config::default();
        config.broker = vhost.config();
        config.broker.connection_name = format!("orchestrator-{label}");
        config.cluster.target = ClusterTarget::Url(sim.url().parse().unwrap());
        config.cluster.retry.max_elapsed = Duration::from_secs(2);
        config.cluster.retry.min_delay = Duration::from_millis(50);
        config.cluster.retry.max_delay = Duration::from_millis(400);
        config.cluster.request_timeout = Duration::from_secs(5);
        config.cluster.relist_interval = Duration::from_secs(30);
        config.runner.requeue_delay = Duration::from_millis(100);
        config.runner.shutdown_grace = Duration::from_secs(10);
        config.licenses.insert(
            "matlab-campus".into(),
            toml::from_str("address = \"license.cloud.sdu.dk\"\nport = 27000").unwrap(),
        );
        let namespaces: Api<Namespace> = Api::all(client.clone());
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
            .expect("the runner's namespace");

        let orchestrator_token = CancellationToken::new();
        let orchestrator = Broker::connect(config.broker.clone(), orchestrator_token.clone())
            .await
            .expect("the orchestrator connects and declares the topology");
        let (connection, channel) = vhost.raw().await;
        channel
            .queue_declare(
                EVENTS_QUEUE.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("events queue");
        for (exchange, key) in [
            (config.broker.events_exchange.as_str(), "#"),
            (config.broker.proxy_exchange.as_str(), ""),
        ] {
            channel
                .queue_bind(
                    EVENTS_QUEUE.into(),
                    exchange.into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind the events queue");
        }
        let _ = connection.close(200, "done".into()).await;
        Self {
            vhost,
            sim,
            client,
            config,
            orchestrator,
            orchestrator_token,
            captured: Mutex::new(Vec::new()),
            published: Mutex::new(BTreeMap::new()),
        }
    }

    /// A runner named `id` with the harness configuration, consuming until stopped. No monitor: these
    /// tests are about the consuming side (tests that want the monitor use [`Harness::start_with`]).
    pub fn start(&self, id: &str) -> RunnerHandle {
        self.start_with(id, self.config.clone(), false)
    }

    /// A runner with its own configuration, and optionally the monitoring duty.
    pub fn start_with(&self, id: &str, mut config: Config, monitor: bool) -> RunnerHandle {
        config.broker.connection_name = format!("runner-{id}");
        let service = Service {
            config,
            client: self.client.clone(),
            runner_id: id.to_owned(),
            monitor,
            monitor_clock: None,
        };
        let token = CancellationToken::new();
        let task = tokio::spawn(service.run(token.clone()));
        RunnerHandle {
            id: id.to_owned(),
            token,
            task: Some(task),
        }
    }

    /// A runner on a runtime of its own, so the test can kill it outright: every task dropped, its
    /// sockets closed, nothing acknowledged or cleaned up, as when a process is killed.
    pub fn start_killable(&self, id: &str) -> KillableRunner {
        self.start_killable_with(id, self.config.clone(), false)
    }

    /// [`Harness::start_killable`] with its own configuration, and optionally the monitoring duty.
    pub fn start_killable_with(
        &self,
        id: &str,
        mut config: Config,
        monitor: bool,
    ) -> KillableRunner {
        config.broker.connection_name = format!("runner-{id}");
        let service = Service {
            config,
            client: self.client.clone(),
            runner_id: id.to_owned(),
            monitor,
            monitor_clock: None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the killable runner");
        // The kube client's connection pool belongs to the test's runtime; this runner gets a client of
        // its own, on its own runtime.
        let url = self.sim.url();
        let token = CancellationToken::new();
        let run_token = token.clone();
        runtime.spawn(async move {
            let client =
                kube::Client::try_from(kube::Config::new(url.parse().unwrap())).expect("a client");
            let service = Service { client, ..service };
            let _ = service.run(run_token).await;
        });
        KillableRunner {
            runtime: Some(runtime),
        }
    }

    /// Publishes a submission with confirms, as an orchestrator does.
    pub async fn submit(&self, job: &SubmitJob) {
        self.publish(Outbound::submit(job, Format::Json, &self.config.broker))
            .await;
    }

    /// Publishes a submission with a W3C trace context.
    pub async fn submit_traced(&self, job: &SubmitJob, traceparent: &str) {
        self.publish(
            Outbound::submit(job, Format::Json, &self.config.broker).with_traceparent(traceparent),
        )
        .await;
    }

    pub async fn cancel(&self, job_id: &str, reason: Option<&str>) {
        let cancel = CancelJob {
            job_id: job_id.into(),
            reason: reason.map(str::to_owned),
        };
        self.publish(Outbound::cancel(&cancel, Format::Json, &self.config.broker))
            .await;
    }

    pub async fn extend(&self, job_id: &str, request_id: &str, seconds: i64) {
        let extend = ExtendJob {
            job_id: job_id.into(),
            request_id: request_id.into(),
            extension: Some(pbjson_types::Duration { seconds, nanos: 0 }),
        };
        self.publish(Outbound::extend(&extend, Format::Json, &self.config.broker))
            .await;
    }

    pub async fn publish(&self, message: Outbound) {
        crate::rabbit::within("publish", self.orchestrator.publisher().publish(&message))
            .await
            .expect("the broker confirms");
        *self
            .published
            .lock()
            .unwrap()
            .entry(message.routing_key)
            .or_default() += 1;
    }

    /// Publishes raw bytes to the jobs exchange with the given properties (bad input).
    pub async fn publish_raw(&self, routing_key: &str, body: &[u8], properties: BasicProperties) {
        self.vhost
            .publish_raw(
                &self.config.broker.jobs_exchange,
                routing_key,
                body,
                properties,
            )
            .await;
    }

    /// Every event captured so far (new ones are fetched from the events queue first).
    pub async fn events(&self) -> Vec<Captured> {
        let fresh = self.vhost.drain(EVENTS_QUEUE).await;
        let mut captured = self.captured.lock().unwrap();
        for m in fresh {
            let props = &m.delivery.properties;
            let format = props
                .content_type()
                .as_ref()
                .and_then(|ct| Format::from_content_type(ct.as_str()).ok())
                .unwrap_or(Format::Json);
            let is_job_event = props
                .kind()
                .as_ref()
                .is_some_and(|t| t.as_str() == "volcano_runner.v1.JobEvent");
            let traceparent = props
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("traceparent").cloned())
                .and_then(|v| match v {
                    AMQPValue::LongString(s) => {
                        Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                    }
                    _ => None,
                });
            captured.push(Captured {
                message_id: props
                    .message_id()
                    .as_ref()
                    .map(|s| s.as_str().to_owned())
                    .unwrap_or_default(),
                routing_key: m.delivery.routing_key.as_str().to_owned(),
                event: is_job_event
                    .then(|| decode::<JobEvent>(format, &m.delivery.data).ok())
                    .flatten(),
                body: m.delivery.data.clone(),
                traceparent,
                app_id: props.app_id().as_ref().map(|s| s.as_str().to_owned()),
            });
        }
        captured.clone()
    }

    /// The job events with this message id.
    pub async fn events_with_id(&self, id: &str) -> Vec<Captured> {
        self.events()
            .await
            .into_iter()
            .filter(|c| c.message_id == id)
            .collect()
    }

    /// Waits until `done` holds for the captured events; fails the test after [`PATIENCE`].
    pub async fn wait_events(
        &self,
        what: &str,
        done: impl Fn(&[Captured]) -> bool,
    ) -> Vec<Captured> {
        self.wait_events_for(what, PATIENCE, done).await
    }

    pub async fn wait_events_for(
        &self,
        what: &str,
        patience: Duration,
        done: impl Fn(&[Captured]) -> bool,
    ) -> Vec<Captured> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let events = self.events().await;
            if done(&events) {
                return events;
            }
            if tokio::time::Instant::now() > deadline {
                let ids: Vec<&str> = events.iter().map(|c| c.message_id.as_str()).collect();
                panic!("timed out waiting for {what}; events so far: {ids:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every VolcanoJob in the cluster.
    pub async fn vcjobs(&self) -> Vec<VolcanoJob> {
        let api: Api<VolcanoJob> = Api::all(self.client.clone());
        api.list(&ListParams::default())
            .await
            .expect("list VolcanoJobs")
            .items
    }

    /// The VolcanoJob of `job_id`, if any.
    pub async fn vcjob(&self, job_id: &str) -> Option<VolcanoJob> {
        let name = format!("j-{job_id}");
        self.vcjobs()
            .await
            .into_iter()
            .find(|j| j.metadata.name.as_deref() == Some(name.as_str()))
    }

    /// Consumers of a queue right now (AMQP passive declare; exact, unlike the management API).
    pub async fn consumers(&self, queue: &str) -> u32 {
        let (connection, channel) = self.vhost.raw().await;
        let q = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("queue {queue}: {e}"));
        let _ = connection.close(200, "done".into()).await;
        q.consumer_count()
    }

    /// Waits until `queue` has `n` consumers.
    pub async fn wait_consumers(&self, queue: &str, n: u32) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.consumers(queue).await != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} never had {n} consumers"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the submit and control queues are empty with nothing unacknowledged.
    pub async fn wait_queues_settled(&self) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let mut busy = Vec::new();
            for q in [
                &self.config.broker.submit_queue,
                &self.config.broker.control_queue,
            ] {
                let (messages, unacked) = self.queue_totals(q).await;
                if messages + unacked > 0 {
                    busy.push(format!("{q}: {messages} ready, {unacked} unacked"));
                }
            }
            if busy.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "queues did not settle: {busy:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every submission, cancel and extension published with `publish` has been
    /// acknowledged by a runner (the management API's `ack` count of each queue, which only grows: a
    /// stale reading delays the answer, never gives a wrong one). `wait_queues_settled` alone may answer
    /// from counts older than the last publish; use this where the test then checks that a message
    /// changed nothing. Only for tests whose every message is acknowledged (none dead-lettered) by a
    /// runner that is still running (a closed channel's counts may leave the queue's).
    pub async fn wait_all_acked(&self) {
        let broker = &self.config.broker;
        let published = self.published.lock().unwrap().clone();
        let expected = |key: &str| published.get(key).copied().unwrap_or(0);
        let submits = expected(&broker.submit_routing_key);
        let controls = expected(&broker.cancel_routing_key) + expected(&broker.extend_routing_key);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let submit_acks = self.queue_acks(&broker.submit_queue).await;
            let control_acks = self.queue_acks(&broker.control_queue).await;
            if submit_acks >= submits && control_acks >= controls {
                return self.wait_queues_settled().await;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not every message acknowledged: submit {submit_acks} of {submits}, control \
                 {control_acks} of {controls}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// How many deliveries of `queue` runners have acknowledged (management API, lagging).
    async fn queue_acks(&self, queue: &str) -> u64 {
        self.queue_stats(queue).await["message_stats"]["ack"]
            .as_u64()
            .unwrap_or(0)
    }

    /// `(ready, unacknowledged)` of a queue from the management API (it lags by its stats interval, so
    /// callers poll).
    pub async fn queue_totals(&self, queue: &str) -> (u64, u64) {
        let body = self.queue_stats(queue).await;
        let ready = body["messages_ready"].as_u64().unwrap_or(0);
        let unacked = body["messages_unacknowledged"].as_u64().unwrap_or(0);
        (ready, unacked)
    }

    /// The management API's view of `queue` in this test's vhost.
    async fn queue_stats(&self, queue: &str) -> serde_json::Value {
        let (status, body) = crate::rabbit::management(
            "GET",
            &format!(
                "/api/queues/{}/{}",
                crate::rabbit::segment(&self.vhost.name),
                crate::rabbit::segment(queue)
            ),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Dead-lettered messages so far (taken from the dead-letter queue).
    pub async fn dead_letters(&self) -> Vec<lapin::message::BasicGetMessage> {
        self.vhost
            .drain(&self.config.broker.dead_letter_queue)
            .await
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.orchestrator_token.cancel();
    }
}

/// A runner started by [`Harness::start`].
pub struct RunnerHandle {
    pub id: String,
    pub token: CancellationToken,
    task: Option<JoinHandle<Result<(), RunnerError>>>,
}

impl RunnerHandle {
    /// Graceful shutdown, as on SIGTERM; waits for the runner to return.
    pub async fn stop(mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            crate::rabbit::within("the runner stops", task)
                .await
                .expect("the runner task")
                .expect("the runner ran without error");
        }
    }
}

impl Drop for RunnerHandle {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// A runner on its own runtime; [`KillableRunner::kill`] drops it without any shutdown.
pub struct KillableRunner {
    runtime: Option<tokio::runtime::Runtime>,
}

impl KillableRunner {
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for KillableRunner {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The example submissions in `schemas/examples`, by job id.
pub fn examples() -> BTreeMap<String, SubmitJob> {
    ["figlet", "matlab-web", "mpi-2-nodes"]
        .into_iter()
        .map(|name| {
            let path = format!(
                "{}/schemas/examples/submit-job.{name}.json",
                env!("CARGO_MANIFEST_DIR")
            );
            let text = std::fs::read_to_string(&path).unwrap();
            let job: SubmitJob = serde_json::from_str(&text).unwrap();
            (job.job_id.clone(), job)
        })
        .collect()
}

/// The figlet example under another job id.
pub fn figlet(job_id: &str) -> SubmitJob {
    let mut job = examples().remove("4817").expect("the figlet example");
    job.job_id = job_id.to_owned();
    job
}
