//! The routes of the running interactive jobs, read from the cluster: what a proxy-sync instance starts
//! from (and starts over from whenever its queue was lost), so it routes every running job whatever
//! events it never saw.
//!
//! A job is routed when it is interactive (the Proxy plugin gave it a `proxyPort`), is not being deleted
//! or ending, and every rank has a running pod with an IP: exactly when the monitor publishes its
//! `CREATE`. Each job becomes the [`JobUpdate`] its last event would be: the persisted `proxySequence`,
//! the targets' start as the timestamp, and the targets as the pods show them now. An event that comes
//! later from the queue is then ordered against it like any other (see [`super::table`]).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::table::{Backend, JobRoutes, JobUpdate, Stamp};
use crate::cluster::ClusterError;
use crate::durable::AnnotationKeys;
use crate::monitor::cache::{WatchedJob, WatchedPod};
use crate::pipeline::PipelineConfig;
use crate::pipeline::hooks::JobFacts;
use crate::pipeline::plugins::proxy::{targets, targets_since};
use crate::volcano::{LABEL_JOB_NAME, VolcanoJob};

/// Objects per page of the lists.
const PAGE: u32 = 500;

/// A job the snapshot could not read (its annotations are broken): skipped, and reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub job: String,
    pub reason: String,
}

/// The updates for every routed job of `jobs`, given all their pods; and the jobs that were skipped.
pub fn updates(
    jobs: &[VolcanoJob],
    pods: &[Pod],
    keys: &AnnotationKeys,
    pipeline: &PipelineConfig,
) -> (Vec<JobUpdate>, Vec<Skipped>) {
    let mut by_job: HashMap<(&str, &str), Vec<Pod>> = HashMap::new();
    for pod in pods {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(job) = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_JOB_NAME))
        {
            by_job
                .entry((namespace, job.as_str()))
                .or_default()
                .push(pod.clone());
        }
    }
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for vcjob in jobs {
        if vcjob.metadata.deletion_timestamp.is_some() || vcjob.phase().is_ending() {
            continue;
        }
        let facts = match JobFacts::read(vcjob, keys, pipeline) {
            Ok(facts) => facts,
            Err(e) => {
                skipped.push(Skipped {
                    job: e.job.clone(),
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let Some(proxy) = &facts.proxy else { continue };
        let namespace = vcjob.metadata.namespace.as_deref().unwrap_or_default();
        let name = vcjob.metadata.name.as_deref().unwrap_or_default();
        let job_pods = by_job
            .get(&(namespace, name))
            .map(Vec::as_slice)
            .unwrap_or_default();
        if let Some(update) = update(&facts, job_pods) {
            out.push(update);
        } else if proxy.port > u32::from(u16::MAX) {
            skipped.push(Skipped {
                job: facts.name.clone(),
                reason: format!("{}: port {} is out of range", keys.proxy_port, proxy.port),
            });
        }
    }
    (out, skipped)
}

/// The update a job's pods make, `None` until every rank runs with an IP.
fn update(facts: &JobFacts, pods: &[Pod]) -> Option<JobUpdate> {
    let proxy = facts.proxy.as_ref()?;
    let port = u16::try_from(proxy.port).ok()?;
    let targets = targets(facts, proxy.port, pods)?;
    let mut ranks = std::collections::BTreeMap::new();
    for t in &targets {
        ranks.insert(
            t.rank,
            Backend {
                ip: t.pod_ip.parse().ok()?,
                port,
            },
        );
    }
    let mut domains: Vec<String> = proxy
        .domains
        .iter()
        .map(|d| d.to_ascii_lowercase())
        .collect();
    domains.sort();
    domains.dedup();
    let at_ms = targets_since(facts, pods).map_or(0, |t| t.as_millisecond());
    Some(JobUpdate {
        stamp: Stamp {
            sequence: proxy.sequence,
            removed: false,
            at_ms,
        },
        routes: Some(JobRoutes { ranks, domains }),
        job_id: facts.job_id.clone(),
    })
}

/// Every managed VolcanoJob and every pod of a Volcano job, listed page by page (`selector` is
/// `[cluster] managed_selector`). Jobs first: a pod listed after its job is at least as new.
pub async fn list(
    client: &kube::Client,
    selector: &str,
) -> Result<(Vec<VolcanoJob>, Vec<Pod>), ClusterError> {
    let jobs_api: Api<WatchedJob> = Api::all(client.clone());
    let jobs = list_all(&jobs_api, selector, "list VolcanoJobs").await?;
    let pods_api: Api<WatchedPod> = Api::all(client.clone());
    let pod_selector = format!("{selector},{LABEL_JOB_NAME}");
    let pods = list_all(&pods_api, &pod_selector, "list pods").await?;
    Ok((
        jobs.into_iter().map(WatchedJob::into_job).collect(),
        pods.into_iter().map(WatchedPod::into_pod).collect(),
    ))
}

async fn list_all<K>(api: &Api<K>, selector: &str, op: &str) -> Result<Vec<K>, ClusterError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().labels(selector).limit(PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| ClusterError::from_kube(op, e))?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::collections::BTreeMap;

    fn keys() -> AnnotationKeys {
        PipelineConfig::default().keys().into_owned()
    }

    fn vcjob(id: &str, phase: &str, extra: &[(&str, &str)]) -> VolcanoJob {
        let k = keys();
        let mut annotations: BTreeMap<String, String> = [
            (k.owner_user.clone(), "alice".to_owned()),
            (k.product_id.clone(), "u1-standard-1".to_owned()),
            (k.replicas.clone(), "2".to_owned()),
        ]
        .into_iter()
        .collect();
        for (key, value) in extra {
            annotations.insert(format!("ucloud.dk/{key}"), (*value).to_owned());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("j-{id}"), "namespace": "ns", "annotations": annotations},
            "spec": {"tasks": [{"name": "job", "replicas": 2}]},
            "status": {"state": {"phase": phase}},
        }))
        .unwrap()
    }

    fn pod(id: &str, rank: u32, ip: &str, started_s: i64) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("j-{id}-job-{rank}"),
                "namespace": "ns",
                "labels": {"volcano.sh/job-name": format!("j-{id}"), "volcano.sh/task-index": rank.to_string()},
            },
            "status": {"phase": "Running", "podIP": ip},
        }))
        .unwrap();
        let started = jiff::Timestamp::from_second(started_s).unwrap();
        pod.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: crate::pipeline::names::USER_CONTAINER.into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(started)),
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]);
        pod
    }

    #[test]
    fn running_interactive_jobs_with_every_rank_up_are_routed() {
        let jobs = vec![
            vcjob(
                "web",
                "Running",
                &[
                    ("proxyPort", "8080"),
                    ("proxyDomains", "b.example.org,a.example.org"),
                    ("proxySequence", "3"),
                ],
            ),
            // Batch: no proxy port.
            vcjob("batch", "Running", &[]),
            // A terminal-only job: routed to the bridges only, with its pods' IPs.
            vcjob(
                "term",
                "Running",
                &[("proxyPort", "0"), ("proxySequence", "1")],
            ),
            // Only rank 0 has a pod yet.
            vcjob("half", "Running", &[("proxyPort", "8080")]),
            // Ending: its REMOVE may have gone out before this instance bound its queue.
            vcjob("ending", "Completing", &[("proxyPort", "8080")]),
        ];
        let pods = vec![
            pod("web", 0, "10.0.0.1", 100),
            pod("web", 1, "10.0.0.2", 130),
            pod("batch", 0, "10.0.0.3", 100),
            pod("batch", 1, "10.0.0.4", 100),
            pod("term", 0, "10.0.0.8", 100),
            pod("term", 1, "10.0.0.9", 100),
            pod("half", 0, "10.0.0.5", 100),
            pod("ending", 0, "10.0.0.6", 100),
            pod("ending", 1, "10.0.0.7", 100),
        ];
        let (updates, skipped) = updates(&jobs, &pods, &keys(), &PipelineConfig::default());
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(updates.len(), 2, "{updates:?}");
        let term = updates.iter().find(|u| u.job_id == "term").unwrap();
        let ranks = &term.routes.as_ref().unwrap().ranks;
        assert!(ranks.values().all(Backend::bridges_only), "{ranks:?}");
        assert_eq!(ranks[&1].ip.to_string(), "10.0.0.9");
        let u = updates.iter().find(|u| u.job_id == "web").unwrap();
        assert_eq!(u.job_id, "web");
        assert_eq!(
            u.stamp,
            Stamp {
                sequence: 3,
                removed: false,
                at_ms: 130_000
            }
        );
        let routes = u.routes.as_ref().unwrap();
        assert_eq!(routes.ranks[&1].to_string(), "10.0.0.2:8080");
        assert_eq!(routes.domains, ["a.example.org", "b.example.org"]);
    }

    #[test]
    fn a_job_being_deleted_is_not_routed_and_broken_annotations_are_reported() {
        let mut deleted = vcjob("gone", "Running", &[("proxyPort", "8080")]);
        deleted.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let broken = vcjob(
            "broken",
            "Running",
            &[("proxyPort", "8080"), ("proxySequence", "many")],
        );
        let pods = vec![pod("gone", 0, "10.0.0.1", 1), pod("gone", 1, "10.0.0.2", 1)];
        let (updates, skipped) = updates(
            &[deleted, broken],
            &pods,
            &keys(),
            &PipelineConfig::default(),
        );
        assert!(updates.is_empty());
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].job, "j-broken");
        assert!(skipped[0].reason.contains("proxySequence"), "{skipped:?}");
    }
}
