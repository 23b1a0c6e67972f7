//! When a waiting job hears its start-time estimate again: a bound that moves later at once, anything
//! else only past a tolerance that grows with the start's distance and with each estimate told, so a
//! person hears a handful while the job waits (docs/estimates.md).

use jiff::{SignedDuration, Timestamp};

/// How much later than what it was told a job's start must move before it is told again: less is noise
/// of the replay (a job ahead that fits now is placed at the instant of each replay), more is news.
pub const LATER_SLACK: SignedDuration = SignedDuration::from_secs(10);

/// How much earlier than what it was told a start `distance` away must move before the job is told
/// again: a minute for a start ten minutes away, an hour for one a day away, growing as a power of the
/// distance between them (`60 s × (distance / 600 s)^0.824`), and never less than `floor`
/// (`[monitor] estimate_tolerance`). A person does not plan around a start a day away to the minute.
pub fn telling_tolerance(distance: SignedDuration, floor: SignedDuration) -> SignedDuration {
    // ln(3600 / 60) / ln(86400 / 600): the exponent that joins the two points.
    const EXPONENT: f64 = 0.824;
    let secs = distance.as_secs_f64().max(0.0);
    let grown = 60.0 * (secs / 600.0).powf(EXPONENT);
    let grown = SignedDuration::try_from_secs_f64(grown.min(1e9)).unwrap_or(SignedDuration::ZERO);
    grown.max(floor)
}

/// What a waiting job was last told: the estimated start, whether it was a bound, how many
/// estimate events it has heard while it waits (that one included), and whether one before it was a
/// bound (so a bound withdrawn once comes back only with news: no flip-flopping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    pub start: Timestamp,
    pub bound: bool,
    pub times: u32,
    pub was_bound: bool,
}

impl Told {
    /// What a job was told after hearing `start` (a bound or not) when it was told `before` (`None`:
    /// nothing yet): the count goes up, and that a bound was told is kept.
    pub fn after(before: Option<Told>, start: Timestamp, bound: bool) -> Told {
        Told {
            start,
            bound,
            times: before.map_or(1, |b| b.times.saturating_add(1)),
            was_bound: before.is_some_and(|b| b.bound || b.was_bound),
        }
    }
}

/// The most times the telling tolerance is doubled (from the seventh event on: 64 times, an hour for a
/// start ten minutes away), so that a move far past anything foreseen is still told.
const MAX_DOUBLINGS: u32 = 6;

/// Whether a job that was last `told` should hear the fresh estimate (`start`, a bound or not), at
/// `now`. The tolerance is [`telling_tolerance`] of the distance to the fresh start, doubled for every
/// estimate the job has heard after the first, so that a job hears a handful of them while it waits:
/// - a kind changed: a bound become an expectation (the promise is withdrawn: told at once, or the
///   bound could break untold) or the reverse (it may now count on it), even at the same time; but a
///   job told a bound before, then an expectation, hears a bound again only with a start it would be
///   told anyway (hysteresis: a promise that comes and goes with each replay is no promise, and each
///   withdrawal costs an event);
/// - a bound moved later by more than [`LATER_SLACK`]: the promise no longer holds, and the person
///   must know, however often told;
/// - an expectation whose told start has gone by, when the fresh start is more than the (undoubled)
///   tolerance of its distance away: what the person was told is over, and the new start is news
///   however often told (not one a moment from now: a replay that keeps placing it now is noise);
/// - an expectation moved later, or either moved earlier, by more than the tolerance. An expectation
///   is not a promise: it moves with what ends early and with the queues' order, and a person plans by
///   it only to the tolerance of its distance; each move told makes the next one need twice as much,
///   and an expectation must also move by a share of the wait it was told ([`share_of_the_wait`]:
///   a quarter later, half earlier).
pub fn tell_again(
    told: Told,
    start: Timestamp,
    bound: bool,
    now: Timestamp,
    floor: SignedDuration,
) -> bool {
    if told.bound != bound {
        if bound && told.was_bound {
            return tell_again(told, start, false, now, floor);
        }
        return true;
    }
    if bound && start > told.start {
        return start.duration_since(told.start) > LATER_SLACK;
    }
    // What it was told has gone by: it is stale, whatever the count (a doubled tolerance of a start
    // far away would keep a start in the past for hours). Told again when the fresh start is more than
    // the tolerance of its distance away, not for a replay that puts it a moment from now.
    if told.start <= now && start > now {
        let distance = start.duration_since(now);
        return distance > telling_tolerance(distance, floor);
    }
    let doublings = told.times.saturating_sub(1).min(MAX_DOUBLINGS);
    let tolerance = telling_tolerance(start.duration_since(now), floor)
        .checked_mul(1 << doublings)
        .unwrap_or(SignedDuration::MAX);
    let tolerance = match bound {
        true => tolerance,
        false => tolerance.max(share_of_the_wait(told.start, start, now)),
    };
    start.duration_since(told.start).abs() > tolerance
}

/// How much of the wait it was told (from `now` to the start told) an expectation must move by to be
/// told again: a quarter of it later, half of it earlier. An expectation is not a promise, and a person
/// plans by it in proportion to the wait: told "in two hours", twenty minutes either way changes
/// nothing they do. Earlier takes more: nobody has to act on a job that starts sooner than they were
/// told (its start is told anyway), whereas a later one may move their plans. Behind a stream of
/// interactive sessions a batch job's expectation swings back and forth as sessions come and end: on
/// issue 45's workload (`tests/sim/promise.rs`, seed 1) each such swing was told, 4 to 7 estimates per
/// waiting batch job (median of all 4); with the shares the median is 2.
fn share_of_the_wait(told: Timestamp, start: Timestamp, now: Timestamp) -> SignedDuration {
    let wait = told.duration_since(now).max(SignedDuration::ZERO);
    if start < told { wait / 2 } else { wait / 4 }
}

/// What of a waiting job's reason it is told again for: its category, not a count or a wording that
/// wiggles. For the scheduler's reasons (`unschedulable`, `queued`) that is the reason itself and what
/// the monitor adds to it (a window that keeps it off nodes, that it can never start), not the jobs
/// ahead in its queue (they move with every job that starts) nor the scheduler's shortfall text (it
/// alternates between "16 vCPU and 64 GiB memory" and "64 GiB memory" as nodes free and fill). Those
/// are told with the next event that is told for a reason; any other reason is told whenever its text
/// changes (a peer named, an image pull's deadline).
pub fn reason_category(reason: &str, text: &str) -> String {
    if !matches!(reason, "unschedulable" | "queued") {
        return text.to_owned();
    }
    text.split("; ")
        .skip(1)
        .filter(|part| !part.contains(" ahead in queue "))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_scheduler_reasons_counts_and_shortfall_wording_are_no_news() {
        let a = "waiting for resources: 1 of 1 pod need 16 vCPU and 64 GiB memory each; 3 jobs ahead in queue q";
        let b = "waiting for resources: 1 of 1 pod need 64 GiB memory each; at least 1 job ahead in queue q";
        assert_eq!(
            reason_category("unschedulable", a),
            reason_category("unschedulable", b)
        );
        let kept_off = format!("{b}; kept off the nodes of the maintenance window w until 12:00");
        assert_ne!(
            reason_category("unschedulable", a),
            reason_category("unschedulable", &kept_off),
            "what the monitor adds is news"
        );
        assert_eq!(
            reason_category("queued", "waiting in queue q; 2 jobs ahead in queue q"),
            reason_category("queued", "waiting in queue q")
        );
        assert_ne!(
            reason_category("waiting_for_peer", "The job waits for its peer a to start"),
            reason_category("waiting_for_peer", "The job waits for its peer b to start")
        );
    }

    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn a_start_that_moves_earlier_is_told_only_past_a_tolerance_growing_with_its_distance() {
        let minute = SignedDuration::from_secs(60);
        let tol = |secs: i64| telling_tolerance(SignedDuration::from_secs(secs), minute).as_secs();
        assert_eq!(tol(60), 60, "never under the floor");
        assert_eq!(tol(600), 60, "a minute for ten minutes away");
        assert!(
            (3500..=3700).contains(&tol(86_400)),
            "an hour for a day: {}",
            tol(86_400)
        );
        assert!(tol(3600) > 60 && tol(3600) < 3600 / 4, "{}", tol(3600));
        let by = |s: i64| Told {
            start: t(s),
            bound: true,
            times: 1,
            was_bound: false,
        };
        let again = |told: Told, s: i64| tell_again(told, t(s), told.bound, t(0), minute);
        // Ten minutes away: two minutes earlier is news, thirty seconds is not.
        assert!(again(by(720), 600));
        assert!(!again(by(630), 600));
        // A day away: half an hour earlier is not news, two hours are.
        assert!(!again(by(86_400 + 1800), 86_400));
        assert!(again(by(86_400 + 7200), 86_400));
        // A bound later is told past a few seconds, however far away and however often told.
        assert!(again(by(86_400), 86_400 + 11));
        assert!(again(
            Told {
                times: 9,
                ..by(600)
            },
            611
        ));
        assert!(!again(by(600), 605));
        assert!(!again(by(600), 600));
    }

    #[test]
    fn an_expectation_is_told_again_past_a_tolerance_that_doubles_with_each_one_told() {
        let minute = SignedDuration::from_secs(60);
        let at = |s: i64, times: u32| Told {
            start: t(s),
            bound: false,
            times,
            was_bound: false,
        };
        let again = |told: Told, s: i64| tell_again(told, t(s), false, t(0), minute);
        // The first told, a minute away (the share of the wait, below, is less): a minute either way
        // is the tolerance.
        let soon = |told: Told, s: i64| tell_again(told, t(s), false, t(540), minute);
        assert!(!soon(at(600, 1), 650), "later within the tolerance");
        assert!(soon(at(600, 1), 670), "later past it");
        assert!(!soon(at(650, 1), 600));
        assert!(soon(at(670, 1), 600));
        // After the third: four times as much (some five minutes).
        assert!(!again(at(600, 3), 830));
        assert!(again(at(600, 3), 1000));
        assert!(!again(at(850, 3), 620));
        // However many were told, a change of kind is told at once: a promise withdrawn or made.
        assert!(tell_again(at(600, 50), t(600), true, t(0), minute));
        let by = Told {
            bound: true,
            ..at(600, 50)
        };
        assert!(tell_again(by, t(600), false, t(0), minute));
        // And the doubling stops at 64 times (an hour for a start ten minutes away), not at an overflow.
        assert!(!again(at(600 + 3800, u32::MAX), 600));
        assert!(again(at(600 + 3900, u32::MAX), 600));
        assert!(again(at(600 + 3900, 7), 600));
        // An expectation that has gone by is told again once the start is later, whatever the count.
        let late = |told: Told, s: i64| tell_again(told, t(s), false, t(700), minute);
        assert!(
            late(at(600, 8), 2400),
            "its start is past and the new one far later"
        );
        assert!(!late(at(600, 8), 730), "a moment from now: noise");
    }

    /// An expectation is told again only when it moves by a share of the wait it was told: a quarter
    /// later, half earlier; a bound is not (later is told past a few seconds, earlier past the tolerance).
    #[test]
    fn an_expectation_moves_by_a_share_of_the_wait_before_it_is_told_again() {
        let minute = SignedDuration::from_secs(60);
        let told = |bound: bool| Told {
            start: t(7200),
            bound,
            times: 1,
            was_bound: false,
        };
        let again = |bound: bool, s: i64| tell_again(told(bound), t(s), bound, t(0), minute);
        // Two hours away: the tolerance is some six minutes; a quarter of the wait is half an hour.
        assert!(!again(false, 7200 + 1200), "twenty minutes later: not news");
        assert!(again(false, 7200 + 1900), "over half an hour later");
        assert!(
            !again(false, 7200 - 3000),
            "fifty minutes earlier: not news"
        );
        assert!(again(false, 7200 - 3700), "over an hour earlier");
        // A bound: later past the slack, earlier past the tolerance of its distance.
        assert!(again(true, 7200 + 20));
        assert!(again(true, 7200 - 1200));
    }

    #[test]
    fn a_bound_withdrawn_once_comes_back_only_with_news() {
        let minute = SignedDuration::from_secs(60);
        let withdrawn = Told {
            start: t(600),
            bound: false,
            times: 2,
            was_bound: true,
        };
        // The same start, or a little earlier, as a bound again: not told (it would flip back and forth
        // with each replay).
        assert!(!tell_again(withdrawn, t(600), true, t(0), minute));
        assert!(!tell_again(withdrawn, t(560), true, t(0), minute));
        // Much earlier: news, told (as the bound it now is).
        assert!(tell_again(withdrawn, t(200), true, t(0), minute));
        // Never told a bound: a bound is told at once.
        let never_bound = Told {
            was_bound: false,
            ..withdrawn
        };
        assert!(tell_again(never_bound, t(600), true, t(0), minute));
        // A bound withdrawn is told at once, however often it came and went.
        let bound = Told {
            bound: true,
            ..withdrawn
        };
        assert!(tell_again(bound, t(600), false, t(0), minute));
    }
}
