//! `volcano-runner logs <jobId> [--rank N] [--follow] [--since D] [--timestamps]`: the output of every
//! rank of a job, read through the Kubernetes API and interleaved in time order, each line prefixed with
//! its rank (`[rank 2] ...`).
//!
//! A multi-node job's ranks are separate pods on separate nodes; `kubectl logs` shows one at a time, so
//! the order of events across ranks (who printed first, which rank stalled) is lost. Here every rank's
//! log is read with the kubelet's timestamps and merged by them; with `--follow` lines are printed as
//! they arrive, a rank whose pod has not started yet is waited for, a dropped stream is resumed where it
//! left off, and the command ends when every rank's program has ended (or on Ctrl-C).
//!
//! The job is found by its VolcanoJob name (`j-<jobId>`) in any namespace (one list with a field
//! selector); its rank count comes from the job's task, so ranks are read by their pod names without
//! listing pods. Only the program's container (`user-job`) is read, never the runner's init containers.
//!
//! An ended job's output files (`[pipeline.output]`) are named on stderr. Exit codes: 0 when lines were
//! printed, or when none could be but the ended job kept its output; 1 when no rank has a log and nothing
//! was kept; 2 on an error (unknown job, `--rank` out of range, the cluster unreachable, a wrong argument).

use std::path::Path;
use std::process::ExitCode;

use jiff::SignedDuration;
use kube::api::{Api, ListParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::CliError;
use super::run::{cancel_on_signal, load_config, operator_client};
use crate::cluster::logs::{Line, RankReader, has_ended, interleave};
use crate::pipeline::names::vcjob_name;
use crate::validate::{self, names};
use crate::volcano::VolcanoJob;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job's id, as in its SubmitJob (checked with the runner's rule for job ids, so it can only
    /// name a job: it goes into a field selector).
    #[arg(value_parser = parse_job_id)]
    pub job_id: String,
    /// Only this rank (0 is the first node of a multi-node job).
    #[arg(long)]
    pub rank: Option<u32>,
    /// Keep printing new lines until every rank's program has ended; wait for ranks not started yet.
    #[arg(short, long)]
    pub follow: bool,
    /// Only lines written in the last D (`90s`, `10m`, `1h30m`), by the cluster's clock.
    #[arg(long, value_parser = parse_since)]
    pub since: Option<SignedDuration>,
    /// Show each line's time, as the kubelet recorded it, after the rank.
    #[arg(long)]
    pub timestamps: bool,
    /// The job's namespace, when the same job id exists under two owners (a DNS-1123 label, as every
    /// namespace name is; it goes into the URL path).
    #[arg(short, long, value_parser = parse_namespace)]
    pub namespace: Option<String>,
    /// The cluster: `auto` (in-cluster, else KUBECONFIG), an http(s):// URL, or `sim` (the simulator of
    /// the runner started on this machine). Default: `[cluster] target`.
    #[arg(long)]
    pub cluster: Option<String>,
}

/// A job id by the rule the runner applies to every message ([`validate::job_id`]): anything else, such
/// as `4817,metadata.namespace=x`, would add terms to the field selector the job is looked up with.
pub(super) fn parse_job_id(s: &str) -> Result<String, String> {
    validate::job_id(s)
        .map(|()| s.to_owned())
        .map_err(|e| e.message().to_owned())
}

/// A namespace name: a DNS-1123 label, so it needs no escaping in the URL path it goes into.
pub(super) fn parse_namespace(s: &str) -> Result<String, String> {
    if names::is_dns_label(s) {
        return Ok(s.to_owned());
    }
    Err(format!(
        "{s:?} is not a namespace name: lower-case letters, digits and '-', starting and ending with a \
         letter or digit, at most {} characters",
        names::DNS_LABEL_MAX
    ))
}

fn parse_since(s: &str) -> Result<SignedDuration, String> {
    match s.parse::<SignedDuration>() {
        Ok(d) if d.is_positive() => Ok(d),
        Ok(_) => Err(format!("{s:?} must be longer than zero")),
        Err(_) => Err(format!(
            "{s:?} is not a duration; write for example 90s, 10m or 1h30m"
        )),
    }
}

/// The job's namespace and number of ranks, and the job as read.
async fn find_job(
    client: &kube::Client,
    job_id: &str,
    namespace: Option<&str>,
) -> Result<(String, u32, VolcanoJob), CliError> {
    let name = vcjob_name(job_id);
    let api: Api<VolcanoJob> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let found = api
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(|e| CliError::Other(format!("cluster: looking up job {job_id}: {e}")))?;
    let mut jobs = found.items;
    match jobs.len() {
        0 => Err(CliError::Other(format!(
            "no job {job_id} in the cluster (no VolcanoJob {name}{}); it may never have been submitted, or it \
             has ended and been removed",
            namespace
                .map(|ns| format!(" in namespace {ns}"))
                .unwrap_or_default()
        ))),
        1 => {
            let job = jobs.remove(0);
            let ns = job.metadata.namespace.clone().unwrap_or_default();
            let ranks = job
                .spec
                .tasks
                .iter()
                .map(|t| t.replicas.max(0) as u32)
                .sum::<u32>();
            Ok((ns, ranks, job))
        }
        _ => Err(CliError::Other(format!(
            "job id {job_id} exists in namespaces {}: say which with --namespace",
            jobs.iter()
                .filter_map(|j| j.metadata.namespace.clone())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Runs the command.
pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = load_config(config, args.cluster.as_deref())?;
    let client = operator_client(&config).await?;
    let (namespace, count, job) =
        find_job(&client, &args.job_id, args.namespace.as_deref()).await?;
    let ended = has_ended(&job, &config.pipeline.keys().lifecycle_state);
    let ranks: Vec<u32> = match args.rank {
        Some(r) if r >= count => {
            return Err(CliError::Other(format!(
                "--rank {r}: job {} has {count} rank(s), numbered from 0",
                args.job_id
            )));
        }
        Some(r) => vec![r],
        None => (0..count).collect(),
    };
    let reader = RankReader::new(
        client,
        &namespace,
        &args.job_id,
        args.since,
        config.pipeline.keys().lifecycle_state.clone(),
    );
    let code = if args.follow {
        follow(&reader, &ranks, args.timestamps).await?
    } else {
        let printed = snapshot(&reader, &ranks, args.timestamps).await;
        let note = reader
            .ended_note(&config.pipeline.annotation_prefix, count)
            .await;
        return Ok(match (printed, note) {
            (_, Some(note)) => {
                // An ended job that kept its output: where it is, is the answer (even with no log left).
                eprintln!("{note}");
                ExitCode::SUCCESS
            }
            (true, None) => ExitCode::SUCCESS,
            (false, None) => {
                // Nothing to show at all: say so in the exit code too (1), as `kubectl logs` does. An
                // ended job's pods are gone for good: nothing would come to wait for.
                let next = if ended {
                    "the job has ended and its pods are gone: no log is left to show, nor to wait \
                     for"
                } else {
                    "--follow waits for them"
                };
                eprintln!(
                    "volcano-runner: no rank of job {} has a log to show (each says why above); {next}",
                    args.job_id
                );
                ExitCode::FAILURE
            }
        });
    };
    if let Some(note) = reader
        .ended_note(&config.pipeline.annotation_prefix, count)
        .await
    {
        eprintln!("{note}");
    }
    Ok(code)
}

/// Prints what the ranks have written so far, interleaved; false when no rank had a log to show.
async fn snapshot(reader: &RankReader, ranks: &[u32], timestamps: bool) -> bool {
    let reads = ranks.iter().map(|rank| {
        let reader = reader.clone();
        async move { (*rank, reader.read(*rank).await) }
    });
    let mut logs = Vec::new();
    for (rank, log) in futures::future::join_all(reads).await {
        match log {
            Ok(lines) => logs.push(lines),
            Err(why) => eprintln!("[rank {rank}] no log: {why}"),
        }
    }
    if logs.is_empty() && !ranks.is_empty() {
        return false;
    }
    let mut out = std::io::stdout().lock();
    for line in interleave(logs) {
        if write_line(&mut out, &line, timestamps).is_err() {
            break;
        }
    }
    true
}

/// Prints every rank's lines as they arrive until all have ended or Ctrl-C.
async fn follow(
    reader: &RankReader,
    ranks: &[u32],
    timestamps: bool,
) -> Result<ExitCode, CliError> {
    let stop = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(stop.clone()));
    let (tx, mut rx) = mpsc::channel::<Line>(1024);
    let mut followers = tokio::task::JoinSet::new();
    for rank in ranks {
        let (reader, tx, stop, rank) = (reader.clone(), tx.clone(), stop.clone(), *rank);
        followers.spawn(async move { reader.follow(rank, tx, stop).await });
    }
    drop(tx);
    let mut out = std::io::stdout().lock();
    while let Some(line) = rx.recv().await {
        if write_line(&mut out, &line, timestamps).is_err() {
            // The reader went away (`| head`): stop quietly.
            break;
        }
    }
    stop.cancel();
    while followers.join_next().await.is_some() {}
    signals.abort();
    Ok(ExitCode::SUCCESS)
}

fn write_line(out: &mut impl std::io::Write, line: &Line, timestamps: bool) -> std::io::Result<()> {
    writeln!(out, "{}", line.render(timestamps))?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Job ids and namespaces are names, never selector terms or path segments.
    #[test]
    fn job_ids_and_namespaces_are_checked() {
        assert_eq!(parse_job_id("4817").as_deref(), Ok("4817"));
        for bad in [
            "4817,metadata.namespace=kube-system",
            "4817 ",
            "a/b",
            "",
            "X",
        ] {
            assert!(parse_job_id(bad).is_err(), "{bad:?}");
        }
        assert!(
            parse_job_id("4817,metadata.namespace=x")
                .unwrap_err()
                .contains("lower-case letters, digits and '-'")
        );
        assert_eq!(parse_namespace("ucloud-apps").as_deref(), Ok("ucloud-apps"));
        for bad in ["..", "a/b", "apps%2fx", "Apps", "", "a?b=c"] {
            let e = parse_namespace(bad).unwrap_err();
            assert!(e.contains("not a namespace name"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn since_wants_a_positive_duration() {
        assert_eq!(parse_since("10m"), Ok(SignedDuration::from_mins(10)));
        assert_eq!(parse_since("1h30m"), Ok(SignedDuration::from_mins(90)));
        assert!(parse_since("0s").unwrap_err().contains("longer than zero"));
        assert!(parse_since("soon").unwrap_err().contains("90s"));
    }
}
