//! Sealed jobs in the rendered objects (issue 44): asked by the submission or by `[pipeline.sealed]`; the
//! job's own policy lets only its ranks in (and out, with several), the namespace's baseline leaves its
//! pods out, no service-account token, inputs still read-only and the output folder writable; whatever
//! would open it (a public IP, a peer, a public link, a license server, a web interface the proxy may not
//! reach) is refused naming the field.

use serde_json::{Value, json};
use volcano_runner::config::Config;
use volcano_runner::messages::v1::{
    NetworkIpValue, PeerValue, PortRange, Protocol, ResourceValue, SubmitJob, resource_value,
};

use crate::pipeline_support::{
    at, config, defaults, golden_dir, golden_text, job, reference, render, render_err,
};

fn sealed_job() -> SubmitJob {
    job("jobs/sealed_multinode")
}

fn objects(job: &SubmitJob, config: &Config) -> Vec<Value> {
    render(job, config)
        .objects()
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn vcjob(objects: &[Value]) -> &Value {
    of_kind(objects, "Job")[0]
}

/// Every object of the sealed 2-rank job, as `volcano-runner render` prints it (shipped defaults).
#[test]
fn whole_job_sealed_multinode() {
    let desired = render(&sealed_job(), &config("default"));
    let text =
        volcano_runner::cli::render::format(&desired, volcano_runner::cli::render::Format::Yaml)
            .unwrap();
    golden_text(&golden_dir().join("jobs/sealed_multinode.yaml"), &text);
}

/// The job's one policy admits its own ranks only and lets them reach each other only; the pods are
/// labelled sealed (so the baseline, which selects every pod but those, leaves them alone) and get no
/// token; the job records why it is sealed; staged inputs stay read-only and the output folder writable.
#[test]
fn a_sealed_job_talks_to_its_own_ranks_only() {
    let objects = objects(&sealed_job(), &defaults());
    let policies = of_kind(&objects, "NetworkPolicy");
    let own: Vec<&&Value> = policies
        .iter()
        .filter(|p| p["metadata"]["name"] == "policy-77")
        .collect();
    assert_eq!(own.len(), 1, "{policies:#?}");
    let spec = &own[0]["spec"];
    let ranks = json!([{"podSelector": {"matchLabels": {"volcano.sh/job-name": "j-77"}}}]);
    assert_eq!(
        spec["podSelector"],
        json!({"matchLabels": {"volcano.sh/job-name": "j-77"}})
    );
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(spec["ingress"], json!([{"from": ranks}]));
    assert_eq!(spec["egress"], json!([{"to": ranks}]));

    let baseline = policies
        .iter()
        .find(|p| p["metadata"]["name"] == "ucloud-baseline")
        .expect("the owner namespace's baseline");
    assert_eq!(
        baseline["spec"]["podSelector"],
        json!({"matchExpressions": [{"key": "ucloud.dk/sealed", "operator": "DoesNotExist"}]})
    );

    let job = vcjob(&objects);
    assert_eq!(
        at(job, "/metadata/annotations/ucloud.dk~1sealed"),
        "submission"
    );
    let template = at(job, "/spec/tasks/0/template");
    assert_eq!(at(template, "/metadata/labels/ucloud.dk~1sealed"), "true");
    let pod = &template["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v.get("hostPath").is_none())
    );
    assert!(pod.get("hostNetwork").is_none());
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let mount = |path: &str| {
        mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("no mount at {path}: {mounts:#?}"))
    };
    assert_ne!(mount("/work")["readOnly"], true, "output writable");
    let inputs: Vec<&Value> = mounts
        .iter()
        .filter(|m| m["mountPath"].as_str().unwrap().starts_with("/work/"))
        .collect();
    assert!(!inputs.is_empty(), "{mounts:#?}");
    assert!(inputs.iter().all(|m| m["readOnly"] == true), "{inputs:#?}");
}

/// One rank: no egress rule at all (not even to itself), and an unsealed job keeps the baseline's way
/// out (the same namespace's baseline, which does not select sealed pods).
#[test]
fn a_single_rank_sealed_job_has_no_way_out() {
    let mut one = sealed_job();
    one.replicas = 1;
    let objects = objects(&one, &defaults());
    let own = of_kind(&objects, "NetworkPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "policy-77")
        .unwrap();
    assert_eq!(own["spec"]["egress"], json!([]));
    assert_eq!(own["spec"]["policyTypes"], json!(["Ingress", "Egress"]));

    let mut open = sealed_job();
    open.sealed = false;
    let objects = objects_of(&open);
    let job = vcjob(&objects);
    assert_eq!(
        at(job, "/metadata/annotations/ucloud.dk~1sealed"),
        &Value::Null
    );
    let own = of_kind(&objects, "NetworkPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "policy-77")
        .unwrap();
    assert!(
        own["spec"]["ingress"].as_array().unwrap().len() == 1
            && own["spec"]["ingress"][0]["from"].as_array().unwrap().len() == 2,
        "an open job admits the pods that name it as their peer: {own:#?}"
    );
}

fn objects_of(job: &SubmitJob) -> Vec<Value> {
    objects(job, &defaults())
}

/// In one shared namespace the job's policy carries no baseline rule (no DNS, no internet, no proxy),
/// and with ConnectToJob switched off the sealed policy is there all the same.
#[test]
fn the_sealed_policy_needs_neither_the_owner_namespace_nor_connect_to_job() {
    let shared = objects(&sealed_job(), &reference());
    let policies = of_kind(&shared, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "{policies:#?}");
    let text = policies[0]["spec"].to_string();
    assert!(
        !text.contains("ipBlock") && !text.contains("53") && !text.contains("namespaceSelector"),
        "{text}"
    );

    let mut off = defaults();
    off.pipeline.plugins.connect_to_job = false;
    let rendered = objects(&sealed_job(), &off);
    let own = of_kind(&rendered, "NetworkPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "policy-77");
    assert!(own.is_some(), "sealed without ConnectToJob");
}

fn with_resource(mut job: SubmitJob, value: resource_value::Value) -> SubmitJob {
    job.resources.push(ResourceValue { value: Some(value) });
    job
}

/// A public IP, a peer, a public link or a license server would open the job: refused, naming the field
/// and saying the job is sealed. So is a web interface where the proxy may not reach sealed jobs.
#[test]
fn what_would_open_a_sealed_job_is_refused_naming_the_field() {
    let ip = NetworkIpValue {
        id: "ip-1".into(),
        ip_address: "203.0.113.9".into(),
        open_ports: vec![PortRange {
            start: 443,
            end: 443,
            protocol: Protocol::Tcp as i32,
        }],
    };
    let mut one = sealed_job();
    one.replicas = 1;
    let mut attaching = defaults();
    attaching.pipeline.public_ip.attach =
        volcano_runner::pipeline::plugins::network_ip::PublicIpAttach::LoadBalancer;
    let e = render_err(
        &with_resource(one.clone(), resource_value::Value::NetworkIp(ip)),
        &attaching,
    );
    assert_eq!(e.field(), "resources[0].networkIp");
    assert!(
        e.message().contains("a sealed job cannot have a public IP"),
        "{e}"
    );
    assert!(e.message().contains("the submission asks for it"), "{e}");

    let peer = PeerValue {
        hostname: "db".into(),
        job_id: "12".into(),
    };
    let e = render_err(
        &with_resource(sealed_job(), resource_value::Value::Peer(peer)),
        &defaults(),
    );
    assert_eq!(e.field(), "resources[0].peer");
    assert!(e.message().contains("cannot have a peer"), "{e}");

    let mut web = job("jobs/web_app");
    web.sealed = true;
    let e = render_err(&web, &defaults());
    assert_eq!(e.field(), "resources[0].ingress");
    assert!(e.message().contains("a public link"), "{e}");
    web.resources.clear();
    let e = render_err(&web, &defaults());
    assert_eq!(e.field(), "application.applicationType");
    assert!(e.message().contains("allow_proxy"), "{e}");

    let mut licensed = job("jobs/multinode_project");
    licensed.resources.clear();
    licensed.parameters.retain(|_, p| {
        !matches!(
            p.value,
            Some(volcano_runner::messages::v1::parameter_value::Value::Peer(
                _
            ))
        )
    });
    licensed.sealed = true;
    let e = render_err(&licensed, &defaults());
    assert_eq!(e.field(), "parameters.license.licenseServer");
    assert_eq!(e.code(), "invalid_field");
    assert!(e.message().contains("a license server"), "{e}");
}

/// With `allow_proxy`, a sealed web application admits the proxy's pods on its web port, and nothing
/// else from outside the job.
#[test]
fn the_operator_may_let_the_proxy_reach_a_sealed_interface() {
    let mut web = job("jobs/web_app");
    web.resources.clear();
    web.sealed = true;
    let mut config = defaults();
    config.pipeline.sealed.allow_proxy = true;
    let objects = objects(&web, &config);
    let own = of_kind(&objects, "NetworkPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "policy-9001")
        .unwrap();
    let ingress = own["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 2, "{ingress:#?}");
    assert_eq!(
        ingress[1]["ports"],
        json!([{"port": 8888, "protocol": "TCP"}])
    );
    assert_eq!(
        ingress[1]["from"][0]["namespaceSelector"],
        json!({"matchLabels": {"kubernetes.io/metadata.name": "volcano-runner"}})
    );
    assert_eq!(own["spec"]["egress"], json!([]));
}

/// `[pipeline.sealed]` seals every job of a listed product id, product category or project, whatever
/// the submission says, and records which; a refusal then says the operator sealed it.
#[test]
fn the_operator_seals_products_and_projects() {
    let mut open = sealed_job();
    open.sealed = false;
    for (products, projects, why) in [
        (vec!["u1-standard-4"], vec![], "product:u1-standard-4"),
        (vec!["u1-standard"], vec![], "product:u1-standard"),
        (vec![], vec!["registry-study"], "project:registry-study"),
    ] {
        let mut config = defaults();
        config.pipeline.sealed.products = products.into_iter().map(String::from).collect();
        config.pipeline.sealed.projects = projects.into_iter().map(String::from).collect();
        let objects = objects(&open, &config);
        assert_eq!(
            at(vcjob(&objects), "/metadata/annotations/ucloud.dk~1sealed"),
            why
        );
        let peer = PeerValue {
            hostname: "db".into(),
            job_id: "12".into(),
        };
        let e = render_err(
            &with_resource(open.clone(), resource_value::Value::Peer(peer)),
            &config,
        );
        assert!(
            e.message().contains("the operator seals every job of"),
            "{e}"
        );
    }
    let mut other = defaults();
    other.pipeline.sealed.projects = vec!["another-project".into()];
    let objects = objects(&open, &other);
    assert_eq!(
        at(vcjob(&objects), "/metadata/annotations/ucloud.dk~1sealed"),
        &Value::Null
    );
}

/// An empty name in `[pipeline.sealed]` stops the runner at start, naming the key.
#[test]
fn the_sealed_section_is_checked_at_start() {
    let config: Config = toml::from_str("[pipeline.sealed]\nprojects = [\" \"]").unwrap();
    let error = config.pipeline.validate().unwrap_err().to_string();
    assert!(error.contains("pipeline.sealed.projects"), "{error}");
    assert!(toml::from_str::<Config>("[pipeline.sealed]\nopen = true").is_err());
}
