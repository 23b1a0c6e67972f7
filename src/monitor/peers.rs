//! Peers run together (scheduling problem 12), decided from what the watches hold of every job.
//!
//! A job with peers (ConnectToJob) is created with its pods gated (`<prefix>peers`), its peers listed in
//! its `<prefix>peers` annotation and a headless Service without endpoints. The monitor of the job,
//! whichever runner holds its shard, reads its peers' jobs and pods from the cache of all jobs (the
//! watches are not sharded, only the duties are), so a decision costs no API call:
//!
//! - while a peer waits, the job waits too, with a status naming the peer (`waiting_for_peer`);
//! - once every peer runs, the EndpointSlice gets their rank 0 addresses by hostname, then the gate goes
//!   from the pods (in that order, so a program that starts finds its peers' names);
//! - while the job runs, a peer that restarts on another address gets its endpoint rewritten, and a peer
//!   that ends is told once (`peer_ended`, a status event whose id is the job's and the peer's);
//! - a peer that ends before the job ever started ends the job (`FAILURE`, `peer_ended`): it would wait
//!   for good.
//!
//! Everything is decided again from durable state: the gate on the pods, the addresses and the told ends
//! recorded in annotations, the peers' own jobs. A runner that dies between two of these steps leaves
//! the next one to whoever monitors the job next.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::record::{Published, Record};
use crate::durable::AnnotationKeys;
use crate::volcano::{JobPhase, VolcanoJob};

/// Reason of the status event of a job that waits for its peer.
pub const WAITING_REASON: &str = "waiting_for_peer";
/// Reason of the status event (and of the end of a job that never started) when a peer ends.
pub const ENDED_REASON: &str = "peer_ended";

/// Reason of the end of a job that has not started when a peer it names has not come within
/// `[monitor] peer_missing_after` of its creation.
pub const MISSING_REASON: &str = "peer_missing";
/// Reason of the refusal of a submission (or the end of a job that has not started) whose peers name it
/// back: each would wait for the other to run, for good.
pub const CYCLE_REASON: &str = "peer_cycle";

/// The peer job ids a job names, from its `<prefix>peers` annotation (`<hostname>=<jobId>,...`).
pub fn named_by(job: &VolcanoJob, keys: &AnnotationKeys) -> Vec<String> {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&keys.peers))
        .map(|v| {
            crate::pipeline::plugins::connect_to_job::parse_peers(v)
                .into_iter()
                .map(|(_, id)| id.to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Why a job that has not started never will for its peers, if so: `(reason, status)`.
///
/// - A peer that waits itself and names this job as its peer (a cycle the submit check could not see:
///   both submitted at once): each waits for the other to run. Told at once.
/// - A peer that does not exist (never submitted, or gone) once the job has waited `wait` since its
///   creation: a peer may be submitted after the job that names it, but not never.
pub fn never_comes(
    job_id: &str,
    seen: &[PeerSeen],
    peers: &[PeerView],
    keys: &AnnotationKeys,
    created: Option<jiff::Timestamp>,
    wait: jiff::SignedDuration,
    now: jiff::Timestamp,
) -> Option<(&'static str, String)> {
    for (p, s) in peers.iter().zip(seen) {
        if p.state == PeerState::Waiting
            && let Some(job) = &s.job
            && named_by(job, keys).iter().any(|id| id == job_id)
        {
            return Some((
                CYCLE_REASON,
                format!(
                    "The job did not start: its peer {} names this job as its peer, and each would wait                      for the other to run; submit one of them without the other as its peer",
                    p.named()
                ),
            ));
        }
    }
    let missing = peers.iter().find(|p| p.state == PeerState::Missing)?;
    let deadline = missing_deadline(peers, created, wait)?;
    (now >= deadline).then(|| {
        (
            MISSING_REASON,
            format!(
                "The job did not start: its peer {} does not exist, and it was waited for {}                  (`[monitor] peer_missing_after`); submit the peer, then this job again",
                missing.named(),
                crate::pipeline::plugins::expiry::human(wait)
            ),
        )
    })
}

/// When a job whose peer does not exist gives up on it (its creation plus `wait`); `None` while every
/// peer exists.
pub fn missing_deadline(
    peers: &[PeerView],
    created: Option<jiff::Timestamp>,
    wait: jiff::SignedDuration,
) -> Option<jiff::Timestamp> {
    let created = created?;
    peers
        .iter()
        .any(|p| p.state == PeerState::Missing)
        .then(|| created.checked_add(wait).unwrap_or(created))
}

/// The estimate a job waiting for its peer is told instead of the replay's: the replay sees its
/// resources, not its gate, and "its resources are free now" would be false. A job that can never fit
/// is still told so.
pub fn gated_estimate(
    peers: &[PeerView],
    estimate: Option<&crate::forecast::Estimate>,
) -> Option<crate::forecast::Estimate> {
    use crate::forecast::Estimate;
    let peer = waiting_for(peers)?;
    match estimate? {
        Estimate::Never { .. } | Estimate::TimesOut { .. } => None,
        Estimate::At { .. } | Estimate::Unbounded { .. } => Some(Estimate::Unbounded {
            why: format!(
                "it waits for its peer {} to start: it starts only once its peer runs, whatever is free",
                peer.named()
            ),
        }),
    }
}

/// One peer of a job as the watches show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    /// The name the job's programs reach it by.
    pub hostname: String,
    pub job_id: String,
    pub state: PeerState,
}

/// Where a peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerState {
    /// Not running yet (queued, starting, or restarting).
    Waiting,
    /// No such job: not created yet (a peer that does not exist yet is accepted where it can only be
    /// the owner's: [`crate::runner`]'s submit check), or gone long after its end (an ended job is kept
    /// as its record for `[cluster] ended_job_retention`, and its end was told from that record).
    Missing,
    /// Running; its rank 0's address once the pod has one.
    Running { address: Option<String> },
    /// Being deleted or finished, its end not recorded yet (its monitor records it within moments): not
    /// running, and not told as ended until its end is recorded.
    Ending,
    /// Ended, with how (e.g. `ended: CANCELLED (cancelled)`), and when, when that is recorded.
    Ended {
        how: String,
        at: Option<jiff::Timestamp>,
    },
}

impl PeerView {
    /// How the user is told which peer: `job 42 (db)`.
    pub fn named(&self) -> String {
        format!("job {} ({})", self.job_id, self.hostname)
    }
}

/// What the watches hold of one peer (the cache's part; [`view`] reads it).
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSeen {
    pub hostname: String,
    pub job_id: String,
    /// Its VolcanoJob; `None` when there is none (any more).
    pub job: Option<Arc<VolcanoJob>>,
    /// Its rank 0's pod address while that pod runs.
    pub rank0_address: Option<String>,
}

/// Where each peer is. A peer has ended when its end is recorded (decided or published); it is ending
/// while it is being deleted (a cancel, an expiry) or Volcano has finished it.
pub fn view(seen: &[PeerSeen], keys: &AnnotationKeys) -> Vec<PeerView> {
    seen.iter()
        .map(|p| {
            let state = match &p.job {
                None => PeerState::Missing,
                Some(job) => state_of(job, p.rank0_address.as_deref(), keys),
            };
            PeerView {
                hostname: p.hostname.clone(),
                job_id: p.job_id.clone(),
                state,
            }
        })
        .collect()
}

fn state_of(job: &VolcanoJob, address: Option<&str>, keys: &AnnotationKeys) -> PeerState {
    let record = Record::read(job, keys);
    if let Some(outcome) = &record.outcome {
        return PeerState::Ended {
            how: format!("ended: {} ({})", outcome.state.as_str(), outcome.reason),
            at: Some(outcome.ended()),
        };
    }
    if let Published::Ended(state) = record.published {
        return PeerState::Ended {
            how: format!("ended: {}", state.as_str()),
            at: None,
        };
    }
    // Being deleted, or being ended or finished by Volcano (a `TerminateJob` leaves it `Terminating`): its
    // monitor records how it ended within moments, and the end is told from that record, so that
    // whoever tells it tells the same.
    let phase = job.phase();
    if crate::cluster::end::is_ending(job) {
        return PeerState::Ending;
    }
    if phase == JobPhase::Running {
        return PeerState::Running {
            address: address.map(str::to_owned),
        };
    }
    PeerState::Waiting
}

/// Whether a pod still carries `gate`.
pub fn is_gated(pod: &Pod, gate: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == gate))
}

/// The pods that carry `gate` and are not being deleted.
pub fn gated_pods<'a>(pods: &'a [Pod], gate: &str) -> Vec<&'a Pod> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_gated(p, gate))
        .collect()
}

/// The first peer that is not running yet, for the waiting status.
pub fn waiting_for(peers: &[PeerView]) -> Option<&PeerView> {
    peers
        .iter()
        .find(|p| matches!(p.state, PeerState::Waiting | PeerState::Missing))
}

/// The peers that have ended, with how and when.
pub fn ended(peers: &[PeerView]) -> Vec<(&PeerView, &str, Option<jiff::Timestamp>)> {
    peers
        .iter()
        .filter_map(|p| match &p.state {
            PeerState::Ended { how, at } => Some((p, how.as_str(), *at)),
            _ => None,
        })
        .collect()
}

/// Every peer's address when every peer runs with one: what the EndpointSlice must say before the gate
/// goes.
pub fn all_addresses(peers: &[PeerView]) -> Option<BTreeMap<String, String>> {
    peers
        .iter()
        .map(|p| match &p.state {
            PeerState::Running {
                address: Some(address),
            } => Some((p.hostname.clone(), address.clone())),
            _ => None,
        })
        .collect()
}

/// The addresses to write while the job runs: each running peer's current one, and the last written
/// for a peer that is between addresses (restarting), so its name keeps resolving to where it comes
/// back, or to nothing new.
pub fn current_addresses(
    peers: &[PeerView],
    recorded: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    peers
        .iter()
        .filter_map(|p| match &p.state {
            PeerState::Running {
                address: Some(address),
            } => Some((p.hostname.clone(), address.clone())),
            _ => recorded
                .get(&p.hostname)
                .map(|a| (p.hostname.clone(), a.clone())),
        })
        .collect()
}

/// `<hostname>=<ip>,...` (the `peerAddresses` annotation).
pub fn format_addresses(addresses: &BTreeMap<String, String>) -> String {
    addresses
        .iter()
        .map(|(h, a)| format!("{h}={a}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads the `peerAddresses` annotation.
pub fn parse_addresses(value: Option<&str>) -> BTreeMap<String, String> {
    value
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter_map(|e| e.split_once('='))
        .map(|(h, a)| (h.to_owned(), a.to_owned()))
        .collect()
}

/// Reads the `peerEnded` annotation: the peers whose end was told.
pub fn parse_told(value: Option<&str>) -> Vec<String> {
    value
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The id of the event telling a job that its peer ended: one per job and peer.
pub fn ended_event_id(job_id: &str, peer_job_id: &str) -> String {
    format!("{job_id}/peer-ended/{peer_job_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(hostname: &str, id: &str, state: PeerState) -> PeerView {
        PeerView {
            hostname: hostname.into(),
            job_id: id.into(),
            state,
        }
    }

    fn waiting_job(id: &str, names: &str) -> Arc<VolcanoJob> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                "metadata": {"name": format!("j-{id}"), "namespace": "ns",
                             "annotations": {"ucloud.dk/peers": names}},
                "spec": {"tasks": []},
                "status": {"state": {"phase": "Pending"}}
            }))
            .unwrap(),
        )
    }

    /// A waiting peer that names the job back is a cycle, told at once; a peer that does not exist is
    /// given up on at the job's creation plus the wait, not before; the estimate says it waits.
    #[test]
    fn peers_that_never_come() {
        use crate::forecast::Estimate;
        let keys = AnnotationKeys::new("ucloud.dk/");
        let t = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
        let wait = jiff::SignedDuration::from_mins(60);
        let created = Some(t("2026-12-01T06:00:00Z"));
        let seen = vec![PeerSeen {
            hostname: "b".into(),
            job_id: "b".into(),
            job: Some(waiting_job("b", "a=a")),
            rank0_address: None,
        }];
        let peers = view(&seen, &keys);
        let (reason, status) = never_comes(
            "a",
            &seen,
            &peers,
            &keys,
            created,
            wait,
            t("2026-12-01T06:00:01Z"),
        )
        .unwrap();
        assert_eq!(reason, CYCLE_REASON);
        assert!(status.contains("job b (b) names this job"), "{status}");
        // The same peer naming another job: no cycle, just waiting.
        let other = vec![PeerSeen {
            job: Some(waiting_job("b", "x=c")),
            ..seen[0].clone()
        }];
        let now = t("2026-12-02T06:00:00Z");
        assert_eq!(
            never_comes("a", &other, &view(&other, &keys), &keys, created, wait, now),
            None
        );

        let missing = vec![PeerSeen {
            job: None,
            ..seen[0].clone()
        }];
        let peers = view(&missing, &keys);
        let deadline = missing_deadline(&peers, created, wait).unwrap();
        assert_eq!(deadline, t("2026-12-01T07:00:00Z"));
        let before = deadline
            .checked_sub(jiff::SignedDuration::from_secs(1))
            .unwrap();
        assert_eq!(
            never_comes("a", &missing, &peers, &keys, created, wait, before),
            None
        );
        let (reason, status) =
            never_comes("a", &missing, &peers, &keys, created, wait, deadline).unwrap();
        assert_eq!(reason, MISSING_REASON);
        assert!(status.contains("job b (b) does not exist"), "{status}");

        let free_now = Estimate::At {
            start: deadline,
            basis: "its resources are free now".into(),
            bound: false,
            record: None,
        };
        match gated_estimate(&peers, Some(&free_now)) {
            Some(Estimate::Unbounded { why }) => {
                assert!(why.starts_with("it waits for its peer job b (b)"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let never = Estimate::Never {
            why: "too big".into(),
        };
        assert_eq!(gated_estimate(&peers, Some(&never)), None);
        assert_eq!(gated_estimate(&[], Some(&free_now)), None);
    }

    #[test]
    fn addresses_only_when_every_peer_runs_with_one() {
        let running = |a: &str| PeerState::Running {
            address: Some(a.into()),
        };
        let both = [
            peer("db", "1", running("10.0.0.1")),
            peer("q", "2", running("10.0.0.2")),
        ];
        let all = all_addresses(&both).unwrap();
        assert_eq!(format_addresses(&all), "db=10.0.0.1,q=10.0.0.2");
        assert_eq!(parse_addresses(Some("db=10.0.0.1,q=10.0.0.2")), all);
        let one_waits = [
            peer("db", "1", running("10.0.0.1")),
            peer("q", "2", PeerState::Waiting),
        ];
        assert_eq!(all_addresses(&one_waits), None);
        assert_eq!(waiting_for(&one_waits).unwrap().named(), "job 2 (q)");
        let no_ip = [peer("db", "1", PeerState::Running { address: None })];
        assert_eq!(all_addresses(&no_ip), None);
        // A restarting peer keeps its last address until it has a new one.
        let recorded = parse_addresses(Some("db=10.0.0.1,q=10.0.0.2"));
        let restarting = [
            peer("db", "1", running("10.0.0.9")),
            peer("q", "2", PeerState::Waiting),
        ];
        assert_eq!(
            format_addresses(&current_addresses(&restarting, &recorded)),
            "db=10.0.0.9,q=10.0.0.2"
        );
        assert_eq!(parse_told(Some("1,2")), vec!["1", "2"]);
        assert!(parse_told(None).is_empty());
    }
}
