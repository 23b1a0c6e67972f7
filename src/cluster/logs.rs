//! Reading a job's logs through the Kubernetes API, rank by rank: the engine of `volcano-runner logs`
//! (`cli::logs`, which prints) and of proxy-sync's logs bridge (`proxy::bridge`, which streams to a
//! browser). It lives here, below both, so that neither imports the other.
//!
//! Each rank's log is read with the kubelet's timestamps ([`Line`]), merged across ranks by them
//! ([`interleave`]), and followed across dropped streams without repeating a line ([`Resume`]); a rank
//! is followed until its program has ended ([`has_ended`]).

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pipeline::names::{USER_CONTAINER, pod_name, vcjob_name};
use crate::pipeline::plugins::output_files;
use crate::volcano::VolcanoJob;

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

/// Reads one rank's log. The engine of `volcano-runner logs`, also behind the logs bridge of
/// proxy-sync (`proxy::bridge`).
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
    pub async fn ended_note(&self, prefix: &str, ranks: u32) -> Option<String> {
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
    pub async fn read(&self, rank: u32) -> Result<Vec<Line>, String> {
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
}
