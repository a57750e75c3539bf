//! SipHash-1-3 of one byte string, in one pass: the bucket names' hash.
//!
//! The same function as `siphasher::sip::SipHasher13::hash` (tested equal
//! on every length from 0 to 64 and random keys below): the rounds and
//! the padding are SipHash's, only the streaming state is gone. Ids are
//! short, and that state (a tail buffer and its length, kept across
//! writes) costs a third of the hash of a short id.

/// A SipHash-1-3 key: two words drawn at random per store.
#[derive(Clone, Copy)]
pub(super) struct SipKey {
    k0: u64,
    k1: u64,
}

impl SipKey {
    pub(super) fn new(k0: u64, k1: u64) -> Self {
        SipKey { k0, k1 }
    }

    /// SipHash-1-3 of `bytes`, 64-bit output.
    #[inline]
    pub(super) fn hash(&self, bytes: &[u8]) -> u64 {
        let mut v = [
            self.k0 ^ 0x736f_6d65_7073_6575,
            self.k1 ^ 0x646f_7261_6e64_6f6d,
            self.k0 ^ 0x6c79_6765_6e65_7261,
            self.k1 ^ 0x7465_6462_7974_6573,
        ];
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            if let &[a, b, c, d, e, f, g, h] = chunk {
                compress(&mut v, u64::from_le_bytes([a, b, c, d, e, f, g, h]));
            }
        }
        // The length's low byte on top, the last 0 to 7 bytes below.
        let last = (bytes.len() as u64) << 56 | tail(chunks.remainder());
        compress(&mut v, last);
        v[2] ^= 0xff;
        round(&mut v);
        round(&mut v);
        round(&mut v);
        v[0] ^ v[1] ^ v[2] ^ v[3]
    }
}

/// One message word, one round (the "1" of SipHash-1-3).
#[inline(always)]
fn compress(v: &mut [u64; 4], m: u64) {
    v[3] ^= m;
    round(v);
    v[0] ^= m;
}

#[inline(always)]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// Up to 7 bytes, little-endian, in two loads that may overlap (a byte
/// read twice lands on the same place both times).
#[inline(always)]
fn tail(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    match bytes {
        [] => 0,
        [a] => u64::from(*a),
        [a, b] => u64::from(u16::from_le_bytes([*a, *b])),
        [a, b, c] => {
            u64::from(u16::from_le_bytes([*a, *b])) | u64::from(*c) << 16
        }
        [a, b, c, d, ..] => {
            let low = u64::from(u32::from_le_bytes([*a, *b, *c, *d]));
            let high = match bytes {
                [.., e, f, g, h] => {
                    u64::from(u32::from_le_bytes([*e, *f, *g, *h]))
                }
                _ => 0,
            };
            low | high << (8 * (len - 4))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SipKey;
    use siphasher::sip::SipHasher13;

    #[test]
    fn the_same_as_siphasher_on_every_length() {
        let bytes: Vec<u8> =
            (0..64u8).map(|i| i.wrapping_mul(97) ^ 0x5a).collect();
        let mut keys = (0x0706_0504_0302_0100_u64, 0x0f0e_0d0c_0b0a_0908_u64);
        for round in 0..50u64 {
            let ours = SipKey::new(keys.0, keys.1);
            let reference = SipHasher13::new_with_keys(keys.0, keys.1);
            for len in 0..=bytes.len() {
                let input = &bytes[..len];
                assert_eq!(
                    ours.hash(input),
                    reference.hash(input),
                    "length {len}, round {round}"
                );
            }
            keys = (
                keys.0.rotate_left(7).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    ^ round,
                keys.1.rotate_left(11).wrapping_add(keys.0),
            );
        }
    }
}
