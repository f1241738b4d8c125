//! Politeness: rate and concurrency limits per key, so a shared external API (a Shodan key every
//! organisation uses) or a scan target (one host, twenty boefjes) is not overrun.
//!
//! A rule names a key of a task, a value (or `*`: each distinct value on its own) and a limit:
//! - a **rate**, `N/S`: at most N tasks with that value dispatched in any span of S seconds (a
//!   sliding window over the dispatch times themselves, so never a burst of 2N across a
//!   boundary);
//! - a **concurrency**, `N`: at most N tasks with that value dispatched or running at once.
//!
//! Written as `key=value:limit` separated by `;`, e.g. `boefje.id=shodan:10/60;input_ooi=*:30/60`
//! (rates) and `input_ooi=*:1;boefje.id=nmap:5` (concurrency). The keys: `boefje.id` (the
//! scheduler's plugin id: a boefje's, a normalizer's or a report recipe's), `oci_image`,
//! `input_ooi`, `organisation`, and `host`: the target host read from the input object's
//! reference where its type names one (see [`host_of`]).
//!
//! [`Throttle`] is the state the scheduler's owner keeps: which tasks hold a concurrency slot and
//! when each value was last dispatched. It is pure (times are given), so its rules are tested
//! without a clock or a database; the engine asks it before each dispatch and tells it every
//! dispatch and every task that leaves flight.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use chrono::{DateTime, Duration, Utc};
use uuid::Uuid;

/// A key a limit is counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKey {
    /// The plugin id (`boefje.id`; for normalizers and reports their plugin or recipe id).
    PluginId,
    /// `oci_image`.
    OciImage,
    /// `input_ooi`: the object scanned.
    InputOoi,
    /// `organisation`.
    Organisation,
    /// The target host of the input object (see [`host_of`]).
    Host,
}

impl LimitKey {
    /// Every key, in the order the rules' text names them.
    pub const ALL: [LimitKey; 5] = [
        Self::PluginId,
        Self::OciImage,
        Self::InputOoi,
        Self::Organisation,
        Self::Host,
    ];

    /// The key's name in a rule.
    pub fn name(self) -> &'static str {
        match self {
            Self::PluginId => "boefje.id",
            Self::OciImage => "oci_image",
            Self::InputOoi => "input_ooi",
            Self::Organisation => "organisation",
            Self::Host => "host",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            // The plugin id under each scheduler's own name too.
            "boefje.id" | "plugin_id" | "normalizer.id" | "report_recipe_id" => {
                Some(Self::PluginId)
            }
            "oci_image" | "boefje.oci_image" => Some(Self::OciImage),
            "input_ooi" => Some(Self::InputOoi),
            "organisation" | "organization" => Some(Self::Organisation),
            "host" => Some(Self::Host),
            _ => None,
        }
    }
}

/// The target host of an object reference, where its type names one: the third part of a
/// `Hostname`, `IPAddressV4`, `IPAddressV6`, `IPPort`, `DNSZone`, `HostnameHTTPURL` or `Website`
/// reference (`Hostname|internet|example.com` → `example.com`, `IPPort|internet|10.0.0.1|tcp|443`
/// → `10.0.0.1`), case-folded. Octopoes' references are `Type|network|…`, the host right after
/// the network for these types. Other types (a `Finding`, a `URL`) name no host.
pub fn host_of(ooi: &str) -> Option<String> {
    let mut parts = ooi.split('|');
    let kind = parts.next()?;
    let host_at = match kind {
        "Hostname" | "IPAddressV4" | "IPAddressV6" | "IPPort" | "DNSZone" => 1,
        // `HostnameHTTPURL|https|internet|example.com|443|/`, `Website|internet|10.0.0.1|tcp|
        // 443|https|internet|example.com`: the service's own address.
        "HostnameHTTPURL" => 2,
        "Website" => 1,
        _ => return None,
    };
    let host = parts.nth(host_at)?;
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// What a rule limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// At most `n` dispatched in any span of `per`.
    Rate {
        /// Tasks.
        n: u32,
        /// The span.
        per: Duration,
    },
    /// At most `n` dispatched or running at once.
    Concurrency {
        /// Tasks.
        n: u32,
    },
}

/// One rule: a key, a value (`None`: each value on its own), a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The key counted.
    pub key: LimitKey,
    /// The value it applies to; `None` (`*`) applies to every value, each counted apart.
    pub value: Option<String>,
    /// The limit.
    pub limit: Limit,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.as_deref().unwrap_or("*");
        match self.limit {
            Limit::Rate { n, per } => {
                write!(f, "{}={value}:{n}/{}", self.key.name(), per.num_seconds())
            }
            Limit::Concurrency { n } => write!(f, "{}={value}:{n}", self.key.name()),
        }
    }
}

/// Parses rate rules, `key=value:N/S;…` (an empty text is none).
pub fn parse_rates(spec: &str) -> Result<Vec<Rule>, String> {
    parse(spec, true)
}

/// Parses concurrency rules, `key=value:N;…` (an empty text is none).
pub fn parse_concurrency(spec: &str) -> Result<Vec<Rule>, String> {
    parse(spec, false)
}

fn parse(spec: &str, rate: bool) -> Result<Vec<Rule>, String> {
    let form = if rate { "key=value:N/S" } else { "key=value:N" };
    let mut rules = Vec::new();
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = |why: &str| format!("`{part}`: {why} (a rule is {form})");
        let (lhs, limit) = part.rsplit_once(':').ok_or_else(|| bad("no limit"))?;
        let (key, value) = lhs.split_once('=').ok_or_else(|| bad("no key=value"))?;
        let key = LimitKey::parse(key.trim()).ok_or_else(|| {
            bad(&format!(
                "unknown key `{}`; the keys are {}",
                key.trim(),
                LimitKey::ALL.map(LimitKey::name).join(", ")
            ))
        })?;
        let value = match value.trim() {
            "" => return Err(bad("no value (`*` is each value)")),
            "*" => None,
            v => Some(v.to_owned()),
        };
        let whole = |s: &str, what: &str| -> Result<u32, String> {
            s.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad(&format!("{what} must be a whole number of at least 1")))
        };
        let limit = if rate {
            let (n, s) = limit.split_once('/').ok_or_else(|| bad("no /S"))?;
            Limit::Rate {
                n: whole(n, "N")?,
                per: Duration::seconds(i64::from(whole(s, "S")?)),
            }
        } else {
            if limit.contains('/') {
                return Err(bad("a concurrency has no /S"));
            }
            Limit::Concurrency {
                n: whole(limit, "N")?,
            }
        };
        rules.push(Rule { key, value, limit });
    }
    Ok(rules)
}

/// A task's values of the limit keys, borrowed from wherever the task is held (the heap, a row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyValues<'a> {
    /// The plugin id.
    pub plugin_id: Option<&'a str>,
    /// The image.
    pub oci_image: Option<&'a str>,
    /// The object.
    pub input_ooi: Option<&'a str>,
    /// The organisation.
    pub organisation: Option<&'a str>,
}

impl KeyValues<'_> {
    fn get(&self, key: LimitKey) -> Option<std::borrow::Cow<'_, str>> {
        use std::borrow::Cow;
        match key {
            LimitKey::PluginId => self.plugin_id.map(Cow::Borrowed),
            LimitKey::OciImage => self.oci_image.map(Cow::Borrowed),
            LimitKey::InputOoi => self.input_ooi.map(Cow::Borrowed),
            LimitKey::Organisation => self.organisation.map(Cow::Borrowed),
            LimitKey::Host => self.input_ooi.and_then(host_of).map(Cow::Owned),
        }
    }
}

/// What holds a task back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// A rate: `rule`'s value `value` has had its N dispatches in the span; the next may go at
    /// `until`.
    Rate {
        /// The rule, as written.
        rule: String,
        /// The value counted.
        value: String,
        /// When the oldest dispatch in the span leaves it.
        until: DateTime<Utc>,
    },
    /// A concurrency: `rule`'s value `value` has N tasks in flight, among them `holder`.
    Concurrency {
        /// The rule, as written.
        rule: String,
        /// The value counted.
        value: String,
        /// One of the tasks holding the slots (the oldest dispatched).
        holder: Uuid,
    },
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rate { rule, value, until } => write!(
                f,
                "rate limit {rule} of {value} reached; the next may go at {}",
                until.to_rfc3339()
            ),
            Self::Concurrency {
                rule,
                value,
                holder,
            } => write!(
                f,
                "concurrency limit {rule} of {value} held, by task {holder} and others"
            ),
        }
    }
}

/// One scheduler's limits and what counts against them.
#[derive(Debug, Default)]
pub struct Throttle {
    rules: Vec<Rule>,
    /// Per (rule, value): the dispatch times in its span, oldest first (at most N).
    sent: HashMap<(usize, String), VecDeque<DateTime<Utc>>>,
    /// Per (rule, value): the tasks in flight, in dispatch order.
    held: HashMap<(usize, String), VecDeque<Uuid>>,
    /// Per task in flight: the (rule, value) slots it holds.
    slots: HashMap<Uuid, Vec<(usize, String)>>,
    /// `sent`'s size that makes the next dispatch forget the values whose span has passed.
    sweep_at: usize,
}

/// `sent` entries kept at least before a sweep: the sweep is amortised over as many dispatches.
const SWEEP_FLOOR: usize = 1024;

impl Throttle {
    /// Limits by these rules.
    pub fn new(rules: Vec<Rule>) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    /// Whether any rule is set (no rules: every check is skipped).
    pub fn is_active(&self) -> bool {
        !self.rules.is_empty()
    }

    /// The rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The longest rate span, or, with only concurrency rules, none at all (`Some(0)`): how far
    /// back a rebuild must count finished tasks. `None`: no rules.
    pub fn longest_span(&self) -> Option<Duration> {
        if self.rules.is_empty() {
            return None;
        }
        Some(
            self.rules
                .iter()
                .filter_map(|r| match r.limit {
                    Limit::Rate { per, .. } => Some(per),
                    Limit::Concurrency { .. } => None,
                })
                .max()
                .unwrap_or_else(Duration::zero),
        )
    }

    /// The (rule, value) pairs that apply to a task.
    fn applying<'a>(
        &'a self,
        keys: &'a KeyValues<'a>,
    ) -> impl Iterator<Item = (usize, String)> + 'a {
        self.rules.iter().enumerate().filter_map(move |(i, r)| {
            let v = keys.get(r.key)?;
            match &r.value {
                Some(want) if *want != v => None,
                _ => Some((i, v.into_owned())),
            }
        })
    }

    /// What holds a task with these keys back now, if anything.
    pub fn hold(&self, keys: &KeyValues, now: DateTime<Utc>) -> Option<Hold> {
        for (i, value) in self.applying(keys) {
            let rule = &self.rules[i];
            match rule.limit {
                Limit::Rate { n, per } => {
                    let Some(sent) = self.sent.get(&(i, value.clone())) else {
                        continue;
                    };
                    let in_span = sent.iter().filter(|t| **t > now - per).count();
                    if in_span >= n as usize {
                        // The span frees up when the oldest of the last N leaves it.
                        let oldest = sent[sent.len() - n as usize];
                        return Some(Hold::Rate {
                            rule: rule.to_string(),
                            value,
                            until: oldest + per,
                        });
                    }
                }
                Limit::Concurrency { n } => {
                    if let Some(held) = self.held.get(&(i, value.clone()))
                        && held.len() >= n as usize
                    {
                        return Some(Hold::Concurrency {
                            rule: rule.to_string(),
                            value,
                            holder: held.front().copied().unwrap_or_default(),
                        });
                    }
                }
            }
        }
        None
    }

    /// Whether a task with these keys may be dispatched now.
    pub fn admits(&self, keys: &KeyValues, now: DateTime<Utc>) -> bool {
        !self.is_active() || self.hold(keys, now).is_none()
    }

    /// A task was dispatched at `at` (now, or, for what a rebuild finds in the table, the last
    /// change of a task in flight: never earlier than its dispatch, so the span it is counted in
    /// ends no sooner than the real one). `in_flight`: whether it holds concurrency slots.
    pub fn dispatched(&mut self, id: Uuid, keys: &KeyValues, at: DateTime<Utc>, in_flight: bool) {
        if !self.is_active() {
            return;
        }
        let applying: Vec<(usize, String)> = self.applying(keys).collect();
        for (i, value) in &applying {
            if let Limit::Rate { n, per } = self.rules[*i].limit {
                let sent = self.sent.entry((*i, value.clone())).or_default();
                let at_most = n as usize;
                // Kept sorted (a rebuild adds past times in any order); only the last N matter
                // to the window.
                let pos = sent.partition_point(|t| *t <= at);
                sent.insert(pos, at);
                while sent.len() > at_most || sent.front().is_some_and(|t| *t <= at - per) {
                    sent.pop_front();
                }
            }
        }
        if in_flight {
            self.take_slots(id, &applying);
        }
        // A `*` rule counts every value it ever met (each object, each host): the values whose
        // span has passed count nothing and are forgotten, once the map has doubled since the
        // last sweep, so a long uptime's values do not pile up and a sweep costs O(1) a dispatch.
        if self.sent.len() > self.sweep_at.max(SWEEP_FLOOR) {
            let rules = &self.rules;
            self.sent.retain(|(i, _), times| match rules[*i].limit {
                Limit::Rate { per, .. } => times.back().is_some_and(|t| *t > at - per),
                Limit::Concurrency { .. } => false,
            });
            self.sweep_at = self.sent.len().saturating_mul(2);
        }
    }

    /// A task in flight that holds no slots takes its concurrency slots (no rate is counted: it
    /// was counted when it was dispatched). A task whose lease ended freed its slots; its
    /// holder's late `running` puts it back in flight, where it counts again. Asked for every
    /// task a batch leaves in flight (each pop's among them, which took its slots already), so
    /// the rules apply to it only when it holds none and a concurrency rule is set.
    pub fn in_flight_again(&mut self, id: Uuid, keys: &KeyValues) {
        if self.slots.contains_key(&id)
            || !self
                .rules
                .iter()
                .any(|r| matches!(r.limit, Limit::Concurrency { .. }))
        {
            return;
        }
        let applying: Vec<(usize, String)> = self.applying(keys).collect();
        self.take_slots(id, &applying);
    }

    /// `id` holds a slot of each concurrency rule among `applying` (rule, value).
    fn take_slots(&mut self, id: Uuid, applying: &[(usize, String)]) {
        let mut slots = Vec::new();
        for (i, value) in applying {
            if let Limit::Concurrency { .. } = self.rules[*i].limit {
                let key = (*i, value.clone());
                let held = self.held.entry(key.clone()).or_default();
                if !held.contains(&id) {
                    held.push_back(id);
                }
                slots.push(key);
            }
        }
        if !slots.is_empty() {
            self.slots.insert(id, slots);
        }
    }

    /// A task left flight (finished, failed, cancelled, or taken back): its slots are free.
    pub fn released(&mut self, id: &Uuid) {
        let Some(slots) = self.slots.remove(id) else {
            return;
        };
        for key in slots {
            if let Some(held) = self.held.get_mut(&key) {
                held.retain(|x| x != id);
                if held.is_empty() {
                    self.held.remove(&key);
                }
            }
        }
    }

    /// Whether a task holds slots.
    pub fn holds(&self, id: &Uuid) -> bool {
        self.slots.contains_key(id)
    }

    /// The same rules with nothing counted (a rebuild counts again from the table).
    pub fn emptied(&self) -> Self {
        Self::new(self.rules.clone())
    }

    /// The dispatches counted against a rate and the tasks holding a concurrency, per rule as
    /// written and value: for the metrics and for explaining a wait.
    pub fn in_use(&self, now: DateTime<Utc>) -> Vec<(String, String, usize)> {
        let mut out: Vec<(String, String, usize)> = Vec::new();
        for ((i, value), sent) in &self.sent {
            if let Limit::Rate { per, .. } = self.rules[*i].limit {
                let n = sent.iter().filter(|t| **t > now - per).count();
                if n > 0 {
                    out.push((self.rules[*i].to_string(), value.clone(), n));
                }
            }
        }
        for ((i, value), held) in &self.held {
            out.push((self.rules[*i].to_string(), value.clone(), held.len()));
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn boefje<'a>(id: &'a str, ooi: &'a str) -> KeyValues<'a> {
        KeyValues {
            plugin_id: Some(id),
            oci_image: Some(id),
            input_ooi: Some(ooi),
            organisation: Some("org"),
        }
    }

    #[test]
    fn rules_parse_as_written_and_name_what_is_wrong() {
        let r = parse_rates("boefje.id=shodan:10/60; input_ooi=*:30/60").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].to_string(), "boefje.id=shodan:10/60");
        assert_eq!(r[1].value, None);
        let c = parse_concurrency("input_ooi=*:1;boefje.id=nmap:5;host=*:2").unwrap();
        assert_eq!(c[2].key, LimitKey::Host);
        assert_eq!(c[1].limit, Limit::Concurrency { n: 5 });
        assert!(parse_rates("").unwrap().is_empty());
        for (bad, rate, says) in [
            ("boefje.id=shodan", true, "no limit"),
            ("shodan:10/60", true, "no key=value"),
            ("colour=red:1/1", true, "unknown key `colour`"),
            ("boefje.id=:1/1", true, "no value"),
            ("boefje.id=x:10", true, "no /S"),
            ("boefje.id=x:0/60", true, "N must be"),
            ("boefje.id=x:1/0", true, "S must be"),
            ("boefje.id=x:1/60", false, "no /S"),
            ("boefje.id=x:many", false, "N must be"),
        ] {
            let e = if rate {
                parse_rates(bad)
            } else {
                parse_concurrency(bad)
            }
            .unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_host_is_read_where_the_reference_names_one() {
        for (ooi, host) in [
            ("Hostname|internet|Example.COM", Some("example.com")),
            ("IPAddressV4|internet|10.0.0.1", Some("10.0.0.1")),
            ("IPPort|internet|10.0.0.1|tcp|443", Some("10.0.0.1")),
            ("DNSZone|internet|example.com", Some("example.com")),
            (
                "HostnameHTTPURL|https|internet|example.com|443|/",
                Some("example.com"),
            ),
            (
                "Website|internet|10.0.0.2|tcp|443|https|internet|example.com",
                Some("10.0.0.2"),
            ),
            ("Finding|Hostname|internet|example.com|KAT-X", None),
            ("Network|internet", None),
        ] {
            assert_eq!(host_of(ooi).as_deref(), host, "{ooi}");
        }
    }

    #[test]
    fn a_rate_is_a_sliding_window_never_a_double_burst_across_a_boundary() {
        let mut th = Throttle::new(parse_rates("boefje.id=limited:5/2").unwrap());
        let limited = boefje("limited", "Hostname|internet|a");
        let free = boefje("free", "Hostname|internet|a");
        // Five at 1.9 s: the sixth waits for the first to leave the span, at 3.9 s, not at a
        // boundary at 2 s.
        let at = t(0) + Duration::milliseconds(1_900);
        for _ in 0..5 {
            assert!(th.admits(&limited, at));
            th.dispatched(Uuid::new_v4(), &limited, at, true);
        }
        assert!(!th.admits(&limited, at));
        assert!(th.admits(&free, at), "other work flows");
        let two_later = t(2) + Duration::milliseconds(100);
        assert!(!th.admits(&limited, two_later), "no second burst at 2.1 s");
        match th.hold(&limited, two_later) {
            Some(Hold::Rate { until, .. }) => {
                assert_eq!(until, t(3) + Duration::milliseconds(900))
            }
            other => panic!("{other:?}"),
        }
        assert!(th.admits(&limited, t(3) + Duration::milliseconds(901)));
        // In any span of 2 s, at most 5: dispatch whenever admitted, every 10 ms, for 10 s.
        let mut th = Throttle::new(parse_rates("boefje.id=limited:5/2").unwrap());
        let mut sent = Vec::new();
        for ms in (0..10_000).step_by(10) {
            let now = t(0) + Duration::milliseconds(ms);
            if th.admits(&limited, now) {
                th.dispatched(Uuid::new_v4(), &limited, now, false);
                sent.push(ms);
            }
        }
        for (i, start) in sent.iter().enumerate() {
            let in_span = sent[i..].iter().take_while(|x| **x < start + 2_000).count();
            assert!(in_span <= 5, "{in_span} within 2 s of {start} ms");
        }
        assert_eq!(sent.len(), 25, "five per span, no fewer");
    }

    #[test]
    fn a_concurrency_holds_until_a_task_leaves_flight_each_value_apart() {
        let mut th = Throttle::new(parse_concurrency("input_ooi=*:1;boefje.id=nmap:2").unwrap());
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let host1 = boefje("dns", "Hostname|internet|one");
        th.dispatched(a, &host1, t(0), true);
        assert_eq!(
            th.hold(&boefje("whois", "Hostname|internet|one"), t(0)),
            Some(Hold::Concurrency {
                rule: "input_ooi=*:1".into(),
                value: "Hostname|internet|one".into(),
                holder: a,
            })
        );
        assert!(
            th.admits(&boefje("whois", "Hostname|internet|two"), t(0)),
            "another object"
        );
        th.dispatched(b, &boefje("nmap", "Hostname|internet|two"), t(0), true);
        th.dispatched(c, &boefje("nmap", "Hostname|internet|three"), t(0), true);
        assert!(!th.admits(&boefje("nmap", "Hostname|internet|four"), t(0)));
        th.released(&b);
        assert!(th.admits(&boefje("nmap", "Hostname|internet|four"), t(0)));
        th.released(&a);
        assert!(th.admits(&boefje("whois", "Hostname|internet|one"), t(0)));
        th.released(&a);
        assert!(!th.holds(&a), "released twice is released");
        assert_eq!(
            th.in_use(t(0)),
            vec![
                ("boefje.id=nmap:2".into(), "nmap".into(), 1),
                ("input_ooi=*:1".into(), "Hostname|internet|three".into(), 1)
            ]
        );
    }

    #[test]
    fn values_whose_span_has_passed_are_forgotten_as_values_pile_up() {
        let mut th = Throttle::new(parse_rates("input_ooi=*:2/60").unwrap());
        for i in 0..3000 {
            let ooi = format!("Hostname|internet|h{i}.nl");
            th.dispatched(Uuid::new_v4(), &boefje("dns", &ooi), t(0), false);
        }
        assert_eq!(th.sent.len(), 3000, "each value still in its span counts");
        // A minute later the earlier values count nothing: the next sweep forgets them, and a
        // value still in its span keeps its count.
        let recent = "Hostname|internet|recent.nl";
        th.dispatched(Uuid::new_v4(), &boefje("dns", recent), t(59), false);
        th.dispatched(Uuid::new_v4(), &boefje("dns", recent), t(59), false);
        for i in 0..3000 {
            let ooi = format!("Hostname|internet|later{i}.nl");
            th.dispatched(Uuid::new_v4(), &boefje("dns", &ooi), t(61), false);
        }
        assert!(
            !th.sent
                .keys()
                .any(|(_, v)| v.starts_with("Hostname|internet|h")),
            "the first minute's values are forgotten"
        );
        assert_eq!(th.sent.len(), 3001);
        assert!(
            !th.admits(&boefje("dns", recent), t(62)),
            "still 2 in its minute"
        );
        assert!(th.admits(&boefje("dns", recent), t(120)));
    }

    #[test]
    fn no_rules_no_checks() {
        let th = Throttle::default();
        assert!(!th.is_active());
        assert!(th.admits(&boefje("x", "y"), t(0)));
    }
}
