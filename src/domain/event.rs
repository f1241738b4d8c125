//! The events the platform sends the scheduler over AMQP (reference §1.9), parsed once: an object's
//! scan profile changed (Octopoes, `scan_profile_mutations`), or a raw file arrived (Bytes,
//! `raw_file_received`). A message that does not parse is refused with a reason naming the key,
//! which the listener puts on the dead-lettered message.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::payload::kind;

/// A message that cannot be used; the reason names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EventError(pub String);

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// The object was created (or got its first scan profile).
    Create,
    /// The object or its scan profile changed.
    Update,
    /// The object was deleted.
    Delete,
}

impl Operation {
    /// The name Octopoes and plugins' `run_on` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Delete => "delete",
        }
    }
}

/// An object event from Octopoes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEvent {
    /// Create, update or delete.
    pub operation: Operation,
    /// The organisation (`client_id`).
    pub organisation: String,
    /// The object reference (`primary_key`), e.g. `Hostname|internet|example.com`.
    pub reference: String,
    /// The object; always `None` on a delete, whatever the message's `value` held.
    pub object: Option<ObjectState>,
}

/// An object as an event describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectState {
    /// Its type (`Hostname`, `IPAddressV4`, …).
    pub object_type: String,
    /// Its scan level (0–4), if it has a scan profile with one.
    pub scan_level: Option<i64>,
    /// `declared`, `inherited` or `empty`, when given.
    pub scan_profile_type: Option<String>,
}

/// A raw file event from Bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct RawFileEvent {
    /// The organisation.
    pub organisation: String,
    /// The raw file's id.
    pub raw_id: Uuid,
    /// Its mime types.
    pub mime_types: Vec<String>,
    /// The `raw_data` object in mula's model ([`mula_raw_data`]): it becomes the normalizer
    /// task's `raw_data`.
    pub raw_data: Map<String, Value>,
    /// When the boefje run that produced the file ended (`boefje_meta.ended_at`), if it says:
    /// mula ranks normalizer work by it, oldest first.
    pub ended_at: Option<DateTime<Utc>>,
}

/// The fields of mula's `RawData`, `BoefjeMeta` and `Boefje` models, with what each holds when
/// a message leaves it out (`None`: null).
const RAW_DATA_FIELDS: [&str; 5] = [
    "id",
    "boefje_meta",
    "mime_types",
    "secure_hash",
    "hash_retrieval_link",
];
const BOEFJE_META_FIELDS: [&str; 7] = [
    "id",
    "boefje",
    "input_ooi",
    "arguments",
    "organization",
    "started_at",
    "ended_at",
];
const BOEFJE_FIELDS: [&str; 4] = ["id", "name", "version", "oci_image"];

/// `raw_data` as mula keeps it in a normalizer task: its own models' fields and no others.
/// Bytes sends more: `boefje_meta.environment` holds the boefje's settings from Katalogus (API
/// keys among them), with `runnable_hash` and `signing_provider_url`; mula's models drop them,
/// so they never reach its database, its API or the normalizer runners, and here neither.
pub fn mula_raw_data(raw_data: &Map<String, Value>) -> Map<String, Value> {
    let keep = |from: &Map<String, Value>, fields: &[&str]| -> Map<String, Value> {
        fields
            .iter()
            .map(|f| {
                (
                    (*f).to_owned(),
                    from.get(*f).cloned().unwrap_or(Value::Null),
                )
            })
            .collect()
    };
    let mut out = keep(raw_data, &RAW_DATA_FIELDS);
    if let Some(Value::Object(meta)) = raw_data.get("boefje_meta") {
        let mut m = keep(meta, &BOEFJE_META_FIELDS);
        if let Some(Value::Object(boefje)) = meta.get("boefje") {
            m.insert("boefje".into(), Value::Object(keep(boefje, &BOEFJE_FIELDS)));
        }
        if m.get("arguments").is_none_or(Value::is_null) {
            m.insert("arguments".into(), Value::Object(Map::new()));
        }
        out.insert("boefje_meta".into(), Value::Object(m));
    }
    out
}

fn object_of(v: &Value, what: &str) -> Result<Map<String, Value>, EventError> {
    match v {
        Value::Object(o) => Ok(o.clone()),
        other => Err(EventError(format!(
            "{what}: expected an object, got {}",
            kind(other)
        ))),
    }
}

fn text(obj: &Map<String, Value>, key: &str, what: &str) -> Result<String, EventError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(EventError(format!("{what}.{key}: must not be empty"))),
        Some(other) => Err(EventError(format!(
            "{what}.{key}: expected a string, got {}",
            kind(other)
        ))),
        None => Err(EventError(format!("{what}.{key}: required"))),
    }
}

/// Parses a `scan_profile_mutations` message.
pub fn parse_object_event(body: &[u8]) -> Result<ObjectEvent, EventError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| EventError(format!("not JSON: {e}")))?;
    let msg = object_of(&v, "message")?;
    let operation = match text(&msg, "operation", "message")?
        .to_ascii_lowercase()
        .as_str()
    {
        "create" => Operation::Create,
        "update" => Operation::Update,
        "delete" => Operation::Delete,
        other => {
            return Err(EventError(format!(
                "message.operation: unknown operation '{other}'; expected create, update or delete"
            )));
        }
    };
    let organisation = text(&msg, "client_id", "message")?;
    let reference = text(&msg, "primary_key", "message")?;
    // The operation decides: a delete removes the object whatever `value` holds (Octopoes may
    // send the deleted object along), so its value is not read at all.
    let value = match operation {
        Operation::Delete => None,
        _ => msg.get("value"),
    };
    let object = match value {
        None | Some(Value::Null) => None,
        Some(value) => {
            let value = object_of(value, "message.value")?;
            let object_type = text(&value, "object_type", "message.value")?;
            let (scan_level, scan_profile_type) = match value.get("scan_profile") {
                None | Some(Value::Null) => (None, None),
                Some(p) => {
                    let p = object_of(p, "message.value.scan_profile")?;
                    let level = match p.get("level") {
                        None | Some(Value::Null) => None,
                        Some(l) => Some(l.as_i64().ok_or_else(|| {
                            EventError(format!(
                                "message.value.scan_profile.level: expected an integer, got {}",
                                kind(l)
                            ))
                        })?),
                    };
                    let profile_type = p
                        .get("scan_profile_type")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    (level, profile_type)
                }
            };
            Some(ObjectState {
                object_type,
                scan_level,
                scan_profile_type,
            })
        }
    };
    if object.is_none() && operation != Operation::Delete {
        return Err(EventError(format!(
            "message.value: required for a {} (only a delete comes without the object)",
            operation.as_str()
        )));
    }
    Ok(ObjectEvent {
        operation,
        organisation,
        reference,
        object,
    })
}

/// Parses a `raw_file_received` message.
pub fn parse_raw_file_event(body: &[u8]) -> Result<RawFileEvent, EventError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| EventError(format!("not JSON: {e}")))?;
    let msg = object_of(&v, "message")?;
    let organisation = text(&msg, "organization", "message")?;
    let raw_data = object_of(
        msg.get("raw_data").unwrap_or(&Value::Null),
        "message.raw_data",
    )?;
    let raw_id = text(&raw_data, "id", "message.raw_data")?;
    let raw_id = Uuid::parse_str(&raw_id)
        .map_err(|_| EventError(format!("message.raw_data.id: '{raw_id}' is not a UUID")))?;
    let meta = object_of(
        raw_data.get("boefje_meta").unwrap_or(&Value::Null),
        "message.raw_data.boefje_meta",
    )?;
    let meta_id = text(&meta, "id", "message.raw_data.boefje_meta")?;
    Uuid::parse_str(&meta_id).map_err(|_| {
        EventError(format!(
            "message.raw_data.boefje_meta.id: '{meta_id}' is not a UUID"
        ))
    })?;
    text(&meta, "organization", "message.raw_data.boefje_meta")?;
    let mime_types = match raw_data.get("mime_types") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.get("value")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        EventError(format!(
                            "message.raw_data.mime_types[{i}].value: expected a string"
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None | Some(Value::Null) => Vec::new(),
        Some(other) => {
            return Err(EventError(format!(
                "message.raw_data.mime_types: expected a list, got {}",
                kind(other)
            )));
        }
    };
    // Without an offset: UTC, as the platform writes its times.
    let ended_at = meta
        .get("ended_at")
        .and_then(Value::as_str)
        .and_then(super::filter::parse_datetime)
        .map(|t| t.and_utc());
    Ok(RawFileEvent {
        organisation,
        raw_id,
        mime_types,
        raw_data: mula_raw_data(&raw_data),
        ended_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_raw_file_keeps_mulas_fields_only_and_its_runs_end() {
        // As Bytes publishes it: the boefje's settings in `environment` (an API key).
        let body = json!({"created_at": "2026-01-01T00:00:00+00:00", "organization": "org1",
            "raw_data": {"id": "0b6c6a5e-2b0e-4a43-9d5f-2d0b4a6c8e11",
                "boefje_meta": {"id": "9a1f6a5e-2b0e-4a43-9d5f-2d0b4a6c8e11",
                    "boefje": {"id": "shodan", "version": null},
                    "input_ooi": "IPAddressV4|internet|1.1.1.1", "arguments": {},
                    "organization": "org1", "runnable_hash": "abc",
                    "environment": {"SHODAN_API": "s3cret"},
                    "started_at": "2024-01-01T00:00:00+00:00", "ended_at": "2024-01-01T00:00:05Z"},
                "mime_types": [{"value": "boefje/shodan"}],
                "secure_hash": "sha512:x", "signing_provider_url": "http://signer"}});
        let e = parse_raw_file_event(body.to_string().as_bytes()).unwrap();
        let mut keys: Vec<&String> = e.raw_data.keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "boefje_meta",
                "hash_retrieval_link",
                "id",
                "mime_types",
                "secure_hash"
            ]
        );
        assert_eq!(
            Value::Object(e.raw_data["boefje_meta"].as_object().unwrap().clone()),
            json!({"id": "9a1f6a5e-2b0e-4a43-9d5f-2d0b4a6c8e11",
                "boefje": {"id": "shodan", "name": null, "version": null, "oci_image": null},
                "input_ooi": "IPAddressV4|internet|1.1.1.1", "arguments": {},
                "organization": "org1", "started_at": "2024-01-01T00:00:00+00:00",
                "ended_at": "2024-01-01T00:00:05Z"})
        );
        assert!(!e.raw_data.contains_key("signing_provider_url"));
        assert!(!Value::Object(e.raw_data).to_string().contains("s3cret"));
        assert_eq!(e.ended_at.map(|t| t.timestamp()), Some(1_704_067_205));
        // Without an offset, UTC; not a time at all, none.
        for (ended, at) in [
            (json!("2024-01-01T00:00:05.5"), Some(1_704_067_205)),
            (json!(null), None),
            (json!("yesterday"), None),
        ] {
            let mut b = body.clone();
            b["raw_data"]["boefje_meta"]["ended_at"] = ended;
            let e = parse_raw_file_event(b.to_string().as_bytes()).unwrap();
            assert_eq!(e.ended_at.map(|t| t.timestamp()), at);
        }
    }

    #[test]
    fn a_mutation_with_its_object_parses() {
        let body = json!({"operation": "create", "primary_key": "Hostname|internet|a.nl",
            "value": {"primary_key": "Hostname|internet|a.nl", "object_type": "Hostname",
                      "scan_profile": {"level": 2, "reference": "Hostname|internet|a.nl", "scan_profile_type": "declared"}},
            "client_id": "org1"});
        let e = parse_object_event(body.to_string().as_bytes()).unwrap();
        assert_eq!(e.operation, Operation::Create);
        assert_eq!(e.organisation, "org1");
        assert_eq!(e.object.unwrap().scan_level, Some(2));
    }

    #[test]
    fn a_delete_comes_without_its_object_and_others_may_not() {
        let delete = json!({"operation": "delete", "primary_key": "Hostname|internet|a.nl", "client_id": "org1"});
        assert!(
            parse_object_event(delete.to_string().as_bytes())
                .unwrap()
                .object
                .is_none()
        );
        let update = json!({"operation": "update", "primary_key": "x", "client_id": "org1"});
        assert!(
            parse_object_event(update.to_string().as_bytes())
                .unwrap_err()
                .0
                .contains("message.value")
        );
        assert!(
            parse_object_event(b"{")
                .unwrap_err()
                .0
                .starts_with("not JSON")
        );
    }

    #[test]
    fn a_delete_carrying_its_object_is_still_a_delete() {
        // Octopoes may send the deleted object along; the operation decides, whatever `value`
        // holds (even a value that would not parse as an object).
        for value in [
            json!({"primary_key": "Hostname|internet|a.nl", "object_type": "Hostname",
                   "scan_profile": {"level": 2, "scan_profile_type": "declared"}}),
            json!({"object_type": 7}),
            json!("gone"),
        ] {
            let delete = json!({"operation": "DELETE", "primary_key": "Hostname|internet|a.nl",
                "value": value, "client_id": "org1"});
            let e = parse_object_event(delete.to_string().as_bytes()).unwrap();
            assert_eq!(e.operation, Operation::Delete);
            assert!(e.object.is_none(), "{value}");
        }
    }

    #[test]
    fn a_raw_file_event_names_what_is_missing() {
        let ok = json!({"organization": "org1", "raw_data": {"id": "0b8c7f7e-3f5e-4b8a-9d7e-3c1f2a4b5c6d",
            "boefje_meta": {"id": "1b8c7f7e-3f5e-4b8a-9d7e-3c1f2a4b5c6d", "organization": "org1"},
            "mime_types": [{"value": "boefje/dns-records"}, {"value": "text/plain"}]}});
        let e = parse_raw_file_event(ok.to_string().as_bytes()).unwrap();
        assert_eq!(e.mime_types, vec!["boefje/dns-records", "text/plain"]);
        let bad = json!({"organization": "org1", "raw_data": {"id": "nope"}});
        assert!(
            parse_raw_file_event(bad.to_string().as_bytes())
                .unwrap_err()
                .0
                .contains("raw_data.id")
        );
    }
}
