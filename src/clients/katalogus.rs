//! Katalogus: the organisations, the plugins each has (enabled or not), and which other
//! organisations run a boefje with the same settings (cross-organisation de-duplication).
//!
//! The calls and shapes are the ones mula uses (`/v1/organisations`, `/v1/organisations/{org}/plugins`,
//! `/v1/configs`). Plugin JSON is mapped onto [`Plugin`]; plugins the scheduler does not plan
//! (`bit`, `report`) are skipped. Config `settings` are never read: Katalogus returns them
//! decrypted, and they must not reach a log or an error.

use std::time::Duration;

use serde::{Deserialize, Deserializer};
use tracing::debug;

use super::http::{Backoff, Call, ClientError, ServiceClient};
use crate::domain::plugin::{Plugin, PluginType};

/// The service's name in errors and logs.
pub const SERVICE: &str = "katalogus";

/// One organisation as Katalogus lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Organisation {
    /// Its id (`org1`), the `organisation` of its tasks.
    #[serde(default)]
    pub id: String,
    /// Its display name.
    #[serde(default)]
    pub name: String,
    /// Whether it takes part in cross-organisation de-duplication.
    #[serde(default)]
    pub deduplicate: bool,
}

/// The Katalogus client.
#[derive(Debug, Clone)]
pub struct Katalogus {
    http: ServiceClient,
}

impl Katalogus {
    /// A client of Katalogus at `base` (`http://katalogus:8000`); `timeout` bounds each try.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, String> {
        Ok(Self {
            http: ServiceClient::new(SERVICE, base, timeout)?,
        })
    }

    /// The same client with other retries.
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        Self {
            http: self.http.with_backoff(backoff),
        }
    }

    /// Every organisation (`GET /v1/organisations`), in Katalogus' order. Katalogus answers an
    /// object keyed by id; a list of the same objects is read too. An entry without `id` takes
    /// its key.
    pub async fn organisations(&self) -> Result<Vec<Organisation>, ClientError> {
        let url = self.http.url(&["v1", "organisations"], &[]);
        let body = self.http.send(Call::get(&url)).await?;
        let read = |at: String, value: serde_json::Value| {
            serde_path_to_error::deserialize::<_, Organisation>(value)
                .map_err(|e| self.http.decode_error(&url, format!("{at}.{e}")))
        };
        match self.http.decode::<serde_json::Value>(&url, &body)? {
            serde_json::Value::Object(map) => map
                .into_iter()
                .map(|(key, value)| {
                    let mut org = read(key.clone(), value)?;
                    if org.id.is_empty() {
                        org.id = key;
                    }
                    Ok(org)
                })
                .collect(),
            serde_json::Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, value)| read(format!("[{i}]"), value))
                .collect(),
            _ => Err(self.http.decode_error(
                &url,
                "expected an object keyed by organisation id, or a list",
            )),
        }
    }

    /// The boefjes and normalizers of `organisation` with its `enabled` overlay
    /// (`GET /v1/organisations/{org}/plugins`). Other plugin types are skipped; a boefje or
    /// normalizer that cannot be read fails the call, naming it.
    pub async fn plugins(&self, organisation: &str) -> Result<Vec<Plugin>, ClientError> {
        let url = self
            .http
            .url(&["v1", "organisations", organisation, "plugins"], &[]);
        let body = self.http.send(Call::get(&url)).await?;
        let items: Vec<serde_json::Value> = self.http.decode(&url, &body)?;
        let mut plugins = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let plugin_type = match item.get("type").and_then(serde_json::Value::as_str) {
                Some("boefje") => PluginType::Boefje,
                Some("normalizer") => PluginType::Normalizer,
                Some(other) => {
                    debug!(
                        organisation,
                        plugin.id = item.get("id").and_then(serde_json::Value::as_str),
                        plugin.kind = other,
                        "plugin type not planned, skipped"
                    );
                    continue;
                }
                None => {
                    return Err(self
                        .http
                        .decode_error(&url, format!("[{i}].type: missing or not a string")));
                }
            };
            let raw: KatalogusPlugin = serde_path_to_error::deserialize(item)
                .map_err(|e| self.http.decode_error(&url, format!("[{i}].{e}")))?;
            plugins.push(raw.into_plugin(plugin_type));
        }
        Ok(plugins)
    }

    /// The other organisations that run `boefje_id` with the same settings as `organisation`
    /// (`GET /v1/configs?…&with_duplicates=true`): the `organisation_id` of each duplicate of the
    /// configs returned, once each, `organisation` left out. Empty when Katalogus has none, has
    /// de-duplication off, or answers 404.
    pub async fn duplicate_organisations(
        &self,
        organisation: &str,
        boefje_id: &str,
    ) -> Result<Vec<String>, ClientError> {
        #[derive(Deserialize)]
        struct Config {
            #[serde(default)]
            duplicates: Vec<Duplicate>,
        }
        #[derive(Deserialize)]
        struct Duplicate {
            organisation_id: String,
        }
        let query = [
            ("organisation_id", organisation),
            ("boefje_id", boefje_id),
            ("enabled", "true"),
            ("with_duplicates", "true"),
        ];
        let configs: Vec<Config> = match self.http.get_json(&["v1", "configs"], &query).await {
            Err(ClientError::NotFound { .. }) => return Ok(Vec::new()),
            other => other?,
        };
        let mut orgs: Vec<String> = Vec::new();
        for d in configs.into_iter().flat_map(|c| c.duplicates) {
            if d.organisation_id != organisation && !orgs.contains(&d.organisation_id) {
                orgs.push(d.organisation_id);
            }
        }
        Ok(orgs)
    }

    /// Whether Katalogus answers `GET /health` with 2xx and, if it says, `healthy: true`.
    pub async fn health(&self) -> bool {
        self.http.healthy(&["health"]).await
    }
}

/// A boefje or normalizer as Katalogus serializes it; unknown keys are ignored.
#[derive(Deserialize)]
struct KatalogusPlugin {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    enabled: bool,
    #[serde(default, deserialize_with = "one_or_many")]
    consumes: Vec<String>,
    #[serde(default)]
    scan_level: Option<i64>,
    #[serde(default)]
    interval: Option<i64>,
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    run_on: Option<Vec<String>>,
    #[serde(default)]
    oci_image: Option<String>,
    #[serde(default)]
    deduplicate: bool,
}

impl KatalogusPlugin {
    fn into_plugin(self, plugin_type: PluginType) -> Plugin {
        Plugin {
            id: self.id,
            plugin_type,
            name: self.name,
            version: self.version,
            enabled: self.enabled,
            consumes: self.consumes,
            scan_level: self.scan_level,
            interval: self.interval,
            cron: self.cron,
            run_on: self.run_on,
            oci_image: self.oci_image,
            deduplicate: self.deduplicate,
        }
    }
}

/// `consumes` is a list in Katalogus' JSON, a single string in mula's model; null is none.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    })
}

#[cfg(test)]
mod tests {
    use super::super::http::stub::{Stub, closed_port};
    use super::*;

    fn quick() -> Backoff {
        Backoff {
            attempts: 2,
            base: Duration::from_millis(1),
            cap: Duration::from_millis(2),
        }
    }

    fn katalogus(stub: &Stub) -> Katalogus {
        Katalogus::new(&stub.base, Duration::from_secs(5))
            .unwrap()
            .with_backoff(quick())
    }

    #[tokio::test]
    async fn organisations_are_read_from_the_keyed_object_in_order() {
        let stub = Stub::start(|_| {
            (
                200,
                r#"{"org2": {"id": "org2", "name": "Org 2", "deduplicate": true},
                    "org1": {"id": "org1", "name": "Org 1"}}"#
                    .into(),
            )
        });
        let orgs = katalogus(&stub).organisations().await.unwrap();
        assert_eq!(
            orgs,
            vec![
                Organisation {
                    id: "org2".into(),
                    name: "Org 2".into(),
                    deduplicate: true
                },
                Organisation {
                    id: "org1".into(),
                    name: "Org 1".into(),
                    deduplicate: false
                },
            ]
        );
        let seen = stub.seen();
        assert_eq!(
            (
                seen[0].method.as_str(),
                seen[0].path.as_str(),
                seen[0].query.as_str()
            ),
            ("GET", "/v1/organisations", "")
        );
    }

    #[tokio::test]
    async fn organisations_are_also_read_from_a_list() {
        let stub = Stub::start(|_| (200, r#"[{"id": "org1", "name": "Org 1"}]"#.into()));
        let orgs = katalogus(&stub).organisations().await.unwrap();
        assert_eq!(orgs.len(), 1);
        assert_eq!(orgs[0].id, "org1");
    }

    #[tokio::test]
    async fn plugins_map_boefjes_and_normalizers_and_skip_other_types() {
        let stub = Stub::start(|_| {
            (
                200,
                r#"[
                {"id": "dns-records", "name": "DNS records", "version": null,
                 "created": null, "description": "Fetch the DNS record(s)", "enabled": true,
                 "static": true, "type": "boefje", "scan_level": 1,
                 "consumes": ["Hostname"], "produces": ["boefje/dns-records"],
                 "boefje_schema": null, "cron": null, "interval": 1440,
                 "run_on": null, "runnable_hash": null,
                 "oci_image": "ghcr.io/minvws/openkat/dns-records:latest",
                 "oci_arguments": [], "deduplicate": true},
                {"id": "nmap", "type": "boefje", "enabled": false, "scan_level": 2,
                 "consumes": "IPAddressV4", "run_on": ["create", "update"],
                 "cron": "0 0 * * *"},
                {"id": "bit-port-classification", "type": "bit", "enabled": true,
                 "consumes": "IPPort", "parameters": []},
                {"id": "kat_dns_normalize", "name": "DNS records", "version": null,
                 "created": null, "description": null, "enabled": true, "static": true,
                 "type": "normalizer", "consumes": ["boefje/dns-records"],
                 "produces": ["Hostname"]}
            ]"#
                .into(),
            )
        });
        let plugins = katalogus(&stub).plugins("org 1/x").await.unwrap();
        let ids: Vec<&str> = plugins.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["dns-records", "nmap", "kat_dns_normalize"]);
        assert_eq!(
            plugins[0],
            Plugin {
                id: "dns-records".into(),
                plugin_type: PluginType::Boefje,
                name: Some("DNS records".into()),
                version: None,
                enabled: true,
                consumes: vec!["Hostname".into()],
                scan_level: Some(1),
                interval: Some(1440),
                cron: None,
                run_on: None,
                oci_image: Some("ghcr.io/minvws/openkat/dns-records:latest".into()),
                deduplicate: true,
            }
        );
        assert_eq!(plugins[1].consumes, ["IPAddressV4"], "a string is one type");
        assert!(!plugins[1].deduplicate, "absent: not shared");
        assert!(!plugins[1].enabled);
        assert_eq!(plugins[1].scan_level, Some(2));
        assert_eq!(
            plugins[1].run_on.as_deref(),
            Some(&["create".to_owned(), "update".to_owned()][..])
        );
        assert_eq!(plugins[1].cron.as_deref(), Some("0 0 * * *"));
        assert_eq!(plugins[2].plugin_type, PluginType::Normalizer);
        assert_eq!(plugins[2].consumes, ["boefje/dns-records"]);
        assert_eq!(plugins[2].scan_level, None);
        assert_eq!(stub.seen()[0].path, "/v1/organisations/org%201%2Fx/plugins");
    }

    #[tokio::test]
    async fn a_plugin_that_cannot_be_read_fails_the_call_naming_it() {
        let stub = Stub::start(|_| {
            (
                200,
                r#"[{"id": "a", "type": "boefje", "consumes": []},
                    {"id": "b", "type": "boefje", "scan_level": "high"}]"#
                    .into(),
            )
        });
        let err = katalogus(&stub).plugins("org1").await.unwrap_err();
        let ClientError::Decode { path, error, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(path, "/v1/organisations/org1/plugins");
        assert!(error.starts_with("[1].scan_level"), "{error}");
    }

    #[tokio::test]
    async fn duplicate_organisations_come_from_the_configs_duplicates() {
        let stub = Stub::start(|_| {
            (
                200,
                r#"[{"id": 12, "settings": {"API_KEY": "secret"}, "enabled": true,
                     "boefje_id": "dns-records", "organisation_id": "org1",
                     "duplicates": [
                        {"id": 34, "settings": {"API_KEY": "secret"}, "enabled": true,
                         "boefje_id": "dns-records", "organisation_id": "org2", "duplicates": []},
                        {"id": 35, "settings": {"API_KEY": "secret"}, "enabled": true,
                         "boefje_id": "dns-records", "organisation_id": "org3", "duplicates": []},
                        {"id": 36, "settings": {}, "enabled": true,
                         "boefje_id": "dns-records", "organisation_id": "org2", "duplicates": []}
                     ]}]"#
                    .into(),
            )
        });
        let orgs = katalogus(&stub)
            .duplicate_organisations("org1", "dns-records")
            .await
            .unwrap();
        assert_eq!(orgs, ["org2", "org3"]);
        let seen = &stub.seen()[0];
        assert_eq!(seen.path, "/v1/configs");
        let pairs = seen.query_pairs();
        let expected = [
            ("organisation_id", "org1"),
            ("boefje_id", "dns-records"),
            ("enabled", "true"),
            ("with_duplicates", "true"),
        ];
        assert_eq!(
            pairs,
            expected.map(|(k, v)| (k.to_owned(), v.to_owned())).to_vec()
        );
    }

    #[tokio::test]
    async fn no_configs_or_a_404_means_no_duplicates() {
        let stub = Stub::start(|s| match s.query_pairs()[0].1.as_str() {
            "org1" => (200, "[]".into()),
            _ => (404, r#"{"detail":"Not Found"}"#.into()),
        });
        let k = katalogus(&stub);
        assert!(
            k.duplicate_organisations("org1", "b")
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            k.duplicate_organisations("org9", "b")
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(stub.seen().len(), 2);
    }

    #[tokio::test]
    async fn health_reads_katalogus_health() {
        let stub = Stub::start(|s| match s.path.as_str() {
            "/health" => (
                200,
                r#"{"service":"katalogus","healthy":true,"version":"1"}"#.into(),
            ),
            _ => (404, "{}".into()),
        });
        assert!(katalogus(&stub).health().await);
        let down = Katalogus::new(
            &format!("http://127.0.0.1:{}", closed_port()),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(!down.health().await);
    }

    #[tokio::test]
    async fn an_unreachable_katalogus_is_reported_after_the_retries() {
        let k = Katalogus::new(
            &format!("http://127.0.0.1:{}", closed_port()),
            Duration::from_secs(5),
        )
        .unwrap()
        .with_backoff(quick());
        let err = k.organisations().await.unwrap_err();
        assert!(
            matches!(
                &err,
                ClientError::Unreachable { service: "katalogus", attempts: 2, path, .. }
                    if path == "/v1/organisations"
            ),
            "{err:?}"
        );
    }
}
