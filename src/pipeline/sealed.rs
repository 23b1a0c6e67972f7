//! Sealed jobs: a job whose pods reach nothing and that nothing reaches but its own ranks, for analyses of
//! sensitive data (registry data, health records, survey microdata) where the researcher's code may read
//! the staged inputs and write results, and nothing else.
//!
//! Not a plugin of the registry on purpose: a switch that turned it off would turn a sealed job into an
//! open one without a word. It runs after every plugin ([`super::render`]) and has the last word on the
//! job's network and credentials:
//!
//! - **Who is sealed**: a submission with `sealed: true`, or any job of a product (id or category) or
//!   project listed in `[pipeline.sealed]`. Why is recorded on the VolcanoJob (`<prefix>sealed`), so that
//!   its events and `job <id>` say so.
//! - **Refused, naming the field**: what would open a sealed job: a public IP, a peer, a public link, a
//!   license server (each is a way out or in), and a web or VNC interface unless the operator lets the
//!   proxy reach sealed jobs (`allow_proxy`). Refused, not dropped: a job that runs without what it asked
//!   for fails later and obscurely.
//! - **Network**: the pods carry the label `<prefix>sealed`, which the namespace's baseline policy
//!   excludes (NetworkPolicies add up: a baseline that selected a sealed pod would give it DNS and the
//!   internet whatever its own policy said). Its own policy `policy-<jobId>` replaces the one ConnectToJob
//!   built, and is built even with ConnectToJob off: ingress from its own ranks only (and the proxy on the
//!   interface's port when allowed), egress to its own ranks only when it has several, none otherwise.
//! - **Credentials and host**: no service-account token whatever Miscellaneous says; a host path volume
//!   or the host's network is refused as a configuration error (no plugin renders either today; this is
//!   the guard that keeps it so).
//! - Files are untouched: the output folder stays writable and staged inputs readable (FileMount).

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;

use super::PipelineError;
use super::context::Context;
use super::desired::Companion;
use super::draft::{Draft, job_selector};
use super::plugins::connect_to_job::policy_name;
use super::plugins::fair_share::baseline_ingress;
use crate::messages::v1::{SubmitJob, parameter_value};

/// `[pipeline.sealed]`: which jobs the operator seals, and whether the proxy may reach a sealed job.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SealedConfig {
    /// Product ids or categories whose every job is sealed, whatever the submission says.
    pub products: Vec<String>,
    /// Projects whose every job is sealed, whatever the submission says.
    pub projects: Vec<String>,
    /// Whether the proxy may reach a sealed job's web or VNC interface (its owner's sessions). Off by
    /// default: what a browser can show, a browser can copy out; the data owner decides.
    pub allow_proxy: bool,
}

impl SealedConfig {
    /// Checked at start-up: `Err((key below pipeline, reason))`.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if self.products.iter().any(|p| p.trim().is_empty()) {
            return Err(("sealed.products", "must not contain an empty name"));
        }
        if self.projects.iter().any(|p| p.trim().is_empty()) {
            return Err(("sealed.projects", "must not contain an empty name"));
        }
        Ok(())
    }
}

/// Why a job is sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// The submission asks for it (`sealed: true`).
    Submission,
    /// `[pipeline.sealed] products` lists the product's id or category (this one).
    Product(String),
    /// `[pipeline.sealed] projects` lists the owner's project.
    Project(String),
}

impl Why {
    /// The value of the `<prefix>sealed` annotation.
    pub fn annotation(&self) -> String {
        match self {
            Self::Submission => "submission".to_owned(),
            Self::Product(p) => format!("product:{p}"),
            Self::Project(p) => format!("project:{p}"),
        }
    }

    /// Reads the annotation back; an unknown value still means sealed (asked by someone).
    pub fn parse(value: &str) -> Self {
        match value.split_once(':') {
            Some(("product", p)) => Self::Product(p.to_owned()),
            Some(("project", p)) => Self::Project(p.to_owned()),
            _ => Self::Submission,
        }
    }

    /// Who sealed it, in words for the user.
    pub fn words(&self) -> String {
        match self {
            Self::Submission => "the submission asks for it".to_owned(),
            Self::Product(p) => format!("the operator seals every job of product {p}"),
            Self::Project(p) => format!("the operator seals every job of project {p}"),
        }
    }
}

/// What a sealed job is told it is, in its events and `job <id>`.
pub fn describe(why: &Why) -> String {
    format!("sealed ({}): no network beyond its own ranks", why.words())
}

/// Says in a QUEUED status that the job is sealed, when its annotations (`key` is `<prefix>sealed`) say
/// so. From the job's record alone, so that the runner and the monitor tell the very same QUEUED.
pub fn tell_queued(status: &mut String, annotations: Option<&BTreeMap<String, String>>, key: &str) {
    if let Some(value) = annotations.and_then(|a| a.get(key)) {
        status.push_str(&format!("; the job is {}", describe(&Why::parse(value))));
    }
}

/// Whether `job` is sealed, and why: the submission first (the user's own words), then the product,
/// then the project.
pub fn why(job: &SubmitJob, config: &SealedConfig) -> Option<Why> {
    if job.sealed {
        return Some(Why::Submission);
    }
    if let Some(product) = job.product.as_ref()
        && let Some(p) = config
            .products
            .iter()
            .find(|p| **p == product.id || **p == product.category)
    {
        return Some(Why::Product(p.clone()));
    }
    let project = job.owner.as_ref().and_then(|o| o.project.as_deref())?;
    config
        .projects
        .iter()
        .find(|p| *p == project)
        .map(|p| Why::Project(p.clone()))
}

/// Whether the job is sealed (and why), refusing it when it asks for something that would open it.
/// Called by [`super::render`] before any plugin, so that the refusal says the job is sealed rather than
/// what a plugin would say of the same field.
pub fn check(cx: &Context<'_>) -> Result<Option<Why>, PipelineError> {
    let Some(why) = why(cx.job, &cx.pipeline().sealed) else {
        return Ok(None);
    };
    refuse_openings(cx, &why)?;
    Ok(Some(why))
}

/// Seals the rendered job. Called by [`super::render`] after every plugin, with what [`check`] found.
pub fn seal(cx: &Context<'_>, draft: &mut Draft, why: &Why) -> Result<(), PipelineError> {
    let proxy_port = interface_port(cx, draft, why)?;
    guard_host(draft)?;
    let label = cx.keys.sealed.clone();
    draft.annotate(&label, why.annotation());
    draft.label_pods(&label, "true");
    draft.pod.automount_service_account_token = Some(false);
    draft
        .companions
        .retain(|c| !matches!(c, Companion::NetworkPolicy(_)));
    draft.companions.insert(
        0,
        Companion::NetworkPolicy(Box::new(policy(cx, proxy_port))),
    );
    Ok(())
}

/// The first value of the submission that would open a sealed job: public IPs, peers, public links and
/// license servers, in that order.
fn refuse_openings(cx: &Context<'_>, why: &Why) -> Result<(), PipelineError> {
    let refuse = |field: String, what: &str| {
        Err(PipelineError::invalid(
            field,
            format!(
                "a sealed job cannot have {what}: it would open the job to the outside world (sealed because {})",
                why.words()
            ),
        ))
    };
    if let Some(ip) = cx.network_ips.first() {
        return refuse(ip.origin.field("networkIp"), "a public IP");
    }
    if let Some(peer) = cx.peers.first() {
        return refuse(peer.origin.field("peer"), "a peer");
    }
    if let Some(link) = cx.ingresses.first() {
        return refuse(link.origin.field("ingress"), "a public link");
    }
    let license = cx
        .job
        .parameters
        .iter()
        .find(|(_, p)| matches!(p.value, Some(parameter_value::Value::LicenseServer(_))));
    if let Some((name, _)) = license {
        return refuse(
            format!("parameters.{name}.licenseServer"),
            "a license server",
        );
    }
    Ok(())
}

/// The port the proxy reaches the job's web or VNC interface on (the Proxy plugin's `proxyPort`), when
/// it has one and the operator lets the proxy in; a job with one and without that leave is refused.
fn interface_port(
    cx: &Context<'_>,
    draft: &Draft,
    why: &Why,
) -> Result<Option<i32>, PipelineError> {
    let port = draft
        .meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(&cx.keys.proxy_port))
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p > 0);
    match port {
        Some(_) if !cx.pipeline().sealed.allow_proxy => Err(PipelineError::invalid(
            "application.applicationType",
            format!(
                "a sealed job's web or VNC interface is reached through the proxy, which this cluster does not let into sealed jobs ([pipeline.sealed] allow_proxy); run it as a batch or terminal application (sealed because {})",
                why.words()
            ),
        )),
        port => Ok(port),
    }
}

/// No host path and not the host's network: either would be a way around the policy.
fn guard_host(draft: &Draft) -> Result<(), PipelineError> {
    let host_path = draft
        .pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.is_some());
    if let Some(volume) = host_path {
        return Err(PipelineError::config(
            "sealed",
            format!(
                "volume {} is a host path, which a sealed job may not have",
                volume.name
            ),
        ));
    }
    if draft.pod.host_network == Some(true) {
        return Err(PipelineError::config(
            "sealed",
            "a sealed job may not use the host's network",
        ));
    }
    Ok(())
}

/// The sealed job's own policy: its ranks to each other (egress only with several ranks), and the proxy
/// in on `proxy_port` when given. Nothing else: with both policy types and no other rule, Kubernetes
/// denies every other connection, DNS included.
fn policy(cx: &Context<'_>, proxy_port: Option<i32>) -> NetworkPolicy {
    let own = || NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(job_selector(cx)),
            match_expressions: None,
        }),
        ..NetworkPolicyPeer::default()
    };
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![own()]),
        ports: None,
    }];
    if let Some(port) = proxy_port {
        ingress.extend(
            baseline_ingress(&cx.pipeline().network_policy)
                .into_iter()
                .map(|rule| NetworkPolicyIngressRule {
                    ports: Some(vec![NetworkPolicyPort {
                        port: Some(IntOrString::Int(port)),
                        protocol: Some("TCP".to_owned()),
                        end_port: None,
                    }]),
                    ..rule
                }),
        );
    }
    let egress = if cx.replicas > 1 {
        vec![NetworkPolicyEgressRule {
            to: Some(vec![own()]),
            ports: None,
        }]
    } else {
        Vec::new()
    };
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(policy_name(cx.job_id)),
            labels: Some(BTreeMap::from([(
                cx.keys.sealed.clone(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(job_selector(cx)),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::v1::{Owner, Product};

    fn job(sealed: bool, project: Option<&str>) -> SubmitJob {
        SubmitJob {
            sealed,
            owner: Some(Owner {
                user: "carol".into(),
                project: project.map(String::from),
            }),
            product: Some(Product {
                id: "u1-standard-4".into(),
                category: "u1-standard".into(),
                ..Product::default()
            }),
            ..SubmitJob::default()
        }
    }

    #[test]
    fn the_submission_then_the_product_then_the_project_seal() {
        let none = SealedConfig::default();
        assert_eq!(why(&job(false, Some("p")), &none), None);
        assert_eq!(why(&job(true, None), &none), Some(Why::Submission));
        let config = SealedConfig {
            products: vec!["u1-standard".into()],
            projects: vec!["p".into()],
            allow_proxy: false,
        };
        assert_eq!(why(&job(true, Some("p")), &config), Some(Why::Submission));
        assert_eq!(
            why(&job(false, Some("p")), &config),
            Some(Why::Product("u1-standard".into()))
        );
        let projects = SealedConfig {
            projects: vec!["p".into()],
            ..SealedConfig::default()
        };
        assert_eq!(
            why(&job(false, Some("p")), &projects),
            Some(Why::Project("p".into()))
        );
        assert_eq!(why(&job(false, Some("q")), &projects), None);
        assert_eq!(why(&job(false, None), &projects), None);
    }

    #[test]
    fn the_annotation_reads_back_and_queued_says_it() {
        for w in [
            Why::Submission,
            Why::Product("u1-gpu".into()),
            Why::Project("p".into()),
        ] {
            assert_eq!(Why::parse(&w.annotation()), w);
        }
        let key = "ucloud.dk/sealed";
        let mut status = "Queued: waiting".to_owned();
        tell_queued(&mut status, None, key);
        assert_eq!(status, "Queued: waiting");
        let annotations = BTreeMap::from([(key.to_owned(), "product:u1-gpu".to_owned())]);
        tell_queued(&mut status, Some(&annotations), key);
        assert_eq!(
            status,
            "Queued: waiting; the job is sealed (the operator seals every job of product u1-gpu): no network beyond its own ranks"
        );
    }
}
