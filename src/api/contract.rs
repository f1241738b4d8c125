//! The parts of the API contract the handlers' annotations cannot say, written into the
//! generated OpenAPI document so it states exactly what the server accepts and answers:
//!
//! - every input's bounds (the configured [`Limits`], lengths, ranges, no NUL characters);
//! - a push per scheduler, each with its own payload schema (the payload a scheduler requires);
//! - the filter language, condition by condition: which operators each column takes and which
//!   values go with them;
//! - a `PATCH` body that changes something;
//! - every status code each operation can answer, with its body.
//!
//! Rules that JSON Schema cannot express are stated in the descriptions: the total number of
//! conditions and the nesting of a filter, and the nesting of a payload.

use serde_json::{Map, Value, json};

use crate::domain::TaskStatus;
use crate::domain::filter::Table;
use crate::domain::limits::Limits;

/// No NUL character anywhere in a string (PostgreSQL cannot store one).
const NO_NUL: &str = "^[^\\u0000]*$";
/// Not blank: at least one character that is neither NUL nor white space.
const NOT_BLANK: &str = "^[^\\u0000]*[^\\u0000\\s][^\\u0000]*$";
/// A `data` field path: keys of letters, digits and `-` with single `_` inside, joined by `__`.
/// A UUID in its hyphenated form, as ids are written and answered.
const UUID: &str = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
const FIELD_PATH: &str = "^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*(__[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*)*$";

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn text(limits: &Limits) -> Value {
    json!({"type": "string", "maxLength": limits.max_string_chars, "pattern": NO_NUL})
}

/// An object's reference (`input_ooi`): stored, but not bounded by an index entry
/// ([`crate::domain::limits::REFERENCE_MAX_CHARS`]).
fn reference() -> Value {
    json!({"type": "string", "maxLength": crate::domain::limits::REFERENCE_MAX_CHARS, "pattern": NO_NUL})
}

/// A filter's text value: only compared, never stored, so bounded apart from the stored
/// strings ([`crate::domain::limits::FILTER_VALUE_MAX_CHARS`]).
fn filter_value() -> Value {
    json!({"type": "string", "maxLength": crate::domain::limits::FILTER_VALUE_MAX_CHARS, "pattern": NO_NUL})
}

/// A filter's `like` pattern: no NUL, and no escape character (`\\`) left alone at its end,
/// which PostgreSQL refuses; bounded as [`filter_value`].
fn filter_pattern() -> Value {
    json!({"type": "string", "maxLength": crate::domain::limits::FILTER_VALUE_MAX_CHARS, "pattern": LIKE_PATTERN})
}

const LIKE_PATTERN: &str = "^([^\\u0000\\\\]|\\\\[^\\u0000])*$";

fn key(limits: &Limits) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": limits.max_string_chars, "pattern": NOT_BLANK_OR_ANY})
}

/// A key field may be any non-empty string; only NUL is refused.
const NOT_BLANK_OR_ANY: &str = "^[^\\u0000]+$";

fn opt(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn integer() -> Value {
    json!({"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX})
}

fn statuses() -> Value {
    let mut names: Vec<String> = TaskStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    names.extend(TaskStatus::ALL.iter().map(|s| s.as_str().to_uppercase()));
    json!({"type": "string", "enum": names})
}

/// Schemas of the request bodies and their parts.
fn schemas(limits: &Limits) -> Map<String, Value> {
    let mut s = Map::new();
    // Any JSON without a NUL character, in keys or strings.
    s.insert(
        "JsonValue".into(),
        json!({
            "description": "Any JSON value without a NUL character in a key or a string.",
            "anyOf": [
                {"type": "string", "pattern": NO_NUL},
                {"type": "number"},
                {"type": "boolean"},
                {"type": "null"},
                {"type": "array", "items": schema_ref("JsonValue")},
                {"type": "object", "propertyNames": {"pattern": NO_NUL},
                 "additionalProperties": schema_ref("JsonValue")}
            ]
        }),
    );
    let payload = |required: Value, properties: Value, what: &str| {
        let mut props = json!({"id": opt(json!({"type": "string", "format": "uuid"}))});
        if let (Some(p), Some(extra)) = (props.as_object_mut(), properties.as_object()) {
            p.extend(extra.clone());
        }
        // Key fields other schedulers' payloads may carry are strings too.
        if let Some(p) = props.as_object_mut() {
            p.entry("input_ooi").or_insert_with(|| opt(reference()));
        }
        json!({
            "type": "object",
            "description": format!("{what} Other keys are kept as sent. Nested at most {} deep.", limits.max_json_depth),
            "required": required,
            "properties": props,
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": schema_ref("JsonValue")
        })
    };
    let open_object = |required: Value, properties: Value| {
        json!({
            "type": "object",
            "required": required,
            "properties": properties,
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": schema_ref("JsonValue")
        })
    };
    s.insert(
        "BoefjeTaskData".into(),
        payload(
            json!(["boefje", "organization"]),
            json!({
                "boefje": open_object(json!(["id"]), json!({
                    "id": key(limits),
                    "oci_image": opt(text(limits))
                })),
                "organization": {"type": "string", "minLength": 1, "pattern": NO_NUL},
                "input_ooi": opt(reference()),
                "deduplication_key": opt(json!({"type": "string", "format": "uuid"}))
            }),
            "A boefje task: the boefje to run, the object to run it on and the organisation.",
        ),
    );
    s.insert(
        "NormalizerTaskData".into(),
        payload(
            json!(["normalizer", "raw_data"]),
            json!({
                "normalizer": open_object(json!(["id"]), json!({"id": key(limits)})),
                "raw_data": open_object(json!(["boefje_meta"]), json!({
                    "boefje_meta": open_object(json!(["id", "organization"]), json!({
                        "id": {"type": "string", "format": "uuid"},
                        "organization": {"type": "string", "minLength": 1, "pattern": NO_NUL}
                    }))
                })),
                "boefje": {"anyOf": [
                    open_object(json!([]), json!({"oci_image": opt(text(limits))})),
                    {"not": {"type": "object"}, "$ref": "#/components/schemas/JsonValue"}
                ]}
            }),
            "A normalizer task: the normalizer and the raw file it parses.",
        ),
    );
    s.insert(
        "ReportTaskData".into(),
        payload(
            json!(["report_recipe_id", "organisation_id"]),
            json!({
                "report_recipe_id": key(limits),
                "organisation_id": {"type": "string", "minLength": 1, "pattern": NO_NUL},
                "boefje": {"anyOf": [
                    open_object(json!([]), json!({"oci_image": opt(text(limits))})),
                    {"not": {"type": "object"}, "$ref": "#/components/schemas/JsonValue"}
                ]}
            }),
            "A report task: the recipe and the organisation.",
        ),
    );
    for (name, scheduler, data) in [
        ("TaskPushBoefje", "boefje", "BoefjeTaskData"),
        ("TaskPushNormalizer", "normalizer", "NormalizerTaskData"),
        ("TaskPushReport", "report", "ReportTaskData"),
    ] {
        let mut props = Map::new();
        props.insert(
            "id".into(),
            opt(json!({"type": "string", "format": "uuid"})),
        );
        props.insert("scheduler_id".into(), json!({"enum": [scheduler, null]}));
        props.insert(
            "organisation".into(),
            json!({"type": "string", "minLength": 1, "maxLength": limits.max_string_chars, "pattern": NOT_BLANK}),
        );
        props.insert(
            "priority".into(),
            json!({"allOf": [integer(), {"not": {"const": 0}}],
                   "description": "Lower is more urgent; not 0. User scans use 1."}),
        );
        props.insert("data".into(), schema_ref(data));
        for ignored in [
            "status",
            "type",
            "hash",
            "schedule_id",
            "created_at",
            "modified_at",
            "attempts",
            "lease_expires_at",
            "failure_reason",
        ] {
            props.insert(ignored.into(), schema_ref("JsonValue"));
        }
        s.insert(
            name.into(),
            json!({
                "type": "object",
                "description": "A task to push; a worker may also push back a full task it holds (the task keys beyond these are accepted and ignored).",
                "required": ["organisation", "priority", "data"],
                "properties": props,
                "additionalProperties": false
            }),
        );
    }
    s.insert(
        "TaskPatchBody".into(),
        json!({
            "type": "object",
            "description": "A new status and/or priority; other keys are ignored.",
            "properties": {
                "status": statuses(),
                "priority": {"allOf": [integer(), {"not": {"const": 0}}]}
            },
            "anyOf": [{"required": ["status"]}, {"required": ["priority"]}],
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": schema_ref("JsonValue")
        }),
    );
    let cron = json!({"type": "string", "pattern": crate::domain::cron::document_pattern(),
    "maxLength": limits.max_string_chars,
    "description": concat!(
        "A cron expression as Python's croniter reads it, evaluated in UTC: five fields (minute 0-59, hour 0-23, ",
        "day of month 1-31, month 1-12, day of week 0-7 with Sunday 0 or 7), each a list of `*`, numbers, ranges `a-b`, ",
        "steps `*/n`, `a-b/n`, `a/n`; month and weekday names (`jan`, `mon-fri`, any case); `L` (last day) and `?` in the ",
        "day of month; `?`, `d#n` (n-th weekday) and `Ld` (last weekday) in the day of week; or a nickname (`@yearly`, ",
        "`@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`). When both day fields are restricted, a ",
        "day matching either fires. The pattern is a part of croniter's language whose every expression fires; the ",
        "service takes all of it, and answers 400 with the reason to an expression croniter refuses or one that ",
        "never fires within 50 years (`0 0 31 2 *`). Seconds and year fields are not taken."
    )});
    let deadline = json!({"anyOf": [
        {"type": "string", "format": "date-time"},
        {"type": "string", "format": "date"},
        {"type": "null"}
    ]});
    let creates: Vec<Value> = [
        ("boefje", "BoefjeTaskData"),
        ("normalizer", "NormalizerTaskData"),
        ("report", "ReportTaskData"),
    ]
    .into_iter()
    .map(|(scheduler, data)| {
        json!({
            "type": "object",
            "required": ["scheduler_id", "organisation", "data"],
            "properties": {
                "scheduler_id": {"const": scheduler},
                "organisation": {"type": "string", "minLength": 1, "maxLength": limits.max_string_chars, "pattern": NOT_BLANK},
                "data": schema_ref(data),
                "schedule": opt(cron.clone()),
                "deadline_at": deadline.clone()
            },
            "additionalProperties": false,
            // A schedule needs a cron expression or a deadline.
            "anyOf": [
                {"required": ["schedule"], "properties": {"schedule": {"type": "string"}}},
                {"required": ["deadline_at"], "properties": {"deadline_at": {"type": "string"}}}
            ]
        })
    })
    .collect();
    s.insert(
        "ScheduleCreate".into(),
        json!({
            "description": "A schedule: the scheduler, the organisation, its task data (the scheduler's item type), and a cron expression or a first deadline (or both). Its hash is the data's, unique over all schedules.",
            "oneOf": creates
        }),
    );
    s.insert(
        "SchedulePatchBody".into(),
        json!({
            "type": "object",
            "description": "Any of `enabled`, `schedule` (the deadline is kept) and `deadline_at`; other keys are ignored.",
            "properties": {
                "enabled": {"type": "boolean"},
                "schedule": opt(cron),
                "deadline_at": deadline
            },
            "anyOf": [{"required": ["enabled"]}, {"required": ["schedule"]}, {"required": ["deadline_at"]}],
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": schema_ref("JsonValue")
        }),
    );
    filter_schemas(&mut s, limits, Table::Tasks);
    filter_schemas(&mut s, limits, Table::Schedules);
    s
}

/// The filter language as schemas: a condition per column class and operator group.
fn filter_schemas(s: &mut Map<String, Value>, limits: &Limits, table: Table) {
    // The schemas of a table's filters: `FilterRequest` … for tasks, `ScheduleFilterRequest` …
    // for schedules.
    let prefix = match table {
        Table::Tasks => "",
        Table::Schedules => "Schedule",
    };
    let name = |n: &str| format!("{prefix}{n}");
    let ops_eq = ["==", "eq", "!=", "ne"];
    let ops_cmp = ["<", "lt", "<=", "lte", ">", "gt", ">=", "gte"];
    let ops_like = ["like", "not_like", "ilike", "not_ilike"];
    let ops_in = ["in", "not_in"];
    let ops_null = ["is_null", "is_not_null"];
    // mula's `is` / `is_not`: with no value, or null, a test for null; with a boolean (a
    // boolean column or a `data` field), a comparison with it.
    let ops_is = ["is", "is_not"];
    let list =
        |item: Value| json!({"type": "array", "items": item, "maxItems": limits.max_in_values});
    let date_time = json!({"type": "string", "format": "date-time"});
    // (columns, value for ==/!=, value for </>…, whether like applies)
    let classes: Vec<(Vec<&str>, Value, Value, bool)> = match table {
        Table::Tasks => vec![
            (
                vec![
                    "id",
                    "scheduler_id",
                    "schedule_id",
                    "organisation",
                    "type",
                    "hash",
                ],
                filter_value(),
                filter_value(),
                true,
            ),
            (vec!["priority"], integer(), integer(), false),
            (vec!["status"], statuses(), statuses(), false),
            (
                vec!["created_at", "modified_at"],
                date_time.clone(),
                date_time,
                false,
            ),
        ],
        Table::Schedules => vec![
            (
                vec!["id", "scheduler_id", "organisation", "hash", "schedule"],
                filter_value(),
                filter_value(),
                true,
            ),
            (
                vec!["enabled"],
                json!({"type": "boolean"}),
                json!({"type": "boolean"}),
                false,
            ),
            (
                vec!["deadline_at", "created_at", "modified_at"],
                date_time.clone(),
                date_time,
                false,
            ),
        ],
    };
    let mut conditions = Vec::new();
    let cond = |columns: Value,
                field: Option<Value>,
                ops: Vec<&str>,
                value: Option<Value>,
                op_optional: bool| {
        let mut props = Map::new();
        props.insert("column".into(), json!({"enum": columns}));
        match &field {
            Some(f) => {
                props.insert("field".into(), f.clone());
            }
            None => {
                props.insert("field".into(), json!({"type": "null"}));
            }
        }
        let mut ops: Vec<Value> = ops.into_iter().map(Value::from).collect();
        if op_optional {
            // Absent or null: `==`.
            ops.push(Value::Null);
        }
        props.insert("operator".into(), json!({"enum": ops}));
        let mut required = vec![json!("column")];
        if field.is_some() {
            required.push(json!("field"));
        }
        if !op_optional {
            required.push(json!("operator"));
        }
        match value {
            Some(v) => {
                props.insert("value".into(), v);
                required.push(json!("value"));
            }
            None => {
                props.insert("value".into(), schema_ref("JsonValue"));
            }
        }
        json!({"type": "object", "required": required, "properties": props, "additionalProperties": false})
    };
    for (columns, eq_value, cmp_value, like) in classes {
        let cols = json!(columns);
        // `==` / `!=` (the default operator), with null meaning is (not) null.
        conditions.push(cond(
            cols.clone(),
            None,
            ops_eq.to_vec(),
            Some(opt(eq_value.clone())),
            true,
        ));
        conditions.push(cond(cols.clone(), None, ops_eq.to_vec(), None, true).tap_absent_value());
        conditions.push(cond(
            cols.clone(),
            None,
            ops_cmp.to_vec(),
            Some(cmp_value),
            false,
        ));
        if like {
            conditions.push(cond(
                cols.clone(),
                None,
                ops_like.to_vec(),
                Some(filter_pattern()),
                false,
            ));
        }
        let is_value = if eq_value["type"] == "boolean" {
            opt(eq_value.clone())
        } else {
            json!({"type": "null"})
        };
        conditions.push(cond(
            cols.clone(),
            None,
            ops_is.to_vec(),
            Some(is_value),
            false,
        ));
        conditions.push(cond(cols.clone(), None, ops_is.to_vec(), None, false).tap_absent_value());
        conditions.push(cond(
            cols.clone(),
            None,
            ops_in.to_vec(),
            Some(list(eq_value)),
            false,
        ));
        conditions.push(cond(cols, None, ops_null.to_vec(), None, false));
    }
    // `data` with a field: text, number or boolean, as the value's type says.
    let field =
        json!({"type": "string", "pattern": FIELD_PATH, "maxLength": limits.max_string_chars});
    let data = json!(["data"]);
    let scalar = json!({"anyOf": [filter_value(), {"type": "number"}, {"type": "boolean"}]});
    conditions.push(cond(
        data.clone(),
        Some(field.clone()),
        ops_eq.to_vec(),
        Some(opt(scalar.clone())),
        true,
    ));
    conditions.push(
        cond(
            data.clone(),
            Some(field.clone()),
            ops_eq.to_vec(),
            None,
            true,
        )
        .tap_absent_value(),
    );
    conditions.push(cond(
        data.clone(),
        Some(field.clone()),
        ops_cmp.to_vec(),
        Some(scalar),
        false,
    ));
    conditions.push(cond(
        data.clone(),
        Some(field.clone()),
        ops_like.to_vec(),
        Some(filter_pattern()),
        false,
    ));
    conditions.push(cond(
        data.clone(),
        Some(field.clone()),
        ops_is.to_vec(),
        Some(opt(json!({"type": "boolean"}))),
        false,
    ));
    conditions.push(
        cond(
            data.clone(),
            Some(field.clone()),
            ops_is.to_vec(),
            None,
            false,
        )
        .tap_absent_value(),
    );
    conditions.push(cond(
        data.clone(),
        Some(field.clone()),
        ops_in.to_vec(),
        Some(json!({"anyOf": [list(filter_value()), list(json!({"type": "number"})), list(json!({"type": "boolean"}))]})),
        false,
    ));
    conditions.push(cond(data, Some(field), ops_null.to_vec(), None, false));
    s.insert(
        name("FilterCondition"),
        json!({
            "description": "One comparison: `column` (and, for `data`, a `field` path such as `boefje__oci_image`), an `operator` (default `==`) and a `value` of the column's type.",
            "oneOf": conditions
        }),
    );
    let item = schema_ref(&name("FilterItem"));
    s.insert(
        name("FilterGroup"),
        json!({
            "type": "object",
            "description": "Combinators: all of `and`, any of `or`, none of `not`; several keys must all hold.",
            "minProperties": 1,
            "properties": {
                "and": {"type": "array", "items": item},
                "or": {"type": "array", "items": item},
                "not": {"type": "array", "items": item}
            },
            "additionalProperties": false
        }),
    );
    s.insert(
        name("FilterItem"),
        json!({"anyOf": [
            schema_ref(&name("FilterCondition")),
            schema_ref(&name("FilterGroup")),
            {"type": "array", "items": item}
        ]}),
    );
    s.insert(
        name("FilterRequest"),
        json!({
            "type": "object",
            "description": format!(
                "Filters: a list (all must hold), one condition, or combinators, nested at most {1} levels deep (a list, or an object of combinators, is a level). At most {0} conditions in all.",
                limits.max_filter_conditions, limits.max_filter_depth
            ),
            "required": ["filters"],
            "properties": {"filters": {"anyOf": [
                {"type": "array", "items": item},
                schema_ref(&name("FilterGroup")),
                schema_ref(&name("FilterCondition"))
            ]}},
            "additionalProperties": false,
            "example": {"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["ghcr.io/minvws/openkat/nmap:latest"]}]}
        }),
    );
}

/// A condition whose `value` may be left out (then it is null: `is null`, `is not null`).
trait AbsentValue {
    fn tap_absent_value(self) -> Value;
}

impl AbsentValue for Value {
    fn tap_absent_value(mut self) -> Value {
        if let Some(props) = self.get_mut("properties").and_then(Value::as_object_mut) {
            props.remove("value");
        }
        self
    }
}

/// The schema of each query and path parameter, by name (and operation where it differs).
fn parameter(path: &str, name: &str, limits: &Limits) -> Option<Value> {
    Some(match (path, name) {
        ("/schedulers/{scheduler_id}/pop", "limit") => {
            json!({"type": "integer", "minimum": 1, "maximum": 1000})
        }
        ("/tasks", "limit") => json!({"type": "integer", "minimum": 0, "maximum": 1000}),
        ("/tasks", "offset") => {
            json!({"type": "integer", "minimum": 0, "maximum": limits.max_offset})
        }
        ("/tasks" | "/schedules", "scheduler_id") => {
            json!({"type": "string", "enum": ["", "boefje", "normalizer", "report"]})
        }
        ("/tasks", "status") => {
            let mut names = vec![json!("")];
            names.extend(TaskStatus::ALL.iter().map(|s| json!(s.as_str())));
            json!({"type": "string", "enum": names})
        }
        ("/tasks", "min_created_at" | "max_created_at") => json!({"anyOf": [
            {"type": "string", "format": "date-time"},
            {"type": "string", "format": "date"},
            {"type": "string", "maxLength": 0}
        ]}),
        ("/tasks", "organisation" | "task_type")
        | ("/tasks/stats", "scheduler_id" | "organisation_id") => text(limits),
        (_, "scheduler_id") => {
            json!({"type": "string", "enum": ["boefje", "normalizer", "report"]})
        }
        // The pattern says it for validators that take `format` as a note only: `search` or
        // `stats` is no id, so `GET /schedules/search` is the concrete path's (405), never an id.
        (_, "task_id") | ("/schedules/{id}" | "/schedules/{id}/history", "id") => {
            json!({"type": "string", "format": "uuid", "pattern": UUID})
        }
        ("/schedules" | "/schedules/search" | "/schedules/{id}/history", "limit") => {
            json!({"type": "integer", "minimum": 0, "maximum": 1000})
        }
        ("/schedules" | "/schedules/search" | "/schedules/{id}/history", "offset") => {
            json!({"type": "integer", "minimum": 0, "maximum": limits.max_offset})
        }
        ("/schedules", "enabled") => json!({"type": "boolean"}),
        ("/schedules", "organisation" | "schedule_hash") => text(limits),
        (
            "/schedules",
            "min_deadline_at" | "max_deadline_at" | "min_created_at" | "max_created_at",
        ) => json!({"anyOf": [
            {"type": "string", "format": "date-time"},
            {"type": "string", "format": "date"},
            {"type": "string", "maxLength": 0}
        ]}),
        ("/health", "externals") => json!({"type": "boolean"}),
        _ => return None,
    })
}

fn error(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema_ref("ErrorBody")}}})
}

/// Rewrites `doc` (the generated document, as JSON) into the full contract.
pub fn apply(doc: &mut Value, limits: &Limits) {
    if let Some(components) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        components.remove("TaskPush");
        components.extend(schemas(limits));
    }
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    // One push per scheduler, each with its payload's schema.
    if let Some(generic) = paths.remove("/schedulers/{scheduler_id}/push") {
        for (scheduler, body) in [
            ("boefje", "TaskPushBoefje"),
            ("normalizer", "TaskPushNormalizer"),
            ("report", "TaskPushReport"),
        ] {
            let mut item = generic.clone();
            if let Some(op) = item.get_mut("post").and_then(Value::as_object_mut) {
                op.insert("operationId".into(), json!(format!("push_{scheduler}")));
                op.insert("parameters".into(), json!([]));
                op.insert(
                    "requestBody".into(),
                    json!({"required": true, "content": {"application/json": {"schema": schema_ref(body)}}}),
                );
            }
            paths.insert(format!("/schedulers/{scheduler}/push"), item);
        }
    }
    for (path, item) in paths.iter_mut() {
        let Some(ops) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in ops.iter_mut() {
            let Some(op) = op.as_object_mut() else {
                continue;
            };
            if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
                for p in params.iter_mut() {
                    let name = p
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    if let Some(schema) = parameter(path, &name, limits) {
                        p["schema"] = schema;
                    }
                }
            }
            let has_body = op.contains_key("requestBody");
            if has_body && (path == "/tasks" || path.ends_with("/pop")) {
                op.insert(
                    "requestBody".into(),
                    json!({"required": false, "content": {"application/json": {"schema": {"anyOf": [schema_ref("FilterRequest"), {"type": "null"}]}}}}),
                );
            }
            if path == "/schedules/search" {
                op.insert(
                    "requestBody".into(),
                    json!({"required": true, "content": {"application/json": {"schema": schema_ref("ScheduleFilterRequest")}}}),
                );
            }
            if path == "/schedules" && method == "post" {
                op.insert(
                    "requestBody".into(),
                    json!({"required": true, "content": {"application/json": {"schema": schema_ref("ScheduleCreate")}}}),
                );
            }
            if path == "/schedules/{id}" && method == "patch" {
                op.insert(
                    "requestBody".into(),
                    json!({"required": true, "content": {"application/json": {"schema": schema_ref("SchedulePatchBody")}}}),
                );
            }
            if path == "/tasks/{task_id}" && method == "patch" {
                op.insert(
                    "requestBody".into(),
                    json!({"required": true, "content": {"application/json": {"schema": schema_ref("TaskPatchBody")}}}),
                );
            }
            let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
                continue;
            };
            if path == "/" {
                responses.insert(
                    "200".into(),
                    json!({"description": "`null`, as mula answers",
                    "content": {"application/json": {"schema": {"type": "null"}}}}),
                );
            }
            if path == "/livez" {
                responses.insert(
                    "200".into(),
                    json!({"description": "The process is up",
                    "content": {"application/json": {"schema": {"type": "object",
                        "required": ["status"], "properties": {"status": {"type": "string"}}}}}}),
                );
            }
            let open = matches!(path.as_str(), "/" | "/livez" | "/health" | "/metrics");
            let mut add = |code: &str, response: Value| {
                responses.entry(code).or_insert(response);
            };
            if !open {
                add(
                    "400",
                    error(
                        "Bad request: a parameter or body out of bounds, or with a NUL character",
                    ),
                );
                add(
                    "401",
                    error("Tokens are configured and the request has no valid one"),
                );
                add("403", error("The request's token does not allow this"));
                add(
                    "422",
                    json!({"description": "A parameter or body that does not parse",
                    "content": {"application/json": {"schema": schema_ref("ValidationBody")}}}),
                );
                add(
                    "503",
                    error(
                        "The database is unavailable, or the scheduler is busy (see Retry-After)",
                    ),
                );
            }
            if has_body {
                add(
                    "408",
                    error("The body did not arrive within api.body_timeout_secs"),
                );
                add("413", error("The body is larger than api.max_body_bytes"));
            }
            if path == "/health" {
                add("400", error("A parameter with a NUL character"));
                add(
                    "422",
                    json!({"description": "A parameter that does not parse",
                    "content": {"application/json": {"schema": schema_ref("ValidationBody")}}}),
                );
            }
        }
    }
}
