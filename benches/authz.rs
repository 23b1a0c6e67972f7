//! The session check (`/authz` of `volcano-runner proxy-sync`) under load: open-loop requests at a
//! fixed rate (2,000 per second for 10 s) over loopback HTTP/1.1 keep-alive connections, against a
//! check that knows 2,000 live sessions (from its watch of the simulator) and 2,000 routed jobs. Latency
//! is measured from each request's scheduled start (so a slow answer also counts against the requests
//! queued behind it) to the end of its answer's head, and printed as percentiles and a histogram.
//!
//! Mix: 90 % a valid session on its host (200), 5 % no cookie (401), 5 % a forged id (403). The load
//! generator runs in the same process on the same two cores as the check.
//!
//! `cargo bench --bench authz` (release). Environment: `AUTHZ_RATE` (requests/s), `AUTHZ_SECONDS`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::PostParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use volcano_runner::config::ProxySyncConfig;
use volcano_runner::messages::v1::{ProxyAction, ProxyEvent, ProxyTarget};
use volcano_runner::proxy::{HostNaming, JobUpdate, RouteTable, Routes};
use volcano_runner::sessions::Kind;
use volcano_runner::sessions::check::{CheckSettings, SessionCheck};
use volcano_runner::sessions::record::SessionRecord;
use volcano_runner::sessions::token::{self, Hash};
use volcano_runner::sim::{SimConfig, Simulator};

const SESSIONS: usize = 2_000;
const NAMESPACE: &str = "volcano-runner";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn routes() -> Routes {
    let mut table = RouteTable::new();
    for i in 0..SESSIONS {
        let event = ProxyEvent {
            event_id: format!("b{i}/proxy/create/1"),
            job_id: format!("b{i}"),
            action: ProxyAction::Create as i32,
            targets: vec![ProxyTarget {
                rank: 0,
                pod_ip: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                port: 8888,
                hostname: format!("j-b{i}-job-0.j-b{i}"),
            }],
            domains: vec![],
            timestamp: Some(pbjson_types::Timestamp {
                seconds: 1,
                nanos: 0,
            }),
            sequence: 1,
        };
        table.apply(JobUpdate::from_event(&event).expect("a valid event"));
    }
    Routes::from_table(table)
}

/// One request over a kept-alive connection: the time its answer's head took and its status.
async fn request(stream: &mut TcpStream, head: &[u8], buf: &mut Vec<u8>) -> std::io::Result<u16> {
    stream.write_all(head).await?;
    buf.clear();
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        // Every answer of the check has an empty body (content-length: 0).
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let status = std::str::from_utf8(&buf[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok(status)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let rate = env_or("AUTHZ_RATE", 2_000);
    let seconds = env_or("AUTHZ_SECONDS", 10);
    let sim = Simulator::start(SimConfig::for_tests())
        .await
        .expect("the simulator starts");
    let client = sim.client().unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let now = jiff::Timestamp::now();
    let mut ids = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        let id = token::generate().unwrap();
        let record = SessionRecord {
            hash: Hash::of(&id),
            job_id: format!("b{i}"),
            rank: 0,
            kind: Kind::Web,
            issued_at: now,
            expires_at: now + jiff::SignedDuration::from_hours(8),
        };
        api.create(&PostParams::default(), &record.to_configmap(NAMESPACE))
            .await
            .unwrap();
        ids.push(id);
    }
    let shutdown = CancellationToken::new();
    let check = SessionCheck::start(
        client,
        routes(),
        CheckSettings {
            namespace: NAMESPACE.into(),
            naming: HostNaming {
                prefix: "app-".into(),
                domain: "cloud.sdu.dk".into(),
            },
            secure: true,
            allowed_origins: Vec::new(),
            clock: Arc::new(jiff::Timestamp::now),
            metrics: None,
        },
        &ProxySyncConfig {
            authz_listen: "127.0.0.1:0".into(),
            ..ProxySyncConfig::default()
        },
        None,
        shutdown.clone(),
    )
    .await
    .unwrap();
    while !check.authz.synced() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let addr = check.addr;
    let heads: Vec<(Vec<u8>, u16)> = (0..SESSIONS)
        .flat_map(|i| {
            let host = format!("app-b{i}-0.cloud.sdu.dk");
            let id = &ids[i];
            let head = |cookie: &str| {
                format!(
                    "GET /authz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Host: {host}\r\nX-Forwarded-Uri: /lab/tree?x=1\r\n{cookie}\r\n"
                )
                .into_bytes()
            };
            let mut out = vec![(head(&format!("Cookie: ucloud-compute-session={id}\r\n")), 200); 18];
            out.push((head(""), 401));
            out.push((
                head(&format!(
                    "Cookie: ucloud-compute-session={}\r\n",
                    token::generate().unwrap()
                )),
                403,
            ));
            out
        })
        .collect();
    let heads = Arc::new(heads);
    let pool: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let total = rate * seconds;
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let latencies: Arc<Mutex<Vec<Duration>>> =
        Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    // From the moment each request was written: without the pacing timer's lateness (tokio's timer
    // ticks by the millisecond, so a request may start up to 1 ms after its schedule).
    let service: Arc<Mutex<Vec<Duration>>> =
        Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let wrong: Arc<Mutex<u64>> = Arc::default();
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let scheduled = start + interval * u32::try_from(i).unwrap();
        tokio::time::sleep_until(scheduled).await;
        let (heads, pool, latencies, wrong, service) = (
            heads.clone(),
            pool.clone(),
            latencies.clone(),
            wrong.clone(),
            service.clone(),
        );
        tasks.spawn(async move {
            let (head, want) = &heads[(i as usize * 7919) % heads.len()];
            let taken = pool.lock().unwrap().pop();
            let mut stream = match taken {
                Some(s) => s,
                None => {
                    let s = TcpStream::connect(addr).await.unwrap();
                    s.set_nodelay(true).unwrap();
                    s
                }
            };
            let mut buf = Vec::with_capacity(512);
            let sent = tokio::time::Instant::now();
            let status = request(&mut stream, head, &mut buf).await.unwrap();
            let took = tokio::time::Instant::now() - scheduled;
            service.lock().unwrap().push(sent.elapsed());
            latencies.lock().unwrap().push(took);
            if status != *want {
                *wrong.lock().unwrap() += 1;
            }
            pool.lock().unwrap().push(stream);
        });
        while let Some(done) = tasks.try_join_next() {
            done.unwrap();
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let elapsed = start.elapsed();
    shutdown.cancel();
    let mut all = latencies.lock().unwrap().clone();
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    let connections = pool.lock().unwrap().len();
    println!(
        "authz: {} requests at {rate}/s open-loop over {:.1} s, {connections} keep-alive connections, {} unexpected statuses",
        all.len(),
        elapsed.as_secs_f64(),
        wrong.lock().unwrap()
    );
    println!(
        "from the schedule: p50 {:?}  p90 {:?}  p99 {:?}  p99.9 {:?}  max {:?}",
        at(0.50),
        at(0.90),
        at(0.99),
        at(0.999),
        all[all.len() - 1]
    );
    let mut served = service.lock().unwrap().clone();
    served.sort();
    let served_at = |q: f64| served[((served.len() as f64 * q) as usize).min(served.len() - 1)];
    println!(
        "from the write: p50 {:?}  p90 {:?}  p99 {:?}  p99.9 {:?}  max {:?}",
        served_at(0.50),
        served_at(0.90),
        served_at(0.99),
        served_at(0.999),
        served[served.len() - 1]
    );
    let mut histogram: BTreeMap<u64, usize> = BTreeMap::new();
    for l in &all {
        let micros = l.as_micros().max(1) as u64;
        let bucket = 1u64 << (63 - micros.leading_zeros());
        *histogram.entry(bucket).or_default() += 1;
    }
    println!("histogram (µs, power-of-two buckets):");
    for (bucket, n) in histogram {
        let bar = "#".repeat(((n as f64 / all.len() as f64) * 60.0).ceil() as usize);
        println!("  {:>8} – {:<8} {:>7}  {bar}", bucket, bucket * 2, n);
    }
    drop(sim);
}
