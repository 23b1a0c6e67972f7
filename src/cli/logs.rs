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
use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::CliError;
use super::run::{cancel_on_signal, load_config, operator_client};
use crate::pipeline::names::{USER_CONTAINER, pod_name, vcjob_name};
use crate::pipeline::plugins::output_files;
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

/// One line of one rank's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub rank: u32,
    /// When the kubelet recorded it; `None` for a line without a readable timestamp.
    pub at: Option<Timestamp>,
    pub text: String,
}

impl Line {
    /// A line as the API returns it with `timestamps=true`: `<RFC 3339 time> <text>`.
    pub fn parse(rank: u32, raw: &str) -> Line {
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        match raw.split_once(' ') {
            Some((time, text)) if let Ok(at) = time.parse::<Timestamp>() => Line {
                rank,
                at: Some(at),
                text: text.to_owned(),
            },
            _ => Line {
                rank,
                at: None,
                text: raw.to_owned(),
            },
        }
    }

    /// The line as printed: `[rank N] text`, or `[rank N] time text`.
    pub fn render(&self, timestamps: bool) -> String {
        match (timestamps, self.at) {
            (true, Some(at)) => format!(
                "[rank {}] {} {}",
                self.rank,
                at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"),
                self.text
            ),
            _ => format!("[rank {}] {}", self.rank, self.text),
        }
    }
}

/// Every rank's lines in one time order: by timestamp, then by rank for lines of the same instant, each
/// rank's own order kept. A line without a timestamp keeps the time of the line before it in its rank.
pub fn interleave(logs: Vec<Vec<Line>>) -> Vec<Line> {
    let mut keyed: Vec<(Option<Timestamp>, u32, usize, Line)> = Vec::new();
    for log in logs {
        let mut last = None;
        for (i, line) in log.into_iter().enumerate() {
            last = line.at.or(last);
            keyed.push((last, line.rank, i, line));
        }
    }
    keyed.sort_by_key(|k| (k.0, k.1, k.2));
    keyed.into_iter().map(|(_, _, _, line)| line).collect()
}

/// Where a followed log resumes after its stream ends early: lines before `last` and the first
/// `at_last` lines at `last` were printed already.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resume {
    last: Option<Timestamp>,
    at_last: usize,
    /// Lines at `last` seen in the current read.
    seen_at_last: usize,
}

impl Resume {
    /// A new read of the log starts (from `since()`).
    pub fn restart(&mut self) {
        self.seen_at_last = 0;
    }

    /// The instant to read from again: the second of the last printed line (the API takes whole
    /// seconds), so nothing printed later is missed.
    pub fn since(&self) -> Option<Timestamp> {
        self.last
            .and_then(|t| Timestamp::from_second(t.as_second()).ok())
    }

    /// Whether this line is new, and counts it.
    pub fn admit(&mut self, line: &Line) -> bool {
        let Some(at) = line.at else {
            return true;
        };
        match self.last {
            Some(last) if at < last => false,
            Some(last) if at == last => {
                self.seen_at_last += 1;
                if self.seen_at_last <= self.at_last {
                    return false;
                }
                self.at_last = self.seen_at_last;
                true
            }
            _ => {
                self.last = Some(at);
                self.at_last = 1;
                self.seen_at_last = 1;
                true
            }
        }
    }
}

/// Whether no more output can come from the job: Volcano is ending or finished it (a cancel, an expiry:
/// its `TerminateJob` command; the ended job is kept as the record of its submission), it is being
/// deleted (by an older runner, or by Volcano's TTL), or the monitor recorded its end.
pub fn has_ended(job: &VolcanoJob, lifecycle_key: &str) -> bool {
    crate::cluster::end::is_ending(job)
        || job
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(lifecycle_key))
            .is_some_and(|s| ["SUCCESS", "FAILURE", "EXPIRED", "CANCELLED"].contains(&s.as_str()))
}

/// What `logs` says about an ended job's output files, when the job kept them.
pub fn kept_note(job_id: &str, job: &VolcanoJob, prefix: &str, ranks: u32) -> Option<String> {
    let kept = output_files::location(job.metadata.annotations.as_ref(), prefix, ranks)?;
    let limit = if kept.max_bytes > 0 {
        format!(
            " (the first {} bytes of each rank's output)",
            kept.max_bytes
        )
    } else {
        String::new()
    };
    Some(format!(
        "job {job_id} has ended; every rank's output was kept in its output folder {}{limit}: {}",
        kept.folder,
        kept.files.join(", ")
    ))
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

/// Reads one rank's log. The engine of `volcano-runner logs`, also behind the logs bridge of
/// proxy-sync ([`crate::proxy::bridge`]).
#[derive(Clone)]
pub struct RankReader {
    pods: Api<Pod>,
    jobs: Api<VolcanoJob>,
    job_id: String,
    since: Option<SignedDuration>,
    /// `<prefix>lifecycleState`: the end the monitor recorded.
    lifecycle_key: String,
}

impl RankReader {
    /// A reader of job `job_id`'s ranks in `namespace`, from `since` ago (`None`: the whole log);
    /// `lifecycle_key` is `<prefix>lifecycleState` under the configured prefix (the end the monitor records).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        job_id: &str,
        since: Option<SignedDuration>,
        lifecycle_key: String,
    ) -> Self {
        Self {
            pods: Api::namespaced(client.clone(), namespace),
            jobs: Api::namespaced(client, namespace),
            job_id: job_id.to_owned(),
            since,
            lifecycle_key,
        }
    }

    /// Where the output was kept, when the job has ended and kept it (read now).
    async fn ended_note(&self, prefix: &str, ranks: u32) -> Option<String> {
        let job = self.jobs.get_opt(&vcjob_name(&self.job_id)).await.ok()??;
        if !has_ended(&job, &self.lifecycle_key) {
            return None;
        }
        kept_note(&self.job_id, &job, prefix, ranks)
    }

    fn params(&self, follow: bool, resume: &Resume) -> LogParams {
        let (since_seconds, since_time) = match resume.since() {
            Some(t) => (None, Some(t)),
            None => (self.since.map(|d| d.as_secs().max(1)), None),
        };
        LogParams {
            container: Some(USER_CONTAINER.to_owned()),
            follow,
            timestamps: true,
            since_seconds,
            since_time,
            ..LogParams::default()
        }
    }

    /// The whole log so far; `Err` says in one line why there is none.
    async fn read(&self, rank: u32) -> Result<Vec<Line>, String> {
        let pod = pod_name(&self.job_id, rank);
        let text = self
            .pods
            .logs(&pod, &self.params(false, &Resume::default()))
            .await
            .map_err(|e| why_no_log(&pod, &e))?;
        Ok(text.lines().map(|l| Line::parse(rank, l)).collect())
    }

    /// Sends the rank's lines as they come until its program has ended (or `stop`).
    pub async fn follow(&self, rank: u32, out: mpsc::Sender<Line>, stop: CancellationToken) {
        let pod = pod_name(&self.job_id, rank);
        let mut resume = Resume::default();
        let mut told_waiting = false;
        loop {
            resume.restart();
            match self
                .pods
                .log_stream(&pod, &self.params(true, &resume))
                .await
            {
                Ok(stream) => {
                    let mut lines = stream.lines();
                    loop {
                        let next = tokio::select! {
                            () = stop.cancelled() => return,
                            next = lines.next() => next,
                        };
                        let Some(Ok(raw)) = next else { break };
                        let line = Line::parse(rank, &raw);
                        if resume.admit(&line) && out.send(line).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    if !told_waiting {
                        eprintln!("[rank {rank}] waiting: {}", why_no_log(&pod, &e));
                        told_waiting = true;
                    }
                }
            }
            match self.ended(&pod).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => eprintln!("[rank {rank}] {e}"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Whether no more lines can come from this rank: its pod has finished, or it is gone and so is
    /// its job.
    async fn ended(&self, pod: &str) -> Result<bool, String> {
        match self.pods.get_opt(pod).await {
            Ok(Some(p)) => Ok(p
                .status
                .and_then(|s| s.phase)
                .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")),
            Ok(None) => match self.jobs.get_opt(&vcjob_name(&self.job_id)).await {
                Ok(None) => Ok(true),
                Ok(Some(job)) => Ok(has_ended(&job, &self.lifecycle_key)),
                Err(e) => Err(format!("cannot read job {}: {e}", self.job_id)),
            },
            Err(e) => Err(format!("cannot read pod {pod}: {e}")),
        }
    }
}

/// Why a log could not be read, in one line.
fn why_no_log(pod: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => {
            format!("pod {pod} does not exist (yet, or any more)")
        }
        kube::Error::Api(s) => s.message.clone(),
        e => format!("cannot read the log of pod {pod}: {e}"),
    }
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

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn raw(s: i64, text: &str) -> String {
        format!("{} {text}", at(s).strftime("%Y-%m-%dT%H:%M:%S.%9fZ"))
    }

    #[test]
    fn a_line_keeps_its_time_and_text_and_spaces() {
        let l = Line::parse(3, &raw(5, "loss 0.25  (epoch 2)"));
        assert_eq!(l.at, Some(at(5)));
        assert_eq!(l.text, "loss 0.25  (epoch 2)");
        assert_eq!(l.render(false), "[rank 3] loss 0.25  (epoch 2)");
        assert!(
            l.render(true)
                .starts_with("[rank 3] 2027-01-15T08:00:05.000Z loss")
        );
        let plain = Line::parse(1, "no time here");
        assert_eq!((plain.at, plain.text.as_str()), (None, "no time here"));
    }

    #[test]
    fn ranks_are_interleaved_by_time_and_each_keeps_its_order() {
        let r0 = vec![
            Line::parse(0, &raw(0, "a")),
            Line::parse(0, &raw(10, "c")),
            Line::parse(0, "untimed after c"),
            Line::parse(0, &raw(10, "d")),
        ];
        let r1 = vec![Line::parse(1, &raw(5, "b")), Line::parse(1, &raw(10, "c1"))];
        let merged: Vec<String> = interleave(vec![r1, r0])
            .iter()
            .map(|l| l.render(false))
            .collect();
        assert_eq!(
            merged,
            [
                "[rank 0] a",
                "[rank 1] b",
                "[rank 0] c",
                "[rank 0] untimed after c",
                "[rank 0] d",
                "[rank 1] c1",
            ]
        );
    }

    #[test]
    fn a_resumed_read_prints_only_what_is_new() {
        let mut r = Resume::default();
        let first = [raw(1, "a"), raw(2, "b"), raw(2, "c")];
        for l in &first {
            assert!(r.admit(&Line::parse(0, l)));
        }
        assert_eq!(r.since(), Some(at(2)));
        // The second read starts at the second of the last line: b and c come again, then d is new.
        r.restart();
        let again: Vec<bool> = [raw(2, "b"), raw(2, "c"), raw(2, "d"), raw(3, "e")]
            .iter()
            .map(|l| r.admit(&Line::parse(0, l)))
            .collect();
        assert_eq!(again, [false, false, true, true]);
        r.restart();
        assert!(!r.admit(&Line::parse(0, &raw(3, "e"))));
        assert!(!r.admit(&Line::parse(0, &raw(1, "a"))));
    }

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
