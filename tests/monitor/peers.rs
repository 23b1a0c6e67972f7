//! Peers by name and peers run together (issue 30, points 3 and 7), against the simulator:
//!
//! - two jobs that both call their peer `db` both run, in one shared namespace (two owners) and in an
//!   owner's namespace (one owner), and in each job's pods `db` resolves to that job's own peer, as
//!   cluster DNS answers it from the objects (the pod's search list, the job's headless peers Service and
//!   its EndpointSlice), and in no other pod;
//! - a job whose peer waits is told so, naming the peer, and starts only once the peer runs;
//! - a running job whose peer ends is told once, even across a crash of the runner that told it.

use crate::monitor_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use monitor_support::*;
use volcano_runner::messages::v1::{
    JobEvent, Owner, PeerValue, ResourceValue, SubmitJob, resource_value,
};
use volcano_runner::pipeline::NamespaceMode;

fn owned(mut job: SubmitJob, user: &str) -> SubmitJob {
    job.owner = Some(Owner {
        user: user.into(),
        ..Owner::default()
    });
    job
}

fn with_peer(mut job: SubmitJob, hostname: &str, peer: &str) -> SubmitJob {
    job.resources.push(ResourceValue {
        value: Some(resource_value::Value::Peer(PeerValue {
            hostname: hostname.into(),
            job_id: peer.into(),
        })),
    });
    job
}

/// Advances the clock a second at a time until every job's RUNNING is published.
async fn until_running(w: &mut World, job_ids: &[&str]) {
    let ids: Vec<String> = job_ids.iter().map(|j| format!("{j}/RUNNING")).collect();
    for _ in 0..60 {
        if ids.iter().all(|id| w.seen.event(id).is_some()) {
            break;
        }
        w.advance(1);
        w.settle(Duration::from_millis(80)).await;
    }
    w.until("RUNNING", |s| ids.iter().all(|id| s.event(id).is_some()))
        .await;
}

/// How cluster DNS (CoreDNS' kubernetes plugin) answers `name` asked in `pod`, from the objects: the
/// resolver tries the name under each search domain in order (`ndots: 5`, so a bare name is searched
/// first): the namespace's, `svc.<zone>`, `<zone>`, then the pod's `dnsConfig.searches`. Under the
/// zone, `<service>.<ns>.svc` is a Service (a headless one answers its ready endpoints' addresses) and
/// `<hostname>.<service>.<ns>.svc` is the endpoint of a headless Service with that hostname.
async fn resolve(client: &kube::Client, pod: &Pod, name: &str) -> Option<Vec<String>> {
    let zone = "cluster.local";
    let ns = pod.metadata.namespace.clone().unwrap();
    let mut searches = vec![
        format!("{ns}.svc.{zone}"),
        format!("svc.{zone}"),
        zone.to_owned(),
    ];
    searches.extend(
        pod.spec
            .as_ref()
            .and_then(|s| s.dns_config.as_ref())
            .and_then(|d| d.searches.clone())
            .unwrap_or_default(),
    );
    for domain in searches {
        let fqdn = format!("{name}.{domain}");
        let Some(rest) = fqdn.strip_suffix(&format!(".svc.{zone}")) else {
            continue;
        };
        let labels: Vec<&str> = rest.split('.').collect();
        let (hostname, service, namespace) = match labels.as_slice() {
            [service, namespace] => (None, *service, *namespace),
            [hostname, service, namespace] => (Some(*hostname), *service, *namespace),
            _ => continue,
        };
        let services: Api<Service> = Api::namespaced(client.clone(), namespace);
        let Some(svc) = services.get_opt(service).await.unwrap() else {
            continue;
        };
        let headless = svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None");
        if !headless {
            if hostname.is_none() {
                return svc.spec.and_then(|s| s.cluster_ip).map(|ip| vec![ip]);
            }
            continue;
        }
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
        let selector = format!("kubernetes.io/service-name={service}");
        let mut addresses = Vec::new();
        for slice in slices
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
        {
            for e in slice.endpoints {
                let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if ready && (hostname.is_none() || e.hostname.as_deref() == hostname) {
                    addresses.extend(e.addresses);
                }
            }
        }
        if !addresses.is_empty() {
            return Some(addresses);
        }
    }
    None
}

async fn pod(w: &World, ns: &str, name: &str) -> Pod {
    Api::<Pod>::namespaced(w.client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("pod {name}: {e}"))
}

/// Two jobs that both call their peer `db` run, each `db` resolving to its own peer's rank 0 (and in no
/// other job's pods): the objects carry job-unique names (`j-<jobId>-peers`), the pods search their
/// job's peers domain. On main the second job's Service `db` collided (`AlreadyExists`).
async fn both_call_their_peer_db(label: &str, single: bool, owners: [&str; 2]) {
    let mut w = World::start(
        label,
        |c| {
            if single {
                c.pipeline.namespace.mode = NamespaceMode::Single;
            }
        },
        |_| {},
    )
    .await;
    if single {
        let ns: Namespace = serde_json::from_value(
            serde_json::json!({"metadata": {"name": w.config.pipeline.namespace.name}}),
        )
        .unwrap();
        Api::<Namespace>::all(w.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("the shared namespace");
    }
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let peer_a = owned(job("db-a", "sleep 3600"), owners[0]);
    let peer_b = owned(job("db-b", "sleep 3600"), owners[1]);
    let app_a = with_peer(owned(job("app-a", "sleep 3600"), owners[0]), "db", "db-a");
    let app_b = with_peer(owned(job("app-b", "sleep 3600"), owners[1]), "db", "db-b");
    let loner = owned(job("loner", "sleep 3600"), owners[0]);
    for j in [&peer_a, &peer_b, &loner] {
        w.submit(j).await;
    }
    until_running(&mut w, &["db-a", "db-b", "loner"]).await;
    // Both are created: no name of the namespace is theirs alone to take.
    w.submit(&app_a).await;
    w.submit(&app_b).await;
    until_running(&mut w, &["app-a", "app-b"]).await;

    let (ns_a, ns_b) = (w.namespace_of(&app_a), w.namespace_of(&app_b));
    if single || owners[0] == owners[1] {
        assert_eq!(ns_a, ns_b, "one namespace for both");
    }
    for (app, peer, ns) in [("app-a", "db-a", &ns_a), ("app-b", "db-b", &ns_b)] {
        let services: Api<Service> = Api::namespaced(w.client.clone(), ns);
        assert!(
            services.get_opt("db").await.unwrap().is_none(),
            "no Service named after the hostname"
        );
        let svc = services
            .get(&format!("j-{app}-peers"))
            .await
            .expect("the job's peers Service");
        assert_eq!(
            svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("None"),
            "headless"
        );
        assert!(svc.spec.as_ref().unwrap().selector.is_none());
        let slice = Api::<EndpointSlice>::namespaced(w.client.clone(), ns)
            .get(&format!("j-{app}-peers"))
            .await
            .expect("the peers' EndpointSlice");
        let job_uid = w.vcjob(ns, app).unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            slice.metadata.owner_references.unwrap()[0].uid,
            job_uid,
            "owned by the job"
        );
        let rank0 = pod(&w, ns, &format!("j-{app}-job-0")).await;
        let search = rank0
            .spec
            .as_ref()
            .and_then(|s| s.dns_config.as_ref())
            .and_then(|d| d.searches.clone())
            .unwrap_or_default();
        assert_eq!(search, [format!("j-{app}-peers.{ns}.svc.cluster.local")]);
        assert!(
            rank0
                .spec
                .as_ref()
                .unwrap()
                .scheduling_gates
                .as_ref()
                .is_none_or(Vec::is_empty),
            "the gate went once the peer ran"
        );
        let peer_ip = pod(&w, ns, &format!("j-{peer}-job-0"))
            .await
            .status
            .unwrap()
            .pod_ip
            .unwrap();
        assert_eq!(
            resolve(&w.client, &rank0, "db").await,
            Some(vec![peer_ip]),
            "{app}'s db is {peer}"
        );
    }
    let loner_pod = pod(&w, &w.namespace_of(&loner), "j-loner-job-0").await;
    assert_eq!(
        resolve(&w.client, &loner_pod, "db").await,
        None,
        "a job without peers has no db"
    );
    a.stop().await;
    w.close().await;
}

#[tokio::test]
async fn two_owners_in_one_shared_namespace_both_call_their_peer_db() {
    both_call_their_peer_db("mon-peers-shared", true, ["alice", "bob"]).await;
}

#[tokio::test]
async fn one_owner_in_its_namespace_calls_two_peers_db() {
    both_call_their_peer_db("mon-peers-owner", false, ["alice", "alice"]).await;
}

fn statuses(w: &World, job_id: &str, reason: &str) -> Vec<JobEvent> {
    w.seen
        .of(job_id)
        .lifecycle
        .into_iter()
        .filter(|e| e.reason == reason)
        .collect()
}

/// The peer waits behind a job that fills the cluster; the job naming it is told it waits for its peer
/// (naming it) and its pods stay gated, unscheduled, while the peer waits; once the peer runs, the job
/// starts. On main the job was scheduled at once, without its peer.
#[tokio::test]
async fn a_job_waits_for_its_peer_and_starts_after_it() {
    let mut w = World::start("mon-peers-wait", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    // The peer cannot start yet: it asks for a whole node (16 cores) while the blocker holds 15 cores
    // of each node; the job naming it would fit beside the blocker (1 core).
    let nodes = volcano_runner::sim::default_nodes();
    let mut blocker = job("blocker", "sleep 30");
    blocker.replicas = u32::try_from(nodes.len()).unwrap();
    blocker.product.as_mut().unwrap().cpu = 15;
    let mut peer = job("wp-db", "sleep 3600");
    peer.product.as_mut().unwrap().cpu = 16;
    let ns = w.namespace_of(&peer);
    w.submit(&blocker).await;
    until_running(&mut w, &["blocker"]).await;
    w.submit(&peer).await;
    let app = with_peer(job("wp-app", "sleep 3600"), "db", "wp-db");
    w.submit(&app).await;
    for _ in 0..10 {
        w.advance(1);
        w.settle(Duration::from_millis(80)).await;
    }
    w.until("the waiting status", |s| {
        s.of("wp-app")
            .lifecycle
            .iter()
            .any(|e| e.reason == "waiting_for_peer")
    })
    .await;
    let waiting = statuses(&w, "wp-app", "waiting_for_peer");
    assert_eq!(
        waiting[0].status,
        "The job waits for its peer job wp-db (db) to start"
    );
    assert!(w.seen.event("wp-app/RUNNING").is_none());
    let gated = pod(&w, &ns, "j-wp-app-job-0").await;
    assert!(
        gated.spec.as_ref().unwrap().node_name.is_none(),
        "not scheduled while the peer waits"
    );
    assert_eq!(
        gated.spec.unwrap().scheduling_gates.unwrap()[0].name,
        "ucloud.dk/peers"
    );
    assert!(
        gated
            .status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.reason.as_deref() == Some("SchedulingGated"))
    );

    // The blocker ends; the peer starts, then the job.
    until_running(&mut w, &["wp-db", "wp-app"]).await;
    let peer_start = ms(&w.seen.event("wp-db/RUNNING").unwrap().started_at);
    let app_start = ms(&w.seen.event("wp-app/RUNNING").unwrap().started_at);
    assert!(
        app_start >= peer_start,
        "the job started at {app_start}, before its peer at {peer_start}"
    );
    a.stop().await;
    w.close().await;
}

/// A job with a peer has companions beside it (its headless peers Service, its own NetworkPolicy) and the
/// peers' EndpointSlice the monitor writes. When it ends the Service and the EndpointSlice are deleted,
/// while the job itself is kept (finished, not being deleted) as the record of its submission until its
/// TTL, with its NetworkPolicy (which holds nothing once its pods are gone), which the garbage collector
/// deletes with it. On main they went with a foreground deletion of the job, which the cleanup
/// finalizer then held, `Terminating`, for the retention.
#[tokio::test]
async fn an_ended_jobs_companions_go_at_its_end_while_the_job_is_kept() {
    let mut w = World::start("mon-peers-companions", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let peer = job("co-db", "sleep 3600");
    let app = with_peer(job("co-app", "sleep 20"), "db", "co-db");
    let ns = w.namespace_of(&app);
    w.submit(&peer).await;
    until_running(&mut w, &["co-db"]).await;
    w.submit(&app).await;
    until_running(&mut w, &["co-app"]).await;
    let slices: Api<EndpointSlice> = Api::namespaced(w.client.clone(), &ns);
    let companions = w.companions(&ns, "j-co-app").await;
    assert!(
        companions.len() >= 2,
        "the peers Service and the job's policy: {companions:?}"
    );
    assert!(slices.get_opt("j-co-app-peers").await.unwrap().is_some());

    for _ in 0..60 {
        if w.seen.event("co-app/SUCCESS").is_some() {
            break;
        }
        w.advance(1);
        w.settle(Duration::from_millis(80)).await;
    }
    w.until("SUCCESS", |s| s.event("co-app/SUCCESS").is_some())
        .await;
    let policy_only = vec!["NetworkPolicy/policy-co-app".to_owned()];
    for _ in 0..100 {
        if w.companions(&ns, "j-co-app").await == policy_only
            && slices.get_opt("j-co-app-peers").await.unwrap().is_none()
        {
            break;
        }
        w.settle(Duration::from_millis(50)).await;
    }
    assert_eq!(w.companions(&ns, "j-co-app").await, policy_only);
    assert!(
        slices.get_opt("j-co-app-peers").await.unwrap().is_none(),
        "the peers' EndpointSlice is deleted at the end"
    );
    let kept = w.vcjob(&ns, "co-app").expect("the job is kept");
    assert!(kept.pointer("/metadata/deletionTimestamp").is_none());
    w.released_then_gone(&ns, "co-app").await;
    assert!(
        w.vcjob(&ns, "co-db").is_some(),
        "the peer runs on, untouched"
    );
    a.stop().await;
    w.close().await;
}

/// A running job's peer is cancelled (deleted): once its end is recorded the job is told, by a status
/// event `<jobId>/peer-ended/<peerId>` naming the peer and how it ended, and runs on. The news is
/// recorded on the job, so neither a later look nor another runner taking over (the first one killed)
/// tells it again. On main nothing was told.
#[tokio::test]
async fn a_running_job_is_told_once_that_its_peer_ended() {
    let mut w = World::start("mon-peers-ended", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let peer = job("pe-db", "sleep 3600");
    let app = with_peer(job("pe-app", "sleep 3600"), "db", "pe-db");
    let ns = w.namespace_of(&peer);
    w.submit(&peer).await;
    until_running(&mut w, &["pe-db"]).await;
    w.submit(&app).await;
    until_running(&mut w, &["pe-app"]).await;

    let api: Api<volcano_runner::volcano::VolcanoJob> = Api::namespaced(w.client.clone(), &ns);
    // Cancelled as the runner cancels: the cause recorded, then the deletion.
    api.patch(
        "j-pe-db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!(
            {"metadata": {"annotations": {"ucloud.dk/terminationCause": "cancelled"}}}
        )),
    )
    .await
    .expect("the cause is recorded");
    api.delete("j-pe-db", &DeleteParams::default())
        .await
        .expect("the peer is deleted");
    let id = "pe-app/peer-ended/pe-db";
    for _ in 0..60 {
        if w.seen.event(id).is_some() {
            break;
        }
        w.advance(1);
        w.settle(Duration::from_millis(100)).await;
    }
    w.until("the news of the peer's end", |s| s.event(id).is_some())
        .await;
    let told = |w: &World| -> Vec<JobEvent> {
        w.seen
            .of("pe-app")
            .lifecycle
            .into_iter()
            .filter(|e| e.event_id == id)
            .collect()
    };
    let event = told(&w)[0].clone();
    assert_eq!(event.reason, "peer_ended");
    assert!(
        event
            .status
            .starts_with("Its peer job pe-db (db) ended: CANCELLED ("),
        "{}",
        event.status
    );
    assert!(
        event
            .status
            .ends_with("; the job runs on, but `db` no longer answers"),
        "{}",
        event.status
    );
    let mut recorded = false;
    for _ in 0..50 {
        let job = w.vcjob(&ns, "pe-app").unwrap();
        if job["metadata"]["annotations"]["ucloud.dk/peerEnded"] == "pe-db" {
            recorded = true;
            break;
        }
        w.settle(Duration::from_millis(100)).await;
    }
    assert!(recorded, "the news is recorded on the job");

    a.kill().await;
    let b = w.runner("runner-b").await;
    b.holds(4).await;
    for _ in 0..5 {
        w.advance(10);
        w.settle(Duration::from_millis(200)).await;
    }
    assert_eq!(told(&w).len(), 1, "told once: {:?}", told(&w));
    assert!(w.seen.event("pe-app/SUCCESS").is_none());
    assert!(w.seen.event("pe-app/FAILURE").is_none(), "it runs on");
    b.stop().await;
    w.close().await;
}

/// The peer is cancelled while it still waits: the job naming it, gated and waiting for it, would wait
/// for good, so it ends: `FAILURE`, reason `peer_ended`, naming the peer and how it ended. On main the job
/// ran without its peer.
#[tokio::test]
async fn a_job_whose_peer_ends_before_it_starts_fails() {
    let mut w = World::start("mon-peers-never", |_| {}, |_| {}).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let nodes = volcano_runner::sim::default_nodes();
    let mut blocker = job("nb-blocker", "sleep 3600");
    blocker.replicas = u32::try_from(nodes.len()).unwrap();
    blocker.product.as_mut().unwrap().cpu = 15;
    let mut peer = job("nb-db", "sleep 3600");
    peer.product.as_mut().unwrap().cpu = 16;
    let ns = w.namespace_of(&peer);
    w.submit(&blocker).await;
    until_running(&mut w, &["nb-blocker"]).await;
    w.submit(&peer).await;
    w.submit(&with_peer(job("nb-app", "sleep 3600"), "db", "nb-db"))
        .await;
    for _ in 0..10 {
        w.advance(1);
        w.settle(Duration::from_millis(80)).await;
    }
    w.until("the waiting status", |s| {
        s.of("nb-app")
            .lifecycle
            .iter()
            .any(|e| e.reason == "waiting_for_peer")
    })
    .await;

    let api: Api<volcano_runner::volcano::VolcanoJob> = Api::namespaced(w.client.clone(), &ns);
    api.patch(
        "j-nb-db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!(
            {"metadata": {"annotations": {"ucloud.dk/terminationCause": "cancelled"}}}
        )),
    )
    .await
    .expect("the cause is recorded");
    api.delete("j-nb-db", &DeleteParams::default())
        .await
        .expect("the peer is deleted");
    for _ in 0..60 {
        if w.seen.event("nb-app/FAILURE").is_some() {
            break;
        }
        w.advance(1);
        w.settle(Duration::from_millis(100)).await;
    }
    w.until("the job's FAILURE", |s| s.event("nb-app/FAILURE").is_some())
        .await;
    let failure = w.seen.event("nb-app/FAILURE").unwrap();
    assert_eq!(failure.reason, "peer_ended");
    assert!(
        failure
            .status
            .starts_with("The job did not start: its peer job nb-db (db) ended: CANCELLED ("),
        "{}",
        failure.status
    );
    assert!(w.seen.event("nb-app/RUNNING").is_none());
    a.stop().await;
    w.close().await;
}

/// Peers that never come end (issue 41, points 2 and 7):
/// - two jobs naming each other, both created (submitted at once, so neither submission could see the
///   other's), each wait for the other to run: they end, `FAILURE` `peer_cycle` (or `peer_ended` for
///   the second, once the first has ended), none left waiting;
/// - a job whose peer is never submitted is told it waits for its peer, its estimate saying so (not
///   "its resources are free now"), and ends `FAILURE` `peer_missing` at `[monitor] peer_missing_after`
///   from its creation, not before.
///
/// On main both pairs waited for ever, and the waiting job was told its resources were free now.
#[tokio::test]
async fn peers_that_never_come_end_the_jobs_waiting_for_them() {
    let mut w = World::start(
        "mon-peers-never",
        |c| c.monitor.peer_missing_after = Duration::from_secs(40),
        |_| {},
    )
    .await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    w.submit(&with_peer(job("cy-a", "sleep 3600"), "b", "cy-b"))
        .await;
    w.submit(&with_peer(job("cy-b", "sleep 3600"), "a", "cy-a"))
        .await;
    w.submit(&with_peer(job("mp-app", "sleep 3600"), "db", "mp-db"))
        .await;
    let failure = |s: &Seen, id: &str| {
        s.of(id)
            .lifecycle
            .into_iter()
            .find(|e| e.state == volcano_runner::messages::v1::JobState::Failure as i32)
    };
    for _ in 0..15 {
        w.advance(1);
        w.settle(Duration::from_millis(80)).await;
    }
    w.until("the ring ended", |s| {
        failure(s, "cy-a").is_some() && failure(s, "cy-b").is_some()
    })
    .await;
    let reasons: Vec<String> = ["cy-a", "cy-b"]
        .iter()
        .map(|id| failure(&w.seen, id).unwrap().reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "peer_cycle")
            && reasons
                .iter()
                .all(|r| r == "peer_cycle" || r == "peer_ended"),
        "{reasons:?}"
    );
    let cycle = failure(&w.seen, "cy-a")
        .filter(|e| e.reason == "peer_cycle")
        .or_else(|| failure(&w.seen, "cy-b"))
        .unwrap();
    assert!(
        cycle.status.contains("names this job as its peer"),
        "{}",
        cycle.status
    );

    // The job whose peer never comes: told it waits for its peer, and its estimate says so.
    w.until("the waiting status", |s| {
        s.of("mp-app")
            .lifecycle
            .iter()
            .any(|e| e.reason == "waiting_for_peer" && e.pending.is_some())
    })
    .await;
    let waiting = statuses(&w, "mp-app", "waiting_for_peer");
    let pending = waiting.last().unwrap().pending.clone().unwrap();
    assert!(
        pending
            .estimate_basis
            .starts_with("it waits for its peer job mp-db (db) to start"),
        "{pending:?}"
    );
    assert_eq!(pending.estimated_start_at, None, "{pending:?}");
    assert!(failure(&w.seen, "mp-app").is_none(), "not before its time");
    for _ in 0..40 {
        if failure(&w.seen, "mp-app").is_some() {
            break;
        }
        w.advance(1);
        w.settle(Duration::from_millis(80)).await;
    }
    w.until("peer_missing", |s| failure(s, "mp-app").is_some())
        .await;
    let missing = failure(&w.seen, "mp-app").unwrap();
    assert_eq!(missing.reason, "peer_missing");
    assert!(
        missing
            .status
            .contains("its peer job mp-db (db) does not exist"),
        "{}",
        missing.status
    );
    let created = w
        .vcjob(&w.namespace_of(&job("mp-app", "sleep 3600")), "mp-app")
        .and_then(|j| {
            j.pointer("/metadata/creationTimestamp")
                .and_then(|t| t.as_str().map(str::to_owned))
        })
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .unwrap();
    let ended = missing.ended_at.map(|t| t.seconds).unwrap();
    assert!(
        ended >= created.as_second() + 40,
        "ended at {ended}, created at {created}"
    );
    a.stop().await;
    w.close().await;
}
