//! One scheduler's bounded in-memory heap of queued tasks, and its indexes.
//!
//! The heap is an index of the `queued` rows of the `tasks` table, which stays the truth. It
//! holds every column of a queued task except the payload and the lease: enough to rank a task
//! (`priority`, then `created_at`, then `id`, as SQL's pop order), to find a duplicate by hash,
//! and to evaluate any filter that reads no payload field other than the key fields
//! (see [`crate::domain::keys`]).
//!
//! Beside the tasks it keeps, per key field, each value with the ordered set of the tasks that
//! have it. A pop with `data.boefje.oci_image in [a, b]` walks the sets of `a` and `b` in merged
//! pop order and stops at its limit: O(k·log n) for k values, whatever the depth of the queue.
//! A filter with no usable lookup walks the organisation sets merged over all their values,
//! which is the whole heap in pop order, still stopping at the limit. The best and the worst
//! task of the whole heap are the best of the organisations' firsts and the worst of their
//! lasts, kept in two priority queues over the organisations (few), so no order of every task
//! is kept beside the organisations' own.
//!
//! When organisations take turns, each organisation also keeps its own sets of the few-valued
//! fields runners filter on (plugin and image, [`PER_ORGANISATION`]): a fair pop for one image
//! serves the organisation in turn from the first entry of that organisation's set of the image,
//! as a strict pop takes the first entry of the image's set, instead of walking the
//! organisation's tasks past every other image ranked ahead of it.
//!
//! Memory is what bounds how much of a queue a heap can hold, so the layout is compact
//! (docs/BENCHMARKS.md has the figures): a task is one fixed-size slot in a slab
//! (`slots`), every other structure names it by its 4-byte slot number, key-field values are
//! interned once per field with their text in one buffer (`values`), and the ordered sets
//! hold slot numbers in sorted runs that read a slot's rank when they compare (`ordered`).

mod ordered;
mod slots;
mod values;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, NaiveDateTime};
use priority_queue::PriorityQueue;
use uuid::Uuid;

use crate::domain::filter::eval::{Json, Record, json_at};
use crate::domain::filter::plan::{Lookup, Plan};
use crate::domain::filter::{Column, FilterNode, eval};
use crate::domain::keys::{DataKeys, KeyField};
use crate::domain::politeness::KeyValues;
use crate::domain::{SchedulerId, USER_PRIORITY_MAX};
use crate::queue::fair::FairShare;
use ordered::Ordered;
use slots::{NONE, Slot, Slots};
use values::Values;

/// Index entries a fair filtered pop may look at, over every organisation it tries, before it
/// settles for the heap's order: it bounds the pop's cost when the filter matches little of the
/// organisations first in turn.
pub const FAIR_SCAN_BUDGET: usize = 4_096;

/// The key fields each organisation keeps its own sets of, when organisations take turns: the
/// fields the runners filter on that have few values (a handful of images, tens of plugins), so
/// the sets cost one entry per task each and no more than a few maps per organisation. Object
/// references and de-duplication keys name so few tasks each that their global sets are already
/// small.
pub const PER_ORGANISATION: [KeyField; 2] = [KeyField::PluginId, KeyField::OciImage];

/// The slot of a field in [`PER_ORGANISATION`].
fn per_org_slot(field: KeyField) -> Option<usize> {
    PER_ORGANISATION.iter().position(|f| *f == field)
}

/// One organisation's sets of the [`PER_ORGANISATION`] fields: value number → its tasks in pop
/// order.
type OrgSets = [HashMap<u32, Ordered<Rank>>; PER_ORGANISATION.len()];

const ORG: usize = KeyField::Organisation as usize;

/// Where a task ranks: lower is popped first (`priority`, then `created_at`, then `id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank {
    /// The task priority (lower is more urgent).
    pub priority: i64,
    /// Creation time in microseconds since the epoch (older first among equals).
    pub created_micros: i64,
    /// The task id, so that no two tasks rank equal.
    pub id: Uuid,
}

impl Rank {
    /// A rank from a priority, a creation time and the task id.
    pub fn new(priority: i64, created_at: NaiveDateTime, id: Uuid) -> Self {
        Self {
            priority,
            created_micros: micros(created_at),
            id,
        }
    }

    /// Whether this is a user scan (priority ≤ 1).
    pub fn is_user(self) -> bool {
        self.priority <= USER_PRIORITY_MAX
    }

    /// The same place in pop order as the table's columns give it (a keyset's bound).
    pub fn key(self) -> crate::storage::rows::PopKey {
        crate::storage::rows::PopKey {
            priority: self.priority,
            created_at: from_micros(self.created_micros),
            id: self.id.to_string(),
        }
    }
}

fn micros(t: NaiveDateTime) -> i64 {
    t.and_utc().timestamp_micros()
}

fn from_micros(m: i64) -> NaiveDateTime {
    DateTime::from_timestamp_micros(m)
        .map(|t| t.naive_utc())
        .unwrap_or_default()
}

/// A task hash as 16 bytes (32 hex digits); `None` if it is not in that form.
pub fn hash_bytes(hash: &str) -> Option<[u8; 16]> {
    u128::from_str_radix(hash, 16)
        .ok()
        .filter(|_| hash.len() == 32)
        .map(u128::to_be_bytes)
}

fn hash_text(h: [u8; 16]) -> String {
    format!("{:032x}", u128::from_be_bytes(h))
}

/// A queued task as the heap takes it in.
#[derive(Debug, Clone)]
pub struct HeapTask {
    /// Task id.
    pub id: Uuid,
    /// Priority.
    pub priority: i64,
    /// Creation time.
    pub created_at: NaiveDateTime,
    /// Last change.
    pub modified_at: NaiveDateTime,
    /// The task hash.
    pub hash: Option<String>,
    /// The schedule that produced it.
    pub schedule_id: Option<Uuid>,
    /// The organisation.
    pub organisation: String,
    /// The payload's key fields.
    pub data_keys: DataKeys,
}

impl HeapTask {
    /// Its rank.
    pub fn rank(&self) -> Rank {
        Rank::new(self.priority, self.created_at, self.id)
    }
}

/// Several ordered sets of slots walked as one, in pop order.
struct Merge<'a> {
    slots: &'a Slots,
    iters: Vec<Box<dyn Iterator<Item = u32> + 'a>>,
    heads: BinaryHeap<Reverse<(Rank, usize, u32)>>,
}

impl<'a> Merge<'a> {
    fn new(slots: &'a Slots, iters: Vec<Box<dyn Iterator<Item = u32> + 'a>>) -> Self {
        let mut merge = Self {
            slots,
            heads: BinaryHeap::with_capacity(iters.len()),
            iters,
        };
        for i in 0..merge.iters.len() {
            merge.advance(i);
        }
        merge
    }

    fn advance(&mut self, i: usize) {
        if let Some(s) = self.iters.get_mut(i).and_then(Iterator::next) {
            self.heads.push(Reverse((self.slots.rank(s), i, s)));
        }
    }
}

impl Iterator for Merge<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let Reverse((_, i, s)) = self.heads.pop()?;
        self.advance(i);
        Some(s)
    }
}

/// A bounded heap of queued tasks, with an index by hash and one per key field.
#[derive(Debug)]
pub struct SchedulerHeap {
    scheduler: SchedulerId,
    slots: Slots,
    /// Per key field ([`KeyField::index`]): each value with its tasks in pop order.
    values: [Values; KeyField::COUNT],
    /// Each organisation's best task, the best of them on top: the heap's best.
    firsts: PriorityQueue<u32, Reverse<Rank>>,
    /// Each organisation's worst task, the worst of them on top: the heap's worst, the one a
    /// better newcomer pushes out of a full heap.
    lasts: PriorityQueue<u32, Rank>,
    /// Every task by creation time, for the age of the oldest (a metric operators alert on);
    /// rank order is by priority first, so the other sets cannot tell.
    by_age: Ordered<(i64, u32)>,
    maxsize: usize,
    /// Whose automatic work is served next, when organisations take turns.
    fair: FairShare,
    /// Per organisation (value number), its own sets of the [`PER_ORGANISATION`] fields; kept
    /// only while organisations take turns (only fair pops read them).
    by_org: HashMap<u32, OrgSets>,
}

/// Builds a heap in bulk from tasks in any order (a rebuild of a million tasks): each set is
/// appended to and sorted once at the end.
pub struct HeapBuilder {
    heap: SchedulerHeap,
}

impl HeapBuilder {
    /// Adds a task (each once).
    pub fn push(&mut self, task: HeapTask) {
        let heap = &mut self.heap;
        if heap.slots.find(&task.id).is_some() {
            return;
        }
        let at = heap.store(task);
        let slot = *heap.slots.get(at);
        let rank = slot.rank();
        let slots = &heap.slots;
        let key = |s: u32| slots.rank(s);
        for field in KeyField::ALL {
            if let Some(v) = slot.key(field) {
                heap.values[field.index()].append(v, at, rank, key);
            }
        }
        heap.by_age.append(at, (slot.created, at));
    }

    /// Tasks added so far.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether none were added.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The heap.
    pub fn finish(mut self) -> SchedulerHeap {
        let heap = &mut self.heap;
        heap.slots.shrink();
        for values in &mut heap.values {
            values.shrink();
        }
        let slots = &heap.slots;
        let key = |s: u32| slots.rank(s);
        for values in &mut heap.values {
            values.settle(key);
        }
        heap.by_age.settle(|s| (slots.get(s).created, s));
        let orgs: Vec<u32> = heap.values[ORG].all().collect();
        for org in orgs {
            heap.touch_org(org);
        }
        self.heap
    }
}

impl SchedulerHeap {
    /// An empty heap that holds at most `maxsize` tasks.
    pub fn new(scheduler: SchedulerId, maxsize: usize) -> Self {
        Self {
            scheduler,
            slots: Slots::default(),
            values: [
                Values::shared(),
                Values::default(),
                Values::default(),
                Values::default(),
                Values::default(),
            ],
            firsts: PriorityQueue::new(),
            lasts: PriorityQueue::new(),
            by_age: Ordered::default(),
            maxsize,
            fair: FairShare::default(),
            by_org: HashMap::new(),
        }
    }

    /// Serves organisations in turn through `fair` (built empty, or [`FairShare::emptied`]):
    /// every organisation with queued work joins it.
    pub fn with_fairness(mut self, fair: FairShare) -> Self {
        self.fair = fair;
        let orgs: Vec<Arc<str>> = self.values[ORG]
            .all()
            .filter_map(|v| self.values[ORG].arc(v).cloned())
            .collect();
        for org in &orgs {
            self.fair.join(org);
        }
        self.by_org.clear();
        if self.fair.is_on() {
            let slots = &self.slots;
            for (at, slot) in slots.iter() {
                let sets = self.by_org.entry(slot.keys[ORG]).or_default();
                for (i, field) in PER_ORGANISATION.iter().enumerate() {
                    if let Some(v) = slot.key(*field) {
                        sets[i].entry(v).or_default().append(at, slot.rank());
                    }
                }
            }
            let key = |s: u32| slots.rank(s);
            for set in self
                .by_org
                .values_mut()
                .flatten()
                .flat_map(HashMap::values_mut)
            {
                set.settle(key);
            }
        }
        self
    }

    /// Takes the rotation out (to hand it to a heap rebuilt in this one's place).
    pub fn take_fairness(&mut self) -> FairShare {
        std::mem::take(&mut self.fair)
    }

    /// The rotation of organisations.
    pub fn fairness(&self) -> &FairShare {
        &self.fair
    }

    /// A builder for a heap filled with about `expected` tasks (sized for them up front: growing
    /// tables of a million entries rehashes them several times).
    pub fn builder(scheduler: SchedulerId, maxsize: usize, expected: usize) -> HeapBuilder {
        let mut heap = Self::new(scheduler, maxsize);
        heap.slots.reserve(expected);
        // Object references are nearly one per task; the other fields have few values.
        heap.values[KeyField::InputOoi.index()].reserve(expected);
        HeapBuilder { heap }
    }

    /// The bound.
    pub fn maxsize(&self) -> usize {
        self.maxsize
    }

    /// Queued tasks held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.slots.len() == 0
    }

    /// Whether the bound is reached.
    pub fn is_full(&self) -> bool {
        self.len() >= self.maxsize
    }

    /// Room left before the bound.
    pub fn room(&self) -> usize {
        self.maxsize.saturating_sub(self.len())
    }

    /// Bytes the heap holds on the allocator's heap (its tables and sets; not the allocator's
    /// own overhead), for the figure of memory per queued task.
    pub fn heap_bytes(&self) -> usize {
        self.slots.heap_bytes()
            + self.values.iter().map(Values::heap_bytes).sum::<usize>()
            + self.by_age.heap_bytes()
            + (self.firsts.capacity() + self.lasts.capacity()) * 64
            + self
                .by_org
                .values()
                .flatten()
                .flat_map(HashMap::values)
                .map(|s| 48 + s.heap_bytes())
                .sum::<usize>()
    }

    /// A task's rank, if it is in the heap.
    pub fn rank(&self, id: &Uuid) -> Option<Rank> {
        self.slots.find(id).map(|s| self.slots.rank(s))
    }

    /// Whether a task is in the heap.
    pub fn contains(&self, id: &Uuid) -> bool {
        self.slots.find(id).is_some()
    }

    /// A queued task's hash.
    pub fn hash_of(&self, id: &Uuid) -> Option<String> {
        self.slots
            .find(id)
            .and_then(|s| self.slots.get(s).hash())
            .map(hash_text)
    }

    /// A queued task's value of a key field.
    pub fn key_of(&self, id: &Uuid, field: KeyField) -> Option<Arc<str>> {
        let v = self.slots.get(self.slots.find(id)?).key(field)?;
        let values = &self.values[field.index()];
        Some(
            values
                .arc(v)
                .cloned()
                .unwrap_or_else(|| Arc::from(values.text(v))),
        )
    }

    /// The queued task with this hash, if any.
    pub fn find_hash(&self, hash: &str) -> Option<Uuid> {
        let s = self.slots.find_hash(&hash_bytes(hash)?)?;
        Some(self.slots.get(s).id)
    }

    /// Stores a task in a new slot, its key values interned (not yet in any set).
    fn store(&mut self, task: HeapTask) -> u32 {
        let mut keys = [NONE; KeyField::COUNT];
        keys[ORG] = self.values[ORG].intern(&task.organisation);
        for field in KeyField::ALL {
            if let Some(v) = task.data_keys.get(field) {
                keys[field.index()] = self.values[field.index()].intern(v);
            }
        }
        self.slots.insert(Slot::new(
            task.id,
            (
                task.priority,
                micros(task.created_at),
                micros(task.modified_at),
            ),
            task.hash.as_deref().and_then(hash_bytes),
            task.schedule_id,
            keys,
        ))
    }

    /// Brings an organisation's entries in [`Self::firsts`] and [`Self::lasts`] up to date
    /// after its set changed.
    fn touch_org(&mut self, org: u32) {
        let tasks = self.values[ORG].tasks(org);
        match (tasks.first(), tasks.last()) {
            (Some(first), Some(last)) => {
                self.firsts.push(org, Reverse(self.slots.rank(first)));
                self.lasts.push(org, self.slots.rank(last));
            }
            _ => {
                self.firsts.remove(&org);
                self.lasts.remove(&org);
            }
        }
    }

    /// Adds a task to every set it belongs in (its slot filled, its values interned).
    fn index(&mut self, at: u32) {
        let slot = *self.slots.get(at);
        let rank = slot.rank();
        let slots = &self.slots;
        let key = |s: u32| slots.rank(s);
        for field in KeyField::ALL {
            if let Some(v) = slot.key(field)
                && self.values[field.index()].add(v, at, rank, key)
                && field == KeyField::Organisation
                && let Some(org) = self.values[ORG].arc(v)
            {
                self.fair.join(org);
            }
        }
        self.by_age
            .insert(at, (slot.created, at), |s| (slots.get(s).created, s));
        self.attach_by_org(at);
        self.touch_org(slot.keys[ORG]);
    }

    /// Takes a task out of every set it is in (its slot still filled); values left with no task
    /// are freed, and an organisation left with none leaves the turns.
    fn unindex(&mut self, at: u32) {
        let slot = *self.slots.get(at);
        let rank = slot.rank();
        self.detach_by_org(at);
        let slots = &self.slots;
        let key = |s: u32| slots.rank(s);
        let org = self.values[ORG].arc(slot.keys[ORG]).cloned();
        for field in KeyField::ALL {
            if let Some(v) = slot.key(field)
                && self.values[field.index()].remove(v, at, rank, key)
                && field == KeyField::Organisation
                && let Some(org) = &org
            {
                self.fair.leave(org);
            }
        }
        self.by_age
            .remove(at, (slot.created, at), |s| (slots.get(s).created, s));
        self.touch_org(slot.keys[ORG]);
    }

    /// Adds a task to its organisation's sets, while organisations take turns.
    fn attach_by_org(&mut self, at: u32) {
        if !self.fair.is_on() {
            return;
        }
        let slot = self.slots.get(at);
        let (rank, slots) = (slot.rank(), &self.slots);
        let sets = self.by_org.entry(slot.keys[ORG]).or_default();
        for (i, field) in PER_ORGANISATION.iter().enumerate() {
            if let Some(v) = slot.key(*field) {
                sets[i]
                    .entry(v)
                    .or_default()
                    .insert(at, rank, |s| slots.rank(s));
            }
        }
    }

    /// Takes a task out of its organisation's sets.
    fn detach_by_org(&mut self, at: u32) {
        let slot = self.slots.get(at);
        let Some(sets) = self.by_org.get_mut(&slot.keys[ORG]) else {
            return;
        };
        let (rank, slots) = (slot.rank(), &self.slots);
        for (i, field) in PER_ORGANISATION.iter().enumerate() {
            if let Some(v) = slot.key(*field)
                && let Some(set) = sets[i].get_mut(&v)
            {
                set.remove(at, rank, |s| slots.rank(s));
                if set.is_empty() {
                    sets[i].remove(&v);
                }
            }
        }
        if sets.iter().all(HashMap::is_empty) {
            self.by_org.remove(&slot.keys[ORG]);
        }
    }

    /// Adds a task (the caller checks the bound first); a task already held is replaced.
    pub fn insert(&mut self, task: HeapTask) {
        self.remove(&task.id);
        let at = self.store(task);
        self.index(at);
    }

    /// Removes a task; returns its rank if it was there.
    pub fn remove(&mut self, id: &Uuid) -> Option<Rank> {
        let at = self.slots.find(id)?;
        Some(self.remove_at(at))
    }

    fn remove_at(&mut self, at: u32) -> Rank {
        self.unindex(at);
        self.slots.remove(at).rank()
    }

    /// Gives a queued task a new priority (and records when it changed); false if the task is
    /// not in the heap.
    pub fn rerank(&mut self, id: &Uuid, priority: i64, modified_at: NaiveDateTime) -> bool {
        let Some(at) = self.slots.find(id) else {
            return false;
        };
        // Out of every set under the old rank, then back under the new one; the values and the
        // organisation's place in the turns stay as they are.
        let slot = *self.slots.get(at);
        let old = slot.rank();
        self.detach_by_org(at);
        {
            let slots = &self.slots;
            for field in KeyField::ALL {
                if let Some(v) = slot.key(field) {
                    self.values[field.index()].detach(v, at, old, |s| slots.rank(s));
                }
            }
        }
        let changed = self.slots.get_mut(at);
        changed.priority = priority;
        changed.modified = micros(modified_at);
        let rank = self.slots.rank(at);
        {
            let slots = &self.slots;
            for field in KeyField::ALL {
                if let Some(v) = slot.key(field) {
                    self.values[field.index()].attach(v, at, rank, |s| slots.rank(s));
                }
            }
        }
        self.attach_by_org(at);
        self.touch_org(slot.keys[ORG]);
        true
    }

    /// Names a queued task's schedule (a push's link that met the schedule its hash had); false
    /// if the task is not in the heap.
    pub fn set_schedule(&mut self, id: &Uuid, schedule: Option<Uuid>) -> bool {
        let Some(at) = self.slots.find(id) else {
            return false;
        };
        self.slots.get_mut(at).set_schedule(schedule);
        true
    }

    /// Takes the best task out.
    pub fn pop_best(&mut self) -> Option<Uuid> {
        let best = self.best()?;
        self.remove(&best.id);
        Some(best.id)
    }

    /// The best task, without taking it out.
    pub fn best(&self) -> Option<Rank> {
        self.firsts.peek().map(|(_, Reverse(r))| *r)
    }

    /// The task an unfiltered pop serves next: the best, if it is a user scan or organisations
    /// do not take turns; else the best of the organisation whose turn it is.
    pub fn next_fair(&self) -> Option<Rank> {
        let best = self.best()?;
        if !self.fair.is_on() || best.is_user() {
            return Some(best);
        }
        let orgs = &self.values[ORG];
        self.fair
            .order()
            .find_map(|org| orgs.tasks(orgs.find(org)?).first())
            .map(|s| self.slots.rank(s))
            .or(Some(best))
    }

    /// The task a full heap moves out to make room for automatic work of `org`, when
    /// organisations take turns and `org` holds fewer tasks than the one holding most (bar one):
    /// that organisation's worst. So a flood of one organisation cannot keep another's work out
    /// of the heap, where turns are taken. O(k) for k organisations in the heap.
    pub fn fair_victim(&self, org: &str) -> Option<Rank> {
        if !self.fair.is_on() {
            return None;
        }
        let orgs = &self.values[ORG];
        let own = orgs.find(org).map_or(0, |v| orgs.count(v));
        let largest = orgs.all().max_by_key(|v| orgs.count(*v))?;
        if own + 1 < orgs.count(largest) {
            orgs.tasks(largest)
                .last()
                .map(|s| self.slots.rank(s))
                .filter(|r| !r.is_user())
        } else {
            None
        }
    }

    /// Takes a task out for a pop, charging its organisation's turn when it is automatic work.
    pub fn take(&mut self, id: &Uuid) -> Option<Rank> {
        let at = self.slots.find(id)?;
        let org = self.values[ORG].arc(self.slots.get(at).keys[ORG]).cloned();
        let rank = self.remove_at(at);
        if let Some(org) = org.filter(|_| !rank.is_user()) {
            self.fair.charge(&org);
        }
        Some(rank)
    }

    /// A queued task's place among all queued tasks in priority order (1: the best). O(n): the
    /// heap keeps no order of every task, and only an operator's question asks.
    pub fn rank_of(&self, id: &Uuid) -> Option<u64> {
        let me = self.rank(id)?;
        Some(self.slots.iter().filter(|(_, s)| s.rank() < me).count() as u64 + 1)
    }

    /// A queued task's organisation and its place among that organisation's queued tasks.
    pub fn organisation_rank(&self, id: &Uuid) -> Option<(Arc<str>, u64)> {
        let at = self.slots.find(id)?;
        let slot = self.slots.get(at);
        let me = slot.rank();
        let orgs = &self.values[ORG];
        let org = orgs.arc(slot.keys[ORG])?.clone();
        let ahead = match orgs.tasks(slot.keys[ORG]) {
            values::Tasks::One(_) => 0,
            values::Tasks::Many(set) => set.count_before(&me, |s| self.slots.rank(s)),
        };
        Some((org, ahead as u64 + 1))
    }

    /// A queued task's values of the keys limits count by.
    pub fn key_values(&self, id: &Uuid) -> Option<KeyValues<'_>> {
        let slot = self.slots.get(self.slots.find(id)?);
        let at = |f: KeyField| slot.key(f).map(|v| self.values[f.index()].text(v));
        Some(KeyValues {
            plugin_id: at(KeyField::PluginId),
            oci_image: at(KeyField::OciImage),
            input_ooi: at(KeyField::InputOoi),
            organisation: at(KeyField::Organisation),
        })
    }

    /// The best task matching `filter` (planned as `plan`, reading no payload) that `admit`
    /// lets go, in pop order.
    pub fn first_admitted(
        &self,
        filter: &FilterNode,
        plan: &Plan,
        admit: &dyn Fn(&Uuid) -> bool,
    ) -> Option<Uuid> {
        self.candidate_slots(plan).find_map(|s| {
            let id = self.slots.get(s).id;
            (eval::matches(filter, &self.record_at(s, None)) && admit(&id)).then_some(id)
        })
    }

    /// The task a pop with `filter` (planned as `plan`, reading no payload) serves next, given
    /// `first`, the best task it matches that `admit` lets go: `first` itself if it is a user
    /// scan or organisations do not take turns; else [`Self::fair_match`], or `first` past its
    /// budget.
    pub fn next_fair_matching(
        &self,
        filter: &FilterNode,
        plan: &Plan,
        first: Uuid,
        admit: &dyn Fn(&Uuid) -> bool,
    ) -> Uuid {
        let user = self.rank(&first).is_none_or(Rank::is_user);
        if !self.fair.is_on() || user {
            return first;
        }
        self.fair_match(filter, plan, admit).unwrap_or(first)
    }

    /// Whether a user scan is queued (the best task is one): only then must a fair pop look for
    /// the best match in priority order before it asks whose turn it is.
    pub fn user_waits(&self) -> bool {
        self.best().is_some_and(Rank::is_user)
    }

    /// The best match of `filter` that `admit` lets go of the first organisation in turn that has
    /// one, searched through whichever names fewest tasks: the organisation's own sets of a
    /// looked-up plugin or image, the plan's narrowest lookup, or all the organisation's tasks;
    /// within [`FAIR_SCAN_BUDGET`] entries over all organisations. `None` past the budget or when
    /// no organisation has one. An organisation with no task of a looked-up plugin or image is
    /// passed over without a look at its tasks.
    pub fn fair_match(
        &self,
        filter: &FilterNode,
        plan: &Plan,
        admit: &dyn Fn(&Uuid) -> bool,
    ) -> Option<Uuid> {
        let orgs = &self.values[ORG];
        let allowed = plan
            .lookups
            .iter()
            .find(|l| l.field == KeyField::Organisation);
        let lookup = self.best_lookup(plan);
        let lookup_size = lookup.map_or(usize::MAX, |l| self.set_size(l));
        let mut budget = FAIR_SCAN_BUDGET;
        for org in self.fair.order() {
            if allowed.is_some_and(|l| !l.values.iter().any(|v| v.as_str() == &**org)) {
                continue;
            }
            let Some(own) = orgs.find(org) else { continue };
            let own_len = orgs.count(own);
            let mine = self.org_lookup(own, plan);
            if mine.as_ref().is_some_and(|(_, n)| *n == 0) {
                continue;
            }
            let walk: Box<dyn Iterator<Item = u32>> = match (mine, lookup) {
                (Some((sets, n)), _) if n <= lookup_size.min(own_len) => Box::new(Merge::new(
                    &self.slots,
                    sets.into_iter()
                        .map(|s| Box::new(s.iter()) as Box<dyn Iterator<Item = u32>>)
                        .collect(),
                )),
                (_, Some(l)) if lookup_size < own_len => Box::new(self.lookup_walk(l)),
                _ => orgs.tasks(own).iter(),
            };
            for s in walk {
                if budget == 0 {
                    return None;
                }
                budget -= 1;
                let slot = self.slots.get(s);
                if slot.keys[ORG] == own
                    && eval::matches(filter, &self.record_at(s, None))
                    && admit(&slot.id)
                {
                    return Some(slot.id);
                }
            }
        }
        None
    }

    /// When the oldest task in the heap was created.
    pub fn oldest_created(&self) -> Option<NaiveDateTime> {
        self.by_age
            .first()
            .map(|s| from_micros(self.slots.get(s).created))
    }

    /// The worst task, the one a better newcomer pushes out of a full heap.
    pub fn worst(&self) -> Option<Rank> {
        self.lasts.peek().map(|(_, r)| *r)
    }

    /// The sets of organisation `org` (its value number) that a lookup of `plan` on a
    /// [`PER_ORGANISATION`] field names, with how many tasks they hold (0: the organisation has
    /// no candidate); the lookup naming fewest. `None` when the plan looks up no such field or
    /// organisations do not take turns.
    fn org_lookup(&self, org: u32, plan: &Plan) -> Option<(Vec<&Ordered<Rank>>, usize)> {
        if !self.fair.is_on() {
            return None;
        }
        let sets = self.by_org.get(&org);
        plan.lookups
            .iter()
            .filter_map(|l| {
                let slot = per_org_slot(l.field)?;
                let values = &self.values[l.field.index()];
                let found: Vec<&Ordered<Rank>> = l
                    .values
                    .iter()
                    .filter_map(|v| sets?[slot].get(&values.find(v.as_str())?))
                    .collect();
                let n = found.iter().map(|s| s.len()).sum::<usize>();
                Some((found, n))
            })
            .min_by_key(|(_, n)| *n)
    }

    fn set_size(&self, lookup: &Lookup) -> usize {
        let values = &self.values[lookup.field.index()];
        lookup
            .values
            .iter()
            .map(|v| values.find(v.as_str()).map_or(0, |v| values.count(v)))
            .sum()
    }

    /// The tasks of a lookup's values, merged in pop order.
    fn lookup_walk(&self, lookup: &Lookup) -> Merge<'_> {
        let values = &self.values[lookup.field.index()];
        Merge::new(
            &self.slots,
            lookup
                .values
                .iter()
                .filter_map(|v| values.find(v.as_str()))
                .map(|v| values.tasks(v).iter())
                .collect(),
        )
    }

    /// The lookup of `plan` that names the fewest tasks in this heap.
    pub fn best_lookup<'p>(&self, plan: &'p Plan) -> Option<&'p Lookup> {
        plan.lookups.iter().min_by_key(|l| self.set_size(l))
    }

    /// The slots a filter planned as `plan` can match, in pop order: through its narrowest
    /// lookup, else the whole heap.
    fn candidate_slots<'a>(&'a self, plan: &Plan) -> Box<dyn Iterator<Item = u32> + 'a> {
        if plan.nothing {
            return Box::new(std::iter::empty());
        }
        match self.best_lookup(plan) {
            Some(lookup) => Box::new(self.lookup_walk(lookup)),
            // Every queued task has an organisation: those sets over all their values are the
            // whole heap.
            None => {
                let orgs = &self.values[ORG];
                Box::new(Merge::new(
                    &self.slots,
                    orgs.all().map(|v| orgs.tasks(v).iter()).collect(),
                ))
            }
        }
    }

    /// The tasks a filter planned as `plan` can match, in pop order: through its narrowest
    /// lookup, else the whole heap.
    pub fn candidates<'a>(&'a self, plan: &Plan) -> Box<dyn Iterator<Item = Uuid> + 'a> {
        Box::new(self.candidate_slots(plan).map(|s| self.slots.get(s).id))
    }

    /// The first `limit` tasks matching `filter`, in pop order, for a filter that reads no
    /// payload (`!plan.needs_payload`). They stay in the heap.
    pub fn matching(&self, filter: &FilterNode, plan: &Plan, limit: usize) -> Vec<Uuid> {
        self.candidate_slots(plan)
            .filter(|s| eval::matches(filter, &self.record_at(*s, None)))
            .take(limit)
            .map(|s| self.slots.get(s).id)
            .collect()
    }

    /// A queued task as the filter evaluator sees it, with its payload if the caller read it.
    pub fn record<'a>(
        &'a self,
        id: &Uuid,
        payload: Option<&'a serde_json::Value>,
    ) -> Option<HeapRecord<'a>> {
        Some(self.record_at(self.slots.find(id)?, payload))
    }

    fn record_at<'a>(&'a self, at: u32, payload: Option<&'a serde_json::Value>) -> HeapRecord<'a> {
        HeapRecord {
            scheduler: self.scheduler,
            slot: self.slots.get(at),
            values: &self.values,
            payload,
        }
    }
}

/// A queued task in the heap, for filter evaluation.
pub struct HeapRecord<'a> {
    scheduler: SchedulerId,
    slot: &'a Slot,
    values: &'a [Values; KeyField::COUNT],
    payload: Option<&'a serde_json::Value>,
}

impl HeapRecord<'_> {
    fn key(&self, field: KeyField) -> Option<&str> {
        self.slot
            .key(field)
            .map(|v| self.values[field.index()].text(v))
    }
}

impl Record for HeapRecord<'_> {
    fn text(&self, column: Column) -> Option<Cow<'_, str>> {
        match column {
            Column::Id => Some(Cow::Owned(self.slot.id.hyphenated().to_string())),
            Column::SchedulerId | Column::Type => Some(Cow::Borrowed(self.scheduler.as_str())),
            Column::ScheduleId => self
                .slot
                .schedule()
                .map(|s| Cow::Owned(s.hyphenated().to_string())),
            Column::Organisation => self.key(KeyField::Organisation).map(Cow::Borrowed),
            Column::Hash => self.slot.hash().map(|h| Cow::Owned(hash_text(h))),
            Column::Status => Some(Cow::Borrowed("queued")),
            _ => None,
        }
    }

    fn priority(&self) -> i64 {
        self.slot.priority
    }

    fn time(&self, column: Column) -> Option<NaiveDateTime> {
        match column {
            Column::CreatedAt => Some(from_micros(self.slot.created)),
            Column::ModifiedAt => Some(from_micros(self.slot.modified)),
            _ => None,
        }
    }

    fn json(&self, path: &[String]) -> Json<'_> {
        if let Some(data) = self.payload {
            return json_at(data, path);
        }
        match KeyField::of_data_path(self.scheduler, path) {
            Some(field) => self.key(field).map_or(Json::Missing, Json::Text),
            None => Json::Missing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use crate::domain::filter::plan::plan;
    use crate::queue::fair::{Fairness, Weights};
    use serde_json::json;

    fn t(n: i64) -> NaiveDateTime {
        from_micros(n)
    }

    fn task(priority: i64, created: i64, org: &str, image: Option<&str>) -> HeapTask {
        let id = Uuid::new_v4();
        HeapTask {
            id,
            priority,
            created_at: t(created),
            modified_at: t(created),
            hash: Some(format!("{:032x}", id.as_u128())),
            schedule_id: None,
            organisation: org.into(),
            data_keys: DataKeys {
                plugin_id: Some("b1".into()),
                oci_image: image.map(str::to_owned),
                input_ooi: None,
                deduplication_key: None,
            },
        }
    }

    fn ids(heap: &mut SchedulerHeap) -> Vec<Uuid> {
        std::iter::from_fn(|| heap.pop_best()).collect()
    }

    #[test]
    fn the_oldest_task_is_known_whatever_its_priority() {
        let mut heap = SchedulerHeap::new(SchedulerId::Boefje, 10);
        assert_eq!(heap.oldest_created(), None);
        let (old, young, middle) = (
            task(9, 10, "o", None),
            task(1, 30, "o", None),
            task(5, 20, "o", None),
        );
        for t in [&old, &young, &middle] {
            heap.insert(t.clone());
        }
        assert_eq!(
            heap.oldest_created(),
            Some(t(10)),
            "the oldest has the worst priority"
        );
        heap.pop_best();
        assert_eq!(heap.oldest_created(), Some(t(10)));
        heap.remove(&old.id);
        assert_eq!(heap.oldest_created(), Some(t(20)));
        // A re-rank keeps the age; a bulk build knows it too.
        heap.rerank(&middle.id, 0, t(99));
        assert_eq!(heap.oldest_created(), Some(t(20)));
        let mut b = SchedulerHeap::builder(SchedulerId::Boefje, 10, 2);
        b.push(task(1, 50, "o", None));
        b.push(task(2, 40, "o", None));
        assert_eq!(b.finish().oldest_created(), Some(t(40)));
    }

    #[test]
    fn pops_lowest_priority_then_oldest() {
        let mut heap = SchedulerHeap::new(SchedulerId::Boefje, 10);
        let tasks = [
            task(5, 10, "o", None),
            task(1, 30, "o", None),
            task(5, 5, "o", None),
            task(1, 20, "o", None),
        ];
        for t in &tasks {
            heap.insert(t.clone());
        }
        assert_eq!(
            ids(&mut heap),
            vec![tasks[3].id, tasks[1].id, tasks[2].id, tasks[0].id]
        );
    }

    #[test]
    fn tasks_sharing_a_hash_are_each_found_until_each_leaves() {
        // Two waiting tasks of the same work (a table written behind the engine's back).
        // Whichever leaves first, the other is still found by its hash.
        for first_out in [0, 1] {
            let mut heap = SchedulerHeap::new(SchedulerId::Boefje, 10);
            let a = task(3, 1, "org1", None);
            let mut b = task(2, 2, "org1", None);
            b.hash = a.hash.clone();
            let h = a.hash.clone().unwrap();
            heap.insert(a.clone());
            heap.insert(b.clone());
            let ids = [a.id, b.id];
            assert!(heap.find_hash(&h).is_some_and(|id| ids.contains(&id)));
            heap.remove(&ids[first_out]);
            assert_eq!(heap.find_hash(&h), Some(ids[1 - first_out]));
            heap.remove(&ids[1 - first_out]);
            assert_eq!(heap.find_hash(&h), None);
        }
    }

    #[test]
    fn indexes_follow_every_way_in_and_out() {
        let mut heap = SchedulerHeap::new(SchedulerId::Boefje, 10);
        let a = task(3, 1, "org1", Some("img1"));
        let b = task(2, 2, "org2", Some("img1"));
        let c = task(1, 3, "org1", Some("img2"));
        for t in [&a, &b, &c] {
            heap.insert(t.clone());
        }
        let f = parse_request(&json!({"filters": [
            {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["img1"]}
        ]}))
        .unwrap();
        let p = plan(&f, SchedulerId::Boefje);
        assert_eq!(heap.matching(&f, &p, 10), vec![b.id, a.id]);
        assert_eq!(heap.find_hash(a.hash.as_deref().unwrap()), Some(a.id));
        // re-rank moves it within its index
        assert!(heap.rerank(&a.id, 1, t(9)));
        assert_eq!(heap.matching(&f, &p, 10), vec![a.id, b.id]);
        assert_eq!(heap.matching(&f, &p, 1), vec![a.id], "stops at the limit");
        heap.remove(&a.id);
        assert_eq!(heap.matching(&f, &p, 10), vec![b.id]);
        assert_eq!(heap.find_hash(a.hash.as_deref().unwrap()), None);
        assert_eq!(heap.pop_best(), Some(c.id));
        assert_eq!(heap.pop_best(), Some(b.id));
        assert!(
            heap.values.iter().all(Values::is_empty),
            "no value without a task left"
        );
        assert!(heap.is_empty() && heap.by_age.is_empty());
        assert!(heap.firsts.is_empty() && heap.lasts.is_empty());
    }

    #[test]
    fn a_filter_without_lookup_walks_the_whole_heap_in_pop_order() {
        let mut heap = SchedulerHeap::new(SchedulerId::Boefje, 100);
        let mut all: Vec<HeapTask> = (0..60)
            .map(|i| task(i % 7, i, &format!("org{}", i % 5), None))
            .collect();
        for t in &all {
            heap.insert(t.clone());
        }
        let f = parse_request(
            &json!({"filters": [{"column": "priority", "operator": ">", "value": 2}]}),
        )
        .unwrap();
        let p = plan(&f, SchedulerId::Boefje);
        all.retain(|t| t.priority > 2);
        all.sort_by_key(HeapTask::rank);
        let want: Vec<Uuid> = all.iter().take(25).map(|t| t.id).collect();
        assert_eq!(heap.matching(&f, &p, 25), want);
    }

    #[test]
    fn a_value_with_many_tasks_grows_into_a_tree_and_keeps_its_order() {
        let mut heap = SchedulerHeap::new(SchedulerId::Boefje, 1000);
        let tasks: Vec<HeapTask> = (0..100).rev().map(|i| task(i, i, "org", None)).collect();
        for t in &tasks {
            heap.insert(t.clone());
        }
        let f = parse_request(&json!({"filters": [{"column": "organisation", "value": "org"}]}))
            .unwrap();
        let p = plan(&f, SchedulerId::Boefje);
        let got = heap.matching(&f, &p, 3);
        assert_eq!(got, vec![tasks[99].id, tasks[98].id, tasks[97].id]);
    }

    #[test]
    fn a_heap_built_in_bulk_is_the_heap_built_one_by_one() {
        let mut tasks: Vec<HeapTask> = (0..200)
            .map(|i| {
                task(
                    i % 9,
                    i,
                    &format!("org{}", i % 3),
                    Some(&format!("img{}", i % 2)),
                )
            })
            .collect();
        tasks.sort_by_key(HeapTask::rank);
        let mut one_by_one = SchedulerHeap::new(SchedulerId::Boefje, 1000);
        let mut builder = SchedulerHeap::builder(SchedulerId::Boefje, 1000, 200);
        for t in &tasks {
            one_by_one.insert(t.clone());
            builder.push(t.clone());
        }
        let mut bulk = builder.finish();
        let f = parse_request(
            &json!({"filters": [{"column": "organisation", "value": "org1"},
            {"column": "data", "field": "boefje__oci_image", "value": "img0"}]}),
        )
        .unwrap();
        let p = plan(&f, SchedulerId::Boefje);
        assert_eq!(bulk.matching(&f, &p, 500), one_by_one.matching(&f, &p, 500));
        assert_eq!(
            bulk.find_hash(tasks[7].hash.as_deref().unwrap()),
            Some(tasks[7].id)
        );
        assert_eq!(ids(&mut bulk), ids(&mut one_by_one));
    }

    fn fair_heap() -> SchedulerHeap {
        use crate::queue::fair::{Fairness, Weights};
        SchedulerHeap::new(SchedulerId::Boefje, 100_000)
            .with_fairness(FairShare::new(Fairness::Organisation, Weights::default()))
    }

    /// Pops `n` unfiltered, in turn; answers the organisations served.
    fn pop_fair(heap: &mut SchedulerHeap, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            let Some(next) = heap.next_fair() else { break };
            out.push(
                heap.key_of(&next.id, KeyField::Organisation)
                    .unwrap()
                    .to_string(),
            );
            heap.take(&next.id);
        }
        out
    }

    #[test]
    fn a_flood_of_one_organisation_does_not_hold_the_others_back() {
        let mut heap = fair_heap();
        // The big one's tasks are older and more urgent than anything the small ones bring.
        for i in 0..9_000 {
            heap.insert(task(50, i, "big", None));
        }
        for o in 0..10 {
            for i in 0..100 {
                heap.insert(task(90, 10_000 + o * 100 + i, &format!("small{o}"), None));
            }
        }
        let served = pop_fair(&mut heap, 1_100);
        let small = served.iter().filter(|o| o.starts_with("small")).count();
        assert_eq!(small, 1_000, "ten pops in eleven are the small ones'");
        // Within an organisation, the heap's order: small3's first pop is its best task.
        let mut strict = SchedulerHeap::new(SchedulerId::Boefje, 100_000);
        strict.insert(task(50, 1, "big", None));
        strict.insert(task(90, 2, "small", None));
        assert_eq!(
            pop_fair(&mut strict, 2),
            vec!["big", "small"],
            "off: the heap's order"
        );
    }

    #[test]
    fn user_scans_come_first_and_an_organisation_keeps_its_own_order() {
        let mut heap = fair_heap();
        let a_late = task(70, 1, "a", None);
        let a_soon = task(20, 2, "a", None);
        let b = task(30, 3, "b", None);
        let user = task(1, 4, "c", None);
        for t in [&a_late, &a_soon, &b, &user] {
            heap.insert(t.clone());
        }
        let mut order = Vec::new();
        while let Some(next) = heap.next_fair() {
            order.push(next.id);
            heap.take(&next.id);
        }
        assert_eq!(order[0], user.id, "the user's scan first");
        let pos = |id: Uuid| order.iter().position(|x| *x == id).unwrap();
        assert!(pos(a_soon.id) < pos(a_late.id), "a's own order stands");
        assert_eq!(order.len(), 4, "nothing is left behind");
    }

    #[test]
    fn a_filtered_pop_takes_turns_among_the_organisations_it_matches() {
        let mut heap = fair_heap();
        for i in 0..3_000 {
            let image = if i % 2 == 0 { "img1" } else { "img2" };
            heap.insert(task(50, i, "big", Some(image)));
        }
        for o in 0..5 {
            for i in 0..20 {
                heap.insert(task(
                    90,
                    5_000 + o * 100 + i,
                    &format!("small{o}"),
                    Some("img1"),
                ));
            }
        }
        // A runner of img1 only, and one whose organisations exclude the small ones.
        let img1 = parse_request(&json!({"filters": [
            {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["img1"]}
        ]}))
        .unwrap();
        let big_only = parse_request(&json!({"filters": [
            {"column": "organisation", "operator": "in", "value": ["big"]}
        ]}))
        .unwrap();
        let p1 = plan(&img1, SchedulerId::Boefje);
        let pb = plan(&big_only, SchedulerId::Boefje);
        let mut served = Vec::new();
        for _ in 0..60 {
            let first = heap.matching(&img1, &p1, 1)[0];
            let id = heap.next_fair_matching(&img1, &p1, first, &|_| true);
            assert_eq!(
                heap.key_of(&id, KeyField::OciImage).as_deref(),
                Some("img1")
            );
            served.push(
                heap.key_of(&id, KeyField::Organisation)
                    .unwrap()
                    .to_string(),
            );
            heap.take(&id);
        }
        let small = served.iter().filter(|o| o.starts_with("small")).count();
        assert_eq!(small, 50, "five of every six img1 pops are the small ones'");
        let first = heap.matching(&big_only, &pb, 1)[0];
        let id = heap.next_fair_matching(&big_only, &pb, first, &|_| true);
        assert_eq!(
            heap.key_of(&id, KeyField::Organisation).as_deref(),
            Some("big"),
            "work-conserving: the only organisation it may take is served, turn or not"
        );
    }

    #[test]
    fn an_organisation_in_turn_is_served_its_image_past_any_number_of_other_images() {
        // "big" holds far more work of another image, ranked ahead of its img1 tasks, than a
        // fair pop may walk; its img1 tasks are still its turn's answer, and no task is walked.
        let mut heap = fair_heap();
        for i in 0..(FAIR_SCAN_BUDGET as i64 + 1_000) {
            heap.insert(task(10, i, "big", Some("img2")));
        }
        let big_img1: Vec<Uuid> = (0..5)
            .map(|i| {
                let t = task(90, 10_000 + i, "big", Some("img1"));
                heap.insert(t.clone());
                t.id
            })
            .collect();
        for i in 0..5 {
            heap.insert(task(50, 20_000 + i, "small", Some("img1")));
        }
        let img1 = parse_request(&json!({"filters": [
            {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["img1"]}
        ]}))
        .unwrap();
        let p1 = plan(&img1, SchedulerId::Boefje);
        let mut served = Vec::new();
        for _ in 0..10 {
            let id = heap.fair_match(&img1, &p1, &|_| true).unwrap();
            served.push(
                heap.key_of(&id, KeyField::Organisation)
                    .unwrap()
                    .to_string(),
            );
            if served.last().map(String::as_str) == Some("big") {
                assert!(big_img1.contains(&id), "big's img1 work, in its own order");
            }
            heap.take(&id);
        }
        assert_eq!(
            served,
            ["big", "small"].repeat(5),
            "the organisations alternate although big's img1 tasks rank behind its img2 flood"
        );
        assert!(
            heap.fair_match(&img1, &p1, &|_| true).is_none(),
            "no img1 left"
        );
    }

    #[test]
    fn the_organisations_own_sets_follow_every_way_in_and_out() {
        let mut tasks: Vec<HeapTask> = (0..300)
            .map(|i| {
                task(
                    i % 9 + 2,
                    i,
                    &format!("org{}", i % 4),
                    Some(&format!("img{}", i % 3)),
                )
            })
            .collect();
        let mut builder = SchedulerHeap::builder(SchedulerId::Boefje, 1000, 300);
        for t in &tasks {
            builder.push(t.clone());
        }
        let mut heap = builder
            .finish()
            .with_fairness(FairShare::new(Fairness::Organisation, Weights::default()));
        // A re-rank moves a task within its organisation's sets: org1's best img2 task becomes
        // the worst.
        let moved = tasks
            .iter()
            .filter(|t| {
                t.organisation == "org1" && t.data_keys.oci_image.as_deref() == Some("img2")
            })
            .min_by_key(|t| t.rank())
            .unwrap()
            .id;
        assert!(heap.rerank(&moved, 1_000, t(0)));
        for t in tasks.iter_mut().filter(|t| t.id == moved) {
            t.priority = 1_000;
        }
        let img2 = parse_request(&json!({"filters": [
            {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["img2"]}
        ]}))
        .unwrap();
        let p2 = plan(&img2, SchedulerId::Boefje);
        // Each answer is the best img2 task of the organisation it names, which is what the
        // organisation's own sets must give.
        while let Some(id) = heap.fair_match(&img2, &p2, &|_| true) {
            let org = heap.key_of(&id, KeyField::Organisation).unwrap();
            let best = tasks
                .iter()
                .filter(|t| {
                    *t.organisation == *org
                        && t.data_keys.oci_image.as_deref() == Some("img2")
                        && heap.contains(&t.id)
                })
                .min_by_key(|t| t.rank())
                .unwrap();
            assert_eq!(id, best.id);
            heap.take(&id);
        }
        while heap.pop_best().is_some() {}
        assert!(heap.by_org.is_empty(), "no empty sets left behind");
    }

    #[test]
    fn the_turns_survive_a_rebuild_of_the_heap() {
        let mut heap = fair_heap();
        for i in 0..10 {
            heap.insert(task(50, i, "a", None));
            heap.insert(task(50, 100 + i, "b", None));
        }
        assert_eq!(pop_fair(&mut heap, 3), vec!["a", "b", "a"]);
        let left: Vec<HeapTask> = std::iter::from_fn(|| {
            let r = heap.best()?;
            let org = heap.key_of(&r.id, KeyField::Organisation)?;
            heap.remove(&r.id);
            let mut t = task(r.priority, r.created_micros, &org, None);
            t.id = r.id;
            Some(t)
        })
        .collect();
        let fair = heap.take_fairness().emptied();
        let mut b = SchedulerHeap::builder(SchedulerId::Boefje, 100, left.len());
        for t in left {
            b.push(t);
        }
        let mut rebuilt = b.finish().with_fairness(fair);
        assert_eq!(
            pop_fair(&mut rebuilt, 2),
            vec!["b", "a"],
            "b's turn, as before"
        );
    }

    #[test]
    fn the_worst_task_is_the_one_pushed_out() {
        let mut heap = SchedulerHeap::new(SchedulerId::Boefje, 3);
        let (a, b, c) = (
            task(1, 1, "o", None),
            task(100, 2, "o", None),
            task(50, 3, "o", None),
        );
        for t in [&a, &b, &c] {
            heap.insert(t.clone());
        }
        assert!(heap.is_full());
        assert_eq!(heap.worst().map(|r| r.id), Some(b.id));
        assert_eq!(heap.best().map(|r| r.id), Some(a.id));
    }

    /// A small deterministic generator (xorshift64*), so a failing case reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A random task drawn from small pools, so ranks tie on priority and creation time (the id
    /// decides), values are shared by a few tasks or many, and hashes repeat.
    fn random_task(rng: &mut Rng) -> HeapTask {
        let id = Uuid::from_u128(u128::from(rng.next()) << 64 | u128::from(rng.next()));
        let created = rng.below(40) as i64;
        HeapTask {
            id,
            priority: 1 + rng.below(12) as i64,
            created_at: t(created),
            modified_at: t(created),
            hash: Some(format!("{:032x}", rng.below(300))),
            schedule_id: (rng.below(2) == 0).then(|| Uuid::from_u128(u128::from(rng.next()))),
            organisation: format!("org{}", rng.below(6)),
            data_keys: DataKeys {
                plugin_id: Some(format!("b{}", rng.below(5))),
                oci_image: (rng.below(5) != 0).then(|| format!("img{}", rng.below(3))),
                input_ooi: Some(format!("Hostname|internet|h{}", rng.below(150))),
                deduplication_key: (rng.below(4) == 0).then(|| format!("d{}", rng.below(20))),
            },
        }
    }

    /// Whether a model task has `field`'s `value`.
    fn has(t: &HeapTask, field: KeyField, value: &str) -> bool {
        match field {
            KeyField::Organisation => t.organisation == value,
            f => t.data_keys.get(f) == Some(value),
        }
    }

    /// Compares the heap with the model (the tasks it should hold; each hash finds one of its
    /// tasks while any is held) on every question the engine asks of it.
    fn check(heap: &SchedulerHeap, model: &[HeapTask], rng: &mut Rng) {
        let mut sorted: Vec<&HeapTask> = model.iter().collect();
        sorted.sort_by_key(|t| t.rank());
        assert_eq!(heap.len(), model.len());
        assert_eq!(heap.best(), sorted.first().map(|t| t.rank()));
        assert_eq!(heap.worst(), sorted.last().map(|t| t.rank()));
        assert_eq!(
            heap.oldest_created(),
            model.iter().map(|t| t.created_at).min()
        );
        let mut hashes: HashMap<&str, Vec<Uuid>> = HashMap::new();
        for t in model {
            hashes
                .entry(t.hash.as_deref().unwrap())
                .or_default()
                .push(t.id);
        }
        for (hash, ids) in &hashes {
            let found = heap.find_hash(hash);
            assert!(found.is_some_and(|id| ids.contains(&id)), "hash {hash}");
        }
        let absent = format!("{:032x}", 300 + rng.below(10));
        assert_eq!(heap.find_hash(&absent), None);
        // Each key field's lookup, in pop order, stops at its limit.
        let (field, name, value) = match rng.below(5) {
            0 => (KeyField::Organisation, None, format!("org{}", rng.below(6))),
            1 => (
                KeyField::PluginId,
                Some("boefje__id"),
                format!("b{}", rng.below(5)),
            ),
            2 => (
                KeyField::OciImage,
                Some("boefje__oci_image"),
                format!("img{}", rng.below(3)),
            ),
            3 => (
                KeyField::InputOoi,
                Some("input_ooi"),
                format!("Hostname|internet|h{}", rng.below(150)),
            ),
            _ => (
                KeyField::DedupKey,
                Some("deduplication_key"),
                format!("d{}", rng.below(20)),
            ),
        };
        let f = match name {
            None => {
                parse_request(&json!({"filters": [{"column": "organisation", "value": value}]}))
            }
            Some(n) => parse_request(&json!({"filters": [
                {"column": "data", "field": n, "operator": "==", "value": value}]})),
        }
        .unwrap();
        let p = plan(&f, SchedulerId::Boefje);
        let want: Vec<Uuid> = sorted
            .iter()
            .filter(|t| has(t, field, &value))
            .take(7)
            .map(|t| t.id)
            .collect();
        assert_eq!(heap.matching(&f, &p, 7), want, "{field:?} = {value}");
        // The whole heap in pop order, through a filter with no lookup.
        let all = parse_request(
            &json!({"filters": [{"column": "priority", "operator": ">", "value": 0}]}),
        )
        .unwrap();
        let pa = plan(&all, SchedulerId::Boefje);
        let everything: Vec<Uuid> = sorted
            .iter()
            .filter(|t| t.priority > 0)
            .map(|t| t.id)
            .collect();
        assert_eq!(heap.matching(&all, &pa, usize::MAX), everything);
        if let Some(t) = model.get(rng.below(model.len().max(1) as u64) as usize) {
            let place = sorted.iter().position(|x| x.id == t.id).unwrap() as u64 + 1;
            assert_eq!(heap.rank_of(&t.id), Some(place));
            let in_org = sorted
                .iter()
                .filter(|x| x.organisation == t.organisation && x.rank() < t.rank())
                .count() as u64
                + 1;
            assert_eq!(
                heap.organisation_rank(&t.id),
                Some((Arc::from(t.organisation.as_str()), in_org))
            );
            assert_eq!(
                heap.key_of(&t.id, KeyField::InputOoi).as_deref(),
                t.data_keys.input_ooi.as_deref()
            );
            let kv = heap.key_values(&t.id).unwrap();
            assert_eq!(kv.oci_image, t.data_keys.oci_image.as_deref());
            assert_eq!(kv.organisation, Some(t.organisation.as_str()));
        }
        if heap.fairness().is_on() {
            // Whose turn it is: the first organisation in the rotation with a task (of the image,
            // for an image pop) gives its best one.
            let turn = |pred: &dyn Fn(&HeapTask) -> bool| {
                heap.fairness().order().find_map(|org| {
                    sorted
                        .iter()
                        .find(|t| *t.organisation == **org && pred(t))
                        .map(|t| t.id)
                })
            };
            let image = format!("img{}", rng.below(3));
            let f = parse_request(&json!({"filters": [
                {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": [image]}]}))
            .unwrap();
            let p = plan(&f, SchedulerId::Boefje);
            assert_eq!(
                heap.fair_match(&f, &p, &|_| true),
                turn(&|t| t.data_keys.oci_image.as_deref() == Some(image.as_str()))
            );
            let best_is_user = sorted
                .first()
                .is_some_and(|t| t.priority <= USER_PRIORITY_MAX);
            if !best_is_user {
                assert_eq!(heap.next_fair().map(|r| r.id), turn(&|_| true));
            }
        }
    }

    /// Random inserts, removals, re-ranks, pops and rebuilds against a model, with organisations
    /// taking turns and not: every answer of the heap is the model's.
    #[test]
    fn the_heap_answers_as_a_plain_list_of_its_tasks_would() {
        for (seed, fair) in [(1, false), (2, true), (3, true), (4, false)] {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
            let fairness = || {
                FairShare::new(
                    if fair {
                        Fairness::Organisation
                    } else {
                        Fairness::Off
                    },
                    Weights::default(),
                )
            };
            let mut heap =
                SchedulerHeap::new(SchedulerId::Boefje, 10_000).with_fairness(fairness());
            let mut model: Vec<HeapTask> = Vec::new();
            for step in 0..3_000 {
                match rng.below(10) {
                    0..=3 => {
                        let t = random_task(&mut rng);
                        heap.insert(t.clone());
                        model.push(t);
                    }
                    4 if !model.is_empty() => {
                        let t = model.swap_remove(rng.below(model.len() as u64) as usize);
                        assert_eq!(heap.remove(&t.id), Some(t.rank()));
                    }
                    5 | 6 if !model.is_empty() => {
                        let i = rng.below(model.len() as u64) as usize;
                        let priority = rng.below(12) as i64;
                        assert!(heap.rerank(&model[i].id, priority, t(99)));
                        model[i].priority = priority;
                    }
                    7 if !model.is_empty() => {
                        let best = heap.pop_best().unwrap();
                        let i = model.iter().position(|t| t.id == best).unwrap();
                        model.swap_remove(i);
                    }
                    8 if !model.is_empty() => {
                        // A fair pop's way out: the turn's task, charged to its organisation.
                        let next = heap.next_fair().unwrap();
                        heap.take(&next.id);
                        let i = model.iter().position(|t| t.id == next.id).unwrap();
                        model.swap_remove(i);
                    }
                    9 if step % 500 == 9 => {
                        // A rebuild from the table: the same tasks, loaded in bulk in any order.
                        let turns = heap.take_fairness().emptied();
                        let mut b =
                            SchedulerHeap::builder(SchedulerId::Boefje, 10_000, model.len());
                        for t in model.iter().rev() {
                            b.push(t.clone());
                        }
                        heap = b.finish().with_fairness(turns);
                    }
                    _ => {}
                }
                if step % 7 == 0 {
                    check(&heap, &model, &mut rng);
                }
            }
            check(&heap, &model, &mut rng);
            model.sort_by_key(HeapTask::rank);
            assert_eq!(
                ids(&mut heap),
                model.iter().map(|t| t.id).collect::<Vec<_>>()
            );
            assert!(
                heap.values.iter().all(Values::is_empty),
                "seed {seed}: values left"
            );
            assert!(heap.by_org.is_empty() && heap.by_age.is_empty());
        }
    }
}
