//! Nothing missed, nothing stale: an instance started while jobs run routes all of them before it is
//! ready, follows the events after that, and one killed and restarted while jobs start and end comes
//! back with exactly the jobs that run. The jobs are made as the runner makes them and the proxy events
//! are published by the runner's own monitor.

use std::collections::{BTreeMap, BTreeSet};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tokio_util::sync::CancellationToken;
use volcano_runner::broker::{Broker, BrokerConfig, Outbound};
use volcano_runner::messages::Format;
use volcano_runner::messages::v1::{ProxyAction, ProxyEvent, ProxyTarget};

use crate::monitor_support::{Seen, World, web_job};
use crate::rabbit::{AMQP_ADDR, management, segment};
use crate::support::{self, cancel, pod_ips, routed};

/// Job `i` of a test: every fifth has two ranks.
pub(crate) fn replicas(i: usize) -> u32 {
    if i.is_multiple_of(5) { 2 } else { 1 }
}

/// Job ids with a published CREATE, and with a published REMOVE.
pub(crate) fn published(seen: &Seen) -> (BTreeSet<String>, BTreeSet<String>) {
    let of = |action: ProxyAction| {
        seen.proxy
            .iter()
            .filter(|p| p.action == action as i32)
            .map(|p| p.job_id.clone())
            .collect()
    };
    (of(ProxyAction::Create), of(ProxyAction::Remove))
}

/// Submits jobs `ids` and waits until the monitor published a CREATE for each.
pub(crate) async fn run_jobs(w: &mut World, ids: &[(String, u32)]) {
    for (id, replicas) in ids {
        w.submit(&web_job(id, *replicas, "sleep 100000")).await;
    }
    let want: BTreeSet<String> = ids.iter().map(|(id, _)| id.clone()).collect();
    for _ in 0..5 {
        w.advance(2);
    }
    w.until("a CREATE for every job", |s| {
        want.is_subset(&published(s).0)
    })
    .await;
}

/// What the cluster runs: each job's ranks' IPs.
pub(crate) fn expected(
    w: &World,
    ns: &str,
    ids: &[(String, u32)],
) -> BTreeMap<String, Vec<String>> {
    ids.iter()
        .map(|(id, r)| (id.clone(), pod_ips(w, ns, id, *r)))
        .collect()
}

/// 50 interactive jobs run (ten with two ranks) before the instance starts: at the moment it reports
/// ready, its table and the Envoy routes it wrote have all 50, with the pods' IPs. Then a job started
/// afterwards is added, and one cancelled is removed.
#[tokio::test]
async fn started_while_jobs_run_it_routes_every_one_before_ready_then_follows_events() {
    let mut w = World::start("proxy-rebuild", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let ids: Vec<(String, u32)> = (0..50).map(|i| (format!("w{i}"), replicas(i))).collect();
    run_jobs(&mut w, &ids).await;
    let ns = w.namespace_of(&web_job("w0", 1, ""));
    let want = expected(&w, &ns, &ids);

    let sync = support::start(&w, "a").await;
    let at_ready = sync.until_ready().await;
    assert_eq!(routed(&at_ready), want, "every running job, before ready");
    let hosts = sync.written_hosts();
    for (id, r) in &ids {
        for rank in 0..*r {
            assert_eq!(
                hosts.get(&format!("app-{id}-{rank}.cloud.sdu.dk")),
                Some(&format!("job-{id}-{rank}")),
                "{id} rank {rank} in the Envoy routes written before ready"
            );
        }
    }
    assert_eq!(hosts.len(), 60);

    // After start: a new job is added from its CREATE...
    run_jobs(&mut w, &[("late".into(), 2)]).await;
    sync.until("the late job", |t| t.job("late").is_some())
        .await;
    let late = pod_ips(&w, &ns, "late", 2);
    assert_eq!(routed(&sync.routes.read(Clone::clone))["late"], late);
    // ...and a cancelled one is removed on its REMOVE.
    cancel(&w, &ns, "w3").await;
    for _ in 0..4 {
        w.advance(5);
    }
    w.until("REMOVE w3", |s| published(s).1.contains("w3"))
        .await;
    sync.until("w3 gone", |t| t.job("w3").is_none()).await;
    sync.until_written("w3's host gone from the Envoy routes", |hosts| {
        !hosts.contains_key("app-w3-0.cloud.sdu.dk")
            && hosts.contains_key("app-late-1.cloud.sdu.dk")
    })
    .await;
    assert_eq!(sync.routes.read(|t| t.live_jobs()), 50);
    sync.stop().await;
    runner.stop().await;
    w.close().await;
}

/// Killed, then restarted while jobs start and end: the new instance's table is exactly the jobs that
/// run (the new ones in, the ended ones out), and it follows later events too.
#[tokio::test]
async fn killed_and_restarted_it_has_no_stale_and_no_missing_route() {
    let mut w = World::start("proxy-restart", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let first: Vec<(String, u32)> = (0..10).map(|i| (format!("k{i}"), replicas(i))).collect();
    run_jobs(&mut w, &first).await;
    let ns = w.namespace_of(&web_job("k0", 1, ""));
    let sync = support::start(&w, "a").await;
    assert_eq!(routed(&sync.until_ready().await), expected(&w, &ns, &first));
    sync.kill().await;

    // While no instance runs: three jobs end, three start.
    for id in ["k1", "k2", "k5"] {
        cancel(&w, &ns, id).await;
    }
    let second: Vec<(String, u32)> = (10..13).map(|i| (format!("k{i}"), replicas(i))).collect();
    run_jobs(&mut w, &second).await;
    for _ in 0..4 {
        w.advance(5);
    }
    w.until("REMOVE for the ended jobs", |s| {
        ["k1", "k2", "k5"]
            .iter()
            .all(|id| published(s).1.contains(*id))
    })
    .await;
    let running: Vec<(String, u32)> = first
        .iter()
        .chain(&second)
        .filter(|(id, _)| !["k1", "k2", "k5"].contains(&id.as_str()))
        .cloned()
        .collect();

    let restarted = support::start(&w, "b").await;
    assert_eq!(
        routed(&restarted.until_ready().await),
        expected(&w, &ns, &running),
        "exactly the running jobs"
    );
    // And it follows what happens next.
    cancel(&w, &ns, "k12").await;
    for _ in 0..4 {
        w.advance(5);
    }
    restarted
        .until("k12 gone", |t| t.job("k12").is_none())
        .await;
    restarted.stop().await;
    runner.stop().await;
    w.close().await;
}

fn create(job: &str, ip: &str, sequence: u64) -> ProxyEvent {
    ProxyEvent {
        event_id: format!("{job}/proxy/create/{sequence}"),
        job_id: job.into(),
        action: ProxyAction::Create as i32,
        targets: vec![ProxyTarget {
            rank: 0,
            pod_ip: ip.into(),
            port: 8888,
            hostname: format!("j-{job}-job-0.j-{job}"),
        }],
        domains: vec![],
        timestamp: Some(pbjson_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 0,
        }),
        sequence,
    }
}

/// Events in either encoding are applied (by their content type), an older one does not replace a
/// newer one, and what is not a valid proxy event goes to the dead-letter queue with the reason, the
/// table untouched.
#[tokio::test]
async fn both_encodings_apply_and_bad_events_are_dead_lettered_with_the_reason() {
    let w = World::start("proxy-input", |_| {}, |_| {}).await;
    let sync = support::start(&w, "a").await;
    sync.until_ready().await;
    let publisher = Broker::connect(w.config.broker.clone(), CancellationToken::new())
        .await
        .expect("RabbitMQ");
    let c = &w.config.broker;
    let publish = |o: Outbound| {
        let publisher = publisher.publisher();
        async move { publisher.publish(&o).await.expect("confirmed") }
    };
    publish(Outbound::proxy(
        &create("p1", "10.1.0.1", 2),
        Format::Protobuf,
        c,
    ))
    .await;
    publish(Outbound::proxy(
        &create("j1", "10.1.0.2", 1),
        Format::Json,
        c,
    ))
    .await;
    sync.until("both", |t| t.job("p1").is_some() && t.job("j1").is_some())
        .await;
    // Older (sequence 1 after 2): ignored. Then bad input, then a marker event.
    publish(Outbound::proxy(
        &create("p1", "10.9.9.9", 1),
        Format::Json,
        c,
    ))
    .await;
    let mut bad_ip = create("b1", "10.1.0.3", 1);
    bad_ip.targets[0].pod_ip = "not-an-ip".into();
    publish(Outbound::proxy(&bad_ip, Format::Json, c)).await;
    let properties = BasicProperties::default()
        .with_content_type(ShortString::from("application/json"))
        .with_type(ShortString::from("volcano_runner.v1.ProxyEvent"));
    w.vhost
        .publish_raw(&c.proxy_exchange, "", b"{\"jobId\": ", properties)
        .await;
    publish(Outbound::proxy(
        &create("marker", "10.1.0.4", 1),
        Format::Json,
        c,
    ))
    .await;
    sync.until("the marker", |t| t.job("marker").is_some())
        .await;
    sync.routes.read(|t| {
        assert_eq!(t.job("p1").unwrap().ranks[&0].ip.to_string(), "10.1.0.1");
        assert!(t.job("b1").is_none());
        assert_eq!(t.live_jobs(), 3);
    });
    let dead = w.vhost.drain(&c.dead_letter_queue).await;
    let header = |m: &lapin::message::BasicGetMessage, name: &str| -> Option<String> {
        let headers: &FieldTable = m.delivery.properties.headers().as_ref()?;
        match headers.inner().get(name)? {
            AMQPValue::LongString(s) => Some(s.to_string()),
            AMQPValue::ShortString(s) => Some(s.to_string()),
            _ => None,
        }
    };
    let reasons: Vec<(Option<String>, Option<String>)> = dead
        .iter()
        .map(|m| {
            (
                header(m, "x-volcano-runner-reason"),
                header(m, "x-volcano-runner-field"),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            (
                Some("invalid_field".into()),
                Some("targets[0].podIp".into())
            ),
            (Some("invalid_json".into()), None),
        ]
    );
    sync.stop().await;
    publisher.close().await;
    w.close().await;
}

/// A RabbitMQ user of its own for one instance, whose access a test can take away and give back.
struct User {
    name: String,
    vhost: String,
}

impl User {
    async fn new(w: &World, label: &str) -> Self {
        let name = format!("{}-{label}", w.vhost.name);
        let (status, body) = management(
            "PUT",
            &format!("/api/users/{}", segment(&name)),
            Some(&serde_json::json!({"password": "secret", "tags": ""})),
        )
        .await;
        assert!(matches!(status, 201 | 204), "user {name}: {status} {body}");
        let user = Self {
            name,
            vhost: w.vhost.name.clone(),
        };
        user.allow(true).await;
        user
    }

    fn permissions(&self) -> String {
        format!(
            "/api/permissions/{}/{}",
            segment(&self.vhost),
            segment(&self.name)
        )
    }

    async fn allow(&self, allowed: bool) {
        let (status, body) = if allowed {
            let all = serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"});
            management("PUT", &self.permissions(), Some(&all)).await
        } else {
            management("DELETE", &self.permissions(), None).await
        };
        assert!(
            matches!(status, 201 | 204),
            "permissions of {}: {status} {body}",
            self.name
        );
    }

    fn broker_config(&self, w: &World) -> BrokerConfig {
        let mut c = w.config.broker.clone();
        c.url = volcano_runner::config::Secret::new(format!(
            "amqp://{}:secret@{AMQP_ADDR}/{}",
            segment(&self.name),
            segment(&self.vhost)
        ));
        c
    }

    async fn delete(self) {
        management(
            "DELETE",
            &format!("/api/users/{}", segment(&self.name)),
            None,
        )
        .await;
    }
}

/// The instance's connection is lost, and it cannot come back while a job ends and another starts: the
/// events of both were published while it had no queue. Once it is back (a new queue), it rebuilds from
/// the cluster: the ended job's route is gone and the new job's is there, though it never got either
/// event.
#[tokio::test]
async fn after_a_lost_connection_it_rebuilds_from_the_cluster() {
    let mut w = World::start("proxy-reconnect", |_| {}, |_| {}).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let first: Vec<(String, u32)> = (0..4).map(|i| (format!("c{i}"), 1)).collect();
    run_jobs(&mut w, &first).await;
    let ns = w.namespace_of(&web_job("c0", 1, ""));
    let user = User::new(&w, "sync").await;
    let sync = support::start_with(&w, "a", user.broker_config(&w)).await;
    assert_eq!(routed(&sync.until_ready().await), expected(&w, &ns, &first));

    user.allow(false).await;
    let connections = w.vhost.connections_named("proxy-sync-a").await;
    assert_eq!(connections.len(), 1, "{connections:?}");
    w.vhost.force_close(&connections[0]).await;
    cancel(&w, &ns, "c1").await;
    for _ in 0..4 {
        w.advance(5);
    }
    w.until("REMOVE c1", |s| published(s).1.contains("c1"))
        .await;
    run_jobs(&mut w, &[("c9".into(), 1)]).await;
    assert!(
        sync.routes
            .read(|t| t.job("c1").is_some() && t.job("c9").is_none()),
        "no event reached the instance while it was away"
    );

    user.allow(true).await;
    sync.until("c1 gone and c9 routed", |t| {
        t.job("c1").is_none() && t.job("c9").is_some()
    })
    .await;
    let running: Vec<(String, u32)> = first
        .iter()
        .filter(|(id, _)| id != "c1")
        .cloned()
        .chain([("c9".to_owned(), 1)])
        .collect();
    sync.until_ready().await;
    assert_eq!(
        routed(&sync.routes.read(Clone::clone)),
        expected(&w, &ns, &running)
    );
    sync.stop().await;
    user.delete().await;
    runner.stop().await;
    w.close().await;
}
