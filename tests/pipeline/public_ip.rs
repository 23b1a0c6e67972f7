//! Public IPs in the rendered objects: refused without a configured way (also with the NetworkIp plugin
//! off), a LoadBalancer Service with the address and the open ports with one, the job's policy admitting
//! exactly those ports, the address's family respected, and the operator's bound on open ports.

use serde_json::{Value, json};
use volcano_runner::config::Config;
use volcano_runner::messages::v1::{
    NetworkIpValue, PortRange, Protocol, ResourceValue, SubmitJob, resource_value,
};
use volcano_runner::pipeline::plugins::network_ip::PublicIpAttach;

use crate::pipeline_support::{defaults, job, reference, render, render_err};

fn with_ip(address: &str, ports: &[(u32, u32, Protocol)]) -> SubmitJob {
    let mut job = job("jobs/figlet");
    job.resources.push(ResourceValue {
        value: Some(resource_value::Value::NetworkIp(NetworkIpValue {
            id: "ip-1".into(),
            ip_address: address.into(),
            open_ports: ports
                .iter()
                .map(|&(start, end, protocol)| PortRange {
                    start,
                    end,
                    protocol: protocol as i32,
                })
                .collect(),
        })),
    });
    job
}

fn attaching(mut config: Config) -> Config {
    config.pipeline.public_ip.attach = PublicIpAttach::LoadBalancer;
    config
}

fn objects(job: &SubmitJob, config: &Config) -> Vec<Value> {
    render(job, config)
        .objects()
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect()
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The default configuration refuses a public IP (`not_offered`, naming the field), and so does a
/// configuration that attaches them but has the NetworkIp plugin off: nothing would attach it.
#[test]
fn a_public_ip_is_refused_where_no_way_is_configured() {
    let job = with_ip("203.0.113.9", &[(443, 443, Protocol::Tcp)]);
    let e = render_err(&job, &defaults());
    assert_eq!(
        (e.code(), e.field().as_str()),
        ("not_offered", "resources[0].networkIp")
    );
    let mut off = attaching(defaults());
    off.pipeline.plugins.network_ip = false;
    let e = render_err(&job, &off);
    assert_eq!(
        (e.code(), e.field().as_str()),
        ("not_offered", "resources[0].networkIp")
    );
}

/// One shared namespace (the reference configuration): the Service asks for the address in MetalLB's
/// annotation, keeps the client's address (`Local`), and the job's own policy admits the open ports
/// from anywhere; a `loadBalancerClass` and another annotation key are the operator's.
#[test]
fn a_public_ip_is_a_load_balancer_service_and_a_policy_rule() {
    let job = with_ip(
        "203.0.113.9",
        &[(443, 443, Protocol::Tcp), (60000, 60001, Protocol::Udp)],
    );
    let objects = objects(&job, &attaching(reference()));
    let service = named(&objects, "Service", "j-42-ip-0");
    assert_eq!(
        service["metadata"]["annotations"],
        json!({"metallb.universe.tf/loadBalancerIPs": "203.0.113.9"})
    );
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    assert_eq!(service["spec"]["externalTrafficPolicy"], "Local");
    assert_eq!(service["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(
        service["spec"]["ports"],
        json!([
            {"name": "tcp-443", "port": 443, "protocol": "TCP", "targetPort": 443},
            {"name": "udp-60000", "port": 60000, "protocol": "UDP", "targetPort": 60000},
            {"name": "udp-60001", "port": 60001, "protocol": "UDP", "targetPort": 60001},
        ])
    );
    let policy = named(&objects, "NetworkPolicy", "policy-42");
    let public: Vec<&Value> = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["from"][0]["ipBlock"].is_object())
        .collect();
    assert_eq!(
        public,
        [&json!({
            "from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
            "ports": [
                {"protocol": "TCP", "port": 443},
                {"protocol": "UDP", "port": 60000, "endPort": 60001}
            ]
        })]
    );

    let mut kube_vip = attaching(reference());
    kube_vip.pipeline.public_ip.address_annotation = "kube-vip.io/loadbalancerIPs".into();
    kube_vip.pipeline.public_ip.load_balancer_class = Some("kube-vip.io/kube-vip-class".into());
    let objects = self::objects(&job, &kube_vip);
    let service = named(&objects, "Service", "j-42-ip-0");
    assert_eq!(
        service["metadata"]["annotations"],
        json!({"kube-vip.io/loadbalancerIPs": "203.0.113.9"})
    );
    assert_eq!(
        service["spec"]["loadBalancerClass"],
        "kube-vip.io/kube-vip-class"
    );
}

/// An IPv6 address gets an IPv6 Service and a rule for `::/0`; per-owner namespaces without the
/// ConnectToJob policy get a policy of their own for the open ports (the baseline admits only the proxy).
#[test]
fn an_ipv6_address_and_an_owner_namespace_without_the_job_policy() {
    let job = with_ip("2001:db8::7", &[(22, 22, Protocol::Tcp)]);
    let mut config = attaching(defaults());
    config.pipeline.plugins.connect_to_job = false;
    let objects = objects(&job, &config);
    let service = named(&objects, "Service", "j-42-ip-0");
    assert_eq!(service["spec"]["ipFamilies"], json!(["IPv6"]));
    let policy = named(&objects, "NetworkPolicy", "policy-42-ip");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"from": [{"ipBlock": {"cidr": "::/0"}}], "ports": [{"protocol": "TCP", "port": 22}]}])
    );
}

/// More open ports than `max_ports` are refused naming the range; no open port at all is refused too
/// (Kubernetes refuses a load balancer without ports).
#[test]
fn open_ports_are_bounded_and_needed() {
    let config = attaching(reference());
    let wide = with_ip("203.0.113.9", &[(1000, 1100, Protocol::Tcp)]);
    let e = render_err(&wide, &config);
    assert_eq!(e.field(), "resources[0].networkIp.openPorts[0]", "{e}");
    assert!(e.message().contains("max_ports"), "{e}");
    let two = with_ip(
        "203.0.113.9",
        &[(1000, 1060, Protocol::Tcp), (2000, 2060, Protocol::Udp)],
    );
    let e = render_err(&two, &config);
    assert_eq!(e.field(), "resources[0].networkIp.openPorts", "{e}");
    let none = with_ip("203.0.113.9", &[]);
    let e = render_err(&none, &config);
    assert_eq!(e.field(), "resources[0].networkIp.openPorts", "{e}");
}
