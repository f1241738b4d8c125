//! `[limits]`: how large inputs may be. The settings are [`crate::domain::limits::Limits`], with
//! their defaults: the domain checks every input against them and must not depend on config;
//! what config adds is the ceilings the storage imposes, checked at start.

use crate::domain::limits::Limits;

use super::ConfigError;

/// `limits.max_string_chars` at most: PostgreSQL refuses an index entry over 2,704 bytes, a
/// character takes up to four, and key fields are indexed with a few more columns.
pub const MAX_STRING_CHARS_CEILING: usize = 600;
/// `limits.max_filter_depth` at most.
pub const MAX_FILTER_DEPTH_CEILING: usize = 64;
/// Highest `max_json_depth`: the JSON parser stops at 128 levels, and a payload sits a few
/// levels inside the request's body (past this, a deep payload met the parser's limit first and
/// was answered 422 without naming the setting).
pub const MAX_JSON_DEPTH_CEILING: usize = 120;
/// `limits.max_in_values` at most: a list is bound value by value, and PostgreSQL takes at most
/// 65,535 bound values in one statement.
pub const MAX_IN_VALUES_CEILING: usize = 30_000;

/// Refuses a zero limit, a negative offset, and a limit beyond what the storage can take.
pub fn validate_limits(l: &Limits) -> Result<(), ConfigError> {
    for (key, value) in [
        ("limits.max_filter_conditions", l.max_filter_conditions),
        ("limits.max_filter_depth", l.max_filter_depth),
        ("limits.max_in_values", l.max_in_values),
        ("limits.max_string_chars", l.max_string_chars),
        ("limits.max_json_depth", l.max_json_depth),
    ] {
        ConfigError::at_least_one(key, value)?;
    }
    if l.max_string_chars > MAX_STRING_CHARS_CEILING {
        return Err(ConfigError::setting(
            "limits.max_string_chars",
            format!(
                "at most {MAX_STRING_CHARS_CEILING}: longer values do not fit an index entry in PostgreSQL"
            ),
        ));
    }
    if l.max_filter_depth > MAX_FILTER_DEPTH_CEILING {
        return Err(ConfigError::setting(
            "limits.max_filter_depth",
            format!("at most {MAX_FILTER_DEPTH_CEILING}: the JSON parser stops at 128 levels"),
        ));
    }
    if l.max_json_depth > MAX_JSON_DEPTH_CEILING {
        return Err(ConfigError::setting(
            "limits.max_json_depth",
            format!(
                "at most {MAX_JSON_DEPTH_CEILING}: the JSON parser stops at 128 levels, and a payload sits inside the request's body"
            ),
        ));
    }
    if l.max_in_values > MAX_IN_VALUES_CEILING {
        return Err(ConfigError::setting(
            "limits.max_in_values",
            format!(
                "at most {MAX_IN_VALUES_CEILING}: a statement takes at most 65,535 bound values"
            ),
        ));
    }
    if l.max_offset < 0 {
        return Err(ConfigError::setting(
            "limits.max_offset",
            "must not be negative",
        ));
    }
    Ok(())
}
