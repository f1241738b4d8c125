//! The values of one key field, interned, each with the set of the tasks that have it.
//!
//! A value is stored once, however many tasks hold it: its text in one buffer shared by all the
//! field's values (no allocation per value), found by content through a hash table of value
//! numbers. Most values of an object reference or a de-duplication key belong to one task, so a
//! value's tasks are one slot held inline until a second task comes; only then does the value
//! get an ordered set ([`Ordered`]). Text of values that are gone is reclaimed by compacting the
//! buffer once it is more than half garbage.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;

use super::Rank;
use super::ordered::Ordered;

/// The tasks of one value.
#[derive(Debug)]
enum Members {
    /// No task: the value is free for reuse.
    Free,
    /// One task's slot.
    One(u32),
    /// Several tasks: a set in [`Values::sets`].
    Many(u32),
}

/// One interned value.
#[derive(Debug)]
struct Value {
    start: u32,
    len: u32,
    members: Members,
}

/// The interned values of one key field (see the module's text).
#[derive(Debug, Default)]
pub(super) struct Values {
    text: String,
    /// Bytes of `text` that belong to no value.
    garbage: usize,
    values: Vec<Value>,
    free: Vec<u32>,
    table: HashTable<u32>,
    sets: Vec<Ordered<Rank>>,
    free_sets: Vec<u32>,
    hasher: RandomState,
    /// A shared copy of each value's text, for fields whose values are handed out often (the
    /// organisation, which the turns keep by name); empty for the others.
    shared: Vec<Option<Arc<str>>>,
    keep_shared: bool,
}

impl Values {
    /// Values that also keep a shared copy of their text (see [`Values::shared`]).
    pub fn shared() -> Self {
        Self {
            keep_shared: true,
            ..Self::default()
        }
    }

    /// Room for about `n` distinct values.
    pub fn reserve(&mut self, n: usize) {
        self.values.reserve_exact(n);
        let (values, text, hasher) = (&self.values, &self.text, &self.hasher);
        self.table
            .reserve(n, |v| hasher.hash_one(text_of(text, &values[*v as usize])));
    }

    /// Gives back the room of the value list, the text and the sets beyond what they hold (see
    /// `Slots::shrink`).
    pub fn shrink(&mut self) {
        self.text.shrink_to_fit();
        self.values.shrink_to_fit();
        self.free.shrink_to_fit();
        self.sets.shrink_to_fit();
        self.shared.shrink_to_fit();
    }

    /// Whether no value has a task.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The number of a value, if a task has it.
    pub fn find(&self, text: &str) -> Option<u32> {
        let (values, buf) = (&self.values, &self.text);
        self.table
            .find(self.hasher.hash_one(text), |v| {
                text_of(buf, &values[*v as usize]) == text
            })
            .copied()
    }

    /// A value's text.
    pub fn text(&self, v: u32) -> &str {
        text_of(&self.text, &self.values[v as usize])
    }

    /// A value's shared text (kept only by [`Values::shared`] values).
    pub fn arc(&self, v: u32) -> Option<&Arc<str>> {
        self.shared.get(v as usize)?.as_ref()
    }

    /// The number of `text`, interned if no task has it yet (with no task until [`Values::add`]).
    pub fn intern(&mut self, text: &str) -> u32 {
        if let Some(v) = self.find(text) {
            return v;
        }
        if self.garbage > self.text.len() / 2 && self.garbage > 4096 {
            self.compact();
        }
        let value = Value {
            start: self.text.len() as u32,
            len: text.len() as u32,
            // Free until a task is added (the caller adds one at once).
            members: Members::Free,
        };
        self.text.push_str(text);
        let v = match self.free.pop() {
            Some(v) => {
                self.values[v as usize] = value;
                v
            }
            None => {
                self.values.push(value);
                (self.values.len() - 1) as u32
            }
        };
        if self.keep_shared {
            if self.shared.len() <= v as usize {
                self.shared.resize(v as usize + 1, None);
            }
            self.shared[v as usize] = Some(Arc::from(text));
        }
        let (values, buf, hasher) = (&self.values, &self.text, &self.hasher);
        self.table.insert_unique(hasher.hash_one(text), v, |x| {
            hasher.hash_one(text_of(buf, &values[*x as usize]))
        });
        v
    }

    fn drop_value(&mut self, v: u32) {
        let (values, buf, hasher) = (&self.values, &self.text, &self.hasher);
        let h = hasher.hash_one(text_of(buf, &values[v as usize]));
        if let Ok(e) = self.table.find_entry(h, |x| *x == v) {
            e.remove();
        }
        let value = &mut self.values[v as usize];
        self.garbage += value.len as usize;
        value.members = Members::Free;
        value.len = 0;
        if let Some(s) = self.shared.get_mut(v as usize) {
            *s = None;
        }
        self.free.push(v);
    }

    /// Adds a task to a value's set; true when it is the value's first task.
    pub fn add(&mut self, v: u32, slot: u32, rank: Rank, key: impl Fn(u32) -> Rank) -> bool {
        self.join(v, slot, rank, key, false)
    }

    /// Adds a task to a value's set in a bulk load (sorted by [`Values::settle`]); true when it is
    /// the value's first task.
    pub fn append(&mut self, v: u32, slot: u32, rank: Rank, key: impl Fn(u32) -> Rank) -> bool {
        self.join(v, slot, rank, key, true)
    }

    /// [`Values::add`], or [`Values::append`] when `bulk`.
    fn join(
        &mut self,
        v: u32,
        slot: u32,
        rank: Rank,
        key: impl Fn(u32) -> Rank,
        bulk: bool,
    ) -> bool {
        let put = |set: &mut Ordered<Rank>, key: &dyn Fn(u32) -> Rank| match bulk {
            true => set.append(slot, rank),
            false => set.insert(slot, rank, key),
        };
        match self.values[v as usize].members {
            Members::Free => {
                self.values[v as usize].members = Members::One(slot);
                true
            }
            Members::One(other) if other == slot => false,
            Members::One(other) => {
                let mut set = Ordered::one(other, key(other));
                put(&mut set, &key);
                let s = self.new_set(set);
                self.values[v as usize].members = Members::Many(s);
                false
            }
            Members::Many(s) => {
                put(&mut self.sets[s as usize], &key);
                false
            }
        }
    }

    /// Sorts every set after a bulk load.
    pub fn settle(&mut self, key: impl Fn(u32) -> Rank) {
        // Freed sets are empty: settling them is a no-op.
        for set in &mut self.sets {
            set.settle(&key);
        }
    }

    fn new_set(&mut self, set: Ordered<Rank>) -> u32 {
        match self.free_sets.pop() {
            Some(s) => {
                self.sets[s as usize] = set;
                s
            }
            None => {
                self.sets.push(set);
                (self.sets.len() - 1) as u32
            }
        }
    }

    /// Takes a task out of a value's set; true when the value has no task left (it is then
    /// freed).
    pub fn remove(&mut self, v: u32, slot: u32, rank: Rank, key: impl Fn(u32) -> Rank) -> bool {
        let empty = match self.values[v as usize].members {
            Members::Free => false,
            Members::One(only) => only == slot,
            Members::Many(s) => {
                let set = &mut self.sets[s as usize];
                set.remove(slot, rank, key);
                match (set.len(), set.first()) {
                    (1, Some(last)) => {
                        // Back to one task held inline: the set's memory is freed.
                        self.sets[s as usize] = Ordered::default();
                        self.free_sets.push(s);
                        self.values[v as usize].members = Members::One(last);
                        false
                    }
                    (0, _) => {
                        self.sets[s as usize] = Ordered::default();
                        self.free_sets.push(s);
                        true
                    }
                    _ => false,
                }
            }
        };
        if empty {
            self.drop_value(v);
        }
        empty
    }

    /// Takes a task out of a value's set for a moment (to change its rank): the value keeps its
    /// number and its other tasks, and nothing is freed. [`Values::attach`] puts it back.
    pub fn detach(&mut self, v: u32, slot: u32, rank: Rank, key: impl Fn(u32) -> Rank) {
        if let Members::Many(s) = self.values[v as usize].members {
            self.sets[s as usize].remove(slot, rank, key);
        }
    }

    /// Puts back a task [`Values::detach`] took out, under its new rank.
    pub fn attach(&mut self, v: u32, slot: u32, rank: Rank, key: impl Fn(u32) -> Rank) {
        if let Members::Many(s) = self.values[v as usize].members {
            self.sets[s as usize].insert(slot, rank, key);
        }
    }

    /// How many tasks have a value.
    pub fn count(&self, v: u32) -> usize {
        match self.values[v as usize].members {
            Members::Free => 0,
            Members::One(_) => 1,
            Members::Many(s) => self.sets[s as usize].len(),
        }
    }

    /// A value's tasks in pop order.
    pub fn tasks(&self, v: u32) -> Tasks<'_> {
        match self.values[v as usize].members {
            Members::Free => Tasks::One(None),
            Members::One(slot) => Tasks::One(Some(slot)),
            Members::Many(s) => Tasks::Many(&self.sets[s as usize]),
        }
    }

    /// Every value with tasks.
    pub fn all(&self) -> impl Iterator<Item = u32> + '_ {
        self.table.iter().copied()
    }

    /// Copies the live values' text into a new buffer, leaving out the garbage.
    fn compact(&mut self) {
        let mut text = String::with_capacity(self.text.len() - self.garbage);
        for value in &mut self.values {
            if value.len > 0 {
                let old = text_of(&self.text, value);
                let start = text.len() as u32;
                text.push_str(old);
                value.start = start;
            } else {
                value.start = 0;
            }
        }
        self.text = text;
        self.garbage = 0;
    }

    /// Bytes held on the allocator's heap.
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity()
            + self.values.capacity() * std::mem::size_of::<Value>()
            + self.free.capacity() * 4
            + self.table.allocation_size()
            + self.sets.capacity() * std::mem::size_of::<Ordered<Rank>>()
            + self.sets.iter().map(Ordered::heap_bytes).sum::<usize>()
            + self.shared.capacity() * std::mem::size_of::<Option<Arc<str>>>()
    }
}

fn text_of<'a>(text: &'a str, v: &Value) -> &'a str {
    text.get(v.start as usize..(v.start + v.len) as usize)
        .unwrap_or_default()
}

/// A value's tasks: one slot, or a set.
pub(super) enum Tasks<'a> {
    One(Option<u32>),
    Many(&'a Ordered<Rank>),
}

impl<'a> Tasks<'a> {
    /// The first in pop order.
    pub fn first(&self) -> Option<u32> {
        match self {
            Tasks::One(s) => *s,
            Tasks::Many(set) => set.first(),
        }
    }

    /// The last in pop order.
    pub fn last(&self) -> Option<u32> {
        match self {
            Tasks::One(s) => *s,
            Tasks::Many(set) => set.last(),
        }
    }

    /// All of them in pop order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = u32> + 'a> {
        match *self {
            Tasks::One(s) => Box::new(s.into_iter()),
            Tasks::Many(set) => Box::new(set.iter()),
        }
    }
}
