//! What became of bookings, told: every runner, every `[bookings] check_interval`, tidies the
//! bookings' record ([`crate::cluster::Bookings::tidy`]: what is over or whose job ended dropped, what
//! lost its room moved or cancelled, the taints put right) and tells the news it was handed: the
//! fates it decided now, and news a runner that died before telling left in the record. Then it lets
//! waiting jobs that end before a booked start onto the booked nodes, just in time
//! ([`crate::cluster::Bookings::admit_just_in_time`]). A booking
//! cancelled for want of room has its job cancelled as an orchestrator's cancel would, through the
//! cancel handler (which frees bookings through [`super::booking`]; this module sits above both).

use std::sync::Arc;

use super::booking::news_event;
use super::{Handler, Message, Settle};
use crate::cluster::bookings::{Fate, News};

/// Every `interval`, the bookings' record tidied and its news told.
pub async fn run_tidy(
    h: Arc<Handler>,
    interval: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    super::every(interval, shutdown, || async {
        match h.bookings.tidy(h.now(), &h.runner_id).await {
            Ok(news) => {
                for n in news {
                    tell(&h, &n).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "The bookings could not be tidied; trying again later.");
            }
        }
        match h.bookings.admit_just_in_time(h.now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(pods = n, "Let waiting pods onto booked capacity they leave before its start."),
            Err(e) => {
                tracing::warn!(error = %e, "Waiting jobs could not be let onto booked capacity; trying again later.");
            }
        }
    })
    .await;
}

/// Tells the user what became of a booking; a cancelled one's job is cancelled (it never started:
/// nothing was charged), as an orchestrator's cancel would, with the reason. Only then is the news
/// removed from the record: a runner that dies before leaves it to another, which tells the same
/// event again (and cancels, harmlessly, again).
pub async fn tell(h: &Handler, news: &News) {
    let event = news_event(news, &h.runner_id);
    if let Err(e) = h.publish(&event, None).await {
        tracing::warn!(event_id = %event.event_id, error = %e, "A booking's fate was not told; told again after the lease.");
        return;
    }
    if let Fate::Cancelled { old, why } = &news.fate {
        let cancel = crate::messages::v1::CancelJob {
            job_id: old.job_id.clone(),
            reason: Some(format!("its booking could not be kept: {why}")),
        };
        let settle = super::cancel::handle(h, &Message::internal(None, None), &cancel).await;
        if settle != Settle::Ack {
            tracing::warn!(job_id = %old.job_id, ?settle, "The job of a cancelled booking was not cancelled; tried again after the lease.");
            return;
        }
    }
    if let Err(e) = h.bookings.told(std::slice::from_ref(news), h.now()).await {
        tracing::warn!(event_id = %event.event_id, error = %e, "A told booking's news could not be removed from the record.");
    }
}
