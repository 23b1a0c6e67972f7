//! Proxy: interactive jobs (a web or VNC interface, or a terminal) are published to every proxy instance.
//!
//! - At create: the target port (`proxyPort`: the web port for WEB apps, default 80; the VNC port for VNC
//!   apps, default 5900; the web port for others that declare one), the public links
//!   (`proxyDomains`), and the session kinds an `OpenSession` may ask for (`sessionKinds`: `vnc,terminal`
//!   for VNC apps, `web,terminal` for the others; [`crate::sessions`]). The port is also declared on the
//!   user's container, named `vnc` for a VNC application and `web` otherwise.
//! - A TERMINAL application without a web port is routed too, so that its user gets the shell the
//!   application exists for: `proxyPort` 0, "bridges only" (the proto's `ProxyTarget.port`), and
//!   `sessionKinds` `terminal`. Its hosts lead to the terminal and logs bridges under `/.volcano-runner/`
//!   and nowhere else; no port is declared. Batch jobs without a web port get nothing and are never routed:
//!   the original routed them to port 80 where nothing listens (W26), and a route per batch job would make
//!   every proxy carry every job of the cluster (docs/proxy.md says so).
//! - Start and monitoring hooks: once every rank has a pod IP, a `CREATE` [`ProxyEvent`] with one target
//!   per rank (IP, port, hostname); when the IPs change (a restarted job), an `UPDATE` (UCloud kept stale
//!   IPs, W26). The generation is a hash of the targets, persisted as `proxyGeneration`, so an event is
//!   published once per set of targets and a re-publication carries the same id.
//! - Every event carries a `sequence`: one more than the last published (`proxySequence`, persisted with
//!   the generation), so a proxy can tell a newer event from an older one that arrives late. The hooks
//!   are re-run against the annotations until their patch lands, so a re-publication carries the same
//!   number.
//! - Cleanup hook: a `REMOVE` event, with the sequence after the last published one. The monitor runs it
//!   after every job end (W13: UCloud only did on cancel).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerPort, Pod};

use super::{Plugin, PluginId};
use crate::messages::v1::{ApplicationType, ProxyAction, ProxyEvent, ProxyTarget};
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::hooks::{
    HookActions, HookContext, HookError, JobFacts, Outbound, proto_timestamp,
};
use crate::pipeline::{PipelineError, names};
use crate::volcano::LABEL_TASK_INDEX;

/// The Proxy plugin; the module documentation says what it builds and why.
pub struct Proxy;

impl Plugin for Proxy {
    fn id(&self) -> PluginId {
        PluginId::Proxy
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let app = cx.app;
        let (port, field) = match ApplicationType::try_from(app.application_type) {
            Ok(ApplicationType::Web) => (Some(app.web_port.unwrap_or(80)), "application.webPort"),
            Ok(ApplicationType::Vnc) => (Some(app.vnc_port.unwrap_or(5900)), "application.vncPort"),
            _ => (app.web_port, "application.webPort"),
        };
        let terminal_only = ApplicationType::try_from(app.application_type)
            == Ok(ApplicationType::Terminal)
            && port.is_none();
        if terminal_only {
            draft.annotate(&cx.keys.proxy_port, BRIDGES_ONLY.to_string());
            draft.annotate(&cx.keys.session_kinds, "terminal".to_owned());
            annotate_domains(cx, draft);
            return Ok(());
        }
        let Some(port) = port else { return Ok(()) };
        if !(1..=65535).contains(&port) {
            return Err(PipelineError::invalid(field, "must be a port number"));
        }
        draft.annotate(&cx.keys.proxy_port, port.to_string());
        // Declared on the container too, named by what it serves (`vnc` for a VNC application, `web`
        // otherwise): informational for Kubernetes, read by the simulator to serve the application.
        let name = match ApplicationType::try_from(app.application_type) {
            Ok(ApplicationType::Vnc) => "vnc",
            _ => "web",
        };
        draft
            .user
            .ports
            .get_or_insert_with(Vec::new)
            .push(ContainerPort {
                name: Some(name.to_owned()),
                container_port: port as i32,
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            });
        // What an OpenSession may ask for (crate::sessions): the interface, and a terminal.
        let kinds = match ApplicationType::try_from(app.application_type) {
            Ok(ApplicationType::Vnc) => "vnc,terminal",
            _ => "web,terminal",
        };
        draft.annotate(&cx.keys.session_kinds, kinds.to_owned());
        annotate_domains(cx, draft);
        Ok(())
    }

    fn on_start(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        publish_targets(cx, out);
        Ok(())
    }

    fn on_monitoring(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        publish_targets(cx, out);
        Ok(())
    }

    fn on_cleanup(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        if let Some(proxy) = &cx.facts.proxy {
            let generation = proxy.generation.as_deref().unwrap_or("none");
            out.publish.push(Outbound::Proxy(event(
                cx.facts,
                ProxyAction::Remove,
                generation,
                proxy.sequence + 1,
                Vec::new(),
                cx.now,
            )));
        }
        Ok(())
    }
}

/// The target port of a job routed to the bridges only (a terminal without a web interface).
pub const BRIDGES_ONLY: u32 = 0;

/// The job's public links, which lead to rank 0 like its own host.
fn annotate_domains(cx: &Context<'_>, draft: &mut Draft) {
    let domains: Vec<&str> = cx
        .ingresses
        .iter()
        .map(|i| i.value.domain.as_str())
        .collect();
    if !domains.is_empty() {
        draft.annotate(&cx.keys.proxy_domains, domains.join(","));
    }
}

fn publish_targets(cx: &HookContext<'_>, out: &mut HookActions) {
    let Some(proxy) = &cx.facts.proxy else { return };
    let Some(targets) = targets(cx.facts, proxy.port, cx.pods) else {
        return;
    };
    let generation = generation(&targets);
    if proxy.generation.as_deref() == Some(generation.as_str()) {
        return;
    }
    let action = if proxy.generation.is_none() {
        ProxyAction::Create
    } else {
        ProxyAction::Update
    };
    // The instant these targets became current (the last rank to start), not when a runner noticed:
    // a re-publication after a crash is the same message.
    let since = targets_since(cx.facts, cx.pods)
        .unwrap_or(cx.now)
        .min(cx.now);
    let sequence = proxy.sequence + 1;
    out.publish.push(Outbound::Proxy(event(
        cx.facts,
        action,
        &generation,
        sequence,
        targets,
        since,
    )));
    out.set.insert(cx.keys.proxy_generation.clone(), generation);
    out.set
        .insert(cx.keys.proxy_sequence.clone(), sequence.to_string());
}

/// When the current set of targets came to be: the latest start of a running rank (its user
/// container's start, else the pod's).
pub fn targets_since(facts: &JobFacts, pods: &[Pod]) -> Option<Timestamp> {
    pods.iter()
        .filter(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod_rank(&facts.job_id, pod).is_some_and(|r| r < facts.replicas)
        })
        .filter_map(|pod| pod.status.as_ref())
        .filter(|status| status.phase.as_deref() == Some("Running"))
        .filter_map(|status| {
            let container = status
                .container_statuses
                .iter()
                .flatten()
                .filter(|c| c.name == names::USER_CONTAINER)
                .find_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
                .map(|t| t.0);
            container.or_else(|| status.start_time.as_ref().map(|t| t.0))
        })
        .max()
}

/// One target per rank, or `None` until every rank has a running pod with an IP.
pub fn targets(facts: &JobFacts, port: u32, pods: &[Pod]) -> Option<Vec<ProxyTarget>> {
    (0..facts.replicas)
        .map(|rank| {
            let ip = pods
                .iter()
                .filter(|pod| {
                    pod.metadata.deletion_timestamp.is_none()
                        && pod_rank(&facts.job_id, pod) == Some(rank)
                })
                .filter_map(|pod| pod.status.as_ref())
                .filter(|status| status.phase.as_deref() == Some("Running"))
                .find_map(|status| status.pod_ip.clone().filter(|ip| !ip.is_empty()))?;
            Some(target(&facts.job_id, rank, ip, port))
        })
        .collect()
}

/// Rank `rank` of job `job_id` at `pod_ip:port`, with the rank's host name in the job's headless
/// service (what a proxy may route by instead of the IP).
pub fn target(job_id: &str, rank: u32, pod_ip: impl Into<String>, port: u32) -> ProxyTarget {
    ProxyTarget {
        rank,
        pod_ip: pod_ip.into(),
        port,
        hostname: names::rank_hostname(job_id, rank),
    }
}

/// A pod's rank: Volcano's task-index label, else the pod name's suffix.
fn pod_rank(job_id: &str, pod: &Pod) -> Option<u32> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_TASK_INDEX))
        .and_then(|i| i.parse().ok())
        .or_else(|| names::rank_from_pod_name(job_id, pod.metadata.name.as_deref()?))
}

/// A short hash of the targets: the same targets always give the same generation.
pub fn generation(targets: &[ProxyTarget]) -> String {
    let mut text = String::new();
    for t in targets {
        text.push_str(&format!("{}={}:{};", t.rank, t.pod_ip, t.port));
    }
    names::short_hash(text.as_bytes(), 12)
}

/// The event, with id `<jobId>/proxy/<action>/<generation>`.
pub fn event(
    facts: &JobFacts,
    action: ProxyAction,
    generation: &str,
    sequence: u64,
    targets: Vec<ProxyTarget>,
    now: Timestamp,
) -> ProxyEvent {
    let verb = match action {
        ProxyAction::Create => "create",
        ProxyAction::Update => "update",
        ProxyAction::Remove => "remove",
        ProxyAction::Unspecified => "unspecified",
    };
    ProxyEvent {
        event_id: crate::durable::ids::proxy(&facts.job_id, verb, generation),
        job_id: facts.job_id.clone(),
        action: action as i32,
        targets,
        domains: facts
            .proxy
            .as_ref()
            .map(|p| p.domains.clone())
            .unwrap_or_default(),
        timestamp: Some(proto_timestamp(now)),
        sequence,
    }
}
