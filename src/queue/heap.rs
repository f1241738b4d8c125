//! One scheduler's bounded in-memory heap of queued tasks, and its indexes.
//!
//! The heap is an index of the `queued` rows of the `tasks` table, which stays the truth. It
//! holds every column of a queued task except the payload and the lease: enough to rank a task
//! (`priority`, then `created_at`, then `id`, as SQL's pop order), to find a duplicate by hash,
//! and to evaluate any filter that reads no payload field other than the key fields
//! (see [`crate::domain::keys`]).
//!
//! Beside the min-max heap it keeps, per key field, an index from each value to the ordered set
//! of the tasks that have it. A pop with `data.boefje.oci_image in [a, b]` walks the sets of `a`
//! and `b` in merged pop order and stops at its limit: O(k·log n) for k values, whatever the
//! depth of the queue. A filter with no usable lookup walks the organisation index merged over
//! all its values, which is the whole heap in pop order, still stopping at the limit.
//!
//! Key-field values are shared (`Arc<str>`) between a task and its index entry, so a value held
//! by many tasks is stored once.
//!
//! When organisations take turns, each organisation also keeps its own sets of the few-valued
//! fields runners filter on (plugin and image, [`PER_ORGANISATION`]): a fair pop for one image
//! serves the organisation in turn from the first entry of that organisation's set of the image,
//! as a strict pop takes the first entry of the image's set, instead of walking the
//! organisation's tasks past every other image ranked ahead of it.

use std::borrow::{Borrow, Cow};
use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use chrono::{DateTime, NaiveDateTime};
use priority_queue::DoublePriorityQueue;
use uuid::Uuid;

use crate::domain::filter::eval::{Json, Record, json_at};
use crate::domain::filter::plan::{Lookup, Plan};
use crate::domain::filter::{Column, FilterNode, eval};
use crate::domain::keys::{DataKeys, KeyField};
use crate::domain::politeness::KeyValues;
use crate::domain::{SchedulerId, USER_PRIORITY_MAX};
use crate::queue::fair::FairShare;

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

/// One organisation's sets of the [`PER_ORGANISATION`] fields: value → its tasks in pop order.
type OrgSets = [HashMap<Arc<str>, KeySet>; PER_ORGANISATION.len()];

/// Adds a task to its organisation's sets in `by_org` (with `add`: an insert, or an append to
/// settle after a bulk load).
fn add_by_org(
    by_org: &mut HashMap<Arc<str>, OrgSets>,
    keys: &[Option<Arc<str>>; KeyField::COUNT],
    rank: Rank,
    add: fn(&mut KeySet, Rank),
) {
    let Some(org) = &keys[KeyField::Organisation.index()] else {
        return;
    };
    let sets = by_org.entry(org.clone()).or_default();
    for (slot, field) in PER_ORGANISATION.iter().enumerate() {
        if let Some(v) = &keys[field.index()] {
            sets[slot]
                .entry(v.clone())
                .and_modify(|set| add(set, rank))
                .or_insert(KeySet::One(rank));
        }
    }
}

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

/// A queued task as the heap holds it: the queue's item, keyed by task id alone, carrying every
/// column but the rank (the queue's priority), the payload and the lease. Keeping it inside the
/// priority queue, rather than in a map beside it, saves a second table of task ids.
#[derive(Debug)]
struct Entry {
    id: Uuid,
    /// Changes when a queued task is re-ranked; the rest never does while it is queued.
    modified_micros: Cell<i64>,
    hash: Option<[u8; 16]>,
    schedule_id: Option<Uuid>,
    /// Values by [`KeyField::index`]; the organisation is always there.
    keys: [Option<Arc<str>>; KeyField::COUNT],
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Entry {}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The same as the id's own hash, so the queue can be searched by id (`Borrow`).
        self.id.hash(state);
    }
}

impl Borrow<Uuid> for Entry {
    fn borrow(&self) -> &Uuid {
        &self.id
    }
}

/// The ordered set of the tasks that share one key-field value. Most values of a
/// high-cardinality field (an object reference) have one task or a handful, for which an inline
/// rank or a sorted vector is far smaller than a B-tree; a set grows into one past [`FEW_MAX`].
#[derive(Debug)]
enum KeySet {
    One(Rank),
    Few(Vec<Rank>),
    Many(BTreeSet<Rank>),
}

const FEW_MAX: usize = 32;

impl KeySet {
    fn insert(&mut self, r: Rank) {
        match self {
            Self::One(only) if *only == r => {}
            Self::One(only) => {
                let mut v = vec![*only, r];
                v.sort_unstable();
                *self = Self::Few(v);
            }
            Self::Few(v) => {
                if let Err(at) = v.binary_search(&r) {
                    v.insert(at, r);
                }
                if v.len() > FEW_MAX {
                    *self = Self::Many(v.drain(..).collect());
                }
            }
            Self::Many(s) => {
                s.insert(r);
            }
        }
    }

    /// Adds a rank, leaving the set unsorted until [`KeySet::settle`] (appending to a vector and
    /// building the tree from it once is twice as fast as growing the tree).
    fn append(&mut self, r: Rank) {
        match self {
            Self::One(only) => *self = Self::Few(vec![*only, r]),
            Self::Few(v) => v.push(r),
            Self::Many(s) => {
                s.insert(r);
            }
        }
    }

    /// Sorts a set built by [`KeySet::append`], and turns a long one into a tree (built in one
    /// pass from the sorted ranks).
    fn settle(&mut self) {
        if let Self::Few(v) = self {
            v.sort_unstable();
            if v.len() > FEW_MAX {
                *self = Self::Many(std::mem::take(v).into_iter().collect());
            }
        }
    }

    /// Removes a rank; true when the set is left empty.
    fn remove(&mut self, r: &Rank) -> bool {
        match self {
            Self::One(only) => only == r,
            Self::Few(v) => {
                if let Ok(at) = v.binary_search(r) {
                    v.remove(at);
                }
                v.is_empty()
            }
            Self::Many(s) => {
                s.remove(r);
                s.is_empty()
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Few(v) => v.len(),
            Self::Many(s) => s.len(),
        }
    }

    fn first(&self) -> Option<Rank> {
        match self {
            Self::One(r) => Some(*r),
            Self::Few(v) => v.first().copied(),
            Self::Many(s) => s.first().copied(),
        }
    }

    fn last(&self) -> Option<Rank> {
        match self {
            Self::One(r) => Some(*r),
            Self::Few(v) => v.last().copied(),
            Self::Many(s) => s.last().copied(),
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = Rank> + '_> {
        match self {
            Self::One(r) => Box::new(std::iter::once(*r)),
            Self::Few(v) => Box::new(v.iter().copied()),
            Self::Many(s) => Box::new(s.iter().copied()),
        }
    }
}

/// Several ordered sets walked as one, in pop order.
struct Merge<'a> {
    iters: Vec<Box<dyn Iterator<Item = Rank> + 'a>>,
    heads: BinaryHeap<Reverse<(Rank, usize)>>,
}

impl<'a> Merge<'a> {
    fn new(sets: impl Iterator<Item = &'a KeySet>) -> Self {
        let mut iters: Vec<Box<dyn Iterator<Item = Rank> + 'a>> = sets.map(KeySet::iter).collect();
        let mut heads = BinaryHeap::with_capacity(iters.len());
        for (i, it) in iters.iter_mut().enumerate() {
            if let Some(r) = it.next() {
                heads.push(Reverse((r, i)));
            }
        }
        Self { iters, heads }
    }
}

impl Iterator for Merge<'_> {
    type Item = Rank;

    fn next(&mut self) -> Option<Rank> {
        let Reverse((r, i)) = self.heads.pop()?;
        if let Some(next) = self.iters.get_mut(i).and_then(Iterator::next) {
            self.heads.push(Reverse((next, i)));
        }
        Some(r)
    }
}

/// A bounded min-max heap of queued tasks, with an index by hash and one per key field.
#[derive(Debug)]
pub struct SchedulerHeap {
    scheduler: SchedulerId,
    queue: DoublePriorityQueue<Entry, Rank>,
    by_hash: HashMap<[u8; 16], Uuid>,
    /// Per key field ([`KeyField::index`]): value → its tasks in pop order.
    keys: [HashMap<Arc<str>, KeySet>; KeyField::COUNT],
    /// Every task by creation time, for the age of the oldest (a metric operators alert on);
    /// rank order is by priority first, so the heap itself cannot tell.
    by_age: BTreeSet<(i64, Uuid)>,
    maxsize: usize,
    /// Whose automatic work is served next, when organisations take turns.
    fair: FairShare,
    /// Per organisation, its own sets of the [`PER_ORGANISATION`] fields; kept only while
    /// organisations take turns (only fair pops read them).
    by_org: HashMap<Arc<str>, OrgSets>,
}

/// Builds a heap in bulk from tasks in any order (a rebuild of a million tasks): each index set is
/// appended to and sorted once at the end, and the priority queue is made in one pass.
pub struct HeapBuilder {
    heap: SchedulerHeap,
    entries: Vec<(Entry, Rank)>,
}

impl HeapBuilder {
    /// Adds a task (each once).
    pub fn push(&mut self, task: HeapTask) {
        let rank = task.rank();
        let entry = self.heap.entry_of(task);
        for field in KeyField::ALL {
            if let Some(v) = &entry.keys[field.index()] {
                self.heap.keys[field.index()]
                    .entry(v.clone())
                    .and_modify(|set| set.append(rank))
                    .or_insert(KeySet::One(rank));
            }
        }
        if let Some(h) = entry.hash {
            self.heap.by_hash.insert(h, entry.id);
        }
        self.entries.push((entry, rank));
    }

    /// Tasks added so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none were added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The heap.
    pub fn finish(mut self) -> SchedulerHeap {
        for map in &mut self.heap.keys {
            map.values_mut().for_each(KeySet::settle);
            map.shrink_to_fit();
        }
        self.heap.by_hash.shrink_to_fit();
        self.heap.by_age = self
            .entries
            .iter()
            .map(|(e, r)| (r.created_micros, e.id))
            .collect();
        self.heap.queue = self.entries.into_iter().collect();
        self.heap
    }
}

impl SchedulerHeap {
    /// An empty heap that holds at most `maxsize` tasks.
    pub fn new(scheduler: SchedulerId, maxsize: usize) -> Self {
        Self {
            scheduler,
            queue: DoublePriorityQueue::new(),
            by_hash: HashMap::new(),
            keys: Default::default(),
            by_age: BTreeSet::new(),
            maxsize,
            fair: FairShare::default(),
            by_org: HashMap::new(),
        }
    }

    /// Serves organisations in turn through `fair` (built empty, or [`FairShare::emptied`]):
    /// every organisation with queued work joins it.
    pub fn with_fairness(mut self, fair: FairShare) -> Self {
        self.fair = fair;
        let orgs: Vec<Arc<str>> = self.keys[KeyField::Organisation.index()]
            .keys()
            .cloned()
            .collect();
        for org in &orgs {
            self.fair.join(org);
        }
        self.by_org.clear();
        if self.fair.is_on() {
            for (entry, rank) in self.queue.iter() {
                add_by_org(&mut self.by_org, &entry.keys, *rank, KeySet::append);
            }
            for map in self.by_org.values_mut().flatten() {
                map.values_mut().for_each(KeySet::settle);
            }
        }
        self
    }

    /// Adds a task to its organisation's sets, while organisations take turns.
    fn index_by_org(&mut self, keys: &[Option<Arc<str>>; KeyField::COUNT], rank: Rank) {
        if self.fair.is_on() {
            add_by_org(&mut self.by_org, keys, rank, KeySet::insert);
        }
    }

    /// Takes a task out of its organisation's sets.
    fn unindex_by_org(&mut self, keys: &[Option<Arc<str>>; KeyField::COUNT], rank: &Rank) {
        let Some(org) = &keys[KeyField::Organisation.index()] else {
            return;
        };
        let Some(sets) = self.by_org.get_mut(org) else {
            return;
        };
        for (slot, field) in PER_ORGANISATION.iter().enumerate() {
            if let Some(v) = &keys[field.index()]
                && sets[slot].get_mut(v).is_some_and(|set| set.remove(rank))
            {
                sets[slot].remove(v);
            }
        }
        if sets.iter().all(HashMap::is_empty) {
            self.by_org.remove(org);
        }
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
    /// maps of a million entries rehashes them several times).
    pub fn builder(scheduler: SchedulerId, maxsize: usize, expected: usize) -> HeapBuilder {
        let mut heap = Self::new(scheduler, maxsize);
        heap.by_hash.reserve(expected);
        // Object references are nearly one per task; the other fields have few values.
        heap.keys[KeyField::InputOoi.index()].reserve(expected);
        HeapBuilder {
            heap,
            entries: Vec::with_capacity(expected),
        }
    }

    /// The bound.
    pub fn maxsize(&self) -> usize {
        self.maxsize
    }

    /// Queued tasks held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the bound is reached.
    pub fn is_full(&self) -> bool {
        self.queue.len() >= self.maxsize
    }

    /// Room left before the bound.
    pub fn room(&self) -> usize {
        self.maxsize.saturating_sub(self.queue.len())
    }

    /// A task's rank, if it is in the heap.
    pub fn rank(&self, id: &Uuid) -> Option<Rank> {
        self.queue.get_priority(id).copied()
    }

    /// Whether a task is in the heap.
    pub fn contains(&self, id: &Uuid) -> bool {
        self.queue.get_priority(id).is_some()
    }

    /// A queued task's hash.
    pub fn hash_of(&self, id: &Uuid) -> Option<String> {
        self.queue
            .get(id)?
            .0
            .hash
            .map(|h| format!("{:032x}", u128::from_be_bytes(h)))
    }

    /// A queued task's value of a key field.
    pub fn key_of(&self, id: &Uuid, field: KeyField) -> Option<Arc<str>> {
        self.queue.get(id)?.0.keys[field.index()].clone()
    }

    /// The queued task with this hash, if any.
    pub fn find_hash(&self, hash: &str) -> Option<Uuid> {
        self.by_hash.get(&hash_bytes(hash)?).copied()
    }

    fn intern(&self, field: KeyField, value: &str) -> Arc<str> {
        match self.keys[field.index()].get_key_value(value) {
            Some((k, _)) => k.clone(),
            None => Arc::from(value),
        }
    }

    fn entry_of(&self, task: HeapTask) -> Entry {
        let mut keys: [Option<Arc<str>>; KeyField::COUNT] = Default::default();
        keys[KeyField::Organisation.index()] =
            Some(self.intern(KeyField::Organisation, &task.organisation));
        for field in KeyField::ALL {
            if let Some(v) = task.data_keys.get(field) {
                keys[field.index()] = Some(self.intern(field, v));
            }
        }
        Entry {
            id: task.id,
            modified_micros: Cell::new(micros(task.modified_at)),
            hash: task.hash.as_deref().and_then(hash_bytes),
            schedule_id: task.schedule_id,
            keys,
        }
    }

    fn index(&mut self, field: KeyField, value: &Arc<str>, rank: Rank) {
        let mut new = false;
        self.keys[field.index()]
            .entry(value.clone())
            .and_modify(|set| set.insert(rank))
            .or_insert_with(|| {
                new = true;
                KeySet::One(rank)
            });
        if new && field == KeyField::Organisation {
            self.fair.join(value);
        }
    }

    fn unindex(&mut self, field: KeyField, value: &Arc<str>, rank: &Rank) {
        let map = &mut self.keys[field.index()];
        if map.get_mut(value).is_some_and(|set| set.remove(rank)) {
            map.remove(value);
            if field == KeyField::Organisation {
                self.fair.leave(value);
            }
        }
    }

    /// Adds a task (the caller checks the bound first); a task already held is replaced.
    pub fn insert(&mut self, task: HeapTask) {
        self.remove(&task.id);
        let rank = task.rank();
        let entry = self.entry_of(task);
        for field in KeyField::ALL {
            if let Some(v) = entry.keys[field.index()].clone() {
                self.index(field, &v, rank);
            }
        }
        if let Some(h) = entry.hash {
            self.by_hash.insert(h, entry.id);
        }
        self.index_by_org(&entry.keys, rank);
        self.by_age.insert((rank.created_micros, entry.id));
        self.queue.push(entry, rank);
    }

    /// Removes a task; returns its rank if it was there.
    pub fn remove(&mut self, id: &Uuid) -> Option<Rank> {
        let (entry, rank) = self.queue.remove(id)?;
        self.forget(&entry, &rank);
        Some(rank)
    }

    fn forget(&mut self, entry: &Entry, rank: &Rank) {
        self.by_age.remove(&(rank.created_micros, entry.id));
        if let Some(h) = entry.hash
            && self.by_hash.get(&h) == Some(&entry.id)
        {
            self.by_hash.remove(&h);
        }
        for field in KeyField::ALL {
            if let Some(v) = &entry.keys[field.index()] {
                self.unindex(field, v, rank);
            }
        }
        self.unindex_by_org(&entry.keys, rank);
    }

    /// Gives a queued task a new priority (and records when it changed); false if the task is
    /// not in the heap.
    pub fn rerank(&mut self, id: &Uuid, priority: i64, modified_at: NaiveDateTime) -> bool {
        let Some((entry, old)) = self.queue.get(id) else {
            return false;
        };
        let old = *old;
        entry.modified_micros.set(micros(modified_at));
        let keys = entry.keys.clone();
        let rank = Rank { priority, ..old };
        for field in KeyField::ALL {
            if let Some(v) = &keys[field.index()] {
                self.unindex(field, v, &old);
                self.index(field, v, rank);
            }
        }
        self.unindex_by_org(&keys, &old);
        self.index_by_org(&keys, rank);
        self.queue.change_priority(id, rank);
        true
    }

    /// Takes the best task out.
    pub fn pop_best(&mut self) -> Option<Uuid> {
        let (entry, rank) = self.queue.pop_min()?;
        self.forget(&entry, &rank);
        Some(entry.id)
    }

    /// The best task, without taking it out.
    pub fn best(&self) -> Option<Rank> {
        self.queue.peek_min().map(|(_, r)| *r)
    }

    /// The task an unfiltered pop serves next: the best, if it is a user scan or organisations
    /// do not take turns; else the best of the organisation whose turn it is.
    pub fn next_fair(&self) -> Option<Rank> {
        let best = self.best()?;
        if !self.fair.is_on() || best.is_user() {
            return Some(best);
        }
        self.fair
            .order()
            .find_map(|org| self.keys[KeyField::Organisation.index()].get(org)?.first())
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
        let orgs = &self.keys[KeyField::Organisation.index()];
        let own = orgs.get(org).map_or(0, KeySet::len);
        let (_, largest) = orgs.iter().max_by_key(|(_, set)| set.len())?;
        if own + 1 < largest.len() {
            largest.last().filter(|r| !r.is_user())
        } else {
            None
        }
    }

    /// Takes a task out for a pop, charging its organisation's turn when it is automatic work.
    pub fn take(&mut self, id: &Uuid) -> Option<Rank> {
        let org = self.key_of(id, KeyField::Organisation);
        let rank = self.remove(id)?;
        if let Some(org) = org.filter(|_| !rank.is_user()) {
            self.fair.charge(&org);
        }
        Some(rank)
    }

    /// A queued task's place among all queued tasks in priority order (1: the best). O(n): the
    /// heap keeps no order statistics, and only an operator's question asks.
    pub fn rank_of(&self, id: &Uuid) -> Option<u64> {
        let me = self.rank(id)?;
        Some(self.queue.iter().filter(|(_, r)| **r < me).count() as u64 + 1)
    }

    /// A queued task's organisation and its place among that organisation's queued tasks.
    pub fn organisation_rank(&self, id: &Uuid) -> Option<(Arc<str>, u64)> {
        let me = self.rank(id)?;
        let org = self.key_of(id, KeyField::Organisation)?;
        let set = self.keys[KeyField::Organisation.index()].get(&org)?;
        let ahead = set.iter().take_while(|r| *r < me).count() as u64;
        Some((org, ahead + 1))
    }

    /// A queued task's values of the keys limits count by.
    pub fn key_values(&self, id: &Uuid) -> Option<KeyValues<'_>> {
        let keys = &self.queue.get(id)?.0.keys;
        let at = |f: KeyField| keys[f.index()].as_deref();
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
        self.candidates(plan).find(|id| {
            self.record(id, None)
                .is_some_and(|r| eval::matches(filter, &r))
                && admit(id)
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
        let orgs = &self.keys[KeyField::Organisation.index()];
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
            let Some(own) = orgs.get(org) else { continue };
            let mine = self.org_lookup(org, plan);
            if mine.as_ref().is_some_and(|(_, n)| *n == 0) {
                continue;
            }
            let walk: Box<dyn Iterator<Item = Rank>> = match (mine, lookup) {
                (Some((sets, n)), _) if n <= lookup_size.min(own.len()) => {
                    Box::new(Merge::new(sets.into_iter()))
                }
                (_, Some(l)) if lookup_size < own.len() => {
                    let map = &self.keys[l.field.index()];
                    let sets: Vec<&KeySet> = l
                        .values
                        .iter()
                        .filter_map(|v| map.get(v.as_str()))
                        .collect();
                    Box::new(Merge::new(sets.into_iter()))
                }
                _ => own.iter(),
            };
            for r in walk {
                if budget == 0 {
                    return None;
                }
                budget -= 1;
                let Some(rec) = self.record(&r.id, None) else {
                    continue;
                };
                let same_org =
                    rec.fields.keys[KeyField::Organisation.index()].as_ref() == Some(org);
                if same_org && eval::matches(filter, &rec) && admit(&r.id) {
                    return Some(r.id);
                }
            }
        }
        None
    }

    /// When the oldest task in the heap was created.
    pub fn oldest_created(&self) -> Option<NaiveDateTime> {
        self.by_age.first().map(|(c, _)| from_micros(*c))
    }

    /// The worst task, the one a better newcomer pushes out of a full heap.
    pub fn worst(&self) -> Option<Rank> {
        self.queue.peek_max().map(|(_, r)| *r)
    }

    /// The sets of `org` that a lookup of `plan` on a [`PER_ORGANISATION`] field names, with how
    /// many tasks they hold (0: the organisation has no candidate); the lookup naming fewest.
    /// `None` when the plan looks up no such field or organisations do not take turns.
    fn org_lookup(&self, org: &str, plan: &Plan) -> Option<(Vec<&KeySet>, usize)> {
        if !self.fair.is_on() {
            return None;
        }
        let sets = self.by_org.get(org);
        plan.lookups
            .iter()
            .filter_map(|l| {
                let slot = per_org_slot(l.field)?;
                let found: Vec<&KeySet> = l
                    .values
                    .iter()
                    .filter_map(|v| sets?[slot].get(v.as_str()))
                    .collect();
                let n = found.iter().map(|s| s.len()).sum::<usize>();
                Some((found, n))
            })
            .min_by_key(|(_, n)| *n)
    }

    fn set_size(&self, lookup: &Lookup) -> usize {
        let map = &self.keys[lookup.field.index()];
        lookup
            .values
            .iter()
            .map(|v| map.get(v.as_str()).map_or(0, KeySet::len))
            .sum()
    }

    /// The lookup of `plan` that names the fewest tasks in this heap.
    pub fn best_lookup<'p>(&self, plan: &'p Plan) -> Option<&'p Lookup> {
        plan.lookups.iter().min_by_key(|l| self.set_size(l))
    }

    /// The tasks a filter planned as `plan` can match, in pop order: through its narrowest
    /// lookup, else the whole heap.
    pub fn candidates<'a>(&'a self, plan: &Plan) -> Box<dyn Iterator<Item = Uuid> + 'a> {
        if plan.nothing {
            return Box::new(std::iter::empty());
        }
        let merge = match self.best_lookup(plan) {
            Some(lookup) => {
                let map = &self.keys[lookup.field.index()];
                let sets: Vec<&KeySet> = lookup
                    .values
                    .iter()
                    .filter_map(|v| map.get(v.as_str()))
                    .collect();
                Merge::new(sets.into_iter())
            }
            // Every queued task has an organisation: that index over all its values is the
            // whole heap.
            None => Merge::new(self.keys[KeyField::Organisation.index()].values()),
        };
        Box::new(merge.map(|r| r.id))
    }

    /// The first `limit` tasks matching `filter`, in pop order, for a filter that reads no
    /// payload (`!plan.needs_payload`). They stay in the heap.
    pub fn matching(&self, filter: &FilterNode, plan: &Plan, limit: usize) -> Vec<Uuid> {
        self.candidates(plan)
            .filter(|id| {
                self.record(id, None)
                    .is_some_and(|r| eval::matches(filter, &r))
            })
            .take(limit)
            .collect()
    }

    /// A queued task as the filter evaluator sees it, with its payload if the caller read it.
    pub fn record<'a>(
        &'a self,
        id: &Uuid,
        payload: Option<&'a serde_json::Value>,
    ) -> Option<HeapRecord<'a>> {
        let (entry, rank) = self.queue.get(id)?;
        Some(HeapRecord {
            scheduler: self.scheduler,
            rank: *rank,
            fields: entry,
            payload,
        })
    }
}

/// A queued task in the heap, for filter evaluation.
pub struct HeapRecord<'a> {
    scheduler: SchedulerId,
    rank: Rank,
    fields: &'a Entry,
    payload: Option<&'a serde_json::Value>,
}

impl Record for HeapRecord<'_> {
    fn text(&self, column: Column) -> Option<Cow<'_, str>> {
        match column {
            Column::Id => Some(Cow::Owned(self.rank.id.hyphenated().to_string())),
            Column::SchedulerId | Column::Type => Some(Cow::Borrowed(self.scheduler.as_str())),
            Column::ScheduleId => self
                .fields
                .schedule_id
                .map(|s| Cow::Owned(s.hyphenated().to_string())),
            Column::Organisation => self.fields.keys[KeyField::Organisation.index()]
                .as_deref()
                .map(Cow::Borrowed),
            Column::Hash => self
                .fields
                .hash
                .map(|h| Cow::Owned(format!("{:032x}", u128::from_be_bytes(h)))),
            Column::Status => Some(Cow::Borrowed("queued")),
            _ => None,
        }
    }

    fn priority(&self) -> i64 {
        self.rank.priority
    }

    fn time(&self, column: Column) -> Option<NaiveDateTime> {
        match column {
            Column::CreatedAt => Some(from_micros(self.rank.created_micros)),
            Column::ModifiedAt => Some(from_micros(self.fields.modified_micros.get())),
            _ => None,
        }
    }

    fn json(&self, path: &[String]) -> Json<'_> {
        if let Some(data) = self.payload {
            return json_at(data, path);
        }
        match KeyField::of_data_path(self.scheduler, path) {
            Some(field) => self.fields.keys[field.index()]
                .as_deref()
                .map_or(Json::Missing, Json::Text),
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
            heap.keys.iter().all(HashMap::is_empty),
            "no empty sets left"
        );
        assert!(heap.queue.is_empty() && heap.by_hash.is_empty());
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
}
