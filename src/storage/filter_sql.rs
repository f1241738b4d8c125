//! Turns a parsed [`FilterNode`] into a SQL condition for the connected backend.
//!
//! JSON fields are read with `data::jsonb #>> ARRAY[…]` on PostgreSQL and `json_extract` on
//! SQLite; key paths and values are always bound, never spliced into the text. Numeric
//! comparisons only consider JSON numbers, so a text value never matches `> 5` (SQLite would
//! otherwise order all text above all numbers).

use uuid::Uuid;

use super::Backend;
use super::sql::{Bind, Sql};
use crate::domain::filter::{Column, Condition, FilterNode, JsonAs, Operand, Operator, Scalar};

/// Appends the condition for `node` to `sql`.
pub fn push_filter(sql: &mut Sql, node: &FilterNode) {
    match node {
        FilterNode::And(items) => push_join(sql, items, " AND ", "1 = 1"),
        FilterNode::Or(items) => push_join(sql, items, " OR ", "1 = 0"),
        FilterNode::Not(items) => {
            if items.is_empty() {
                sql.push("1 = 1");
            } else {
                sql.push("NOT ");
                push_join(sql, items, " OR ", "1 = 0");
            }
        }
        FilterNode::Cond(cond) => push_condition(sql, cond),
    }
}

fn push_join(sql: &mut Sql, items: &[FilterNode], sep: &str, empty: &str) {
    if items.is_empty() {
        sql.push(empty);
        return;
    }
    sql.push("(");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            sql.push(sep);
        }
        push_filter(sql, item);
    }
    sql.push(")");
}

fn push_json_path_pg(sql: &mut Sql, path: &[String]) {
    sql.push("ARRAY[");
    for (i, key) in path.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.bind(key.as_str());
    }
    sql.push("]::text[]");
}

fn sqlite_path(path: &[String]) -> String {
    let mut p = String::from("$");
    for key in path {
        p.push_str(".\"");
        p.push_str(key);
        p.push('"');
    }
    p
}

/// Writes the expression that reads `data` at `path` the way `how` asks.
fn push_json_expr(sql: &mut Sql, path: &[String], how: JsonAs) {
    match (sql.backend(), how) {
        (Backend::Postgres, JsonAs::Text) => {
            sql.push("(data::jsonb #>> ");
            push_json_path_pg(sql, path);
            sql.push(")");
        }
        (Backend::Postgres, JsonAs::Bool) => {
            // JSON booleans only, as the heap and SQLite read them: the string "true" is not one.
            sql.push("(CASE WHEN jsonb_typeof(data::jsonb #> ");
            push_json_path_pg(sql, path);
            sql.push(") = 'boolean' THEN (data::jsonb #>> ");
            push_json_path_pg(sql, path);
            sql.push(") END)");
        }
        (Backend::Postgres, JsonAs::Number) => {
            sql.push("(CASE WHEN jsonb_typeof(data::jsonb #> ");
            push_json_path_pg(sql, path);
            sql.push(") = 'number' THEN (data::jsonb #>> ");
            push_json_path_pg(sql, path);
            sql.push(")::numeric END)");
        }
        (Backend::Sqlite, JsonAs::Text) => {
            // The field's text form, as PostgreSQL's `#>>` and the heap give it: json_extract
            // answers numbers as numbers (which never equal text) and booleans as 1 and 0.
            sql.push("(CASE json_type(data, ")
                .bind(sqlite_path(path))
                .push(") WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE CAST(json_extract(data, ")
                .bind(sqlite_path(path))
                .push(") AS TEXT) END)");
        }
        (Backend::Sqlite, JsonAs::Number) => {
            sql.push("(CASE WHEN json_type(data, ")
                .bind(sqlite_path(path))
                .push(") IN ('integer', 'real') THEN json_extract(data, ")
                .bind(sqlite_path(path))
                .push(") END)");
        }
        (Backend::Sqlite, JsonAs::Bool) => {
            // json_type names booleans 'true' / 'false', matching PostgreSQL's #>> text.
            sql.push("(CASE WHEN json_type(data, ")
                .bind(sqlite_path(path))
                .push(") IN ('true', 'false') THEN json_type(data, ")
                .bind(sqlite_path(path))
                .push(") END)");
        }
    }
}

fn push_column(sql: &mut Sql, cond: &Condition) {
    if cond.column == Column::Data {
        push_json_expr(sql, &cond.path, cond.json_as());
    } else {
        sql.push(cond.column.sql_name());
    }
}

fn scalar_bind(column: Column, scalar: &Scalar) -> Bind {
    match scalar {
        Scalar::Text(s) if matches!(column, Column::Id | Column::ScheduleId) => {
            // Ids are stored lowercase and hyphenated; accept any UUID spelling.
            Bind::Text(
                Uuid::parse_str(s)
                    .map(|u| u.hyphenated().to_string())
                    .unwrap_or_else(|_| s.clone()),
            )
        }
        Scalar::Text(s) => Bind::Text(s.clone()),
        Scalar::Bool(b) if column == Column::Enabled => Bind::Bool(*b),
        Scalar::Int(v) => Bind::BigInt(*v),
        Scalar::Float(v) => Bind::Double(*v),
        Scalar::Bool(b) => Bind::Text(if *b { "true" } else { "false" }.to_owned()),
        Scalar::Time(t) => Bind::Time(*t),
    }
}

/// Rewrites a LIKE pattern (`%`, `_`, `\` escapes) as a case-sensitive SQLite GLOB pattern.
fn like_to_glob(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 4);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(lit @ ('*' | '?' | '[')) => {
                    out.push('[');
                    out.push(lit);
                    out.push(']');
                }
                Some(lit) => out.push(lit),
                None => out.push('\\'),
            },
            '%' => out.push('*'),
            '_' => out.push('?'),
            '*' | '?' | '[' => {
                out.push('[');
                out.push(c);
                out.push(']');
            }
            other => out.push(other),
        }
    }
    out
}

fn push_condition(sql: &mut Sql, cond: &Condition) {
    let comparison = |op: Operator| match op {
        Operator::Eq => " = ",
        Operator::Ne => " <> ",
        Operator::Lt => " < ",
        Operator::Le => " <= ",
        Operator::Gt => " > ",
        _ => " >= ",
    };
    match (cond.op, &cond.operand) {
        (Operator::IsNull, _) => {
            sql.push("(");
            push_column(sql, cond);
            sql.push(" IS NULL)");
        }
        (Operator::IsNotNull, _) => {
            sql.push("(");
            push_column(sql, cond);
            sql.push(" IS NOT NULL)");
        }
        (Operator::In | Operator::NotIn, Operand::Many(items)) => {
            if items.is_empty() {
                sql.push(if cond.op == Operator::In {
                    "1 = 0"
                } else {
                    "1 = 1"
                });
                return;
            }
            sql.push("(");
            push_column(sql, cond);
            sql.push(if cond.op == Operator::In {
                " IN "
            } else {
                " NOT IN "
            });
            sql.bind_list(items.iter().map(|s| scalar_bind(cond.column, s)));
            sql.push(")");
        }
        (
            op @ (Operator::Like | Operator::NotLike | Operator::ILike | Operator::NotILike),
            Operand::One(Scalar::Text(pattern)),
        ) => {
            let negate = matches!(op, Operator::NotLike | Operator::NotILike);
            let insensitive = matches!(op, Operator::ILike | Operator::NotILike);
            sql.push(if negate { "(NOT (" } else { "((" });
            push_column(sql, cond);
            match (sql.backend(), insensitive) {
                (Backend::Postgres, false) => {
                    sql.push(" LIKE ").bind(pattern.as_str());
                }
                (Backend::Postgres, true) => {
                    sql.push(" ILIKE ").bind(pattern.as_str());
                }
                (Backend::Sqlite, false) => {
                    sql.push(" GLOB ").bind(like_to_glob(pattern));
                }
                (Backend::Sqlite, true) => {
                    sql.push(" LIKE ")
                        .bind(pattern.as_str())
                        .push(" ESCAPE '\\'");
                }
            }
            sql.push("))");
        }
        (op, Operand::One(value)) => {
            sql.push("(");
            push_column(sql, cond);
            sql.push(comparison(op));
            sql.bind(scalar_bind(cond.column, value));
            sql.push(")");
        }
        // The parser never pairs an operator with an operand of the wrong shape.
        _ => {
            sql.push("1 = 0");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use serde_json::json;

    fn render(backend: Backend, body: serde_json::Value) -> Sql {
        let node = parse_request(&body).unwrap();
        let mut sql = Sql::new(backend, "");
        push_filter(&mut sql, &node);
        sql
    }

    #[test]
    fn json_fields_are_bound_not_spliced() {
        let sql = render(
            Backend::Postgres,
            json!({"filters": [{"column": "data", "field": "boefje__id", "operator": "==", "value": "x'; DROP"}]}),
        );
        assert_eq!(
            sql.text(),
            "(((data::jsonb #>> ARRAY[$1, $2]::text[]) = $3))"
        );
        let sql = render(
            Backend::Sqlite,
            json!({"filters": [{"column": "data", "field": "input_ooi", "operator": "in", "value": ["a"]}]}),
        );
        assert_eq!(
            sql.text(),
            "(((CASE json_type(data, ?) WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' \
             ELSE CAST(json_extract(data, ?) AS TEXT) END) IN (?)))"
        );
    }

    #[test]
    fn not_means_none_of() {
        let sql = render(
            Backend::Sqlite,
            json!({"filters": {"not": [{"column": "organisation", "value": "a"}, {"column": "organisation", "value": "b"}]}}),
        );
        assert_eq!(sql.text(), "NOT ((organisation = ?) OR (organisation = ?))");
    }

    #[test]
    fn like_patterns_become_case_sensitive_globs_on_sqlite() {
        assert_eq!(like_to_glob("dns-%_x"), "dns-*?x");
        assert_eq!(like_to_glob(r"100\%*"), "100%[*]");
    }
}
