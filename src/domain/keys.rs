//! The fields workers and the webapp select tasks by, and how each is read from a task.
//!
//! Real runners pop with `data.boefje.oci_image in […]` and `data.boefje.id in […]`; scripts
//! and the webapp filter on `organisation` and `data.input_ooi`. These *key fields* are kept
//! apart from the payload: in memory, where each heap indexes its queued tasks by them, and in
//! the `tasks` table (`plugin_id`, `oci_image`, `input_ooi` next to `organisation`), where the
//! pending backlog is indexed by them. A filter on any other field is still answered, by
//! evaluating it, but not through an index.

use serde_json::{Map, Value};

use super::SchedulerId;

/// A field a task can be found by without reading its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyField {
    /// The `organisation` column.
    Organisation,
    /// The scheduler's plugin: `data.boefje.id` (boefje), `data.normalizer.id` (normalizer) or
    /// `data.report_recipe_id` (report).
    PluginId,
    /// `data.boefje.oci_image`.
    OciImage,
    /// `data.input_ooi`.
    InputOoi,
    /// `data.deduplication_key` of a boefje task: the group of sibling tasks, one per
    /// organisation, that run the same boefje on the same object (see [`crate::planner`]).
    DedupKey,
}

impl KeyField {
    /// Every key field, in index order.
    pub const ALL: [KeyField; KeyField::COUNT] = [
        Self::Organisation,
        Self::PluginId,
        Self::OciImage,
        Self::InputOoi,
        Self::DedupKey,
    ];

    /// How many key fields there are.
    pub const COUNT: usize = 5;

    /// A dense index, for per-field arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The `tasks` column that holds the field.
    pub fn column(self) -> &'static str {
        match self {
            Self::Organisation => "organisation",
            Self::PluginId => "plugin_id",
            Self::OciImage => "oci_image",
            Self::InputOoi => "input_ooi",
            Self::DedupKey => "deduplication_key",
        }
    }

    /// The key field a `data` path names on `scheduler`'s tasks, if any.
    pub fn of_data_path(scheduler: SchedulerId, path: &[String]) -> Option<KeyField> {
        // Called for every candidate a filter is evaluated on: compares without allocating.
        let is =
            |want: &[&str]| path.len() == want.len() && path.iter().zip(want).all(|(a, b)| a == b);
        if is(plugin_path(scheduler)) {
            Some(Self::PluginId)
        } else if is(&["boefje", "oci_image"]) {
            Some(Self::OciImage)
        } else if is(&["input_ooi"]) {
            Some(Self::InputOoi)
        } else if scheduler == SchedulerId::Boefje && is(DEDUP_PATH) {
            Some(Self::DedupKey)
        } else {
            None
        }
    }

    /// How selective a lookup on this field usually is, most selective first: an object
    /// reference names few tasks, an organisation many.
    pub fn selectivity_rank(self) -> u8 {
        match self {
            Self::DedupKey => 0,
            Self::InputOoi => 1,
            Self::PluginId => 2,
            Self::OciImage => 3,
            Self::Organisation => 4,
        }
    }
}

/// Where a boefje task names its de-duplication group (mula's `BoefjeTask.deduplication_key`).
pub const DEDUP_PATH: &[&str] = &["deduplication_key"];

/// Where `scheduler`'s payload names its plugin.
pub fn plugin_path(scheduler: SchedulerId) -> &'static [&'static str] {
    match scheduler {
        SchedulerId::Boefje => &["boefje", "id"],
        SchedulerId::Normalizer => &["normalizer", "id"],
        SchedulerId::Report => &["report_recipe_id"],
    }
}

/// The key fields of one payload (`organisation` is a column of its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataKeys {
    /// See [`KeyField::PluginId`].
    pub plugin_id: Option<String>,
    /// See [`KeyField::OciImage`].
    pub oci_image: Option<String>,
    /// See [`KeyField::InputOoi`].
    pub input_ooi: Option<String>,
    /// See [`KeyField::DedupKey`].
    pub deduplication_key: Option<String>,
}

impl DataKeys {
    /// Reads the key fields of `scheduler`'s payload `data`.
    pub fn of(scheduler: SchedulerId, data: &Map<String, Value>) -> Self {
        Self {
            plugin_id: text_at(data, plugin_path(scheduler)),
            oci_image: text_at(data, &["boefje", "oci_image"]),
            input_ooi: text_at(data, &["input_ooi"]),
            deduplication_key: match scheduler {
                SchedulerId::Boefje => text_at(data, DEDUP_PATH),
                _ => None,
            },
        }
    }

    /// The value of a payload key field (`None` for the organisation, which is a column).
    pub fn get(&self, field: KeyField) -> Option<&str> {
        match field {
            KeyField::Organisation => None,
            KeyField::PluginId => self.plugin_id.as_deref(),
            KeyField::OciImage => self.oci_image.as_deref(),
            KeyField::InputOoi => self.input_ooi.as_deref(),
            KeyField::DedupKey => self.deduplication_key.as_deref(),
        }
    }

    /// Reads the key fields from payload JSON text; a payload that is not a JSON object has none.
    pub fn of_json(scheduler: SchedulerId, data: &str) -> Self {
        match serde_json::from_str::<Value>(data) {
            Ok(Value::Object(map)) => Self::of(scheduler, &map),
            _ => Self::default(),
        }
    }
}

/// The value at `path` in its text form (see [`text_form`]); `None` when absent or JSON null.
fn text_at(data: &Map<String, Value>, path: &[&str]) -> Option<String> {
    let (first, rest) = path.split_first()?;
    let mut v = data.get(*first)?;
    for key in rest {
        v = v.as_object()?.get(*key)?;
    }
    text_form(v)
}

/// How a JSON value compares as text, as PostgreSQL's `#>>` renders it: a string is itself, a
/// number or boolean its JSON spelling, an object or array its compact JSON, null is SQL NULL.
pub fn text_form(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
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
    fn each_scheduler_names_its_plugin_in_its_own_place() {
        let boefje = map(json!({"boefje": {"id": "nmap", "oci_image": "img"}, "input_ooi": "o"}));
        assert_eq!(
            DataKeys::of(SchedulerId::Boefje, &boefje),
            DataKeys {
                plugin_id: Some("nmap".into()),
                oci_image: Some("img".into()),
                input_ooi: Some("o".into()),
                deduplication_key: None,
            }
        );
        let normalizer = map(json!({"normalizer": {"id": "kat_n"}, "boefje": {"id": "x"}}));
        assert_eq!(
            DataKeys::of(SchedulerId::Normalizer, &normalizer).plugin_id,
            Some("kat_n".into())
        );
        let report = map(json!({"report_recipe_id": "r1"}));
        assert_eq!(
            DataKeys::of(SchedulerId::Report, &report).plugin_id,
            Some("r1".into())
        );
    }

    #[test]
    fn null_and_missing_are_absent_and_scalars_keep_their_json_spelling() {
        let data = map(json!({"input_ooi": null, "boefje": {"id": 5, "oci_image": true}}));
        let keys = DataKeys::of(SchedulerId::Boefje, &data);
        assert_eq!(keys.input_ooi, None);
        assert_eq!(keys.plugin_id.as_deref(), Some("5"));
        assert_eq!(keys.oci_image.as_deref(), Some("true"));
        assert_eq!(
            DataKeys::of_json(SchedulerId::Boefje, "[1]"),
            DataKeys::default()
        );
    }

    #[test]
    fn data_paths_map_to_key_fields_per_scheduler() {
        let p = |s: &str| s.split("__").map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            KeyField::of_data_path(SchedulerId::Boefje, &p("boefje__id")),
            Some(KeyField::PluginId)
        );
        assert_eq!(
            KeyField::of_data_path(SchedulerId::Normalizer, &p("boefje__id")),
            None
        );
        assert_eq!(
            KeyField::of_data_path(SchedulerId::Normalizer, &p("boefje__oci_image")),
            Some(KeyField::OciImage)
        );
        assert_eq!(
            KeyField::of_data_path(SchedulerId::Report, &p("report_recipe_id")),
            Some(KeyField::PluginId)
        );
        assert_eq!(
            KeyField::of_data_path(SchedulerId::Boefje, &p("depth")),
            None
        );
    }
}
