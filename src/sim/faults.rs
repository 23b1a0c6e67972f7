//! Fault injection: added latency, a fraction of requests answered 500, 503 or 429 (with `Retry-After`),
//! watches cut after some events or seconds, and windows of total unavailability, per resource and verb.
//! Set at start from configuration or flags, and at run time from tests through the handle. Random
//! choices come from a seeded generator, so a test run repeats.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::error::ApiError;

/// One rule of a fault plan. Every field has a neutral default, so a rule names only what it changes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FaultRule {
    /// The resource it applies to: `pods`, `jobs`, `jobs.batch.volcano.sh` or a subresource such as
    /// `pods/log`. Empty applies to every resource (discovery and health checks are never affected).
    pub resource: String,
    /// The verb it applies to: get, list, watch, create, update, patch, delete, deletecollection.
    /// Empty applies to every verb.
    pub verb: String,
    /// Added to every matching request before it is served, so that timeouts and slow paths show.
    pub latency_ms: u64,
    /// Fraction (0..1) of matching requests answered 500 InternalError.
    pub error_500: f64,
    /// Fraction of matching requests answered 503 ServiceUnavailable.
    pub error_503: f64,
    /// Fraction of matching requests answered 429 TooManyRequests.
    pub error_429: f64,
    /// Fraction of matching requests answered 422 Invalid: a refusal that no retry changes, as an
    /// admission webhook or a validation rule gives.
    pub error_422: f64,
    /// Fraction of matching requests answered 403 Forbidden, as RBAC answers a request the service
    /// account may not make.
    pub error_403: f64,
    /// `Retry-After` seconds sent with 429 and 503 (0 lets clients retry at once, which keeps tests fast).
    pub retry_after_secs: u64,
    /// A matching watch is cut (the connection drops) after this many events.
    pub watch_cut_after_events: Option<u64>,
    /// A matching watch is cut after this many seconds (real time).
    pub watch_cut_after_secs: Option<f64>,
    /// Fraction (0..1) of a matching watch's events silently never sent, while the watch goes on and its
    /// bookmarks move past them: the quiet loss that only a full reconciliation can catch (W1).
    pub watch_lose_events: f64,
}

impl FaultRule {
    fn matches(&self, verb: &str, resource: &str, group: &str, sub: Option<&str>) -> bool {
        let verb_ok = self.verb.is_empty() || self.verb == verb;
        let full = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        let res_ok = self.resource.is_empty()
            || match sub {
                Some(s) => {
                    self.resource == format!("{resource}/{s}")
                        || self.resource == format!("{full}/{s}")
                }
                None => self.resource == resource || self.resource == full,
            };
        verb_ok && res_ok
    }
}

/// A set of fault rules plus an unavailability window.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FaultPlan {
    /// Rules; every rule that matches a request applies (latencies add up, error fractions add up).
    pub rules: Vec<FaultRule>,
    /// Seconds after start at which every request starts failing with 503 (with `unavailable_secs`).
    pub unavailable_from_secs: Option<f64>,
    /// Length of the unavailability window.
    pub unavailable_secs: Option<f64>,
    /// Seed of the generator that picks which requests fail.
    pub seed: u64,
}

/// What the fault plan does to one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub latency: Duration,
    pub error: Option<ApiError>,
    pub cut_after_events: Option<u64>,
    pub cut_after: Option<Duration>,
    /// Fraction of a watch's events lost (evenly spread: every `1/f`-th event).
    pub lose_events: f64,
}

#[derive(Debug)]
struct State {
    plan: FaultPlan,
    rng: u64,
    unavailable_until: Option<Instant>,
    window: Option<(Instant, Instant)>,
}

/// The live fault plan of a running simulator.
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
}

/// The unavailability window from `start`. One that begins too late for an instant to hold never begins;
/// one too long to hold lasts a century (no panic for `1e30` seconds from a configuration file).
fn window(plan: &FaultPlan, start: Instant) -> Option<(Instant, Instant)> {
    let from = plan.unavailable_from_secs?;
    let len = plan.unavailable_secs?;
    let a = start.checked_add(seconds(from))?;
    let end = a
        .checked_add(seconds(len))
        .or_else(|| a.checked_add(CENTURY))?;
    Some((a, end))
}

/// A hundred years: "forever" for a fault window.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Seconds from the plan as a duration: negative or NaN is zero, too long to hold is the longest one.
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX)
}

impl Faults {
    /// A live plan; an unavailability window in it counts from now.
    pub fn new(plan: FaultPlan) -> Self {
        let now = Instant::now();
        Faults {
            state: Mutex::new(State {
                rng: plan.seed ^ 0x5DEE_CE66_D1CE_5EED,
                window: window(&plan, now),
                plan,
                unavailable_until: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the plan (its unavailability window counts from now).
    pub fn set(&self, plan: FaultPlan) {
        let mut s = self.lock();
        s.window = window(&plan, Instant::now());
        s.rng = plan.seed ^ 0x5DEE_CE66_D1CE_5EED;
        s.plan = plan;
    }

    /// Removes every fault.
    pub fn clear(&self) {
        self.set(FaultPlan::default());
        self.lock().unavailable_until = None;
    }

    /// Adds one rule to the current plan.
    pub fn add_rule(&self, rule: FaultRule) {
        self.lock().plan.rules.push(rule);
    }

    /// Makes every request fail with 503 for `d` from now.
    pub fn unavailable_for(&self, d: Duration) {
        self.lock().unavailable_until = Some(Instant::now() + d);
    }

    /// The current plan.
    pub fn plan(&self) -> FaultPlan {
        self.lock().plan.clone()
    }

    fn next_unit(s: &mut State) -> f64 {
        s.rng = s.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Whether the server is inside an unavailability window now.
    pub fn unavailable_now(&self) -> Option<ApiError> {
        let s = self.lock();
        let now = Instant::now();
        let until = s.unavailable_until.filter(|u| now < *u);
        let in_window = s.window.is_some_and(|(a, b)| now >= a && now < b);
        if until.is_some() || in_window {
            Some(ApiError::unavailable(
                "the server is currently unable to handle the request",
                Some(1),
            ))
        } else {
            None
        }
    }

    /// Decides the fate of a resource request.
    pub fn decide(&self, verb: &str, resource: &str, group: &str, sub: Option<&str>) -> Decision {
        if let Some(e) = self.unavailable_now() {
            return Decision {
                error: Some(e),
                ..Decision::default()
            };
        }
        let mut s = self.lock();
        let matching: Vec<FaultRule> = s
            .plan
            .rules
            .iter()
            .filter(|r| r.matches(verb, resource, group, sub))
            .cloned()
            .collect();
        if matching.is_empty() {
            return Decision::default();
        }
        let mut d = Decision::default();
        let (mut p500, mut p503, mut p429, mut p422, mut p403, mut retry) =
            (0.0, 0.0, 0.0, 0.0, 0.0, 0u64);
        for r in &matching {
            d.latency += Duration::from_millis(r.latency_ms);
            p500 += r.error_500.max(0.0);
            p503 += r.error_503.max(0.0);
            p429 += r.error_429.max(0.0);
            p422 += r.error_422.max(0.0);
            p403 += r.error_403.max(0.0);
            retry = retry.max(r.retry_after_secs);
            if let Some(n) = r.watch_cut_after_events {
                d.cut_after_events = Some(d.cut_after_events.map_or(n, |m| m.min(n)));
            }
            d.lose_events = (d.lose_events + r.watch_lose_events.max(0.0)).min(1.0);
            if let Some(secs) = r.watch_cut_after_secs {
                let c = seconds(secs);
                d.cut_after = Some(d.cut_after.map_or(c, |m| m.min(c)));
            }
        }
        let u = Self::next_unit(&mut s);
        d.error = if u < p500 {
            Some(ApiError::internal("simulated fault"))
        } else if u < p500 + p503 {
            Some(ApiError::unavailable(
                "simulated fault: the server is currently unable to handle the request",
                Some(retry),
            ))
        } else if u < p500 + p503 + p429 {
            Some(ApiError::too_many_requests(retry))
        } else if u < p500 + p503 + p429 + p422 {
            Some(ApiError::unprocessable(
                "simulated fault: the request is invalid and will stay so",
            ))
        } else if u < p500 + p503 + p429 + p422 + p403 {
            Some(ApiError::forbidden(
                resource,
                group,
                "",
                &format!("simulated fault: this user may not {verb} {resource}"),
            ))
        } else {
            None
        };
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_too_long_to_hold_never_panic() {
        let plan = |from: f64, len: f64| FaultPlan {
            unavailable_from_secs: Some(from),
            unavailable_secs: Some(len),
            ..Default::default()
        };
        let now = Instant::now();
        assert_eq!(window(&plan(1e30, 1.0), now), None);
        let (a, end) = window(&plan(0.0, 1e30), now).expect("a window from now");
        assert_eq!((a, end), (now, now + CENTURY));
        assert_eq!(
            window(&plan(f64::NAN, 1e300), now),
            Some((now, now + CENTURY))
        );
        let f = Faults::new(FaultPlan {
            rules: vec![FaultRule {
                watch_cut_after_secs: Some(1e30),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(
            f.decide("watch", "pods", "", None).cut_after,
            Some(Duration::MAX)
        );
    }

    #[test]
    fn rules_match_by_resource_and_verb() {
        let f = Faults::new(FaultPlan {
            rules: vec![FaultRule {
                resource: "jobs.batch.volcano.sh".into(),
                verb: "create".into(),
                error_503: 1.0,
                retry_after_secs: 7,
                ..Default::default()
            }],
            ..Default::default()
        });
        let d = f.decide("create", "jobs", "batch.volcano.sh", None);
        let e = d.error.unwrap();
        assert_eq!(e.code, 503);
        assert_eq!(e.retry_after, Some(7));
        assert_eq!(
            f.decide("get", "jobs", "batch.volcano.sh", None).error,
            None
        );
        assert_eq!(f.decide("create", "pods", "", None).error, None);
    }

    #[test]
    fn fractions_are_roughly_respected_and_repeatable() {
        let plan = FaultPlan {
            rules: vec![FaultRule {
                error_429: 0.25,
                ..Default::default()
            }],
            seed: 3,
            ..Default::default()
        };
        let run = || {
            let f = Faults::new(plan.clone());
            (0..4000)
                .filter(|_| f.decide("get", "pods", "", None).error.is_some())
                .count()
        };
        let n = run();
        assert!((800..1200).contains(&n), "{n}");
        assert_eq!(n, run());
    }

    #[test]
    fn unavailability_window() {
        let f = Faults::new(FaultPlan::default());
        assert!(f.unavailable_now().is_none());
        f.unavailable_for(Duration::from_secs(60));
        assert_eq!(f.decide("get", "pods", "", None).error.unwrap().code, 503);
        f.clear();
        assert!(f.decide("get", "pods", "", None).error.is_none());
    }

    #[test]
    fn watch_cuts_take_the_smallest() {
        let f = Faults::new(FaultPlan {
            rules: vec![
                FaultRule {
                    verb: "watch".into(),
                    watch_cut_after_events: Some(5),
                    ..Default::default()
                },
                FaultRule {
                    resource: "pods".into(),
                    watch_cut_after_events: Some(2),
                    latency_ms: 10,
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let d = f.decide("watch", "pods", "", None);
        assert_eq!(d.cut_after_events, Some(2));
        assert_eq!(d.latency, Duration::from_millis(10));
    }

    #[test]
    fn lost_event_fractions_add_up_to_at_most_all() {
        let rule = |resource: &str, f: f64| FaultRule {
            resource: resource.into(),
            verb: "watch".into(),
            watch_lose_events: f,
            ..Default::default()
        };
        let f = Faults::new(FaultPlan {
            rules: vec![rule("pods", 0.25), rule("", 0.5), rule("jobs", 0.75)],
            ..Default::default()
        });
        assert_eq!(f.decide("watch", "pods", "", None).lose_events, 0.75);
        assert_eq!(f.decide("watch", "jobs", "", None).lose_events, 1.0);
        assert_eq!(f.decide("list", "pods", "", None).lose_events, 0.0);
    }
}
