//! Cron expressions as Python's croniter (6.0) reads and evaluates them. mula checks a schedule
//! by asking croniter for its next fire from now and sets deadlines the same way, in UTC; users'
//! schedules and scripts were written against that. This is an evaluator of our own that gives
//! croniter's answers for its five-field language, its quirks included (listed below), so that a
//! schedule fires here when it fired under mula. Pure: no IO, no clock.
//!
//! # The language
//!
//! Five fields, split on whitespace: minute (0-59), hour (0-23), day of month (1-31), month
//! (1-12), day of week (0-6, Sunday 0 or 7). Letters are case-insensitive. A field is a comma
//! list of items: `*`, a number, a range `a-b`, a step `*/n`, `a-b/n` or `a/n` (= `a-max/n`);
//! months and weekdays also by their three-letter English names (`jan`, `mon`), in ranges too
//! (`mon-fri`, `nov-feb`). Day of month: `L` is the last day, `a-L` runs to 31, `?` is `*`. Day of
//! week: `?` is `*`, `d#n` the n-th (1-5) such weekday of the month (`mon#2`, `mon-wed#2`), `Ld`
//! the last one (`L5`: the last Friday; croniter refuses `5L`). Nicknames, alone: `@yearly`,
//! `@annually` (`0 0 1 1 *`), `@monthly` (`0 0 1 * *`), `@weekly` (`0 0 * * 0`), `@daily`,
//! `@midnight` (`0 0 * * *`), `@hourly` (`0 * * * *`).
//!
//! A day matches when the day of month *or* the day of week matches, if both are restricted. A
//! field is restricted unless it is `*` or `?`, holds a `*` item (`*,5`), or lists every value
//! (`0-59`), with one exception: a day of month listing all 31 days (or a day of week all 7)
//! stays restricted when the other day field's text has no `*`. So `*/2` restricts (odd days),
//! and `0 0 1-31 * 1` fires every day.
//!
//! # croniter's quirks, kept
//!
//! - `a-a` is the whole field (`5-5` in minutes is every minute), and `a-a/n` steps through it.
//! - A reversed range wraps (`fri-mon`, `nov-feb`, `50-10`); with a step, the values after the
//!   wrap start where croniter puts them, which is one later than counting on would
//!   (`50-10/7` is 50, 57, 5).
//! - The search moves a day-of-month field to the next listed day even past the month's end and
//!   goes on from where that lands: `0 0 1,30 * *` from 20 February next fires on 30 March
//!   (1 March is skipped), and `15,31,L` skips the last day of a 30-day month after the 15th.
//! - `#` and `L` in the day of week replace the plain weekdays of that field (`*,sat#3` is the
//!   third Saturday only; mixing them with plain weekdays is refused, as croniter does). With
//!   a restricted day of month they fire alone (the listed days add none), and only if both
//!   fields meet on some day within the horizon: `0 0 8-14 * 1#2` is the second Monday,
//!   `0 0 1 * 1#2` never fires.
//! - Nothing fires when the search passes 50 years (croniter's `max_years_between_matches`):
//!   `0 0 30 2 *` is valid syntax that never fires, which mula refuses.
//!
//! # Not taken, though croniter has them
//!
//! - A sixth (seconds) or seventh (year) field. mula accepts them (its check only asks croniter
//!   for a next fire), but no KAT client writes them: Rocky's report schedules and the plugin
//!   catalogue's crons have five fields, and a seconds field would let one schedule come due
//!   every second, a task per reschedule tick. Refused with a reason, as before.
//! - `R` (random) and `H` (hashed) fields: `R` picks new times each time it is read, so a
//!   schedule's deadline would not be the time it next fires; `H` needs a hash id, which mula
//!   does not give, so croniter refuses it there too.
//! - Digits other than ASCII `0-9` (Python's `int` reads other scripts' digits).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, Timelike, Utc};

/// Years the search for a next fire goes on before it gives up (croniter's default
/// `max_years_between_matches`).
pub const HORIZON_YEARS: i32 = 50;

/// The nicknames croniter knows (without a hash id) and the expressions they stand for.
pub const NICKNAMES: [(&str, &str); 7] = [
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
    ("@daily", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"),
    ("@monthly", "0 0 1 * *"),
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
];

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// A cron expression that cannot be used; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cron expression '{expression}': {reason}")]
pub struct CronError {
    /// The expression as given.
    pub expression: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A parsed cron expression (croniter's five-field language, see the module's documentation).
#[derive(Clone, PartialEq, Eq)]
pub struct CronExpr {
    text: String,
    spec: Spec,
}

impl std::fmt::Debug for CronExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CronExpr({})", self.text)
    }
}

impl CronExpr {
    /// Parses `text` as croniter does; the error names the field and what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, CronError> {
        let spec = Spec::parse(text).map_err(|reason| CronError {
            expression: text.to_owned(),
            reason,
        })?;
        Ok(Self {
            text: text.to_owned(),
            spec,
        })
    }

    /// The expression as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first time the expression fires strictly after `after` (croniter's `get_next`: the
    /// minute after `after`'s minute, at the earliest); `None` when it does not fire within
    /// [`HORIZON_YEARS`] (where croniter raises `CroniterBadDateError`).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let secs = after.timestamp();
        let minute = secs - secs.rem_euclid(60);
        let start = DateTime::from_timestamp(minute + 60, 0)?.naive_utc();
        self.spec.next(start).map(|t| t.and_utc())
    }
}

/// One item of a field once expanded; the order is croniter's (`*`, numbers, `L`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Entry {
    Star,
    Num(u32),
    Last,
}

/// A day of month a field lists: a number, or the month's last day. Ordered as croniter sorts
/// them: numbers, then `L`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Day {
    Of(u32),
    Last,
}

/// Which of a weekday's occurrences in its month: the n-th (1-5) or the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Nth {
    Of(u32),
    Last,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Minute,
    Hour,
    Day,
    Month,
    Weekday,
}

const KINDS: [Kind; 5] = [
    Kind::Minute,
    Kind::Hour,
    Kind::Day,
    Kind::Month,
    Kind::Weekday,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Minute => "minute",
            Kind::Hour => "hour",
            Kind::Day => "day of month",
            Kind::Month => "month",
            Kind::Weekday => "day of week",
        }
    }

    fn min(self) -> u32 {
        match self {
            Kind::Day | Kind::Month => 1,
            _ => 0,
        }
    }

    fn max(self) -> u32 {
        match self {
            Kind::Minute => 59,
            Kind::Hour => 23,
            Kind::Day => 31,
            Kind::Month => 12,
            Kind::Weekday => 6,
        }
    }

    /// How many values the whole field has.
    fn size(self) -> usize {
        (self.max() - self.min() + 1) as usize
    }

    /// The values a field allows, as the error messages name them.
    fn allowed(self) -> String {
        match self {
            Kind::Day => "1 to 31 or L".into(),
            Kind::Month => "1 to 12 or jan to dec".into(),
            Kind::Weekday => "0 to 7 or sun to sat".into(),
            _ => format!("{} to {}", self.min(), self.max()),
        }
    }

    /// A word croniter reads in this field: a month or weekday name, or `L` in the day of month.
    fn word(self, text: &str) -> Option<Entry> {
        let index = |names: &[&str]| names.iter().position(|n| *n == text);
        match self {
            Kind::Day => (text == "l").then_some(Entry::Last),
            Kind::Month => index(&MONTHS).map(|i| Entry::Num(i as u32 + 1)),
            Kind::Weekday => index(&WEEKDAYS).map(|i| Entry::Num(i as u32)),
            _ => None,
        }
    }

    /// croniter's aliases: 7 is Sunday (0) in the day of week.
    fn alias(self, n: u64) -> u64 {
        if self == Kind::Weekday && n == 7 {
            0
        } else {
            n
        }
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The value of an all-digit string; a number too large for `u64` stays out of every range.
fn number(s: &str) -> u64 {
    s.bytes().fold(0u64, |n, b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    })
}

/// Python's `str.isspace`, which `str.split()` splits on: Rust's whitespace and the four
/// information separators.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// One field's items once read: what the search needs plus the text it came from.
struct Field {
    kind: Kind,
    entries: BTreeSet<Entry>,
}

/// An expression as croniter expands it: per field the values it allows, `None` when the field
/// is unrestricted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spec {
    minutes: Option<Vec<u32>>,
    hours: Option<Vec<u32>>,
    days: Option<Vec<Day>>,
    months: Option<Vec<u32>>,
    weekdays: Option<Vec<u32>>,
    /// `#` and `L` items of the day of week: weekday → occurrences.
    nth: BTreeMap<u32, BTreeSet<Nth>>,
}

impl Spec {
    fn parse(text: &str) -> Result<Self, String> {
        let lower = text.to_lowercase();
        let expanded = NICKNAMES
            .iter()
            .find(|(nick, _)| *nick == lower)
            .map_or(lower.as_str(), |(_, e)| *e);
        let raw: Vec<&str> = expanded
            .split(is_py_space)
            .filter(|f| !f.is_empty())
            .collect();
        if raw.len() != 5 {
            if raw.len() == 1 && raw[0].starts_with('@') {
                return Err(format!(
                    "unknown nickname '{}': croniter knows {}",
                    raw[0],
                    NICKNAMES.map(|(n, _)| n).join(", ")
                ));
            }
            let extra = if matches!(raw.len(), 6 | 7) {
                "; croniter's seconds and year fields are not taken"
            } else {
                ""
            };
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week) or a nickname \
                 (@hourly, @daily, @weekly, @monthly, @yearly), got {}{extra}",
                raw.len()
            ));
        }
        // Errors name a field as the user wrote it (croniter reads it lowercased).
        let written: Vec<&str> = text.split(is_py_space).filter(|f| !f.is_empty()).collect();
        let mut nth = BTreeMap::new();
        let mut fields = Vec::with_capacity(5);
        for (i, (kind, field)) in KINDS.into_iter().zip(&raw).enumerate() {
            let entries = read_field(kind, field, &mut nth).map_err(|why| {
                let shown = written
                    .get(i)
                    .filter(|_| written.len() == 5)
                    .unwrap_or(field);
                format!("{} '{shown}': {why}", kind.name())
            })?;
            fields.push(Field { kind, entries });
        }
        // A field that lists every value is `*`, except a day field whose partner's text has no
        // `*` (croniter keeps the list there, so the day fields' OR still applies).
        for field in &mut fields {
            if field.entries.len() == field.kind.size() {
                let keep = match field.kind {
                    Kind::Day => !raw[4].contains('*'),
                    Kind::Weekday => !raw[2].contains('*'),
                    _ => false,
                };
                if !keep {
                    field.entries = BTreeSet::from([Entry::Star]);
                }
            }
        }
        if !nth.is_empty() {
            let weekdays = &fields[4].entries;
            let plain = weekdays
                .iter()
                .any(|e| matches!(e, Entry::Num(n) if !nth.contains_key(n)));
            if plain && weekdays.len() != Kind::Weekday.size() {
                return Err(format!(
                    "day of week '{}': plain weekdays cannot be mixed with '#' or 'L' items",
                    written
                        .get(4)
                        .filter(|_| written.len() == 5)
                        .unwrap_or(&raw[4])
                ));
            }
        }
        let nums = |f: &Field| -> Option<Vec<u32>> {
            (!f.entries.contains(&Entry::Star)).then(|| {
                f.entries
                    .iter()
                    .filter_map(|e| match e {
                        Entry::Num(n) => Some(*n),
                        _ => None,
                    })
                    .collect()
            })
        };
        let days = (!fields[2].entries.contains(&Entry::Star)).then(|| {
            fields[2]
                .entries
                .iter()
                .filter_map(|e| match e {
                    Entry::Num(n) => Some(Day::Of(*n)),
                    Entry::Last => Some(Day::Last),
                    Entry::Star => None,
                })
                .collect()
        });
        Ok(Spec {
            minutes: nums(&fields[0]),
            hours: nums(&fields[1]),
            days,
            months: nums(&fields[3]),
            weekdays: nums(&fields[4]),
            nth,
        })
    }

    /// The first fire at or after `start` (a whole minute).
    fn next(&self, start: NaiveDateTime) -> Option<NaiveDateTime> {
        match (&self.days, &self.weekdays) {
            // Both day fields restricted: the earlier of the day-of-month search (weekdays
            // free) and the day-of-week search (days free); croniter needs both to succeed.
            (Some(days), Some(weekdays)) => {
                let by_day = self.search(start, Some(days), None)?;
                let by_weekday = self.search(start, None, Some(weekdays))?;
                Some(by_day.min(by_weekday))
            }
            (days, weekdays) => self.search(start, days.as_deref(), weekdays.as_deref()),
        }
    }

    /// croniter's search: the first field, from the month down, that `cur` does not fit moves
    /// it to that field's next listed value (the fields below reset), and the search starts
    /// over; `cur` is the answer when every field fits.
    fn search(
        &self,
        start: NaiveDateTime,
        days: Option<&[Day]>,
        weekdays: Option<&[u32]>,
    ) -> Option<NaiveDateTime> {
        let first_year = start.year();
        let mut cur = start;
        while (cur.year() - first_year).abs() <= HORIZON_YEARS {
            let date = cur.date();
            if let Some(months) = &self.months {
                let diff = next_diff(cur.month(), months, 12);
                if diff != 0 {
                    cur = first_of_month(date, diff)?.and_time(chrono::NaiveTime::MIN);
                    continue;
                }
            }
            let month_days = month_len(date)?;
            if let Some(days) = days {
                let on_last = days.contains(&Day::Last) && cur.day() == month_days;
                if !on_last {
                    let diff = next_day_diff(cur.day(), days, month_days);
                    if diff != 0 {
                        cur = midnight(date, i64::from(diff))?;
                        continue;
                    }
                }
            }
            if !self.nth.is_empty() {
                let diff = self.nth_diff(date, month_days)?;
                if diff != 0 {
                    cur = midnight(date, diff)?;
                    continue;
                }
            } else if let Some(weekdays) = weekdays {
                let diff = next_diff(date.weekday().num_days_from_sunday(), weekdays, 7);
                if diff != 0 {
                    cur = midnight(date, i64::from(diff))?;
                    continue;
                }
            }
            if let Some(hours) = &self.hours {
                let diff = next_diff(cur.hour(), hours, 24);
                if diff != 0 {
                    cur = cur.with_minute(0)? + Duration::hours(i64::from(diff));
                    continue;
                }
            }
            if let Some(minutes) = &self.minutes {
                let diff = next_diff(cur.minute(), minutes, 60);
                if diff != 0 {
                    cur += Duration::minutes(i64::from(diff));
                    continue;
                }
            }
            return Some(cur);
        }
        None
    }

    /// Days from `date` to the nearest `#`/`L` weekday on or after it in its month, or to the
    /// first of the next month when there is none left.
    fn nth_diff(&self, date: NaiveDate, month_days: u32) -> Option<i64> {
        let today = date.day();
        let first = date.with_day(1)?.weekday().num_days_from_sunday();
        let nearest = self
            .nth
            .iter()
            .flat_map(|(weekday, which)| {
                // The days of the month that fall on `weekday`.
                let first_day = 1 + (weekday + 7 - first) % 7;
                let count = (month_days - first_day) / 7 + 1;
                which.iter().filter_map(move |w| match w {
                    Nth::Last => Some(first_day + 7 * (count - 1)),
                    Nth::Of(n) if *n <= count => Some(first_day + 7 * (n - 1)),
                    Nth::Of(_) => None,
                })
            })
            .filter(|d| *d >= today)
            .min();
        Some(match nearest {
            Some(d) => i64::from(d - today),
            None => i64::from(month_days - today + 1),
        })
    }
}

/// Reads one field's items into its entries (and the day of week's `#`/`L` items into `nth`).
fn read_field(
    kind: Kind,
    text: &str,
    nth: &mut BTreeMap<u32, BTreeSet<Nth>>,
) -> Result<BTreeSet<Entry>, String> {
    if let Some(letter) = hash_or_random(text) {
        return Err(if letter == 'r' {
            "croniter's random 'R' is not taken: a schedule must fire at the same times each \
             time it is read"
                .into()
        } else {
            "croniter's hashed 'H' needs a hash id, which mula does not give".into()
        });
    }
    if text.contains('?') {
        if text != "?" {
            return Err("'?' cannot be used with other characters".into());
        }
        if !matches!(kind, Kind::Day | Kind::Weekday) {
            return Err("'?' is only allowed in the day of month and the day of week".into());
        }
        return Ok(BTreeSet::from([Entry::Star]));
    }
    let mut entries = BTreeSet::new();
    for item in text.split(',') {
        read_item(kind, item, &mut entries, nth)?;
    }
    Ok(entries)
}

/// Whether a field is croniter's `H`/`R` form (`h`, `r`, `h(0-29)`, `r/15`, ...): its letter.
fn hash_or_random(text: &str) -> Option<char> {
    let mut chars = text.chars();
    let letter = chars.next().filter(|c| matches!(c, 'h' | 'r'))?;
    let mut rest = chars.as_str();
    if let Some(inner) = rest.strip_prefix('(') {
        let (range, after) = inner.split_once(')')?;
        let (a, b) = range.split_once('-')?;
        if !is_digits(a) || !is_digits(b) {
            return None;
        }
        rest = after;
    }
    if let Some(step) = rest.strip_prefix('/') {
        rest = if is_digits(step) { "" } else { rest };
    }
    rest.is_empty().then_some(letter)
}

/// Splits a day-of-week item into its weekday part and its `#n` / `L` occurrence, when it has
/// one (croniter: `he#n` where `he` is a name, a name range or a word, and `l<digits>`).
fn split_nth(item: &str) -> Result<Option<(&str, Nth)>, String> {
    if let Some((head, n)) = item.split_once('#') {
        let word = !head.is_empty() && head.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        let names = |list: &[&str]| match head.split_once('-') {
            Some((a, b)) => list.contains(&a) && list.contains(&b),
            None => false,
        };
        if is_digits(n) && (word || names(&WEEKDAYS) || names(&MONTHS)) {
            let n = number(n);
            if !(1..=5).contains(&n) {
                return Err(format!("'#{n}': the occurrence must be 1 to 5"));
            }
            return Ok(Some((head, Nth::Of(n as u32))));
        }
        return Ok(None);
    }
    if let Some(day) = item.strip_prefix('l')
        && is_digits(day)
    {
        return Ok(Some((day, Nth::Last)));
    }
    Ok(None)
}

/// A number or a name of the field, as a range's end (`L` is no range end but `a-L` in the day
/// of month, handled by the caller).
fn bound(kind: Kind, text: &str) -> Result<u64, String> {
    if is_digits(text) {
        return Ok(kind.alias(number(text)));
    }
    match kind.word(text) {
        Some(Entry::Num(n)) => Ok(kind.alias(u64::from(n))),
        Some(_) => Err(format!("'{text}' cannot bound a range")),
        None => Err(format!("'{text}' is not a value: use {}", kind.allowed())),
    }
}

/// croniter's range form `low-high[/step]` of an item, after it writes `*/n` as `min-max/n`
/// and `a/n` as `a-max/n`.
fn range_form(kind: Kind, item: &str) -> Option<(String, String, Option<String>)> {
    let parse = |t: &str| -> Option<(String, String, Option<String>)> {
        let (low, rest) = t.split_once('-')?;
        let (high, step) = match rest.split_once('/') {
            Some((h, s)) => (h, Some(s)),
            None => (rest, None),
        };
        let ok = !low.is_empty()
            && !high.is_empty()
            && !high.contains('-')
            && step.is_none_or(is_digits);
        ok.then(|| (low.to_owned(), high.to_owned(), step.map(str::to_owned)))
    };
    let first = match item.strip_prefix("*/") {
        Some(step) if !step.is_empty() => format!("{}-{}/{step}", kind.min(), kind.max()),
        _ => item.to_owned(),
    };
    if let Some(found) = parse(&first) {
        return Some(found);
    }
    let (start, step) = item.rsplit_once('/')?;
    if start.is_empty() || step.is_empty() {
        return None;
    }
    parse(&format!("{start}-{}/{step}", kind.max()))
}

/// The values of `low-high/step` as croniter expands them (see the module's quirks).
fn range_values(kind: Kind, low: u32, high: u32, step: u64) -> Vec<u32> {
    let (min, max) = (kind.min(), kind.max());
    let step = usize::try_from(step).unwrap_or(usize::MAX);
    if low == high {
        return (min..=max).step_by(step).collect();
    }
    if low < high {
        return (low..=high).step_by(step).collect();
    }
    let mut values: Vec<u32> = (low..=max).step_by(step).collect();
    let last = values.last().copied().unwrap_or(low) as usize;
    let (len, position, from_end) = (kind.size(), last - min as usize, (max as usize) - last);
    let skip = if position.saturating_add(step) > len && from_end < step {
        step - from_end
    } else {
        0
    };
    let skip = u32::try_from(skip).unwrap_or(u32::MAX);
    values.extend((min.saturating_add(skip)..=high).step_by(step));
    values
}

fn read_item(
    kind: Kind,
    item: &str,
    entries: &mut BTreeSet<Entry>,
    nth: &mut BTreeMap<u32, BTreeSet<Nth>>,
) -> Result<(), String> {
    let (item, which) = match kind {
        Kind::Weekday => split_nth(item)?.map_or((item, None), |(i, w)| (i, Some(w))),
        _ => (item, None),
    };
    let mut add = |value: u32, entries: &mut BTreeSet<Entry>| -> Result<(), String> {
        if value < kind.min() {
            return Err(format!("{value} is out of range: use {}", kind.allowed()));
        }
        entries.insert(Entry::Num(value));
        if let Some(w) = which {
            nth.entry(value).or_default().insert(w);
        }
        Ok(())
    };
    if let Some((low, high, step)) = range_form(kind, item) {
        let high = if kind == Kind::Day && high == "l" {
            "31".to_owned()
        } else {
            high
        };
        let (low, high) = (bound(kind, &low)?, bound(kind, &high)?);
        if low.max(high) > u64::from(kind.max()) {
            return Err(format!(
                "{}-{} is out of range: use {}",
                low,
                high,
                kind.allowed()
            ));
        }
        let step = step.as_deref().map_or(1, number);
        if step == 0 {
            return Err("a step must be at least 1".into());
        }
        for value in range_values(kind, low as u32, high as u32, step) {
            add(value, entries)?;
        }
        return Ok(());
    }
    if item.starts_with('-') {
        return Err("negative numbers are not allowed".into());
    }
    if item == "*" {
        entries.insert(Entry::Star);
        return Ok(());
    }
    let value = if is_digits(item) {
        kind.alias(number(item))
    } else {
        match kind.word(item) {
            Some(Entry::Num(n)) => u64::from(n),
            Some(entry) => {
                entries.insert(entry);
                return Ok(());
            }
            None => {
                return Err(format!(
                    "'{item}' is not a value: use {}, ranges, steps and lists",
                    kind.allowed()
                ));
            }
        }
    };
    if value > u64::from(kind.max()) {
        return Err(format!("{value} is out of range: use {}", kind.allowed()));
    }
    add(value as u32, entries)
}

/// The distance from `x` to the first listed value at or after it, or around the cycle of
/// `cycle` to the first one (croniter's nearest difference).
fn next_diff(x: u32, values: &[u32], cycle: u32) -> u32 {
    match values.iter().find(|v| **v >= x) {
        Some(v) => v - x,
        None => values.first().map_or(0, |v| v + cycle - x),
    }
}

/// [`next_diff`] for days of month: `L` is the month's last day; a listed day past the
/// month's end counts as it is (the search then lands in the next month).
fn next_day_diff(x: u32, days: &[Day], month_days: u32) -> u32 {
    let value = |d: &Day| match d {
        Day::Of(n) => *n,
        Day::Last => month_days,
    };
    match days.iter().map(value).find(|v| *v >= x) {
        Some(v) => v - x,
        None => days.first().map_or(0, |d| value(d) + month_days - x),
    }
}

fn month_len(date: NaiveDate) -> Option<u32> {
    let first = date.with_day(1)?;
    let next = first.checked_add_months(chrono::Months::new(1))?;
    u32::try_from((next - first).num_days()).ok()
}

fn first_of_month(date: NaiveDate, months: u32) -> Option<NaiveDate> {
    date.with_day(1)?
        .checked_add_months(chrono::Months::new(months))
}

fn midnight(date: NaiveDate, days: i64) -> Option<NaiveDateTime> {
    Some((date + Duration::try_days(days)?).and_time(chrono::NaiveTime::MIN))
}

/// The pattern the API document gives a schedule's cron expression: croniter's syntax (a
/// nickname, or five fields of numbers, names, `*`, `?`, `L`, ranges, steps, lists and `#`/`L`
/// weekdays), narrowed so that every expression it allows is one that parses and fires:
/// numbers within their field, steps from 1 to 99, a day of month of 30 or 31 only with every
/// month (`0 0 31 2 *` never fires, and mula refuses it), and `#`/`L` weekdays only alone in
/// their field and with a free day of month (`0 0 1 * 1#2` never fires in croniter). The
/// service takes the whole of croniter's language, so a few expressions outside the pattern
/// run too (`0 0 31 1,3 *`, `0 0 8-14 * mon#2`). JSON Schema patterns have no flag for case, so
/// letters are given in both cases.
pub fn document_pattern() -> String {
    fn either_case(word: &str) -> String {
        word.chars()
            .map(|c| {
                if c.is_ascii_alphabetic() {
                    format!("[{}{}]", c.to_ascii_uppercase(), c)
                } else {
                    c.to_string()
                }
            })
            .collect()
    }
    fn one_of(words: &[&str]) -> String {
        let words: Vec<String> = words.iter().map(|w| either_case(w)).collect();
        format!("(?:{})", words.join("|"))
    }
    fn list(item: &str) -> String {
        format!("(?:{item})(?:,(?:{item}))*")
    }
    let step = "(?:/[1-9][0-9]?)";
    let last = "[Ll]";
    let minute = "(?:[0-5]?[0-9])";
    let hour = "(?:[01]?[0-9]|2[0-3])";
    let early_day = "(?:0?[1-9]|[12][0-9])";
    let day = "(?:0?[1-9]|[12][0-9]|3[01])";
    let month = format!("(?:0?[1-9]|1[0-2]|{})", one_of(&MONTHS));
    let weekday = format!("(?:[0-7]|{})", one_of(&WEEKDAYS));
    let numeric = |n: &str| list(&format!(r"\*{step}?|{n}{step}?|{n}-{n}{step}?"));
    let minutes = numeric(minute);
    let hours = numeric(hour);
    let months = numeric(&month);
    let weekdays = format!(r"\?|{}", numeric(&weekday));
    let nth_weekdays = list(&format!("{weekday}#[1-5]|{last}[0-7]"));
    // Every item holds a day that every month has (or is `L`), so any months fit.
    let early_days = format!(
        r"\?|{}",
        list(&format!(
            r"\*{step}?|{last}|{early_day}{step}?|{early_day}-(?:{day}|{last}){step}?"
        ))
    );
    let any_days = format!(
        r"\?|{}",
        list(&format!(
            r"\*{step}?|{last}|{day}{step}?|{day}-(?:{day}|{last}){step}?"
        ))
    );
    let nicknames = one_of(&NICKNAMES.map(|(n, _)| n));
    format!(
        r"^(?:{nicknames}|\s*(?:{minutes})\s+(?:{hours})\s+(?:(?:{early_days})\s+(?:{months})\s+(?:{weekdays})|(?:{any_days})\s+\*\s+(?:{weekdays})|[*?]\s+(?:{months})\s+(?:{nth_weekdays}))\s*)$"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        let t = NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
            .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M"))
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        t.and_utc()
    }

    /// The fires after `start`, each from the one before (croniter's iterator).
    fn fires(expr: &str, start: &str, n: usize) -> Vec<String> {
        let cron = CronExpr::parse(expr).unwrap_or_else(|e| panic!("{e}"));
        let mut t = at(start);
        (0..n)
            .map(|_| {
                t = cron
                    .next_after(t)
                    .unwrap_or_else(|| panic!("{expr} fires after {t}"));
                t.format("%Y-%m-%d %H:%M").to_string()
            })
            .collect()
    }

    /// croniter's own vectors: its README (kiorky/croniter, README.rst, section named) and its
    /// tests (src/croniter/tests/test_croniter.py, test named), release 6.0.0. Where a test
    /// asserts some fields of a fire (`n1.day == 25`), the whole time is croniter's answer,
    /// which agrees with them.
    const CRONITER_VECTORS: &[(&str, &str, &str, &[&str])] = &[
        (
            "test_croniter.py testMinute",
            "*/5 * * * *",
            "2010-01-23T12:18:00",
            &["2010-01-23 12:20", "2010-01-23 12:25", "2010-01-23 12:30"],
        ),
        (
            "test_croniter.py testHour",
            "0 */3 * * *",
            "2010-01-24T12:02:00",
            &[
                "2010-01-24 15:00",
                "2010-01-24 18:00",
                "2010-01-24 21:00",
                "2010-01-25 00:00",
            ],
        ),
        (
            "test_croniter.py testDay",
            "0 0 */3 * *",
            "2010-02-24T12:09:00",
            &["2010-02-25 00:00", "2010-02-28 00:00", "2010-03-01 00:00"],
        ),
        (
            "test_croniter.py testWeekDay",
            "0 0 * * sat",
            "2010-02-25T00:00:00",
            &["2010-02-27 00:00", "2010-03-06 00:00"],
        ),
        (
            "test_croniter.py testWeekDay (day of month OR day of week)",
            "0 0 1 * wed",
            "2010-01-25T00:00:00",
            &["2010-01-27 00:00", "2010-02-01 00:00", "2010-02-03 00:00"],
        ),
        (
            "test_croniter.py testNthWeekDay",
            "0 0 * * sat#1",
            "2010-02-25T00:00:00",
            &["2010-03-06 00:00", "2010-04-03 00:00"],
        ),
        (
            "test_croniter.py testNthWeekDay",
            "0 0 * * wed#5",
            "2010-01-25T00:00:00",
            &["2010-03-31 00:00", "2010-06-30 00:00", "2010-09-29 00:00"],
        ),
        (
            "test_croniter.py testDomDowVixieCronBug (*/2 restricts: the union)",
            "0 16 */2 * sat",
            "2023-05-02T00:00:00",
            &[
                "2023-05-03 16:00",
                "2023-05-05 16:00",
                "2023-05-06 16:00",
                "2023-05-07 16:00",
            ],
        ),
        (
            "test_croniter.py testMonth",
            "0 0 1 * *",
            "2010-01-25T00:00:00",
            &["2010-02-01 00:00", "2010-03-01 00:00"],
        ),
        (
            "test_croniter.py testLastDayOfMonth",
            "0 0 l * *",
            "2015-09-04T00:00:00",
            &[
                "2015-09-30 00:00",
                "2015-10-31 00:00",
                "2015-11-30 00:00",
                "2015-12-31 00:00",
            ],
        ),
        (
            "test_croniter.py testRangeWithUppercaseLastDayOfMonth",
            "0 0 29-L * *",
            "2015-09-04T00:00:00",
            &["2015-09-29 00:00", "2015-09-30 00:00"],
        ),
        (
            "test_croniter.py testSundayToThursdayWithAlphaConversion",
            "30 22 * * sun-thu",
            "2010-08-25T15:56:00",
            &["2010-08-25 22:30"],
        ),
        (
            "test_croniter.py testBug57 (a/n is a-max/n)",
            "0 4/6 * * *",
            "2012-02-24T00:00:00",
            &["2012-02-24 04:00"],
        ),
        (
            "test_croniter.py testBug57",
            "0 0/6 * * *",
            "2012-02-24T00:00:00",
            &["2012-02-24 06:00"],
        ),
        (
            "test_croniter.py test_multiple_months",
            "0 0 1 3,6,9,12 *",
            "2016-12-03T10:00:00",
            &["2017-03-01 00:00"],
        ),
        (
            "test_croniter.py test_question_mark",
            "0 0 1 * ?",
            "2010-08-25T15:56:00",
            &["2010-09-01 00:00"],
        ),
        (
            "test_croniter.py test_milliseconds",
            "0 10 * * *",
            "2018-01-02T10:00:00.000500",
            &["2018-01-03 10:00"],
        ),
        (
            "test_croniter.py test_milliseconds",
            "0 10 * * *",
            "2018-01-02T09:59:59.999999",
            &["2018-01-02 10:00"],
        ),
        (
            "test_croniter.py test_lwom_friday",
            "0 0 * * L5",
            "1987-01-15T00:00:00",
            &[
                "1987-01-30 00:00",
                "1987-02-27 00:00",
                "1987-03-27 00:00",
                "1987-04-24 00:00",
                "1987-05-29 00:00",
                "1987-06-26 00:00",
                "1987-07-31 00:00",
                "1987-08-28 00:00",
                "1987-09-25 00:00",
                "1987-10-30 00:00",
                "1987-11-27 00:00",
                "1987-12-25 00:00",
            ],
        ),
        (
            "test_croniter.py test_issue156 (a * item frees the field)",
            "* * * * *,0",
            "2019-01-14T11:00:59.999999",
            &["2019-01-14 11:01"],
        ),
        (
            "test_croniter.py test_issue156 (#: only the third Saturday)",
            "0 0 * * *,sat#3",
            "2019-01-14T11:00:59.999999",
            &["2019-01-19 00:00"],
        ),
        (
            "test_croniter.py test_issue_k33",
            "30 23 1-7 JAN MON-FRI#1",
            "2018-01-01T00:00:00",
            &[
                "2018-01-01 23:30",
                "2018-01-02 23:30",
                "2018-01-03 23:30",
                "2018-01-04 23:30",
                "2018-01-05 23:30",
                "2019-01-01 23:30",
            ],
        ),
        (
            "test_croniter.py test_sunday_ranges_to",
            "0 0 * * Sat-Sun",
            "2024-01-01T00:00:00",
            &[
                "2024-01-06 00:00",
                "2024-01-07 00:00",
                "2024-01-13 00:00",
                "2024-01-14 00:00",
                "2024-01-20 00:00",
                "2024-01-21 00:00",
                "2024-01-27 00:00",
                "2024-01-28 00:00",
                "2024-02-03 00:00",
                "2024-02-04 00:00",
            ],
        ),
        (
            "test_croniter.py test_sunday_ranges_to (Sunday as 7)",
            "0 0 * * sat-7",
            "2024-01-01T00:00:00",
            &[
                "2024-01-06 00:00",
                "2024-01-07 00:00",
                "2024-01-13 00:00",
                "2024-01-14 00:00",
                "2024-01-20 00:00",
                "2024-01-21 00:00",
                "2024-01-27 00:00",
                "2024-01-28 00:00",
                "2024-02-03 00:00",
                "2024-02-04 00:00",
            ],
        ),
        (
            "test_croniter.py test_sunday_ranges_to (Sunday as 0)",
            "0 0 * * sat-0",
            "2024-01-01T00:00:00",
            &[
                "2024-01-06 00:00",
                "2024-01-07 00:00",
                "2024-01-13 00:00",
                "2024-01-14 00:00",
                "2024-01-20 00:00",
                "2024-01-21 00:00",
                "2024-01-27 00:00",
                "2024-01-28 00:00",
                "2024-02-03 00:00",
                "2024-02-04 00:00",
            ],
        ),
        (
            "test_croniter.py test_sunday_ranges_to (a-a is the whole week)",
            "0 0 * * Sun-Sun",
            "2024-01-01T00:00:00",
            &[
                "2024-01-02 00:00",
                "2024-01-03 00:00",
                "2024-01-04 00:00",
                "2024-01-05 00:00",
                "2024-01-06 00:00",
            ],
        ),
        (
            "test_croniter.py test_mth_ranges_from (wraps)",
            "0 0 1 Nov-Mar *",
            "2024-01-01T00:00:00",
            &[
                "2024-02-01 00:00",
                "2024-03-01 00:00",
                "2024-11-01 00:00",
                "2024-12-01 00:00",
                "2025-01-01 00:00",
            ],
        ),
        (
            "test_croniter.py test_mth_ranges_from (wraps with a step)",
            "0 0 1 Apr-Mar/3 *",
            "2024-01-01T00:00:00",
            &[
                "2024-04-01 00:00",
                "2024-07-01 00:00",
                "2024-10-01 00:00",
                "2025-01-01 00:00",
                "2025-04-01 00:00",
            ],
        ),
        (
            "test_croniter.py test_mth_ranges_from (the step after the wrap starts at 3)",
            "0 0 1 Apr-Mar/2 *",
            "2024-01-01T00:00:00",
            &[
                "2024-03-01 00:00",
                "2024-04-01 00:00",
                "2024-06-01 00:00",
                "2024-08-01 00:00",
                "2024-10-01 00:00",
                "2024-12-01 00:00",
            ],
        ),
        (
            "README Usage",
            "*/5 * * * *",
            "2010-01-25T04:46:00",
            &["2010-01-25 04:50", "2010-01-25 04:55", "2010-01-25 05:00"],
        ),
        (
            "README Usage (day of month OR day of week)",
            "2 4 1 * wed",
            "2010-01-25T04:46:00",
            &["2010-01-27 04:02", "2010-02-01 04:02", "2010-02-03 04:02"],
        ),
        (
            "README Usage",
            "0 0 * * sat#1,sun#2",
            "2010-01-25T04:46:00",
            &["2010-02-06 00:00"],
        ),
        (
            "README Usage",
            "0 0 * * 5#3,L5",
            "2010-01-25T04:46:00",
            &["2010-01-29 00:00", "2010-02-19 00:00"],
        ),
    ];

    #[test]
    fn next_fires_equal_croniters_own_vectors() {
        for (source, expr, start, want) in CRONITER_VECTORS {
            assert_eq!(
                fires(expr, start, want.len()),
                *want,
                "{expr} from {start} ({source})"
            );
        }
    }

    #[test]
    fn nicknames_are_the_expressions_of_croniters_table() {
        // README.rst, "Keyword expressions": without a hash id each is a Vixie cron expression.
        for (nick, expr) in [
            ("@midnight", "0 0 * * *"),
            ("@hourly", "0 * * * *"),
            ("@daily", "0 0 * * *"),
            ("@weekly", "0 0 * * 0"),
            ("@monthly", "0 0 1 * *"),
            ("@yearly", "0 0 1 1 *"),
            ("@annually", "0 0 1 1 *"),
        ] {
            for start in ["2020-01-01T11:10:32", "2024-02-29T23:59:00"] {
                assert_eq!(fires(nick, start, 3), fires(expr, start, 3), "{nick}");
                let upper = nick.to_uppercase();
                assert_eq!(fires(&upper, start, 3), fires(expr, start, 3), "{upper}");
            }
        }
        assert_eq!(
            fires("@weekly", "2026-11-25T21:30:00", 2),
            ["2026-11-29 00:00", "2026-12-06 00:00"]
        );
    }

    #[test]
    fn croniters_quirks_are_kept() {
        // Each as croniter 6.0.0 answers it (run against it while writing this evaluator).
        for (expr, start, want) in [
            // `a-a` is the whole field.
            (
                "5-5 * * * *",
                "2027-04-20T00:00:00",
                &["2027-04-20 00:01", "2027-04-20 00:02"][..],
            ),
            // After a wrap, a step restarts one later than counting on: 50, 57, then 5.
            (
                "50-10/7 * * * *",
                "2027-04-20T00:00:00",
                &["2027-04-20 00:05", "2027-04-20 00:50", "2027-04-20 00:57"],
            ),
            // A listed day past the month's end moves the search into the next month and on:
            // 1 March is skipped, and so is 30 April, the last day, after the 15th.
            (
                "0 0 1,30 * *",
                "2027-02-20T00:00:00",
                &["2027-03-30 00:00", "2027-04-01 00:00"],
            ),
            (
                "0 0 15,31,L * *",
                "2027-04-20T00:00:00",
                &["2027-05-15 00:00", "2027-05-31 00:00"],
            ),
            // A day of month listing all 31 days stays restricted when the day of week has no
            // `*`: either matches, so every day.
            (
                "0 0 1-31 * 1",
                "2027-04-20T00:00:00",
                &["2027-04-21 00:00", "2027-04-22 00:00"],
            ),
            // ... and is free when it has one: Sundays only (`*/7` is 0).
            (
                "0 0 1-31 * */7",
                "2027-04-20T00:00:00",
                &["2027-04-25 00:00", "2027-05-02 00:00"],
            ),
            // `#` with a restricted day of month: the n-th weekday, once both meet somewhere.
            (
                "0 0 8-14 * 1#2",
                "2027-04-20T00:00:00",
                &["2027-05-10 00:00", "2027-06-14 00:00"],
            ),
            // Day of month or weekday: the last day or a Monday.
            (
                "0 0 L * 1",
                "2027-04-20T00:00:00",
                &["2027-04-26 00:00", "2027-04-30 00:00", "2027-05-03 00:00"],
            ),
            // `*/100` is a step past the field: its first value only.
            (
                "*/100 * * * *",
                "2027-04-20T00:00:00",
                &["2027-04-20 01:00"],
            ),
            // Whitespace as Python's `str.split()` sees it; names in any case.
            (
                " 0\t9  * * MON-fri ",
                "2027-04-23T10:00:00",
                &["2027-04-26 09:00"],
            ),
            // The first of January or February, or their Sundays (7).
            (
                "0 0 1 JAN-feb/1 7",
                "2027-04-23T10:00:00",
                &["2028-01-01 00:00", "2028-01-02 00:00", "2028-01-09 00:00"],
            ),
        ] {
            assert_eq!(fires(expr, start, want.len()), want, "{expr} from {start}");
        }
    }

    #[test]
    fn expressions_that_never_fire_have_no_next() {
        // test_croniter.py test_bug34 ("failed to find next date"); the others as croniter
        // 6.0.0 answers them: 31 February never comes, nor a first of the month that is the
        // second Monday (`#` meets the day of month), nor 30 February with Mondays (both day
        // searches must succeed).
        for expr in ["* * 31 2 *", "0 0 30 2 *", "0 0 1 * 1#2", "0 0 30 2 1"] {
            let cron = CronExpr::parse(expr).unwrap();
            assert_eq!(cron.next_after(at("2012-02-24T00:00:00")), None, "{expr}");
        }
        // Once every 28 years or so is within the horizon: Monday 29 February.
        let leap = CronExpr::parse("0 0 * 2 1#5").unwrap();
        assert_eq!(
            leap.next_after(at("2026-11-25T00:00:00")),
            Some(at("2044-02-29 00:00"))
        );
    }

    #[test]
    fn what_croniter_refuses_is_refused_with_the_field_and_the_reason() {
        // (expression, source, words the reason holds)
        for (expr, source, words) in [
            ("* * * *", "test_croniter.py testError", "expected 5 fields"),
            ("-90 * * * *", "test_croniter.py testError", "negative"),
            ("a * * * *", "test_croniter.py testError", "minute 'a'"),
            (
                "* * * janu-jun *",
                "test_croniter.py testError",
                "month 'janu-jun'",
            ),
            ("1-1_0 * * * *", "test_croniter.py testError", "minute"),
            ("0-10/error * * * *", "test_croniter.py testError", "minute"),
            ("0-10/ * * * *", "test_croniter.py testError", "minute"),
            ("0-1& * * * *", "test_croniter.py testError", "minute"),
            (
                "* * 5-100 * *",
                "test_croniter.py testError",
                "day of month '5-100'",
            ),
            (
                "*/0 * * * *",
                "test_croniter.py test_invalid_zerorepeat",
                "step",
            ),
            (
                "0 0 * * 1#7",
                "test_croniter.py test_nth_out_of_range",
                "1 to 5",
            ),
            (
                "0 0 * * 1#0",
                "test_croniter.py test_nth_out_of_range",
                "1 to 5",
            ),
            (
                "0 0 * * L-1",
                "test_croniter.py test_last_out_of_range",
                "day of week",
            ),
            (
                "0 0 * * L8",
                "test_croniter.py test_last_out_of_range",
                "out of range",
            ),
            (
                "? * * * *",
                "test_croniter.py test_invalid_question_mark",
                "'?' is only allowed",
            ),
            (
                "* ? * * *",
                "test_croniter.py test_invalid_question_mark",
                "'?' is only allowed",
            ),
            (
                "* * ?,* * *",
                "test_croniter.py test_invalid_question_mark",
                "other characters",
            ),
            (
                "0-10000000 * * * *",
                "test_croniter.py test_overflow",
                "out of range",
            ),
            (
                "* * * * *,b",
                "test_croniter.py test_issue156",
                "day of week '*,b': 'b'",
            ),
            (
                "0 0 0 0 0",
                "test_croniter.py test_issue_k6",
                "day of month '0'",
            ),
            (
                "0 0 0 1 0",
                "test_croniter.py test_issue_k6",
                "day of month '0'",
            ),
            (
                "4 0 L/2 2 0",
                "test_croniter.py test_issue_k34",
                "day of month 'L/2'",
            ),
            (
                "0 0 * * 1#2,3",
                "croniter: CroniterUnsupportedSyntaxError",
                "mixed",
            ),
            (
                "0 0 * * 5L",
                "croniter: CroniterNotAlphaError",
                "day of week '5L'",
            ),
            (
                "0 0 * * 1-3#2",
                "croniter: CroniterNotAlphaError",
                "day of week",
            ),
            (
                "61 * * * *",
                "the API's example",
                "minute '61': 61 is out of range",
            ),
            ("0 0 * * FOO", "the API's example", "day of week 'FOO'"),
            (
                "@fortnightly",
                "README.rst Keyword expressions",
                "unknown nickname '@fortnightly'",
            ),
            (
                "H * * * *",
                "README.rst Hashed expressions (no hash id)",
                "hash id",
            ),
            // Taken by croniter, not here (see the module's documentation).
            ("R * * * *", "not taken", "random"),
            (
                "0 0 * * * 30",
                "not taken",
                "seconds and year fields are not taken",
            ),
            (
                "0 0 1 1 * 0 2030",
                "not taken",
                "seconds and year fields are not taken",
            ),
        ] {
            let err = CronExpr::parse(expr).expect_err(expr);
            assert_eq!(err.expression, expr);
            assert!(
                err.reason.contains(words),
                "{expr} ({source}): {}",
                err.reason
            );
        }
    }

    #[test]
    fn sunday_is_0_or_7_and_dow_7_ranges_are_taken() {
        // test_croniter.py test_revert_issue_90_aka_support_DOW7; README.rst "Note about Sunday".
        for expr in ["* * * * 1-7", "* * * * 7", "0 0 * * 6-7", "0 0 * * 6,7"] {
            assert!(CronExpr::parse(expr).is_ok(), "{expr}");
        }
        assert_eq!(
            fires("0 0 * * 7", "2024-01-01T00:00:00", 1),
            fires("0 0 * * 0", "2024-01-01T00:00:00", 1)
        );
    }

    #[test]
    fn the_document_pattern_is_anchored_and_names_both_cases() {
        let p = document_pattern();
        assert!(p.starts_with('^') && p.ends_with('$'));
        assert!(p.contains("[Mm][Oo][Nn]") && p.contains("@[Aa][Nn][Nn][Uu][Aa][Ll][Ll][Yy]"));
    }
}
