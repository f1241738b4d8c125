//! Plugins as the catalogue (Katalogus, or a static file standing in for it) describes them, and
//! the rule of which plugin may run on what.

use serde::{Deserialize, Serialize};

use super::event::Operation;

/// What kind of plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginType {
    /// Scans an object.
    Boefje,
    /// Parses a boefje's raw file.
    Normalizer,
    /// Produces a report (not planned from events).
    Report,
}

/// One plugin (Katalogus' `Plugin`, the keys the scheduler uses; others are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plugin {
    /// Its id (`dns-records`, `kat_dns_normalize`).
    pub id: String,
    /// Boefje, normalizer or report.
    #[serde(rename = "type")]
    pub plugin_type: PluginType,
    /// A display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Its version.
    #[serde(default)]
    pub version: Option<String>,
    /// Whether the organisation enabled it.
    #[serde(default)]
    pub enabled: bool,
    /// Object types (boefjes) or mime types (normalizers) it consumes.
    #[serde(default)]
    pub consumes: Vec<String>,
    /// The scan level an object needs for this boefje to run on it.
    #[serde(default)]
    pub scan_level: Option<i64>,
    /// Minutes between runs on the same object, if the plugin says.
    #[serde(default)]
    pub interval: Option<i64>,
    /// A cron expression for its runs, if the plugin says.
    #[serde(default)]
    pub cron: Option<String>,
    /// Run only on these operations (`create`, `update`); absent: on any.
    #[serde(default)]
    pub run_on: Option<Vec<String>>,
    /// The image that runs it.
    #[serde(default)]
    pub oci_image: Option<String>,
    /// Whether organisations that run this boefje with the same settings share its runs (one
    /// run, its result copied to each; Katalogus' `deduplicate`).
    #[serde(default)]
    pub deduplicate: bool,
}

impl Plugin {
    /// Whether this boefje runs on an object of `object_type` at `scan_level` after `operation`
    /// (mula's `has_boefje_permission_to_run` and `run_on`): enabled, consumes the type, has a
    /// scan level not above the object's, and, if it names operations, this is one of them.
    pub fn runs_on(
        &self,
        object_type: &str,
        scan_level: Option<i64>,
        operation: Operation,
    ) -> bool {
        self.may_scan(object_type, scan_level)
            && self
                .run_on
                .as_ref()
                .is_none_or(|ops| ops.iter().any(|o| o == operation.as_str()))
    }

    /// Whether this is an enabled boefje that may scan an object of `object_type` at
    /// `scan_level`, whatever happened to the object ([`Self::runs_on`] without `run_on`).
    pub fn may_scan(&self, object_type: &str, scan_level: Option<i64>) -> bool {
        self.plugin_type == PluginType::Boefje
            && self.enabled
            && self.permits(object_type, scan_level).is_ok()
    }

    /// Whether this plugin may run on an object of `object_type` at `scan_level`, whatever
    /// happened to it: it consumes the type, and names a scan level not above the object's (a
    /// scan level is the user's clearance to scan). The error says which does not hold, as a
    /// disabled schedule's reason.
    pub fn permits(&self, object_type: &str, scan_level: Option<i64>) -> Result<(), String> {
        if !self.consumes.iter().any(|t| t == object_type) {
            return Err(format!(
                "object type {object_type} is no longer consumed by plugin {}",
                self.id
            ));
        }
        match (self.scan_level, scan_level) {
            (Some(need), Some(have)) if need <= have => Ok(()),
            (need, have) => Err(format!(
                "plugin {} needs scan level {need:?}; the object has {have:?}",
                self.id
            )),
        }
    }

    /// Whether this normalizer parses a raw file with one of `mime_types`.
    pub fn parses(&self, mime_types: &[String]) -> bool {
        self.plugin_type == PluginType::Normalizer
            && self.enabled
            && mime_types.iter().any(|m| self.consumes.contains(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boefje() -> Plugin {
        Plugin {
            id: "dns-records".into(),
            plugin_type: PluginType::Boefje,
            name: None,
            version: None,
            enabled: true,
            consumes: vec!["Hostname".into()],
            scan_level: Some(1),
            interval: None,
            cron: None,
            run_on: None,
            oci_image: None,
            deduplicate: false,
        }
    }

    #[test]
    fn a_plugin_permits_an_object_it_consumes_at_its_level_and_says_why_not() {
        let b = Plugin {
            scan_level: Some(2),
            ..boefje()
        };
        assert_eq!(b.permits("Hostname", Some(2)), Ok(()));
        assert!(
            b.permits("IPAddressV4", Some(4))
                .unwrap_err()
                .contains("no longer consumed")
        );
        assert!(
            b.permits("Hostname", Some(1))
                .unwrap_err()
                .contains("needs scan level")
        );
        assert!(
            b.permits("Hostname", None)
                .unwrap_err()
                .contains("scan level")
        );
    }

    #[test]
    fn a_boefje_runs_on_what_it_consumes_at_a_high_enough_level() {
        let b = boefje();
        assert!(b.runs_on("Hostname", Some(1), Operation::Create));
        assert!(b.runs_on("Hostname", Some(3), Operation::Update));
        assert!(
            !b.runs_on("Hostname", Some(0), Operation::Create),
            "level too low"
        );
        assert!(
            !b.runs_on("Hostname", None, Operation::Create),
            "no scan profile"
        );
        assert!(
            !b.runs_on("IPAddressV4", Some(4), Operation::Create),
            "not consumed"
        );
        let disabled = Plugin {
            enabled: false,
            ..boefje()
        };
        assert!(!disabled.runs_on("Hostname", Some(4), Operation::Create));
        let no_level = Plugin {
            scan_level: None,
            ..boefje()
        };
        assert!(!no_level.runs_on("Hostname", Some(4), Operation::Create));
    }

    #[test]
    fn run_on_restricts_the_operations() {
        let on_create = Plugin {
            run_on: Some(vec!["create".into()]),
            ..boefje()
        };
        assert!(on_create.runs_on("Hostname", Some(1), Operation::Create));
        assert!(!on_create.runs_on("Hostname", Some(1), Operation::Update));
    }
}
