//! The plugin catalogue: which plugins each organisation has enabled and what they consume. A
//! static file stands in for Katalogus, so the whole flow from event to task also runs on the
//! embedded default with nothing else installed.
//!
//! ```toml
//! [[plugins]]
//! id = "dns-records"
//! type = "boefje"             # boefje | normalizer
//! consumes = ["Hostname"]     # object types, or mime types for a normalizer
//! scan_level = 1
//! oci_image = "ghcr.io/minvws/openkat/dns-records:latest"
//! enabled = true
//! organisations = ["org1"]    # optional: only these organisations (default: all)
//! ```

use std::path::Path;

use config::{Config, File, FileFormat};
use serde::Deserialize;

use crate::domain::plugin::Plugin;

/// What the planner asks of a catalogue.
pub trait Catalogue: Send + Sync {
    /// The plugins of `organisation` (enabled or not; the planner checks).
    fn plugins(&self, organisation: &str) -> Vec<Plugin>;
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueFile {
    #[serde(default)]
    plugins: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    #[serde(flatten)]
    plugin: Plugin,
    #[serde(default)]
    organisations: Option<Vec<String>>,
}

/// A catalogue read from a file at start.
#[derive(Debug, Default)]
pub struct StaticCatalogue {
    entries: Vec<(Plugin, Option<Vec<String>>)>,
}

impl StaticCatalogue {
    /// Reads `path`; the error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<Self, String> {
        let file: CatalogueFile = Config::builder()
            .add_source(File::from(path).format(FileFormat::Toml))
            .build()
            .and_then(Config::try_deserialize)
            .map_err(|e| format!("plugin catalogue {}: {e}", path.display()))?;
        Ok(Self {
            entries: file
                .plugins
                .into_iter()
                .map(|e| (e.plugin, e.organisations))
                .collect(),
        })
    }

    /// How many plugins it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Catalogue for StaticCatalogue {
    fn plugins(&self, organisation: &str) -> Vec<Plugin> {
        self.entries
            .iter()
            .filter(|(_, orgs)| {
                orgs.as_ref()
                    .is_none_or(|o| o.iter().any(|x| x == organisation))
            })
            .map(|(p, _)| p.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_lists_plugins_for_all_or_some_organisations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalogue.toml");
        std::fs::write(
            &path,
            r#"
[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true

[[plugins]]
id = "kat_dns"
type = "normalizer"
consumes = ["boefje/dns-records"]
enabled = true
organisations = ["org2"]
"#,
        )
        .unwrap();
        let c = StaticCatalogue::load(&path).unwrap();
        assert_eq!(c.plugins("org1").len(), 1);
        assert_eq!(c.plugins("org2").len(), 2);
        std::fs::write(&path, "[[plugins]]\nid = 3\n").unwrap();
        assert!(
            StaticCatalogue::load(&path)
                .unwrap_err()
                .contains("catalogue.toml")
        );
    }
}
