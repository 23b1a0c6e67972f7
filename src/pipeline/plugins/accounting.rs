//! Accounting: charging for a running job in fixed ticks, as a pure computation.
//!
//! With the job's real start `S` and the period `P` (config `accounting.period`, persisted on the job at
//! create so a configuration change never shifts a running job's ticks), tick `n` covers
//! `[S + n·P, S + (n+1)·P)` and has the id `<jobId>/<n>`. While the job runs, a tick is due once it is
//! complete and the cluster's view has had `[pipeline.accounting] settle` to report an earlier end
//! (`S + (n+1)·P + settle ≤ now`). When the job has ended at `E`, the remaining ticks are due and the last
//! one ends exactly at `E` (`final`). So ticks never leave a gap, never overlap, never start before the
//! job ran, and never charge past its real end (W16–W20): a job that ran 61 s with `P` = 60 s gets ticks
//! `0` `[S, S+60s)` and `1` `[S+60s, S+61s)` final.
//!
//! Every tick has a duration: there is never a zero-length tick. A job whose end falls exactly on a boundary
//! gets that tick as its final one (its end is seen within the settle delay, before the tick would be
//! charged as running). Only a cluster whose view lags by more than the settle delay can have a tick
//! charged to its boundary before the end is seen; the job then has no further tick, and its terminal
//! event marks the end.
//!
//! A job deleted because it expired is charged up to its expiry, not for the seconds its pods took to
//! stop.
//!
//! The persisted cursor is `accountedTicks` (how many ticks were published, i.e. the next `n`) and
//! `accountingFinal`. The hooks publish the due ticks first and then advance the cursor with a patch
//! guarded by the resourceVersion: a tick published twice has the same id and content, so consumers drop
//! the duplicate, and a tick is never skipped (W19).

use jiff::{SignedDuration, Timestamp};

use super::{Plugin, PluginId};
use crate::messages::v1::AccountingTick;
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::hooks::{
    HookActions, HookContext, HookError, JobFacts, Outbound, TerminationCause, proto_timestamp,
};

/// When ticks start and how long they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickSchedule {
    start: Timestamp,
    period: SignedDuration,
}

/// How far accounting got: the next tick's index, and whether the final tick was published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickCursor {
    /// Index of the next tick to publish.
    pub next: u64,
    /// The final tick was published: nothing more is ever due.
    pub finished: bool,
}

/// Up to when ticks are due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Horizon {
    /// The job is still running at this instant: only complete ticks are due.
    Running(Timestamp),
    /// The job ended at this instant (its real end): every remaining tick is due, the last one final.
    Ended(Timestamp),
}

/// One interval to charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// `n`.
    pub sequence: u64,
    /// Start of the interval (inclusive).
    pub start: Timestamp,
    /// End of the interval (exclusive); the real end for the final tick.
    pub end: Timestamp,
    /// The last tick of the job.
    pub is_final: bool,
}

impl Tick {
    /// `<jobId>/<n>` ([`crate::durable::ids::tick`]).
    pub fn id(&self, job_id: &str) -> String {
        crate::durable::ids::tick(job_id, self.sequence)
    }

    /// Length of the interval (per replica).
    pub fn duration(&self) -> SignedDuration {
        self.end.duration_since(self.start)
    }

    /// The message to publish, with the owner and product from the job's facts: for a whole-node job
    /// with a persisted whole-node charge, that charge (each rank holds a node, whatever it asked for).
    pub fn to_message(&self, facts: &JobFacts) -> AccountingTick {
        let p = &facts.product;
        let (product_id, cpu, memory_gib, gpu) = match &facts.whole_node {
            Some(w) => (w.product.clone(), w.cpu, w.memory_gib, w.gpu),
            None => (p.id.clone(), p.cpu, p.memory_gib, p.gpu),
        };
        AccountingTick {
            tick_id: self.id(&facts.job_id),
            job_id: facts.job_id.clone(),
            user: facts.owner.user.clone(),
            project: facts.owner.project.clone(),
            product_id,
            replicas: facts.replicas,
            cpu,
            memory_gib,
            gpu,
            exclusive_nodes: facts.exclusive_nodes,
            interval_start: Some(proto_timestamp(self.start)),
            interval_end: Some(proto_timestamp(self.end)),
            duration_ms: i64::try_from(self.duration().as_millis()).unwrap_or(i64::MAX),
            r#final: self.is_final,
            sequence: self.sequence,
        }
    }
}

impl TickSchedule {
    /// Ticks of `period` from `start`; `None` when the period is not positive.
    pub fn new(start: Timestamp, period: SignedDuration) -> Option<Self> {
        period.is_positive().then_some(Self { start, period })
    }

    /// The job's real start, where tick 0 begins.
    pub fn start(&self) -> Timestamp {
        self.start
    }

    /// The tick length.
    pub fn period(&self) -> SignedDuration {
        self.period
    }

    /// `start + n·period`, `None` when out of range.
    pub fn boundary(&self, n: u64) -> Option<Timestamp> {
        let n = i32::try_from(n).ok()?;
        self.start.checked_add(self.period.checked_mul(n)?).ok()
    }

    /// The ticks due after `cursor` up to `horizon`, in order. Lazy: take as many as you publish.
    pub fn due(&self, cursor: TickCursor, horizon: Horizon) -> DueTicks {
        DueTicks {
            schedule: *self,
            cursor,
            horizon,
        }
    }
}

/// Iterator over due ticks; [`DueTicks::cursor`] is the cursor after the ticks taken so far.
#[derive(Debug, Clone)]
pub struct DueTicks {
    schedule: TickSchedule,
    cursor: TickCursor,
    horizon: Horizon,
}

impl DueTicks {
    /// The cursor to persist once every tick taken so far is published.
    pub fn cursor(&self) -> TickCursor {
        self.cursor
    }
}

impl Iterator for DueTicks {
    type Item = Tick;

    fn next(&mut self) -> Option<Tick> {
        if self.cursor.finished {
            return None;
        }
        let n = self.cursor.next;
        let start = self.schedule.boundary(n)?;
        let full_end = self.schedule.boundary(n.checked_add(1)?)?;
        let tick = match self.horizon {
            Horizon::Running(now) => {
                if full_end > now {
                    return None;
                }
                Tick {
                    sequence: n,
                    start,
                    end: full_end,
                    is_final: false,
                }
            }
            Horizon::Ended(end) => {
                // Nothing left to charge (the job ran no time, or its end was seen only after the tick up
                // to it was charged): no zero-length tick.
                if end <= start {
                    self.cursor.finished = true;
                    return None;
                }
                Tick {
                    sequence: n,
                    start,
                    end: end.clamp(start, full_end),
                    is_final: end <= full_end,
                }
            }
        };
        self.cursor = TickCursor {
            next: n + 1,
            finished: tick.is_final,
        };
        Some(tick)
    }
}

/// The Accounting plugin; the module documentation says what it builds and why.
pub struct Accounting;

impl Plugin for Accounting {
    fn id(&self) -> PluginId {
        PluginId::Accounting
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let period = cx.pipeline().accounting.period;
        if period < SignedDuration::from_millis(1) {
            return Err(PipelineError::config(
                "accounting.period",
                "must be positive",
            ));
        }
        if cx.pipeline().accounting.settle.is_negative() {
            return Err(PipelineError::config(
                "accounting.settle",
                "must not be negative",
            ));
        }
        draft.annotate(&cx.keys.accounting_period, period.as_millis().to_string());
        Ok(())
    }

    fn on_start(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        if let Some(schedule) = schedule(cx.facts)? {
            let settle = cx.pipeline.accounting.settle;
            let next = schedule
                .boundary(cx.facts.accounted_ticks + 1)
                .unwrap_or(cx.now);
            out.check_at(next.checked_add(settle).unwrap_or(next));
        }
        Ok(())
    }

    fn on_monitoring(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        // Only time the cluster's view has had `settle` to prove: a job that ended just before a
        // boundary must not be charged the whole tick because its end was reported late.
        let settle = cx.pipeline.accounting.settle;
        let proven = cx.now.checked_sub(settle).unwrap_or(cx.now);
        publish(cx, Horizon::Running(proven), out)
    }

    fn on_completion(&self, cx: &HookContext<'_>, out: &mut HookActions) -> Result<(), HookError> {
        let mut end = cx.ended_at.unwrap_or(cx.now);
        // A job deleted because its time ran out is not charged for the seconds its pods took to stop.
        if cx.facts.termination_cause == Some(TerminationCause::Expired)
            && let Some(expiry) = cx.facts.expiry
        {
            end = end.min(expiry);
        }
        publish(cx, Horizon::Ended(end), out)
    }
}

fn schedule(facts: &JobFacts) -> Result<Option<TickSchedule>, HookError> {
    let Some(start) = facts.start else {
        return Ok(None);
    };
    TickSchedule::new(start, facts.accounting_period)
        .map(Some)
        .ok_or_else(|| HookError::Invalid("the accounting period is not positive".into()))
}

/// Publishes every due tick, then advances the cursor.
fn publish(cx: &HookContext<'_>, horizon: Horizon, out: &mut HookActions) -> Result<(), HookError> {
    let facts = cx.facts;
    let Some(schedule) = schedule(facts)? else {
        return Ok(());
    };
    let cursor = TickCursor {
        next: facts.accounted_ticks,
        finished: facts.accounting_final,
    };
    let mut due = schedule.due(cursor, horizon);
    let mut until = None;
    for tick in due.by_ref() {
        until = Some(tick.end);
        out.publish
            .push(Outbound::Accounting(tick.to_message(facts)));
    }
    let after = due.cursor();
    if after != cursor {
        out.set
            .insert(cx.keys.accounted_ticks.clone(), after.next.to_string());
        // For people (`volcano-runner job`): what the ticks charged add up to, exactly.
        if let Some(until) = until {
            out.set.insert(
                cx.keys.accounted_until.clone(),
                until.as_millisecond().to_string(),
            );
        }
        if after.finished {
            out.set
                .insert(cx.keys.accounting_final.clone(), "true".into());
        }
    }
    if let (Horizon::Running(_), false) = (horizon, after.finished)
        && let Some(next) = schedule.boundary(after.next + 1)
    {
        let settle = cx.pipeline.accounting.settle;
        out.check_at(next.checked_add(settle).unwrap_or(next));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn sched() -> TickSchedule {
        TickSchedule::new(ts(1000), SignedDuration::from_secs(60)).unwrap()
    }

    fn spans(ticks: &[Tick]) -> Vec<(u64, i64, i64, bool)> {
        ticks
            .iter()
            .map(|t| {
                (
                    t.sequence,
                    t.start.as_second(),
                    t.end.as_second(),
                    t.is_final,
                )
            })
            .collect()
    }

    #[test]
    fn running_job_gets_only_complete_ticks() {
        let ticks: Vec<Tick> = sched()
            .due(TickCursor::default(), Horizon::Running(ts(1000 + 150)))
            .collect();
        assert_eq!(
            spans(&ticks),
            [(0, 1000, 1060, false), (1, 1060, 1120, false)]
        );
        let none: Vec<Tick> = sched()
            .due(
                TickCursor {
                    next: 2,
                    finished: false,
                },
                Horizon::Running(ts(1170)),
            )
            .collect();
        assert!(none.is_empty());
    }

    #[test]
    fn final_tick_ends_at_the_real_end() {
        let ticks: Vec<Tick> = sched()
            .due(
                TickCursor {
                    next: 1,
                    finished: false,
                },
                Horizon::Ended(ts(1061)),
            )
            .collect();
        assert_eq!(spans(&ticks), [(1, 1060, 1061, true)]);
        assert_eq!(ticks[0].id("42"), "42/1");
        assert_eq!(ticks[0].duration(), SignedDuration::from_secs(1));
    }

    #[test]
    fn end_on_a_boundary() {
        // Not yet published: the full tick is final.
        let ticks: Vec<Tick> = sched()
            .due(
                TickCursor {
                    next: 1,
                    finished: false,
                },
                Horizon::Ended(ts(1120)),
            )
            .collect();
        assert_eq!(spans(&ticks), [(1, 1060, 1120, true)]);
        // Already published while running (a view that lagged past the settle delay): no zero-length
        // tick; the cursor is finished.
        let mut due = sched().due(
            TickCursor {
                next: 2,
                finished: false,
            },
            Horizon::Ended(ts(1120)),
        );
        assert_eq!(due.next(), None);
        assert!(due.cursor().finished);
    }

    #[test]
    fn never_before_start_and_never_twice_final() {
        // An end before the start (clocks of two nodes): nothing ran, nothing is charged.
        let mut due = sched().due(TickCursor::default(), Horizon::Ended(ts(500)));
        assert_eq!(due.next(), None);
        assert!(due.cursor().finished);
        assert!(
            sched()
                .due(TickCursor::default(), Horizon::Running(ts(500)))
                .next()
                .is_none()
        );
        assert!(
            sched()
                .due(
                    TickCursor {
                        next: 3,
                        finished: true
                    },
                    Horizon::Ended(ts(5000))
                )
                .next()
                .is_none()
        );
    }

    #[test]
    fn cursor_follows_what_was_taken() {
        let mut due = sched().due(TickCursor::default(), Horizon::Ended(ts(1000 + 61)));
        assert_eq!(
            due.cursor(),
            TickCursor {
                next: 0,
                finished: false
            }
        );
        due.next();
        assert_eq!(
            due.cursor(),
            TickCursor {
                next: 1,
                finished: false
            }
        );
        due.next();
        assert_eq!(
            due.cursor(),
            TickCursor {
                next: 2,
                finished: true
            }
        );
        assert!(due.next().is_none());
    }

    #[test]
    fn non_positive_period_is_refused() {
        assert!(TickSchedule::new(ts(0), SignedDuration::ZERO).is_none());
        assert!(TickSchedule::new(ts(0), SignedDuration::from_secs(-1)).is_none());
    }
}
