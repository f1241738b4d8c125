//! Who may do what: optional bearer tokens, each with a role and the schedulers it covers.
//!
//! | role | may |
//! |---|---|
//! | `runner` | pop its schedulers' tasks, patch them and read them |
//! | `webapp` | push, list, read and see statistics (and, once they exist, schedules) of its schedulers |
//! | `admin` | everything |
//!
//! A token without schedulers covers all three. With no token configured the service is open,
//! as mula is.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::SchedulerId;

/// What a token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A boefje, normalizer or report runner.
    Runner,
    /// The webapp (Rocky).
    Webapp,
    /// An operator.
    Admin,
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "runner" => Ok(Self::Runner),
            "webapp" => Ok(Self::Webapp),
            "admin" => Ok(Self::Admin),
            other => Err(format!(
                "unknown role '{other}'; use runner, webapp or admin"
            )),
        }
    }
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `POST /schedulers/{id}/pop`
    Pop,
    /// `PATCH /tasks/{id}`
    Patch,
    /// `GET /tasks/{id}`, `GET /schedulers…`, and listings restricted to one scheduler
    Read,
    /// `POST /schedulers/{id}/push`
    Push,
    /// `GET|POST /tasks` across schedulers, `GET /tasks/stats`
    List,
    /// `/schedules`: read and manage schedules (the webapp's report and scan schedules)
    Schedules,
}

/// What one token may do.
#[derive(Clone, PartialEq, Eq)]
pub struct Grant {
    /// A name for logs (never the secret).
    pub name: String,
    /// The role.
    pub role: Role,
    /// The schedulers it covers; empty for all.
    pub schedulers: Vec<SchedulerId>,
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.name, self.role)
    }
}

impl Grant {
    fn covers(&self, s: SchedulerId) -> bool {
        self.schedulers.is_empty() || self.schedulers.contains(&s)
    }

    /// Whether it allows `action` on `scheduler`'s tasks (`None`: no one scheduler, e.g. a
    /// listing across all of them).
    pub fn allows(&self, action: Action, scheduler: Option<SchedulerId>) -> bool {
        let in_scope = match scheduler {
            Some(s) => self.covers(s),
            None => self.schedulers.is_empty(),
        };
        match self.role {
            Role::Admin => in_scope,
            Role::Runner => {
                matches!(action, Action::Pop | Action::Patch | Action::Read)
                    && scheduler.is_some()
                    && in_scope
            }
            Role::Webapp => {
                matches!(
                    action,
                    Action::Push | Action::List | Action::Read | Action::Schedules
                ) && in_scope
            }
        }
    }
}

/// The configured tokens, by secret.
#[derive(Clone, Default)]
pub struct Tokens {
    by_secret: HashMap<String, Grant>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Secrets never reach a log.
        f.debug_list().entries(self.by_secret.values()).finish()
    }
}

impl Tokens {
    /// Tokens from `(secret, grant)` pairs; an empty or repeated secret is refused.
    pub fn new(pairs: Vec<(String, Grant)>) -> Result<Self, String> {
        let mut by_secret = HashMap::new();
        for (secret, grant) in pairs {
            if secret.trim().is_empty() {
                return Err(format!("token '{}' has an empty secret", grant.name));
            }
            if by_secret.insert(secret, grant.clone()).is_some() {
                return Err(format!(
                    "token '{}' repeats another token's secret",
                    grant.name
                ));
            }
        }
        Ok(Self { by_secret })
    }

    /// Whether any token is configured (else the service is open).
    pub fn enabled(&self) -> bool {
        !self.by_secret.is_empty()
    }

    /// The grant of a presented secret.
    pub fn grant(&self, secret: &str) -> Option<&Grant> {
        self.by_secret.get(secret)
    }
}

/// Parses the compact form of `SCHEDULER_API_TOKENS`: `role[@scheduler,…]=secret`, separated
/// by `;` (for example `runner@boefje=s3cr3t; webapp=…; admin=…`).
pub fn parse_spec(spec: &str) -> Result<Vec<(String, Grant)>, String> {
    let mut out = Vec::new();
    for (i, item) in spec.split(';').map(str::trim).enumerate() {
        if item.is_empty() {
            continue;
        }
        let (who, secret) = item
            .split_once('=')
            .ok_or_else(|| format!("token {}: expected role[@schedulers]=secret", i + 1))?;
        let (role, schedulers) = match who.trim().split_once('@') {
            Some((r, list)) => (r, list),
            None => (who.trim(), ""),
        };
        let role: Role = role.trim().parse()?;
        let schedulers = schedulers
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<SchedulerId>()
                    .map_err(|()| format!("token {}: unknown scheduler '{s}'", i + 1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push((
            secret.trim().to_owned(),
            Grant {
                name: who.trim().to_owned(),
                role,
                schedulers,
            },
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use SchedulerId::*;

    fn grant(role: Role, schedulers: &[SchedulerId]) -> Grant {
        Grant {
            name: "t".into(),
            role,
            schedulers: schedulers.to_vec(),
        }
    }

    #[test]
    fn a_runner_pops_and_patches_only_its_own_schedulers_tasks() {
        let g = grant(Role::Runner, &[Normalizer]);
        assert!(g.allows(Action::Pop, Some(Normalizer)));
        assert!(g.allows(Action::Patch, Some(Normalizer)));
        assert!(!g.allows(Action::Pop, Some(Boefje)));
        assert!(!g.allows(Action::Push, Some(Normalizer)));
        assert!(!g.allows(Action::List, None));
    }

    #[test]
    fn the_webapp_pushes_and_lists_but_does_not_pop() {
        let g = grant(Role::Webapp, &[]);
        assert!(g.allows(Action::Push, Some(Boefje)));
        assert!(g.allows(Action::List, None));
        assert!(!g.allows(Action::Pop, Some(Boefje)));
        assert!(!g.allows(Action::Patch, Some(Boefje)));
        assert!(g.allows(Action::Schedules, Some(Report)));
        assert!(!grant(Role::Runner, &[]).allows(Action::Schedules, Some(Report)));
        assert!(grant(Role::Admin, &[]).allows(Action::Pop, Some(Report)));
    }

    #[test]
    fn the_compact_form_parses_and_names_its_mistakes() {
        let pairs = parse_spec("runner@boefje,normalizer=abc; webapp=def ;").unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[0].1.schedulers, vec![Boefje, Normalizer]);
        assert_eq!(pairs[1].0, "def");
        assert!(parse_spec("root=x").unwrap_err().contains("unknown role"));
        assert!(
            parse_spec("runner@mail=x")
                .unwrap_err()
                .contains("unknown scheduler")
        );
        assert!(parse_spec("runner").unwrap_err().contains("expected"));
        let tokens = Tokens::new(pairs).unwrap();
        assert!(
            !format!("{tokens:?}").contains("abc"),
            "secrets are not printed"
        );
    }
}
