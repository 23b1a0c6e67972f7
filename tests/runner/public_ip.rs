//! Public IPs are attached or refused, never dropped: without a configured way the submission is refused
//! (`not_offered`); with `load-balancer` the job gets a LoadBalancer Service with the address and exactly
//! its open ports, the simulator's load balancer (a model of MetalLB) gives the Service that address, the
//! job's policy lets those ports in, and the Service goes away with the job.

use std::time::Duration;

use crate::harness;

use harness::{Harness, figlet};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use volcano_runner::messages::v1::{
    JobState, NetworkIpValue, PortRange, Protocol, ResourceValue, SubmitJob, resource_value,
};
use volcano_runner::pipeline::plugins::network_ip::PublicIpAttach;

fn with_public_ip(job_id: &str, address: &str) -> SubmitJob {
    let mut job = figlet(job_id);
    job.resources.push(ResourceValue {
        value: Some(resource_value::Value::NetworkIp(NetworkIpValue {
            id: "ip-7".into(),
            ip_address: address.into(),
            open_ports: vec![
                PortRange {
                    start: 22,
                    end: 22,
                    protocol: Protocol::Tcp as i32,
                },
                PortRange {
                    start: 8000,
                    end: 8002,
                    protocol: Protocol::Udp as i32,
                },
            ],
        })),
    });
    job
}

/// Without a configured way to attach an address, a job with a public IP is refused: a FAILURE with
/// reason `not_offered` naming the field, and no job in the cluster (UCloud ran it without the address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_ip_without_a_configured_way_is_refused() {
    let h = Harness::new("public-ip-refused").await;
    let runner = h.start("runner-a");
    h.submit(&with_public_ip("ip-refused", "203.0.113.7")).await;
    let events = h
        .wait_events("the refusal", |e| {
            e.iter()
                .any(|c| c.message_id.starts_with("ip-refused/rejected/"))
        })
        .await;
    let event = events
        .iter()
        .find(|c| c.message_id.starts_with("ip-refused/rejected/"))
        .and_then(|c| c.event.clone())
        .unwrap();
    assert_eq!(event.state, JobState::Failure as i32);
    assert_eq!(event.reason, "not_offered");
    assert!(
        event
            .status
            .starts_with("resources[0].networkIp: public IPs are not offered on this cluster"),
        "{}",
        event.status
    );
    assert!(
        h.vcjob("ip-refused").await.is_none(),
        "no job without its IP"
    );
    runner.stop().await;
}

/// With `attach = "load-balancer"`: a LoadBalancer Service `j-<id>-ip-0` asks for the address in MetalLB's
/// annotation, carries exactly the open ports (TCP 22, UDP 8000-8002), selects the job's pods, is owned by
/// the job, and the simulator's load balancer gives it the address; the job's policy admits those ports
/// from anywhere. Cancelling the job deletes the Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_ip_is_a_load_balancer_with_the_address_and_the_open_ports() {
    let h = Harness::new("public-ip-attached").await;
    let mut config = h.config.clone();
    config.pipeline.public_ip.attach = PublicIpAttach::LoadBalancer;
    // The monitor cleans a cancelled job up (it holds the cleanup finalizer).
    config.cluster.lease.shards = 1;
    config.cluster.lease.duration = Duration::from_secs(4);
    config.cluster.lease.renew_interval = Duration::from_millis(500);
    config.cluster.lease.safety_margin = Duration::from_secs(1);
    let runner = h.start_with("runner-a", config, true);
    h.submit(&with_public_ip("ip-on", "203.0.113.7")).await;
    h.wait_events("QUEUED", |e| {
        e.iter().any(|c| c.message_id == "ip-on/QUEUED")
    })
    .await;
    let job = h.vcjob("ip-on").await.expect("the job exists");
    let namespace = job.metadata.namespace.clone().unwrap();
    let services: kube::Api<Service> = kube::Api::namespaced(h.client.clone(), &namespace);
    let service = services
        .get("j-ip-on-ip-0")
        .await
        .expect("the public IP's Service");
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("metallb.universe.tf/loadBalancerIPs")
            .map(String::as_str),
        Some("203.0.113.7")
    );
    let owners = service
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, job.metadata.uid.clone().unwrap());
    let spec = service.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(spec.load_balancer_ip, None, "not the deprecated field");
    assert_eq!(
        spec.selector
            .unwrap()
            .get("volcano.sh/job-name")
            .map(String::as_str),
        Some("j-ip-on")
    );
    let mut ports: Vec<(String, i32)> = spec
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.protocol.unwrap_or_default(), p.port))
        .collect();
    ports.sort();
    assert_eq!(
        ports,
        [
            ("TCP".to_owned(), 22),
            ("UDP".to_owned(), 8000),
            ("UDP".to_owned(), 8001),
            ("UDP".to_owned(), 8002)
        ]
    );
    let ingress = service
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|l| l.ingress)
        .unwrap_or_default();
    assert_eq!(
        ingress
            .iter()
            .filter_map(|i| i.ip.as_deref())
            .collect::<Vec<_>>(),
        ["203.0.113.7"],
        "the load balancer gave the Service the address"
    );

    let policies: kube::Api<NetworkPolicy> = kube::Api::namespaced(h.client.clone(), &namespace);
    let policy = policies
        .get("policy-ip-on")
        .await
        .expect("the job's policy");
    let rules = serde_json::to_value(policy.spec.unwrap().ingress).unwrap();
    let public = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["from"][0]["ipBlock"]["cidr"] == "0.0.0.0/0")
        .expect("a rule admitting the open ports from anywhere");
    assert_eq!(
        public["ports"],
        serde_json::json!([
            {"protocol": "TCP", "port": 22},
            {"protocol": "UDP", "port": 8000, "endPort": 8002}
        ])
    );

    h.cancel("ip-on", None).await;
    h.wait_events("CANCELLED", |e| {
        e.iter().any(|c| c.message_id == "ip-on/CANCELLED")
    })
    .await;
    let mut gone = false;
    for _ in 0..100 {
        if services.get_opt("j-ip-on-ip-0").await.unwrap().is_none() {
            gone = true;
            break;
        }
        h.sim.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the public IP's Service is deleted with the job");
    runner.stop().await;
}
