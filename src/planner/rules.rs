//! The planning rules, pure: what work an event asks for. An object event yields a boefje task
//! for every plugin of the organisation that may run on the object (see [`Plugin::runs_on`]); a
//! raw file yields a normalizer task for every enabled normalizer that parses one of its mime
//! types, none for a file whose mime types say it is an error (`error/…`); a boefje task may get
//! de-duplication siblings in the organisations that share its boefje's runs. The task data is
//! the payload the upstream runners validate (reference §4.1).

use serde_json::{Map, Value, json};

use uuid::Uuid;

use crate::domain::event::{ObjectEvent, Operation, RawFileEvent};
use crate::domain::plugin::Plugin;
use crate::queue::PushRequest;

/// Boefje tasks for an object event (none for a delete), each with `priority`.
pub fn boefje_tasks(event: &ObjectEvent, plugins: &[Plugin], priority: i64) -> Vec<PushRequest> {
    let Some(object) = &event.object else {
        return Vec::new();
    };
    let runs = plugins
        .iter()
        .filter(|p| p.runs_on(&object.object_type, object.scan_level, event.operation));
    tasks_of(event, runs, priority)
}

/// A boefje task of `event`'s object for each of `boefjes`, with `priority`.
fn tasks_of<'a>(
    event: &ObjectEvent,
    boefjes: impl Iterator<Item = &'a Plugin>,
    priority: i64,
) -> Vec<PushRequest> {
    boefjes
        .map(|p| {
            push(
                &event.organisation,
                priority,
                boefje_data(p, &event.reference, &event.organisation),
            )
        })
        .collect()
}

/// The task of one boefje newly enabled in the event's organisation, if it may scan the object:
/// whatever operations its `run_on` names, as mula's `process_new_boefjes` plans every boefje it
/// finds enabled (an event-only boefje enabled later otherwise waits for the object to change).
pub fn enabled_boefje_tasks(
    event: &ObjectEvent,
    plugins: &[Plugin],
    boefje: &str,
    priority: i64,
) -> Vec<PushRequest> {
    let Some(object) = &event.object else {
        return Vec::new();
    };
    let runs = plugins
        .iter()
        .filter(|p| p.id == boefje && p.may_scan(&object.object_type, object.scan_level));
    tasks_of(event, runs, priority)
}

/// A boefje task's payload (mula's `BoefjeTask`).
pub fn boefje_data(p: &Plugin, reference: &str, organisation: &str) -> Value {
    json!({
        "boefje": {
            "id": p.id,
            "name": p.name,
            "version": p.version,
            "oci_image": p.oci_image,
        },
        "input_ooi": reference,
        "organization": organisation,
        "deduplication_key": null,
        "dispatches": [],
    })
}

/// Another organisation that holds the same object, as its frontier row and catalogue say.
#[derive(Debug, Clone)]
pub struct Holder<'a> {
    /// The organisation.
    pub organisation: &'a str,
    /// The object's type there.
    pub object_type: &'a str,
    /// The object's scan level there.
    pub scan_level: Option<i64>,
    /// The organisation's plugins.
    pub plugins: &'a [Plugin],
}

/// Turns `task` (a boefje task of one organisation) into the leader of a de-duplication group
/// with a sibling for each holder that may run the same boefje on the object there (mula's
/// cross-organisation de-duplication): every member carries the leader's id as
/// `deduplication_key`, so a pop hands them out together and the runner runs the boefje once.
/// Returns the siblings (none: `task` is left as it was).
pub fn siblings(
    task: &mut PushRequest,
    operation: Operation,
    holders: &[Holder<'_>],
) -> Vec<PushRequest> {
    let Some(boefje) = task
        .data
        .get("boefje")
        .and_then(|b| b.get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return Vec::new();
    };
    let Some(reference) = task
        .data
        .get("input_ooi")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return Vec::new();
    };
    // A task that has its id already (a schedule's fire, whose id is its fire's) leads under
    // it; a planned one gets one.
    let leader = task.id.unwrap_or_else(Uuid::new_v4);
    let key = Value::String(leader.hyphenated().to_string());
    let out: Vec<PushRequest> = holders
        .iter()
        .filter(|h| h.organisation != task.organisation)
        .filter_map(|h| {
            let p = h
                .plugins
                .iter()
                .find(|p| p.id == boefje && p.runs_on(h.object_type, h.scan_level, operation))?;
            let mut sibling = push(
                h.organisation,
                task.priority.unwrap_or(1),
                boefje_data(p, &reference, h.organisation),
            );
            sibling.data.insert("deduplication_key".into(), key.clone());
            Some(sibling)
        })
        .collect();
    if !out.is_empty() {
        task.id = Some(leader);
        task.data.insert("id".into(), key.clone());
        task.data.insert("deduplication_key".into(), key);
    }
    out
}

/// Normalizer tasks for a raw file, each with `priority`.
pub fn normalizer_tasks(
    event: &RawFileEvent,
    plugins: &[Plugin],
    priority: i64,
) -> Vec<PushRequest> {
    if event.mime_types.iter().any(|m| m.starts_with("error/")) {
        return Vec::new();
    }
    let mut seen: Vec<&str> = Vec::new();
    plugins
        .iter()
        .filter(|p| p.parses(&event.mime_types))
        .filter(|p| {
            // One task per normalizer, however many of its mime types the file has.
            let new = !seen.contains(&p.id.as_str());
            seen.push(&p.id);
            new
        })
        .map(|p| {
            let data = json!({
                "normalizer": {"id": p.id, "name": p.name, "version": p.version},
                "raw_data": Value::Object(event.raw_data.clone()),
            });
            push(&event.organisation, priority, data)
        })
        .collect()
}

fn push(organisation: &str, priority: i64, data: Value) -> PushRequest {
    let data = match data {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    PushRequest {
        organisation: organisation.to_owned(),
        priority: Some(priority),
        data,
        // Planned work waits for its previous run to finish (no concurrent invocation).
        planned: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{ObjectState, Operation};
    use crate::domain::plugin::PluginType;
    use uuid::Uuid;

    fn plugin(id: &str, t: PluginType, consumes: &[&str], level: Option<i64>) -> Plugin {
        Plugin {
            id: id.into(),
            plugin_type: t,
            name: Some(id.into()),
            version: None,
            enabled: true,
            consumes: consumes.iter().map(|s| (*s).to_owned()).collect(),
            scan_level: level,
            interval: None,
            cron: None,
            run_on: None,
            oci_image: Some(format!("img/{id}")),
            deduplicate: false,
        }
    }

    #[test]
    fn an_object_gets_a_task_per_boefje_that_may_run_on_it() {
        let plugins = vec![
            plugin("dns-records", PluginType::Boefje, &["Hostname"], Some(1)),
            plugin("nmap", PluginType::Boefje, &["IPAddressV4"], Some(2)),
            plugin("intrusive", PluginType::Boefje, &["Hostname"], Some(3)),
            plugin(
                "kat_dns",
                PluginType::Normalizer,
                &["boefje/dns-records"],
                None,
            ),
        ];
        let event = ObjectEvent {
            operation: Operation::Create,
            organisation: "org1".into(),
            reference: "Hostname|internet|a.nl".into(),
            object: Some(ObjectState {
                object_type: "Hostname".into(),
                scan_level: Some(2),
                scan_profile_type: None,
            }),
        };
        let tasks = boefje_tasks(&event, &plugins, 7);
        assert_eq!(tasks.len(), 1);
        let data = &tasks[0].data;
        assert_eq!(data["boefje"]["id"], "dns-records");
        assert_eq!(data["boefje"]["oci_image"], "img/dns-records");
        assert_eq!(data["input_ooi"], "Hostname|internet|a.nl");
        assert_eq!(data["organization"], "org1");
        assert_eq!(tasks[0].priority, Some(7));
        let delete = ObjectEvent {
            operation: Operation::Delete,
            object: None,
            ..event
        };
        assert!(boefje_tasks(&delete, &plugins, 7).is_empty());
    }

    #[test]
    fn a_boefje_enabled_later_runs_on_what_it_may_scan_whatever_its_run_on() {
        let on_update = Plugin {
            run_on: Some(vec!["update".into()]),
            ..plugin("cert-check", PluginType::Boefje, &["Hostname"], Some(1))
        };
        let plugins = vec![
            on_update.clone(),
            plugin("dns-records", PluginType::Boefje, &["Hostname"], Some(1)),
            plugin("intrusive", PluginType::Boefje, &["Hostname"], Some(3)),
        ];
        let event = ObjectEvent {
            operation: Operation::Create,
            organisation: "org1".into(),
            reference: "Hostname|internet|a.nl".into(),
            object: Some(ObjectState {
                object_type: "Hostname".into(),
                scan_level: Some(2),
                scan_profile_type: None,
            }),
        };
        // An event plans it only on the operations it names.
        let ids = |tasks: Vec<PushRequest>| -> Vec<String> {
            tasks
                .iter()
                .map(|t| t.data["boefje"]["id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids(boefje_tasks(&event, &plugins, 7)), ["dns-records"]);
        assert_eq!(
            ids(enabled_boefje_tasks(&event, &plugins, "cert-check", 7)),
            ["cert-check"]
        );
        assert!(enabled_boefje_tasks(&event, &plugins, "intrusive", 7).is_empty());
        let disabled = vec![Plugin {
            enabled: false,
            ..on_update
        }];
        assert!(enabled_boefje_tasks(&event, &disabled, "cert-check", 7).is_empty());
    }

    #[test]
    fn a_raw_file_gets_one_task_per_normalizer_and_none_when_it_is_an_error() {
        let plugins = vec![
            plugin(
                "kat_dns",
                PluginType::Normalizer,
                &["boefje/dns-records", "text/plain"],
                None,
            ),
            plugin("kat_other", PluginType::Normalizer, &["boefje/nmap"], None),
        ];
        let mut event = RawFileEvent {
            organisation: "org1".into(),
            raw_id: Uuid::new_v4(),
            mime_types: vec!["boefje/dns-records".into(), "text/plain".into()],
            raw_data: Map::new(),
            ended_at: None,
        };
        let tasks = normalizer_tasks(&event, &plugins, 3);
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].data["normalizer"]["id"], "kat_dns");
        event.mime_types.push("error/boefje".into());
        assert!(normalizer_tasks(&event, &plugins, 3).is_empty());
    }
}
