//! Octopoes: an organisation's objects at a moment, a page at a time, as mula pages them
//! (`GET /{org}/objects`), and its health.
//!
//! Only what planning needs is kept of an object: its key, its type and its scan profile. One
//! object that cannot be read is set aside with the reason, so a single odd object does not stop
//! an organisation's paging.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::http::{Backoff, ClientError, ServiceClient};

/// The service's name in errors and logs.
pub const SERVICE: &str = "octopoes";

/// Which objects to list; empty lists mean all (Octopoes' defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectFilter {
    /// Object types (`Hostname`, `IPAddressV4`); sent as repeated `types`.
    pub types: Vec<String>,
    /// Scan levels 0–4; sent as repeated `scan_level`.
    pub scan_levels: Vec<u8>,
}

/// One object as the scheduler needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OctopoesObject {
    /// Its primary key (`Hostname|internet|example.com`), a task's `input_ooi`.
    pub reference: String,
    /// Its type (`Hostname`).
    pub object_type: String,
    /// Its scan profile's level, if it has a profile.
    pub scan_level: Option<i64>,
    /// `declared`, `inherited` or `empty`, if it has a profile.
    pub scan_profile_type: Option<String>,
}

/// One page of `GET /{org}/objects`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectPage {
    /// Objects matching in all, over every page.
    pub count: u64,
    /// This page's objects that could be read.
    pub items: Vec<OctopoesObject>,
    /// This page's other objects, which could not be read.
    pub rejected: Vec<Rejected>,
}

/// An object Octopoes listed that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Its primary key, when it has one: Octopoes holds that object, so ColdStart keeps its
    /// frontier row rather than finding it gone.
    pub reference: Option<String>,
    /// Why, naming its place on the page (`items[3]: …`) and, when known, the object.
    pub why: String,
}

/// Octopoes' `detail` of a 404 for an organisation it has no node for.
const NODE_NOT_FOUND: &str = "Node not found";

/// Octopoes' answer about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// It exists.
    Found(OctopoesObject),
    /// Octopoes' own "not found": it does not exist at that moment.
    NotFound,
    /// A 404 that says nothing of the object (no node for the organisation, not Octopoes'
    /// JSON); why.
    Unanswered(String),
    /// A 400: Octopoes cannot read this object (its model refuses the stored record, or the
    /// reference), which says nothing of the others; why.
    Refused(String),
}

/// The Octopoes client.
#[derive(Debug, Clone)]
pub struct Octopoes {
    http: ServiceClient,
}

impl Octopoes {
    /// A client of Octopoes at `base` (`http://octopoes:80`); `timeout` bounds each try.
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

    /// Objects `offset..offset+limit` of `organisation` as they were at `valid_time`, of every
    /// type and scan level.
    pub async fn objects(
        &self,
        organisation: &str,
        offset: u64,
        limit: u64,
        valid_time: DateTime<Utc>,
    ) -> Result<ObjectPage, ClientError> {
        self.objects_matching(
            organisation,
            &ObjectFilter::default(),
            offset,
            limit,
            valid_time,
        )
        .await
    }

    /// Objects `offset..offset+limit` of `organisation` matching `filter` at `valid_time`
    /// (`GET /{org}/objects?types=…&scan_level=…&offset=&limit=&valid_time=`, mula's order;
    /// `valid_time` as ISO-8601 with a `+00:00` offset, which Octopoes requires). An organisation
    /// Octopoes has no node for (404 `Node not found`) has an empty listing; any other 404 (a
    /// route the server lacks) is [`ClientError::NotFound`]. A type Octopoes does not know, or a
    /// record on the page its model refuses, is a 400 (its `ValueError` handler).
    pub async fn objects_matching(
        &self,
        organisation: &str,
        filter: &ObjectFilter,
        offset: u64,
        limit: u64,
        valid_time: DateTime<Utc>,
    ) -> Result<ObjectPage, ClientError> {
        #[derive(Deserialize)]
        struct Page {
            count: u64,
            items: Vec<Value>,
        }
        let levels: Vec<String> = filter.scan_levels.iter().map(u8::to_string).collect();
        let (offset, limit) = (offset.to_string(), limit.to_string());
        let valid_time = valid_time.to_rfc3339_opts(SecondsFormat::AutoSi, false);
        let mut query: Vec<(&str, &str)> = Vec::new();
        query.extend(filter.types.iter().map(|t| ("types", t.as_str())));
        query.extend(levels.iter().map(|l| ("scan_level", l.as_str())));
        query.extend([
            ("offset", offset.as_str()),
            ("limit", limit.as_str()),
            ("valid_time", valid_time.as_str()),
        ]);
        let page: Page = match self.http.get_json(&[organisation, "objects"], &query).await {
            // An organisation Octopoes has no node for (Katalogus lists it, nothing was ever
            // stored for it, or it was removed) holds no objects: an empty listing, as mula
            // reads it, rather than a failure retried every minute for ever.
            Err(ClientError::NotFound {
                detail: Some(d), ..
            }) if d == NODE_NOT_FOUND => {
                tracing::warn!(
                    organisation,
                    "Octopoes has no node for the organisation (404 Node not found): its listing is empty"
                );
                Page {
                    count: 0,
                    items: Vec::new(),
                }
            }
            other => other?,
        };
        let mut out = ObjectPage {
            count: page.count,
            items: Vec::with_capacity(page.items.len()),
            rejected: Vec::new(),
        };
        for (i, item) in page.items.iter().enumerate() {
            match read_object(item) {
                Ok(object) => out.items.push(object),
                Err(why) => out.rejected.push(Rejected {
                    reference: item
                        .get("primary_key")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    why: format!("items[{i}]: {why}"),
                }),
            }
        }
        Ok(out)
    }

    /// One object of `organisation` as it is at `valid_time` (`GET /{org}/object?reference=&
    /// valid_time=`, mula's call when it reschedules). Octopoes answers a missing object with a
    /// 404 whose `detail` names it (its `ObjectNotFoundException` handler: the reference), and an
    /// organisation it has no node for with a 404 `Node not found`; only the first is
    /// [`Lookup::NotFound`]. Any other 404 says nothing of the object: a route the server does not
    /// have answers FastAPI's `{"detail": "Not Found"}` (a wrong path prefix in the configured
    /// URL, a proxy before another app, a version whose route moved), and a proxy's own page has
    /// no JSON. Read as "gone", each would disable every due schedule whose object the frontier
    /// lacks, tick after tick.
    pub async fn object(
        &self,
        organisation: &str,
        reference: &str,
        valid_time: DateTime<Utc>,
    ) -> Result<Lookup, ClientError> {
        let valid_time = valid_time.to_rfc3339_opts(SecondsFormat::AutoSi, false);
        let query = [
            ("reference", reference),
            ("valid_time", valid_time.as_str()),
        ];
        match self
            .http
            .get_json::<Value>(&[organisation, "object"], &query)
            .await
        {
            Ok(item) => read_object(&item)
                .map(Lookup::Found)
                .map_err(|error| ClientError::Decode {
                    service: SERVICE,
                    path: format!("/{organisation}/object"),
                    error,
                })
                .inspect_err(super::http::count_failure),
            Err(ClientError::NotFound { detail, .. }) => Ok(match detail.as_deref() {
                Some(NODE_NOT_FOUND) => Lookup::Unanswered(format!(
                    "octopoes has no node for organisation {organisation}"
                )),
                Some(d) if d.contains(reference) => Lookup::NotFound,
                Some(d) => Lookup::Unanswered(format!(
                    "octopoes /{organisation}/object answered 404 '{d}', which does not name the object (a route it lacks?)"
                )),
                None => Lookup::Unanswered(format!(
                    "octopoes /{organisation}/object answered 404 without its JSON detail"
                )),
            }),
            // Octopoes' `ValueError` handler: a pydantic `ValidationError` or `TypeNotFound` of
            // this object's record, or a reference it cannot parse. Octopoes itself is fine.
            Err(ClientError::Status {
                status: 400,
                excerpt,
                ..
            }) => Ok(Lookup::Refused(format!(
                "octopoes cannot read object {reference} of {organisation} (400: {excerpt})"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Which of `clients` (organisations) hold `reference` at `valid_time`, with the object as
    /// each holds it (`GET /object-clients?reference=&clients=…&valid_time=`, mula's call for
    /// de-duplication siblings). A 404 is none, as mula reads it; an object one organisation
    /// returns that cannot be read is left out.
    pub async fn object_clients(
        &self,
        reference: &str,
        clients: &[String],
        valid_time: DateTime<Utc>,
    ) -> Result<Vec<(String, OctopoesObject)>, ClientError> {
        let valid_time = valid_time.to_rfc3339_opts(SecondsFormat::AutoSi, false);
        let mut query: Vec<(&str, &str)> = vec![("reference", reference)];
        query.extend(clients.iter().map(|c| ("clients", c.as_str())));
        query.push(("valid_time", valid_time.as_str()));
        let held: serde_json::Map<String, Value> =
            match self.http.get_json(&["object-clients"], &query).await {
                Err(ClientError::NotFound { .. }) => return Ok(Vec::new()),
                other => other?,
            };
        Ok(held
            .into_iter()
            .filter(|(org, _)| clients.contains(org))
            .filter_map(|(org, item)| read_object(&item).ok().map(|o| (org, o)))
            .collect())
    }

    /// Whether the service answers `GET /health` with 2xx (and `healthy: true`, when it says):
    /// the service as a whole, with no organisation to name.
    pub async fn service_health(&self) -> bool {
        self.http.healthy(&["health"]).await
    }

    /// Whether `GET /{org}/health` answers 2xx with `healthy: true` (when it says).
    pub async fn health(&self, organisation: &str) -> bool {
        self.http.healthy(&[organisation, "health"]).await
    }
}

/// One item of a page; the error names the key that is wrong and, when it is known, the object.
fn read_object(item: &Value) -> Result<OctopoesObject, String> {
    let Some(fields) = item.as_object() else {
        return Err("not an object".into());
    };
    let Some(reference) = fields.get("primary_key").and_then(Value::as_str) else {
        return Err("primary_key: missing or not a string".into());
    };
    let Some(object_type) = fields.get("object_type").and_then(Value::as_str) else {
        return Err(format!("{reference}: object_type: missing or not a string"));
    };
    let (scan_level, scan_profile_type) = match fields.get("scan_profile") {
        None | Some(Value::Null) => (None, None),
        Some(Value::Object(profile)) => {
            let level =
                match profile.get("level") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_i64().ok_or_else(|| {
                        format!("{reference}: scan_profile.level: not an integer")
                    })?),
                };
            let kind = match profile.get("scan_profile_type") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => {
                    return Err(format!(
                        "{reference}: scan_profile.scan_profile_type: not a string"
                    ));
                }
            };
            (level, kind)
        }
        Some(_) => return Err(format!("{reference}: scan_profile: not an object")),
    };
    Ok(OctopoesObject {
        reference: reference.to_owned(),
        object_type: object_type.to_owned(),
        scan_level,
        scan_profile_type,
    })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::super::http::stub::{Stub, closed_port};
    use super::*;

    fn octopoes(stub: &Stub) -> Octopoes {
        Octopoes::new(&stub.base, Duration::from_secs(5))
            .unwrap()
            .with_backoff(Backoff {
                attempts: 2,
                base: Duration::from_millis(1),
                cap: Duration::from_millis(2),
            })
    }

    const PAGE: &str = r#"{"count": 1204, "items": [
        {"object_type": "Hostname",
         "scan_profile": {"scan_profile_type": "declared",
                          "reference": "Hostname|internet|example.com", "level": 2, "user_id": null},
         "user_id": null, "primary_key": "Hostname|internet|example.com",
         "network": "Network|internet", "name": "example.com",
         "dns_zone": null, "registered_domain": null},
        {"object_type": "IPAddressV4", "primary_key": "IPAddressV4|internet|192.0.2.1",
         "scan_profile": {"scan_profile_type": "inherited", "level": "two"}},
        {"object_type": "Network", "primary_key": "Network|internet",
         "scan_profile": {"scan_profile_type": "empty", "reference": "Network|internet",
                          "level": 0, "user_id": null}},
        {"object_type": "Hostname", "name": "no-key.example"},
        {"object_type": "Network", "primary_key": "Network|lab", "scan_profile": null}
    ]}"#;

    #[tokio::test]
    async fn a_page_keeps_readable_objects_and_rejects_the_others_by_key() {
        let stub = Stub::start(|_| (200, PAGE.into()));
        let t = Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap()
            + chrono::Duration::microseconds(123_456);
        let page = octopoes(&stub)
            .objects("org1", 1000, 1000, t)
            .await
            .unwrap();
        assert_eq!(page.count, 1204);
        assert_eq!(
            page.items,
            vec![
                OctopoesObject {
                    reference: "Hostname|internet|example.com".into(),
                    object_type: "Hostname".into(),
                    scan_level: Some(2),
                    scan_profile_type: Some("declared".into()),
                },
                OctopoesObject {
                    reference: "Network|internet".into(),
                    object_type: "Network".into(),
                    scan_level: Some(0),
                    scan_profile_type: Some("empty".into()),
                },
                OctopoesObject {
                    reference: "Network|lab".into(),
                    object_type: "Network".into(),
                    scan_level: None,
                    scan_profile_type: None,
                },
            ]
        );
        assert_eq!(
            page.rejected,
            [
                Rejected {
                    reference: Some("IPAddressV4|internet|192.0.2.1".into()),
                    why: "items[1]: IPAddressV4|internet|192.0.2.1: scan_profile.level: not an integer".into(),
                },
                Rejected {
                    reference: None,
                    why: "items[3]: primary_key: missing or not a string".into(),
                },
            ]
        );
        let seen = &stub.seen()[0];
        assert_eq!(seen.path, "/org1/objects");
        assert_eq!(
            seen.query_pairs(),
            [
                ("offset", "1000"),
                ("limit", "1000"),
                ("valid_time", "2025-01-02T03:04:05.123456+00:00"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[tokio::test]
    async fn types_and_scan_levels_are_repeated_parameters() {
        let stub = Stub::start(|_| (200, r#"{"count": 0, "items": []}"#.into()));
        let filter = ObjectFilter {
            types: vec!["Hostname".into(), "IPAddressV4".into()],
            scan_levels: vec![1, 2, 3, 4],
        };
        let t = Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap();
        let page = octopoes(&stub)
            .objects_matching("org 1", &filter, 0, 1000, t)
            .await
            .unwrap();
        assert_eq!(page, ObjectPage::default());
        let seen = &stub.seen()[0];
        assert_eq!(seen.path, "/org%201/objects");
        assert_eq!(
            seen.query,
            "types=Hostname&types=IPAddressV4&scan_level=1&scan_level=2&scan_level=3&scan_level=4\
             &offset=0&limit=1000&valid_time=2025-01-02T03%3A04%3A05%2B00%3A00"
        );
    }

    #[tokio::test]
    async fn a_page_without_a_count_is_a_decode_error_and_404_is_not_found() {
        let stub = Stub::start(|s| match s.path.as_str() {
            "/org1/objects" => (200, r#"{"items": []}"#.into()),
            "/nonode/objects" => (404, r#"{"detail": "Node not found"}"#.into()),
            _ => (404, r#"{"detail":"Unknown type"}"#.into()),
        });
        let o = octopoes(&stub);
        let err = o.objects("org1", 0, 10, Utc::now()).await.unwrap_err();
        assert!(
            matches!(&err, ClientError::Decode { error, .. } if error.contains("count")),
            "{err:?}"
        );
        let err = o.objects("org2", 0, 10, Utc::now()).await.unwrap_err();
        assert_eq!(err.status(), Some(404));
        // An organisation Octopoes has no node for holds no objects.
        let empty = o.objects("nonode", 0, 10, Utc::now()).await.unwrap();
        assert_eq!((empty.count, empty.items.len()), (0, 0));
    }

    #[tokio::test]
    async fn one_object_is_found_or_octopoes_says_it_is_not_and_other_404s_say_nothing() {
        let stub = Stub::start(|s| match (s.path.as_str(), s.query_pairs()[0].1.as_str()) {
            ("/org1/object", "Hostname|internet|a.nl") => (
                200,
                r#"{"object_type": "Hostname", "primary_key": "Hostname|internet|a.nl",
                    "scan_profile": {"scan_profile_type": "declared", "level": 2}}"#
                    .into(),
            ),
            // Octopoes' ObjectNotFoundException handler: the detail names the object.
            ("/org1/object", _) => (404, r#"{"detail": "Hostname|internet|b.nl"}"#.into()),
            // No node for the organisation: says nothing of the object.
            ("/nonode/object", _) => (404, r#"{"detail": "Node not found"}"#.into()),
            // A route the server lacks (FastAPI's own 404): nothing of the object either.
            ("/wrongprefix/object", _) => (404, r#"{"detail": "Not Found"}"#.into()),
            _ => (404, "<html>Not Found</html>".into()),
        });
        let o = octopoes(&stub);
        let t = Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(
            o.object("org1", "Hostname|internet|a.nl", t).await.unwrap(),
            Lookup::Found(OctopoesObject {
                reference: "Hostname|internet|a.nl".into(),
                object_type: "Hostname".into(),
                scan_level: Some(2),
                scan_profile_type: Some("declared".into()),
            })
        );
        assert_eq!(
            o.object("org1", "Hostname|internet|b.nl", t).await.unwrap(),
            Lookup::NotFound
        );
        assert!(matches!(
            o.object("nonode", "Hostname|internet|a.nl", t).await.unwrap(),
            Lookup::Unanswered(why) if why.contains("no node")
        ));
        assert!(matches!(
            o.object("proxy", "Hostname|internet|a.nl", t)
                .await
                .unwrap(),
            Lookup::Unanswered(_)
        ));
        assert!(matches!(
            o.object("wrongprefix", "Hostname|internet|a.nl", t)
                .await
                .unwrap(),
            Lookup::Unanswered(why) if why.contains("does not name the object")
        ));
        let seen = &stub.seen()[0];
        assert_eq!(
            seen.query_pairs(),
            [
                ("reference", "Hostname|internet|a.nl"),
                ("valid_time", "2025-01-02T03:04:05+00:00"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let down = Octopoes::new(
            &format!("http://127.0.0.1:{}", closed_port()),
            Duration::from_secs(5),
        )
        .unwrap()
        .with_backoff(Backoff {
            attempts: 1,
            base: Duration::from_millis(1),
            cap: Duration::from_millis(1),
        });
        assert!(matches!(
            down.object("org1", "x", t).await,
            Err(ClientError::Unreachable { .. })
        ));
    }

    #[tokio::test]
    async fn the_holders_of_an_object_are_asked_with_repeated_clients() {
        let stub = Stub::start(|s| match s.path.as_str() {
            "/object-clients" => (
                200,
                r#"{"org2": {"object_type": "Hostname", "primary_key": "Hostname|internet|a.nl",
                             "scan_profile": {"scan_profile_type": "inherited", "level": 1}},
                    "org9": {"object_type": "Hostname", "primary_key": "Hostname|internet|a.nl"}}"#
                    .into(),
            ),
            _ => (404, r#"{"detail": "Not Found"}"#.into()),
        });
        let t = Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap();
        let held = octopoes(&stub)
            .object_clients("Hostname|internet|a.nl", &["org2".into(), "org3".into()], t)
            .await
            .unwrap();
        assert_eq!(held.len(), 1, "org9 was not asked about");
        assert_eq!(held[0].0, "org2");
        assert_eq!(held[0].1.scan_level, Some(1));
        assert_eq!(
            stub.seen()[0].query,
            "reference=Hostname%7Cinternet%7Ca.nl&clients=org2&clients=org3\
             &valid_time=2025-01-02T03%3A04%3A05%2B00%3A00"
        );
    }

    #[tokio::test]
    async fn health_is_asked_per_organisation() {
        let stub = Stub::start(|s| match s.path.as_str() {
            "/org1/health" => (200, r#"{"service":"octopoes","healthy":true}"#.into()),
            _ => (200, r#"{"service":"octopoes","healthy":false}"#.into()),
        });
        let o = octopoes(&stub);
        assert!(o.health("org1").await);
        assert!(!o.health("org2").await);
        let down = Octopoes::new(
            &format!("http://127.0.0.1:{}", closed_port()),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(!down.health("org1").await);
    }
}
