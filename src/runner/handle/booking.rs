//! The booking of a submission with a start window (docs/bookings.md): decided before the job is
//! created, from the bookings' record and the cluster as they are ([`crate::cluster::Bookings`]); a
//! booked job is created at once, its pods gated until the booked start and tolerating its booking's
//! taint, so that its id is taken, a cancel finds it and `jobs` shows it; a refused one is never
//! created.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{PodSchedulingGate, Toleration};
use tracing::info;

use super::super::events;
use super::{Handler, Message, Settle};
use crate::cluster::bookings::{self, Amount, Answer, Booking, Fate, News, Request};
use crate::durable::{AnnotationKeys, ids};
use crate::messages::proto_timestamp;
use crate::messages::v1::{BookedWindow, BookingDetails, JobEvent, JobState, SubmitJob};
use crate::volcano::VolcanoJob;

/// A status event: the booking holds, with its start and nodes.
pub const BOOKED: &str = "booked";
/// FAILURE: the start window cannot be promised (with the earliest window that could).
pub const BOOKING_REFUSED: &str = "booking_refused";
/// An extension refused: it would run into another job's booked capacity.
pub const BOOKED_CAPACITY: &str = "booked_capacity";
/// A status event: the booking was cancelled with its job, and its capacity is free again.
pub const BOOKING_CANCELLED: &str = "booking_cancelled";

/// What one rank of the rendered job asks for: its pod template's requests, as the scheduler counts
/// them (init containers and sidecars included).
fn per_rank(vcjob: &VolcanoJob) -> Amount {
    vcjob
        .spec
        .tasks
        .first()
        .and_then(|t| t.template.spec.as_ref())
        .map(bookings::pod_spec_requests)
        .unwrap_or_default()
}

fn timestamp(t: &pbjson_types::Timestamp) -> Timestamp {
    Timestamp::new(t.seconds, t.nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The request `job` makes, rendered as `vcjob`.
pub fn request(job: &SubmitJob, vcjob: &VolcanoJob, fingerprint16: &str) -> Option<Request> {
    let window = job.start_window.as_ref()?;
    let owner = job.owner.clone().unwrap_or_default();
    let runs_for = job
        .time_allocation
        .as_ref()
        .map(|d| SignedDuration::new(d.seconds, d.nanos))?;
    Some(Request {
        job_id: job.job_id.clone(),
        owner: bookings::owner_of(&owner.user, owner.project.as_deref()),
        fingerprint: fingerprint16.to_owned(),
        earliest: timestamp(window.earliest.as_ref()?),
        latest: timestamp(window.latest.as_ref()?),
        runs_for,
        replicas: job.replicas.max(1),
        per_rank: per_rank(vcjob),
    })
}

/// Books the job (or finds its booking again, on a redelivery).
pub async fn book(h: &Handler, request: &Request) -> Result<Answer, crate::cluster::ClusterError> {
    if !h.config.bookings.enabled {
        return Ok(Answer::Refused {
            why: "bookings are switched off on this cluster ([bookings] enabled)".into(),
            earliest: None,
        });
    }
    h.bookings.book(request, || h.now()).await
}

/// Gates the job's pods until the booked start (`<prefix>booking`), lets them onto booked nodes (the
/// toleration of the bookings' taint) and only onto its own (the selector of its booking's label), and
/// records the start for the monitor that lifts the gate.
/// Its `sla-waiting-time` runs out at the start (rounded up to the second, counted from now, just before
/// its PodGroup is created): Volcano's `sla` plugin then admits it to its queue at once and tries it
/// first, so that jobs waiting in the queue since before it, which hold the queue's admission, cannot
/// keep it from the room set aside for it.
pub fn hold_until_start(
    vcjob: &mut VolcanoJob,
    keys: &AnnotationKeys,
    booking: &Booking,
    now: Timestamp,
) {
    let gate = keys.booking_gate();
    let taint = bookings::taint_key(keys);
    let label = bookings::label_key(keys, &booking.job_id);
    for task in &mut vcjob.spec.tasks {
        let spec = task.template.spec.get_or_insert_default();
        spec.node_selector
            .get_or_insert_default()
            .insert(label.clone(), bookings::LABEL_VALUE.to_owned());
        let gates = spec.scheduling_gates.get_or_insert_default();
        if !gates.iter().any(|g| g.name == gate) {
            gates.push(PodSchedulingGate { name: gate.clone() });
        }
        spec.tolerations.get_or_insert_default().push(Toleration {
            key: Some(taint.clone()),
            operator: Some("Exists".into()),
            effect: Some(bookings::TAINT_EFFECT.into()),
            ..Toleration::default()
        });
    }
    let annotations = vcjob.metadata.annotations.get_or_insert_default();
    annotations.insert(
        keys.booked_start.clone(),
        booking.start.as_millisecond().to_string(),
    );
    let wait_ms = booking.start.duration_since(now).as_millis().max(0);
    annotations.insert(
        crate::pipeline::plugins::task::SLA_WAITING_TIME.to_owned(),
        format!("{}s", (wait_ms + 999) / 1000),
    );
}

/// The booking as events carry it.
pub fn details(booking: &Booking) -> BookingDetails {
    BookingDetails {
        start_at: Some(proto_timestamp(booking.start)),
        end_at: Some(proto_timestamp(booking.end)),
        nodes: booking.nodes(),
        earliest_window: None,
    }
}

/// The status event `<jobId>/booked/<start ms>`.
pub fn booked_event(
    booking: &Booking,
    margin: SignedDuration,
    at: Timestamp,
    runner: &str,
) -> JobEvent {
    let mut nodes = booking.nodes();
    nodes.dedup();
    JobEvent {
        event_id: ids::booked(&booking.job_id, booking.start.as_millisecond()),
        job_id: booking.job_id.clone(),
        state: JobState::Unspecified as i32,
        status: format!(
            "Booked: starts at {} (placed within {margin:#}), {} rank(s) on {} set aside until {}",
            booking.start,
            booking.ranks.len(),
            nodes.join(", "),
            booking.end
        ),
        reason: BOOKED.into(),
        timestamp: Some(proto_timestamp(at)),
        runner_id: runner.to_owned(),
        booking: Some(Box::new(details(booking))),
        ..JobEvent::default()
    }
}

/// The FAILURE `booking_refused`, with the earliest window that could be promised.
pub fn refused_event(
    job_id: &str,
    fingerprint16: &str,
    why: &str,
    earliest: Option<(Timestamp, Timestamp)>,
    at: Timestamp,
    runner: &str,
) -> JobEvent {
    let instead = match earliest {
        Some((from, to)) => {
            format!("; the earliest window that can be booked now is {from} to {to}")
        }
        None => String::new(),
    };
    let mut event = events::submission_rejected(
        job_id,
        fingerprint16,
        BOOKING_REFUSED,
        format!("startWindow: cannot be promised: {why}{instead}"),
        at,
        runner,
    );
    event.booking = Some(Box::new(BookingDetails {
        earliest_window: earliest.map(|(from, to)| BookedWindow {
            earliest: Some(proto_timestamp(from)),
            latest: Some(proto_timestamp(to)),
        }),
        ..BookingDetails::default()
    }));
    event
}

/// Refuses the submission: acknowledged (the message is valid), nothing created.
pub async fn refuse(
    h: &Handler,
    m: &Message<'_>,
    job_id: &str,
    fingerprint16: &str,
    why: &str,
    earliest: Option<(Timestamp, Timestamp)>,
) -> Settle {
    info!(job_id, why, ?earliest, "Refused a booking.");
    let at = m.sent_at.unwrap_or_else(|| h.now());
    let event = refused_event(job_id, fingerprint16, why, earliest, at, &h.runner_id);
    match h.publish(&event, m.traceparent.as_ref()).await {
        Ok(()) => Settle::Ack,
        Err(e) => Settle::publish(&e),
    }
}

/// Tells that the booking holds, after the job's QUEUED.
pub async fn tell_booked(h: &Handler, m: &Message<'_>, booking: &Booking) -> Settle {
    let margin = SignedDuration::try_from(h.config.monitor.start_margin).unwrap_or_default();
    let at = m.sent_at.unwrap_or_else(|| h.now());
    let event = booked_event(booking, margin, at, &h.runner_id);
    match h.publish(&event, m.traceparent.as_ref()).await {
        Ok(()) => {
            info!(job_id = %booking.job_id, start = %booking.start, "Told a booking.");
            Settle::Ack
        }
        Err(e) => Settle::publish(&e),
    }
}

/// Frees the job's booking (a cancel) and tells so: `<jobId>/booking/<start ms>/cancelled`. The news
/// is in the record from the write that freed the booking until it is told, so a runner that dies in
/// between leaves it to the cancel's redelivery or to any runner's tidy.
pub async fn cancel(h: &Handler, m: &Message<'_>, job_id: &str) -> Result<(), Settle> {
    let news = h
        .bookings
        .cancel_and_tell(job_id, h.now(), &h.runner_id)
        .await
        .map_err(|e| Settle::cluster(&e))?;
    let Some(news) = news else {
        return Ok(());
    };
    let event = news_event(&news, &h.runner_id);
    h.publish(&event, m.traceparent.as_ref())
        .await
        .map_err(|e| Settle::publish(&e))?;
    if let Err(e) = h.bookings.told(&[news], h.now()).await {
        // Told already: a later tidy tells it once more, the same event, after the lease.
        tracing::warn!(job_id, error = %e, "A told booking's news could not be removed from the record.");
    }
    Ok(())
}

/// A status event: the booking was moved to other room at the same start.
pub const BOOKING_MOVED: &str = "booking_moved";

/// The event telling what became of a booking: `<jobId>/booking/<start ms>/moved` (reason
/// `booking_moved`, the new nodes) or `.../cancelled` (reason `booking_cancelled`: no other room, or
/// its job cancelled). Its id, content and time come from the news alone, so every telling of one
/// news is the same message.
pub fn news_event(news: &News, runner: &str) -> JobEvent {
    let (status, reason, details) = match &news.fate {
        Fate::Moved { old, new, why } => (
            format!(
                "The booking for {} was moved to other nodes ({}): {why}; the start is the same",
                old.start,
                new.nodes().join(", ")
            ),
            BOOKING_MOVED,
            details(new),
        ),
        Fate::Cancelled { old, why } => (
            format!(
                "The booking for {} was cancelled: {why}; the job is cancelled and charged nothing",
                old.start
            ),
            BOOKING_CANCELLED,
            details(old),
        ),
        Fate::Freed { old } => (
            format!(
                "The booking for {} was cancelled with the job; its capacity is free again",
                old.start
            ),
            BOOKING_CANCELLED,
            details(old),
        ),
    };
    let old = news.fate.old();
    JobEvent {
        event_id: ids::booking_news(&old.job_id, old.start.as_millisecond(), news.fate.what()),
        job_id: old.job_id.clone(),
        state: JobState::Unspecified as i32,
        status,
        reason: reason.into(),
        timestamp: Some(proto_timestamp(news.at)),
        runner_id: runner.to_owned(),
        booking: Some(Box::new(details)),
        ..JobEvent::default()
    }
}
