//! Volcano's `sla` scheduler plugin, as the simulator's scheduler applies it. A job may carry the
//! annotation `sla-waiting-time` (a Go duration such as `1h2m3s`; the job controller carries the job's
//! annotations to its PodGroup, where the plugin reads them). Once its PodGroup has waited that long
//! since it was created, the plugin:
//! - lets it into its queue at once (`JobEnqueueableFn` permits it whatever the over-commit check says);
//! - puts it first (`JobOrderFn`: a job past its waiting time before one that is not, the earlier
//!   deadline first);
//! - keeps what it could place in a session even when its gang is not complete (`JobPipelinedFn`): the
//!   idle resources its ranks were given stay locked for the rest of the session, so no job tried after
//!   it takes them. The next session tries it first again, so what it locked stays locked until the
//!   whole gang fits.
//!
//! What it does not do (nor does Volcano): a rank that fits on no node now locks nothing, so the free
//! part of a node too full for one of its ranks stays open to other jobs.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use super::Model;
use crate::sim::api::Core;
use crate::sim::encode::ObjectKey;
use crate::sim::json::JsonPath;

/// The job annotation the `sla` plugin reads.
pub const SLA_WAITING_TIME: &str = "sla-waiting-time";

/// A job's `sla-waiting-time`, when it has a valid one (Volcano ignores one it cannot parse).
pub(super) fn waiting_time(job: &Value) -> Option<SignedDuration> {
    let text = job
        .at("/metadata/annotations")
        .and_then(|a| a.get(SLA_WAITING_TIME))
        .and_then(Value::as_str)?;
    let d = crate::sim::parse_duration(text).ok()?;
    SignedDuration::try_from(d).ok()
}

impl Model {
    /// Notes a job's `sla-waiting-time` (or that it has none any more).
    pub(super) fn note_sla(&mut self, key: &ObjectKey, job: Option<&Value>) {
        match job.and_then(|j| Some((waiting_time(j)?, super::podgroup_name(j)))) {
            Some(sla) => {
                self.sla_jobs.insert(key.clone(), sla);
            }
            None => {
                self.sla_jobs.remove(key);
            }
        }
    }

    /// The waiting PodGroups past their waiting time, by their place in the scheduler's list, with the
    /// instant their waiting time ran out.
    pub(super) fn overdue_groups(&self, core: &Core) -> BTreeMap<u64, Timestamp> {
        let mut out = BTreeMap::new();
        for (job, (wait, group)) in &self.sla_jobs {
            let key = core.key_of(core.ids.podgroups, &job.namespace, group);
            let Some(seq) = self.group_order.get(&key) else {
                continue;
            };
            let Some(created) = core.store.get(&key).and_then(|pg| {
                pg.at("/metadata/creationTimestamp")
                    .and_then(Value::as_str)
                    .and_then(|t| t.parse::<Timestamp>().ok())
            }) else {
                continue;
            };
            let Ok(deadline) = created.checked_add(*wait) else {
                continue;
            };
            if deadline <= core.now {
                out.insert(*seq, deadline);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_waiting_time_is_read_as_volcano_writes_it_and_a_bad_one_is_ignored() {
        let job = |v: &str| json!({"metadata": {"annotations": {SLA_WAITING_TIME: v}}});
        assert_eq!(
            waiting_time(&job("1h2m3s")),
            Some(SignedDuration::from_secs(3723))
        );
        assert_eq!(
            waiting_time(&job("90s")),
            Some(SignedDuration::from_secs(90))
        );
        assert_eq!(waiting_time(&job("soon")), None);
        assert_eq!(waiting_time(&json!({"metadata": {}})), None);
    }
}
