//! Whether a booking can be promised, and where: pure, over the nodes, what holds them until when, and
//! the bookings already made. The I/O around it ([`super::Bookings`]) reads these from the cluster and
//! writes the answer with a conditional write, so two runners deciding at once never both promise the
//! same capacity.
//!
//! The rule is deliberately conservative, so that a promise made is kept:
//! - a pod bound to a node holds its requests until its job's persisted expiry (a job volcano-runner
//!   ends itself at that instant), or forever when it has none (no time limit, or not our job);
//! - every booking whose `[start, end)` overlaps the one asked for is subtracted whole from its nodes,
//!   even where two of them never overlap each other;
//! - a waiting job holds nothing: from the booking on, the booking's taint keeps it off the booked
//!   nodes, but one let on just in time, which is placed by the taint's cutoff and ends before the
//!   first booked start (docs/bookings.md); once placed, it is a holding like any other;
//! - the operator's shares (`[bookings] max_share`, `max_share_per_owner`) bound the CPU and GPUs set
//!   aside by the bookings overlapping the one asked for, added up.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::interval::Span;

/// CPU in millicores, memory in MiB, GPUs: of a rank, or of what a node can hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Amount {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: u64,
}

impl Amount {
    pub fn fits_in(&self, free: &Amount) -> bool {
        self.cpu_milli <= free.cpu_milli
            && self.memory_mib <= free.memory_mib
            && self.gpu <= free.gpu
    }

    pub fn minus(&self, other: &Amount) -> Amount {
        Amount {
            cpu_milli: self.cpu_milli.saturating_sub(other.cpu_milli),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
            gpu: self.gpu.saturating_sub(other.gpu),
        }
    }

    fn plus(&self, other: &Amount) -> Amount {
        Amount {
            cpu_milli: self.cpu_milli.saturating_add(other.cpu_milli),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            gpu: self.gpu.saturating_add(other.gpu),
        }
    }
}

/// A node a booking may set capacity aside on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRoom {
    pub name: String,
    pub allocatable: Amount,
}

/// What a bound pod holds on its node, and until when (`None`: for good).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub node: String,
    pub uses: Amount,
    pub until: Option<Timestamp>,
    /// The job it belongs to, when volcano-runner created it: a booked job's own pods are counted by its
    /// booking, not twice.
    pub job_id: Option<String>,
}

/// One rank's capacity set aside on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BookedRank {
    pub node: String,
    #[serde(flatten)]
    pub amount: Amount,
}

/// A promise: the job starts at `start`, and its ranks' capacity is set aside until `end`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Booking {
    pub job_id: String,
    /// `user <name>` or `project <name>`: whose share it counts against.
    pub owner: String,
    /// The submission's fingerprint (16 hex digits): a redelivery finds its own booking, another
    /// submission under the same id does not.
    pub fingerprint: String,
    #[serde(with = "millis")]
    pub start: Timestamp,
    #[serde(with = "millis")]
    pub end: Timestamp,
    pub ranks: Vec<BookedRank>,
}

impl Booking {
    /// `[start, end)`: the time its capacity is set aside.
    pub fn span(&self) -> Span<Timestamp> {
        Span::new(self.start, self.end)
    }

    fn overlaps(&self, start: Timestamp, end: Timestamp) -> bool {
        self.span().overlaps(&Span::new(start, end))
    }

    /// Everything its ranks set aside.
    pub fn total(&self) -> Amount {
        self.ranks
            .iter()
            .fold(Amount::default(), |a, r| a.plus(&r.amount))
    }

    /// Its nodes, one per rank.
    pub fn nodes(&self) -> Vec<String> {
        self.ranks.iter().map(|r| r.node.clone()).collect()
    }
}

pub(super) mod millis {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(t.as_millisecond())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let ms = i64::deserialize(d)?;
        Timestamp::from_millisecond(ms).map_err(serde::de::Error::custom)
    }
}

/// What is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub job_id: String,
    pub owner: String,
    pub fingerprint: String,
    pub earliest: Timestamp,
    pub latest: Timestamp,
    pub runs_for: SignedDuration,
    pub replicas: u32,
    pub per_rank: Amount,
}

/// The operator's bounds (`[bookings]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// How far ahead of now a booking may start.
    pub horizon: SignedDuration,
    /// The share of the cluster's CPU and GPUs all bookings together may set aside at once.
    pub max_share: f64,
    /// The same, for one owner's bookings.
    pub max_share_per_owner: f64,
}

/// The answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Booked(Booking),
    /// Not within the window: why, and the earliest window as long as the one asked for that could be
    /// promised now (`None`: none within the horizon).
    Refused {
        why: String,
        earliest: Option<(Timestamp, Timestamp)>,
    },
}

/// What the decision reads.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub nodes: &'a [NodeRoom],
    pub holdings: &'a [Holding],
    pub bookings: &'a [Booking],
    /// The maintenance windows: a node a window takes away during `[start, end)` has no room then.
    pub windows: &'a [crate::cluster::Window],
    pub limits: Limits,
    pub now: Timestamp,
}

/// Books `request` at the earliest start within its window where every rank fits, or refuses it with
/// the earliest window that would have been booked.
pub fn decide(request: &Request, inputs: Inputs<'_>) -> Answer {
    let horizon_end = inputs.now + inputs.limits.horizon;
    let from = request.earliest.max(inputs.now);
    if request.latest < inputs.now {
        return refuse(request, inputs, "the window has passed".into());
    }
    if from > horizon_end {
        return Answer::Refused {
            why: format!(
                "bookings open {} ahead ([bookings] horizon): the earliest start asked for, {}, is \
                 later; book from {} on",
                show_duration(inputs.limits.horizon),
                request.earliest,
                request.earliest - inputs.limits.horizon
            ),
            earliest: None,
        };
    }
    let until = request.latest.min(horizon_end);
    let mut last_why = String::new();
    for start in candidates(inputs, from, until) {
        match place(request, inputs, start) {
            Ok(booking) => return Answer::Booked(booking),
            Err(why) => last_why = why,
        }
    }
    refuse(request, inputs, last_why)
}

/// Whether `booking` (one of `inputs.bookings` or not) still has its room on its nodes: checked after
/// its taints are written, for a pod bound in the moment between the decision and the taint.
pub fn still_fits(booking: &Booking, inputs: Inputs<'_>) -> bool {
    let overlapping: Vec<&Booking> = inputs
        .bookings
        .iter()
        .filter(|b| b.job_id != booking.job_id && b.overlaps(booking.start, booking.end))
        .collect();
    let mut free = free_at(inputs, &overlapping, booking.start, booking.end);
    booking.ranks.iter().all(
        |r| match free.iter_mut().find(|(name, _)| *name == r.node) {
            Some((_, room)) if r.amount.fits_in(room) => {
                *room = room.minus(&r.amount);
                true
            }
            _ => false,
        },
    )
}

/// The refusal, with the earliest window after the one asked for (or from now, when it has passed)
/// where the booking fits.
fn refuse(request: &Request, inputs: Inputs<'_>, why: String) -> Answer {
    let length = request.latest.duration_since(request.earliest);
    let from = request.latest.max(inputs.now);
    let until = inputs.now + inputs.limits.horizon;
    let earliest = candidates(inputs, from, until)
        .into_iter()
        .find(|start| place(request, inputs, *start).is_ok())
        .map(|start| (start, start + length));
    Answer::Refused { why, earliest }
}

/// The starts worth trying within `[from, until]`: `from` itself and every instant something ends
/// (a holding's deadline, a booking's end), when capacity comes back.
fn candidates(inputs: Inputs<'_>, from: Timestamp, until: Timestamp) -> Vec<Timestamp> {
    let mut out: Vec<Timestamp> = inputs
        .holdings
        .iter()
        .filter_map(|h| h.until)
        .chain(inputs.bookings.iter().map(|b| b.end))
        .chain(inputs.windows.iter().map(|w| w.end))
        .filter(|t| *t > from && *t <= until)
        .collect();
    out.push(from);
    out.sort();
    out.dedup();
    out
}

/// The booking at `start`, or why it does not fit there.
fn place(request: &Request, inputs: Inputs<'_>, start: Timestamp) -> Result<Booking, String> {
    let end = start + request.runs_for;
    let overlapping: Vec<&Booking> = inputs
        .bookings
        .iter()
        .filter(|b| b.job_id != request.job_id && b.overlaps(start, end))
        .collect();
    within_shares(request, inputs, &overlapping)?;
    let mut free = free_at(inputs, &overlapping, start, end);
    let mut ranks = Vec::new();
    for _ in 0..request.replicas {
        // Best fit: the node with the least room that still holds the rank keeps larger rooms whole
        // for larger ranks.
        let Some((name, room)) = free
            .iter_mut()
            .filter(|(_, room)| request.per_rank.fits_in(room))
            .min_by_key(|(name, room)| (room.gpu, room.cpu_milli, room.memory_mib, name.clone()))
        else {
            return Err(format!(
                "{} of {} ranks fit at {start}: no node has room for another rank set aside until {end}",
                ranks.len(),
                request.replicas
            ));
        };
        *room = room.minus(&request.per_rank);
        ranks.push(BookedRank {
            node: name.clone(),
            amount: request.per_rank,
        });
    }
    Ok(Booking {
        job_id: request.job_id.clone(),
        owner: request.owner.clone(),
        fingerprint: request.fingerprint.clone(),
        start,
        end,
        ranks,
    })
}

/// Each node's room at `start` for `[start, end)`: its allocatable less what holds it past `start` and
/// less every overlapping booking's ranks on it; none where a maintenance window takes it away then.
fn free_at(
    inputs: Inputs<'_>,
    overlapping: &[&Booking],
    start: Timestamp,
    end: Timestamp,
) -> Vec<(String, Amount)> {
    let booked = |job: &Option<String>| {
        job.as_ref()
            .is_some_and(|id| inputs.bookings.iter().any(|b| &b.job_id == id))
    };
    inputs
        .nodes
        .iter()
        .map(|n| {
            if inputs
                .windows
                .iter()
                .any(|w| w.overlaps(start, end) && w.covers(&n.name))
            {
                return (n.name.clone(), Amount::default());
            }
            let mut room = n.allocatable;
            for h in inputs.holdings.iter().filter(|h| h.node == n.name) {
                if h.until.is_none_or(|u| u > start) && !booked(&h.job_id) {
                    room = room.minus(&h.uses);
                }
            }
            for r in overlapping.iter().flat_map(|b| &b.ranks) {
                if r.node == n.name {
                    room = room.minus(&r.amount);
                }
            }
            (n.name.clone(), room)
        })
        .collect()
}

/// Whether the bookings overlapping it, with it, stay within the operator's shares of the cluster's CPU
/// and GPUs, in total and for its owner.
fn within_shares(
    request: &Request,
    inputs: Inputs<'_>,
    overlapping: &[&Booking],
) -> Result<(), String> {
    let cluster = inputs
        .nodes
        .iter()
        .fold(Amount::default(), |a, n| a.plus(&n.allocatable));
    let asked = Amount {
        cpu_milli: request.per_rank.cpu_milli * u64::from(request.replicas),
        memory_mib: 0,
        gpu: request.per_rank.gpu * u64::from(request.replicas),
    };
    let sum = |of: &dyn Fn(&Booking) -> bool| {
        overlapping
            .iter()
            .filter(|b| of(b))
            .fold(asked, |a, b| a.plus(&b.total()))
    };
    let share = |used: u64, all: u64| {
        if all == 0 {
            0.0
        } else {
            used as f64 / all as f64
        }
    };
    let checks = [
        (
            sum(&|_| true),
            inputs.limits.max_share,
            "max_share",
            "all bookings".to_owned(),
        ),
        (
            sum(&|b| b.owner == request.owner),
            inputs.limits.max_share_per_owner,
            "max_share_per_owner",
            format!("the bookings of {}", request.owner),
        ),
    ];
    for (used, limit, key, whose) in checks {
        let over = share(used.cpu_milli, cluster.cpu_milli) > limit
            || (used.gpu > 0 && share(used.gpu, cluster.gpu) > limit);
        if over {
            return Err(format!(
                "{whose} would set aside more than {:.0}% of the cluster's CPU or GPUs at once \
                 ([bookings] {key})",
                limit * 100.0
            ));
        }
    }
    Ok(())
}

fn show_duration(d: SignedDuration) -> String {
    format!("{d:#}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn cpus(n: u64) -> Amount {
        Amount {
            cpu_milli: n * 1000,
            memory_mib: n * 4096,
            gpu: 0,
        }
    }

    fn nodes(n: usize, cpu: u64) -> Vec<NodeRoom> {
        (0..n)
            .map(|i| NodeRoom {
                name: format!("n{i}"),
                allocatable: cpus(cpu),
            })
            .collect()
    }

    fn request(id: &str, earliest: i64, latest: i64, replicas: u32, cpu: u64) -> Request {
        Request {
            job_id: id.into(),
            owner: "user alice".into(),
            fingerprint: "f".into(),
            earliest: at(earliest),
            latest: at(latest),
            runs_for: SignedDuration::from_hours(1),
            replicas,
            per_rank: cpus(cpu),
        }
    }

    fn limits() -> Limits {
        Limits {
            horizon: SignedDuration::from_hours(24 * 14),
            max_share: 1.0,
            max_share_per_owner: 1.0,
        }
    }

    fn inputs<'a>(n: &'a [NodeRoom], h: &'a [Holding], b: &'a [Booking]) -> Inputs<'a> {
        Inputs {
            nodes: n,
            holdings: h,
            bookings: b,
            windows: &[],
            limits: limits(),
            now: at(0),
        }
    }

    fn hold(node: &str, cpu: u64, until: Option<i64>) -> Holding {
        Holding {
            node: node.into(),
            uses: cpus(cpu),
            until: until.map(at),
            job_id: None,
        }
    }

    fn booked(answer: Answer) -> Booking {
        match answer {
            Answer::Booked(b) => b,
            other => panic!("not booked: {other:?}"),
        }
    }

    /// A running job that ends before the start leaves its room to the booking; one without a limit
    /// never does, and one that ends later only from its end.
    #[test]
    fn what_ends_before_the_start_leaves_room_and_what_runs_on_does_not() {
        let n = nodes(1, 4);
        let ends_before = [hold("n0", 4, Some(3000))];
        let b = booked(decide(
            &request("a", 3600, 3600, 1, 4),
            inputs(&n, &ends_before, &[]),
        ));
        assert_eq!((b.start, b.nodes()), (at(3600), vec!["n0".to_owned()]));
        assert_eq!(b.end, at(7200));

        let forever = [hold("n0", 1, None)];
        let refused = decide(&request("a", 3600, 3600, 1, 4), inputs(&n, &forever, &[]));
        assert!(
            matches!(refused, Answer::Refused { earliest: None, .. }),
            "{refused:?}"
        );

        let later = [hold("n0", 2, Some(5000))];
        match decide(&request("a", 3600, 3660, 1, 4), inputs(&n, &later, &[])) {
            Answer::Refused { earliest, why } => {
                assert_eq!(earliest, Some((at(5000), at(5060))), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // Within a window that reaches the end, the start is that end.
        let b = booked(decide(
            &request("a", 3600, 6000, 1, 4),
            inputs(&n, &later, &[]),
        ));
        assert_eq!(b.start, at(5000));
    }

    /// A booking is never given capacity another overlapping booking holds; one that does not overlap
    /// shares it; the refused one is offered the window from the first's end.
    #[test]
    fn overlapping_bookings_never_share_capacity() {
        let n = nodes(2, 4);
        let first = booked(decide(
            &request("a", 3600, 3600, 2, 4),
            inputs(&n, &[], &[]),
        ));
        let all = [first.clone()];
        match decide(&request("b", 3600, 3600, 1, 1), inputs(&n, &[], &all)) {
            Answer::Refused { earliest, .. } => assert_eq!(earliest, Some((at(7200), at(7200)))),
            other => panic!("{other:?}"),
        }
        let b = booked(decide(
            &request("b", 7200, 7200, 1, 1),
            inputs(&n, &[], &all),
        ));
        assert_eq!(b.start, at(7200));
        // Its own booking (a redelivery) is not counted against it.
        let again = booked(decide(
            &request("a", 3600, 3600, 2, 4),
            inputs(&n, &[], &all),
        ));
        assert_eq!(again.start, first.start);
    }

    /// Ranks go where the room is smallest that still holds them, several on one node when it fits.
    #[test]
    fn ranks_are_placed_best_fit() {
        let n = vec![
            NodeRoom {
                name: "big".into(),
                allocatable: cpus(16),
            },
            NodeRoom {
                name: "small".into(),
                allocatable: cpus(2),
            },
        ];
        let b = booked(decide(&request("a", 60, 60, 3, 1), inputs(&n, &[], &[])));
        assert_eq!(b.nodes(), vec!["small", "small", "big"]);
    }

    /// The shares bound what all bookings, and one owner's, set aside at once; the horizon how far
    /// ahead; a window in the past is refused with one from now.
    #[test]
    fn shares_horizon_and_the_past() {
        let n = nodes(4, 4);
        let mut i = inputs(&n, &[], &[]);
        i.limits.max_share = 0.5;
        i.limits.max_share_per_owner = 0.25;
        let first = booked(decide(&request("a", 60, 60, 1, 4), i));
        let mine = [first];
        let i = Inputs {
            bookings: &mine,
            ..i
        };
        match decide(&request("b", 60, 60, 1, 4), i) {
            Answer::Refused { why, earliest } => {
                assert!(why.contains("max_share_per_owner"), "{why}");
                assert_eq!(earliest, Some((at(3660), at(3660))));
            }
            other => panic!("{other:?}"),
        }
        let mut other_owner = request("c", 60, 60, 1, 4);
        other_owner.owner = "project p".into();
        assert!(matches!(decide(&other_owner, i), Answer::Booked(_)));
        let mut big = request("d", 60, 60, 2, 4);
        big.owner = "project q".into();
        match decide(&big, i) {
            Answer::Refused { why, .. } => assert!(why.contains("[bookings] max_share)"), "{why}"),
            other => panic!("{other:?}"),
        }

        let far = request("e", 15 * 24 * 3600, 15 * 24 * 3600, 1, 1);
        match decide(&far, inputs(&n, &[], &[])) {
            Answer::Refused { why, earliest } => {
                assert!(why.contains("horizon"), "{why}");
                assert_eq!(earliest, None);
            }
            other => panic!("{other:?}"),
        }
        let past = request("f", -600, -300, 1, 1);
        match decide(&past, inputs(&n, &[], &[])) {
            Answer::Refused { why, earliest } => {
                assert!(why.contains("passed"), "{why}");
                assert_eq!(earliest, Some((at(0), at(300))));
            }
            other => panic!("{other:?}"),
        }
    }

    /// A pod bound after the decision onto the booked room, past the start, breaks the booking; one
    /// that ends before it does not.
    #[test]
    fn a_pod_bound_after_the_decision_is_noticed() {
        let n = nodes(1, 4);
        let b = booked(decide(
            &request("a", 3600, 3600, 1, 4),
            inputs(&n, &[], &[]),
        ));
        let mine = [b.clone()];
        assert!(still_fits(&b, inputs(&n, &[], &mine)));
        assert!(still_fits(
            &b,
            inputs(&n, &[hold("n0", 4, Some(3600))], &mine)
        ));
        assert!(!still_fits(
            &b,
            inputs(&n, &[hold("n0", 1, Some(3601))], &mine)
        ));
        assert!(!still_fits(&b, inputs(&n, &[hold("n0", 1, None)], &mine)));
    }

    /// A maintenance window over a node during the booking takes the node away; one before or after
    /// does not, and the window's end is a start worth trying.
    #[test]
    fn maintenance_windows_take_their_nodes_away() {
        let n = nodes(2, 4);
        let window = |from: i64, to: i64, node: &str| {
            crate::cluster::Window::new(
                at(from),
                at(to),
                [node.to_owned()].into(),
                None,
                "op",
                at(0),
            )
            .unwrap()
        };
        let both = [window(3000, 4000, "n0"), window(3000, 4000, "n1")];
        let mut i = inputs(&n, &[], &[]);
        i.windows = &both;
        match decide(&request("a", 3600, 3600, 1, 1), i) {
            Answer::Refused { earliest, .. } => assert_eq!(earliest, Some((at(4000), at(4000)))),
            other => panic!("{other:?}"),
        }
        let one = [window(3000, 4000, "n0")];
        i.windows = &one;
        let b = booked(decide(&request("a", 3600, 3600, 1, 1), i));
        assert_eq!(b.nodes(), vec!["n1"]);
        let before = [window(0, 3600, "n0")];
        i.windows = &before;
        let b = booked(decide(&request("a", 3600, 3600, 2, 4), i));
        assert_eq!(b.nodes(), vec!["n0", "n1"]);
    }

    /// The record's JSON: times in epoch milliseconds, amounts beside the node.
    #[test]
    fn the_record_reads_back() {
        let b = booked(decide(
            &request("a", 60, 60, 1, 1),
            inputs(&nodes(1, 4), &[], &[]),
        ));
        let text = serde_json::to_string(&b).unwrap();
        assert!(text.contains("\"start\":1800000060000"), "{text}");
        assert!(text.contains("\"node\":\"n0\",\"cpuMilli\":1000"), "{text}");
        assert_eq!(serde_json::from_str::<Booking>(&text).unwrap(), b);
    }
}
