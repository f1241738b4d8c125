//! The AMQP listener: consumes Octopoes' `scan_profile_mutations` and Bytes' `raw_file_received`
//! (reference §1.9), records each event in the frontier, plans the work it asks for and pushes it.
//!
//! - **Ack after commit.** A message is acked only once its frontier write and every push it
//!   caused are committed: at-least-once delivery, and applying a message twice changes nothing
//!   (frontier upserts; a repeated push is a duplicate of waiting work).
//! - **Poison goes to a dead-letter queue.** A message that cannot be used (malformed, or refused
//!   for what it says) is published to `<queue>.dead` with the reason in the `x-kat-reason`
//!   header, confirmed, and then acked: it never blocks the queue, however many come.
//! - **Transient failures are retried.** While the database is away or a scheduler is full, the
//!   message is handed back (`nack`, requeue) after a pause, so nothing is lost and nothing spins.
//!   The two queues are consumed apart, so one queue's pause does not hold the other's events.
//! - **Reconnects.** When RabbitMQ goes away, or refuses the listener, it tries again after
//!   [`FIRST_RETRY`], doubling each time to at most [`MAX_BACKOFF`], and back to the first wait
//!   once a connection held (reached consuming); unacked messages go back to their queue with the
//!   old connection. Each failed attempt is one WARN that says what happened: a refused login, a
//!   refused connection, or a lost one (only after a connection held). lapin's own connection
//!   recovery stays off (its default), so nothing retries behind the listener's back. `/health`
//!   shows each queue's state and counts.

mod clearance;
mod mutations;
pub mod parked;
mod raw_files;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::frontier::Frontier;
use crate::planner::{PlanError, Planner};
use crate::storage::redact;

/// Longest wait between two connection attempts: a RabbitMQ that refuses the listener for hours
/// (a wrong password) is asked once a minute, and a returning one is found within a minute.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// First wait after a failed attempt or a lost connection.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Wait before handing back a message that failed for a passing reason.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Longest wait for RabbitMQ to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the listener asks RabbitMQ how many messages wait in its queues (its lag).
const LAG_EVERY: Duration = Duration::from_secs(1);

/// Where to listen.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// `amqp://user:pass@host:5672/vhost` (mula's `QUEUE_URI`).
    pub uri: String,
    /// Octopoes' object events.
    pub mutations_queue: String,
    /// Bytes' raw file events.
    pub raw_files_queue: String,
    /// Unacked messages RabbitMQ hands the listener at most, per queue.
    pub prefetch: u16,
}

/// What a message came to.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Its effect is committed: ack it.
    Done,
    /// It cannot be used: dead-letter it with this reason.
    Poison(String),
    /// It failed for a passing reason: hand it back to try again, or park it once it has
    /// failed long enough ([`parked`]).
    Retry(String),
    /// It waits behind an earlier event of its object that was handed back: hand it back too,
    /// or park it if that one is parked with it.
    Behind(String),
    /// An earlier event of its object is parked: park it behind, unapplied.
    Park(String),
}

impl Outcome {
    /// The outcome of planning a message's work.
    pub(crate) fn of_plan(planned: &Result<usize, PlanError>) -> Outcome {
        match planned {
            Ok(_) => Outcome::Done,
            Err(PlanError::Passing(why)) => Outcome::Retry(why.clone()),
            Err(PlanError::Refused(why)) => Outcome::Poison(why.clone()),
        }
    }

    /// The outcome of a frontier write that failed for `e`.
    pub(crate) fn of_storage(e: &crate::storage::StorageError) -> Outcome {
        if e.is_request_fault() {
            Outcome::Poison(format!("the frontier refused it: {e}"))
        } else {
            Outcome::Retry(e.to_string())
        }
    }
}

/// One queue's figures, for `/health` and `/metrics`.
#[derive(Debug, Default, Serialize)]
pub struct QueueFigures {
    /// The queue.
    pub queue: String,
    /// `off`, `connecting`, `consuming` or `down: <why>`.
    pub state: String,
    /// Messages received.
    pub received: u64,
    /// Batches they were handled in (received ÷ batches is the batch size).
    pub batches: u64,
    /// Messages acked after their effect was committed.
    pub acked: u64,
    /// Messages sent to the dead-letter queue.
    pub dead_lettered: u64,
    /// Messages handed back to be tried again.
    pub retried: u64,
    /// Messages parked in the database after failing too long (acked; see [`parked`]).
    pub parked: u64,
    /// Messages ready in the queue, not yet delivered (the listener's lag; read once a second).
    pub ready: u64,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    batches: AtomicU64,
    acked: AtomicU64,
    dead_lettered: AtomicU64,
    retried: AtomicU64,
    parked: AtomicU64,
    ready: AtomicU64,
}

/// The listener's state, shared with the API.
#[derive(Debug)]
pub struct ListenerStatus {
    queues: [String; 2],
    state: Mutex<String>,
    /// Connections that reached consuming (more than one: it reconnected).
    sessions: tokio::sync::watch::Sender<u64>,
    counters: [Counters; 2],
    handled: tokio::sync::watch::Sender<u64>,
    retried: tokio::sync::watch::Sender<u64>,
    parked: tokio::sync::watch::Sender<u64>,
}

impl ListenerStatus {
    /// A status for these two queues, `off` until the listener runs.
    pub fn new(mutations_queue: &str, raw_files_queue: &str) -> Self {
        Self {
            queues: [mutations_queue.to_owned(), raw_files_queue.to_owned()],
            state: Mutex::new("off".into()),
            sessions: tokio::sync::watch::channel(0).0,
            counters: Default::default(),
            handled: tokio::sync::watch::channel(0).0,
            retried: tokio::sync::watch::channel(0).0,
            parked: tokio::sync::watch::channel(0).0,
        }
    }

    fn set_state(&self, s: impl Into<String>) {
        *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s.into();
    }

    /// The connection's state.
    pub fn state(&self) -> String {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Connections that reached consuming since start.
    pub fn sessions(&self) -> u64 {
        *self.sessions.borrow()
    }

    /// Waits until `n` connections have reached consuming (a test signal).
    pub async fn wait_sessions(&self, n: u64) {
        let mut rx = self.sessions.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Each queue's figures.
    pub fn figures(&self) -> Vec<QueueFigures> {
        let state = self.state();
        self.queues
            .iter()
            .zip(&self.counters)
            .map(|(q, c)| QueueFigures {
                queue: q.clone(),
                state: state.clone(),
                received: c.received.load(Ordering::Relaxed),
                batches: c.batches.load(Ordering::Relaxed),
                acked: c.acked.load(Ordering::Relaxed),
                dead_lettered: c.dead_lettered.load(Ordering::Relaxed),
                retried: c.retried.load(Ordering::Relaxed),
                parked: c.parked.load(Ordering::Relaxed),
                ready: c.ready.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Waits until `n` messages in all have been acked or dead-lettered (a test signal).
    pub async fn wait_handled(&self, n: u64) {
        let mut rx = self.handled.subscribe();
        let _ = rx.wait_for(|h| *h >= n).await;
    }

    /// Waits until `n` messages in all have been handed back (a test signal).
    pub async fn wait_retried(&self, n: u64) {
        let mut rx = self.retried.subscribe();
        let _ = rx.wait_for(|r| *r >= n).await;
    }

    /// Waits until `n` messages in all have been parked (a test signal).
    pub async fn wait_parked(&self, n: u64) {
        let mut rx = self.parked.subscribe();
        let _ = rx.wait_for(|p| *p >= n).await;
    }

    fn handled_n(&self, n: u64) {
        self.handled.send_modify(|h| *h += n);
    }
}

/// Which of the two queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Octopoes' object events.
    Mutations = 0,
    /// Bytes' raw file events.
    RawFiles = 1,
}

impl Source {
    /// Its name in `listener_parked.source`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Mutations => "mutations",
            Source::RawFiles => "raw_files",
        }
    }
}

/// The listener and what it needs.
pub struct Listener {
    /// Where to listen.
    pub config: ListenerConfig,
    /// Where objects and raw files are recorded.
    pub frontier: Frontier,
    /// What work they ask for, and where it goes.
    pub planner: Planner,
    /// Its state, shared with the API.
    pub status: Arc<ListenerStatus>,
    /// Objects whose event was handed back: their later events wait behind it (`Holds`, in
    /// `listener/mutations.rs`).
    pub holds: mutations::Holds,
    /// Where and when events that keep failing are set aside.
    pub parking: parked::Parking,
}

impl Listener {
    /// Listens until `token` is cancelled, reconnecting whenever the connection is lost.
    pub async fn run(self: Arc<Self>, token: CancellationToken) {
        let mut backoff = Backoff::default();
        info!(uri = %redact(&self.config.uri), "AMQP listener starting");
        while !token.is_cancelled() {
            self.status.set_state("connecting");
            let mut held = false;
            let why = match self.session(&token, &mut held).await {
                Ok(()) => break,
                Err(e) => describe(&e, &self.config.uri, held),
            };
            if held {
                backoff.held();
            }
            let wait = backoff.failed();
            warn!(retry_in_ms = wait.as_millis() as u64, "{why}");
            self.status.set_state(format!("down: {why}"));
            tokio::select! {
                () = token.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        self.status.set_state("off");
        info!("AMQP listener stopped");
    }

    /// One connection: declare, consume, handle until the token or the connection ends.
    async fn session(
        &self,
        token: &CancellationToken,
        held: &mut bool,
    ) -> Result<(), lapin::Error> {
        // Named, so an operator (or a test) can tell this connection apart in RabbitMQ.
        let name = format!("kat-scheduler listener ({})", self.config.mutations_queue);
        let properties = ConnectionProperties::default().with_connection_name(name.as_str().into());
        let connect = Connection::connect(&self.config.uri, properties);
        // A stop does not wait for a connect that hangs (a black-holed RabbitMQ).
        let conn = tokio::select! {
            () = token.cancelled() => return Ok(()),
            connected = tokio::time::timeout(CONNECT_TIMEOUT, connect) => connected,
        }
        .map_err(|_| lapin::Error::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
        // A channel per queue: each consumer's unacked window is its own, and a batch is acked
        // in one frame without touching the other queue's deliveries.
        let mut consumers = Vec::with_capacity(2);
        for (q, tag) in [
            (&self.config.mutations_queue, "kat-scheduler-mutations"),
            (&self.config.raw_files_queue, "kat-scheduler-raw-files"),
        ] {
            let channel = conn.create_channel().await?;
            channel
                .basic_qos(self.config.prefetch, BasicQosOptions::default())
                .await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            for name in [q.clone(), dead_letter(q)] {
                ensure_queue(&conn, &channel, &name).await?;
            }
            let consumer = channel
                .basic_consume(
                    q.as_str().into(),
                    tag.into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            consumers.push((channel, consumer));
        }
        let (raw_channel, raw_files) = consumers.pop().ok_or_else(no_consumer)?;
        let (mut_channel, mutations) = consumers.pop().ok_or_else(no_consumer)?;
        self.status.set_state("consuming");
        self.status.sessions.send_modify(|c| *c += 1);
        // The old connection's unacked messages went back to the queue in their order: nothing
        // handed back is ahead of anything else any more.
        self.holds.clear();
        *held = true;
        info!(
            mutations = %self.config.mutations_queue,
            raw_files = %self.config.raw_files_queue,
            "AMQP listener consuming"
        );
        // Each queue is consumed on its own: a batch handed back waits out its pause
        // ([`RETRY_PAUSE`]) without holding the other queue's events, which plan other work.
        tokio::try_join!(
            self.consume(Source::Mutations, &mut_channel, mutations, token),
            self.consume(Source::RawFiles, &raw_channel, raw_files, token),
        )?;
        // Stopped: unacked messages go back to their queues with the channels.
        let _ = mut_channel.close(200, "shutting down".into()).await;
        let _ = raw_channel.close(200, "shutting down".into()).await;
        let _ = conn.close(200, "shutting down".into()).await;
        Ok(())
    }

    /// Consumes one queue until `token` is cancelled or the connection fails: what has arrived
    /// is taken as one batch (up to the prefetch window) and handled; the queue's lag is read
    /// every [`LAG_EVERY`].
    async fn consume(
        &self,
        source: Source,
        channel: &Channel,
        mut consumer: Consumer,
        token: &CancellationToken,
    ) -> Result<(), lapin::Error> {
        let queue = match source {
            Source::Mutations => &self.config.mutations_queue,
            Source::RawFiles => &self.config.raw_files_queue,
        };
        let most = usize::from(self.config.prefetch).clamp(1, BATCH_MAX);
        let mut lag = tokio::time::interval(LAG_EVERY);
        lag.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                () = token.cancelled() => return Ok(()),
                _ = lag.tick() => {
                    self.read_lag(source, channel, queue).await?;
                    continue;
                }
                d = consumer.next() => d,
            };
            // What else has arrived joins the batch: one frontier write, one push, one ack.
            let batch = gather(first, &mut consumer, most)?;
            self.handle(source, channel, batch, token).await?;
        }
    }

    /// Asks RabbitMQ how many messages wait in `queue` (a passive declare: it changes nothing).
    async fn read_lag(
        &self,
        source: Source,
        channel: &Channel,
        queue: &str,
    ) -> Result<(), lapin::Error> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let q = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await?;
        self.status.counters[source as usize]
            .ready
            .store(u64::from(q.message_count()), Ordering::Relaxed);
        Ok(())
    }

    /// Handles a batch of one queue's deliveries: decides each, then acks, dead-letters or hands
    /// back each as decided.
    async fn handle(
        &self,
        source: Source,
        channel: &Channel,
        batch: Vec<Delivery>,
        token: &CancellationToken,
    ) -> Result<(), lapin::Error> {
        let counters = &self.status.counters[source as usize];
        counters
            .received
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        counters.batches.fetch_add(1, Ordering::Relaxed);
        let bodies: Vec<&[u8]> = batch.iter().map(|d| d.data.as_slice()).collect();
        let outcomes = match source {
            Source::Mutations => {
                let redelivered: Vec<bool> = batch.iter().map(|d| d.redelivered).collect();
                self.on_mutations(&bodies, &redelivered).await
            }
            Source::RawFiles => self.on_raw_files(&bodies).await,
        };
        let queue = match source {
            Source::Mutations => &self.config.mutations_queue,
            Source::RawFiles => &self.config.raw_files_queue,
        };
        let all_done = outcomes.iter().all(|o| matches!(o, Outcome::Done));
        if all_done && let Some(last) = batch.last() {
            // Every delivery up to the last is done: one ack for all.
            last.ack(BasicAckOptions { multiple: true }).await?;
            counters
                .acked
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            self.status.handled_n(batch.len() as u64);
            return Ok(());
        }
        let mut failed = Vec::new();
        for (delivery, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Done => {
                    delivery.ack(BasicAckOptions::default()).await?;
                    counters.acked.fetch_add(1, Ordering::Relaxed);
                    self.status.handled_n(1);
                }
                Outcome::Poison(reason) => {
                    warn!(queue = %queue, reason = %reason, "message dead-lettered");
                    dead_letter_publish(channel, queue, &delivery.data, &reason).await?;
                    delivery.ack(BasicAckOptions::default()).await?;
                    counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    self.status.handled_n(1);
                }
                failure => failed.push((delivery, failure)),
            }
        }
        let now = self.planner.clock.now();
        let parked::Sorted { park, mut retry } = self.sort_out(source, failed, now);
        if !park.is_empty() {
            let (deliveries, rows): (Vec<_>, Vec<_>) = park
                .into_iter()
                .map(|(d, row, mark)| ((d, mark), row))
                .unzip();
            let first_reason = rows[0].reason.clone();
            match self.park(rows, now).await {
                Ok(()) => {
                    let n = deliveries.len() as u64;
                    warn!(queue = %queue, messages = n, reason = %first_reason, "messages that kept failing parked: they are tried again from the database (listener_parked)");
                    let marks: Vec<_> = deliveries.iter().map(|(_, m)| m.clone()).collect();
                    self.after_park(&marks, now);
                    for (delivery, _) in deliveries {
                        delivery.ack(BasicAckOptions::default()).await?;
                    }
                    counters.parked.fetch_add(n, Ordering::Relaxed);
                    self.status.handled_n(n);
                    self.status.parked.send_modify(|p| *p += n);
                }
                Err(e) => {
                    warn!(queue = %queue, error = %e, "messages could not be parked: handed back");
                    retry.extend(
                        deliveries
                            .into_iter()
                            .map(|(d, _)| (d, first_reason.clone())),
                    );
                }
            }
        }
        if let Some((_, reason)) = retry.first() {
            warn!(queue = %queue, messages = retry.len(), reason = %reason, "messages handed back to be tried again");
            tokio::select! {
                () = token.cancelled() => {}
                () = tokio::time::sleep(RETRY_PAUSE) => {}
            }
            for (delivery, _) in &retry {
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await?;
            }
            counters
                .retried
                .fetch_add(retry.len() as u64, Ordering::Relaxed);
            self.status
                .retried
                .send_modify(|r| *r += retry.len() as u64);
        }
        Ok(())
    }
}

/// The waits between connection attempts: [`FIRST_RETRY`] doubling to [`MAX_BACKOFF`], back to
/// the first once a connection held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST_RETRY }
    }
}

impl Backoff {
    /// An attempt failed: the wait before the next one (the following wait doubles).
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        wait
    }

    /// A connection held: the next failure waits [`FIRST_RETRY`] again.
    pub fn held(&mut self) {
        self.next = FIRST_RETRY;
    }
}

/// What a failed connection came to, in words an operator can act on: a refused login names the
/// user and RabbitMQ's reason, a refused or unanswered connection names the address, and a
/// connection is "lost" only when it had `held` (reached consuming).
pub fn describe(e: &lapin::Error, uri: &str, held: bool) -> String {
    let parsed = uri.parse::<lapin::uri::AMQPUri>().ok();
    let at = parsed
        .as_ref()
        .map(|u| format!("{}:{}", u.authority.host, u.authority.port))
        .unwrap_or_else(|| redact(uri));
    let user = parsed
        .as_ref()
        .map(|u| u.authority.userinfo.username.clone())
        .unwrap_or_default();
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(
                amqp.kind(),
                lapin::protocol::AMQPErrorKind::Soft(lapin::protocol::AMQPSoftError::ACCESSREFUSED)
                    | lapin::protocol::AMQPErrorKind::Hard(
                        lapin::protocol::AMQPHardError::NOTALLOWED
                    )
            ) && !held =>
        {
            format!(
                "RabbitMQ refused the login for user {user}: {}",
                amqp.get_message()
            )
        }
        lapin::ErrorKind::IOError(io) if !held => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                format!("cannot connect to RabbitMQ at {at}: connection refused")
            }
            std::io::ErrorKind::TimedOut => format!(
                "cannot connect to RabbitMQ at {at}: no answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            ),
            _ => format!("cannot connect to RabbitMQ at {at}: {io}"),
        },
        _ if held => format!("AMQP connection to {at} lost: {e}"),
        _ => format!("cannot listen on RabbitMQ at {at}: {e}"),
    }
}

/// Deliveries handled together at most: a batch is what has arrived, up to the prefetch window.
const BATCH_MAX: usize = 1_000;

fn no_consumer() -> lapin::Error {
    lapin::Error::from(std::io::Error::other("no consumer"))
}

/// `first` and the deliveries already waiting behind it, `most` in all, without waiting for more.
fn gather(
    first: Option<Result<Delivery, lapin::Error>>,
    consumer: &mut Consumer,
    most: usize,
) -> Result<Vec<Delivery>, lapin::Error> {
    let ended = || {
        lapin::Error::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the consumer was cancelled",
        ))
    };
    let mut batch = vec![first.ok_or_else(ended)??];
    while batch.len() < most {
        match consumer.next().now_or_never() {
            Some(Some(d)) => batch.push(d?),
            // The stream ended or holds nothing more now: handle what there is (an ended stream
            // shows again on the next read).
            Some(None) | None => break,
        }
    }
    Ok(batch)
}

/// Declares `name` durable unless it exists. A queue an operator declared with arguments (a
/// quorum queue, a length limit) is used as it is: declared again without them, RabbitMQ
/// refuses (406 PRECONDITION_FAILED) and closes the channel, and the listener could never start.
/// Whether it exists is asked on a channel of its own (a passive declare of a missing queue
/// closes its channel); on any refusal there, the durable declaration says what is wrong.
async fn ensure_queue(
    conn: &Connection,
    channel: &Channel,
    name: &str,
) -> Result<(), lapin::Error> {
    let probe = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let exists = probe
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
        .is_ok();
    if exists {
        let _ = probe.close(200, "checked".into()).await;
        return Ok(());
    }
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(name.into(), durable, FieldTable::default())
        .await?;
    Ok(())
}

/// The dead-letter queue of `queue`.
pub fn dead_letter(queue: &str) -> String {
    format!("{queue}.dead")
}

async fn dead_letter_publish(
    channel: &Channel,
    queue: &str,
    body: &[u8],
    reason: &str,
) -> Result<(), lapin::Error> {
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("x-kat-reason"),
        AMQPValue::LongString(reason.into()),
    );
    headers.insert(
        ShortString::from("x-kat-queue"),
        AMQPValue::LongString(queue.into()),
    );
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    // Mandatory, and its confirmation read: a message with no queue to go to (the dead-letter
    // queue deleted while the listener runs) is otherwise dropped and confirmed all the same,
    // and the original, acked, would be lost. A queue gone is declared again and the message
    // tried once more; failing that, or refused, the session ends and the unacked original goes
    // back to its queue.
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    for attempt in 0..2 {
        let confirmation = channel
            .basic_publish(
                ShortString::from(""),
                dead_letter(queue).into(),
                mandatory,
                body,
                properties.clone(),
            )
            .await?
            .await?;
        match confirmation {
            Confirmation::Ack(None) | Confirmation::NotRequested => return Ok(()),
            // Returned unrouted: the queue is gone. A queue that exists and refuses (a nack: an
            // operator's length limit with `reject-publish`) is not declared again: declared
            // without its arguments, RabbitMQ would refuse that too and close the channel.
            Confirmation::Ack(Some(_)) if attempt == 0 => {
                warn!(queue = %dead_letter(queue), "the dead-letter queue is gone; declaring it again");
                let durable = QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                };
                channel
                    .queue_declare(dead_letter(queue).into(), durable, FieldTable::default())
                    .await?;
            }
            _ => break,
        }
    }
    Err(std::io::Error::other(format!(
        "the dead-letter queue {} did not take a message (gone after being declared again, or \
         full and refusing)",
        dead_letter(queue)
    ))
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPSoftError};

    const URI: &str = "amqp://guest:secret@rabbit.example:5672/%2f";

    #[test]
    fn retries_wait_one_second_doubling_to_a_minute_and_start_over_after_a_connection_held() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.failed().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        b.held();
        assert_eq!(b.failed(), FIRST_RETRY);
        assert_eq!(b.failed(), Duration::from_secs(2));
    }

    #[test]
    fn a_refused_login_says_so_and_names_the_user_not_the_password() {
        let refused = lapin::Error::from(lapin::ErrorKind::ProtocolError(AMQPError::new(
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
            "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN.".into(),
        )));
        let why = describe(&refused, URI, false);
        assert_eq!(
            why,
            "RabbitMQ refused the login for user guest: ACCESS_REFUSED - Login was refused \
             using authentication mechanism PLAIN."
        );
        assert!(!why.contains("secret") && !why.contains("lost"), "{why}");
    }

    #[test]
    fn a_refused_connection_names_the_address_and_is_never_lost_before_a_first_connection() {
        let refused =
            lapin::Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            describe(&refused, URI, false),
            "cannot connect to RabbitMQ at rabbit.example:5672: connection refused"
        );
        let reset = lapin::Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(describe(&reset, URI, false).starts_with("cannot connect to RabbitMQ"));
        assert!(
            describe(&reset, URI, true).starts_with("AMQP connection to rabbit.example:5672 lost")
        );
    }
}
