//! How large an input may be, in every dimension a client controls, so that no request can make
//! the service or the database behind it fail: the number of conditions in a filter and their
//! nesting, the values of an `in` list, the length of every string a task is stored or found by,
//! the nesting of a payload, and the window of a listing. Each limit is a named setting with a
//! default (see the config module); a request beyond one is refused with a message naming the
//! limit. NUL characters, which PostgreSQL cannot store in text, are refused everywhere, so both
//! databases accept the same inputs.

use serde_json::{Map, Value};

use super::filter::{FilterNode, Operand, Scalar};
use super::keys::{DataKeys, KeyField};

/// Default conditions in one filter at most.
pub const DEFAULT_MAX_FILTER_CONDITIONS: usize = 100;
/// Default nesting of lists and `and` / `or` / `not` at most: deep enough for any filter a person
/// or a program writes, far below what the parser (128 levels of JSON) and the SQL behind it bear.
pub const DEFAULT_MAX_FILTER_DEPTH: usize = 32;
/// Default values of one `in` / `not_in` list at most (the runners send a few images or plugins).
pub const DEFAULT_MAX_IN_VALUES: usize = 1_000;
/// Default characters in one string a task is stored by (organisation, ids, key fields) at
/// most (filter values: [`FILTER_VALUE_MAX_CHARS`]): even at four bytes a character, well under PostgreSQL's limit on an
/// index entry (2,704 bytes). Counted in characters, as JSON Schema's `maxLength` counts them.
pub const DEFAULT_MAX_STRING_CHARS: usize = 512;
/// Characters in one filter value at most. A filter value is only compared, never stored or
/// indexed, so it is not held to `max_string_chars`: the webapp finds tasks and schedules by an
/// object's reference, which may be a long URL. The bound keeps a `like` pattern within
/// SQLite's (50,000 bytes at four a character).
pub const FILTER_VALUE_MAX_CHARS: usize = 8_192;
/// Characters in an object's reference (`input_ooi`, a key field) at most. A reference is
/// Octopoes' primary key, and a URL's holds the whole URL: mula stores and plans any length.
/// Stored references longer than an index entry holds are found without the index (migration
/// 20), so this bound is the filter values' own, not `max_string_chars`: a reference the
/// webapp can search for can be stored.
pub const REFERENCE_MAX_CHARS: usize = FILTER_VALUE_MAX_CHARS;
/// Default nesting of a task payload at most.
pub const DEFAULT_MAX_JSON_DEPTH: usize = 32;
/// Default `offset` of a listing at most.
pub const DEFAULT_MAX_OFFSET: i64 = 100_000_000;

/// The limits in force: the `[limits]` settings (see the config module), a request beyond one
/// is a 400 naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Conditions in one filter.
    pub max_filter_conditions: usize,
    /// Nesting of combinators in one filter.
    pub max_filter_depth: usize,
    /// Values in one `in` / `not_in` list.
    pub max_in_values: usize,
    /// Characters in one string a task is stored or found by.
    pub max_string_chars: usize,
    /// Nesting of a payload.
    pub max_json_depth: usize,
    /// A listing's offset.
    pub max_offset: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_filter_conditions: DEFAULT_MAX_FILTER_CONDITIONS,
            max_filter_depth: DEFAULT_MAX_FILTER_DEPTH,
            max_in_values: DEFAULT_MAX_IN_VALUES,
            max_string_chars: DEFAULT_MAX_STRING_CHARS,
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
            max_offset: DEFAULT_MAX_OFFSET,
        }
    }
}

/// An input beyond a limit, or with a NUL character; the message names the field and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LimitError(pub String);

/// Refuses a NUL character, and more than `max` characters (the limit `limit` names).
fn check_length(field: &str, value: &str, max: usize, limit: &str) -> Result<(), LimitError> {
    if value.contains('\0') {
        return Err(LimitError(format!(
            "{field}: contains a NUL character, which is not allowed"
        )));
    }
    // Bytes bound characters from above: count only when the bytes could be over.
    if value.len() > max {
        let chars = value.chars().count();
        if chars > max {
            return Err(LimitError(format!(
                "{field}: {chars} characters, more than the limit of {max} ({limit})"
            )));
        }
    }
    Ok(())
}

impl Limits {
    /// Checks one string a task is stored or found by.
    pub fn check_text(&self, field: &str, value: &str) -> Result<(), LimitError> {
        check_length(field, value, self.max_string_chars, "max_string_chars")
    }

    /// Checks a payload's key fields ([`DataKeys`]): each within `max_string_chars`, an object's
    /// reference within [`REFERENCE_MAX_CHARS`].
    pub fn check_keys(&self, keys: &DataKeys) -> Result<(), LimitError> {
        for field in KeyField::ALL {
            let Some(value) = keys.get(field) else {
                continue;
            };
            let name = format!("data ({})", field.column());
            if field == KeyField::InputOoi {
                check_length(
                    &name,
                    value,
                    REFERENCE_MAX_CHARS,
                    "the longest object reference stored",
                )?;
            } else {
                self.check_text(&name, value)?;
            }
        }
        Ok(())
    }

    /// Checks a payload: its nesting, and no NUL in any key or string. Its key fields are
    /// checked for length once they are read ([`super::keys`]).
    pub fn check_json(&self, field: &str, value: &Value) -> Result<(), LimitError> {
        self.walk(field, vec![(value, 1)])
    }

    /// [`Limits::check_json`] for a payload object.
    pub fn check_object(&self, field: &str, map: &Map<String, Value>) -> Result<(), LimitError> {
        if map.keys().any(|k| k.contains('\0')) {
            return Err(LimitError(format!(
                "{field}: a key contains a NUL character, which is not allowed"
            )));
        }
        self.walk(field, map.values().map(|v| (v, 2)).collect())
    }

    fn walk(&self, field: &str, mut stack: Vec<(&Value, usize)>) -> Result<(), LimitError> {
        // Iterative, so a deeply nested payload cannot exhaust the stack before it is refused.
        while let Some((v, depth)) = stack.pop() {
            // Depth counts objects and arrays, the payload itself being 1.
            if depth > self.max_json_depth && (v.is_object() || v.is_array()) {
                return Err(LimitError(format!(
                    "{field}: nested deeper than the limit of {} (max_json_depth)",
                    self.max_json_depth
                )));
            }
            match v {
                Value::String(s) if s.contains('\0') => {
                    return Err(LimitError(format!(
                        "{field}: a string contains a NUL character, which is not allowed"
                    )));
                }
                Value::Array(items) => stack.extend(items.iter().map(|i| (i, depth + 1))),
                Value::Object(map) => {
                    for (k, item) in map {
                        if k.contains('\0') {
                            return Err(LimitError(format!(
                                "{field}: a key contains a NUL character, which is not allowed"
                            )));
                        }
                        stack.push((item, depth + 1));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Checks how deeply the `filters` of a request body nest: each list, and each object of
    /// combinators with its lists, is one level (as the API document's schema counts them).
    pub fn check_filter_nesting(&self, filters: &Value) -> Result<(), LimitError> {
        fn nesting(v: &Value) -> usize {
            match v {
                Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
                Value::Object(o) if !o.contains_key("column") => {
                    1 + o
                        .values()
                        .filter_map(Value::as_array)
                        .flatten()
                        .map(nesting)
                        .max()
                        .unwrap_or(0)
                }
                _ => 0,
            }
        }
        let depth = nesting(filters);
        if depth > self.max_filter_depth {
            return Err(LimitError(format!(
                "filters: nested {depth} deep, more than the limit of {} (max_filter_depth)",
                self.max_filter_depth
            )));
        }
        Ok(())
    }

    /// Checks a parsed filter: conditions, list lengths and every text value (its nesting is
    /// checked on the body, [`Limits::check_filter_nesting`]).
    pub fn check_filter(&self, node: &FilterNode) -> Result<(), LimitError> {
        let mut conditions = 0usize;
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            match n {
                FilterNode::And(items) | FilterNode::Or(items) | FilterNode::Not(items) => {
                    stack.extend(items.iter());
                }
                FilterNode::Cond(c) => {
                    conditions += 1;
                    if conditions > self.max_filter_conditions {
                        return Err(LimitError(format!(
                            "filters: more than the limit of {} conditions (max_filter_conditions)",
                            self.max_filter_conditions
                        )));
                    }
                    if !c.path.is_empty() {
                        self.check_text("filters.field", &c.path.join("__"))?;
                    }
                    let values: &[Scalar] = match &c.operand {
                        Operand::None => &[],
                        Operand::One(s) => std::slice::from_ref(s),
                        Operand::Many(items) => {
                            if items.len() > self.max_in_values {
                                return Err(LimitError(format!(
                                    "filters: a list of {} values, more than the limit of {} (max_in_values)",
                                    items.len(),
                                    self.max_in_values
                                )));
                            }
                            items
                        }
                    };
                    for v in values {
                        if let Scalar::Text(s) = v {
                            check_filter_value(s)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// A filter value: no NUL, at most [`FILTER_VALUE_MAX_CHARS`].
fn check_filter_value(value: &str) -> Result<(), LimitError> {
    if value.contains('\0') {
        return Err(LimitError(
            "filters.value: contains a NUL character, which is not allowed".into(),
        ));
    }
    if value.len() > FILTER_VALUE_MAX_CHARS {
        let chars = value.chars().count();
        if chars > FILTER_VALUE_MAX_CHARS {
            return Err(LimitError(format!(
                "filters.value: {chars} characters, more than the {FILTER_VALUE_MAX_CHARS} a filter value may have"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use serde_json::json;

    fn filter(v: Value) -> FilterNode {
        parse_request(&json!({ "filters": v })).unwrap()
    }

    #[test]
    fn an_objects_reference_may_be_longer_than_the_other_key_fields() {
        let l = Limits::default();
        let keys = |plugin: &str, reference: &str| DataKeys {
            plugin_id: Some(plugin.to_owned()),
            input_ooi: Some(reference.to_owned()),
            ..DataKeys::default()
        };
        let url = "u".repeat(REFERENCE_MAX_CHARS);
        assert_eq!(l.check_keys(&keys("nmap", &url)), Ok(()));
        let over = l.check_keys(&keys("nmap", &format!("{url}u"))).unwrap_err();
        assert!(
            over.0.starts_with("data (input_ooi): 8193 characters"),
            "{over}"
        );
        let plugin = "p".repeat(DEFAULT_MAX_STRING_CHARS + 1);
        let over = l
            .check_keys(&keys(&plugin, "Hostname|internet|a.nl"))
            .unwrap_err();
        assert!(
            over.0.contains("(plugin_id)") && over.0.contains("max_string_chars"),
            "{over}"
        );
        assert!(l.check_keys(&keys("nmap", "a\0b")).is_err());
    }

    #[test]
    fn each_limit_is_named_when_it_is_passed() {
        let l = Limits {
            max_filter_conditions: 2,
            max_filter_depth: 1,
            max_in_values: 3,
            max_string_chars: 5,
            max_json_depth: 2,
            max_offset: 10,
        };
        let c = json!({"column": "organisation", "value": "a"});
        assert!(l.check_filter(&filter(json!([c, c]))).is_ok());
        assert!(
            l.check_filter(&filter(json!([c, c, c])))
                .unwrap_err()
                .0
                .contains("max_filter_conditions")
        );
        let deep = json!({"and": [{"or": [c]}]});
        assert!(l.check_filter_nesting(&json!({"and": [c]})).is_ok());
        assert!(
            l.check_filter_nesting(&deep)
                .unwrap_err()
                .0
                .contains("max_filter_depth")
        );
        assert!(
            l.check_filter_nesting(&json!([[c]])).is_err(),
            "a list in a list"
        );
        let list =
            json!([{"column": "organisation", "operator": "in", "value": ["a", "b", "c", "d"]}]);
        assert!(
            l.check_filter(&filter(list))
                .unwrap_err()
                .0
                .contains("max_in_values")
        );
        // A filter value is only compared: an object's long reference finds its tasks.
        let reference = format!("URL|internet|https://example.nl/{}", "a".repeat(2_000));
        let long = json!([{"column": "organisation", "value": reference}]);
        assert!(l.check_filter(&filter(long)).is_ok());
        let too_long = "a".repeat(FILTER_VALUE_MAX_CHARS + 1);
        let too_long = json!([{"column": "organisation", "value": too_long}]);
        assert!(
            l.check_filter(&filter(too_long))
                .unwrap_err()
                .0
                .contains("a filter value may have")
        );
        assert!(l.check_json("data", &json!({"a": {"b": 1}})).is_ok());
        assert!(
            l.check_json("data", &json!({"a": {"b": [1]}}))
                .unwrap_err()
                .0
                .contains("max_json_depth")
        );
    }

    #[test]
    fn nul_characters_are_refused_in_keys_values_and_filters() {
        let l = Limits::default();
        assert!(l.check_text("organisation", "org\u{0}1").is_err());
        assert!(l.check_json("data", &json!({"k": "a\u{0}"})).is_err());
        assert!(l.check_json("data", &json!({"k\u{0}": 1})).is_err());
        let f = filter(json!([{"column": "organisation", "value": "\u{0}"}]));
        assert!(l.check_filter(&f).unwrap_err().0.contains("NUL"));
    }
}
