//! Sealed jobs for real (issue 44): submitted through RabbitMQ, applied by a runner to the simulator, and
//! the cluster's NetworkPolicies evaluated by the simulator with the API's semantics. A sealed job's rank
//! reaches its own ranks and nothing else (not another job's pod, the proxy, DNS or an "internet" address
//! on loopback), and nothing but its ranks reaches it; an ordinary job of the same owner, in the same
//! namespace, reaches DNS, the internet and its peer, and the proxy reaches it. The owner's namespace
//! already has a baseline written before sealed jobs existed (selecting every pod): the runner makes it
//! leave sealed pods out. A sealed submission with a public IP, a peer or a license server is refused,
//! naming the field.

use std::net::IpAddr;
use std::time::Duration;

use crate::harness;

use harness::{Harness, examples, figlet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, PostParams};
use volcano_runner::messages::v1::{
    JobState, NetworkIpValue, PeerValue, PortRange, Protocol, ResourceValue, SubmitJob,
    resource_value,
};
use volcano_runner::pipeline::names;
use volcano_runner::sim::netpol::{Peer, Protocol as Proto};

fn sealed(job_id: &str, replicas: u32) -> SubmitJob {
    let mut job = figlet(job_id);
    job.replicas = replicas;
    job.sealed = true;
    job
}

fn with_resource(mut job: SubmitJob, value: resource_value::Value) -> SubmitJob {
    job.resources.push(ResourceValue { value: Some(value) });
    job
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

/// The owner's namespace as a runner of before sealed jobs left it: the baseline selects every pod.
async fn old_owner_namespace(h: &Harness, namespace: &str) {
    create_namespace(&h.client, namespace).await;
    let config = &h.config.pipeline.network_policy;
    let baseline: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ucloud-baseline", "namespace": namespace},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.proxy_namespace}},
                "podSelector": {"matchLabels": config.proxy_pod_labels}}]}],
            "egress": [
                {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": config.egress_except}}]}]
        }
    }))
    .unwrap();
    Api::<NetworkPolicy>::namespaced(h.client.clone(), namespace)
        .create(&PostParams::default(), &baseline)
        .await
        .expect("the old baseline");
}

/// A proxy pod where the configuration says the proxy runs, labelled as it says.
async fn proxy_pod(h: &Harness) -> (String, String) {
    let config = &h.config.pipeline.network_policy;
    create_namespace(&h.client, &config.proxy_namespace).await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "proxy-0", "namespace": config.proxy_namespace, "labels": config.proxy_pod_labels},
        "spec": {"containers": [{"name": "envoy", "image": "envoyproxy/envoy:v1.31",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(h.client.clone(), &config.proxy_namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("the proxy pod");
    (config.proxy_namespace.clone(), "proxy-0".into())
}

/// Whether `from` may connect to `to` on TCP `port` (UDP for 53), as the simulator's policies say.
fn may(h: &Harness, from: &Peer, to: &Peer, port: u16) -> bool {
    let protocol = if port == 53 { Proto::Udp } else { Proto::Tcp };
    h.sim
        .connection(from, to, port, protocol)
        .unwrap_or_else(|e| panic!("{from:?} -> {to:?}: {e:?}"))
        .allowed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_rank_reaches_its_own_ranks_and_nothing_else() {
    let h = Harness::new("sealed-network").await;
    let owner = figlet("x").owner.unwrap();
    let namespace = names::owner_namespace(&h.config.pipeline.namespace.prefix, &owner);
    old_owner_namespace(&h, &namespace).await;
    let (proxy_ns, proxy_name) = proxy_pod(&h).await;
    let runner = h.start("runner-a");

    h.submit(&figlet("other")).await;
    h.wait_events("the other job queued", |e| {
        e.iter().any(|c| c.message_id == "other/QUEUED")
    })
    .await;
    h.submit(&sealed("sealed", 2)).await;
    let open = with_resource(
        figlet("open"),
        resource_value::Value::Peer(PeerValue {
            hostname: "db".into(),
            job_id: "other".into(),
        }),
    );
    h.submit(&open).await;
    let events = h
        .wait_events("both queued", |e| {
            ["sealed/QUEUED", "open/QUEUED"]
                .iter()
                .all(|id| e.iter().any(|c| c.message_id == *id))
        })
        .await;
    let queued = events
        .iter()
        .find(|c| c.message_id == "sealed/QUEUED")
        .and_then(|c| c.event.clone())
        .unwrap();
    assert!(
        queued
            .status
            .contains("sealed (the submission asks for it): no network beyond its own ranks"),
        "{}",
        queued.status
    );
    let open_queued = events
        .iter()
        .find(|c| c.message_id == "open/QUEUED")
        .and_then(|c| c.event.clone())
        .unwrap();
    assert!(
        !open_queued.status.contains("sealed"),
        "{}",
        open_queued.status
    );
    // The pods start (and get their addresses).
    h.sim.advance(Duration::from_secs(5));

    let pod = |job: &str, rank: u32| Peer::pod(&namespace, &names::pod_name(job, rank));
    let (s0, s1) = (pod("sealed", 0), pod("sealed", 1));
    let (open0, other0) = (pod("open", 0), pod("other", 0));
    let proxy = Peer::pod(&proxy_ns, &proxy_name);
    let dns = Peer::Address("10.96.0.10".parse::<IpAddr>().unwrap());
    let internet = Peer::Address("127.0.0.1".parse::<IpAddr>().unwrap());
    for p in [&s0, &s1, &other0] {
        let Peer::Pod { namespace, name } = p else {
            unreachable!()
        };
        let pod = Api::<Pod>::namespaced(h.client.clone(), namespace)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            pod.status.and_then(|s| s.pod_ip).is_some(),
            "{name} runs with an address"
        );
    }

    // Its own ranks, both ways, on any port.
    assert!(may(&h, &s0, &s1, 7000), "rank 0 -> rank 1");
    assert!(may(&h, &s1, &s0, 7001), "rank 1 -> rank 0");
    // Nothing else, either way.
    for (what, target) in [
        ("another job's pod", &other0),
        ("an open job's pod", &open0),
        ("the proxy", &proxy),
        ("DNS", &dns),
        ("the internet", &internet),
    ] {
        let port = if what == "DNS" { 53 } else { 443 };
        assert!(!may(&h, &s0, target, port), "sealed rank -> {what}");
        if !matches!(target, Peer::Address(_)) {
            assert!(!may(&h, target, &s0, 8080), "{what} -> sealed rank");
        }
    }
    let verdict = h.sim.connection(&s0, &dns, 53, Proto::Udp).unwrap();
    assert!(
        verdict.to_string().contains("policy-sealed"),
        "denied by the job's own policy: {verdict}"
    );

    // The same question over HTTP, as a tool that is not Rust asks it; bad parameters are named.
    let ask = |query: String| {
        let client = h.client.clone();
        async move {
            let request = http::Request::get(format!("/sim/v1/connection?{query}"))
                .body(Vec::new())
                .unwrap();
            client.request_text(request).await
        }
    };
    let s0_name = names::pod_name("sealed", 0);
    let answer: serde_json::Value = serde_json::from_str(
        &ask(format!(
            "from={namespace}/{s0_name}&to=10.96.0.10&port=53&protocol=UDP"
        ))
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(
        answer["egress"]["isolatedBy"],
        serde_json::json!([format!("{namespace}/policy-sealed")]),
        "{answer}"
    );
    let error = ask(format!("from={namespace}/{s0_name}&to=somewhere&port=53"))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("to: \"somewhere\" is neither"), "{error}");

    // The open job of the same owner: DNS, the internet and its peer; the proxy reaches it.
    assert!(may(&h, &open0, &dns, 53), "open -> DNS");
    assert!(may(&h, &open0, &internet, 443), "open -> internet");
    assert!(may(&h, &open0, &other0, 5432), "open -> its peer");
    assert!(may(&h, &proxy, &open0, 8080), "proxy -> open");
    assert!(!may(&h, &open0, &s0, 8080), "open -> sealed");

    // The old baseline was made to leave sealed pods out; its rules are as they were.
    let baseline = Api::<NetworkPolicy>::namespaced(h.client.clone(), &namespace)
        .get("ucloud-baseline")
        .await
        .unwrap();
    let spec = serde_json::to_value(baseline.spec.unwrap()).unwrap();
    assert_eq!(
        spec["podSelector"],
        serde_json::json!({"matchExpressions": [{"key": "ucloud.dk/sealed", "operator": "DoesNotExist"}]})
    );
    assert_eq!(spec["egress"].as_array().map(Vec::len), Some(2));

    // A job of the same owner that names the sealed job as its peer could never reach it: refused.
    let reaching = with_resource(
        figlet("reaching"),
        resource_value::Value::Peer(PeerValue {
            hostname: "vault".into(),
            job_id: "sealed".into(),
        }),
    );
    h.submit(&reaching).await;
    let event = refusal(&h, "reaching").await;
    assert_eq!(event.reason, "invalid_field");
    assert!(
        event
            .status
            .starts_with("resources[0].peer.jobId: job sealed is sealed"),
        "{}",
        event.status
    );
    assert!(h.vcjob("reaching").await.is_none());
    runner.stop().await;
}

/// The job id of a refusal's FAILURE, its event.
async fn refusal(h: &Harness, job_id: &str) -> volcano_runner::messages::v1::JobEvent {
    let prefix = format!("{job_id}/rejected/");
    let events = h
        .wait_events("the refusal", |e| {
            e.iter().any(|c| c.message_id.starts_with(&prefix))
        })
        .await;
    events
        .iter()
        .find(|c| c.message_id.starts_with(&prefix))
        .and_then(|c| c.event.clone())
        .unwrap()
}

/// A sealed submission with a public IP, a peer or a license server: a FAILURE naming the field and
/// saying the job is sealed, the message dead-lettered, and no job in the cluster. With the product
/// sealed by the operator, the words say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_submission_that_would_open_the_job_is_refused() {
    let h = Harness::new("sealed-refused").await;
    let mut config = h.config.clone();
    config.pipeline.sealed.products = vec!["u1-standard".into()];
    let runner = h.start_with("runner-a", config, false);
    // Not sealed: a product the operator does not seal.
    let mut target = figlet("peer-target");
    let product = target.product.as_mut().unwrap();
    product.id = "u2-standard-1".into();
    product.category = "u2-standard".into();
    h.submit(&target).await;
    h.wait_events("the peer queued", |e| {
        e.iter().any(|c| c.message_id == "peer-target/QUEUED")
    })
    .await;

    let ip = with_resource(
        sealed("with-ip", 1),
        resource_value::Value::NetworkIp(NetworkIpValue {
            id: "ip-1".into(),
            ip_address: "203.0.113.7".into(),
            open_ports: vec![PortRange {
                start: 22,
                end: 22,
                protocol: Protocol::Tcp as i32,
            }],
        }),
    );
    let peer = with_resource(
        sealed("with-peer", 1),
        resource_value::Value::Peer(PeerValue {
            hostname: "db".into(),
            job_id: "peer-target".into(),
        }),
    );
    let mut license = examples().remove("4819").expect("the MATLAB example");
    license.job_id = "with-license".into();
    license.resources.clear();
    license.parameters.remove("database");
    license.sealed = true;
    // Sealed by the operator (its product's category), not by the submission.
    let mut by_operator = peer.clone();
    by_operator.job_id = "by-operator".into();
    by_operator.sealed = false;
    for job in [&ip, &peer, &license, &by_operator] {
        h.submit(job).await;
    }
    for (job_id, field, words) in [
        ("with-ip", "resources[0].networkIp", "a public IP"),
        ("with-peer", "resources[0].peer", "a peer"),
        (
            "with-license",
            "parameters.license.licenseServer",
            "a license server",
        ),
        ("by-operator", "resources[0].peer", "a peer"),
    ] {
        let event = refusal(&h, job_id).await;
        assert_eq!(event.state, JobState::Failure as i32);
        assert_eq!(event.reason, "invalid_field", "{job_id}");
        assert!(
            event
                .status
                .starts_with(&format!("{field}: a sealed job cannot have {words}")),
            "{job_id}: {}",
            event.status
        );
        assert!(h.vcjob(job_id).await.is_none(), "{job_id}: no job");
    }
    let event = refusal(&h, "by-operator").await;
    assert!(
        event
            .status
            .contains("the operator seals every job of product u1-standard"),
        "{}",
        event.status
    );
    let dead = h.dead_letters().await;
    assert!(dead.len() >= 4, "{} dead letters", dead.len());
    runner.stop().await;
}

/// Runs `script` with bash in the pod (exec through the simulator, a real process on this machine):
/// `(exit code, stderr)`.
async fn exec(h: &Harness, namespace: &str, pod: &str, script: &str) -> (i32, String) {
    use tokio::io::AsyncReadExt;
    let mut process = Api::<Pod>::namespaced(h.client.clone(), namespace)
        .exec(
            pod,
            ["bash", "-c", script],
            &kube::api::AttachParams::default()
                .stdout(false)
                .stderr(true),
        )
        .await
        .unwrap_or_else(|e| panic!("exec into {pod}: {e}"));
    let mut err = String::new();
    let mut stderr = process.stderr().unwrap();
    let status = process.take_status().unwrap();
    stderr.read_to_string(&mut err).await.unwrap();
    let status = status.await.expect("a closing status");
    let code = match status.status.as_deref() {
        Some("Success") => 0,
        _ => status
            .details
            .and_then(|d| d.causes)
            .and_then(|c| c.first().and_then(|c| c.message.clone()))
            .and_then(|m| m.parse().ok())
            .unwrap_or(-1),
    };
    (code, err)
}

/// For real, where the simulator can: a process run (exec) in a one-rank sealed job's pod cannot connect
/// to an "internet" address on loopback (it has a network namespace of its own, with nothing in it),
/// while the same command in an ordinary job's pod connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_pods_process_cannot_connect_for_real() {
    let h = Harness::new("sealed-exec").await;
    let runner = h.start("runner-a");
    h.submit(&sealed("alone", 1)).await;
    h.submit(&figlet("ordinary")).await;
    h.wait_events("both queued", |e| {
        ["alone/QUEUED", "ordinary/QUEUED"]
            .iter()
            .all(|id| e.iter().any(|c| c.message_id == *id))
    })
    .await;
    h.sim.advance(Duration::from_secs(5));
    let namespace = h.vcjob("alone").await.unwrap().metadata.namespace.unwrap();
    let internet = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = internet.local_addr().unwrap().port();
    let script = format!("echo hello >/dev/tcp/127.0.0.1/{port}");

    let (code, err) = exec(&h, &namespace, &names::pod_name("ordinary", 0), &script).await;
    assert_eq!(code, 0, "the ordinary pod connects: {err}");
    let (socket, _) = tokio::time::timeout(Duration::from_secs(10), internet.accept())
        .await
        .expect("the connection arrives")
        .unwrap();
    drop(socket);

    let (code, err) = exec(&h, &namespace, &names::pod_name("alone", 0), &script).await;
    assert_ne!(code, 0, "the sealed pod cannot connect");
    assert!(err.contains("Network is unreachable"), "{err}");
    runner.stop().await;
}
