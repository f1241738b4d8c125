//! The heap's slab: one fixed-size slot per queued task, found by task id or by hash.
//!
//! A slot holds every column the heap keeps of a task, with each key-field value as the number of
//! its interned value ([`super::values`]); every other structure of the heap names a task by its
//! slot number (4 bytes) instead of its id. The two lookups are hash tables of slot numbers
//! whose keys are read from the slots, so neither stores an id or a hash a second time (about
//! 5 bytes a bucket, against 21 for a map from id to slot).

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;
use uuid::Uuid;

use super::Rank;
use crate::domain::keys::KeyField;

/// A key field with no value.
pub(super) const NONE: u32 = u32::MAX;

/// A queued task as the slab holds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub priority: i64,
    /// Creation time, microseconds since the epoch.
    pub created: i64,
    /// Last change, microseconds since the epoch.
    pub modified: i64,
    pub id: Uuid,
    /// Meaningful when [`Slot::has_hash`].
    pub hash: [u8; 16],
    /// Meaningful when [`Slot::has_schedule`].
    pub schedule: Uuid,
    /// Interned value numbers by [`KeyField::index`]; [`NONE`] for no value.
    pub keys: [u32; KeyField::COUNT],
    flags: u8,
}

const HAS_HASH: u8 = 1;
const HAS_SCHEDULE: u8 = 2;
/// Set on a slot in use; a free slot waits in [`Slots::free`].
const LIVE: u8 = 4;

impl Slot {
    /// A slot for a task.
    pub fn new(
        id: Uuid,
        (priority, created, modified): (i64, i64, i64),
        hash: Option<[u8; 16]>,
        schedule: Option<Uuid>,
        keys: [u32; KeyField::COUNT],
    ) -> Self {
        let mut flags = LIVE;
        if hash.is_some() {
            flags |= HAS_HASH;
        }
        if schedule.is_some() {
            flags |= HAS_SCHEDULE;
        }
        Self {
            priority,
            created,
            modified,
            id,
            hash: hash.unwrap_or_default(),
            schedule: schedule.unwrap_or_default(),
            keys,
            flags,
        }
    }

    /// Where the task ranks.
    pub fn rank(&self) -> Rank {
        Rank {
            priority: self.priority,
            created_micros: self.created,
            id: self.id,
        }
    }

    /// Its hash, when it has one in the 32-hex-digit form.
    pub fn hash(&self) -> Option<[u8; 16]> {
        (self.flags & HAS_HASH != 0).then_some(self.hash)
    }

    /// The schedule that produced it.
    pub fn schedule(&self) -> Option<Uuid> {
        (self.flags & HAS_SCHEDULE != 0).then_some(self.schedule)
    }

    /// Names its schedule.
    pub fn set_schedule(&mut self, schedule: Option<Uuid>) {
        self.schedule = schedule.unwrap_or_default();
        match schedule {
            Some(_) => self.flags |= HAS_SCHEDULE,
            None => self.flags &= !HAS_SCHEDULE,
        }
    }

    /// The value number of a key field, if it has one.
    pub fn key(&self, field: KeyField) -> Option<u32> {
        Some(self.keys[field.index()]).filter(|v| *v != NONE)
    }

    fn is_live(&self) -> bool {
        self.flags & LIVE != 0
    }
}

/// The slab and its lookups by id and by hash.
#[derive(Debug, Default)]
pub(super) struct Slots {
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_id: HashTable<u32>,
    by_hash: HashTable<u32>,
    hasher: RandomState,
}

impl Slots {
    /// Room for `n` tasks, so a bulk load allocates once.
    pub fn reserve(&mut self, n: usize) {
        self.slots.reserve_exact(n);
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.by_id
            .reserve(n, |s| hasher.hash_one(slots[*s as usize].id));
        self.by_hash
            .reserve(n, |s| hasher.hash_one(slots[*s as usize].hash));
    }

    /// Gives back the slab's room beyond its tasks: grown one task at a time (a rebuild that
    /// could not know how many were coming), it ends up to twice as large as needed. (The hash
    /// tables end at the same size either way: their buckets come in powers of two.)
    pub fn shrink(&mut self) {
        self.slots.shrink_to_fit();
        self.free.shrink_to_fit();
    }

    /// Tasks held.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The slot of a task.
    pub fn find(&self, id: &Uuid) -> Option<u32> {
        let slots = &self.slots;
        self.by_id
            .find(self.hasher.hash_one(id), |s| slots[*s as usize].id == *id)
            .copied()
    }

    /// The slot of a task with this hash (any one, if several share it).
    pub fn find_hash(&self, hash: &[u8; 16]) -> Option<u32> {
        let slots = &self.slots;
        self.by_hash
            .find(self.hasher.hash_one(hash), |s| {
                slots[*s as usize].hash == *hash
            })
            .copied()
    }

    /// A slot in use.
    pub fn get(&self, slot: u32) -> &Slot {
        &self.slots[slot as usize]
    }

    /// A slot in use, to change its priority or modification time (never its id or hash).
    pub fn get_mut(&mut self, slot: u32) -> &mut Slot {
        &mut self.slots[slot as usize]
    }

    /// The rank of a slot in use.
    pub fn rank(&self, slot: u32) -> Rank {
        self.slots[slot as usize].rank()
    }

    /// Takes in a task whose id is not held yet; answers its slot.
    pub fn insert(&mut self, slot: Slot) -> u32 {
        let at = match self.free.pop() {
            Some(at) => {
                self.slots[at as usize] = slot;
                at
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    // Growth by an eighth, not a doubling: the slab is most of the heap's
                    // memory, and a doubling would leave up to half of it unused.
                    self.slots.reserve_exact((self.slots.len() / 8).max(64));
                }
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.by_id.insert_unique(hasher.hash_one(slot.id), at, |s| {
            hasher.hash_one(slots[*s as usize].id)
        });
        if slot.hash().is_some() {
            // An entry per task, also when several share the hash (rows written behind the
            // engine's back, a database written by mula): each is found until it leaves. One entry per hash lost the others as soon as its own task left.
            self.by_hash
                .insert_unique(hasher.hash_one(slot.hash), at, |s| {
                    hasher.hash_one(slots[*s as usize].hash)
                });
        }
        at
    }

    /// Frees a slot; answers what it held.
    pub fn remove(&mut self, at: u32) -> Slot {
        let slot = self.slots[at as usize];
        let hasher = &self.hasher;
        if let Ok(e) = self
            .by_id
            .find_entry(hasher.hash_one(slot.id), |s| *s == at)
        {
            e.remove();
        }
        if let Some(h) = slot.hash()
            && let Ok(e) = self.by_hash.find_entry(hasher.hash_one(h), |s| *s == at)
        {
            e.remove();
        }
        self.slots[at as usize].flags = 0;
        self.free.push(at);
        slot
    }

    /// Every slot in use with its number, in slab order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Slot)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_live())
            .map(|(i, s)| (i as u32, s))
    }

    /// Bytes held on the allocator's heap.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.free.capacity() * 4
            + self.by_id.allocation_size()
            + self.by_hash.allocation_size()
    }
}
