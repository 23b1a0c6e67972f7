//! `volcano-runner job <jobId> [-o json]` and `volcano-runner jobs [--state S] [--owner O] [-o json]`:
//! what is recorded about jobs, read from their durable record, the VolcanoJob and its annotations
//! (docs/ops.md, "What happened to a job").
//!
//! Nothing here reads pods, logs or events: one list call answers either command (a field selector on the
//! job's name for `job`, the managed-job selector for `jobs`), so they work the same against a real
//! cluster and the simulator, while the job waits, runs, or is kept as the record of its submission after
//! its end.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::CliError;
use super::run::{load_config, operator_client};
use crate::durable::AnnotationKeys;
use crate::durable::annotations::parse_millis;
use crate::durable::history::{self, RestartEntry, StatusEntry};
use crate::monitor::record::{Outcome, Published, RankCode, Record};
use crate::pipeline::names::{job_id_from_vcjob_name, vcjob_name};
use crate::volcano::VolcanoJob;

/// How the answer is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// The job's id, as in its SubmitJob.
    #[arg(value_parser = super::logs::parse_job_id)]
    pub job_id: String,
    /// The job's namespace, when the same job id exists under two owners.
    #[arg(short, long, value_parser = super::logs::parse_namespace)]
    pub namespace: Option<String>,
    /// `text` or `json`.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The cluster: `auto` (in-cluster, else KUBECONFIG), an http(s):// URL, or `sim` (the simulator of
    /// the runner started on this machine). Default: `[cluster] target`.
    #[arg(long)]
    pub cluster: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    /// Only jobs in this state.
    #[arg(long, value_enum)]
    pub state: Option<State>,
    /// Only jobs of this owner: a user or a project, as in the SubmitJob.
    #[arg(long)]
    pub owner: Option<String>,
    /// `text` or `json`.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// As for `job`.
    #[arg(long)]
    pub cluster: Option<String>,
}

/// Where a job is in its life, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    /// Accepted, not started yet.
    #[value(alias = "queued")]
    Queued,
    /// Started (and not ended).
    #[value(alias = "running")]
    Running,
    /// Ended: every rank exited 0.
    #[value(alias = "success")]
    Success,
    /// Ended otherwise: a rank's exit code, a disruption, an image that cannot be pulled, ...
    #[value(alias = "failure")]
    Failure,
    /// Its time allocation ran out.
    #[value(alias = "expired")]
    Expired,
    /// Cancelled by its owner.
    #[value(alias = "cancelled")]
    Cancelled,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::Success => "SUCCESS",
            Self::Failure => "FAILURE",
            Self::Expired => "EXPIRED",
            Self::Cancelled => "CANCELLED",
        }
    }

    fn of(outcome: Option<&Outcome>, published: Published) -> Self {
        use crate::monitor::record::Terminal;
        // A decided end is the job's state even before it is published: it is what will be.
        let terminal = outcome.map(|o| o.state).or(match published {
            Published::Ended(t) => Some(t),
            _ => None,
        });
        match (terminal, published) {
            (Some(Terminal::Success), _) => Self::Success,
            (Some(Terminal::Failure), _) => Self::Failure,
            (Some(Terminal::Expired), _) => Self::Expired,
            (Some(Terminal::Cancelled), _) => Self::Cancelled,
            (None, Published::Running) => Self::Running,
            (None, _) => Self::Queued,
        }
    }
}

/// Everything recorded about one job.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    pub job_id: String,
    pub namespace: String,
    /// The VolcanoJob's name (`j-<jobId>`).
    pub name: String,
    pub state: State,
    /// Whether the end was published (the terminal event went out); false while it is being told.
    pub end_published: bool,
    pub owner: Owner,
    pub product: Product,
    pub ranks: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application: Option<String>,
    /// Where the system calls of a traced job are recorded (`SubmitJob.traced`, `[pipeline.traced]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traced: Option<Traced>,
    /// Why the job is sealed (`submission`, `product:<p>`, `project:<p>`), when it is
    /// ([`crate::pipeline::sealed`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
    /// When the runner accepted the submission and created the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_at: Option<Timestamp>,
    /// The runner that accepted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_by: Option<String>,
    /// Every transition recorded, in the order of the job's life (accepted, waiting, started, restarts,
    /// end). Container times have whole seconds, so a start may read a few ms before its acceptance.
    pub history: Vec<HistoryEntry>,
    /// The status events told while the job waited: queue position and estimated start.
    pub waiting: Vec<Waiting>,
    /// The first start of the job (a restart does not move it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_allocation_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiry: Option<Timestamp>,
    /// Request ids of the extensions applied, oldest first.
    pub extensions: Vec<String>,
    pub restarts: Vec<Restart>,
    pub accounting: Accounting,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeView>,
    /// Why the runner deleted the job, when it did (`expired`, `cancelled`, ...), and its words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_cause: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_reason: Option<String>,
    pub volcano: VolcanoView,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Product {
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    pub cpu: Option<u32>,
    pub memory_gib: Option<u32>,
    pub gpu: Option<u32>,
    /// Each rank has a node to itself (and is charged a whole node).
    pub exclusive_nodes: bool,
}

/// A traced job's trace.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Traced {
    /// Why it is traced: the submission asked, or the operator traces its product or project.
    pub why: String,
    /// The trace folder and every rank's file, as storage paths, and the bound per file.
    pub folder: String,
    pub files: Vec<String>,
    pub max_bytes: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub at: Timestamp,
    /// `QUEUED`, `WAITING`, `RUNNING`, `RESTARTING`, or the terminal state.
    pub state: String,
    pub text: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    pub at: Timestamp,
    pub reason: String,
    pub text: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub queue: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs_ahead: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_start_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub estimate_basis: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    /// The attempt that began with it (2 for the first restart).
    pub attempt: i32,
    pub at: Timestamp,
    pub cause: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Accounting {
    pub period_ms: Option<u64>,
    /// Ticks published (`<jobId>/0` .. `<jobId>/<n-1>`).
    pub ticks: u64,
    /// The final tick (ending at the real end) was published.
    pub final_tick: bool,
    /// What the ticks published charge in all, in ms of run time (the sum of their durations).
    pub charged_ms: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeView {
    pub state: String,
    pub reason: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    pub ended_at: Timestamp,
    pub exit_codes: Vec<RankCode>,
}

impl OutcomeView {
    fn of(o: &Outcome) -> Self {
        Self {
            state: o.state.as_str().to_owned(),
            reason: o.reason.clone(),
            status: o.status.clone(),
            started_at: o.started(),
            ended_at: o.ended(),
            exit_codes: o.exit_codes.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolcanoView {
    pub phase: String,
    /// Volcano's restarts of the whole job.
    pub retry_count: i32,
    pub max_attempts: i32,
    /// Set once the job was asked to end (a cancel, an expiry: `terminationAt`; or deleted by an older
    /// runner): its pods go, the VolcanoJob is the record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Timestamp>,
    /// Until when Volcano keeps the finished job (its `ttlSecondsAfterFinished` after it finished).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<Timestamp>,
}

/// Reads one job's record into a [`JobView`]. `None` when the object is not a runner's job.
pub fn view(job: &VolcanoJob, keys: &AnnotationKeys) -> Option<JobView> {
    let name = job.metadata.name.clone()?;
    let job_id = job_id_from_vcjob_name(&name)?.to_owned();
    let empty = BTreeMap::new();
    let a = job.metadata.annotations.as_ref().unwrap_or(&empty);
    let get = |k: &str| a.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let text = |k: &str| get(k).map(str::to_owned);
    let number = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
    let small = |k: &str| number(k).and_then(|v| u32::try_from(v).ok());
    let time = |k: &str| get(k).and_then(parse_millis);

    let record = Record::read(job, keys);
    let state = State::of(record.outcome.as_ref(), record.published);
    let accepted_at =
        time(&keys.accepted_at).or_else(|| job.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let accepted_by = text(&keys.accepted_by);
    let started_at = time(&keys.job_start);
    let waiting = waiting_of(get(&keys.status_log));
    let restarts = restarts_of(get(&keys.restart_log));
    let period_ms = number(&keys.accounting_period);
    let ticks = number(&keys.accounted_ticks).unwrap_or(0);
    let final_tick = get(&keys.accounting_final) == Some("true");
    let charged_ms = charged_ms(
        time(&keys.accounted_until),
        started_at,
        period_ms,
        ticks,
        final_tick,
    );
    let outcome = record.outcome.as_ref().map(OutcomeView::of);
    let history = history_of(
        accepted_at.map(|at| (at, accepted_by.as_deref())),
        &waiting,
        started_at,
        &restarts,
        outcome.as_ref(),
    );

    let extensions = get(&keys.extensions)
        .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
        .unwrap_or_default();
    let ranks = small(&keys.replicas).unwrap_or_else(|| {
        job.spec
            .tasks
            .iter()
            .map(|t| t.replicas.max(0) as u32)
            .sum()
    });
    Some(JobView {
        job_id,
        namespace: job.metadata.namespace.clone().unwrap_or_default(),
        name,
        state,
        end_published: matches!(record.published, Published::Ended(_)),
        owner: Owner {
            user: text(&keys.owner_user),
            project: text(&keys.owner_project),
        },
        product: Product {
            id: text(&keys.product_id),
            category: text(&keys.product_category),
            cpu: small(&keys.product_cpu),
            memory_gib: small(&keys.product_memory_gib),
            gpu: small(&keys.product_gpu),
            exclusive_nodes: get(&keys.exclusive_nodes) == Some("true"),
        },
        ranks,
        application: text(&keys.application),
        traced: traced(job, &keys.prefix, ranks),
        sealed: text(&keys.sealed),
        accepted_at,
        accepted_by,
        history,
        waiting,
        started_at,
        time_allocation_ms: number(&keys.max_time),
        expiry: time(&keys.expiry),
        extensions,
        restarts,
        accounting: Accounting {
            period_ms,
            ticks,
            final_tick,
            charged_ms,
        },
        outcome,
        termination_cause: text(&keys.termination_cause),
        termination_reason: record.termination_reason,
        volcano: VolcanoView {
            phase: job.phase().to_string(),
            retry_count: job.retries(),
            max_attempts: job.max_attempts(),
            released_at: crate::cluster::end::terminated_at(job, keys),
            kept_until: kept_until(job),
        },
    })
}

/// The run time charged: from the start to `accountedUntil`, or, on a record written before
/// `accountedUntil` was, every tick but the final one as a whole period.
fn charged_ms(
    accounted_until: Option<Timestamp>,
    started_at: Option<Timestamp>,
    period_ms: Option<u64>,
    ticks: u64,
    final_tick: bool,
) -> u64 {
    match (accounted_until, started_at, period_ms, final_tick) {
        (Some(until), Some(start), _, _) => {
            u64::try_from(until.as_millisecond() - start.as_millisecond()).unwrap_or(0)
        }
        (None, _, Some(period), false) => ticks * period,
        _ => 0,
    }
}

/// The waiting history of a job's status log (its annotation's value).
fn waiting_of(log: Option<&str>) -> Vec<Waiting> {
    history::read::<StatusEntry>(log)
        .into_iter()
        .map(|e| Waiting {
            at: at_ms(e.at),
            reason: e.reason,
            text: e.text,
            queue: e.queue,
            jobs_ahead: e.jobs_ahead,
            estimated_start_at: e.estimated_start_at.map(at_ms),
            estimate_basis: e.estimate_basis,
        })
        .collect()
}

/// The restarts of a job's restart log (its annotation's value).
fn restarts_of(log: Option<&str>) -> Vec<Restart> {
    history::read::<RestartEntry>(log)
        .into_iter()
        .map(|e| Restart {
            attempt: e.attempt,
            at: at_ms(e.at),
            cause: e.cause,
        })
        .collect()
}

/// The instant of a log entry's milliseconds (the epoch when out of range).
fn at_ms(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The job's history in order of what happened: accepted (when, by which runner), each time it was
/// told waiting, started, each restart, its outcome.
fn history_of(
    accepted: Option<(Timestamp, Option<&str>)>,
    waiting: &[Waiting],
    started_at: Option<Timestamp>,
    restarts: &[Restart],
    outcome: Option<&OutcomeView>,
) -> Vec<HistoryEntry> {
    let mut history = Vec::new();
    if let Some((at, accepted_by)) = accepted {
        history.push(HistoryEntry {
            at,
            state: "QUEUED".into(),
            text: match accepted_by {
                Some(by) => format!("accepted by runner {by}"),
                None => "accepted".into(),
            },
        });
    }
    for w in waiting {
        history.push(HistoryEntry {
            at: w.at,
            state: "WAITING".into(),
            text: w.text.clone(),
        });
    }
    if let Some(at) = started_at {
        history.push(HistoryEntry {
            at,
            state: "RUNNING".into(),
            text: "started (its first rank's program began)".into(),
        });
    }
    for r in restarts {
        history.push(HistoryEntry {
            at: r.at,
            state: "RESTARTING".into(),
            text: format!("restarted after {} (attempt {})", r.cause, r.attempt),
        });
    }
    if let Some(o) = outcome {
        history.push(HistoryEntry {
            at: o.ended_at,
            state: o.state.clone(),
            text: format!("{} ({})", o.status, o.reason),
        });
    }
    history
}

/// A traced job's trace, from its annotations.
fn traced(job: &VolcanoJob, prefix: &str, ranks: u32) -> Option<Traced> {
    use crate::pipeline::plugins::traced;
    let annotations = job.metadata.annotations.as_ref();
    let why = traced::reason(annotations, prefix)?;
    let kept = traced::location(annotations, prefix, ranks)?;
    Some(Traced {
        why,
        folder: kept.folder,
        files: kept.files,
        max_bytes: kept.max_bytes,
    })
}

/// When Volcano's garbage collector deletes the finished job: `ttlSecondsAfterFinished` after the
/// transition to its finished phase. `None` while it has not finished, or without a TTL.
fn kept_until(job: &VolcanoJob) -> Option<Timestamp> {
    let ttl = job.spec.ttl_seconds_after_finished?;
    let state = &job.status.as_ref()?.state;
    if !state.phase.is_finished() {
        return None;
    }
    let finished = state.last_transition_time.as_ref()?.0;
    finished
        .checked_add(jiff::SignedDuration::from_secs(i64::from(ttl)))
        .ok()
}

/// `1h02m03s` for a span in ms.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        format!("{h}h{m:02}m{s:02}s")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{}.{:03}s", s, ms % 1000)
    }
}

impl JobView {
    fn owner_text(&self) -> String {
        match (&self.owner.user, &self.owner.project) {
            (Some(u), Some(p)) => format!("{u} (project {p})"),
            (Some(u), None) => u.clone(),
            (None, Some(p)) => format!("project {p}"),
            (None, None) => "-".into(),
        }
    }

    fn product_text(&self) -> String {
        let p = &self.product;
        let mut text = p.id.clone().unwrap_or_else(|| "-".into());
        if let Some(c) = &p.category {
            text.push_str(&format!(" ({c})"));
        }
        let each = [
            p.cpu.map(|c| format!("{c} vCPU")),
            p.memory_gib.map(|m| format!("{m} GiB")),
            p.gpu.filter(|g| *g > 0).map(|g| format!("{g} GPU")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>();
        if !each.is_empty() {
            text.push_str(&format!(": {} per rank", each.join(", ")));
        }
        if p.exclusive_nodes {
            text.push_str(", a whole node each");
        }
        text
    }

    /// The text `job` prints.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k:<14}{v}\n"));
        line(
            "Job:",
            format!("{} ({}/{})", self.job_id, self.namespace, self.name),
        );
        let mut state = self.state.as_str().to_owned();
        if self.outcome.is_some() && !self.end_published {
            state.push_str(" (decided; its end is being published)");
        }
        line("State:", state);
        line("Owner:", self.owner_text());
        line("Product:", self.product_text());
        line("Ranks:", self.ranks.to_string());
        if let Some(app) = &self.application {
            line("Application:", app.clone());
        }
        if let Some(t) = &self.traced {
            line(
                "Traced:",
                format!(
                    "yes ({}): every rank's system calls in {} (the first {} bytes of each: {})",
                    t.why,
                    t.folder,
                    t.max_bytes,
                    t.files.join(", ")
                ),
            );
        }
        if let Some(why) = &self.sealed {
            let why = crate::pipeline::sealed::Why::parse(why);
            line("Network:", crate::pipeline::sealed::describe(&why));
        }
        line(
            "Accepted:",
            match (&self.accepted_at, &self.accepted_by) {
                (Some(at), Some(by)) => format!("{at} by runner {by}"),
                (Some(at), None) => at.to_string(),
                _ => "-".into(),
            },
        );
        if let Some(at) = self.started_at {
            line("Started:", at.to_string());
        }
        line(
            "Time limit:",
            match (self.time_allocation_ms, self.expiry) {
                (Some(ms), Some(at)) => format!("{} (expires {at})", span(ms)),
                (Some(ms), None) => span(ms),
                _ => "none".into(),
            },
        );
        if !self.extensions.is_empty() {
            line("Extensions:", self.extensions.join(", "));
        }
        line("Charged:", self.charged_text());
        line("Volcano:", self.volcano_text());
        if let Some(o) = &self.outcome {
            line(
                "Outcome:",
                format!("{} ({}): {}", o.state, o.reason, o.status),
            );
            if let Some(at) = o.started_at {
                line("Ran:", format!("{at} to {}", o.ended_at));
            } else {
                line("Ended:", o.ended_at.to_string());
            }
            if !o.exit_codes.is_empty() {
                line(
                    "Exit codes:",
                    o.exit_codes
                        .iter()
                        .map(|c| format!("rank {}: {}", c.rank, c.code))
                        .collect::<Vec<_>>()
                        .join(", "),
                );
            }
        }
        if let Some(cause) = &self.termination_cause {
            let reason = self
                .termination_reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            line("Stopped by:", format!("the runner ({cause}){reason}"));
        }
        out.push_str(&self.history_text());
        out
    }

    /// What the accounting charged: ticks, their period, the run time.
    fn charged_text(&self) -> String {
        let a = &self.accounting;
        format!(
            "{} tick{} ({}{}) = {} of run time",
            a.ticks,
            if a.ticks == 1 { "" } else { "s" },
            a.period_ms
                .map_or_else(|| "-".into(), |p| format!("{} each", span(p))),
            if a.final_tick {
                ", the last ending at the real end"
            } else {
                ""
            },
            span(a.charged_ms)
        )
    }

    /// Volcano's view: phase, restarts, released and kept.
    fn volcano_text(&self) -> String {
        format!(
            "phase {}, {} restart{} of {} attempts{}{}",
            self.volcano.phase,
            self.volcano.retry_count,
            if self.volcano.retry_count == 1 {
                ""
            } else {
                "s"
            },
            self.volcano.max_attempts,
            self.volcano
                .released_at
                .map(|at| format!("; pods released at {at}, the job kept as its record"))
                .unwrap_or_default(),
            self.volcano
                .kept_until
                .map(|at| format!(" until {at}"))
                .unwrap_or_default()
        )
    }

    /// The history, then what the job was told while it waited.
    fn history_text(&self) -> String {
        let mut out = String::from("History:\n");
        for h in &self.history {
            out.push_str(&format!("  {}  {:<10} {}\n", h.at, h.state, h.text));
        }
        if !self.waiting.is_empty() {
            out.push_str("While it waited:\n");
            for w in &self.waiting {
                let ahead = w
                    .jobs_ahead
                    .map(|n| format!("{n} ahead in {}", w.queue))
                    .unwrap_or_else(|| format!("queue {}", w.queue));
                let estimate = w
                    .estimated_start_at
                    .map(|at| format!(", start by {at}"))
                    .unwrap_or_default();
                out.push_str(&format!("  {}  {ahead}{estimate}\n", w.at));
            }
        }
        out
    }
}

/// `job <jobId>`.
pub async fn run_job(args: JobArgs, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = load_config(config, args.cluster.as_deref())?;
    let client = operator_client(&config).await?;
    let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
    let name = vcjob_name(&args.job_id);
    let api: Api<VolcanoJob> = match &args.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let found = api
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(|e| CliError::Other(format!("cluster: looking up job {}: {e}", args.job_id)))?;
    let mut views: Vec<JobView> = found.items.iter().filter_map(|j| view(j, &keys)).collect();
    let view = match views.len() {
        0 => {
            return Err(CliError::Other(format!(
                "no job {} in the cluster (no VolcanoJob {name}{}): it was never accepted, or it ended \
                 more than [cluster] ended_job_retention ago and its record is gone. `volcano-runner jobs` \
                 lists the jobs there are",
                args.job_id,
                args.namespace
                    .as_ref()
                    .map(|ns| format!(" in namespace {ns}"))
                    .unwrap_or_default()
            )));
        }
        1 => views.remove(0),
        _ => {
            return Err(CliError::Other(format!(
                "job id {} exists in namespaces {}: say which with --namespace",
                args.job_id,
                views
                    .iter()
                    .map(|v| v.namespace.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    };
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&view).unwrap_or_default()
        ),
        Output::Text => print!("{}", view.text()),
    }
    Ok(ExitCode::SUCCESS)
}

/// `jobs`.
pub async fn run_jobs(args: JobsArgs, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = load_config(config, args.cluster.as_deref())?;
    let client = operator_client(&config).await?;
    let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
    let api: Api<VolcanoJob> = Api::all(client);
    let listed = api
        .list(&ListParams::default().labels(&config.cluster.managed_selector))
        .await
        .map_err(|e| CliError::Other(format!("cluster: listing the jobs: {e}")))?;
    let mut views: Vec<JobView> = listed
        .items
        .iter()
        .filter_map(|j| view(j, &keys))
        .filter(|v| args.state.is_none_or(|s| v.state == s))
        .filter(|v| {
            args.owner.as_ref().is_none_or(|o| {
                v.owner.user.as_ref() == Some(o) || v.owner.project.as_ref() == Some(o)
            })
        })
        .collect();
    views.sort_by(|a, b| {
        (a.accepted_at, &a.namespace, &a.job_id).cmp(&(b.accepted_at, &b.namespace, &b.job_id))
    });
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&views).unwrap_or_default()
        ),
        Output::Text => print!("{}", table(&views)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The `jobs` table.
fn table(views: &[JobView]) -> String {
    if views.is_empty() {
        return "no job matches\n".to_owned();
    }
    let mut out = format!(
        "{:<24} {:<26} {:<9} {:<20} {:<16} {:>5} {:>8} {:<20}\n",
        "JOB", "NAMESPACE", "STATE", "OWNER", "PRODUCT", "RANKS", "CHARGED", "ACCEPTED"
    );
    for v in views {
        out.push_str(&format!(
            "{:<24} {:<26} {:<9} {:<20} {:<16} {:>5} {:>8} {:<20}\n",
            v.job_id,
            v.namespace,
            v.state.as_str(),
            v.owner
                .project
                .as_ref()
                .or(v.owner.user.as_ref())
                .map_or("-", |s| s),
            v.product.id.as_deref().unwrap_or("-"),
            v.ranks,
            span(v.accounting.charged_ms),
            v.accepted_at
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_else(|| "-".into()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volcano::VolcanoJob;

    fn job(annotations: &[(&str, String)]) -> VolcanoJob {
        let mut job = VolcanoJob::default();
        job.metadata.name = Some("j-4817".into());
        job.metadata.namespace = Some("ucloud-alice".into());
        job.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        );
        job
    }

    #[test]
    fn a_sealed_job_says_so_and_why() {
        let k = AnnotationKeys::new("ucloud.dk/");
        let sealed = view(
            &job(&[
                (&k.owner_user, "carol".into()),
                (&k.sealed, "project:registry-study".into()),
            ]),
            &k,
        )
        .unwrap();
        assert_eq!(sealed.sealed.as_deref(), Some("project:registry-study"));
        assert!(
            sealed.text().contains(
                "Network:      sealed (the operator seals every job of project registry-study): no network beyond its own ranks\n"
            ),
            "{}",
            sealed.text()
        );
        let json = serde_json::to_value(&sealed).unwrap();
        assert_eq!(json["sealed"], "project:registry-study");
        let open = view(&job(&[(&k.owner_user, "carol".into())]), &k).unwrap();
        assert!(!open.text().contains("Network:"));
        assert!(serde_json::to_value(&open).unwrap().get("sealed").is_none());
    }

    #[test]
    fn an_ended_job_reads_as_its_whole_story() {
        let k = AnnotationKeys::new("ucloud.dk/");
        let outcome = Outcome {
            state: crate::monitor::record::Terminal::Failure,
            reason: "exit_code".into(),
            status: "Rank 1 exited with code 3".into(),
            started_at: Some(120_000),
            ended_at: 250_500,
            exit_codes: vec![RankCode { rank: 0, code: 0 }, RankCode { rank: 1, code: 3 }],
            log_tails: vec![],
        };
        let job = job(&[
            (&k.owner_user, "alice".into()),
            (&k.product_id, "u1-standard".into()),
            (&k.replicas, "2".into()),
            (&k.accepted_at, "100000".into()),
            (&k.accepted_by, "runner-a".into()),
            (&k.job_start, "120000".into()),
            (&k.accounting_period, "60000".into()),
            (&k.accounted_ticks, "3".into()),
            (&k.accounting_final, "true".into()),
            (&k.accounted_until, "250500".into()),
            (&k.lifecycle_state, "FAILURE".into()),
            (&k.outcome, outcome.to_annotation()),
            (
                &k.status_log,
                history::append_status(
                    None,
                    StatusEntry {
                        at: 110_000,
                        reason: "queued".into(),
                        text: "waiting in queue default".into(),
                        queue: "default".into(),
                        jobs_ahead: Some(2),
                        estimated_start_at: Some(130_000),
                        estimate_basis: String::new(),
                    },
                ),
            ),
            (
                &k.restart_log,
                history::append_restart(
                    None,
                    RestartEntry {
                        attempt: 2,
                        at: 200_000,
                        cause: "rank 1's node n3 was lost".into(),
                    },
                ),
            ),
        ]);
        let v = view(&job, &k).expect("a runner's job");
        assert_eq!(v.job_id, "4817");
        assert_eq!(v.state, State::Failure);
        assert!(v.end_published);
        assert_eq!(v.accounting.charged_ms, 130_500);
        assert_eq!(
            v.history
                .iter()
                .map(|h| h.state.as_str())
                .collect::<Vec<_>>(),
            ["QUEUED", "WAITING", "RUNNING", "RESTARTING", "FAILURE"]
        );
        let text = v.text();
        assert!(text.contains("rank 1: 3"), "{text}");
        assert!(text.contains("2 ahead in default"), "{text}");
        assert!(text.contains("by runner runner-a"), "{text}");
        assert!(
            text.contains("3 ticks (1m00s each, the last ending at the real end) = 2m10s"),
            "{text}"
        );
    }

    #[test]
    fn a_decided_end_is_the_state_before_it_is_published_and_other_objects_are_not_jobs() {
        let k = AnnotationKeys::new("ucloud.dk/");
        let outcome = Outcome {
            state: crate::monitor::record::Terminal::Success,
            reason: "success".into(),
            status: "done".into(),
            started_at: None,
            ended_at: 1,
            exit_codes: vec![],
            log_tails: vec![],
        };
        let v = view(
            &job(&[
                (&k.lifecycle_state, "RUNNING".into()),
                (&k.outcome, outcome.to_annotation()),
            ]),
            &k,
        )
        .unwrap();
        assert_eq!(v.state, State::Success);
        assert!(!v.end_published);
        assert!(v.text().contains("being published"));
        let mut other = job(&[]);
        other.metadata.name = Some("not-a-job".into());
        assert!(view(&other, &k).is_none());
        assert_eq!(view(&job(&[]), &k).unwrap().state, State::Queued);
    }
}
