//! The exchanges, queues and bindings the runner relies on, as data.
//!
//! Building the [`Topology`] from the configuration is pure, so the same value is declared on every
//! connection, checked passively when an operator pre-provisions, and rendered as RabbitMQ definitions
//! (`deploy/rabbitmq/definitions.json`), and a test proves the three agree.

use std::fmt;

use lapin::{
    Channel, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError},
    types::{AMQPValue, FieldTable, ShortString},
};
use serde_json::{Map, Value, json};

use super::BrokerConfig;

/// The kind of an exchange, as RabbitMQ names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeType {
    Direct,
    Topic,
    Fanout,
}

impl ExchangeType {
    /// The name RabbitMQ uses in declarations and definitions.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Topic => "topic",
            Self::Fanout => "fanout",
        }
    }

    fn lapin(self) -> ExchangeKind {
        match self {
            Self::Direct => ExchangeKind::Direct,
            Self::Topic => ExchangeKind::Topic,
            Self::Fanout => ExchangeKind::Fanout,
        }
    }
}

/// A durable exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeSpec {
    pub name: String,
    pub kind: ExchangeType,
}

/// The value of a queue argument (`x-...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgValue {
    Text(String),
    Int(i64),
}

/// A durable queue with its arguments, in a fixed order so renderings are stable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    pub name: String,
    pub arguments: Vec<(&'static str, ArgValue)>,
}

/// A binding of a queue to an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingSpec {
    pub exchange: String,
    pub queue: String,
    pub routing_key: String,
}

/// Everything the runner declares: exchanges first, then queues, then bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub exchanges: Vec<ExchangeSpec>,
    pub queues: Vec<QueueSpec>,
    pub bindings: Vec<BindingSpec>,
}

/// Why the topology could not be declared or is not as expected. Every variant but `Amqp` is permanent:
/// retrying will not fix it, an operator has to.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// Passive mode found something missing.
    #[error(
        "broker.passive is on, but {missing} missing in the vhost; pre-provision the topology (for example by \
         importing deploy/rabbitmq/definitions.json) or switch broker.passive off"
    )]
    Missing { missing: MissingList },
    /// Something exists with other properties than the runner's (e.g. a classic queue of the same name, or
    /// another x-delivery-limit). RabbitMQ refuses to change it in place.
    #[error(
        "{kind} `{name}` exists with different properties than configured: {message}; delete it or change the \
         configuration to match"
    )]
    Mismatch {
        kind: &'static str,
        name: String,
        message: String,
    },
    /// The user may not declare (no `configure` permission).
    #[error(
        "not allowed to declare {kind} `{name}`: {message}; grant `configure` permission or use broker.passive \
         with a pre-provisioned topology"
    )]
    Forbidden {
        kind: &'static str,
        name: String,
        message: String,
    },
    /// The connection or channel failed on the way: worth retrying after a reconnect.
    #[error("declaring {kind} `{name}` failed: {source}")]
    Amqp {
        kind: &'static str,
        name: String,
        #[source]
        source: lapin::Error,
    },
}

impl TopologyError {
    /// Whether a reconnect may fix it.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Amqp { .. })
    }
}

/// The names of what passive mode found missing, for one message that lists them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingList(pub Vec<(&'static str, String)>);

impl fmt::Display for MissingList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self
            .0
            .iter()
            .map(|(kind, name)| format!("{kind} `{name}`"))
            .collect();
        let verb = if items.len() == 1 { "is" } else { "are" };
        write!(f, "{} {verb}", items.join(", "))
    }
}

/// Whether to create the topology or only check that it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclareMode {
    Declare,
    Passive,
}

impl Topology {
    /// The topology the configuration describes: the jobs exchange with the submit and control queues
    /// (quorum, delivery limit, at-least-once dead-lettering), the dead-letter exchange and queue, the events
    /// topic exchange and the proxy fanout exchange.
    pub fn from_config(c: &BrokerConfig) -> Self {
        let work_queue = |name: &str| QueueSpec {
            name: name.to_owned(),
            arguments: vec![
                ("x-queue-type", ArgValue::Text("quorum".into())),
                (
                    "x-delivery-limit",
                    ArgValue::Int(i64::from(c.delivery_limit)),
                ),
                (
                    "x-dead-letter-exchange",
                    ArgValue::Text(c.dead_letter_exchange.clone()),
                ),
                // At-least-once dead-lettering: a message that hits the delivery limit is kept until the
                // dead-letter queue has it. It requires reject-publish overflow; no length limit is set.
                (
                    "x-dead-letter-strategy",
                    ArgValue::Text("at-least-once".into()),
                ),
                ("x-overflow", ArgValue::Text("reject-publish".into())),
            ],
        };
        let binding = |exchange: &str, queue: &str, key: &str| BindingSpec {
            exchange: exchange.to_owned(),
            queue: queue.to_owned(),
            routing_key: key.to_owned(),
        };
        Self {
            exchanges: vec![
                ExchangeSpec {
                    name: c.jobs_exchange.clone(),
                    kind: ExchangeType::Direct,
                },
                ExchangeSpec {
                    name: c.dead_letter_exchange.clone(),
                    kind: ExchangeType::Fanout,
                },
                ExchangeSpec {
                    name: c.events_exchange.clone(),
                    kind: ExchangeType::Topic,
                },
                ExchangeSpec {
                    name: c.proxy_exchange.clone(),
                    kind: ExchangeType::Fanout,
                },
            ],
            queues: vec![
                work_queue(&c.submit_queue),
                work_queue(&c.control_queue),
                work_queue(&c.session_queue),
                QueueSpec {
                    name: c.dead_letter_queue.clone(),
                    arguments: vec![("x-queue-type", ArgValue::Text("quorum".into()))],
                },
            ],
            bindings: vec![
                binding(&c.jobs_exchange, &c.submit_queue, &c.submit_routing_key),
                binding(&c.jobs_exchange, &c.control_queue, &c.cancel_routing_key),
                binding(&c.jobs_exchange, &c.control_queue, &c.extend_routing_key),
                binding(&c.jobs_exchange, &c.session_queue, &c.session_routing_key),
                // Fanout: the key is ignored; dead-lettered messages keep their original routing key.
                binding(&c.dead_letter_exchange, &c.dead_letter_queue, ""),
            ],
        }
    }

    /// The topology as RabbitMQ definitions (the format of `rabbitmqctl import_definitions` and of
    /// `POST /api/definitions`), for the given vhost.
    pub fn definitions(&self, vhost: &str) -> Value {
        let exchanges: Vec<Value> = self
            .exchanges
            .iter()
            .map(|e| {
                json!({
                    "name": e.name, "vhost": vhost, "type": e.kind.as_str(), "durable": true,
                    "auto_delete": false, "internal": false, "arguments": {}
                })
            })
            .collect();
        let queues: Vec<Value> = self
            .queues
            .iter()
            .map(|q| {
                let arguments: Map<String, Value> = q
                    .arguments
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            ArgValue::Text(s) => Value::from(s.as_str()),
                            ArgValue::Int(i) => Value::from(*i),
                        };
                        ((*k).to_owned(), v)
                    })
                    .collect();
                json!({
                    "name": q.name, "vhost": vhost, "durable": true, "auto_delete": false,
                    "arguments": arguments
                })
            })
            .collect();
        let bindings: Vec<Value> = self
            .bindings
            .iter()
            .map(|b| {
                json!({
                    "source": b.exchange, "vhost": vhost, "destination": b.queue,
                    "destination_type": "queue", "routing_key": b.routing_key, "arguments": {}
                })
            })
            .collect();
        json!({ "exchanges": exchanges, "queues": queues, "bindings": bindings })
    }

    /// Declares everything (idempotent: declaring an existing, equal topology changes nothing), or in passive
    /// mode checks that every exchange and queue exists and lists all that are missing. Bindings cannot be
    /// checked passively in AMQP; in passive mode they are the operator's responsibility.
    ///
    /// A failed declaration closes the channel it ran on, so each check gets a channel from `open`.
    pub(crate) async fn apply<F, Fut>(
        &self,
        mode: DeclareMode,
        open: F,
    ) -> Result<(), TopologyError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Channel, lapin::Error>>,
    {
        let mut channel: Option<Channel> = None;
        let mut missing = Vec::new();
        for item in self.items() {
            let ch = match &channel {
                Some(ch) if ch.status().connected() => ch.clone(),
                _ => {
                    let ch = open().await.map_err(|source| TopologyError::Amqp {
                        kind: item.kind(),
                        name: item.name().to_owned(),
                        source,
                    })?;
                    channel = Some(ch.clone());
                    ch
                }
            };
            match item.declare(&ch, mode).await {
                Ok(()) => {}
                Err(e) => match classify(item.kind(), item.name(), e) {
                    Failure::Missing if mode == DeclareMode::Passive => {
                        missing.push((item.kind(), item.name().to_owned()));
                    }
                    Failure::Missing => {
                        // Declaring never answers NOT_FOUND except for a binding whose exchange or queue
                        // vanished at that moment: report it as the operator-visible mismatch it is.
                        return Err(TopologyError::Mismatch {
                            kind: item.kind(),
                            name: item.name().to_owned(),
                            message: "a binding's exchange or queue does not exist".into(),
                        });
                    }
                    Failure::Error(e) => return Err(e),
                },
            }
        }
        if let Some(ch) = channel
            && ch.status().connected()
        {
            // Best effort: the channel is ours alone and dropping it would close it as well.
            let _ = ch.close(200, "topology done".into()).await;
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(TopologyError::Missing {
                missing: MissingList(missing),
            })
        }
    }

    fn items(&self) -> impl Iterator<Item = Item<'_>> {
        self.exchanges
            .iter()
            .map(Item::Exchange)
            .chain(self.queues.iter().map(Item::Queue))
            .chain(self.bindings.iter().map(Item::Binding))
    }
}

enum Item<'a> {
    Exchange(&'a ExchangeSpec),
    Queue(&'a QueueSpec),
    Binding(&'a BindingSpec),
}

impl Item<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Item::Exchange(_) => "exchange",
            Item::Queue(_) => "queue",
            Item::Binding(_) => "binding of queue",
        }
    }

    fn name(&self) -> &str {
        match self {
            Item::Exchange(e) => &e.name,
            Item::Queue(q) => &q.name,
            Item::Binding(b) => &b.queue,
        }
    }

    async fn declare(&self, ch: &Channel, mode: DeclareMode) -> Result<(), lapin::Error> {
        let passive = mode == DeclareMode::Passive;
        match self {
            Item::Exchange(e) => {
                let options = ExchangeDeclareOptions {
                    passive,
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                };
                ch.exchange_declare(
                    ShortString::from(e.name.as_str()),
                    e.kind.lapin(),
                    options,
                    FieldTable::default(),
                )
                .await
            }
            Item::Queue(q) => {
                let options = QueueDeclareOptions {
                    passive,
                    durable: true,
                    ..QueueDeclareOptions::default()
                };
                ch.queue_declare(
                    ShortString::from(q.name.as_str()),
                    options,
                    queue_arguments(q),
                )
                .await
                .map(drop)
            }
            Item::Binding(_) if passive => Ok(()),
            Item::Binding(b) => {
                ch.queue_bind(
                    ShortString::from(b.queue.as_str()),
                    ShortString::from(b.exchange.as_str()),
                    ShortString::from(b.routing_key.as_str()),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
            }
        }
    }
}

/// The queue's arguments as AMQP field values.
pub(crate) fn queue_arguments(q: &QueueSpec) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in &q.arguments {
        let value = match value {
            ArgValue::Text(s) => AMQPValue::LongString(s.as_str().into()),
            ArgValue::Int(i) => AMQPValue::LongLongInt(*i),
        };
        table.insert(ShortString::from(*key), value);
    }
    table
}

/// Whether AMQP said that what was declared or used does not exist (404 NOT_FOUND: a passive declare
/// of a queue or exchange that is not there).
pub(crate) fn is_not_found(e: &lapin::Error) -> bool {
    matches!(
        e.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

enum Failure {
    Missing,
    Error(TopologyError),
}

fn classify(kind: &'static str, name: &str, e: lapin::Error) -> Failure {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
        let message = amqp.get_message().to_string();
        match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => return Failure::Missing,
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => {
                return Failure::Error(TopologyError::Mismatch {
                    kind,
                    name: name.to_owned(),
                    message,
                });
            }
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
            | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) => {
                return Failure::Error(TopologyError::Forbidden {
                    kind,
                    name: name.to_owned(),
                    message,
                });
            }
            _ => {}
        }
    }
    Failure::Error(TopologyError::Amqp {
        kind,
        name: name.to_owned(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_queues_are_quorum_with_limit_and_dead_lettering() {
        let c = BrokerConfig {
            delivery_limit: 7,
            dead_letter_exchange: "dlx".into(),
            ..BrokerConfig::default()
        };
        let t = Topology::from_config(&c);
        for name in ["compute.jobs.submit", "compute.jobs.control"] {
            let q = t.queues.iter().find(|q| q.name == name).unwrap();
            assert!(
                q.arguments
                    .contains(&("x-queue-type", ArgValue::Text("quorum".into())))
            );
            assert!(
                q.arguments
                    .contains(&("x-delivery-limit", ArgValue::Int(7)))
            );
            assert!(
                q.arguments
                    .contains(&("x-dead-letter-exchange", ArgValue::Text("dlx".into())))
            );
        }
    }

    #[test]
    fn control_queue_gets_cancel_and_extend_and_nothing_else() {
        let t = Topology::from_config(&BrokerConfig::default());
        let keys: Vec<&str> = t
            .bindings
            .iter()
            .filter(|b| b.queue == "compute.jobs.control")
            .map(|b| b.routing_key.as_str())
            .collect();
        assert_eq!(keys, ["cancel", "extend"]);
        let submit: Vec<&str> = t
            .bindings
            .iter()
            .filter(|b| b.queue == "compute.jobs.submit")
            .map(|b| b.routing_key.as_str())
            .collect();
        assert_eq!(submit, ["submit"]);
    }

    #[test]
    fn every_name_comes_from_the_configuration() {
        let c = BrokerConfig {
            jobs_exchange: "a".into(),
            submit_queue: "b".into(),
            control_queue: "c".into(),
            session_queue: "s".into(),
            dead_letter_exchange: "d".into(),
            dead_letter_queue: "e".into(),
            events_exchange: "f".into(),
            proxy_exchange: "g".into(),
            ..BrokerConfig::default()
        };
        let text = Topology::from_config(&c).definitions("/").to_string();
        assert!(!text.contains("compute."), "a default name leaked: {text}");
    }

    #[test]
    fn definitions_have_the_import_format() {
        let d = Topology::from_config(&BrokerConfig::default()).definitions("/");
        let ex = &d["exchanges"][0];
        assert_eq!(ex["name"], "compute.jobs");
        assert_eq!(ex["type"], "direct");
        assert_eq!(ex["durable"], true);
        let q = &d["queues"][0];
        assert_eq!(q["arguments"]["x-delivery-limit"], 20);
        assert_eq!(q["vhost"], "/");
        let b = &d["bindings"][0];
        assert_eq!(b["destination_type"], "queue");
        assert_eq!(b["routing_key"], "submit");
    }

    #[test]
    fn missing_list_reads_as_a_sentence() {
        let one = MissingList(vec![("queue", "q".into())]).to_string();
        assert_eq!(one, "queue `q` is");
        let two = MissingList(vec![("exchange", "e".into()), ("queue", "q".into())]).to_string();
        assert_eq!(two, "exchange `e`, queue `q` are");
    }
}
