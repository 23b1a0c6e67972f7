//! The runner's side of sessions: [`Issuer`] consumes `OpenSession` requests from `[broker]
//! session_queue` and answers each with a `SessionReply`, published to the default exchange with routing
//! key = the request's `reply_to` (a queue, or RabbitMQ's direct reply-to) and the request's
//! `correlation_id`.
//!
//! The decision reads the job's durable state (its VolcanoJob and annotations), never a cache: a job
//! that is unknown, has ended (a terminal state, Volcano finished it, or it is being deleted), is not
//! interactive (the Proxy plugin gave it no `proxyPort`: a batch job), has no such rank, or does not offer the kind
//! (`sessionKinds`), is refused with that reason. Otherwise a new id is made, its record stored
//! ([`super::record`]), and the URL and expiry sent. The session expires after the requested lifetime
//! (at most `[sessions] max_lifetime`), and never after the job's own expiry.
//!
//! A request that does not decode or validate is dead-lettered with the reason, and, when it has a
//! `reply_to`, answered with the refusal too. One without a `reply_to` is dead-lettered
//! (`missing_reply_to`): nobody could receive its session. One whose `reply_to` names a queue or exchange
//! of the runners' own topology (the submit, control or session queue, the dead-letter queue or
//! exchange, ...) is dead-lettered too (`forbidden_reply_to`) and answered nowhere: a reply carries a
//! live session URL, and those queues are read by runners and operators, not by whoever asked. A cluster that does not answer within the
//! retry budget returns the request to the queue.
//!
//! [`Issuer::sweep`] deletes the records of expired sessions and of ended jobs, a bounded page at a time.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use lapin::BasicProperties;
use lapin::types::ShortString;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Kind;
use super::record::{SessionRecord, SessionStore};
use super::token::{self, Hash};
use crate::broker::{Broker, BrokerConfig, DeadLetterReason, Delivery, QueueConsumer, Topology};
use crate::cluster::ClusterError;
use crate::cluster::jobs::{JobStore, annotation, is_over};
use crate::config::Config;
use crate::durable::AnnotationKeys;
use crate::durable::annotations::parse_millis;
use crate::messages::v1::{
    OpenSession, OpenedSession, SessionRefusal, SessionReply, session_reply::Result as Outcome,
};
use crate::messages::{self, Format, MessageType};
use crate::volcano::VolcanoJob;

/// Why a request gets no session: a machine reason and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// What a request may open, decided from its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub kind: Kind,
    /// The job's expiry, if it has one: the session ends then at the latest.
    pub job_expiry: Option<Timestamp>,
}

/// Decides a (valid) request against its job as the cluster has it (`None`: no such job).
pub fn decide(
    job: Option<&VolcanoJob>,
    request: &OpenSession,
    keys: &AnnotationKeys,
) -> Result<Grant, Refusal> {
    let id = &request.job_id;
    let Some(job) = job else {
        return Err(Refusal::new(
            "unknown_job",
            format!("no job {id} runs on this cluster"),
        ));
    };
    if is_over(job, keys)
        || job.phase().is_ending()
        || annotation(job, &keys.termination_cause).is_some()
    {
        return Err(Refusal::new("job_ended", format!("job {id} has ended")));
    }
    if annotation(job, &keys.proxy_port).is_none() {
        return Err(Refusal::new(
            "not_interactive",
            format!(
                "job {id} is not interactive: its application has no web or VNC interface and is not a terminal"
            ),
        ));
    }
    let replicas: u32 = annotation(job, &keys.replicas)
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    if request.rank >= replicas {
        return Err(Refusal::new(
            "rank_out_of_range",
            format!(
                "rank: job {id} has {replicas} rank(s), 0 to {}; there is no rank {}",
                replicas - 1,
                request.rank
            ),
        ));
    }
    let Some(kind) = Kind::from_proto(request.kind) else {
        return Err(Refusal::new("invalid_field", "kind: not a session kind"));
    };
    let offered = super::offered_kinds(annotation(job, &keys.session_kinds));
    if !offered.contains(&kind) {
        let names: Vec<&str> = offered.iter().map(|k| k.as_str()).collect();
        return Err(Refusal::new(
            "kind_not_offered",
            format!(
                "kind: job {id}'s application offers {}, not {kind}",
                names.join(", ")
            ),
        ));
    }
    let job_expiry = annotation(job, &keys.expiry).and_then(parse_millis);
    Ok(Grant { kind, job_expiry })
}

/// Why a `reply_to` is refused, if it is: it names a queue or an exchange of the runners' topology. Replies
/// are published to the default exchange, so the name is a queue name; the exchanges are refused too, so
/// that a queue an operator someday names like one cannot receive them either.
pub fn forbidden_reply_to(reply_to: &str, broker: &BrokerConfig) -> Option<DeadLetterReason> {
    let topology = Topology::from_config(broker);
    let own = topology
        .queues
        .iter()
        .map(|q| ("queue", q.name.as_str()))
        .chain(
            topology
                .exchanges
                .iter()
                .map(|e| ("exchange", e.name.as_str())),
        )
        .find(|(_, name)| *name == reply_to)?;
    Some(
        DeadLetterReason::new(
            "forbidden_reply_to",
            format!(
                "reply_to names the runners' own {} {:?}: a session reply goes only to the requester's \
                 queue (its own, or amq.rabbitmq.reply-to)",
                own.0, own.1
            ),
        )
        .with_field("reply_to"),
    )
}

/// Answers session requests and sweeps session records. Cheap to clone.
#[derive(Clone)]
pub struct Issuer {
    broker: Broker,
    jobs: JobStore,
    store: SessionStore,
    keys: AnnotationKeys,
    config: Arc<Config>,
    clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
}

impl Issuer {
    /// An issuer for `config`, reading the time from `clock` (the wall clock in production).
    pub fn new(
        broker: Broker,
        client: kube::Client,
        config: Arc<Config>,
        clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    ) -> Self {
        Self {
            broker,
            jobs: JobStore::new(client.clone(), &config.pipeline, &config.cluster),
            store: SessionStore::new(client, &config.cluster),
            keys: config.pipeline.keys().into_owned(),
            config,
            clock,
        }
    }

    /// Consumes `[broker] session_queue` until `shutdown`, and sweeps every `[sessions]
    /// sweep_interval`. Requests are answered one at a time, in order.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), crate::broker::BrokerError> {
        let queue = self.broker.config().session_queue.clone();
        let mut consumer =
            QueueConsumer::start_on(self.broker.clone(), &queue, self.config.sessions.prefetch)
                .await?;
        info!(%queue, "Answering session requests.");
        let period = self.config.sessions.sweep_interval;
        let mut sweep = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut continue_token: Option<String> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                delivery = consumer.recv() => match delivery {
                    Some(d) => self.handle(d).await,
                    None => break,
                },
                _ = sweep.tick() => {
                    match self.sweep(continue_token.take()).await {
                        Ok((report, next)) => {
                            continue_token = next;
                            debug!(seen = report.seen, deleted = report.deleted, "Session records swept.");
                        }
                        Err(e) => warn!(error = %e, "Sweeping session records failed; trying again at the next interval."),
                    }
                }
            }
        }
        consumer.close().await;
        Ok(())
    }

    /// Handles one delivery: answers it, dead-letters it, or returns it to the queue.
    pub async fn handle(&self, delivery: Delivery) {
        let format = delivery
            .content_type()
            .map(Format::from_content_type)
            .unwrap_or(Ok(Format::Json));
        let reply_format = format.clone().unwrap_or(Format::Json);
        let reply_to = delivery.reply_to().map(str::to_owned);
        if let Some(reason) = reply_to
            .as_deref()
            .and_then(|r| forbidden_reply_to(r, self.broker.config()))
        {
            // Not even a refusal goes there.
            warn!(code = %reason.code, reason = %reason.message, "A session request names a runner queue as its reply_to; dead-lettering it.");
            dead_letter(delivery, &reason).await;
            return;
        }
        let correlation_id = delivery.correlation_id().map(str::to_owned);
        let decoded = decode_request(&delivery, format);
        let request = match decoded {
            Ok(request) => request,
            Err(reason) => {
                let to = reply_to.as_deref().map(|r| (r, correlation_id.as_deref()));
                self.refuse_invalid(delivery, to, reply_format, &reason)
                    .await;
                return;
            }
        };
        let Some(reply_to) = reply_to else {
            let reason = DeadLetterReason::new(
                "missing_reply_to",
                "no reply_to: set the AMQP reply_to property (a queue, or amq.rabbitmq.reply-to) to receive the session",
            );
            warn!(job = %request.job_id, "A session request has no reply_to; dead-lettering it.");
            dead_letter(delivery, &reason).await;
            return;
        };
        let result = match self.open(&request).await {
            Ok(result) => result,
            Err(e) => {
                warn!(job = %request.job_id, error = %e, "A session could not be decided; returning the request to the queue.");
                if let Err(e) = delivery.nack_requeue().await {
                    debug!(error = %e, "Returning a session request failed; it comes back anyway.");
                }
                return;
            }
        };
        let reply = SessionReply {
            job_id: request.job_id.clone(),
            rank: request.rank,
            kind: request.kind,
            result: Some(result),
        };
        match self
            .reply(&reply_to, correlation_id.as_deref(), reply_format, &reply)
            .await
        {
            Ok(()) => {
                if let Err(e) = delivery.ack().await {
                    debug!(error = %e, "A session request's ack failed.");
                }
            }
            Err(e) => {
                warn!(job = %request.job_id, error = %e, "A session reply could not be published; returning the request to the queue.");
                if let Err(e) = delivery.nack_requeue().await {
                    debug!(error = %e, "Returning a session request failed; it comes back anyway.");
                }
            }
        }
    }

    /// Refuses an invalid request: a refusal to its `reply_to` when it names one (with the job id when
    /// one can be read from the body), and the request to the dead-letter queue with the reason.
    async fn refuse_invalid(
        &self,
        delivery: Delivery,
        reply_to: Option<(&str, Option<&str>)>,
        reply_format: Format,
        reason: &DeadLetterReason,
    ) {
        warn!(code = %reason.code, reason = %reason.message, "A session request is invalid; refusing and dead-lettering it.");
        if let Some((reply_to, correlation_id)) = reply_to {
            let reply = SessionReply {
                job_id: messages::peek_job_id(reply_format, delivery.body())
                    .filter(|id| crate::validate::job_id(id).is_ok())
                    .unwrap_or_default(),
                rank: 0,
                kind: 0,
                result: Some(Outcome::Refused(SessionRefusal {
                    reason: reason.code.clone(),
                    message: reason.message.clone(),
                })),
            };
            if let Err(e) = self
                .reply(reply_to, correlation_id, reply_format, &reply)
                .await
            {
                warn!(error = %e, "The refusal of an invalid session request could not be sent.");
            }
        }
        dead_letter(delivery, reason).await;
    }

    /// Decides a valid request and, when it is granted, stores the session. `Err`: the cluster did not
    /// answer (worth another try).
    pub async fn open(&self, request: &OpenSession) -> Result<Outcome, ClusterError> {
        let job = self.jobs.find(&request.job_id).await?;
        let grant = match decide(job.as_ref(), request, &self.keys) {
            Ok(grant) => grant,
            Err(refusal) => {
                info!(job = %request.job_id, rank = request.rank, reason = refusal.reason, "Session refused.");
                return Ok(Outcome::Refused(SessionRefusal {
                    reason: refusal.reason.to_owned(),
                    message: refusal.message,
                }));
            }
        };
        let c = &self.config.sessions;
        let wanted = request
            .lifetime
            .as_ref()
            .map(|d| {
                std::time::Duration::new(
                    u64::try_from(d.seconds).unwrap_or(0),
                    u32::try_from(d.nanos).unwrap_or(0),
                )
            })
            .unwrap_or(c.default_lifetime)
            .min(c.max_lifetime);
        let now = (self.clock)();
        let lifetime = SignedDuration::try_from(wanted).unwrap_or(SignedDuration::MAX);
        let mut expires_at = now.checked_add(lifetime).unwrap_or(Timestamp::MAX);
        if let Some(job_expiry) = grant.job_expiry {
            expires_at = expires_at.min(job_expiry);
        }
        // Whole seconds: the label and the reply say the same instant.
        let expires_at = Timestamp::from_second(expires_at.as_second()).unwrap_or(expires_at);
        let id = token::generate().map_err(|e| ClusterError::Internal {
            op: "make a session id".into(),
            message: e.to_string(),
        })?;
        let record = SessionRecord {
            hash: Hash::of(&id),
            job_id: request.job_id.clone(),
            rank: request.rank,
            kind: grant.kind,
            issued_at: now,
            expires_at,
        };
        self.store.create(&record).await?;
        info!(job = %record.job_id, rank = record.rank, kind = %record.kind, session = %record.hash.short(), %expires_at, "Session opened.");
        let host = self
            .config
            .pipeline
            .proxy
            .rank_host(&request.job_id, request.rank)
            .to_ascii_lowercase();
        Ok(Outcome::Opened(OpenedSession {
            url: format!("{}://{host}{}?token={id}", c.scheme, super::SESSION_PATH),
            expires_at: Some(messages::proto_timestamp(expires_at)),
        }))
    }

    /// Publishes a reply to the default exchange, routed to `reply_to`, with the request's correlation id.
    async fn reply(
        &self,
        reply_to: &str,
        correlation_id: Option<&str>,
        format: Format,
        reply: &SessionReply,
    ) -> Result<(), crate::broker::PublishError> {
        let body = messages::encode(format, reply)
            .unwrap_or_else(|_| prost::Message::encode_to_vec(reply));
        let format = if messages::encode(format, reply).is_ok() {
            format
        } else {
            Format::Protobuf
        };
        let mut properties = BasicProperties::default()
            .with_content_type(ShortString::from(format.content_type()))
            .with_type(ShortString::from(MessageType::SessionReply.amqp_type()))
            .with_app_id(ShortString::from(self.broker.config().app_id.as_str()))
            .with_timestamp(jiff::Timestamp::now().as_second().max(0) as u64);
        if let Some(id) = correlation_id.and_then(|c| ShortString::try_new(c).ok()) {
            properties = properties.with_correlation_id(id);
        }
        // Not mandatory: a requester that went away is not the runner's problem.
        self.broker
            .publisher()
            .publish_raw("", reply_to, &body, properties, false)
            .await
    }

    /// One sweep of at most `[sessions] sweep_batch` records, from `from` (the previous sweep's place):
    /// deletes the unreadable, the expired, and those whose job has ended or is gone. Returns what it
    /// did and where the next sweep goes on (`None`: from the start).
    pub async fn sweep(
        &self,
        from: Option<String>,
    ) -> Result<(super::record::SweepReport, Option<String>), ClusterError> {
        let now = (self.clock)();
        let (page, next) = self
            .store
            .page(self.config.sessions.sweep_batch, from.as_deref())
            .await?;
        let mut report = super::record::SweepReport {
            seen: page.len(),
            deleted: 0,
        };
        let mut ended: std::collections::BTreeMap<String, bool> = Default::default();
        for (name, record) in page {
            let dead = match &record {
                None => true,
                Some(r) if r.is_expired(now) => true,
                Some(r) => match ended.get(&r.job_id) {
                    Some(&e) => e,
                    None => {
                        let job = self.jobs.find(&r.job_id).await?;
                        let e = job.as_ref().is_none_or(|j| is_over(j, &self.keys));
                        ended.insert(r.job_id.clone(), e);
                        e
                    }
                },
            };
            if dead {
                self.store.delete(&name).await?;
                report.deleted += 1;
            }
        }
        Ok((report, next))
    }
}

/// Sends a request to the dead-letter queue with the reason. A failure is logged and left: a copy not
/// confirmed returns the request to its queue, and a lost ack has the broker deliver it again.
async fn dead_letter(delivery: Delivery, reason: &DeadLetterReason) {
    if let Err(e) = delivery.dead_letter(reason).await {
        warn!(code = %reason.code, error = %e, "Dead-lettering a session request failed.");
    }
}

/// A delivery's session request, decoded and validated; the reason to dead-letter it otherwise (a
/// format or a message type it cannot be, properties that arrived not UTF-8, an invalid request).
fn decode_request(
    delivery: &Delivery,
    format: Result<Format, messages::DecodeError>,
) -> Result<OpenSession, DeadLetterReason> {
    // Properties that arrived not UTF-8 (shown with '?'): the request is not acted on.
    let marked = delivery
        .invalid_properties()
        .map(|names| crate::broker::properties::invalid_properties_reason(&names));
    format
        .map_err(|e| reason_of(&e))
        .and_then(|format| marked.map_or(Ok(format), Err))
        .and_then(|format| {
            match delivery.type_name() {
                Some(t) if t != MessageType::OpenSession.amqp_type() => {
                    return Err(DeadLetterReason::new(
                        "unexpected_message_type",
                        format!(
                            "{t} is not {}: only session requests go to the session queue",
                            MessageType::OpenSession.amqp_type()
                        ),
                    ));
                }
                _ => {}
            }
            messages::decode::<OpenSession>(format, delivery.body()).map_err(|e| reason_of(&e))
        })
        .and_then(|request| {
            crate::validate::open_session(&request)
                .map(|()| request)
                .map_err(|e| {
                    DeadLetterReason::new(e.kind().code(), e.to_string()).with_field(e.field())
                })
        })
}

fn reason_of(e: &messages::DecodeError) -> DeadLetterReason {
    let reason = DeadLetterReason::new(e.reason(), e.to_string());
    match e.field() {
        Some(field) => reason.with_field(field),
        None => reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_to_naming_the_runners_topology_is_refused_with_the_field() {
        let c = BrokerConfig::default();
        for own in [
            &c.submit_queue,
            &c.control_queue,
            &c.session_queue,
            &c.dead_letter_queue,
            &c.dead_letter_exchange,
            &c.jobs_exchange,
            &c.proxy_exchange,
        ] {
            let reason = forbidden_reply_to(own, &c).unwrap_or_else(|| panic!("{own} accepted"));
            assert_eq!(reason.code, "forbidden_reply_to");
            assert_eq!(reason.field.as_deref(), Some("reply_to"));
            assert!(reason.message.contains(own.as_str()), "{}", reason.message);
        }
        for theirs in [
            "amq.rabbitmq.reply-to",
            "amq.gen-JzTY20BRgKO-HjmUJj0wLg",
            "orchestrator.replies",
            "",
        ] {
            assert!(forbidden_reply_to(theirs, &c).is_none(), "{theirs}");
        }
    }
}
