//! Logging: a tracing subscriber writing text or JSON lines to stderr. `RUST_LOG`, when set,
//! overrides the configured level.
//!
//! - **Colour only on a terminal.** Text lines carry ANSI colours only when stderr is a terminal
//!   and `NO_COLOR` is unset or empty (<https://no-color.org>): a file, a pipe, `docker logs` or
//!   journald get plain text.
//! - **Client faults are not errors.** actix-web logs a request it cannot parse (a malformed URI
//!   or header, a client that hung up mid-request) at ERROR; the client is answered 400 and the
//!   operator has nothing to do, so those lines are logged again at DEBUG under this crate.
//! - **One event, one line.** A message with line breaks of its own (libpq's errors end with one,
//!   after a tab-indented hint) is written on one line, its pieces joined by a space, so no
//!   blank or orphaned line reaches the log.
//! - **The AMQP library is quiet.** lapin logs each failure it returns at ERROR, and the listener
//!   reports the same failure once, in words (see [`crate::listener`]); lapin's own lines are
//!   off unless the filter names `lapin` (`SCHEDULER_LOG_LEVEL=info,lapin=debug`).

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, LoggingSettings, filter_of};

/// Installs the global subscriber; a second call is a no-op.
pub fn init(logging: &LoggingSettings) {
    let rust_log = std::env::var("RUST_LOG").ok().filter(|f| !f.is_empty());
    let from_env = rust_log.as_deref().map(filter_of);
    let filter = match &from_env {
        Some(Ok(f)) => EnvFilter::try_new(with_quiet_libraries(f)).ok(),
        _ => None,
    }
    .or_else(|| {
        let level = filter_of(&logging.level).ok()?;
        EnvFilter::try_new(with_quiet_libraries(&level)).ok()
    })
    .unwrap_or_else(|| EnvFilter::new(with_quiet_libraries("info")));
    let colour = use_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(|| OneLine(std::io::stderr()))
        // A line that cannot be written (the log pipe is gone: a collector restarted) is dropped.
        // Reporting it would `eprintln!` to the same broken stderr, which panics in whichever
        // thread logged, the signal handler's included, so SIGTERM no longer stopped the service.
        .log_internal_errors(false);
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(ClientFaults);
    let _ = match logging.format {
        LogFormat::Text => registry
            .with(fmt.with_target(false).with_ansi(colour))
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt.json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_ansi(false),
            )
            .try_init(),
    };
    // Said once logging runs: RUST_LOG is not the service's own setting, so a wrong one does not
    // stop it, but it must not be ignored unsaid.
    if let Some(Err(why)) = from_env {
        tracing::warn!("RUST_LOG is ignored: {why}; logging.level (SCHEDULER_LOG_LEVEL) is used");
    }
}

/// `text` on one line: its lines trimmed, the empty ones dropped, the rest joined by a space.
pub fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A writer that puts each formatted event (one `write` of a whole line, as the fmt layer does)
/// on one line.
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(body) = buf.strip_suffix(b"\n") else {
            return self.0.write(buf);
        };
        if !body.contains(&b'\n') {
            return self.0.write_all(buf).map(|()| buf.len());
        }
        let mut line = one_line(&String::from_utf8_lossy(body)).into_bytes();
        line.push(b'\n');
        self.0.write_all(&line).map(|()| buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Whether text logs carry ANSI colours: only on a terminal, and never when `NO_COLOR` is set to
/// something non-empty (an empty `NO_COLOR` counts as unset, as no-color.org says).
pub fn use_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// `filter` with the libraries whose own lines repeat what this service reports turned off,
/// unless the filter names them.
fn with_quiet_libraries(filter: &str) -> String {
    if filter.contains("lapin") {
        filter.to_owned()
    } else {
        format!("{filter},lapin=off")
    }
}

/// Where actix-http logs a connection it gave up on: a request it could not parse, or a client
/// that went away. Both are the client's doing.
const ACTIX_DISPATCHER: &str = "actix_http::h1::dispatcher";
/// The start of those lines.
const STREAM_ERROR: &str = "stream error: ";

/// Drops actix-http's ERROR line about a client's malformed request and logs it at DEBUG here.
struct ClientFaults;

impl<S: Subscriber> Layer<S> for ClientFaults {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        if event.metadata().target() != ACTIX_DISPATCHER {
            return true;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        match message.0.strip_prefix(STREAM_ERROR) {
            Some(why) => {
                // The subscriber is the global default, so an event logged from here is
                // dispatched like any other (a scoped one would drop it, not recurse).
                tracing::debug!(error = %why, "a client's request was not valid HTTP; answered 400 or closed");
                false
            }
            None => true,
        }
    }
}

/// The `message` field of an event.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn colour_is_used_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None), "a pipe or a file");
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, Some(OsStr::new("1"))));
        assert!(
            use_colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR counts as unset"
        );
    }

    #[test]
    fn a_message_with_line_breaks_is_written_on_one_line() {
        use std::io::Write;
        let libpq = "ERROR cannot open database: connection to server at \"127.0.0.1\", port 5999 \
                     failed: Connection refused\n\tIs the server running on that host?\n\n";
        let mut out = OneLine(Vec::new());
        let n = out.write(libpq.as_bytes()).unwrap();
        assert_eq!(n, libpq.len());
        assert_eq!(
            String::from_utf8(out.0).unwrap(),
            "ERROR cannot open database: connection to server at \"127.0.0.1\", port 5999 \
             failed: Connection refused Is the server running on that host?\n"
        );
        let mut out = OneLine(Vec::new());
        out.write_all(b"INFO listening\n").unwrap();
        assert_eq!(out.0, b"INFO listening\n");
    }

    #[test]
    fn lapin_is_off_unless_the_filter_names_it() {
        assert_eq!(with_quiet_libraries("info"), "info,lapin=off");
        assert_eq!(with_quiet_libraries("info,lapin=debug"), "info,lapin=debug");
    }
}
