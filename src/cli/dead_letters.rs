//! `volcano-runner admin dead-letters list|show|requeue|drop`: the dead-letter queue for an operator, over
//! AMQP alone ([`crate::broker::dead_letters`]): read the dead letters with their reasons, requeue them to
//! where they came from (same `message_id`, so exactly-once holds) or drop them, by message id or by
//! filter. Every message a command leaves alone goes back to the queue unchanged.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::CliError;
use super::output::Output;
use crate::broker::dead_letters::{Action, DeadLetter, Listing, Selection, Settled};
use crate::broker::{DeadLetterQueue, DeadLetterQueueError};
use crate::config::Config;

#[derive(Debug, clap::Subcommand)]
pub enum DeadLettersCommand {
    /// The dead letters, oldest first: message id, type, reason, field, where from, when, and what is
    /// wrong.
    List {
        /// Only those with this reason code (e.g. `invalid_field`, or `delivery_limit` for messages
        /// RabbitMQ dead-lettered after too many deliveries).
        #[arg(long)]
        reason: Option<String>,
        /// Show at most this many (the rest are counted).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// `text` or `json`.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Everything about the dead letters with this message id: reason, origin, headers, body.
    Show {
        /// The message id (e.g. `submit/4817`).
        id: String,
        /// `text` or `json`.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Publish the selected dead letters again to their original exchange and routing key, with their
    /// original properties and message id and without the dead-letter headers; each leaves the
    /// dead-letter queue once the broker has confirmed its copy.
    Requeue(Which),
    /// Remove the selected dead letters for good.
    Drop(Which),
}

/// Which dead letters `requeue` and `drop` act on: message ids, a reason, or all.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["ids", "reason", "all"])))]
pub struct Which {
    /// Message ids (every copy of each).
    ids: Vec<String>,
    /// Every dead letter with this reason code.
    #[arg(long)]
    reason: Option<String>,
    /// Every dead letter.
    #[arg(long)]
    all: bool,
    /// `text` or `json`.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

impl Which {
    fn selection(&self) -> Selection {
        match (&self.reason, self.all) {
            (Some(reason), _) => Selection::Reason(reason.clone()),
            (None, true) => Selection::All,
            (None, false) => Selection::Ids(self.ids.clone()),
        }
    }
}

pub async fn run(command: DeadLettersCommand, config: &Config) -> Result<ExitCode, CliError> {
    // The command declares nothing; a vhost without the dead-letter queue is told as such.
    let broker = super::inspect_broker(config, CancellationToken::new()).await?;
    let queue = DeadLetterQueue::new(broker.clone());
    let listing = matches!(command, DeadLettersCommand::List { .. });
    let result = execute(command, &queue).await;
    broker.close().await;
    match result {
        Ok(code) => Ok(code),
        // No dead-letter queue in the vhost: nothing was ever dead-lettered there. A listing is an
        // answer (none, and why); what looks for given dead letters did not find them (exit code 1).
        Err(e @ DeadLetterQueueError::Missing { .. }) => {
            if listing {
                println!("no dead letters: {e}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("volcano-runner: {e}");
                Ok(ExitCode::FAILURE)
            }
        }
        Err(e) => Err(error(e)),
    }
}

async fn execute(
    command: DeadLettersCommand,
    queue: &DeadLetterQueue,
) -> Result<ExitCode, DeadLetterQueueError> {
    match command {
        DeadLettersCommand::List {
            reason,
            limit,
            output,
        } => {
            let filter = reason.map(Selection::Reason);
            let listing = queue.list(filter.as_ref(), limit).await?;
            match output {
                Output::Json => println!("{}", json(&listing)),
                Output::Text => print!("{}", list_text(&listing, filter.as_ref())),
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Show { id, output } => {
            let selection = Selection::Ids(vec![id.clone()]);
            let listing = queue.list(Some(&selection), usize::MAX).await?;
            if listing.letters.is_empty() {
                eprintln!(
                    "volcano-runner: no dead letter with message id {id:?} in {} ({} messages)",
                    listing.queue, listing.total
                );
                return Ok(ExitCode::FAILURE);
            }
            match output {
                Output::Json => {
                    let shown: Vec<Shown> = listing.letters.iter().map(Shown::new).collect();
                    println!("{}", json(&shown));
                }
                Output::Text => {
                    for letter in &listing.letters {
                        print!("{}", show_text(letter, &listing));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Requeue(which) => settle(queue, &which, Action::Requeue).await,
        DeadLettersCommand::Drop(which) => settle(queue, &which, Action::Drop).await,
    }
}

/// Requeues or drops, prints what became of each, and fails when one was kept or an id was not there.
async fn settle(
    queue: &DeadLetterQueue,
    which: &Which,
    action: Action,
) -> Result<ExitCode, DeadLetterQueueError> {
    let selection = which.selection();
    let settled = queue.settle(&selection, action).await?;
    let missing: Vec<&String> = match &selection {
        Selection::Ids(ids) => ids
            .iter()
            .filter(|id| !settled.iter().any(|s| s.message_id.as_ref() == Some(*id)))
            .collect(),
        _ => Vec::new(),
    };
    match which.output {
        Output::Json => println!(
            "{}",
            json(&serde_json::json!({
                "queue": queue.name(),
                "settled": settled,
                "missing": missing,
            }))
        ),
        Output::Text => print!("{}", settle_text(&settled, queue.name(), action)),
    }
    for id in &missing {
        eprintln!(
            "volcano-runner: no dead letter with message id {id:?} in {}",
            queue.name()
        );
    }
    let failed = settled.iter().any(|s| s.error.is_some());
    Ok(if failed || !missing.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn error(e: DeadLetterQueueError) -> CliError {
    CliError::Other(format!("RabbitMQ: {e}"))
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// `volcano_runner.v1.SubmitJob` as `SubmitJob`.
fn short_type(letter: &DeadLetter) -> &str {
    let name = letter.type_name.as_deref().unwrap_or("-");
    name.rsplit('.').next().unwrap_or(name)
}

fn or_dash(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or("-")
}

/// `1 dead letter`, `3 dead letters`.
fn letters(n: usize) -> String {
    if n == 1 {
        "1 dead letter".to_owned()
    } else {
        format!("{n} dead letters")
    }
}

/// The dead letters as a table, what is wrong under each.
fn list_text(listing: &Listing, filter: Option<&Selection>) -> String {
    if listing.total == 0 {
        return format!("{} is empty\n", listing.queue);
    }
    let shown = listing.letters.len() + listing.more;
    let mut out = match filter {
        Some(Selection::Reason(reason)) => format!(
            "{}: {}, {shown} with reason {reason}\n",
            listing.queue,
            letters(listing.total as usize)
        ),
        _ => format!("{}: {}\n", listing.queue, letters(listing.total as usize)),
    };
    if listing.letters.is_empty() {
        return out;
    }
    out.push_str(&format!(
        "{:>4}  {:<28} {:<14} {:<18} {:<24} {:<22} DEAD-LETTERED AT\n",
        "#", "MESSAGE ID", "TYPE", "REASON", "FIELD", "FROM"
    ));
    for letter in &listing.letters {
        out.push_str(&format!(
            "{:>4}  {:<28} {:<14} {:<18} {:<24} {:<22} {}\n",
            letter.position,
            or_dash(&letter.message_id),
            short_type(letter),
            or_dash(&letter.reason),
            or_dash(&letter.field),
            or_dash(&letter.original_queue),
            or_dash(&letter.dead_lettered_at),
        ));
        if let Some(error) = &letter.error {
            out.push_str(&format!("{:6}{error}\n", ""));
        }
    }
    if listing.more > 0 {
        out.push_str(&format!(
            "... and {} more (--limit to see them)\n",
            listing.more
        ));
    }
    out
}

/// One dead letter with its body, for `show -o json`: the body as text when it is UTF-8 (JSON
/// messages), else in hex (protobuf).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Shown<'a> {
    #[serde(flatten)]
    letter: &'a DeadLetter,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_hex: Option<String>,
}

impl<'a> Shown<'a> {
    fn new(letter: &'a DeadLetter) -> Self {
        match std::str::from_utf8(&letter.body) {
            Ok(text) => Self {
                letter,
                body: Some(text),
                body_hex: None,
            },
            Err(_) => Self {
                letter,
                body: None,
                body_hex: Some(hex(&letter.body)),
            },
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Everything about one dead letter, for a person.
fn show_text(letter: &DeadLetter, listing: &Listing) -> String {
    let mut out = format!(
        "dead letter {} of {} in {}\n",
        letter.position, listing.total, listing.queue
    );
    let mut line = |name: &str, value: &str| out.push_str(&format!("{name:<18}{value}\n"));
    line("message id:", or_dash(&letter.message_id));
    line("type:", or_dash(&letter.type_name));
    line("content type:", or_dash(&letter.content_type));
    line("reason:", or_dash(&letter.reason));
    if let Some(error) = &letter.error {
        line("error:", error);
    }
    if let Some(field) = &letter.field {
        line("field:", field);
    }
    line(
        "from:",
        &format!(
            "exchange {}, routing key {}, queue {}",
            or_dash(&letter.original_exchange),
            or_dash(&letter.original_routing_key),
            or_dash(&letter.original_queue)
        ),
    );
    if let Some(count) = letter.delivery_count {
        line("delivered before:", &format!("{count} times"));
    }
    line("dead-lettered at:", or_dash(&letter.dead_lettered_at));
    if let Some(death) = &letter.death {
        line(
            "x-death:",
            &format!(
                "{} in {} ({} times){}",
                death.reason,
                death.queue,
                death.count,
                death
                    .time
                    .as_ref()
                    .map(|t| format!(" at {t}"))
                    .unwrap_or_default()
            ),
        );
    }
    if let Some(dropped) = &letter.dropped_headers {
        line(
            "dropped headers:",
            &format!("{dropped} (left out of the copy; a requeue goes without them)"),
        );
    }
    out.push_str("headers:\n");
    for (name, value) in &letter.headers {
        out.push_str(&format!("  {name}: {value}\n"));
    }
    match std::str::from_utf8(&letter.body) {
        Ok(text) => out.push_str(&format!("body ({} bytes):\n{text}\n", letter.body.len())),
        Err(_) => out.push_str(&format!(
            "body ({} bytes, hex):\n{}\n",
            letter.body.len(),
            hex(&letter.body)
        )),
    }
    out.push('\n');
    out
}

/// One line per selected dead letter, then the count.
fn settle_text(settled: &[Settled], queue: &str, action: Action) -> String {
    let verb = match action {
        Action::Requeue => "requeued",
        Action::Drop => "dropped",
    };
    if settled.is_empty() {
        return format!("no dead letter in {queue} was selected: nothing {verb}\n");
    }
    let mut out = String::new();
    for s in settled {
        let id = or_dash(&s.message_id);
        let reason = or_dash(&s.reason);
        match (&s.error, &s.to) {
            (Some(e), _) => out.push_str(&format!(
                "kept {id} (#{}, {reason}) in {queue}: {e}\n",
                s.position
            )),
            (None, Some(to)) => out.push_str(&format!("{verb} {id} ({reason}) to {to}\n")),
            (None, None) => out.push_str(&format!("{verb} {id} ({reason})\n")),
        }
    }
    let done = settled.iter().filter(|s| s.error.is_none()).count();
    out.push_str(&format!(
        "{done} of {} selected dead letters {verb}\n",
        settled.len()
    ));
    out
}
