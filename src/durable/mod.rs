//! A job's durable record and the ids derived from it, in one place.
//!
//! A runner holds caches only: what was done to a job is recorded on its VolcanoJob, as annotations
//! ([`annotations`]), and every event published about the job has an id that is a pure function of that
//! record and of what happened ([`ids`]), so a runner that repeats work after a crash publishes the same
//! messages under the same ids and consumers drop the copies. The runner writes the record at create;
//! the pipeline's hooks and the monitor read and extend it.

pub mod annotations;
pub mod history;
pub mod ids;

pub use annotations::AnnotationKeys;

use jiff::Timestamp;

use crate::messages::proto_timestamp;
use crate::messages::v1::{JobEvent, JobState};

/// The reason of QUEUED.
pub const SUBMITTED: &str = "submitted";

/// QUEUED: the job's objects were created at `created_at` (the VolcanoJob's creationTimestamp) by runner
/// `accepted_by` (its `acceptedBy` annotation). Built from the record alone, so the runner (after its
/// create, or on a redelivery that finds the job) and the monitor (before its first event of a job whose
/// QUEUED may never have gone out) publish the very same message.
pub fn queued_event(job_id: &str, created_at: Timestamp, accepted_by: &str) -> JobEvent {
    JobEvent {
        event_id: ids::transition(job_id, JobState::Queued),
        job_id: job_id.to_owned(),
        state: JobState::Queued as i32,
        status: "Queued: waiting for the scheduler to place every rank".into(),
        reason: SUBMITTED.into(),
        timestamp: Some(proto_timestamp(created_at)),
        runner_id: accepted_by.to_owned(),
        ..JobEvent::default()
    }
}
