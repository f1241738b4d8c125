//! `[clients]`: where Katalogus, Octopoes and Bytes are, and each try's time limit; the clients
//! of [`crate::clients`] are built from these settings.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default seconds each try of a call to Katalogus, Octopoes or Bytes may take (mula's 10).
pub const DEFAULT_CLIENT_TIMEOUT_SECS: u64 = 10;
/// Default seconds a fire's lookups wait for Octopoes' answers.
pub const DEFAULT_LOOKUP_WINDOW_SECS: u64 = 5;
/// Longest lookup window: each page of a cron table, and each batch of the listener, may wait
/// this long for Octopoes.
pub const MAX_LOOKUP_WINDOW_SECS: u64 = 60;

/// Where the platform's other services are (see [`crate::clients`]); an empty URL means that
/// service is not configured.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct ClientSettings {
    /// Katalogus, `http://katalogus:8000` (mula's `KATALOGUS_API`).
    pub katalogus_api: String,
    /// Octopoes, `http://octopoes_api:80` (mula's `OCTOPOES_API`).
    pub octopoes_api: String,
    /// Bytes, `http://bytes:8000` (mula's `BYTES_API`); needs the user and password below.
    pub bytes_api: String,
    /// The Bytes user (mula's `BYTES_USERNAME`).
    pub bytes_username: String,
    /// The Bytes password (mula's `BYTES_PASSWORD`); never logged.
    pub bytes_password: String,
    /// Seconds each try of a call may take, from connecting to the last byte.
    pub request_timeout_secs: u64,
    /// Seconds one lookup of objects the frontier cannot vouch for waits for Octopoes' answers
    /// (`GET /{org}/object`, 8 at a time): an organisation's page of due schedules, a listener
    /// batch's deletes and lowered levels, a fire's holders. The unanswered wait for a later try.
    pub lookup_window_secs: u64,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            katalogus_api: String::new(),
            octopoes_api: String::new(),
            bytes_api: String::new(),
            bytes_username: String::new(),
            bytes_password: String::new(),
            request_timeout_secs: DEFAULT_CLIENT_TIMEOUT_SECS,
            lookup_window_secs: DEFAULT_LOOKUP_WINDOW_SECS,
        }
    }
}

impl std::fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password, and one a URL may carry, never reach a log.
        let url = |u: &str| match crate::clients::http::parse_base(u) {
            Ok(parsed) => crate::clients::http::redacted(&parsed),
            Err(_) if u.is_empty() => String::new(),
            Err(_) => "(invalid)".into(),
        };
        f.debug_struct("ClientSettings")
            .field("katalogus_api", &url(&self.katalogus_api))
            .field("octopoes_api", &url(&self.octopoes_api))
            .field("bytes_api", &url(&self.bytes_api))
            .field("bytes_username", &self.bytes_username)
            .field("bytes_password", &"***")
            .field("request_timeout_secs", &self.request_timeout_secs)
            .field("lookup_window_secs", &self.lookup_window_secs)
            .finish()
    }
}

impl ClientSettings {
    /// Each try's time limit.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    /// How long a lookup waits for Octopoes' answers.
    pub fn lookup_window(&self) -> Duration {
        Duration::from_secs(self.lookup_window_secs)
    }

    /// The Katalogus client, if `katalogus_api` is set.
    pub fn katalogus(&self) -> Result<Option<crate::clients::katalogus::Katalogus>, String> {
        if self.katalogus_api.is_empty() {
            return Ok(None);
        }
        crate::clients::katalogus::Katalogus::new(&self.katalogus_api, self.timeout()).map(Some)
    }

    /// The Octopoes client, if `octopoes_api` is set.
    pub fn octopoes(&self) -> Result<Option<crate::clients::octopoes::Octopoes>, String> {
        if self.octopoes_api.is_empty() {
            return Ok(None);
        }
        crate::clients::octopoes::Octopoes::new(&self.octopoes_api, self.timeout()).map(Some)
    }

    /// The Bytes client, if `bytes_api` is set.
    pub fn bytes(&self) -> Result<Option<crate::clients::bytes::Bytes>, String> {
        if self.bytes_api.is_empty() {
            return Ok(None);
        }
        crate::clients::bytes::Bytes::new(
            &self.bytes_api,
            &self.bytes_username,
            &self.bytes_password,
            self.timeout(),
        )
        .map(Some)
    }
}

impl ClientSettings {
    /// Refuses a URL that is not `http://HOST:PORT`, Bytes without its user and password, a
    /// zero timeout, and a lookup window of zero or beyond [`MAX_LOOKUP_WINDOW_SECS`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, url) in [
            ("clients.katalogus_api", &self.katalogus_api),
            ("clients.octopoes_api", &self.octopoes_api),
            ("clients.bytes_api", &self.bytes_api),
        ] {
            if !url.is_empty()
                && let Err(e) = crate::clients::http::parse_base(url)
            {
                return Err(ConfigError::setting(key, e));
            }
        }
        if !self.bytes_api.is_empty() {
            for (key, var, value) in [
                (
                    "clients.bytes_username",
                    "BYTES_USERNAME",
                    &self.bytes_username,
                ),
                (
                    "clients.bytes_password",
                    "BYTES_PASSWORD",
                    &self.bytes_password,
                ),
            ] {
                if value.is_empty() {
                    return Err(ConfigError::setting(
                        key,
                        format!("required when clients.bytes_api is set (env {var})"),
                    ));
                }
            }
        }
        ConfigError::at_least_one("clients.request_timeout_secs", self.request_timeout_secs)?;
        ConfigError::at_least_one("clients.lookup_window_secs", self.lookup_window_secs)?;
        if self.lookup_window_secs > MAX_LOOKUP_WINDOW_SECS {
            return Err(ConfigError::setting(
                "clients.lookup_window_secs",
                format!(
                    "{} is more than {MAX_LOOKUP_WINDOW_SECS}: each page of due schedules and each listener batch may wait this long for Octopoes",
                    self.lookup_window_secs
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::load;

    #[test]
    fn mula_names_set_the_service_clients() {
        let s = load(&[
            ("KATALOGUS_API", "http://katalogus:8000"),
            ("OCTOPOES_API", "http://octopoes_api:80"),
            ("BYTES_API", "http://bytes:8000"),
            ("BYTES_USERNAME", "scheduler"),
            ("BYTES_PASSWORD", "s3cr3t-pw"),
            ("SCHEDULER_CLIENTS_REQUEST_TIMEOUT", "3"),
            ("SCHEDULER_OCTOPOES_LOOKUP_WINDOW", "12"),
        ])
        .unwrap();
        let c = &s.clients;
        assert_eq!(c.katalogus_api, "http://katalogus:8000");
        assert_eq!(c.octopoes_api, "http://octopoes_api:80");
        assert_eq!(c.bytes_api, "http://bytes:8000");
        assert_eq!(c.bytes_username, "scheduler");
        assert_eq!(c.bytes_password, "s3cr3t-pw");
        assert_eq!(c.timeout(), Duration::from_secs(3));
        assert_eq!(c.lookup_window(), Duration::from_secs(12));
        assert!(c.katalogus().unwrap().is_some());
        assert!(c.octopoes().unwrap().is_some());
        assert!(c.bytes().unwrap().is_some());
        assert!(!format!("{s:?}").contains("s3cr3t-pw"));
        let none = load(&[]).unwrap().clients;
        assert_eq!(none.request_timeout_secs, DEFAULT_CLIENT_TIMEOUT_SECS);
        assert_eq!(none.lookup_window_secs, DEFAULT_LOOKUP_WINDOW_SECS);
        assert!(none.katalogus().unwrap().is_none());
        assert!(none.bytes().unwrap().is_none());
    }
    #[test]
    fn bad_client_settings_are_refused_naming_the_key() {
        let err = load(&[("KATALOGUS_API", "https://katalogus:8000")])
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            "clients.katalogus_api (from KATALOGUS_API): https is not built in: use http on \
             the internal network or a TLS-terminating proxy"
        );
        let err = load(&[("OCTOPOES_API", "octopoes")]).unwrap_err().0;
        assert!(
            err.starts_with("clients.octopoes_api (from OCTOPOES_API): not a URL"),
            "{err}"
        );
        let err = load(&[("BYTES_API", "http://bytes:8000"), ("BYTES_USERNAME", "u")])
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            "clients.bytes_password: required when clients.bytes_api is set (env BYTES_PASSWORD)"
        );
        let err = load(&[("SCHEDULER_CLIENTS_REQUEST_TIMEOUT", "0")])
            .unwrap_err()
            .0;
        assert!(err.starts_with("clients.request_timeout_secs"), "{err}");
        for (window, why) in [("0", "must be at least 1"), ("61", "61 is more than 60")] {
            let err = load(&[("SCHEDULER_OCTOPOES_LOOKUP_WINDOW", window)])
                .unwrap_err()
                .0;
            assert!(
                err.starts_with("clients.lookup_window_secs") && err.contains(why),
                "{err}"
            );
        }
        let err = load(&[("BYTES_API", "http://u:hunter2@bytes:8000")])
            .unwrap_err()
            .0;
        assert!(!err.contains("hunter2"), "{err}");
    }
}
