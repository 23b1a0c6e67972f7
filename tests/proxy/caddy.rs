//! A real proxy end to end: proxy-sync configures a running Caddy (Debian's, a process of the test's)
//! through its admin API, from the proxy events on real RabbitMQ and from the simulator's cluster, and
//! requests go through Caddy: to each rank's page, through the session check first, to the bridges for
//! `/.volcano-runner/`, WebSocket upgrades included; in headless Chromium too. Caddy's live configuration
//! (read from its admin API) is compared with what runs, after restarts of Caddy and kill -9 of
//! proxy-sync processes.
//!
//! Until the simulator serves pages on loopback pod addresses, the tests that need a page behind a route
//! publish the job's proxy events themselves with targets on loopback servers of the test's
//! ([`live::Server`]); the tests of what routes exist use jobs run by the runner in the simulator.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, Outbound};
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::{ProxyAction, ProxyEvent};
use volcano_runner::pipeline::plugins::proxy::target;
use volcano_runner::proxy::ProxySyncConfig;

use crate::live::{Browser, COOKIE, Caddy, Role, Server, get, websocket_echo};
use crate::monitor_support::{World, web_job};
use crate::ports::free_port;
use crate::support::{self, cancel};
use crate::sync::{expected, published, replicas, run_jobs};

pub(crate) const DOMAIN: &str = "cloud.sdu.dk";

pub(crate) fn host(job: &str, rank: u32) -> String {
    format!("app-{job}-{rank}.{DOMAIN}")
}

/// A job's event with its ranks at `addrs` (CREATE at sequence 1, REMOVE at 2).
pub(crate) fn event(job: &str, addrs: &[std::net::SocketAddr], remove: bool) -> ProxyEvent {
    ProxyEvent {
        event_id: format!("{job}/proxy/{}", if remove { "remove" } else { "create" }),
        job_id: job.into(),
        action: if remove {
            ProxyAction::Remove
        } else {
            ProxyAction::Create
        } as i32,
        targets: (0..)
            .zip(addrs)
            .map(|(rank, a)| target(job, rank, a.ip().to_string(), u32::from(a.port())))
            .collect(),
        domains: vec![],
        timestamp: Some(pbjson_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 0,
        }),
        sequence: if remove { 2 } else { 1 },
    }
}

/// An instance (in the test process) pushing to `caddy`, its `[proxy_sync]` changed by `configure`.
async fn behind(
    w: &World,
    caddy: &Caddy,
    configure: impl FnOnce(&mut ProxySyncConfig),
) -> support::Instance {
    support::start_configured(w, "a", w.config.broker.clone(), |c| {
        c.caddy_admin = caddy.admin_url.clone();
        c.listen_port = caddy.http_port;
        configure(c);
    })
    .await
}

pub(crate) async fn publish(w: &World, e: &ProxyEvent) {
    let broker = Broker::connect(w.config.broker.clone(), CancellationToken::new())
        .await
        .expect("RabbitMQ");
    broker
        .publisher()
        .publish(&Outbound::proxy(e, Format::Json, &w.config.broker))
        .await
        .expect("confirmed");
    broker.close().await;
}

/// Two ranks behind Caddy with the session check and the bridges: each host reaches its own rank's
/// page with a session; without a cookie (401) or with a wrong one (403) the request never reaches the
/// pod; the session path's 302 and its cookie reach the client; `/.volcano-runner/` goes to the bridge;
/// a WebSocket upgrade passes through to the pod; a host the check does not route is answered 404.
#[tokio::test]
async fn caddy_checks_every_request_routes_each_rank_and_bridge_and_passes_websockets() {
    let w = World::start("caddy-e2e", |_| {}, |_| {}).await;
    let caddy = Caddy::start().await;
    let pods = [
        Server::pod("127.0.1.1", "e1", 0).await,
        Server::pod("127.0.1.2", "e1", 1).await,
    ];
    let upstreams = crate::live::Upstreams::default();
    let authz = Server::start("127.0.0.1", Role::Authz(upstreams.clone())).await;
    let bridge = Server::start("127.0.0.1", Role::Bridge).await;
    let sync = behind(&w, &caddy, |c| {
        c.authz_url = format!("http://{}/authz", authz.addr);
        c.bridge_url = format!("http://{}", bridge.addr);
    })
    .await;
    sync.until_ready().await;
    let addrs = [pods[0].addr, pods[1].addr];
    publish(&w, &event("e1", &addrs, false)).await;
    sync.until("both ranks", |t| t.job("e1").is_some()).await;
    // The check names each host's upstream (the real one from the route table).
    for (rank, addr) in addrs.iter().enumerate() {
        upstreams
            .lock()
            .unwrap()
            .insert(host("e1", rank as u32), addr.to_string());
    }
    let port = caddy.http_port;
    let good = format!("{COOKIE}=good");

    for rank in 0..2u32 {
        let a = get(port, &host("e1", rank), "/lab?x=1", &[("Cookie", &good)]).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(
            a.body.contains(&format!("job e1 rank {rank}")),
            "{}",
            a.body
        );
        let at_pod = pods[rank as usize].last();
        assert_eq!(at_pod.target, "/lab?x=1");
        assert_eq!(at_pod.header("x-volcano-runner-job"), Some("checked"));
    }
    let check = authz.last();
    // The check's path is the endpoint's (Caddy keeps the query; the original URI is the header).
    assert!(check.target.starts_with("/authz"), "{check:?}");
    assert_eq!(check.header("x-forwarded-uri"), Some("/lab?x=1"));
    assert_eq!(
        check.header("x-forwarded-host"),
        Some(host("e1", 1).as_str())
    );
    assert_eq!(check.header("cookie"), Some(good.as_str()));

    let before = pods[0].requests();
    let none = get(port, &host("e1", 0), "/", &[]).await;
    assert_eq!(none.status, 401, "{none:?}");
    let wrong = get(
        port,
        &host("e1", 0),
        "/",
        &[("Cookie", &format!("{COOKIE}=bad"))],
    )
    .await;
    assert_eq!(wrong.status, 403, "{wrong:?}");
    assert_eq!(
        pods[0].requests(),
        before,
        "a refused request never reaches the pod"
    );

    let session = get(
        port,
        &host("e1", 0),
        "/.volcano-runner/session?token=t1",
        &[],
    )
    .await;
    assert_eq!(session.status, 302, "{session:?}");
    assert_eq!(session.header("location"), Some("/"));
    assert_eq!(
        session.header("set-cookie"),
        Some(format!("{COOKIE}=t1; Path=/; HttpOnly; SameSite=Lax").as_str())
    );
    assert_eq!(
        bridge.requests(),
        0,
        "the session path is answered by the check"
    );

    let logs = get(
        port,
        &host("e1", 1),
        "/.volcano-runner/logs",
        &[("Cookie", &good)],
    )
    .await;
    assert_eq!(logs.status, 200, "{logs:?}");
    assert_eq!(
        logs.body,
        format!("bridge {} /.volcano-runner/logs", host("e1", 1))
    );
    let refused = get(port, &host("e1", 1), "/.volcano-runner/terminal", &[]).await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        bridge.requests(),
        1,
        "a refused bridge request never reaches it"
    );

    let (status, echo) = websocket_echo(
        port,
        &host("e1", 1),
        "/ws",
        &[("Cookie", &good)],
        b"hello through caddy",
    )
    .await;
    assert_eq!(status, 101);
    assert_eq!(echo, b"hello through caddy");
    let (status, _) = websocket_echo(port, &host("e1", 1), "/ws", &[], b"x").await;
    assert_eq!(status, 401, "an upgrade without a session is refused");

    // Caddy was given one configuration, which names no job: routing is the check's. Neither the job's
    // hosts nor its pods' addresses are in it (not the bare id "e1": the configuration's random `@id`
    // may hold those two hex digits).
    let live = caddy
        .admin
        .config()
        .await
        .expect("Caddy's configuration")
        .to_string();
    for named in ["app-e1-", "127.0.1.1", "127.0.1.2"] {
        assert!(!live.contains(named), "{named} in {live}");
    }
    upstreams.lock().unwrap().clear();
    let gone = get(port, &host("e1", 0), "/", &[("Cookie", &good)]).await;
    assert_eq!(gone.status, 404, "{gone:?}");
    sync.stop().await;
    w.close().await;
}

/// Caddy killed -9 and started again (empty), and Caddy's configuration replaced by someone: proxy-sync
/// sees it on its next check and pushes the whole configuration again, without a new event.
#[tokio::test]
async fn a_restarted_caddy_or_one_whose_config_was_replaced_gets_every_route_again() {
    let w = World::start("caddy-restart", |_| {}, |_| {}).await;
    let mut caddy = Caddy::start().await;
    let pod = Server::pod("127.0.1.3", "r1", 0).await;
    let sync = behind(&w, &caddy, |c| {
        c.caddy_check = Duration::from_millis(100);
    })
    .await;
    sync.until_ready().await;
    publish(&w, &event("r1", &[pod.addr], false)).await;
    let want = BTreeMap::from([(host("r1", 0), pod.addr.to_string())]);
    caddy.until("r1", |h| *h == want).await;

    caddy.crash_and_restart().await;
    caddy
        .until("r1 pushed again after the restart", |h| *h == want)
        .await;
    let a = get(caddy.http_port, &host("r1", 0), "/", &[]).await;
    assert!(a.body.contains("job r1 rank 0"), "{a:?}");

    // Someone loads another configuration (the admin API stays where it is).
    let other =
        serde_json::json!({"admin": {"listen": caddy.admin_url.trim_start_matches("http://")}});
    caddy.admin.load(&other).await.expect("caddy takes it");
    caddy
        .until("r1 pushed again after the replacement", |h| *h == want)
        .await;
    sync.stop().await;
    w.close().await;
}

/// 200 interactive jobs run (a fifth with two ranks) before the instance starts: when it reports
/// ready, Caddy already routes every rank of every one, to the pods' IPs.
#[tokio::test]
async fn started_while_200_jobs_run_every_route_is_in_caddy_before_ready() {
    // Room for 240 pods.
    let mut w = World::start(
        "caddy-200",
        |_| {},
        |s| {
            for n in &mut s.nodes {
                n.cpu = "200".into();
                n.memory = "800Gi".into();
            }
        },
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let ids: Vec<(String, u32)> = (0..200).map(|i| (format!("c{i}"), replicas(i))).collect();
    run_jobs(&mut w, &ids).await;
    let ns = w.namespace_of(&web_job("c0", 1, ""));
    let caddy = Caddy::start().await;
    let sync = behind(&w, &caddy, |_| {}).await;
    sync.until_ready().await;
    let live = caddy.hosts().await;
    let mut want = BTreeMap::new();
    for (id, ips) in expected(&w, &ns, &ids) {
        for (rank, ip) in ips.into_iter().enumerate() {
            want.insert(host(&id, rank as u32), ip);
        }
    }
    assert_eq!(want.len(), 240);
    assert_eq!(
        live.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "every rank of every job in Caddy at ready"
    );
    for (h, ip) in &want {
        assert_eq!(live[h], format!("{ip}:8080"), "{h}");
    }
    sync.stop().await;
    runner.stop().await;
    w.close().await;
}

/// `volcano-runner proxy-sync` as a process, pushing to `caddy`.
fn spawn_sync(w: &World, caddy: &Caddy, ops_port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["proxy-sync", "--cluster", &w.sim.url(), "--id", "proxy-0"])
        .env("VOLCANO_RUNNER_BROKER__URL", w.vhost.amqp_url())
        .env(
            "VOLCANO_RUNNER_OPS__LISTEN",
            format!("127.0.0.1:{ops_port}"),
        )
        .env("VOLCANO_RUNNER_PIPELINE__PROXY__DOMAIN", DOMAIN)
        .env("VOLCANO_RUNNER_PROXY_SYNC__CADDY_ADMIN", &caddy.admin_url)
        .env(
            "VOLCANO_RUNNER_PROXY_SYNC__LISTEN_PORT",
            caddy.http_port.to_string(),
        )
        .env("VOLCANO_RUNNER_PROXY_SYNC__CADDY_CHECK", "200ms")
        .env_remove("VOLCANO_RUNNER_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("volcano-runner starts")
}

fn kill_9(child: &mut Child) {
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    assert!(killed.success());
    let _ = child.wait();
}

/// proxy-sync processes killed -9 and restarted while jobs start and end (some while no instance
/// runs, some while one starts): at the end Caddy's live routes are exactly the running jobs' ranks,
/// none missing, none stale.
#[tokio::test]
async fn proxy_sync_killed_and_restarted_while_jobs_come_and_go_leaves_caddy_exact() {
    let mut w = World::start("caddy-kill", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let caddy = Caddy::start().await;
    let ops = free_port();
    let mut child = spawn_sync(&w, &caddy, ops);
    let mut running: Vec<(String, u32)> = Vec::new();
    let mut ended = Vec::new();
    let mut next = 0;
    for round in 0..4 {
        // Jobs start...
        let fresh: Vec<(String, u32)> = (next..next + 6)
            .map(|i| (format!("q{i}"), replicas(i)))
            .collect();
        next += 6;
        run_jobs(&mut w, &fresh).await;
        running.extend(fresh);
        // ...the instance dies, two jobs end while none runs...
        kill_9(&mut child);
        let ns = w.namespace_of(&web_job("q0", 1, ""));
        for _ in 0..2 {
            let (id, _) = running.remove(round % running.len());
            cancel(&w, &ns, &id).await;
            ended.push(id);
        }
        // ...and a new one starts while more end and start.
        child = spawn_sync(&w, &caddy, ops);
        let (id, _) = running.remove(0);
        cancel(&w, &ns, &id).await;
        ended.push(id);
        for _ in 0..4 {
            w.advance(5);
        }
        w.until("REMOVE for every ended job", |s| {
            ended.iter().all(|id| published(s).1.contains(id))
        })
        .await;
    }
    let ns = w.namespace_of(&web_job("q0", 1, ""));
    let mut want = BTreeMap::new();
    for (id, ips) in expected(&w, &ns, &running) {
        for (rank, ip) in ips.into_iter().enumerate() {
            want.insert(host(&id, rank as u32), format!("{ip}:8080"));
        }
    }
    assert!(!want.is_empty());
    caddy
        .until("exactly the running jobs' routes", |h| *h == want)
        .await;
    // And it stays so (nothing late brings an ended job back).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(caddy.hosts().await, want);
    for id in &ended {
        assert!(!want.contains_key(&host(id, 0)), "{id} has ended");
    }
    kill_9(&mut child);
    runner.stop().await;
    w.close().await;
}

/// Headless Chromium opens a 2-rank job's hosts through Caddy and sees rank 0's page, then rank 1's;
/// after the job ends its host is gone. (The session cases are [`Browser::open`] on the session URL,
/// with and without the right token.)
#[tokio::test]
async fn chromium_sees_rank_0_then_rank_1_through_caddy_and_nothing_after_the_job_ends() {
    let w = World::start("caddy-browser", |_| {}, |_| {}).await;
    let caddy = Caddy::start().await;
    let pods = [
        Server::pod("127.0.1.4", "b1", 0).await,
        Server::pod("127.0.1.5", "b1", 1).await,
    ];
    let sync = behind(&w, &caddy, |_| {}).await;
    sync.until_ready().await;
    let addrs = [pods[0].addr, pods[1].addr];
    publish(&w, &event("b1", &addrs, false)).await;
    caddy
        .until("both ranks", |h| h.contains_key(&host("b1", 1)))
        .await;
    let browser = Browser {
        domain: DOMAIN.into(),
        proxy_port: caddy.http_port,
    };
    let url = |rank| browser.url(&host("b1", rank), "/tree");
    for rank in 0..2 {
        let page = browser.open(&url(rank)).await;
        assert_eq!(page.statuses, [200], "{page:?}");
        assert!(
            page.dom
                .contains(&format!("<h1 id=\"who\">job b1 rank {rank}</h1>")),
            "{page:?}"
        );
        let at_pod = pods[rank as usize].seen.lock().unwrap().clone();
        assert!(at_pod.iter().any(|r| r.target == "/tree"), "{at_pod:?}");
    }
    publish(&w, &event("b1", &addrs, true)).await;
    caddy.until("b1 gone", |h| h.is_empty()).await;
    let page = browser.open(&url(0)).await;
    assert_eq!(page.statuses, [404], "{page:?}");
    assert!(!page.dom.contains("job b1"), "{page:?}");
    sync.stop().await;
    w.close().await;
}
