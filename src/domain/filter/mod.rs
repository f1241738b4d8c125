//! The filter language of pop, `/tasks` and schedule search: parsed once, at the edge, into a
//! typed tree that the storage layer turns into SQL.
//!
//! Wire format (mula's): `{"filters": [F, …]}` means all of them; `{"filters": {"and": […],
//! "or": […], "not": […]}}` combines (several keys are ANDed; list items may nest further
//! combinators). `F = {column, field?, operator = "eq", value}`; `field` walks into the JSON
//! `data` column with `__` between keys (`boefje__id` is `data.boefje.id`).
//! `not: [A, B]` means neither A nor B.
//!
//! Every error names where it is (`filters[1].operator`) and what is wrong.
//!
//! [`eval`] evaluates a tree against one task in memory with SQL's semantics; [`plan`] finds the
//! key-field lookups a tree allows.

pub mod eval;
pub mod plan;

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, Utc};
use serde_json::{Map, Value};

use super::TaskStatus;
use super::payload::kind;

/// A filter that cannot be understood; the message names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FilterError(pub String);

/// A parsed filter tree.
#[derive(Debug, Clone, PartialEq)]
pub enum FilterNode {
    /// Every child holds.
    And(Vec<FilterNode>),
    /// At least one child holds.
    Or(Vec<FilterNode>),
    /// No child holds.
    Not(Vec<FilterNode>),
    /// One comparison.
    Cond(Condition),
}

impl FilterNode {
    /// `column` (at `path` inside `data`) equals the text `value`.
    pub fn equals(column: Column, path: &[&str], value: &str) -> FilterNode {
        FilterNode::Cond(Condition {
            column,
            path: path.iter().map(|p| (*p).to_owned()).collect(),
            op: Operator::Eq,
            operand: Operand::One(Scalar::Text(value.to_owned())),
        })
    }
}

/// A filterable column of the `tasks` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// `id`
    Id,
    /// `scheduler_id`
    SchedulerId,
    /// `schedule_id`
    ScheduleId,
    /// `organisation`
    Organisation,
    /// `type`
    Type,
    /// `hash`
    Hash,
    /// `priority`
    Priority,
    /// `status`
    Status,
    /// `created_at`
    CreatedAt,
    /// `modified_at`
    ModifiedAt,
    /// `data`, with a `field` path
    Data,
    /// `enabled` (schedules)
    Enabled,
    /// `schedule`, the cron expression (schedules)
    Schedule,
    /// `deadline_at` (schedules)
    DeadlineAt,
}

/// Which table a filter selects from: each has its own columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `tasks`
    Tasks,
    /// `schedules`
    Schedules,
}

impl Table {
    /// The columns a filter on this table may name.
    fn columns(self) -> &'static [Column] {
        match self {
            Table::Tasks => &[
                Column::Id,
                Column::SchedulerId,
                Column::ScheduleId,
                Column::Organisation,
                Column::Type,
                Column::Hash,
                Column::Priority,
                Column::Status,
                Column::CreatedAt,
                Column::ModifiedAt,
                Column::Data,
            ],
            Table::Schedules => &[
                Column::Id,
                Column::SchedulerId,
                Column::Organisation,
                Column::Hash,
                Column::Data,
                Column::Enabled,
                Column::Schedule,
                Column::DeadlineAt,
                Column::CreatedAt,
                Column::ModifiedAt,
            ],
        }
    }
}

const COLUMNS: [(&str, Column); 14] = [
    ("id", Column::Id),
    ("scheduler_id", Column::SchedulerId),
    ("schedule_id", Column::ScheduleId),
    ("organisation", Column::Organisation),
    ("type", Column::Type),
    ("hash", Column::Hash),
    ("priority", Column::Priority),
    ("status", Column::Status),
    ("created_at", Column::CreatedAt),
    ("modified_at", Column::ModifiedAt),
    ("data", Column::Data),
    ("enabled", Column::Enabled),
    ("schedule", Column::Schedule),
    ("deadline_at", Column::DeadlineAt),
];

impl Column {
    /// The SQL column name.
    pub fn sql_name(self) -> &'static str {
        COLUMNS
            .iter()
            .find(|(_, c)| *c == self)
            .map(|(n, _)| *n)
            .unwrap_or("id")
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// `==`, `eq`
    Eq,
    /// `!=`, `ne`
    Ne,
    /// `<`, `lt`
    Lt,
    /// `<=`, `lte`
    Le,
    /// `>`, `gt`
    Gt,
    /// `>=`, `gte`
    Ge,
    /// `in`
    In,
    /// `not_in`
    NotIn,
    /// `is_null`, `is`
    IsNull,
    /// `is_not_null`, `is_not`
    IsNotNull,
    /// `like` (case-sensitive, `%` and `_` wildcards, `\` escapes)
    Like,
    /// `not_like`
    NotLike,
    /// `ilike` (case-insensitive like)
    ILike,
    /// `not_ilike`
    NotILike,
}

const OPERATORS: [(&str, Operator); 22] = [
    ("==", Operator::Eq),
    ("eq", Operator::Eq),
    ("!=", Operator::Ne),
    ("ne", Operator::Ne),
    ("<", Operator::Lt),
    ("lt", Operator::Lt),
    ("<=", Operator::Le),
    ("lte", Operator::Le),
    (">", Operator::Gt),
    ("gt", Operator::Gt),
    (">=", Operator::Ge),
    ("gte", Operator::Ge),
    ("in", Operator::In),
    ("not_in", Operator::NotIn),
    ("is_null", Operator::IsNull),
    ("is", Operator::IsNull),
    ("is_not_null", Operator::IsNotNull),
    ("is_not", Operator::IsNotNull),
    ("like", Operator::Like),
    ("not_like", Operator::NotLike),
    ("ilike", Operator::ILike),
    ("not_ilike", Operator::NotILike),
];

/// One typed value to compare against.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    /// Text comparison.
    Text(String),
    /// Integer comparison.
    Int(i64),
    /// Numeric comparison.
    Float(f64),
    /// Boolean comparison (JSON fields only).
    Bool(bool),
    /// Timestamp comparison (UTC).
    Time(NaiveDateTime),
}

/// The right-hand side of a condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    /// `is_null` / `is_not_null` take none.
    None,
    /// One value.
    One(Scalar),
    /// The list of `in` / `not_in` (may be empty).
    Many(Vec<Scalar>),
}

/// One comparison: `column[.field…] operator operand`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// The column.
    pub column: Column,
    /// For `data`: the keys to walk, outermost first.
    pub path: Vec<String>,
    /// The operator.
    pub op: Operator,
    /// The typed value.
    pub operand: Operand,
}

/// How a condition on a `data` field reads the field, chosen by the type of the value it compares
/// with: numbers compare only with JSON numbers, booleans only with JSON booleans, and anything
/// else compares the field's text form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonAs {
    /// The text form (PostgreSQL's `#>>`).
    Text,
    /// JSON numbers only.
    Number,
    /// JSON booleans only.
    Bool,
}

impl Condition {
    /// How this condition reads a `data` field.
    pub fn json_as(&self) -> JsonAs {
        let first = match &self.operand {
            Operand::One(s) => Some(s),
            Operand::Many(items) => items.first(),
            Operand::None => None,
        };
        match first {
            Some(Scalar::Int(_) | Scalar::Float(_)) => JsonAs::Number,
            Some(Scalar::Bool(_)) => JsonAs::Bool,
            _ => JsonAs::Text,
        }
    }
}

/// Parses the body of a filtered request on tasks (`{"filters": …}`).
pub fn parse_request(body: &Value) -> Result<FilterNode, FilterError> {
    parse_request_on(body, Table::Tasks)
}

/// Parses the body of a filtered request on `table`.
pub fn parse_request_on(body: &Value, table: Table) -> Result<FilterNode, FilterError> {
    let Value::Object(obj) = body else {
        return Err(FilterError(format!(
            "body: expected an object with a 'filters' key, got {}",
            kind(body)
        )));
    };
    for key in obj.keys() {
        if key != "filters" {
            return Err(FilterError(format!(
                "body.{key}: unknown key; a filter body has only 'filters'"
            )));
        }
    }
    match obj.get("filters") {
        Some(filters) => parse_group(filters, "filters", table),
        None => Err(FilterError("body.filters: required".into())),
    }
}

fn parse_group(v: &Value, path: &str, table: Table) -> Result<FilterNode, FilterError> {
    match v {
        Value::Array(items) => Ok(FilterNode::And(parse_list(items, path, table)?)),
        Value::Object(obj) if obj.contains_key("column") => {
            Ok(FilterNode::Cond(parse_condition(obj, path, table)?))
        }
        Value::Object(obj) => {
            let mut parts = Vec::new();
            for (key, value) in obj {
                let here = format!("{path}.{key}");
                let Value::Array(items) = value else {
                    return Err(FilterError(format!(
                        "{here}: expected a list of filters, got {}",
                        kind(value)
                    )));
                };
                let list = parse_list(items, &here, table)?;
                parts.push(match key.as_str() {
                    "and" => FilterNode::And(list),
                    "or" => FilterNode::Or(list),
                    "not" => FilterNode::Not(list),
                    other => {
                        return Err(FilterError(format!(
                            "{path}: unknown combinator '{other}'; use 'and', 'or' or 'not'"
                        )));
                    }
                });
            }
            if parts.is_empty() {
                return Err(FilterError(format!(
                    "{path}: empty; give a list of filters or 'and'/'or'/'not'"
                )));
            }
            Ok(if parts.len() == 1 {
                parts.remove(0)
            } else {
                FilterNode::And(parts)
            })
        }
        other => Err(FilterError(format!(
            "{path}: expected a list of filters or an object with 'and'/'or'/'not', got {}",
            kind(other)
        ))),
    }
}

fn parse_list(items: &[Value], path: &str, table: Table) -> Result<Vec<FilterNode>, FilterError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_group(item, &format!("{path}[{i}]"), table))
        .collect()
}

fn parse_condition(
    obj: &Map<String, Value>,
    path: &str,
    table: Table,
) -> Result<Condition, FilterError> {
    for key in obj.keys() {
        if !matches!(key.as_str(), "column" | "field" | "operator" | "value") {
            return Err(FilterError(format!(
                "{path}.{key}: unknown key; a filter has 'column', 'field', 'operator' and 'value'"
            )));
        }
    }
    let column_name = match obj.get("column") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(FilterError(format!(
                "{path}.column: expected a string, got {}",
                kind(other)
            )));
        }
        None => return Err(FilterError(format!("{path}.column: required"))),
    };
    let allowed = table.columns();
    let column = COLUMNS
        .iter()
        .find(|(n, c)| *n == column_name && allowed.contains(c))
        .map(|(_, c)| *c)
        .ok_or_else(|| {
            let known: Vec<&str> = allowed.iter().map(|c| c.sql_name()).collect();
            FilterError(format!(
                "{path}.column: unknown column '{column_name}'; known columns: {}",
                known.join(", ")
            ))
        })?;
    let path_keys = match (obj.get("field"), column) {
        (None | Some(Value::Null), Column::Data) => {
            return Err(FilterError(format!(
                "{path}.field: required with column 'data' (e.g. 'boefje__id')"
            )));
        }
        (None | Some(Value::Null), _) => Vec::new(),
        (Some(Value::String(field)), Column::Data) => parse_field(field, path)?,
        (Some(Value::String(_)), _) => {
            return Err(FilterError(format!(
                "{path}.field: only the 'data' column has fields"
            )));
        }
        (Some(other), _) => {
            return Err(FilterError(format!(
                "{path}.field: expected a string, got {}",
                kind(other)
            )));
        }
    };
    let op = match obj.get("operator") {
        None | Some(Value::Null) => Operator::Eq,
        Some(Value::String(s)) => OPERATORS
            .iter()
            .find(|(n, _)| *n == s.as_str())
            .map(|(_, o)| *o)
            .ok_or_else(|| {
                let known: Vec<&str> = OPERATORS.iter().map(|(n, _)| *n).collect();
                FilterError(format!(
                    "{path}.operator: unknown operator '{s}'; supported: {}",
                    known.join(", ")
                ))
            })?,
        Some(other) => {
            return Err(FilterError(format!(
                "{path}.operator: expected a string, got {}",
                kind(other)
            )));
        }
    };
    let value = obj.get("value").unwrap_or(&Value::Null);
    // mula's `is` and `is_not` compare with their value (SQL's `enabled IS true`); with none, or
    // null, they test for null. Any other value is SQL's error there, a 400 here.
    let op = match (obj.get("operator").and_then(Value::as_str), value) {
        (Some("is"), Value::Bool(_)) => Operator::Eq,
        (Some("is_not"), Value::Bool(_)) => Operator::Ne,
        (Some(name @ ("is" | "is_not")), v) if !v.is_null() => {
            return Err(FilterError(format!(
                "{path}.value: '{name}' takes true, false or null, got {}",
                kind(v)
            )));
        }
        _ => op,
    };
    let (op, operand) = typed_operand(column, op, value, &format!("{path}.value"))?;
    Ok(Condition {
        column,
        path: path_keys,
        op,
        operand,
    })
}

fn parse_field(field: &str, path: &str) -> Result<Vec<String>, FilterError> {
    // A key is letters, digits and '-', with single '_' inside (`oci_image`), so that splitting
    // on '__' gives back exactly the keys (`___x` would have an empty first key).
    let keys: Vec<String> = field.split("__").map(str::to_owned).collect();
    for key in &keys {
        let ok = !key.is_empty()
            && !key.starts_with('_')
            && !key.ends_with('_')
            && !key.contains("__")
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(FilterError(format!(
                "{path}.field: '{field}' is not a key path; use keys of letters, digits and '-' (with single '_' inside) joined by '__'"
            )));
        }
    }
    Ok(keys)
}

fn typed_operand(
    column: Column,
    op: Operator,
    value: &Value,
    path: &str,
) -> Result<(Operator, Operand), FilterError> {
    match op {
        Operator::IsNull | Operator::IsNotNull => Ok((op, Operand::None)),
        // SQL's `= NULL` matches nothing; mula (SQLAlchemy) turns it into IS NULL.
        Operator::Eq if value.is_null() => Ok((Operator::IsNull, Operand::None)),
        Operator::Ne if value.is_null() => Ok((Operator::IsNotNull, Operand::None)),
        Operator::In | Operator::NotIn => {
            let Value::Array(items) = value else {
                return Err(FilterError(format!(
                    "{path}: operator needs a list, got {}",
                    kind(value)
                )));
            };
            let scalars = items
                .iter()
                .enumerate()
                .map(|(i, v)| scalar(column, v, &format!("{path}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(first) = scalars.first() {
                // Integers and other numbers are one type, as in JSON.
                let kind = |s: &Scalar| match s {
                    Scalar::Int(_) | Scalar::Float(_) => 0,
                    Scalar::Text(_) => 1,
                    Scalar::Bool(_) => 2,
                    Scalar::Time(_) => 3,
                };
                let same = scalars.iter().all(|s| kind(s) == kind(first));
                if !same {
                    return Err(FilterError(format!(
                        "{path}: list items must all have the same type"
                    )));
                }
            }
            Ok((op, Operand::Many(scalars)))
        }
        Operator::Like | Operator::NotLike | Operator::ILike | Operator::NotILike => {
            if !matches!(
                column,
                Column::Data
                    | Column::Organisation
                    | Column::Hash
                    | Column::Type
                    | Column::SchedulerId
                    | Column::Id
                    | Column::ScheduleId
                    | Column::Schedule
            ) {
                return Err(FilterError(format!(
                    "{path}: pattern operators apply to text columns and data fields only"
                )));
            }
            match value {
                // PostgreSQL refuses a pattern ending in its escape character (an error, which
                // was a 500), while SQLite and the heap read the backslash as itself.
                Value::String(s) if s.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1 => {
                    Err(FilterError(format!(
                        "{path}: a pattern must not end with the escape character '\\' (write '\\\\' for a backslash)"
                    )))
                }
                Value::String(s) => Ok((op, Operand::One(Scalar::Text(s.clone())))),
                other => Err(FilterError(format!(
                    "{path}: a pattern must be a string, got {}",
                    kind(other)
                ))),
            }
        }
        _ => {
            if value.is_array() {
                return Err(FilterError(format!(
                    "{path}: a list needs operator 'in' or 'not_in'"
                )));
            }
            Ok((op, Operand::One(scalar(column, value, path)?)))
        }
    }
}

fn scalar(column: Column, value: &Value, path: &str) -> Result<Scalar, FilterError> {
    let wrong = |want: &str| {
        FilterError(format!(
            "{path}: column '{}' compares with {want}, got {}",
            column.sql_name(),
            kind(value)
        ))
    };
    match column {
        Column::Priority => value
            .as_number()
            .and_then(as_integer)
            .map(Scalar::Int)
            .ok_or_else(|| wrong("an integer")),
        Column::Enabled => value
            .as_bool()
            .map(Scalar::Bool)
            .ok_or_else(|| wrong("true or false")),
        Column::CreatedAt | Column::ModifiedAt | Column::DeadlineAt => match value {
            Value::String(s) => parse_datetime(s).map(Scalar::Time).ok_or_else(|| {
                FilterError(format!(
                    "{path}: '{s}' is not a date-time (use ISO 8601, e.g. 2025-01-31T12:00:00Z)"
                ))
            }),
            _ => Err(wrong("an ISO 8601 date-time string")),
        },
        Column::Status => match value {
            Value::String(s) => s
                .parse::<TaskStatus>()
                .map(|st| Scalar::Text(st.as_str().to_owned()))
                .map_err(|()| {
                    let known: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
                    FilterError(format!(
                        "{path}: unknown status '{s}'; known: {}",
                        known.join(", ")
                    ))
                }),
            _ => Err(wrong("a status string")),
        },
        Column::Data => match value {
            Value::String(s) => Ok(Scalar::Text(s.clone())),
            Value::Bool(b) => Ok(Scalar::Bool(*b)),
            Value::Number(n) => Ok(n
                .as_i64()
                .map(Scalar::Int)
                .unwrap_or_else(|| Scalar::Float(n.as_f64().unwrap_or(0.0)))),
            _ => Err(wrong("a string, number or boolean")),
        },
        Column::Id
        | Column::SchedulerId
        | Column::ScheduleId
        | Column::Organisation
        | Column::Type
        | Column::Hash
        | Column::Schedule => match value {
            Value::String(s) => Ok(Scalar::Text(s.clone())),
            _ => Err(wrong("a string")),
        },
    }
}

/// A JSON number as an `i64`, if it is an integer in range (`5`, or `5.0` as JSON Schema counts
/// it). A number written with a fraction or exponent is taken only within ±2^53, where a double
/// holds every integer exactly: beyond, `-9223372036854775809` and `-9223372036854775808.0` are
/// the same double, and only the second is in range.
pub fn as_integer(n: &serde_json::Number) -> Option<i64> {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    n.as_i64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() <= EXACT)
            .map(|f| f as i64)
    })
}

#[cfg(test)]
mod integer_tests {
    use super::as_integer;

    #[test]
    fn an_integer_written_with_a_fraction_is_read_exactly() {
        // Without serde_json's correctly rounded parsing this one reads back half a unit off
        // (-3972287107741433.5), and a schema-valid priority would be refused.
        let n: serde_json::Number = serde_json::from_str("-3972287107741434.0").unwrap();
        assert_eq!(as_integer(&n), Some(-3_972_287_107_741_434));
        let n: serde_json::Number = serde_json::from_str("-3.972287107741434e15").unwrap();
        assert_eq!(as_integer(&n), Some(-3_972_287_107_741_434));
        let n: serde_json::Number = serde_json::from_str("2.5").unwrap();
        assert_eq!(as_integer(&n), None);
    }
}

/// Parses the date-times clients send: RFC 3339 (any offset, turned into UTC), a naive
/// `YYYY-MM-DD[T ]HH:MM:SS[.f]` taken as UTC, or a bare date (midnight UTC). Years are 0 to
/// 9999, as ISO 8601 writes them without an agreement: SQLite keeps times as text, where
/// `+10000-01-01` sorts before `2025` (a schedule due then fired at once, and a listing up to
/// it found nothing), so a year of five digits or a sign is refused as PostgreSQL would not.
pub fn parse_datetime(s: &str) -> Option<NaiveDateTime> {
    parse_any_datetime(s).filter(|t| (0..=9999).contains(&t.year()))
}

fn parse_any_datetime(s: &str) -> Option<NaiveDateTime> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc).naive_utc());
    }
    for fmt in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, fmt) {
            return Some(t);
        }
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        parse_request(&v).unwrap_err().0
    }

    #[test]
    fn a_plain_list_is_an_and_of_conditions() {
        let node = parse_request(&json!({"filters": [
            {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["a", "b"]},
            {"column": "organisation", "value": "org1"}
        ]}))
        .unwrap();
        let FilterNode::And(items) = node else {
            panic!("not an and")
        };
        assert_eq!(items.len(), 2);
        assert_eq!(
            items[0],
            FilterNode::Cond(Condition {
                column: Column::Data,
                path: vec!["boefje".into(), "oci_image".into()],
                op: Operator::In,
                operand: Operand::Many(vec![Scalar::Text("a".into()), Scalar::Text("b".into())]),
            })
        );
        // operator defaults to eq
        assert!(matches!(&items[1], FilterNode::Cond(c) if c.op == Operator::Eq));
    }

    #[test]
    fn combinators_nest() {
        let node = parse_request(&json!({"filters": {"or": [
            {"column": "priority", "operator": "<", "value": 3},
            {"and": [{"column": "status", "operator": "==", "value": "QUEUED"}]}
        ], "not": [{"column": "hash", "operator": "is_null"}]}}))
        .unwrap();
        let FilterNode::And(parts) = node else {
            panic!("expected and")
        };
        assert!(matches!(parts[0], FilterNode::Or(_)));
        assert!(matches!(parts[1], FilterNode::Not(_)));
    }

    #[test]
    fn an_unknown_column_is_named() {
        assert!(
            err(json!({"filters": [{"column": "colour", "value": 1}]}))
                .starts_with("filters[0].column: unknown column 'colour'")
        );
    }

    #[test]
    fn an_unknown_operator_is_named() {
        assert!(
            err(json!({"filters": {"and": [{"column": "organisation", "operator": "equals", "value": "x"}]}}))
                .starts_with("filters.and[0].operator: unknown operator 'equals'")
        );
    }

    #[test]
    fn values_are_checked_against_the_column_type() {
        assert!(
            err(json!({"filters": [{"column": "priority", "value": "high"}]}))
                .contains("compares with an integer")
        );
        assert!(
            err(json!({"filters": [{"column": "created_at", "operator": ">", "value": "yesterday"}]}))
                .contains("is not a date-time")
        );
        assert!(
            err(json!({"filters": [{"column": "status", "value": "done"}]}))
                .contains("unknown status 'done'")
        );
        assert!(
            err(json!({"filters": [{"column": "organisation", "operator": "in", "value": "x"}]}))
                .contains("needs a list")
        );
    }

    #[test]
    fn data_needs_a_field_and_other_columns_refuse_one() {
        assert!(err(json!({"filters": [{"column": "data", "value": "x"}]})).contains("required"));
        assert!(
            err(json!({"filters": [{"column": "status", "field": "a", "value": "queued"}]}))
                .contains("only the 'data' column")
        );
        assert!(
            err(json!({"filters": [{"column": "data", "field": "a.b", "value": "x"}]}))
                .contains("not a key path")
        );
        assert!(
            err(json!({"filters": [{"column": "data", "field": "___b", "value": "x"}]}))
                .contains("not a key path")
        );
    }

    #[test]
    fn equality_with_null_becomes_is_null() {
        let node = parse_request(
            &json!({"filters": [{"column": "hash", "operator": "==", "value": null}]}),
        )
        .unwrap();
        let FilterNode::And(items) = node else {
            panic!()
        };
        assert!(matches!(&items[0], FilterNode::Cond(c) if c.op == Operator::IsNull));
    }

    #[test]
    fn date_times_parse_in_the_forms_clients_send() {
        let want = NaiveDate::from_ymd_opt(2025, 1, 31)
            .unwrap()
            .and_hms_opt(12, 0, 0)
            .unwrap();
        assert_eq!(parse_datetime("2025-01-31T12:00:00Z"), Some(want));
        assert_eq!(parse_datetime("2025-01-31T13:00:00+01:00"), Some(want));
        assert_eq!(parse_datetime("2025-01-31T12:00:00"), Some(want));
        assert_eq!(
            parse_datetime("2025-01-31"),
            Some(want - chrono::Duration::hours(12))
        );
        assert_eq!(parse_datetime("31/01/2025"), None);
        for far in [
            "+10000-01-01T00:00:00",
            "+10000-01-01",
            "-0001-01-01T00:00:00",
        ] {
            assert_eq!(parse_datetime(far), None, "{far}");
        }
        assert!(parse_datetime("9999-12-31T23:59:59Z").is_some());
    }
}
