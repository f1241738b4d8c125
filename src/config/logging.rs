//! `[logging]`: the log lines' format and filter, read by [`crate::telemetry`].

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default log line format.
pub const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;
/// Default tracing filter.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// Log output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter (`info`, `kat_scheduler=debug,info`); `RUST_LOG` overrides it.
    pub level: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Default for LoggingSettings {
    fn default() -> Self {
        Self {
            format: DEFAULT_LOG_FORMAT,
            level: DEFAULT_LOG_LEVEL.into(),
        }
    }
}

impl LoggingSettings {
    /// Refuses a level that is no tracing filter.
    pub fn validate(&self) -> Result<(), ConfigError> {
        filter_of(&self.level)
            .map(|_| ())
            .map_err(|why| ConfigError::setting("logging.level", why))
    }
}

/// `level` as a tracing filter. Each directive without a target (`info`) must be a level, and
/// Python's names, which mula's operators know (`WARNING`, `CRITICAL`, `FATAL`), stand for
/// tracing's `warn` and `error`, case aside: tracing reads a bare word that is no level as a
/// target to log everything of, so `WARNING` would leave every other line unlogged.
pub fn filter_of(level: &str) -> Result<String, String> {
    let mut directives = Vec::new();
    for d in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if d.contains('=') || d.contains('[') {
            directives.push(d.to_owned());
            continue;
        }
        let word = match d.to_ascii_lowercase().as_str() {
            l @ ("trace" | "debug" | "info" | "warn" | "error" | "off") => l.to_owned(),
            "warning" => "warn".into(),
            "critical" | "fatal" => "error".into(),
            _ => {
                return Err(format!(
                    "'{d}' in '{level}' is no level (trace, debug, info, warn, error or off);                      a target takes one, as in '{d}=debug'"
                ));
            }
        };
        directives.push(word);
    }
    let filter = directives.join(",");
    match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(_) => Ok(filter),
        Err(e) => Err(format!("'{level}' is not a log filter: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_read_as_tracing_and_python_name_them_and_a_bare_word_that_is_none_is_refused() {
        assert_eq!(filter_of("info").unwrap(), "info");
        assert_eq!(filter_of("WARNING").unwrap(), "warn");
        assert_eq!(
            filter_of("Critical, kat_scheduler=debug").unwrap(),
            "error,kat_scheduler=debug"
        );
        assert_eq!(filter_of("info,lapin=debug").unwrap(), "info,lapin=debug");
        let why = filter_of("verbose").unwrap_err();
        assert!(
            why.contains("'verbose'") && why.contains("no level"),
            "{why}"
        );
        assert!(filter_of("kat_scheduler=loud").is_err());
        let bad = LoggingSettings {
            level: "WARNINGS".into(),
            ..LoggingSettings::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("logging.level")
        );
    }
}
