//! Task payloads (`data`): the shape each scheduler's workers need, and the hash derived from it.
//!
//! Only the keys that identify the work are checked; everything else in `data` is kept as sent,
//! because workers and later platform versions add keys of their own.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::SchedulerId;
use super::hash::task_hash;

/// A payload that does not fit its scheduler's item type; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PayloadError(pub String);

fn text<'a>(obj: &'a Map<String, Value>, key: &str, path: &str) -> Result<&'a str, PayloadError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(Value::String(_)) => Err(PayloadError(format!("{path}.{key}: must not be empty"))),
        Some(other) => Err(PayloadError(format!(
            "{path}.{key}: expected a string, got {}",
            kind(other)
        ))),
        None => Err(PayloadError(format!("{path}.{key}: required"))),
    }
}

fn object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a Map<String, Value>, PayloadError> {
    match obj.get(key) {
        Some(Value::Object(o)) => Ok(o),
        Some(other) => Err(PayloadError(format!(
            "{path}.{key}: expected an object, got {}",
            kind(other)
        ))),
        None => Err(PayloadError(format!("{path}.{key}: required"))),
    }
}

/// The JSON type name of a value, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The optional `data.id`: absent, or a UUID.
pub fn data_id(data: &Map<String, Value>) -> Result<Option<Uuid>, PayloadError> {
    match data.get("id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Uuid::parse_str(s)
            .map(Some)
            .map_err(|_| PayloadError(format!("data.id: '{s}' is not a valid UUID"))),
        Some(other) => Err(PayloadError(format!(
            "data.id: expected a UUID string, got {}",
            kind(other)
        ))),
    }
}

/// The key fields tasks are found by (see [`super::keys`]) are strings when present, whatever the
/// scheduler: `input_ooi` and `boefje.oci_image` (the plugin ids are checked by each item type).
fn key_fields_are_text(data: &Map<String, Value>) -> Result<(), PayloadError> {
    let check = |v: Option<&Value>, path: &str| match v {
        None | Some(Value::Null | Value::String(_)) => Ok(()),
        Some(other) => Err(PayloadError(format!(
            "{path}: expected a string or null, got {}",
            kind(other)
        ))),
    };
    check(data.get("input_ooi"), "data.input_ooi")?;
    if let Some(Value::Object(boefje)) = data.get("boefje") {
        check(boefje.get("oci_image"), "data.boefje.oci_image")?;
    }
    Ok(())
}

/// Checks `data` against `scheduler`'s item type and returns its task hash (mula's rules):
///
/// | scheduler | hashed string |
/// |---|---|
/// | boefje | `{input_ooi}-{boefje.id}-{organization}`, or `{boefje.id}-{organization}` without an OOI |
/// | normalizer | `{normalizer.id}-{raw_data.boefje_meta.id}-{raw_data.boefje_meta.organization}` |
/// | report | `{report_recipe_id}-{organisation_id}` |
pub fn hash_for(scheduler: SchedulerId, data: &Map<String, Value>) -> Result<String, PayloadError> {
    key_fields_are_text(data)?;
    let input = match scheduler {
        SchedulerId::Boefje => {
            let boefje = object(data, "boefje", "data")?;
            let boefje_id = text(boefje, "id", "data.boefje")?;
            // A key field runners select by: a string, if anything.
            match boefje.get("oci_image") {
                None | Some(Value::Null | Value::String(_)) => {}
                Some(other) => {
                    return Err(PayloadError(format!(
                        "data.boefje.oci_image: expected a string or null, got {}",
                        kind(other)
                    )));
                }
            }
            // The de-duplication group, a key field too: a task id, if anything.
            match data.get("deduplication_key") {
                None | Some(Value::Null) => {}
                Some(Value::String(k)) if Uuid::parse_str(k).is_ok() => {}
                Some(Value::String(k)) => {
                    return Err(PayloadError(format!(
                        "data.deduplication_key: '{k}' is not a valid UUID"
                    )));
                }
                Some(other) => {
                    return Err(PayloadError(format!(
                        "data.deduplication_key: expected a UUID string or null, got {}",
                        kind(other)
                    )));
                }
            }
            let organization = text(data, "organization", "data")?;
            match data.get("input_ooi") {
                None | Some(Value::Null) => format!("{boefje_id}-{organization}"),
                Some(Value::String(ooi)) if ooi.is_empty() => format!("{boefje_id}-{organization}"),
                Some(Value::String(ooi)) => format!("{ooi}-{boefje_id}-{organization}"),
                Some(other) => {
                    return Err(PayloadError(format!(
                        "data.input_ooi: expected a string or null, got {}",
                        kind(other)
                    )));
                }
            }
        }
        SchedulerId::Normalizer => {
            let normalizer = object(data, "normalizer", "data")?;
            let normalizer_id = text(normalizer, "id", "data.normalizer")?;
            let raw_data = object(data, "raw_data", "data")?;
            let meta = object(raw_data, "boefje_meta", "data.raw_data")?;
            let meta_id = text(meta, "id", "data.raw_data.boefje_meta")?;
            let meta_id = Uuid::parse_str(meta_id).map_err(|_| {
                PayloadError(format!(
                    "data.raw_data.boefje_meta.id: '{meta_id}' is not a valid UUID"
                ))
            })?;
            let organization = text(meta, "organization", "data.raw_data.boefje_meta")?;
            format!("{normalizer_id}-{}-{organization}", meta_id.hyphenated())
        }
        SchedulerId::Report => {
            let recipe = text(data, "report_recipe_id", "data")?;
            let organisation = text(data, "organisation_id", "data")?;
            format!("{recipe}-{organisation}")
        }
    };
    Ok(task_hash(&input))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn boefje_hash_includes_the_ooi_when_there_is_one() {
        let data = map(
            json!({"boefje": {"id": "dns-records"}, "input_ooi": "Hostname|internet|example.com", "organization": "org1"}),
        );
        assert_eq!(
            hash_for(SchedulerId::Boefje, &data).unwrap(),
            "74956880324db1838156e1ebf7847448"
        );
    }

    #[test]
    fn boefje_hash_without_ooi_uses_boefje_and_organization() {
        let data = map(
            json!({"boefje": {"id": "dns-records"}, "input_ooi": null, "organization": "org1"}),
        );
        assert_eq!(
            hash_for(SchedulerId::Boefje, &data).unwrap(),
            "316d04d4f0baf363b64ec113ce54f9ce"
        );
    }

    #[test]
    fn normalizer_hash_uses_the_hyphenated_boefje_meta_id() {
        let meta = "0b8c7f7e-3f5e-4b8a-9d7e-3c1f2a4b5c6d";
        let data = map(json!({"normalizer": {"id": "kat_dns_normalize"},
            "raw_data": {"boefje_meta": {"id": meta, "organization": "org1"}}}));
        assert_eq!(
            hash_for(SchedulerId::Normalizer, &data).unwrap(),
            task_hash(&format!("kat_dns_normalize-{meta}-org1"))
        );
    }

    #[test]
    fn report_hash_uses_recipe_and_organisation() {
        let data = map(json!({"report_recipe_id": "r1", "organisation_id": "org1"}));
        assert_eq!(
            hash_for(SchedulerId::Report, &data).unwrap(),
            task_hash("r1-org1")
        );
    }

    #[test]
    fn a_missing_key_is_named_with_its_full_path() {
        let data = map(json!({"boefje": {}, "organization": "org1"}));
        assert_eq!(
            hash_for(SchedulerId::Boefje, &data).unwrap_err().0,
            "data.boefje.id: required"
        );
        let data = map(
            json!({"normalizer": {"id": "n"}, "raw_data": {"boefje_meta": {"id": "x", "organization": "o"}}}),
        );
        assert_eq!(
            hash_for(SchedulerId::Normalizer, &data).unwrap_err().0,
            "data.raw_data.boefje_meta.id: 'x' is not a valid UUID"
        );
    }

    #[test]
    fn data_id_must_be_a_uuid() {
        assert!(data_id(&map(json!({"id": 5}))).is_err());
        assert_eq!(data_id(&map(json!({}))).unwrap(), None);
    }
}
