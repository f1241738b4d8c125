//! `[api]`: the HTTP server. Its values go to `startup`, which builds the actix-web server.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default listen address (mula's).
pub const DEFAULT_HOST: &str = "0.0.0.0";
/// Default listen port (mula's).
pub const DEFAULT_PORT: u16 = 8000;
/// Default HTTP worker threads: 0, one per CPU.
pub const DEFAULT_WORKERS: usize = 0;
/// Default largest request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Default seconds to let in-flight requests finish at shutdown.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 30;
/// Default seconds an idle keep-alive connection stays open: longer than the runners' 10 s poll
/// interval, so a polling worker keeps its connection.
pub const DEFAULT_KEEP_ALIVE_SECS: u64 = 75;
/// Default seconds a client has to send a request's head (408 beyond; a request read in full is
/// never answered 408).
pub const DEFAULT_REQUEST_HEAD_TIMEOUT_SECS: u64 = 10;
/// Default seconds a client has to send a whole request body (408 beyond).
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 30;

/// The HTTP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (0 picks a free one).
    pub port: u16,
    /// HTTP worker threads; 0 means one per CPU.
    pub workers: usize,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Seconds in-flight requests get to finish at shutdown.
    pub shutdown_timeout_secs: u64,
    /// Seconds an idle keep-alive connection stays open (0 closes after each response).
    pub keep_alive_secs: u64,
    /// Seconds a client has to send a request's head before it is answered 408.
    pub request_head_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body before it is answered 408.
    pub body_timeout_secs: u64,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            host: DEFAULT_HOST.into(),
            port: DEFAULT_PORT,
            workers: DEFAULT_WORKERS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            shutdown_timeout_secs: DEFAULT_SHUTDOWN_TIMEOUT_SECS,
            keep_alive_secs: DEFAULT_KEEP_ALIVE_SECS,
            request_head_timeout_secs: DEFAULT_REQUEST_HEAD_TIMEOUT_SECS,
            body_timeout_secs: DEFAULT_BODY_TIMEOUT_SECS,
        }
    }
}

impl ApiSettings {
    /// Refuses an empty body limit and a zero head or body timeout (every request would be 408).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_body_bytes == 0 {
            return Err(ConfigError::setting(
                "api.max_body_bytes",
                "must be positive",
            ));
        }
        ConfigError::at_least_one(
            "api.request_head_timeout_secs",
            self.request_head_timeout_secs,
        )?;
        ConfigError::at_least_one("api.body_timeout_secs", self.body_timeout_secs)
    }
}
