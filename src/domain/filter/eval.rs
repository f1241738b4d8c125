//! Evaluates a filter against one task in memory, with the semantics of the SQL the storage layer
//! writes for the same tree, so a pop served from memory selects exactly what a query would.
//!
//! SQL's three-valued logic is kept: a comparison with a missing value is *unknown*, `NOT
//! unknown` is unknown, and only a tree that is *true* selects the task. So
//! `data.input_ooi != 'x'` does not select a task without an `input_ooi`, as in SQL.
//!
//! Text compares byte by byte (the C collation the PostgreSQL cluster uses); a `data` field
//! compares as text in its [`text_form`] (PostgreSQL's `#>>`),
//! as a number only when it is a JSON number, and as a boolean only when it is a JSON boolean.

use std::borrow::Cow;
use std::cmp::Ordering;

use chrono::NaiveDateTime;
use serde_json::Value;
use uuid::Uuid;

use super::{Column, Condition, FilterNode, JsonAs, Operand, Operator, Scalar};
use crate::domain::keys::text_form;

/// A `data` field as a record knows it.
#[derive(Debug, Clone, Copy)]
pub enum Json<'a> {
    /// Absent (or the record does not hold it; see [`super::plan::Plan::needs_payload`]).
    Missing,
    /// The JSON value itself.
    Value(&'a Value),
    /// Only the field's text form (a key field held apart from the payload).
    Text(&'a str),
}

/// What the evaluator reads of a task.
pub trait Record {
    /// A text column (`id`, `scheduler_id`, `schedule_id`, `organisation`, `type`, `hash`,
    /// `status`); `None` is SQL NULL.
    fn text(&self, column: Column) -> Option<Cow<'_, str>>;
    /// The `priority` column.
    fn priority(&self) -> i64;
    /// A time column (`created_at`, `modified_at`).
    fn time(&self, column: Column) -> Option<NaiveDateTime>;
    /// The `data` field at `path`.
    fn json(&self, path: &[String]) -> Json<'_>;
}

/// The value at `path` in a payload; JSON null counts as missing, as in SQL.
pub fn json_at<'a>(data: &'a Value, path: &[String]) -> Json<'a> {
    let mut v = data;
    for key in path {
        match v.get(key) {
            Some(next) => v = next,
            None => return Json::Missing,
        }
    }
    if v.is_null() {
        Json::Missing
    } else {
        Json::Value(v)
    }
}

/// Whether `node` selects the task (true, not false or unknown).
pub fn matches(node: &FilterNode, record: &impl Record) -> bool {
    eval(node, record) == Some(true)
}

/// Three-valued evaluation: `None` is SQL's unknown.
pub fn eval(node: &FilterNode, record: &impl Record) -> Option<bool> {
    match node {
        FilterNode::And(items) => {
            let mut unknown = false;
            for item in items {
                match eval(item, record) {
                    Some(false) => return Some(false),
                    None => unknown = true,
                    Some(true) => {}
                }
            }
            if unknown { None } else { Some(true) }
        }
        FilterNode::Or(items) => any(items, record),
        // `not: [A, B]` is NOT (A OR B); an empty list holds.
        FilterNode::Not(items) if items.is_empty() => Some(true),
        FilterNode::Not(items) => any(items, record).map(|b| !b),
        FilterNode::Cond(cond) => condition(cond, record),
    }
}

fn any(items: &[FilterNode], record: &impl Record) -> Option<bool> {
    let mut unknown = false;
    for item in items {
        match eval(item, record) {
            Some(true) => return Some(true),
            None => unknown = true,
            Some(false) => {}
        }
    }
    if unknown { None } else { Some(false) }
}

/// A column's value as SQL sees it.
#[derive(Debug)]
enum Sql<'a> {
    Null,
    Text(Cow<'a, str>),
    Int(i64),
    Num(f64),
    Time(NaiveDateTime),
}

fn value_of<'a>(cond: &Condition, record: &'a impl Record) -> Sql<'a> {
    match cond.column {
        Column::Priority => Sql::Int(record.priority()),
        Column::CreatedAt | Column::ModifiedAt | Column::DeadlineAt => {
            record.time(cond.column).map_or(Sql::Null, Sql::Time)
        }
        Column::Data => match (record.json(&cond.path), cond.json_as()) {
            (Json::Missing, _) => Sql::Null,
            (Json::Text(s), JsonAs::Text) => Sql::Text(Cow::Borrowed(s)),
            // A bare text form cannot tell a number or a boolean from a string; the planner
            // sends such conditions to the payload, so this is only a safe default.
            (Json::Text(_), _) => Sql::Null,
            (Json::Value(v), JsonAs::Text) => {
                text_form(v).map_or(Sql::Null, |s| Sql::Text(s.into()))
            }
            (Json::Value(v), JsonAs::Number) => v.as_f64().map_or(Sql::Null, Sql::Num),
            (Json::Value(Value::Bool(b)), JsonAs::Bool) => {
                Sql::Text(Cow::Borrowed(if *b { "true" } else { "false" }))
            }
            (Json::Value(_), JsonAs::Bool) => Sql::Null,
        },
        _ => record.text(cond.column).map_or(Sql::Null, Sql::Text),
    }
}

/// The operand as the storage layer binds it.
fn operand_of(column: Column, scalar: &Scalar) -> Sql<'_> {
    match scalar {
        Scalar::Text(s) if matches!(column, Column::Id | Column::ScheduleId) => {
            // Ids are stored lowercase and hyphenated; any UUID spelling finds them.
            match Uuid::parse_str(s) {
                Ok(u) => Sql::Text(Cow::Owned(u.hyphenated().to_string())),
                Err(_) => Sql::Text(Cow::Borrowed(s)),
            }
        }
        Scalar::Text(s) => Sql::Text(Cow::Borrowed(s)),
        Scalar::Int(v) => Sql::Int(*v),
        Scalar::Float(v) => Sql::Num(*v),
        Scalar::Bool(b) => Sql::Text(Cow::Borrowed(if *b { "true" } else { "false" })),
        Scalar::Time(t) => Sql::Time(*t),
    }
}

fn compare(a: &Sql<'_>, b: &Sql<'_>) -> Option<Ordering> {
    match (a, b) {
        (Sql::Text(x), Sql::Text(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        (Sql::Int(x), Sql::Int(y)) => Some(x.cmp(y)),
        (Sql::Int(x), Sql::Num(y)) => (*x as f64).partial_cmp(y),
        (Sql::Num(x), Sql::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Sql::Num(x), Sql::Num(y)) => x.partial_cmp(y),
        (Sql::Time(x), Sql::Time(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

fn condition(cond: &Condition, record: &impl Record) -> Option<bool> {
    let lhs = value_of(cond, record);
    match (cond.op, &cond.operand) {
        (Operator::IsNull, _) => Some(matches!(lhs, Sql::Null)),
        (Operator::IsNotNull, _) => Some(!matches!(lhs, Sql::Null)),
        // `IN ()` is written as a constant, whatever the column holds.
        (Operator::In, Operand::Many(items)) if items.is_empty() => Some(false),
        (Operator::NotIn, Operand::Many(items)) if items.is_empty() => Some(true),
        _ if matches!(lhs, Sql::Null) => None,
        (Operator::In | Operator::NotIn, Operand::Many(items)) => {
            let mut found = false;
            for item in items {
                match compare(&lhs, &operand_of(cond.column, item)) {
                    Some(Ordering::Equal) => {
                        found = true;
                        break;
                    }
                    Some(_) => {}
                    None => return None,
                }
            }
            Some(found == (cond.op == Operator::In))
        }
        (
            op @ (Operator::Like | Operator::NotLike | Operator::ILike | Operator::NotILike),
            Operand::One(Scalar::Text(pattern)),
        ) => {
            let Sql::Text(text) = &lhs else { return None };
            let insensitive = matches!(op, Operator::ILike | Operator::NotILike);
            let hit = like(pattern, text, insensitive);
            Some(hit != matches!(op, Operator::NotLike | Operator::NotILike))
        }
        (op, Operand::One(value)) => {
            let ord = compare(&lhs, &operand_of(cond.column, value))?;
            Some(match op {
                Operator::Eq => ord == Ordering::Equal,
                Operator::Ne => ord != Ordering::Equal,
                Operator::Lt => ord == Ordering::Less,
                Operator::Le => ord != Ordering::Greater,
                Operator::Gt => ord == Ordering::Greater,
                Operator::Ge => ord != Ordering::Less,
                _ => return None,
            })
        }
        // The parser never pairs an operator with an operand of the wrong shape; the SQL
        // writes such a pair as `1 = 0`.
        _ => Some(false),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    /// `%`: any run of characters.
    Any,
    /// `_`: one character.
    One,
    Lit(char),
}

fn tokens(pattern: &str) -> Vec<Token> {
    let mut out = Vec::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '\\' => Token::Lit(chars.next().unwrap_or('\\')),
            '%' => Token::Any,
            '_' => Token::One,
            other => Token::Lit(other),
        });
    }
    out
}

/// SQL `LIKE` (`%`, `_`, `\` escapes); with `insensitive`, `ILIKE`.
pub fn like(pattern: &str, text: &str, insensitive: bool) -> bool {
    let (pattern, text) = if insensitive {
        (
            Cow::Owned(pattern.to_lowercase()),
            Cow::Owned(text.to_lowercase()),
        )
    } else {
        (Cow::Borrowed(pattern), Cow::Borrowed(text))
    };
    let p = tokens(&pattern);
    let t: Vec<char> = text.chars().collect();
    // Greedy matching with one backtrack point: the last `%` seen.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(Token::Any) => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(Token::One) => {
                pi += 1;
                ti += 1;
            }
            Some(Token::Lit(c)) if *c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|tok| *tok == Token::Any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use serde_json::json;

    struct Rec {
        org: &'static str,
        priority: i64,
        hash: Option<&'static str>,
        data: Value,
    }

    impl Record for Rec {
        fn text(&self, column: Column) -> Option<Cow<'_, str>> {
            match column {
                Column::Organisation => Some(Cow::Borrowed(self.org)),
                Column::Hash => self.hash.map(Cow::Borrowed),
                Column::Type | Column::SchedulerId => Some(Cow::Borrowed("boefje")),
                Column::Status => Some(Cow::Borrowed("queued")),
                _ => None,
            }
        }
        fn priority(&self) -> i64 {
            self.priority
        }
        fn time(&self, _: Column) -> Option<NaiveDateTime> {
            None
        }
        fn json(&self, path: &[String]) -> Json<'_> {
            json_at(&self.data, path)
        }
    }

    fn rec() -> Rec {
        Rec {
            org: "org1",
            priority: 5,
            hash: None,
            data: json!({"boefje": {"id": "nmap"}, "input_ooi": null, "depth": 3, "deep": true, "n": "7"}),
        }
    }

    fn check(filters: Value) -> Option<bool> {
        eval(
            &parse_request(&json!({ "filters": filters })).unwrap(),
            &rec(),
        )
    }

    #[test]
    fn missing_values_make_comparisons_unknown_and_not_keeps_them_unknown() {
        let ne = json!([{"column": "data", "field": "input_ooi", "operator": "!=", "value": "x"}]);
        assert_eq!(check(ne.clone()), None);
        assert_eq!(check(json!({"not": ne})), None);
        assert_eq!(
            check(json!([{"column": "hash", "operator": "is_null"}])),
            Some(true)
        );
        // unknown OR true is true; unknown AND false is false
        assert_eq!(
            check(json!({"or": [ne, {"column": "organisation", "value": "org1"}]})),
            Some(true)
        );
    }

    #[test]
    fn empty_lists_are_constants() {
        let in_empty = json!([{"column": "hash", "operator": "in", "value": []}]);
        let not_in_empty = json!([{"column": "hash", "operator": "not_in", "value": []}]);
        assert_eq!(check(in_empty), Some(false));
        assert_eq!(check(not_in_empty), Some(true));
    }

    #[test]
    fn json_fields_compare_by_the_type_of_the_value() {
        let depth = |op: &str, v: Value| json!([{"column": "data", "field": "depth", "operator": op, "value": v}]);
        assert_eq!(check(depth(">", json!(2))), Some(true));
        assert_eq!(check(depth("<=", json!(2.5))), Some(false));
        assert_eq!(check(depth("==", json!("3"))), Some(true), "text form");
        // a text field is no number
        let n = json!([{"column": "data", "field": "n", "operator": ">", "value": 5}]);
        assert_eq!(check(n), None);
        let deep = json!([{"column": "data", "field": "deep", "operator": "==", "value": true}]);
        assert_eq!(check(deep), Some(true));
    }

    #[test]
    fn like_follows_sql() {
        assert!(like("dns-%", "dns-records", false));
        assert!(like("%b.nl", "Hostname|internet|b.nl", false));
        assert!(!like("%B.nl", "Hostname|internet|b.nl", false));
        assert!(like("%B.nl", "Hostname|internet|b.nl", true));
        assert!(like("a_c", "abc", false));
        assert!(!like("a_c", "ac", false));
        assert!(like(r"100\%", "100%", false));
        assert!(!like(r"100\%", "1000", false));
        assert!(like("%a%b%", "xxaxxbxx", false));
        assert!(!like("%a%b", "xxaxxbxx", false));
        assert!(like("%", "", false));
        assert!(!like("_", "", false));
    }
}
