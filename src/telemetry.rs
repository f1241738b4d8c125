//! Logging: a tracing subscriber writing text or JSON lines to stderr. `RUST_LOG`, when set,
//! overrides the configured level.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LoggingSettings};

/// Installs the global subscriber; a second call is a no-op.
pub fn init(logging: &LoggingSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&logging.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A line that cannot be written (the log pipe is gone: a collector restarted) is dropped.
        // Reporting it would `eprintln!` to the same broken stderr, which panics in whichever
        // thread logged, the signal handler's included, so SIGTERM no longer stopped the service.
        .log_internal_errors(false);
    let _ = match logging.format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}
