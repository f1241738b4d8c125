//! The task hash: the de-duplication key mula computes from a task's payload.
//!
//! MurmurHash3 x64 128-bit with seed 0, rendered like Python's `mmh3.hash_bytes(s).hex()`:
//! `h1` little-endian followed by `h2` little-endian, as 32 lowercase hex digits.

const C1: u64 = 0x87c3_7b91_1142_53d5;
const C2: u64 = 0x4cf5_ad43_2745_937f;

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

fn mix_k1(k1: u64) -> u64 {
    k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2)
}

fn mix_k2(k2: u64) -> u64 {
    k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1)
}

/// MurmurHash3 x64 128 of `data` with `seed`; returns `(h1, h2)`.
pub fn murmur3_x64_128(data: &[u8], seed: u32) -> (u64, u64) {
    let mut h1 = u64::from(seed);
    let mut h2 = u64::from(seed);
    let mut blocks = data.chunks_exact(16);
    for block in &mut blocks {
        let (lo, hi) = block.split_at(8);
        let k1 = u64::from_le_bytes(lo.try_into().unwrap_or_default());
        let k2 = u64::from_le_bytes(hi.try_into().unwrap_or_default());
        h1 ^= mix_k1(k1);
        h1 = h1
            .rotate_left(27)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x52dc_e729);
        h2 ^= mix_k2(k2);
        h2 = h2
            .rotate_left(31)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x3849_5ab5);
    }
    let tail = blocks.remainder();
    let (mut k1, mut k2) = (0u64, 0u64);
    for (i, byte) in tail.iter().enumerate() {
        if i < 8 {
            k1 |= u64::from(*byte) << (8 * i);
        } else {
            k2 |= u64::from(*byte) << (8 * (i - 8));
        }
    }
    if tail.len() > 8 {
        h2 ^= mix_k2(k2);
    }
    if !tail.is_empty() {
        h1 ^= mix_k1(k1);
    }
    let len = data.len() as u64;
    h1 ^= len;
    h2 ^= len;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    (h1, h2)
}

/// The 32-hex-digit hash of `input`, as mula stores it.
pub fn task_hash(input: &str) -> String {
    let (h1, h2) = murmur3_x64_128(input.as_bytes(), 0);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&h1.to_le_bytes());
    bytes[8..].copy_from_slice(&h2.to_le_bytes());
    let mut out = String::with_capacity(32);
    for b in bytes {
        out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::task_hash;

    // Test vectors from the reference notes (computed with Python mmh3 5.x).
    #[test]
    fn hash_of_hello_matches_mmh3() {
        assert_eq!(task_hash("hello"), "029bbd41b3a7d8cb191dae486a901e5b");
    }

    #[test]
    fn hash_of_a_boefje_without_ooi_matches_mmh3() {
        assert_eq!(
            task_hash("dns-records-org1"),
            "316d04d4f0baf363b64ec113ce54f9ce"
        );
    }

    #[test]
    fn hash_of_a_boefje_with_ooi_matches_mmh3() {
        assert_eq!(
            task_hash("Hostname|internet|example.com-dns-records-org1"),
            "74956880324db1838156e1ebf7847448"
        );
    }

    #[test]
    fn hash_of_the_empty_string_is_all_zeros() {
        assert_eq!(task_hash(""), "0".repeat(32));
    }

    #[test]
    fn every_tail_length_gives_a_distinct_hash() {
        // Exercises each branch of the tail handling (lengths 0..=32).
        let input = "abcdefghijklmnopqrstuvwxyz0123456789";
        let hashes: std::collections::HashSet<String> =
            (0..=32).map(|n| task_hash(&input[..n])).collect();
        assert_eq!(hashes.len(), 33);
    }
}
