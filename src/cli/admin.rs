//! `volcano-runner admin pause [--reason R] [--wait [--timeout D]] | resume | status [-o json] | queue [--queue Q] [-o json]`: the operator's switches and
//! gauges.
//!
//! - `pause` / `resume` flip the pause switch (a ConfigMap in the runner's namespace) that every runner
//!   watches: while paused, submissions wait in their queue (nothing is rejected) and cancels and
//!   extensions still flow. Runners resume on their own when the switch flips back.
//! - `status` shows the switch, the depth of the submit, control and dead-letter queues (passive declares,
//!   exact right now), the active jobs against `cluster.max_active_jobs`, who holds which shard lease
//!   of the monitoring duty, and `PROBLEM:` lines: the runner namespace missing, dead letters waiting,
//!   shards without a live holder, admitted jobs that can never start.
//! - `maintenance schedule|list|cancel` stores maintenance windows (a ConfigMap each in the runner's
//!   namespace, [`crate::cluster::maintenance`]) that every runner's monitor follows: a running job a
//!   window cuts is warned ahead and ended at its start (see docs/ops.md). `cancel` also moves on or
//!   removes the cancelled window's node taints itself, as the monitor would.
//! - `dead-letters list|show|requeue|drop` reads and settles the dead-letter queue over AMQP alone
//!   ([`super::dead_letters`]); it needs no cluster.
//! - `queue` lists the jobs waiting to start with their estimated start ([`crate::monitor::inputs`]),
//!   from one list each of nodes, pods, PodGroups and managed jobs (an operator's occasional look; the
//!   runners themselves never list pods cluster-wide).

use std::path::Path;
use std::process::ExitCode;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::CliError;
use super::output::Output;
use super::run::{cluster_error, load_config, operator_client};

use crate::cluster::capacity::count_active;
use crate::cluster::labels::COMPONENT;
use crate::cluster::labels::RUNNER_PROBLEM;
use crate::cluster::lease::{COMPONENT_MEMBER, COMPONENT_SHARD};
use crate::cluster::{ClusterError, MaintenanceWindows, PauseState, PauseSwitch, Window};
use crate::config::Config;
use crate::durable::AnnotationKeys;
use crate::monitor::inputs::{ClusterView, QueueEntry, Replaying, forecast_with};
use crate::volcano::{PodGroup, Queue, VolcanoJob};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster: `auto` (in-cluster, else KUBECONFIG), an http(s):// URL, or `sim`: the simulator
    /// inside the runner started on this machine with `run --cluster sim` (it leaves its URL in the
    /// temporary directory). Default: `[cluster] target`.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Stop every runner from taking submissions; they wait in the queue. Cancels and extensions flow.
    Pause {
        /// Why, for whoever looks at `admin status`.
        #[arg(long, default_value = "")]
        reason: String,
        /// Return only once every runner has stopped taking submissions (no consumer left on the
        /// submit queue), printing progress; exit code 2 after `--timeout`.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits (`30s`, `5m`).
        #[arg(long, value_parser = parse_timeout, default_value = "2m", requires = "wait")]
        timeout: std::time::Duration,
    },
    /// Let submissions flow again.
    Resume,
    /// The pause switch, queue depths, active jobs and lease holders.
    Status {
        /// `text` or `json`.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// The dead-letter queue: list and show dead letters with their reasons, requeue them to where they
    /// came from (same message id), or drop them; by message id, `--reason` or `--all`.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(super::dead_letters::DeadLettersCommand),
    /// Maintenance windows: schedule, list, cancel. Every runner follows them: a running job a window
    /// cuts is warned (`[monitor] maintenance_warn_before`) and ended at its start (FAILURE, reason
    /// `maintenance`), charged up to the start.
    #[command(subcommand)]
    Maintenance(MaintenanceCommand),
    /// Jobs waiting to start, per Volcano queue: position, ranks and what each asks for, time limit,
    /// the estimated start and why it waits.
    Queue {
        /// Only this Volcano queue.
        #[arg(long)]
        queue: Option<String>,
        /// `text` or `json`.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum MaintenanceCommand {
    /// Schedule a window; prints its id.
    Schedule {
        /// RFC 3339 (`2026-12-01T06:00:00Z`), `now`, or relative (`+2h`, `+1h30m`).
        #[arg(long)]
        start: String,
        /// As `--start`, relative to now.
        #[arg(long)]
        end: String,
        /// Only these nodes (`n1,n2`); without it, every node. An empty list (`--nodes ""`) is refused.
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Why, shown to the users whose jobs it ends and in `admin status`.
        #[arg(long, default_value = "")]
        reason: String,
        /// Schedule it even over booked starts (docs/bookings.md): the runners then move the bookings it
        /// breaks to other room at the same start, or cancel them, and tell their users.
        #[arg(long)]
        force: bool,
    },
    /// Every window, with its id.
    List {
        /// `text` or `json`.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Remove a window (by the id `schedule` and `list` print).
    Cancel { id: String },
}

/// One window as `list`, `status` and `-o json` show it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowView {
    pub id: String,
    pub start: String,
    pub end: String,
    /// Empty: every node.
    pub nodes: Vec<String>,
    pub reason: Option<String>,
    pub created_by: Option<String>,
    /// `scheduled`, `in progress` or `over`.
    pub state: &'static str,
}

impl WindowView {
    fn of(w: &crate::cluster::Window, now: jiff::Timestamp) -> Self {
        Self {
            id: w.id.clone(),
            start: w.start.to_string(),
            end: w.end.to_string(),
            nodes: w.nodes.iter().cloned().collect(),
            reason: w.reason.clone(),
            created_by: w.created_by.clone(),
            state: if now >= w.end {
                "over"
            } else if now >= w.start {
                "in progress"
            } else {
                "scheduled"
            },
        }
    }

    fn line(&self) -> String {
        let nodes = if self.nodes.is_empty() {
            "every node".to_owned()
        } else {
            self.nodes.join(",")
        };
        let mut text = format!(
            "{}  {} .. {}  {nodes}  ({})",
            self.id, self.start, self.end, self.state
        );
        if let Some(r) = &self.reason {
            text.push_str(&format!(": {r}"));
        }
        text
    }
}

async fn maintenance(
    command: MaintenanceCommand,
    windows: &MaintenanceWindows,
    bookings: &crate::cluster::Bookings,
    client: &kube::Client,
    keys: &AnnotationKeys,
    now: jiff::Timestamp,
) -> Result<(), CliError> {
    use crate::cluster::maintenance::{Window, parse_time};
    match command {
        MaintenanceCommand::Schedule {
            start,
            end,
            nodes,
            reason,
            force,
        } => {
            let invalid =
                |e: crate::cluster::maintenance::WindowError| CliError::Other(e.to_string());
            let start = parse_time("--start", &start, now).map_err(invalid)?;
            let end = parse_time("--end", &end, now).map_err(invalid)?;
            let nodes = crate::cluster::maintenance::node_list(&nodes).map_err(invalid)?;
            let window =
                Window::new(start, end, nodes, Some(reason), &operator(), now).map_err(invalid)?;
            let all = bookings.list().await.map_err(cluster_error)?;
            let broken = crate::cluster::bookings::under_window(&all, &window, now);
            if !broken.is_empty() {
                let names: Vec<String> = broken
                    .iter()
                    .map(|b| format!("{} (from {})", b.job_id, b.start))
                    .collect();
                if !force {
                    return Err(CliError::Other(format!(
                        "the window is over booked starts: {}; schedule it with --force to move or \
                         cancel them (their users are told)",
                        names.join(", ")
                    )));
                }
                println!(
                    "over booked starts (forced): {}; the runners move or cancel them and tell their users",
                    names.join(", ")
                );
            }
            let created = windows.schedule(&window).await.map_err(cluster_error)?;
            let line = WindowView::of(&window, now).line();
            if created {
                println!("scheduled {line}");
            } else {
                println!("already scheduled: {line}");
            }
        }
        MaintenanceCommand::List { output } => {
            let (list, broken) = windows.list().await.map_err(cluster_error)?;
            let views: Vec<WindowView> = list.iter().map(|w| WindowView::of(w, now)).collect();
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&views).unwrap_or_default()
                ),
                Output::Text => {
                    if views.is_empty() {
                        println!("no maintenance window");
                    }
                    for v in &views {
                        println!("{}", v.line());
                    }
                }
            }
            for name in broken {
                eprintln!(
                    "ConfigMap {name} is labelled as a maintenance window but is not a valid one; runners ignore it"
                );
            }
        }
        MaintenanceCommand::Cancel { id } => {
            if windows.cancel(&id).await.map_err(cluster_error)? {
                println!("cancelled maintenance window {id}");
            } else {
                return Err(CliError::Other(format!("no maintenance window {id}")));
            }
            // The runner lifts the cancelled window's taints too; doing it here, with the operator's
            // credentials, frees its nodes at once (and does not need a runner). Best effort.
            match lift_taints(client, windows, &keys.maintenance_taint(), &id, now).await {
                Ok(0) => {}
                Ok(n) => println!("its taint lifted from {n} node(s)"),
                Err(e) => eprintln!(
                    "its node taints were not lifted ({e}); the runners lift them on their own"
                ),
            }
        }
    }
    Ok(())
}

/// Moves the maintenance taints valued `id` (a window just cancelled) on to the next window over their
/// node, or removes them, as the monitor would ([`crate::monitor::maintenance::plan_taints`]), each
/// write guarded by the node's version. Only nodes carrying `id` are touched. Returns the nodes written.
async fn lift_taints(
    client: &kube::Client,
    windows: &MaintenanceWindows,
    key: &str,
    id: &str,
    now: jiff::Timestamp,
) -> Result<usize, ClusterError> {
    use crate::cluster::error::KubeResultExt as _;
    use crate::monitor::reserve::{self, NodeTaints};
    use k8s_openapi::api::core::v1::Node;
    let (listed, _) = windows.list().await?;
    let nodes: Vec<NodeTaints> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .classify(|| "list nodes".to_owned())?
        .items
        .iter()
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key == key && t.value.as_deref() == Some(id))
                })
        })
        .map(NodeTaints::of)
        .collect();
    let planned = crate::monitor::maintenance::plan_taints(&nodes, &listed, key, now);
    let changes = reserve::with_maintenance(Vec::new(), &nodes, planned);
    let applied = reserve::apply(client, &changes).await;
    match applied.failed.into_iter().next() {
        Some((_, e)) if applied.written == 0 => Err(e),
        _ => Ok(applied.written),
    }
}

pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = load_config(config, args.cluster.as_deref())?;
    let command = match args.command {
        // The broker alone: no cluster is needed to read dead letters.
        AdminCommand::DeadLetters(command) => {
            return super::dead_letters::run(command, &config).await;
        }
        other => other,
    };
    let client = operator_client(&config).await?;
    let switch = PauseSwitch::new(client.clone(), &config.cluster);
    let now = jiff::Timestamp::now();
    match command {
        AdminCommand::Pause {
            reason,
            wait,
            timeout,
        } => {
            let state = switch
                .pause(&reason, &operator(), now)
                .await
                .map_err(cluster_error)?;
            println!("{}", describe_pause(&state));
            if wait {
                super::pause_wait::wait(&config, &client, timeout).await?;
            }
        }
        AdminCommand::Resume => {
            let state = switch
                .resume(&operator(), now)
                .await
                .map_err(cluster_error)?;
            println!("{}", describe_pause(&state));
        }
        AdminCommand::Status { output } => {
            let status = status(&config, &client, &switch).await?;
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&status).unwrap_or_default()
                ),
                Output::Text => print!("{}", status.text()),
            }
        }
        AdminCommand::Maintenance(command) => {
            let windows = MaintenanceWindows::new(client.clone(), &config.cluster);
            let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
            let bookings = crate::cluster::Bookings::new(
                client.clone(),
                &config.cluster,
                &config.bookings,
                &keys,
            );
            maintenance(command, &windows, &bookings, &client, &keys, now).await?;
        }
        AdminCommand::Queue { queue, output } => {
            // The windows as the monitor follows them: they cut running jobs and hold gated ones back.
            // Without them the estimates are still worth showing, said to be without them.
            let windows = match MaintenanceWindows::new(client.clone(), &config.cluster)
                .list()
                .await
            {
                Ok((windows, broken)) => {
                    if !broken.is_empty() {
                        eprintln!(
                            "volcano-runner: ConfigMaps labelled as maintenance windows that are not readable as one, left out of the estimates: {}",
                            broken.join(", ")
                        );
                    }
                    windows
                }
                Err(e) => {
                    eprintln!(
                        "volcano-runner: could not list the maintenance windows ({e}); the estimates below do not account for any"
                    );
                    Vec::new()
                }
            };
            let mut entries = waiting_jobs(&client, &config, &windows, now).await?;
            entries.retain(|e| queue.as_ref().is_none_or(|q| &e.queue == q));
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&entries).unwrap_or_default()
                ),
                Output::Text => {
                    print!("{}", queue_text(&entries));
                    print_bookings(&client, &config, now).await;
                }
            }
        }
        // Taken before the cluster client above; here only for completeness.
        AdminCommand::DeadLetters(command) => {
            return super::dead_letters::run(command, &config).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every waiting job with its estimate, from one list of each kind the estimate reads.
async fn waiting_jobs(
    client: &kube::Client,
    config: &Config,
    windows: &[Window],
    now: jiff::Timestamp,
) -> Result<Vec<QueueEntry>, CliError> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let list = ListParams::default();
    let managed = ListParams::default().labels(&config.cluster.managed_selector);
    let (node_api, pod_api) = (
        Api::<Node>::all(client.clone()),
        Api::<Pod>::all(client.clone()),
    );
    let group_api = Api::<PodGroup>::all(client.clone());
    let job_api = Api::<VolcanoJob>::all(client.clone());
    let queue_api = Api::<Queue>::all(client.clone());
    let (nodes, pods, groups, jobs, queues) = futures::try_join!(
        node_api.list(&list),
        pod_api.list(&list),
        group_api.list(&list),
        job_api.list(&managed),
        queue_api.list(&list),
    )
    .map_err(|e| cluster_error(ClusterError::from_kube("list what the estimates read", e)))?;
    let view = ClusterView {
        nodes: &nodes.items,
        pods: &pods.items,
        groups: &groups.items,
        jobs: &jobs.items,
        queues: &queues.items,
    };
    let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
    Ok(forecast_with(
        view,
        windows,
        &keys,
        now,
        Replaying {
            reserve_nodes: config.monitor.reserve_nodes,
            proportion: config.monitor.proportion,
            start_margin: jiff::SignedDuration::try_from(config.monitor.start_margin)
                .unwrap_or_default(),
            queue_timeout: config
                .monitor
                .queue_timeout
                .and_then(|d| jiff::SignedDuration::try_from(d).ok()),
        },
    ))
}

/// Booked starts wait for their time, not in the queue: `admin queue` shows them apart.
async fn print_bookings(client: &kube::Client, config: &Config, now: jiff::Timestamp) {
    let bookings = crate::cluster::Bookings::new(
        client.clone(),
        &config.cluster,
        &config.bookings,
        &AnnotationKeys::new(&config.pipeline.annotation_prefix),
    );
    match bookings.list().await {
        Ok(all) => print!("{}", bookings_text(&all, now)),
        Err(e) => eprintln!("volcano-runner: could not read the bookings ({e})"),
    }
}

/// The bookings not over at `now`, by start: empty when there are none.
fn bookings_text(all: &[crate::cluster::bookings::Booking], now: jiff::Timestamp) -> String {
    let mut live: Vec<_> = all.iter().filter(|b| b.end > now).collect();
    if live.is_empty() {
        return String::new();
    }
    live.sort_by_key(|b| (b.start, b.job_id.clone()));
    let mut out = format!(
        "\n{:<21} {:<21} {:<24} {:<20} {:>5}  NODES\n",
        "BOOKED START", "SET ASIDE UNTIL", "JOB", "OWNER", "RANKS"
    );
    for b in live {
        let mut nodes = b.nodes();
        nodes.dedup();
        out.push_str(&format!(
            "{:<21} {:<21} {:<24} {:<20} {:>5}  {}\n",
            b.start.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            b.end.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            b.job_id,
            b.owner,
            b.ranks.len(),
            nodes.join(",")
        ));
    }
    out
}

/// The waiting jobs as a table, the scheduler's message under each job it concerns.
fn queue_text(entries: &[QueueEntry]) -> String {
    if entries.is_empty() {
        return "no job is waiting to start\n".to_owned();
    }
    let mut out = format!(
        "{:<12} {:>5}  {:<40} {:>5}  {:<26} {:<9} ESTIMATED START\n",
        "QUEUE", "AHEAD", "JOB", "RANKS", "EACH RANK", "LIMIT"
    );
    for e in entries {
        let job = match (&e.job, &e.job_id) {
            (Some(job), Some(id)) => format!("{}/{job} ({id})", e.namespace),
            (Some(job), None) => format!("{}/{job}", e.namespace),
            _ => format!("{}/{} (PodGroup)", e.namespace, e.pod_group),
        };
        let r = e.per_rank;
        let mut each = format!(
            "{} CPU {} GiB",
            r.cpu_milli as f64 / 1000.0,
            r.memory_mib.div_ceil(1024)
        );
        if r.gpu > 0 {
            each.push_str(&format!(" {} GPU", r.gpu));
        }
        if e.whole_nodes {
            each.push_str(", whole node");
        }
        let limit = e.time_allocation_s.map_or_else(
            || "none".to_owned(),
            |s| format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        );
        let estimate = match &e.estimate.start_at {
            Some(at) => format!("{at} ({})", e.estimate.basis),
            None => format!("{}: {}", e.estimate.kind, e.estimate.basis),
        };
        out.push_str(&format!(
            "{:<12} {:>5}  {:<40} {:>5}  {:<26} {:<9} {estimate}\n",
            e.queue, e.jobs_ahead, job, e.ranks, each, limit
        ));
        if let Some(m) = &e.scheduler_message {
            out.push_str(&format!("{:<20}{} scheduler: {m}\n", "", e.phase));
        }
    }
    out
}

/// A positive duration for `--timeout`, in the configuration's notation (`30s`, `5m`).
fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    s.parse::<jiff::SignedDuration>()
        .ok()
        .filter(|d| d.is_positive())
        .and_then(|d| std::time::Duration::try_from(d).ok())
        .ok_or_else(|| format!("{s:?} is not a positive duration such as `30s` or `5m`"))
}

/// `user@host` of whoever runs the command, recorded on the switch.
fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    format!("{user}@{}", host.trim())
}

fn describe_pause(state: &PauseState) -> String {
    let mut text = if state.paused {
        "submissions are PAUSED".to_owned()
    } else {
        "submissions flow".to_owned()
    };
    if let Some(reason) = &state.reason {
        text.push_str(&format!(": {reason}"));
    }
    if let (Some(by), Some(at)) = (&state.changed_by, &state.changed_at) {
        text.push_str(&format!(" (set by {by} at {at})"));
    }
    text
}

/// What `status` reports.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub paused: bool,
    pub pause: String,
    pub queues: Vec<QueueDepth>,
    pub active_jobs: usize,
    pub max_active_jobs: Option<u32>,
    pub shards: Vec<ShardHolder>,
    /// The shard leases (of `[cluster.lease] shards`) that no live runner holds: lapsed, free or missing.
    /// The jobs in them are not monitored.
    pub unheld_shards: Vec<String>,
    /// Managed jobs waiting to start that can never start on this cluster (their estimate says `never`),
    /// as `namespace/name`.
    pub never_start: Vec<String>,
    /// The maintenance windows not over yet, earliest first.
    pub maintenance: Vec<WindowView>,
    /// What keeps the runners from doing their work, in words for an operator (empty when nothing).
    pub problems: Vec<String>,
}

/// One queue, right now.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueDepth {
    pub name: String,
    /// Whether the queue exists in the vhost (else no runner has declared the topology there; ready
    /// and consumers are then 0).
    pub exists: bool,
    /// Messages ready for delivery (not counting those delivered and unacknowledged).
    pub ready: u32,
    pub consumers: u32,
}

/// One shard lease of the monitoring duty.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardHolder {
    pub lease: String,
    pub holder: Option<String>,
    /// Whether the holder renewed it within its duration (else it is up for grabs).
    pub live: bool,
    pub renewed: Option<String>,
}

impl Status {
    fn text(&self) -> String {
        let mut out = format!("pause switch:  {}\n", self.pause);
        let cap = self
            .max_active_jobs
            .map_or_else(|| "no cap".to_owned(), |m| format!("cap {m}"));
        out.push_str(&format!("active jobs:   {} ({cap})\n", self.active_jobs));
        out.push_str("queues:\n");
        for q in &self.queues {
            if q.exists {
                out.push_str(&format!(
                    "  {:<32} {:>7} ready  {:>3} consumers\n",
                    q.name, q.ready, q.consumers
                ));
            } else {
                out.push_str(&format!("  {:<32} (missing)\n", q.name));
            }
        }
        out.push_str("monitoring shards:\n");
        if self.shards.is_empty() && self.problems.is_empty() {
            out.push_str("  (no shard leases: no runner with the monitoring duty has started)\n");
        }
        for s in &self.shards {
            let holder = s.holder.as_deref().unwrap_or("(free)");
            let state = if s.live { "live" } else { "lapsed" };
            out.push_str(&format!("  {:<32} {holder} ({state})\n", s.lease));
        }
        for missing in self
            .unheld_shards
            .iter()
            .filter(|u| !self.shards.iter().any(|s| &s.lease == *u))
        {
            out.push_str(&format!("  {missing:<32} (no lease)\n"));
        }
        if self.maintenance.is_empty() {
            out.push_str("maintenance:   none scheduled\n");
        } else {
            out.push_str("maintenance:\n");
            for w in &self.maintenance {
                out.push_str(&format!("  {}\n", w.line()));
            }
        }
        for problem in &self.problems {
            out.push_str(&format!("PROBLEM: {problem}\n"));
        }
        out
    }
}

async fn status(
    config: &Config,
    client: &kube::Client,
    switch: &PauseSwitch,
) -> Result<Status, CliError> {
    let pause = switch.read().await.map_err(cluster_error)?;
    let active_jobs = count_active(client, &config.cluster)
        .await
        .map_err(cluster_error)?;
    let queues = queue_depths(config).await?;
    let shards = shard_holders(client, config).await?;
    let mut problems = problems(client, config).await?;
    let missing: Vec<&str> = queues
        .iter()
        .filter(|q| !q.exists)
        .map(|q| q.name.as_str())
        .collect();
    if !missing.is_empty() {
        problems.push(missing_queues_problem(&missing, &config.broker));
    }
    let now = jiff::Timestamp::now();
    let windows = match MaintenanceWindows::new(client.clone(), &config.cluster)
        .list()
        .await
    {
        Ok((windows, broken)) => {
            for b in broken {
                problems.push(format!(
                    "ConfigMap {b} is labelled as a maintenance window but is not a valid one; runners ignore it: fix or delete it"
                ));
            }
            windows
        }
        Err(e) => {
            problems.push(format!("could not list the maintenance windows: {e}"));
            Vec::new()
        }
    };
    let maintenance = windows
        .iter()
        .filter(|w| w.end > now)
        .map(|w| WindowView::of(w, now))
        .collect();
    if let Some(dead) = queues
        .iter()
        .find(|q| q.name == config.broker.dead_letter_queue)
        .filter(|q| q.ready > 0)
    {
        problems.push(dead_letter_problem(&dead.name, dead.ready));
    }
    let unheld = unheld_shards(
        &shards,
        &config.cluster.lease.name_prefix,
        config.cluster.lease.shards,
    );
    if !unheld.is_empty() {
        problems.push(unheld_problem(&unheld, config.cluster.lease.shards));
    }
    problems.extend(runner_problems(client, config).await?);
    let mut never_start = Vec::new();
    match waiting_jobs(client, config, &windows, jiff::Timestamp::now()).await {
        Ok(entries) => {
            for e in entries.iter().filter(|e| e.estimate.kind == "never") {
                let Some(job) = &e.job else { continue };
                never_start.push(format!("{}/{job}", e.namespace));
                problems.push(never_start_problem(e, job));
            }
        }
        Err(e) => problems.push(format!(
            "could not look for jobs that can never start (the lists `admin queue` reads): {e}"
        )),
    }
    Ok(Status {
        paused: pause.paused,
        pause: describe_pause(&pause),
        queues,
        active_jobs,
        max_active_jobs: config.cluster.max_active_jobs,
        shards,
        unheld_shards: unheld,
        never_start,
        maintenance,
        problems,
    })
}

/// What live runners say keeps them from their work, on their member leases (e.g. `no queue receives
/// compute.events`), one line per problem with the runners that have it.
async fn runner_problems(client: &kube::Client, config: &Config) -> Result<Vec<String>, CliError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.cluster.namespace);
    let params = ListParams::default().labels(&format!("{COMPONENT}={COMPONENT_MEMBER}"));
    let leases = api
        .list(&params)
        .await
        .map_err(|e| CliError::Other(format!("listing member leases: {e}")))?;
    let now = jiff::Timestamp::now();
    let mut by_problem: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for lease in leases.items {
        let live = super::pause_wait::live(&lease, now);
        let spec = lease.spec.clone().unwrap_or_default();
        let problem = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RUNNER_PROBLEM));
        if let (true, Some(problem)) = (live, problem) {
            let runner = spec
                .holder_identity
                .or(lease.metadata.name)
                .unwrap_or_default();
            by_problem.entry(problem.clone()).or_default().push(runner);
        }
    }
    Ok(by_problem
        .into_iter()
        .map(|(problem, runners)| format!("runner {}: {problem}", runners.join(", ")))
        .collect())
}

/// Queues that are not in the vhost: no runner has declared the topology there (none has started with
/// this broker URL), or it is pre-provisioned and incomplete.
fn missing_queues_problem(missing: &[&str], broker: &crate::broker::BrokerConfig) -> String {
    format!(
        "{} {} not exist in {}: no runner has declared the topology there. A runner declares it when it \
         starts (is one running, with this broker URL?); with [broker] passive = true, import \
         deploy/rabbitmq/definitions.json into the vhost",
        missing.join(", "),
        if missing.len() == 1 { "does" } else { "do" },
        broker.endpoint()
    )
}

/// Dead letters wait for a person: say how many and how to look.
fn dead_letter_problem(queue: &str, ready: u32) -> String {
    format!(
        "{ready} message{} in the dead-letter queue {queue}: submissions, cancels or extensions that \
         were rejected or failed too often; nobody was told about those a runner could not read. Look \
         with `volcano-runner admin dead-letters list`, then requeue or drop them",
        if ready == 1 { "" } else { "s" }
    )
}

/// The shard leases of `0..shards` that no live runner holds: a lease that lapsed, was released, or
/// was never written. Leases beyond `shards` (left by an earlier configuration) are not counted.
fn unheld_shards(holders: &[ShardHolder], prefix: &str, shards: u32) -> Vec<String> {
    (0..shards.max(1))
        .map(|shard| format!("{prefix}-shard-{shard}"))
        .filter(|name| !holders.iter().any(|h| &h.lease == name && h.live))
        .collect()
}

fn unheld_problem(unheld: &[String], shards: u32) -> String {
    format!(
        "{} of {} shards of the monitoring duty have no live holder ({}): the jobs in them are not \
         monitored (no RUNNING, ticks, expiry or end) until a runner with the monitoring duty takes them, \
         within one lease duration of its start. Is one running, and can it reach the cluster? Its \
         /readyz says why not",
        unheld.len(),
        shards.max(1),
        unheld.join(", ")
    )
}

fn never_start_problem(entry: &QueueEntry, job: &str) -> String {
    let id = entry
        .job_id
        .as_ref()
        .map(|id| format!(" (job {id})"))
        .unwrap_or_default();
    format!(
        "{}/{job}{id} was admitted but can never start on this cluster: {}. It waits in queue {} until \
         it is cancelled, its queue timeout ends it, or a node that can hold it joins",
        entry.namespace, entry.estimate.basis, entry.queue
    )
}

/// What the cluster shows is keeping runners from their work: the runner's own namespace missing (no
/// runner could create it, so no lease is written and no job is monitored).
async fn problems(client: &kube::Client, config: &Config) -> Result<Vec<String>, CliError> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let mut problems = Vec::new();
    let name = &config.cluster.namespace;
    match api.get_opt(name).await {
        Ok(Some(_)) => {}
        Ok(None) => problems.push(format!(
            "namespace {name} does not exist: runners keep their shard leases, tombstones and pause \
             switch there, so no job is monitored (no RUNNING, ticks, expiry or end) and cancels \
             cannot be recorded. Runners create it when they may; otherwise create it (kubectl create \
             namespace {name}) or allow the runners' service account to create namespaces. A runner \
             that cannot create it says so in its log (ERROR) and in /readyz."
        )),
        // Not allowed to read namespaces: nothing to conclude.
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        Err(e) => {
            return Err(CliError::Other(format!("reading namespace {name}: {e}")));
        }
    }
    Ok(problems)
}

/// Passive declares of the runner's queues: exact counts now (the management API lags by seconds), and
/// which of them are missing.
async fn queue_depths(config: &Config) -> Result<Vec<QueueDepth>, CliError> {
    let shutdown = CancellationToken::new();
    // Looking at a broker never creates anything on it, and takes the vhost as it is.
    let broker = super::inspect_broker(config, shutdown).await?;
    let c = &config.broker;
    let mut depths = Vec::new();
    for name in [&c.submit_queue, &c.control_queue, &c.dead_letter_queue] {
        let read = super::pause_wait::depth(&broker, name).await;
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                broker.close().await;
                return Err(e);
            }
        };
        let (ready, consumers) = read.unwrap_or_default();
        depths.push(QueueDepth {
            name: name.clone(),
            exists: read.is_some(),
            ready,
            consumers,
        });
    }
    broker.close().await;
    Ok(depths)
}

async fn shard_holders(
    client: &kube::Client,
    config: &Config,
) -> Result<Vec<ShardHolder>, CliError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.cluster.namespace);
    let params = ListParams::default().labels(&format!("{COMPONENT}={COMPONENT_SHARD}"));
    let leases = api
        .list(&params)
        .await
        .map_err(|e| CliError::Other(format!("listing shard leases: {e}")))?;
    let now = jiff::Timestamp::now();
    let mut holders: Vec<ShardHolder> = leases
        .items
        .into_iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&config.cluster.lease.name_prefix))
        })
        .map(|l| {
            let spec = l.spec.unwrap_or_default();
            let renewed = spec.renew_time.map(|t| t.0);
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
            let holder = spec.holder_identity.filter(|h| !h.is_empty());
            let live = holder.is_some()
                && renewed.is_some_and(|r| {
                    r.checked_add(jiff::SignedDuration::from_secs(duration))
                        .is_ok_and(|until| until > now)
                });
            ShardHolder {
                lease: l.metadata.name.unwrap_or_default(),
                holder,
                live,
                renewed: renewed.map(|r| r.to_string()),
            }
        })
        .collect();
    holders.sort_by_key(|h| natural(&h.lease));
    Ok(holders)
}

/// `prefix-shard-10` after `prefix-shard-9`.
fn natural(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = name.split_at(name.len() - digits);
    (head.to_owned(), tail.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `admin queue` lists the bookings not over, by start, after the waiting jobs.
    #[test]
    fn bookings_are_listed_by_start_until_they_are_over() {
        use crate::cluster::bookings::{Amount, BookedRank, Booking};
        let at = |s: i64| jiff::Timestamp::from_second(1_800_000_000 + s).unwrap();
        let b = |id: &str, start: i64| Booking {
            job_id: id.into(),
            owner: "project class".into(),
            fingerprint: "f".into(),
            start: at(start),
            end: at(start + 3600),
            ranks: vec![
                BookedRank {
                    node: "n1".into(),
                    amount: Amount::default(),
                },
                BookedRank {
                    node: "n1".into(),
                    amount: Amount::default(),
                },
            ],
        };
        let text = bookings_text(&[b("late", 7200), b("early", 0), b("over", -7200)], at(0));
        let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].contains("early") && lines[1].ends_with("2  n1"),
            "{text}"
        );
        assert!(lines[2].contains("late"), "{text}");
        assert_eq!(bookings_text(&[b("over", -7200)], at(0)), "");
    }

    #[test]
    fn the_pause_line_says_who_and_why() {
        let state = PauseState {
            paused: true,
            reason: Some("upgrade".into()),
            changed_at: Some("2026-01-01T00:00:00Z".parse().unwrap()),
            changed_by: Some("ops@host".into()),
        };
        let line = describe_pause(&state);
        assert!(
            line.starts_with("submissions are PAUSED: upgrade"),
            "{line}"
        );
        assert!(line.contains("ops@host"), "{line}");
        assert_eq!(describe_pause(&PauseState::default()), "submissions flow");
    }

    fn holder(lease: &str, live: bool) -> ShardHolder {
        ShardHolder {
            lease: lease.into(),
            holder: live.then(|| "runner-a".to_owned()),
            live,
            renewed: None,
        }
    }

    #[test]
    fn shards_without_a_live_holder_are_lapsed_free_or_missing() {
        let holders = [
            holder("vr-shard-0", true),
            holder("vr-shard-1", false),
            // Left by a configuration with more shards: not one of ours now.
            holder("vr-shard-7", false),
        ];
        assert_eq!(
            unheld_shards(&holders, "vr", 3),
            ["vr-shard-1", "vr-shard-2"]
        );
        assert!(unheld_shards(&holders[..1], "vr", 1).is_empty());
        // No lease at all: every shard is unheld.
        assert_eq!(unheld_shards(&[], "vr", 2), ["vr-shard-0", "vr-shard-1"]);
        let problem = unheld_problem(&unheld_shards(&[], "vr", 2), 2);
        assert!(problem.starts_with("2 of 2 shards"), "{problem}");
    }

    #[test]
    fn shards_sort_by_number() {
        let mut names = vec!["vr-shard-10", "vr-shard-2", "vr-shard-1"];
        names.sort_by_key(|n| natural(n));
        assert_eq!(names, ["vr-shard-1", "vr-shard-2", "vr-shard-10"]);
    }
}
