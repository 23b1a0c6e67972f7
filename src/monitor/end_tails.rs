//! The log tails of a job read just before it is deleted (an expiry, a cancel), kept on the job
//! (annotation `<prefix>endTails`) until its outcome is recorded.
//!
//! Why: the outcome of a deleted job is recorded once its pods have stopped, and by then their logs are
//! gone with them (UCloud read them after the deletion, W15: its EXPIRED and CANCELLED tails were
//! empty). Whoever deletes the job reads the tails first and writes them with (or before) the delete, so
//! they are durable even when that runner dies at that moment. When the outcome is recorded, a rank whose
//! log can still be read gets its later tail; the others keep the one read before the delete. The
//! annotation is removed when the outcome (which carries the tails) is written, so the two never use the
//! annotation budget together.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};

use super::events;
use super::record::RankTail;
use crate::pipeline::names::{self, USER_CONTAINER};
use crate::volcano::VolcanoJob;

/// The annotation's name under the prefix.
pub const ANNOTATION: &str = "endTails";

/// The annotation's key.
pub fn key(prefix: &str) -> String {
    format!("{prefix}{ANNOTATION}")
}

/// Whether the job keeps tails read before a command ended it (the annotation is there).
pub fn kept_on(job: &VolcanoJob, prefix: &str) -> bool {
    job.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(&key(prefix)))
}

/// How much of each log: `per_rank` bytes at most, `total` for the whole job.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub per_rank: usize,
    pub total: usize,
}

impl Budget {
    /// From `[monitor] log_tail_bytes` and `log_tail_total_bytes`.
    pub fn of(config: &crate::config::Config) -> Self {
        Budget {
            per_rank: config.monitor.log_tail_bytes,
            total: config.monitor.log_tail_total_bytes,
        }
    }
}

/// Reads the tail of each `(rank, pod)`'s log once (best effort: a log that cannot be read is left out,
/// a deletion never waits for logs).
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    ranks: &[(u32, String)],
    budget: Budget,
) -> Vec<RankTail> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    read_with(ranks, budget, |pod, params| {
        let api = api.clone();
        async move { api.logs(&pod, &params).await }
    })
    .await
}

/// The end of each `(rank, pod)`'s log, `fetch`ed (with retries or without, as the caller needs) with
/// one set of log parameters, cut to the budget: `per_rank` bytes each and `total` for the whole job. A
/// log that cannot be read is left out (and logged).
pub async fn read_with<F, Fut, E>(
    ranks: &[(u32, String)],
    budget: Budget,
    fetch: F,
) -> Vec<RankTail>
where
    F: Fn(String, LogParams) -> Fut,
    Fut: std::future::Future<Output = Result<String, E>>,
    E: std::fmt::Display,
{
    if ranks.is_empty() || budget.per_rank == 0 {
        return Vec::new();
    }
    let per_rank = budget.per_rank.min(budget.total / ranks.len()).max(1);
    let params = LogParams {
        container: Some(USER_CONTAINER.to_owned()),
        // Lines are short in practice; the byte cut below is what bounds the size.
        tail_lines: Some(i64::try_from(per_rank / 16 + 16).unwrap_or(i64::MAX)),
        ..LogParams::default()
    };
    let reads = ranks.iter().map(|(rank, pod)| {
        let read = fetch(pod.clone(), params.clone());
        async move {
            match read.await {
                Ok(log) => Some(RankTail {
                    rank: *rank,
                    tail: events::tail(&log, per_rank),
                }),
                Err(e) => {
                    tracing::info!(pod = %pod, error = %e, "No log tail for this rank.");
                    None
                }
            }
        }
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Every rank of `job` by its pod name (`j-<id>-job-<rank>`), from the task's replicas.
pub fn ranks_of(job: &VolcanoJob) -> Vec<(u32, String)> {
    let Some(job_id) = job
        .metadata
        .name
        .as_deref()
        .and_then(names::job_id_from_vcjob_name)
    else {
        return Vec::new();
    };
    let replicas: u32 = job
        .spec
        .tasks
        .iter()
        .map(|t| u32::try_from(t.replicas).unwrap_or(0))
        .sum();
    (0..replicas)
        .map(|rank| (rank, names::pod_name(job_id, rank)))
        .collect()
}

/// The annotation's value.
pub fn encode(tails: &[RankTail]) -> String {
    serde_json::to_string(tails).unwrap_or_else(|_| "[]".to_owned())
}

/// The tails kept on the job; none when absent or unreadable.
pub fn decode(annotations: Option<&BTreeMap<String, String>>, prefix: &str) -> Vec<RankTail> {
    annotations
        .and_then(|a| a.get(&key(prefix)))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The tails read now where there are any, else the ones kept before the deletion; by rank.
pub fn merge(now: Vec<RankTail>, kept: Vec<RankTail>) -> Vec<RankTail> {
    let mut by_rank: BTreeMap<u32, RankTail> = kept.into_iter().map(|t| (t.rank, t)).collect();
    for t in now {
        by_rank.insert(t.rank, t);
    }
    by_rank.into_values().collect()
}

/// The tails of `job`'s ranks (as read from the API: namespace and tasks) as an annotation patch entry
/// `(key, value)`, read now; `None` when no log could be read (a job that never started).
pub async fn snapshot(
    client: &kube::Client,
    job: &VolcanoJob,
    prefix: &str,
    budget: Budget,
) -> Option<(String, String)> {
    let namespace = job.metadata.namespace.as_deref()?;
    snapshot_of(client, namespace, &ranks_of(job), prefix, budget).await
}

/// Like [`snapshot`], for the `(rank, pod)`s given.
pub async fn snapshot_of(
    client: &kube::Client,
    namespace: &str,
    ranks: &[(u32, String)],
    prefix: &str,
    budget: Budget,
) -> Option<(String, String)> {
    let tails = read(client, namespace, ranks, budget).await;
    (!tails.is_empty()).then(|| (key(prefix), encode(&tails)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rank: u32, tail: &str) -> RankTail {
        RankTail {
            rank,
            tail: tail.to_owned(),
        }
    }

    #[test]
    fn a_tail_read_now_wins_and_the_kept_ones_fill_the_gaps() {
        let merged = merge(vec![t(1, "later")], vec![t(0, "kept 0"), t(1, "kept 1")]);
        assert_eq!(merged, [t(0, "kept 0"), t(1, "later")]);
    }

    #[test]
    fn the_annotation_round_trips_and_garbage_is_none() {
        let prefix = "ucloud.dk/";
        let tails = vec![t(0, "a\nb\n"), t(2, "c")];
        let annotations = BTreeMap::from([(key(prefix), encode(&tails))]);
        assert_eq!(decode(Some(&annotations), prefix), tails);
        let garbage = BTreeMap::from([(key(prefix), "{".to_owned())]);
        assert!(decode(Some(&garbage), prefix).is_empty());
        assert!(decode(None, prefix).is_empty());
    }
}
