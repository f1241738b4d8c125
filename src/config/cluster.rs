//! `[cluster]`: several instances on one PostgreSQL database, read by [`crate::ownership`] and
//! the forwarding of requests to a scheduler's owner.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default lease: a killed owner's schedulers are taken over within about this long plus a
/// third of it (the other instances' round).
pub const DEFAULT_LEASE_MS: u64 = 2_000;
/// `cluster.lease_ms` at least.
pub const MIN_LEASE_MS: u64 = 300;

/// Several instances on one PostgreSQL database (see [`crate::ownership`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct ClusterSettings {
    /// This instance's name in the lease rows; empty: host name, process id and a random part.
    pub instance_id: String,
    /// Where the other instances reach this one, `http://HOST:PORT`; empty: this host's name
    /// (or `api.host` when it names one) and the bound port.
    pub advertise_url: String,
    /// Milliseconds a scheduler's lease runs without renewal; the owner renews every third of
    /// it, and a killed owner's schedulers are taken over within about 4/3 of it.
    pub lease_ms: u64,
    /// Bearer token sent with forwarded requests when the instances require tokens; it must
    /// allow push, pop and patch on every scheduler.
    pub peer_token: String,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            instance_id: String::new(),
            advertise_url: String::new(),
            lease_ms: DEFAULT_LEASE_MS,
            peer_token: String::new(),
        }
    }
}

impl ClusterSettings {
    /// Refuses a lease too short to renew and an advertised address that is no `http://` URL.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_ms < MIN_LEASE_MS {
            return Err(ConfigError::setting(
                "cluster.lease_ms",
                format!(
                    "must be at least {MIN_LEASE_MS} (renewals every third of it must outpace network hiccups), got {}",
                    self.lease_ms
                ),
            ));
        }
        if !self.advertise_url.is_empty()
            && let Err(e) = crate::clients::http::parse_base(&self.advertise_url)
        {
            return Err(ConfigError::setting("cluster.advertise_url", e));
        }
        Ok(())
    }
}
