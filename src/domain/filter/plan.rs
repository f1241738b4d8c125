//! What a filter lets the queue skip: the key-field lookups every match satisfies, whether it can
//! match on a scheduler at all, and whether it reads payload fields the heap does not hold.

use std::borrow::Cow;

use chrono::NaiveDateTime;

use super::eval::{self, Json, Record};
use super::{Column, Condition, FilterNode, JsonAs, Operand, Operator, Scalar};
use crate::domain::SchedulerId;
use crate::domain::keys::KeyField;

/// Every match has one of `values` in `field`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The key field.
    pub field: KeyField,
    /// The values, without repeats.
    pub values: Vec<String>,
}

/// How a filter can be answered on one scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// No task of this scheduler can match (a top-level condition on `scheduler_id` or `type`
    /// names another scheduler).
    pub nothing: bool,
    /// Lookups every match satisfies (top-level `==` and `in` on key fields); any one of them
    /// finds all candidates.
    pub lookups: Vec<Lookup>,
    /// The filter reads a `data` field that is not a key field, or reads a key field as a
    /// number or boolean, so it must see the payload.
    pub needs_payload: bool,
}

impl Plan {
    /// The lookup to use when nothing is known of how many tasks each value has: the fewest
    /// values on the most selective field.
    pub fn narrowest(&self) -> Option<&Lookup> {
        self.lookups
            .iter()
            .min_by_key(|l| (l.values.len(), l.field.selectivity_rank()))
    }
}

/// Plans `node` for `scheduler`.
pub fn plan(node: &FilterNode, scheduler: SchedulerId) -> Plan {
    let mut out = Plan {
        nothing: false,
        lookups: Vec::new(),
        needs_payload: reads_payload(node, scheduler),
    };
    conjuncts(node, scheduler, &mut out);
    out
}

fn conjuncts(node: &FilterNode, scheduler: SchedulerId, out: &mut Plan) {
    match node {
        FilterNode::And(items) => {
            for item in items {
                conjuncts(item, scheduler, out);
            }
        }
        FilterNode::Cond(cond) => {
            if matches!(cond.column, Column::SchedulerId | Column::Type)
                && eval::eval(node, &SchedulerOnly(scheduler)) != Some(true)
            {
                out.nothing = true;
            }
            if let Some(lookup) = lookup_of(cond, scheduler) {
                out.lookups.push(lookup);
            }
        }
        FilterNode::Or(_) | FilterNode::Not(_) => {}
    }
}

fn key_field(cond: &Condition, scheduler: SchedulerId) -> Option<KeyField> {
    match cond.column {
        Column::Organisation => Some(KeyField::Organisation),
        Column::Data if cond.json_as() == JsonAs::Text => {
            KeyField::of_data_path(scheduler, &cond.path)
        }
        _ => None,
    }
}

fn lookup_of(cond: &Condition, scheduler: SchedulerId) -> Option<Lookup> {
    let field = key_field(cond, scheduler)?;
    let mut values: Vec<String> = match (cond.op, &cond.operand) {
        (Operator::Eq, Operand::One(Scalar::Text(v))) => vec![v.clone()],
        (Operator::In, Operand::Many(items)) => items
            .iter()
            .map(|s| match s {
                Scalar::Text(v) => Some(v.clone()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?,
        _ => return None,
    };
    values.sort_unstable();
    values.dedup();
    Some(Lookup { field, values })
}

fn reads_payload(node: &FilterNode, scheduler: SchedulerId) -> bool {
    match node {
        FilterNode::And(items) | FilterNode::Or(items) | FilterNode::Not(items) => {
            items.iter().any(|i| reads_payload(i, scheduler))
        }
        FilterNode::Cond(cond) => {
            cond.column == Column::Data && key_field(cond, scheduler).is_none()
        }
    }
}

/// A record that knows only which scheduler it belongs to.
struct SchedulerOnly(SchedulerId);

impl Record for SchedulerOnly {
    fn text(&self, column: Column) -> Option<Cow<'_, str>> {
        matches!(column, Column::SchedulerId | Column::Type).then(|| Cow::Borrowed(self.0.as_str()))
    }
    fn priority(&self) -> i64 {
        0
    }
    fn time(&self, _: Column) -> Option<NaiveDateTime> {
        None
    }
    fn json(&self, _: &[String]) -> Json<'_> {
        Json::Missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use serde_json::{Value, json};

    fn plan_of(filters: Value, s: SchedulerId) -> Plan {
        plan(&parse_request(&json!({ "filters": filters })).unwrap(), s)
    }

    #[test]
    fn the_runners_filters_are_lookups_on_key_fields() {
        let p = plan_of(
            json!([
                {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["b", "a", "b"]},
                {"column": "data", "field": "boefje__id", "operator": "in", "value": ["x"]}
            ]),
            SchedulerId::Boefje,
        );
        assert!(!p.nothing && !p.needs_payload);
        assert_eq!(
            p.lookups[0],
            Lookup {
                field: KeyField::OciImage,
                values: vec!["a".into(), "b".into()]
            }
        );
        assert_eq!(p.narrowest().map(|l| l.field), Some(KeyField::PluginId));
    }

    #[test]
    fn conditions_under_or_and_not_are_no_lookups() {
        let p = plan_of(
            json!({"or": [{"column": "organisation", "value": "a"}], "not": [{"column": "organisation", "value": "b"}]}),
            SchedulerId::Boefje,
        );
        assert!(p.lookups.is_empty());
    }

    #[test]
    fn another_schedulers_type_matches_nothing() {
        let f = json!([{"column": "type", "value": "normalizer"}]);
        assert!(plan_of(f.clone(), SchedulerId::Boefje).nothing);
        assert!(!plan_of(f, SchedulerId::Normalizer).nothing);
    }

    #[test]
    fn other_data_fields_and_typed_reads_need_the_payload() {
        assert!(
            plan_of(
                json!([{"column": "data", "field": "depth", "value": 3}]),
                SchedulerId::Boefje
            )
            .needs_payload
        );
        assert!(
            plan_of(
                json!({"not": [{"column": "data", "field": "boefje__id", "value": 3}]}),
                SchedulerId::Boefje
            )
            .needs_payload
        );
        assert!(
            !plan_of(
                json!([{"column": "data", "field": "input_ooi", "operator": "like", "value": "x%"}]),
                SchedulerId::Boefje
            )
            .needs_payload
        );
    }
}
