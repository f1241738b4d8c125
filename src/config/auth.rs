//! `[auth]`: optional bearer tokens, turned into [`crate::domain::auth::Tokens`] at start.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::domain::SchedulerId;
use crate::domain::auth::{Grant, Role, Tokens, parse_spec};

/// Optional bearer tokens (see [`crate::domain::auth`]); none configured means open, as mula.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// Tokens from the configuration file.
    #[serde(default)]
    pub tokens: Vec<TokenSettings>,
    /// Tokens in compact form, `role[@scheduler,…]=secret;…` (`SCHEDULER_API_TOKENS`).
    #[serde(default)]
    pub spec: String,
}

/// One token.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// A name for logs.
    pub name: String,
    /// `runner`, `webapp` or `admin`.
    pub role: Role,
    /// The schedulers it covers; empty or absent for all.
    #[serde(default)]
    pub schedulers: Vec<SchedulerId>,
    /// The secret clients send as `Authorization: Bearer <secret>`.
    pub token: String,
}

impl std::fmt::Debug for TokenSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches a log.
        f.debug_struct("TokenSettings")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("schedulers", &self.schedulers)
            .field("token", &"***")
            .finish()
    }
}

impl AuthSettings {
    /// The configured tokens, from the file and the compact form together.
    pub fn tokens(&self) -> Result<Tokens, String> {
        let mut pairs: Vec<(String, Grant)> = self
            .tokens
            .iter()
            .map(|t| {
                (
                    t.token.clone(),
                    Grant {
                        name: t.name.clone(),
                        role: t.role,
                        schedulers: t.schedulers.clone(),
                    },
                )
            })
            .collect();
        pairs.extend(parse_spec(&self.spec)?);
        Tokens::new(pairs)
    }

    /// Refuses tokens that do not parse or clash.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.tokens() {
            Ok(_) => Ok(()),
            Err(e) => Err(ConfigError::setting("auth", e)),
        }
    }
}
