//! Every annotation key volcano-runner persists on a VolcanoJob, in one place.
//!
//! A runner holds caches only: the durable facts of a job live here, on the job itself, and every hook is
//! idempotent against them (DESIGN §4). Keys are `<prefix><name>`, the prefix `ucloud.dk/` by default.
//! Time values are epoch milliseconds as decimal strings, as UCloud wrote them.
//!
//! | name | written by | value |
//! |---|---|---|
//! | `user` | FairShare, at create | project, or user without a project (UCloud's key) |
//! | `ownerUser`, `ownerProject` | core, at create | the owner, for accounting |
//! | `productId`, `productCategory`, `productCpu`, `productMemoryGib`, `productGpu` | core, at create | the product |
//! | `replicas` | core, at create | number of ranks |
//! | `exclusiveNodes` | Task, at create | `true` when each rank has its node to itself; also a label on the pods, so that an estimate sees which running pods hold a whole node |
//! | `reservable` | Task, at create | `true` when every rank tolerates its own job's reservation taint ([`AnnotationKeys::reservation_taint`]; a job with a `sla-waiting-time` or whole nodes): the monitor reserves nodes only for such a job, never for one rendered before the toleration came with the waiting time |
//! | `wholeNodeCharge` | Task, at create | for a whole-node job, what one node is charged (JSON `{"product", "cpu", "memoryGib", "gpu"}`, from `[pipeline.whole_nodes]`); its ticks carry it instead of the product |
//! | `application` | core, at create | `<name>@<version>` |
//! | `submissionHash` | core, at create | `sha256:<hex>` of the SubmitJob's protobuf encoding (duplicate detection) |
//! | `acceptedAt` | core, at create | when the runner rendered the job |
//! | `acceptedBy` | runner, at create | the runner that created the job (QUEUED carries it as `runnerId`) |
//! | `companions` | runner, at create (jobs kept by a TTL) | the objects created beside the job, `<Kind>/<name>` comma separated: the monitor deletes them by name at the job's end, with no list |
//! | `queuedBy` | runner, at create (only when another runner holds the job's shard) | `monitor`: the job's monitor tells its QUEUED, at once, and the submit path publishes none ([`crate::monitor::queued`]) |
//! | `queuedConfirmed` | the monitor's first write of the job (or the runner at a shard's hand-over; the submit path itself for a booked job of another runner's shard, when its view of the leases cannot tell who monitors the job, or when the job's holder went away meanwhile) | `true`: the broker confirmed the job's QUEUED (a monitor sends no copy of it) |
//! | `traceparent` | runner, at create | W3C trace context of the submission |
//! | `maxTime` | Expiry, at create; extensions | the time allocation in ms; absent: never expires |
//! | `jobStart` | start hook, once | when the job first ran |
//! | `expiry` | Expiry start hook, once; extensions | `jobStart + maxTime` |
//! | `extensions` | extension | JSON array of applied extension request ids |
//! | `expiryWarned` | Expiry monitoring | `<expiry ms>/<seconds before>` of the last warning sent |
//! | `accountingPeriodMs` | Accounting, at create | tick length for this job |
//! | `accountedTicks` | Accounting hooks | number of ticks published (the next tick's index) |
//! | `accountingFinal` | Accounting completion | `true` once the final tick is published |
//! | `proxyPort`, `proxyDomains` | Proxy, at create | target port (0: the terminal and logs bridges only), public links (comma-separated) |
//! | `proxyGeneration` | Proxy hooks | generation of the last published targets |
//! | `proxySequence` | Proxy hooks | the `sequence` of the last published CREATE or UPDATE (events of a job are ordered by it) |
//! | `sessionKinds` | Proxy, at create | the session kinds the application offers, comma-separated: `web,terminal`, `vnc,terminal`, or `terminal` (a terminal-only job) |
//! | `terminationCause` | whoever ends the job (cancel, expiry, maintenance, ...) | `expired`, `cancelled`, ... (W11) |
//! | `terminationReason` | whoever ends the job | the cause in words, e.g. the cancel's reason |
//! | `terminationAt` | whoever ends the job, with `terminationCause` | when the job was asked to stop (epoch ms), before its `TerminateJob` command: the end of a rank still running then, and the start of `cleanup_grace` |
//! | `lifecycleState` | monitor | the last published lifecycle state |
//! | `statusHash` | monitor | `<chained>/<plain>[/<estimate>]`: hashes of the last status-only event and the start estimate it told (`at:<ms>:<n>` an expectation, `by:<ms>:<n>` a bound, `n` the estimates told so far; `never`, `unbounded`) (publish a pending reason once, an estimate again only when it moved enough) |
//! | `restarts` | monitor | Volcano's `retryCount` when the monitor last told the user of a restart (one status event per restart) |
//! | `disruption` | monitor | the last disruption told, in words (`rank 1's node n3 was lost`), for the FAILURE when the restarts run out |
//! | `disruptionRetry` | monitor, with `disruption` | Volcano's `retryCount` that the recorded `disruption` caused: recorded before its restart event (or the FAILURE) is told, so that whichever runner tells it tells the same |
//! | `outcome` | monitor | the decided end of the job (JSON: state, reason, times, exit codes, log tails) |
//! | `accountedUntil` | Accounting hooks, with `accountedTicks` | end of the last tick published (epoch ms): the ticks charged add up to `accountedUntil - jobStart` |
//! | `statusLog` | monitor, with `statusHash` | the status events told while the job waited (JSON array of `{at, reason, text, queue, jobsAhead, estimatedStartAt, estimateBasis}`, at most [`super::history::STATUS_LOG_MAX`]) |
//! | `restartLog` | monitor, with `restarts` | the restarts told (JSON array of `{attempt, at, cause}`) |
//! | `peers` | ConnectToJob, at create | the job's peers, `<hostname>=<peerJobId>` comma-separated, sorted by hostname |
//! | `peerAddresses` | monitor | the peer addresses last written into the job's peer EndpointSlice, `<hostname>=<ip>` comma-separated |
//! | `peerEnded` | monitor | the peers whose end the running job was told of, job ids comma-separated |
//! | `maintenanceWarned` | monitor | `<window id>/<start ms>` of the last maintenance window the running job was warned of |
//! | `maintenanceCut` | monitor | the instant (ms) a maintenance window ended the job at; its final tick ends there |
//! | `maintenanceTold` | monitor | `<window id>/<start ms>` of the last maintenance window a job queued before it was told it could not be held back for |
//! | `sealed` | core, at create (sealed jobs only) | why the job is sealed: `submission`, `product:<id or category>` or `project:<id>`; also a label on the pods (`true`), which keeps them out of the namespace's baseline policy ([`crate::pipeline::sealed`]) |
//! | `maintenanceHeld` | runner, at create | the id of the maintenance window the job was created held back by (its pods carry the gate [`AnnotationKeys::maintenance_gate`]) |
//! | `bookedStart` | runner, at create | the guaranteed start (ms) of a booked job, whose pods carry the gate [`AnnotationKeys::booking_gate`] until then (docs/bookings.md) |
//!
//! Every VolcanoJob the runner creates carries the finalizer [`AnnotationKeys::cleanup_finalizer`]
//! (`<prefix>cleanup`): the job cannot vanish before the monitor has run its cleanup (final tick, proxy
//! remove, terminal event), and the monitor removes the finalizer last.

/// The full keys for one prefix. Build it once per configuration: every field is a ready `String`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationKeys {
    /// The prefix itself, e.g. `ucloud.dk/`.
    pub prefix: String,
    /// `<prefix>user` (see the table above).
    pub user: String,
    /// `<prefix>ownerUser` (see the table above).
    pub owner_user: String,
    /// `<prefix>ownerProject` (see the table above).
    pub owner_project: String,
    /// `<prefix>productId` (see the table above).
    pub product_id: String,
    /// `<prefix>productCategory` (see the table above).
    pub product_category: String,
    /// `<prefix>productCpu` (see the table above).
    pub product_cpu: String,
    /// `<prefix>productMemoryGib` (see the table above).
    pub product_memory_gib: String,
    /// `<prefix>productGpu` (see the table above).
    pub product_gpu: String,
    /// `<prefix>replicas` (see the table above).
    pub replicas: String,
    /// `<prefix>sealed` (see the table above).
    pub sealed: String,
    /// `<prefix>exclusiveNodes` (see the table above).
    pub exclusive_nodes: String,
    /// `<prefix>wholeNodeCharge` (see the table above).
    pub whole_node_charge: String,
    /// `<prefix>application` (see the table above).
    pub application: String,
    /// `<prefix>submissionHash` (see the table above).
    pub submission_hash: String,
    /// `<prefix>acceptedAt` (see the table above).
    pub accepted_at: String,
    /// `<prefix>acceptedBy` (see the table above).
    pub accepted_by: String,
    /// `<prefix>traceparent` (see the table above).
    pub traceparent: String,
    /// `<prefix>maxTime` (see the table above).
    pub max_time: String,
    /// `<prefix>jobStart` (see the table above).
    pub job_start: String,
    /// `<prefix>expiry` (see the table above).
    pub expiry: String,
    /// `<prefix>extensions` (see the table above).
    pub extensions: String,
    /// `<prefix>expiryWarned` (see the table above).
    pub expiry_warned: String,
    /// `<prefix>accountingPeriodMs` (see the table above).
    pub accounting_period: String,
    /// `<prefix>accountedTicks` (see the table above).
    pub accounted_ticks: String,
    /// `<prefix>accountingFinal` (see the table above).
    pub accounting_final: String,
    /// `<prefix>proxyPort` (see the table above).
    pub proxy_port: String,
    /// `<prefix>proxyDomains` (see the table above).
    pub proxy_domains: String,
    /// `<prefix>proxyGeneration` (see the table above).
    pub proxy_generation: String,
    /// `<prefix>proxySequence` (see the table above).
    pub proxy_sequence: String,
    /// `sessionKinds`
    pub session_kinds: String,
    /// `<prefix>terminationCause` (see the table above).
    pub termination_cause: String,
    /// `<prefix>terminationReason` (see the table above).
    pub termination_reason: String,
    /// `<prefix>terminationAt` (see the table above).
    pub termination_at: String,
    /// `<prefix>companions` (see the table above).
    pub companions: String,
    /// `<prefix>lifecycleState` (see the table above).
    pub lifecycle_state: String,
    /// `<prefix>statusHash` (see the table above).
    pub status_hash: String,
    /// `<prefix>restarts` (see the table above).
    pub restarts: String,
    /// `<prefix>disruption` (see the table above).
    pub disruption: String,
    /// `<prefix>disruptionRetry` (see the table above).
    pub disruption_retry: String,
    /// `<prefix>outcome` (see the table above).
    pub outcome: String,
    /// `<prefix>accountedUntil` (see the table above).
    pub accounted_until: String,
    /// `<prefix>statusLog` (see the table above).
    pub status_log: String,
    /// `<prefix>restartLog` (see the table above).
    pub restart_log: String,
    /// `<prefix>peers` (see the table above).
    pub peers: String,
    /// `<prefix>peerAddresses` (see the table above).
    pub peer_addresses: String,
    /// `<prefix>peerEnded` (see the table above).
    pub peer_ended: String,
    /// `<prefix>maintenanceWarned` (see the table above).
    pub maintenance_warned: String,
    /// `<prefix>maintenanceCut` (see the table above).
    pub maintenance_cut: String,
    /// `<prefix>maintenanceHeld` (see the table above).
    pub maintenance_held: String,
    /// `<prefix>maintenanceTold` (see the table above).
    pub maintenance_told: String,
    /// `<prefix>reservable` (see the table above).
    pub reservable: String,
    /// `<prefix>bookedStart` (see the table above).
    pub booked_start: String,
}

impl AnnotationKeys {
    /// The keys under `prefix` (e.g. `ucloud.dk/`).
    pub fn new(prefix: &str) -> Self {
        let k = |name: &str| format!("{prefix}{name}");
        Self {
            prefix: prefix.to_owned(),
            user: k("user"),
            owner_user: k("ownerUser"),
            owner_project: k("ownerProject"),
            product_id: k("productId"),
            product_category: k("productCategory"),
            product_cpu: k("productCpu"),
            product_memory_gib: k("productMemoryGib"),
            product_gpu: k("productGpu"),
            replicas: k("replicas"),
            sealed: k("sealed"),
            exclusive_nodes: k("exclusiveNodes"),
            whole_node_charge: k("wholeNodeCharge"),
            application: k("application"),
            submission_hash: k("submissionHash"),
            accepted_at: k("acceptedAt"),
            accepted_by: k("acceptedBy"),
            traceparent: k("traceparent"),
            max_time: k("maxTime"),
            job_start: k("jobStart"),
            expiry: k("expiry"),
            extensions: k("extensions"),
            expiry_warned: k("expiryWarned"),
            accounting_period: k("accountingPeriodMs"),
            accounted_ticks: k("accountedTicks"),
            accounting_final: k("accountingFinal"),
            proxy_port: k("proxyPort"),
            proxy_domains: k("proxyDomains"),
            proxy_generation: k("proxyGeneration"),
            proxy_sequence: k("proxySequence"),
            session_kinds: k("sessionKinds"),
            termination_cause: k("terminationCause"),
            termination_reason: k("terminationReason"),
            termination_at: k("terminationAt"),
            companions: k("companions"),
            lifecycle_state: k("lifecycleState"),
            status_hash: k("statusHash"),
            restarts: k("restarts"),
            disruption: k("disruption"),
            disruption_retry: k("disruptionRetry"),
            outcome: k("outcome"),
            accounted_until: k("accountedUntil"),
            status_log: k("statusLog"),
            restart_log: k("restartLog"),
            peers: k("peers"),
            peer_addresses: k("peerAddresses"),
            peer_ended: k("peerEnded"),
            maintenance_warned: k("maintenanceWarned"),
            maintenance_cut: k("maintenanceCut"),
            maintenance_held: k("maintenanceHeld"),
            maintenance_told: k("maintenanceTold"),
            reservable: k("reservable"),
            booked_start: k("bookedStart"),
        }
    }

    /// The finalizer on every VolcanoJob the runner creates, `<prefix>cleanup`: the monitor removes it
    /// once the job's cleanup (final tick, proxy remove, terminal event) is done.
    pub fn cleanup_finalizer(&self) -> String {
        format!("{}cleanup", self.prefix)
    }

    /// The pod label a job's pods carry for each peer they may talk to: `<prefix>peer-<peerJobId>`.
    /// The peer's own policy admits every pod with this label, so connecting needs no patch of the peer's
    /// policy, and the permission goes away with the pods (W27).
    pub fn peer_label(&self, peer_job_id: &str) -> String {
        format!("{}peer-{peer_job_id}", self.prefix)
    }

    /// The scheduling gate on the pods of a job with peers, `<prefix>peers`: they are not scheduled
    /// until the monitor has seen every peer run and removed it (peers run together).
    pub fn peers_gate(&self) -> String {
        format!("{}peers", self.prefix)
    }

    /// The scheduling gate on the pods of a job created while a maintenance window was in the way of
    /// its time allocation, `<prefix>maintenance`: Kubernetes lets a gate be removed after a pod's
    /// creation but never added, so a job is held back this way only from its creation, and the monitor
    /// removes the gate once no window is in the way.
    pub fn maintenance_gate(&self) -> String {
        format!("{}maintenance", self.prefix)
    }

    /// The scheduling gate on the pods of a booked job, `<prefix>booking`: the job exists from its
    /// booking on (so that a redelivery, a cancel and `jobs` find it), but its pods may not take the
    /// capacity set aside before the booked start, when the monitor removes the gate.
    pub fn booking_gate(&self) -> String {
        format!("{}booking", self.prefix)
    }
}

/// Epoch milliseconds of a timestamp, as the annotations store them.
pub fn format_millis(ts: jiff::Timestamp) -> String {
    ts.as_millisecond().to_string()
}

/// A timestamp from an epoch-milliseconds annotation value.
pub fn parse_millis(value: &str) -> Option<jiff::Timestamp> {
    jiff::Timestamp::from_millisecond(value.trim().parse().ok()?).ok()
}

/// The effect of the node taint by which the monitor reserves a node for a whole-node gang
/// (`[monitor] reserve_nodes`): nothing new is placed there, nothing running is evicted.
pub const RESERVATION_EFFECT: &str = "NoSchedule";

impl AnnotationKeys {
    /// The key of that taint, `<prefix>reserved` (its value: the job id it is reserved for). Here, beside
    /// the annotation keys, because the pipeline renders the ranks' toleration of it and the monitor
    /// writes it.
    pub fn reservation_taint(&self) -> String {
        format!("{}reserved", self.prefix)
    }

    /// The key of the taint the monitor puts on the nodes of the maintenance windows that are not over,
    /// `<prefix>maintenance` (its value: the id of the earliest-starting such window over the node), and
    /// that the pods of a job a window is not in the way of tolerate with that window's id as the value.
    /// One key for every window: a node's taints are unique by key and effect, and a job not in the way
    /// of the earliest window over a node is not in the way of the later ones, so one taint per node
    /// suffices; and one key lets the runner and the system workloads tolerate every window at once
    /// (`operator: Exists`).
    pub fn maintenance_taint(&self) -> String {
        format!("{}maintenance", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_prefix() {
        let keys = AnnotationKeys::new("ucloud.dk/");
        assert_eq!(keys.max_time, "ucloud.dk/maxTime");
        assert_eq!(keys.job_start, "ucloud.dk/jobStart");
        assert_eq!(keys.user, "ucloud.dk/user");
        assert_eq!(keys.peer_label("42"), "ucloud.dk/peer-42");
        assert_eq!(keys.cleanup_finalizer(), "ucloud.dk/cleanup");
        assert_eq!(keys.outcome, "ucloud.dk/outcome");
        let other = AnnotationKeys::new("example.org/");
        assert_eq!(other.expiry, "example.org/expiry");
    }

    #[test]
    fn millis_round_trip() {
        let ts = jiff::Timestamp::from_millisecond(1_700_000_000_123).unwrap();
        assert_eq!(format_millis(ts), "1700000000123");
        assert_eq!(parse_millis("1700000000123"), Some(ts));
        assert_eq!(parse_millis("soon"), None);
    }
}
