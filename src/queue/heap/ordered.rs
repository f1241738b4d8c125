//! An ordered set of slots, compared by a key read from the slab: the heap's per-value sets.
//!
//! The heap keeps several orders of the same tasks (per organisation, plugin, image, the age
//! order, each organisation's own plugin and image sets). Holding a task's whole rank (32 bytes)
//! in each of them, in a B-tree, cost about 45 bytes a task per order; this set holds 4-byte
//! slot numbers in sorted runs ("chunks") of at most [`CHUNK_MAX`], and reads a slot's key from
//! the slab when it must compare. Each chunk keeps a copy of its last key, so finding the chunk
//! of a key reads no slot; only an insert's binary search within one chunk does (about six
//! reads, none when the key is past the chunk's last); a removal finds its slot by number. An
//! insert or a removal moves at most one chunk's items (256 bytes). Runs of 64 cost about 1.5
//! bytes a slot in chunk headers, runs of 256 a third of that; in the heap alone at 1e6 queued
//! (`cargo bench --bench broker -- --fairness`), runs of 256 searched by key for removals cost
//! 31 µs a strict image pop and push, runs of 64 with removals by number 21 µs (the B-tree of
//! whole ranks before them, 23 µs).
//!
//! The key of a slot must not change while the slot is in a set: the heap takes a task out of
//! its sets before it changes its priority, and puts it back after.

/// Items a chunk holds at most; a chunk that grows past it splits in two. Small in unit tests,
/// so that every test of the heap splits and merges chunks.
const CHUNK_MAX: usize = if cfg!(test) { 8 } else { 64 };
/// A chunk smaller than this after a removal merges into its neighbour when both fit in one.
const CHUNK_MIN: usize = CHUNK_MAX / 8;

/// A sorted run of slots and the key of its last one.
#[derive(Debug)]
struct Chunk<K> {
    last: K,
    items: Vec<u32>,
}

/// An ordered set of slots (see the module's text). `K` is the order: a slot's key must be
/// unique within a set.
#[derive(Debug)]
pub(super) struct Ordered<K> {
    chunks: Vec<Chunk<K>>,
    len: usize,
}

impl<K> Default for Ordered<K> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Copy> Ordered<K> {
    /// A set of one slot.
    pub fn one(slot: u32, key: K) -> Self {
        Self {
            chunks: vec![Chunk {
                last: key,
                items: vec![slot],
            }],
            len: 1,
        }
    }

    /// Slots held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first slot in the order.
    pub fn first(&self) -> Option<u32> {
        self.chunks.first().and_then(|c| c.items.first().copied())
    }

    /// The last slot in the order.
    pub fn last(&self) -> Option<u32> {
        self.chunks.last().and_then(|c| c.items.last().copied())
    }

    /// The slots in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.chunks.iter().flat_map(|c| c.items.iter().copied())
    }

    /// The chunk a key belongs in: the first whose last key is not below it (the last chunk for
    /// a key past every one).
    fn chunk_of(&self, k: &K) -> usize {
        self.chunks
            .partition_point(|c| c.last < *k)
            .min(self.chunks.len().saturating_sub(1))
    }

    /// Adds `slot`, whose key is `k`; `key` reads any held slot's key.
    pub fn insert(&mut self, slot: u32, k: K, key: impl Fn(u32) -> K) {
        if self.chunks.is_empty() {
            *self = Self::one(slot, k);
            return;
        }
        let c = self.chunk_of(&k);
        let chunk = &mut self.chunks[c];
        // Past the chunk's last (a new task in the age order, mostly): no slot is read.
        let at = match k > chunk.last {
            true => chunk.items.len(),
            false => chunk.items.partition_point(|s| key(*s) < k),
        };
        if chunk.items.get(at).is_some_and(|s| *s == slot) {
            return;
        }
        chunk.items.insert(at, slot);
        if at + 1 == chunk.items.len() {
            chunk.last = k;
        }
        self.len += 1;
        if chunk.items.len() > CHUNK_MAX {
            let tail = chunk.items.split_off(chunk.items.len() / 2);
            let tail_last = chunk.last;
            if let Some(s) = chunk.items.last() {
                chunk.last = key(*s);
            }
            self.chunks.insert(
                c + 1,
                Chunk {
                    last: tail_last,
                    items: tail,
                },
            );
        }
    }

    /// Adds `slot` after every slot held, unsorted until [`Ordered::settle`]: a bulk load.
    pub fn append(&mut self, slot: u32, k: K) {
        match self.chunks.last_mut() {
            Some(c) => {
                c.items.push(slot);
                c.last = k;
                self.len += 1;
            }
            None => *self = Self::one(slot, k),
        }
    }

    /// Sorts a set built by [`Ordered::append`] and cuts it into chunks.
    pub fn settle(&mut self, key: impl Fn(u32) -> K) {
        let mut all: Vec<u32> = self.chunks.drain(..).flat_map(|c| c.items).collect();
        all.sort_unstable_by_key(|s| key(*s));
        all.dedup();
        self.len = all.len();
        // Chunks filled to three quarters, so the first inserts do not split them all.
        for run in all.chunks(CHUNK_MAX * 3 / 4) {
            let Some(last) = run.last() else { continue };
            self.chunks.push(Chunk {
                last: key(*last),
                items: run.to_vec(),
            });
        }
    }

    /// Removes `slot`, whose key is `k`; true if it was held.
    pub fn remove(&mut self, slot: u32, k: K, key: impl Fn(u32) -> K) -> bool {
        if self.chunks.is_empty() {
            return false;
        }
        let c = self.chunk_of(&k);
        let chunk = &mut self.chunks[c];
        // The slot's number is what is searched for: a scan of one chunk's items, which reads no
        // slot (a binary search by key would read several, each likely a cache miss).
        let Some(at) = chunk.items.iter().position(|s| *s == slot) else {
            return false;
        };
        chunk.items.remove(at);
        self.len -= 1;
        match chunk.items.last() {
            None => {
                self.chunks.remove(c);
            }
            Some(s) => {
                if at == chunk.items.len() {
                    chunk.last = key(*s);
                }
                if chunk.items.len() < CHUNK_MIN {
                    self.merge_small(c);
                }
            }
        }
        true
    }

    /// Merges chunk `c` into a neighbour when the two fit in one chunk.
    fn merge_small(&mut self, c: usize) {
        let fits = |a: usize, b: usize| {
            self.chunks[a].items.len() + self.chunks[b].items.len() <= CHUNK_MAX
        };
        let (into, from) = if c + 1 < self.chunks.len() && fits(c, c + 1) {
            (c, c + 1)
        } else if c > 0 && fits(c - 1, c) {
            (c - 1, c)
        } else {
            return;
        };
        let moved = self.chunks.remove(from);
        let target = &mut self.chunks[into];
        target.items.extend(moved.items);
        target.last = moved.last;
    }

    /// How many slots rank before `k`.
    pub fn count_before(&self, k: &K, key: impl Fn(u32) -> K) -> usize {
        let c = self.chunks.partition_point(|c| c.last < *k);
        let before: usize = self.chunks[..c].iter().map(|c| c.items.len()).sum();
        before
            + self
                .chunks
                .get(c)
                .map_or(0, |chunk| chunk.items.partition_point(|s| key(*s) < *k))
    }

    /// Bytes held on the allocator's heap (the chunks and their items), for the heap's own
    /// figure of its size.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Chunk<K>>()
            + self
                .chunks
                .iter()
                .map(|c| c.items.capacity() * 4)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys by slot: a permutation, so slot order differs from key order.
    fn keys(n: u32) -> Vec<u64> {
        (0..n)
            .map(|s| u64::from(s.wrapping_mul(2_654_435_761)))
            .collect()
    }

    #[test]
    fn holds_any_number_of_slots_in_key_order_through_inserts_and_removals() {
        let k = keys(5_000);
        let key = |s: u32| k[s as usize];
        let mut set = Ordered::default();
        for s in 0..5_000 {
            set.insert(s, key(s), key);
        }
        assert_eq!(set.len(), 5_000);
        let mut want: Vec<u32> = (0..5_000).collect();
        want.sort_by_key(|s| key(*s));
        assert_eq!(set.iter().collect::<Vec<_>>(), want);
        // Remove every other one in key order, and every slot of a stretch that empties chunks.
        for s in want.iter().step_by(2).chain(&want[1_000..2_000]) {
            set.remove(*s, key(*s), key);
        }
        let left: Vec<u32> = want
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 1 && !(1_000..2_000).contains(i))
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(set.iter().collect::<Vec<_>>(), left);
        assert_eq!(set.len(), left.len());
        assert_eq!(set.first(), left.first().copied());
        assert_eq!(set.last(), left.last().copied());
        assert!(!set.remove(want[0], key(want[0]), key), "gone already");
        let probe = key(left[700]);
        assert_eq!(set.count_before(&probe, key), 700);
        for s in &left {
            assert!(set.remove(*s, key(*s), key));
        }
        assert!(
            set.is_empty() && set.chunks.is_empty(),
            "no empty chunk left"
        );
    }

    #[test]
    fn a_set_loaded_in_bulk_is_the_set_built_one_by_one() {
        let k = keys(3_000);
        let key = |s: u32| k[s as usize];
        let (mut bulk, mut single) = (Ordered::default(), Ordered::default());
        for s in 0..3_000 {
            bulk.append(s, key(s));
            single.insert(s, key(s), key);
        }
        bulk.settle(key);
        assert_eq!(bulk.len(), 3_000);
        assert_eq!(
            bulk.iter().collect::<Vec<_>>(),
            single.iter().collect::<Vec<_>>()
        );
        // Inserts after a bulk load land in order too.
        let k2: Vec<u64> = (0..3_100)
            .map(|s| if s < 3_000 { k[s] } else { s as u64 * 331 })
            .collect();
        let key2 = |s: u32| k2[s as usize];
        for s in 3_000..3_100 {
            bulk.insert(s, key2(s), key2);
        }
        let got: Vec<u64> = bulk.iter().map(key2).collect();
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(got.len(), 3_100);
    }
}
