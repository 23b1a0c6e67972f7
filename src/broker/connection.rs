//! [`Broker`]: the one AMQP connection of a process, and the supervisor that keeps it.
//!
//! lapin's own recovery is not used: its history of silent failures (consumer streams that stop, recovery
//! that did not survive a broker restart, see ../shared/reference/anchors.md section 4) argues for a loop
//! we can read and test. The supervisor notices a lost connection three ways (lapin's error event, a report
//! from a consumer or publisher that saw its channel fail, and a periodic look at the connection state),
//! then reconnects with jittered exponential backoff, declares (or checks) the topology again, and
//! publishes the new connection under a new *generation* number. Channels belong to consumers and the
//! publisher; they notice the new generation and open fresh channels on it.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};
use std::time::Duration;

use futures::{Stream, StreamExt};
use lapin::{
    Channel, Connection, ConnectionProperties, Event,
    protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError},
};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::topology::{DeclareMode, Topology, TopologyError};
use super::{BrokerConfig, ConsumerKind, EventsFollower, Publisher, QueueConsumer};

/// Why the broker could not be reached or used.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The `[broker]` configuration is invalid.
    #[error(transparent)]
    Config(#[from] super::BrokerConfigError),
    /// Connecting failed. `retryable` is false for refused credentials or a missing vhost. The message names
    /// where (host, port, vhost, user; never the password) and what to fix.
    #[error("{message}")]
    Connect { message: String, retryable: bool },
    /// The topology is missing, different, or may not be declared.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// Opening a channel or a consumer failed.
    #[error("RabbitMQ channel failed: {0}")]
    Channel(#[source] lapin::Error),
    /// The first connection did not succeed within `broker.startup_timeout`.
    #[error(
        "no connection to RabbitMQ at {endpoint} within {} s (broker.startup_timeout); last \
         error: {last}. Check that RabbitMQ runs there and that [broker] url \
         (VOLCANO_RUNNER_BROKER__URL) points at it", waited.as_secs_f32().round()
    )]
    StartupTimeout {
        waited: Duration,
        /// Where it tried: host, port and vhost, never the credentials.
        endpoint: String,
        last: String,
    },
    /// The broker is shutting down; nothing new is started.
    #[error("the broker connection is shutting down")]
    Shutdown,
}

impl BrokerError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { retryable, .. } => *retryable,
            Self::Topology(e) => e.is_retryable(),
            Self::Channel(_) | Self::StartupTimeout { .. } => true,
            Self::Config(_) | Self::Shutdown => false,
        }
    }

    /// What a failed connection attempt means, in words that name the place and the fix. Refused
    /// credentials and a vhost that does not exist (or may not be used) will not change by trying again.
    fn connect(e: &lapin::Error, config: &BrokerConfig) -> Self {
        let at = config.endpoint();
        let place = config.place().unwrap_or_default();
        let (user, address) = (&place.user, format!("{}:{}", place.host, place.port));
        let key = "[broker] url (VOLCANO_RUNNER_BROKER__URL)";
        let (retryable, message) = match e.kind() {
            lapin::ErrorKind::ProtocolError(amqp)
                if matches!(
                    amqp.kind(),
                    AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                ) =>
            {
                (
                    false,
                    format!(
                        "RabbitMQ at {at} refused the login of user {user:?}: check the user name and \
                         password in {key}"
                    ),
                )
            }
            lapin::ErrorKind::ProtocolError(amqp)
                if matches!(amqp.kind(), AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)) =>
            {
                (
                    false,
                    format!(
                        "RabbitMQ at {at} has no vhost {:?} that user {user:?} may use: create it and \
                         grant the user permissions (rabbitmqctl add_vhost, set_permissions), or fix the \
                         vhost in {key}",
                        place.vhost
                    ),
                )
            }
            lapin::ErrorKind::InvalidProtocolVersion(_) => (
                false,
                format!(
                    "{at} does not speak AMQP 0.9.1: is {key} the AMQP port (5672, or 5671 for TLS)?"
                ),
            ),
            lapin::ErrorKind::IOError(io) => (
                true,
                match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => {
                        format!("nothing accepts connections at {address} (connection refused)")
                    }
                    _ if is_lookup_failure(io) => {
                        format!("the host name {:?} does not resolve ({io})", place.host)
                    }
                    _ => format!("cannot reach {address}: {io}"),
                },
            ),
            _ => (true, format!("cannot connect to RabbitMQ at {at}: {e}")),
        };
        Self::Connect { message, retryable }
    }
}

/// Whether an I/O error is a failed name lookup (the resolver's words; std has no kind for it).
fn is_lookup_failure(io: &std::io::Error) -> bool {
    let text = io.to_string();
    text.contains("failed to lookup address")
        || text.contains("Name or service not known")
        || text.contains("Temporary failure in name resolution")
        || text.contains("No address associated")
}

/// The connection as consumers and publishers see it.
#[derive(Clone)]
struct Live {
    /// Bumped on every new connection, so a holder of a channel can tell that it is stale.
    generation: u64,
    connection: Option<Arc<Connection>>,
}

struct Shared {
    config: BrokerConfig,
    topology: Topology,
    live: watch::Sender<Live>,
    reconnects: AtomicU64,
    /// A consumer or publisher saw a failure: look at the connection now rather than at the next tick.
    suspect: Notify,
    /// The caller's shutdown: stop consuming and do not reconnect any more.
    shutdown: CancellationToken,
    /// [`Broker::close`]: close the connection and end the supervisor.
    closing: CancellationToken,
    supervisor: Mutex<Option<JoinHandle<()>>>,
    /// Every publisher made from this broker, so that [`Broker::close`] closes their channels (and waits
    /// for the broker's close-ok) before the connection: a channel closed by lapin when its last handle
    /// drops races the connection's close and is logged as a connection error.
    /// Held strongly: a channel whose last publisher is dropped during shutdown is still closed here.
    publishers: Mutex<Vec<Arc<super::publisher::PublisherChannel>>>,
}

/// The process's connection to RabbitMQ. Cheap to clone; every clone is the same connection.
///
/// The supervisor task it starts is owned by the `Broker` and ended by [`Broker::close`].
#[derive(Clone)]
pub struct Broker {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("generation", &self.generation())
            .field("connected", &self.is_connected())
            .field("reconnects", &self.reconnects())
            .finish()
    }
}

/// What ops reads of the connection for readiness and metrics.
impl crate::ops::BrokerConnection for Broker {
    fn is_connected(&self) -> bool {
        Broker::is_connected(self)
    }

    fn reconnects(&self) -> u64 {
        Broker::reconnects(self)
    }
}

impl Broker {
    /// Connects, declares (or in passive mode checks) the topology, and starts the supervisor.
    ///
    /// Transient failures are retried with backoff for `broker.startup_timeout`; refused credentials, a
    /// missing vhost and a topology problem fail at once, with a message that says what to fix. `shutdown`
    /// is the process's shutdown signal: once it fires, consumers stop taking deliveries and a lost
    /// connection is no longer re-established, but the current connection stays open (so in-flight work
    /// can still be acknowledged) until [`Broker::close`].
    pub async fn connect(
        config: BrokerConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, BrokerError> {
        let topology = Topology::from_config(&config);
        Self::connect_with(config, topology, shutdown).await
    }

    /// Connects without declaring or checking any topology: for a command that looks at a vhost as it
    /// is (`admin status`, `admin dead-letters`), and says itself what is missing there, rather than
    /// failing the connection on the first queue no runner has declared yet.
    pub async fn connect_bare(
        config: BrokerConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, BrokerError> {
        let nothing = Topology {
            exchanges: Vec::new(),
            queues: Vec::new(),
            bindings: Vec::new(),
        };
        Self::connect_with(config, nothing, shutdown).await
    }

    async fn connect_with(
        config: BrokerConfig,
        topology: Topology,
        shutdown: CancellationToken,
    ) -> Result<Self, BrokerError> {
        config.check()?;
        let (live, _) = watch::channel(Live {
            generation: 0,
            connection: None,
        });
        let shared = Arc::new(Shared {
            config,
            topology,
            live,
            reconnects: AtomicU64::new(0),
            suspect: Notify::new(),
            shutdown,
            closing: CancellationToken::new(),
            supervisor: Mutex::new(None),
            publishers: Mutex::new(Vec::new()),
        });
        let (connection, events) = first_connection(&shared).await?;
        info!(
            connection = %shared.config.connection_name,
            passive = shared.config.passive,
            "Connected to RabbitMQ and the topology is in place."
        );
        let connection = Arc::new(connection);
        shared.live.send_replace(Live {
            generation: 1,
            connection: Some(connection.clone()),
        });
        let task = tokio::spawn(supervise(shared.clone(), connection, events));
        *shared.supervisor.lock().expect("supervisor lock") = Some(task);
        Ok(Self { shared })
    }

    /// The configuration this broker was started with.
    pub fn config(&self) -> &BrokerConfig {
        &self.shared.config
    }

    /// The topology it declares.
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// How often the connection was re-established since start (a metric).
    pub fn reconnects(&self) -> u64 {
        self.shared.reconnects.load(Ordering::Relaxed)
    }

    /// The number of the current connection, 1 for the first. A holder of a channel from an older
    /// generation knows its channel is gone.
    pub fn generation(&self) -> u64 {
        self.shared.live.borrow().generation
    }

    /// Whether a connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.shared
            .live
            .borrow()
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected())
    }

    /// The shutdown signal given to [`Broker::connect`].
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shared.shutdown
    }

    /// A publisher with confirms on its own channel.
    pub fn publisher(&self) -> Publisher {
        let publisher = Publisher::new(self.clone());
        let mut publishers = self.shared.publishers.lock().expect("publishers lock");
        // Channels no publisher uses any more are let go (lapin closes a dropped channel) while running.
        publishers.retain(|p| Arc::strong_count(p) > 1);
        publishers.push(publisher.channel_handle());
        publisher
    }

    /// A consumer of the submit or control queue with its configured prefetch, already consuming.
    pub async fn consumer(&self, kind: ConsumerKind) -> Result<QueueConsumer, BrokerError> {
        QueueConsumer::start(self.clone(), kind).await
    }

    /// A temporary queue on the events and proxy exchanges, for `volcano-runner events`.
    pub async fn follow_events(&self) -> Result<EventsFollower, BrokerError> {
        EventsFollower::start(self.clone()).await
    }

    /// Waits until the connection after `generation` is up (for callers that saw theirs fail).
    pub async fn wait_for_generation_after(&self, generation: u64) -> Result<u64, BrokerError> {
        let mut rx = self.shared.live.subscribe();
        tokio::select! {
            r = rx.wait_for(|l| l.generation > generation && l.connection.is_some()) => {
                r.map(|l| l.generation).map_err(|_| BrokerError::Shutdown)
            }
            _ = self.shared.closing.cancelled() => Err(BrokerError::Shutdown),
        }
    }

    /// Closes the connection cleanly (unacknowledged deliveries go back to their queues) and ends the
    /// supervisor. Close consumers first so they can cancel politely; this is safe to call more than once.
    pub async fn close(&self) {
        let publishers: Vec<_> = self
            .shared
            .publishers
            .lock()
            .expect("publishers lock")
            .drain(..)
            .collect();
        for publisher in publishers {
            publisher.close().await;
        }
        self.shared.closing.cancel();
        let task = self
            .shared
            .supervisor
            .lock()
            .expect("supervisor lock")
            .take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            warn!(error = %e, "The RabbitMQ supervisor ended abnormally.");
        }
    }

    /// A new channel on the current connection, waiting for a reconnect when there is none. Fails with
    /// [`BrokerError::Shutdown`] when there is no connection and shutdown has begun.
    pub(crate) async fn channel(&self) -> Result<(u64, Channel), BrokerError> {
        loop {
            let (generation, connection) = self.connection().await?;
            match connection.create_channel().await {
                Ok(channel) => return Ok((generation, channel)),
                Err(e) if !connection.status().connected() => {
                    debug!(error = %e, "Channel could not open on a lost connection; waiting for the next.");
                    self.suspect();
                    self.wait_for_generation_after(generation).await?;
                }
                Err(e) => return Err(BrokerError::Channel(e)),
            }
        }
    }

    /// Declares the topology again (outside the reconnect cycle), e.g. when a queue was deleted under a
    /// consumer. In passive mode this only checks it.
    pub(crate) async fn redeclare(&self) -> Result<(), BrokerError> {
        let (_, connection) = self.connection().await?;
        let mode = declare_mode(&self.shared.config);
        self.shared
            .topology
            .apply(mode, || connection.create_channel())
            .await
            .map_err(BrokerError::from)
    }

    /// Tells the supervisor that something failed, so it looks at the connection now.
    pub(crate) fn suspect(&self) {
        self.shared.suspect.notify_one();
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shared.shutdown.is_cancelled() || self.shared.closing.is_cancelled()
    }

    pub(crate) fn closing_token(&self) -> &CancellationToken {
        &self.shared.closing
    }

    async fn connection(&self) -> Result<(u64, Arc<Connection>), BrokerError> {
        let mut rx = self.shared.live.subscribe();
        loop {
            {
                let live = rx.borrow_and_update();
                if let Some(c) = &live.connection
                    && c.status().connected()
                {
                    return Ok((live.generation, c.clone()));
                }
            }
            if self.is_shutting_down() {
                return Err(BrokerError::Shutdown);
            }
            self.suspect();
            tokio::select! {
                changed = rx.changed() => changed.map_err(|_| BrokerError::Shutdown)?,
                _ = self.shared.shutdown.cancelled() => {}
                _ = self.shared.closing.cancelled() => {}
            }
        }
    }
}

fn declare_mode(config: &BrokerConfig) -> DeclareMode {
    if config.passive {
        DeclareMode::Passive
    } else {
        DeclareMode::Declare
    }
}

type Events = std::pin::Pin<Box<dyn Stream<Item = Event> + Send>>;

/// The largest AMQP frame the runner offers when the URL does not set `frame_max`; the connection uses
/// the smaller of this and the server's `frame_max` (RabbitMQ's default is 128 KiB).
///
/// Chosen for memory: lapin keeps buffers of 32 frames each way, 8 MiB a connection at RabbitMQ's 128 KiB
/// (a sixth of an idle runner), 2 MiB at 32 KiB. What the runner publishes fits in it (a dead-letter
/// copy keeps at most 16 KiB of the message's own headers). A message's properties and headers travel in
/// one frame, which is never split, and RabbitMQ delivers a header frame larger than the connection's
/// size as it is: the sanitizer under lapin leaves the largest headers of such a message out, naming
/// them in `x-volcano-runner-dropped-headers` (see [`super::sanitize`]), so it is read and handled like
/// any other (the runner reads `traceparent` alone), and lapin never drops the connection for it.
/// `?frame_max=` in the URL overrides it.
pub const DEFAULT_FRAME_MAX: u32 = 32 * 1024;

/// Opens an AMQP connection to `url` the way every connection of this program is opened: with the
/// runner's frame size (see [`DEFAULT_FRAME_MAX`]) and the inbound frames sanitized, so that bytes a
/// publisher put in a short string cannot make lapin drop it (see [`super::sanitize`]).
pub async fn open_connection(
    url: &str,
    properties: ConnectionProperties,
) -> Result<Connection, lapin::Error> {
    match url.parse::<lapin::uri::AMQPUri>() {
        Ok(mut uri) => {
            uri.query.frame_max = uri.query.frame_max.or(Some(DEFAULT_FRAME_MAX));
            super::transport::connect(uri, properties).await
        }
        // The configuration check refuses such a URL; lapin names the problem if one gets here.
        Err(_) => Connection::connect(url, properties).await,
    }
}

/// One attempt: connect and put the topology in place.
async fn open(shared: &Shared) -> Result<(Connection, Events), BrokerError> {
    let properties = ConnectionProperties::default()
        .with_connection_name(shared.config.connection_name.as_str().into());
    let connection = open_connection(shared.config.url.expose(), properties)
        .await
        .map_err(|e| BrokerError::connect(&e, &shared.config))?;
    // Listen before anything else can fail, so no error event is missed.
    let events: Events = Box::pin(connection.events_listener());
    shared
        .topology
        .apply(declare_mode(&shared.config), || connection.create_channel())
        .await?;
    Ok((connection, events))
}

async fn first_connection(shared: &Shared) -> Result<(Connection, Events), BrokerError> {
    let deadline = tokio::time::Instant::now() + shared.config.startup_timeout;
    retry_until(
        deadline,
        shared.config.reconnect_backoff(),
        &shared.shutdown,
        || open(shared),
    )
    .await
    .map_err(|e| match e {
        BrokerError::StartupTimeout { waited, last, .. } => BrokerError::StartupTimeout {
            waited,
            endpoint: shared.config.endpoint(),
            last,
        },
        other => other,
    })
}

/// Runs `attempt` until it succeeds, fails permanently, shutdown begins, or the next try would start after
/// `deadline` (then [`BrokerError::StartupTimeout`]); waits the next of `delays` between tries. An attempt
/// that hangs is cut off at the deadline (lapin has hung on unreachable servers before, its 3.1.1 changelog).
async fn retry_until<T, F, Fut>(
    deadline: tokio::time::Instant,
    mut delays: impl Iterator<Item = Duration>,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> Result<T, BrokerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, BrokerError>>,
{
    let started = tokio::time::Instant::now();
    let gave_up = |last: String| BrokerError::StartupTimeout {
        // What was really waited (the whole budget, give or take an attempt), not what was configured.
        waited: started.elapsed(),
        endpoint: String::new(),
        last,
    };
    let mut last: Option<String> = None;
    loop {
        let result = tokio::select! {
            r = tokio::time::timeout_at(deadline, attempt()) => r,
            _ = shutdown.cancelled() => return Err(BrokerError::Shutdown),
        };
        let error = match result {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if !e.is_retryable() => return Err(e),
            Ok(Err(e)) => e,
            Err(_) => {
                let last = last.unwrap_or_else(|| "the attempt got no answer".into());
                return Err(gave_up(last));
            }
        };
        let Some(delay) = delays.next() else {
            return Err(gave_up(error.to_string()));
        };
        // The last wait is cut to the deadline, for one more try: the budget is used up, not given up
        // on early.
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(gave_up(error.to_string()));
        }
        let delay = delay.min(deadline - now);
        warn!(error = %error, ?delay, "RabbitMQ is not reachable yet; retrying.");
        last = Some(error.to_string());
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return Err(BrokerError::Shutdown),
        }
    }
}

/// Reconnects until it works, or until shutdown (then `None`).
async fn reconnect(shared: &Shared) -> Option<(Connection, Events)> {
    let mut delays = shared.config.reconnect_backoff();
    loop {
        let delay = delays.next().unwrap_or(shared.config.reconnect_max_delay);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shared.shutdown.cancelled() => return None,
            _ = shared.closing.cancelled() => return None,
        }
        let attempt = tokio::select! {
            r = tokio::time::timeout(shared.config.startup_timeout, open(shared)) => r,
            _ = shared.shutdown.cancelled() => return None,
            _ = shared.closing.cancelled() => return None,
        };
        let attempt = attempt.unwrap_or_else(|_| {
            Err(BrokerError::Connect {
                message: format!(
                    "no answer within {:?} (broker.startup_timeout)",
                    shared.config.startup_timeout
                ),
                retryable: true,
            })
        });
        match attempt {
            Ok(ok) => return Some(ok),
            // Permanent errors (a deleted vhost, a changed topology) need an operator; keep trying at the
            // slowest pace and say so loudly.
            Err(e) if !e.is_retryable() => {
                tracing::error!(error = %e, "Reconnecting to RabbitMQ failed and needs an operator; still retrying.");
            }
            Err(e) => warn!(error = %e, ?delay, "Reconnecting to RabbitMQ failed; retrying."),
        }
    }
}

/// Watches the connection and replaces it when it is lost, until [`Broker::close`].
async fn supervise(shared: Arc<Shared>, mut connection: Arc<Connection>, mut events: Events) {
    let mut tick = tokio::time::interval(shared.config.health_check_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let lost: Option<String> = tokio::select! {
            _ = shared.closing.cancelled() => break,
            event = events.next() => match event {
                Some(Event::Error(e)) if !connection.status().connected() => Some(e.to_string()),
                Some(Event::Error(e)) => {
                    // A channel error: the channel's owner handles it.
                    debug!(error = %e, "A RabbitMQ channel failed.");
                    None
                }
                Some(Event::ConnectionBlocked(reason)) => {
                    warn!(%reason, "RabbitMQ blocked publishing on this connection (resource alarm).");
                    None
                }
                Some(Event::ConnectionUnblocked) => {
                    info!("RabbitMQ unblocked publishing on this connection.");
                    None
                }
                Some(_) => None,
                None => Some("the connection's event stream ended".to_owned()),
            },
            _ = shared.suspect.notified() => lost_state(&connection),
            _ = tick.tick() => lost_state(&connection),
        };
        let Some(reason) = lost else { continue };
        let generation = {
            let mut generation = 0;
            shared.live.send_modify(|l| {
                l.connection = None;
                generation = l.generation;
            });
            generation
        };
        if shared.shutdown.is_cancelled() {
            info!(%reason, "RabbitMQ connection lost during shutdown; not reconnecting.");
            return;
        }
        warn!(%reason, generation, "RabbitMQ connection lost; reconnecting.");
        let Some((new_connection, new_events)) = reconnect(&shared).await else {
            return;
        };
        connection = Arc::new(new_connection);
        events = new_events;
        shared.reconnects.fetch_add(1, Ordering::Relaxed);
        shared.live.send_modify(|l| {
            l.generation = generation + 1;
            l.connection = Some(connection.clone());
        });
        info!(
            generation = generation + 1,
            "Reconnected to RabbitMQ and the topology is in place again."
        );
    }
    shared.live.send_modify(|l| l.connection = None);
    if connection.status().connected()
        && let Err(e) = connection.close(200, "shutdown".into()).await
    {
        debug!(error = %e, "Closing the RabbitMQ connection failed; it is gone either way.");
    }
}

fn lost_state(connection: &Connection) -> Option<String> {
    let status = connection.status();
    if status.connected() {
        return None;
    }
    let state = if status.errored() {
        "failed"
    } else if status.closing() || status.closed() {
        "closed"
    } else {
        "not connected"
    };
    Some(format!("the connection is {state}"))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    fn refused() -> BrokerError {
        BrokerError::Connect {
            message: "Connection refused".into(),
            retryable: true,
        }
    }

    fn backoff() -> impl Iterator<Item = Duration> {
        BrokerConfig {
            reconnect_min_delay: Duration::from_secs(1),
            reconnect_max_delay: Duration::from_secs(4),
            ..BrokerConfig::default()
        }
        .reconnect_backoff()
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_backoff_until_the_deadline() {
        let attempts = AtomicU32::new(0);
        let start = tokio::time::Instant::now();
        let budget = Duration::from_secs(30);
        let err = retry_until(
            start + budget,
            backoff(),
            &CancellationToken::new(),
            || async {
                attempts.fetch_add(1, Ordering::Relaxed);
                Err::<(), _>(refused())
            },
        )
        .await
        .unwrap_err();
        let waited = start.elapsed();
        assert!(matches!(err, BrokerError::StartupTimeout { .. }), "{err:?}");
        assert!(err.to_string().contains("Connection refused"), "{err}");
        // The budget is used up (the last wait is cut to the deadline), not given up on early, and the
        // error says how long it really waited.
        assert!(
            waited > Duration::from_secs(29) && waited <= budget,
            "{waited:?}"
        );
        assert!(
            err.to_string()
                .contains(&format!("within {} s", waited.as_secs_f32().round())),
            "{err}"
        );
        // Delays of at least 1, 2, 4, 4, ... seconds (plus jitter) fit 5 to 10 times into 30 s.
        let n = attempts.load(Ordering::Relaxed);
        assert!((5..=10).contains(&n), "{n} attempts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_error_is_not_retried() {
        let attempts = AtomicU32::new(0);
        let start = tokio::time::Instant::now();
        let err = retry_until(
            start + Duration::from_secs(30),
            backoff(),
            &CancellationToken::new(),
            || async {
                attempts.fetch_add(1, Ordering::Relaxed);
                Err::<(), _>(BrokerError::Connect {
                    message: "ACCESS_REFUSED".into(),
                    retryable: false,
                })
            },
        )
        .await
        .unwrap_err();
        assert!(matches!(
            err,
            BrokerError::Connect {
                retryable: false,
                ..
            }
        ));
        assert_eq!(attempts.load(Ordering::Relaxed), 1);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn success_after_failures_is_returned() {
        let attempts = AtomicU32::new(0);
        let value = retry_until(
            tokio::time::Instant::now() + Duration::from_secs(30),
            backoff(),
            &CancellationToken::new(),
            || async {
                match attempts.fetch_add(1, Ordering::Relaxed) {
                    0 | 1 => Err(refused()),
                    n => Ok(n),
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(value, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_attempt_is_cut_off_at_the_deadline_and_shutdown_ends_it_sooner() {
        let start = tokio::time::Instant::now();
        let err = retry_until(
            start + Duration::from_secs(10),
            backoff(),
            &CancellationToken::new(),
            std::future::pending::<Result<(), BrokerError>>,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, BrokerError::StartupTimeout { .. }), "{err:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(10));

        let shutdown = CancellationToken::new();
        let cancel = shutdown.clone();
        let start = tokio::time::Instant::now();
        let (err, ()) = tokio::join!(
            retry_until(
                start + Duration::from_secs(10),
                backoff(),
                &shutdown,
                std::future::pending::<Result<(), BrokerError>>,
            ),
            async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                cancel.cancel();
            }
        );
        assert!(matches!(err, Err(BrokerError::Shutdown)), "{err:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }
}
