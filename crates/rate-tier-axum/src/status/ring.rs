//! [`Ring`]: an hour of counts in 10-second slots, without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// The counters' time slot: the last minute is the current slot and the
/// five before it, the hour is 360 of them.
pub(super) const SLOT_US: u64 = 10_000_000;
const SLOTS_PER_MINUTE: u64 = 6;
/// The chart's span, in minutes.
pub(super) const HOUR_MINUTES: u64 = 60;
const SLOTS: usize = (HOUR_MINUTES * SLOTS_PER_MINUTE) as usize;

/// One count per slot of the last hour, without a lock: each word holds
/// its slot's number (high 32 bits) and count (low 32 bits), so a word
/// left from an hour ago reads as 0 and the first count of its new slot
/// starts it again.
pub(super) struct Ring([AtomicU64; SLOTS]);

impl Ring {
    pub(super) fn new() -> Ring {
        Ring(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    fn cell(&self, slot: u64) -> &AtomicU64 {
        &self.0[(slot % SLOTS as u64) as usize]
    }

    pub(super) fn add(&self, slot: u64) {
        // Slot numbers wrap after 2^32 slots (1,361 years): only equality
        // and the wrapped distance are compared.
        let stamp = slot as u32;
        let _ = self.cell(slot).fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |word| {
                let (at, count) = ((word >> 32) as u32, word as u32);
                if at == stamp {
                    Some(pack(stamp, count.saturating_add(1)))
                } else if count == 0 || stamp.wrapping_sub(at) as i32 > 0 {
                    Some(pack(stamp, 1))
                } else {
                    // A reading older than the slot's (a clock stepped
                    // back): dropped rather than counted in the wrong slot.
                    None
                }
            },
        );
    }

    fn count(&self, slot: u64) -> u64 {
        let word = self.cell(slot).load(Ordering::Relaxed);
        if (word >> 32) as u32 == slot as u32 {
            u64::from(word as u32)
        } else {
            0
        }
    }

    /// The minute ending with slot `last` (before the clock's origin: 0).
    pub(super) fn minute(&self, last: Option<u64>) -> u64 {
        let Some(last) = last else { return 0 };
        (last.saturating_sub(SLOTS_PER_MINUTE - 1)..=last)
            .map(|slot| self.count(slot))
            .sum()
    }

    /// Per minute over the last hour, oldest first, the last minute ending
    /// with slot `now`.
    pub(super) fn hour(&self, now: u64) -> Vec<u64> {
        (0..HOUR_MINUTES)
            .rev()
            .map(|ago| self.minute(now.checked_sub(ago * SLOTS_PER_MINUTE)))
            .collect()
    }
}

fn pack(stamp: u32, count: u32) -> u64 {
    (u64::from(stamp) << 32) | u64::from(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_counts_per_slot_and_forgets_after_an_hour() {
        let ring = Ring::new();
        for slot in [0, 0, 5, 6, 359] {
            ring.add(slot);
        }
        assert_eq!(ring.minute(Some(5)), 3);
        assert_eq!(ring.minute(Some(6)), 2);
        let hour = ring.hour(359);
        assert_eq!(hour.len(), 60);
        assert_eq!((hour[0], hour[1], hour[59]), (3, 1, 1));
        // A slot later, slot 0 is over an hour old.
        assert_eq!(ring.hour(360).iter().sum::<u64>(), 3);
        // An hour later slot 0's word is reused: the old count is gone.
        ring.add(360);
        assert_eq!(ring.count(0), 0);
        assert_eq!(ring.count(360), 1);
        // A reading from before the word's slot is not counted in it.
        ring.add(0);
        assert_eq!(ring.count(360), 1);
    }
}
