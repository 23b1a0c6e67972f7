//! Measurements, not tests (ignored; run with
//! `cargo test --release --test proxy measure -- --ignored --nocapture`): the figures are printed, never
//! asserted.
//!
//! - Route latency: from publishing a `CREATE` (with confirms, as the monitor does) to the route being in
//!   an instance's table, and the same for `REMOVE`, over 1,000 jobs, one at a time.
//! - Rebuild: an instance's table built from a simulator with 10,000 running interactive jobs (the list
//!   of jobs and pods, the table, and the Envoy files).
//! - Caddy: without the check, the whole configuration for 10,000 jobs pushed to a running Caddy
//!   (`POST /load`); with it, the one configuration, and a route from `CREATE` published to a request
//!   through Caddy being routed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, Outbound};
use volcano_runner::config::Config;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::{ProxyAction, ProxyEvent, ProxyTarget};
use volcano_runner::pipeline::NamespaceMode;
use volcano_runner::proxy::envoy::{self, EnvoySettings};
use volcano_runner::proxy::{HostNaming, RouteTable, snapshot};
use volcano_runner::sim::{NodeSpec, SimConfig, Simulator};
use volcano_runner::volcano::VolcanoJob;

use crate::monitor_support::{World, web_job};
use crate::support;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{what}: n={} p50={:?} p99={:?} max={:?}",
        samples.len(),
        percentile(&samples, 0.50),
        percentile(&samples, 0.99),
        samples.last().unwrap()
    );
}

fn event(job: &str, action: ProxyAction, sequence: u64) -> ProxyEvent {
    ProxyEvent {
        event_id: format!("{job}/proxy/x/{sequence}"),
        job_id: job.into(),
        action: action as i32,
        targets: if action == ProxyAction::Remove {
            vec![]
        } else {
            vec![ProxyTarget {
                rank: 0,
                pod_ip: "10.2.0.1".into(),
                port: 8888,
                hostname: format!("j-{job}-job-0.j-{job}"),
            }]
        },
        domains: vec![],
        timestamp: Some(pbjson_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 0,
        }),
        sequence,
    }
}

#[tokio::test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
async fn route_latency_from_publish_to_table() {
    let w = World::start("proxy-latency", |_| {}, |_| {}).await;
    let sync = support::start(&w, "a").await;
    sync.until_ready().await;
    let broker = Broker::connect(w.config.broker.clone(), CancellationToken::new())
        .await
        .expect("RabbitMQ");
    let publisher = broker.publisher();
    let mut changes = sync.routes.subscribe();
    let (mut created, mut removed) = (Vec::new(), Vec::new());
    for i in 0..1000 {
        let job = format!("l{i}");
        for (action, samples) in [
            (ProxyAction::Create, &mut created),
            (ProxyAction::Remove, &mut removed),
        ] {
            let message = Outbound::proxy(
                &event(&job, action, 1 + u64::from(action == ProxyAction::Remove)),
                Format::Protobuf,
                &w.config.broker,
            );
            let began = Instant::now();
            publisher.publish(&message).await.expect("confirmed");
            let want = action == ProxyAction::Create;
            while sync.routes.read(|t| t.job(&job).is_some()) != want {
                changes.changed().await.unwrap();
            }
            samples.push(began.elapsed());
        }
    }
    report("CREATE publish -> route in the table", created);
    report("REMOVE publish -> route gone from the table", removed);
    sync.stop().await;
    broker.close().await;
    w.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
async fn rebuild_from_ten_thousand_running_jobs() {
    let n: usize = std::env::var("PROXY_REBUILD_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut sim_config = SimConfig::for_tests();
    sim_config.start_time = "2026-11-22T08:00:00Z".into();
    sim_config.nodes = (0..n / 100 + 2)
        .map(|i| NodeSpec {
            name: format!("node-{i}"),
            cpu: "128".into(),
            memory: "1024Gi".into(),
            gpus: 0,
            max_pods: 110,
            labels: Default::default(),
            taints: Vec::new(),
        })
        .collect();
    let sim = Arc::new(Simulator::start(sim_config).await.expect("the simulator"));
    let client = sim.client().unwrap();
    let mut config = Config::default();
    config.pipeline.namespace.mode = NamespaceMode::Single;
    config.pipeline.namespace.name = "bench".into();
    let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in ["bench", "volcano-runner"] {
        let object = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        let _ = namespaces.create(&PostParams::default(), &object).await;
    }
    let api: Api<VolcanoJob> = Api::namespaced(client.clone(), "bench");
    let began = Instant::now();
    let start: jiff::Timestamp = "2026-11-22T08:00:00Z".parse().unwrap();
    futures::future::join_all((0..8).map(|worker| {
        let api = api.clone();
        let config = &config;
        let keys = &keys;
        async move {
            for i in (worker..n).step_by(8) {
                let job = web_job(&format!("r{i}"), 1, "sleep 100000");
                let mut vcjob = volcano_runner::pipeline::render(&job, config, start)
                    .expect("renders")
                    .vcjob;
                if let Some(spec) = vcjob.spec.tasks[0].template.spec.as_mut() {
                    spec.init_containers = None;
                }
                vcjob.metadata.finalizers = Some(vec![keys.cleanup_finalizer()]);
                api.create(&PostParams::default(), &vcjob)
                    .await
                    .expect("a job is created");
            }
        }
    }))
    .await;
    for _ in 0..5 {
        sim.advance(Duration::from_secs(2));
    }
    println!("created {n} running jobs in {:?}", began.elapsed());

    let pipeline = config.pipeline.clone();
    let selector = config.cluster.managed_selector.clone();
    let dir = std::env::temp_dir().join(format!("vr-proxy-rebuild-{}", std::process::id()));
    let settings = EnvoySettings {
        dir: dir.clone(),
        listen_port: 8080,
        connect_timeout_ms: 5000,
        authz: None,
        bridge: None,
    };
    let naming = HostNaming {
        prefix: pipeline.proxy.prefix.clone(),
        domain: pipeline.proxy.domain.clone(),
    };
    for round in 0..3 {
        let t0 = Instant::now();
        let (jobs, pods) = snapshot::list(&client, &selector).await.expect("lists");
        let listed = t0.elapsed();
        let (updates, skipped) = snapshot::updates(&jobs, &pods, &keys, &pipeline);
        let mut table = RouteTable::new();
        table.replace(updates);
        let built = t0.elapsed();
        envoy::write_all(&table, &naming, &settings, "bench").unwrap();
        let written = t0.elapsed();
        assert!(skipped.is_empty());
        println!(
            "rebuild {round}: {} jobs routed; listed in {listed:?}, table at {built:?}, Envoy files at {written:?}",
            table.live_jobs()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Caddy. Without the check: how long a `POST /load` of the whole configuration takes for 10,000 routed
/// jobs (every change is one). With the check: the configuration for 10,000 jobs is the one for none
/// (its size and one load), and a route from `CREATE` published to a request through Caddy being routed
/// (answered 401 by the check, not 404): nothing is pushed to Caddy on a change.
#[tokio::test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
async fn caddy_load_and_route_latency() {
    use volcano_runner::config::proxy_sync::Upstream;
    use volcano_runner::proxy::caddy::{self, CaddySettings};
    use volcano_runner::proxy::{JobUpdate, ProxySyncConfig};
    use volcano_runner::sessions::check::{CheckSettings, SessionCheck};

    let live = crate::live::Caddy::start().await;
    let authz_port = crate::ports::free_port();
    let with_check = CaddySettings {
        admin: Upstream::parse(&live.admin_url).unwrap(),
        listen_port: live.http_port,
        authz: Some(Upstream::parse(&format!("http://127.0.0.1:{authz_port}/authz")).unwrap()),
        bridge: Some(Upstream::parse("http://127.0.0.1:9902").unwrap()),
    };
    let without_check = CaddySettings {
        authz: None,
        ..with_check.clone()
    };
    let naming = HostNaming {
        prefix: "app-".into(),
        domain: "cloud.sdu.dk".into(),
    };
    let mut table = RouteTable::new();
    for i in 0..10_000u32 {
        let e = ProxyEvent {
            event_id: format!("m{i}/proxy/create/1"),
            job_id: format!("m{i}"),
            action: ProxyAction::Create as i32,
            targets: vec![ProxyTarget {
                rank: 0,
                pod_ip: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                port: 8888,
                hostname: format!("j-m{i}-job-0.j-m{i}"),
            }],
            domains: vec![],
            timestamp: Some(pbjson_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 0,
            }),
            sequence: 1,
        };
        table.apply(JobUpdate::from_event(&e).unwrap());
    }
    let mut loads = Vec::new();
    for round in 0..3 {
        let t0 = Instant::now();
        let (config, _) = caddy::config(&table.routes(&naming), &without_check);
        let rendered = t0.elapsed();
        let bytes = serde_json::to_vec(&config).unwrap().len();
        let t1 = Instant::now();
        live.admin.load(&config).await.expect("caddy loads it");
        loads.push(t1.elapsed());
        println!(
            "without the check, round {round}: 10,000 routes rendered in {rendered:?} ({bytes} bytes), loaded in {:?}",
            t1.elapsed()
        );
    }
    report("without the check: POST /load of 10,000 routes", loads);
    let t0 = Instant::now();
    let (config, marker) = caddy::config(&table.routes(&naming), &with_check);
    let rendered = t0.elapsed();
    assert_eq!(caddy::config(&[], &with_check).1, marker);
    let bytes = serde_json::to_vec(&config).unwrap().len();
    let t1 = Instant::now();
    live.admin.load(&config).await.expect("caddy loads it");
    println!(
        "with the check: the configuration for 10,000 jobs (the same as for none) rendered in {rendered:?} ({bytes} bytes), loaded once in {:?}",
        t1.elapsed()
    );

    // From CREATE published to the route through Caddy, 100 jobs one after another.
    let w = World::start("caddy-latency", |_| {}, |_| {}).await;
    let sync = support::start_configured(&w, "m", w.config.broker.clone(), |c| {
        c.caddy_admin = live.admin_url.clone();
        c.listen_port = live.http_port;
        c.coalesce = Duration::from_millis(20);
        c.authz_url = format!("http://127.0.0.1:{authz_port}/authz");
    })
    .await;
    sync.until_ready().await;
    let shutdown = CancellationToken::new();
    let check = SessionCheck::start(
        w.client.clone(),
        sync.routes.clone(),
        CheckSettings {
            namespace: w.config.cluster.namespace.clone(),
            naming: naming.clone(),
            secure: false,
            allowed_origins: Vec::new(),
            clock: Arc::new(jiff::Timestamp::now),
            metrics: None,
        },
        &ProxySyncConfig {
            authz_listen: format!("127.0.0.1:{authz_port}"),
            ..ProxySyncConfig::default()
        },
        None,
        shutdown.clone(),
    )
    .await
    .unwrap();
    let publisher = Broker::connect(w.config.broker.clone(), CancellationToken::new())
        .await
        .unwrap();
    let mut samples = Vec::new();
    for i in 0..100 {
        let job = format!("l{i}");
        let e = ProxyEvent {
            event_id: format!("{job}/proxy/create/1"),
            job_id: job.clone(),
            action: ProxyAction::Create as i32,
            targets: vec![ProxyTarget {
                rank: 0,
                pod_ip: "10.1.0.1".into(),
                port: 8888,
                hostname: format!("j-{job}-job-0.j-{job}"),
            }],
            domains: vec![],
            timestamp: Some(pbjson_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 0,
            }),
            sequence: 1,
        };
        let t0 = Instant::now();
        publisher
            .publisher()
            .publish(&Outbound::proxy(&e, Format::Json, &w.config.broker))
            .await
            .unwrap();
        let host = format!("app-{job}-0.cloud.sdu.dk");
        while crate::live::get(live.http_port, &host, "/", &[])
            .await
            .status
            != 401
        {}
        samples.push(t0.elapsed());
    }
    report(
        "with the check: CREATE published to the route through Caddy (a request answered 401)",
        samples,
    );
    publisher.close().await;
    shutdown.cancel();
    check.join().await;
    sync.stop().await;
    w.close().await;
}
