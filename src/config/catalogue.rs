//! `[catalogue]`: where the plugins come from when Katalogus is not configured, and how long a
//! Katalogus answer is used (read by [`crate::clients::catalogue`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default seconds a Katalogus answer is used before it is fetched again.
pub const DEFAULT_CATALOGUE_TTL_SECS: u64 = 60;

/// The plugin catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogueSettings {
    /// A TOML file of plugins standing in for Katalogus (see [`crate::clients::catalogue`]);
    /// empty: no plugins, so events plan nothing. Katalogus (`clients.katalogus_api`) wins
    /// when both are set.
    pub file: String,
    /// Seconds a Katalogus answer is used before it is fetched again (refreshed in the
    /// background every half of it).
    pub ttl_secs: u64,
}

impl Default for CatalogueSettings {
    fn default() -> Self {
        Self {
            file: String::new(),
            ttl_secs: DEFAULT_CATALOGUE_TTL_SECS,
        }
    }
}

impl CatalogueSettings {
    /// Refuses a file that does not load as a catalogue and a zero TTL.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.file.is_empty()
            && let Err(e) = crate::clients::catalogue::StaticCatalogue::load(Path::new(&self.file))
        {
            return Err(ConfigError::setting("catalogue.file", e));
        }
        ConfigError::at_least_one("catalogue.ttl_secs", self.ttl_secs)
    }
}
