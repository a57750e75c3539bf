//! Refusals remembered in process: a client hammering past its limit costs
//! no Redis call until GCRA says it could pass.
//!
//! A refusal with `retry_after = r` means the bucket's TAT is at least
//! `r` too far ahead for that cost. Other instances can only push the TAT
//! further (they charge), never back (a refund, rare, is the exception:
//! see below), so until `sent + r` (`sent`: when the refused call left,
//! on the local clock, never later than when Redis decided) the same
//! request, or a costlier one, on the same bucket under the same quota is
//! refused again, exactly: it is answered from here. A cheaper request is
//! sent (it may fit). The memory is bounded: a fixed number of entries per
//! shard, the oldest replaced when full.
//!
//! A settlement's refund made elsewhere can let a bucket pass before the
//! remembered time: the memory then refuses for at most the time left of
//! that refusal's wait.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

use gcra_core::Decision;

use crate::bucket::BucketCheck;

const SHARDS: usize = 16;
const PER_SHARD: usize = 4096;

/// One remembered refusal.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    /// Until when (local µs) the same request is refused.
    until_us: u64,
    /// The smallest cost refused.
    cost: u32,
    /// The bucket's reset, as of `until_us`.
    reset_at_us: u64,
}

/// Remembered refusals, by bucket.
pub(super) struct Refusals {
    hasher: std::collections::hash_map::RandomState,
    shards: Box<[Mutex<HashMap<u64, Refusal>>]>,
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusals").finish_non_exhaustive()
    }
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            hasher: Default::default(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl Refusals {
    /// The bucket under its quota (a reload that changes the quota is a
    /// different entry); keyed, so ids cannot be aimed at one entry.
    fn key(&self, check: &BucketCheck<'_>) -> u64 {
        let quota = check.quota();
        self.hasher.hash_one((
            check.name(),
            check.partition(),
            quota.emission_interval_us(),
            quota.burst_offset_us(),
        ))
    }

    fn shard(&self, key: u64) -> &Mutex<HashMap<u64, Refusal>> {
        &self.shards[(key as usize) % SHARDS]
    }

    /// Answers `checks` from memory if an enforced bucket among them is
    /// remembered refused for a cost no larger than its cost now: `out`
    /// then holds that refusal (the refusing bucket's wait and reset; the
    /// others are reported passing, their state unknown here) and the
    /// refusing index is returned.
    pub(super) fn answer(
        &self,
        checks: &[BucketCheck<'_>],
        now_us: u64,
        out: &mut [Decision],
    ) -> Option<usize> {
        let (index, refusal) =
            checks.iter().enumerate().find_map(|(i, check)| {
                if check.cost() == 0 || check.is_shadow() {
                    return None;
                }
                let key = self.key(check);
                let shard = self
                    .shard(key)
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let found = shard.get(&key).copied()?;
                (found.until_us > now_us && found.cost <= check.cost())
                    .then_some((i, found))
            })?;
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = if i == index {
                Decision {
                    allowed: false,
                    remaining: 0,
                    retry_after_us: refusal.until_us.saturating_sub(now_us),
                    reset_after_us: refusal.reset_at_us.saturating_sub(now_us),
                    store: None,
                }
            } else {
                Decision {
                    allowed: true,
                    ..Decision::default()
                }
            };
        }
        Some(index)
    }

    /// Remembers the refusal of `checks[index]`, decided by a call sent at
    /// `sent_us` (local clock).
    pub(super) fn remember(
        &self,
        check: &BucketCheck<'_>,
        decision: &Decision,
        sent_us: u64,
    ) {
        if decision.allowed || check.cost() == 0 || check.is_shadow() {
            return;
        }
        let key = self.key(check);
        let refusal = Refusal {
            until_us: sent_us.saturating_add(decision.retry_after_us),
            cost: check.cost(),
            reset_at_us: sent_us.saturating_add(decision.reset_after_us),
        };
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = shard.get_mut(&key) {
            // The cheapest refused cost is the most useful to remember.
            if refusal.cost <= slot.cost || slot.until_us <= sent_us {
                *slot = refusal;
            }
            return;
        }
        if shard.len() >= PER_SHARD {
            // Full: the ended ones go; if none has, so does any half.
            shard.retain(|_, r| r.until_us > sent_us);
            if shard.len() >= PER_SHARD {
                let mut drop = PER_SHARD / 2;
                shard.retain(|_, _| {
                    drop = drop.saturating_sub(1);
                    drop == 0
                });
            }
        }
        shard.insert(key, refusal);
    }

    /// How many refusals are remembered.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use gcra_core::Quota;

    use super::*;
    use crate::LimitName;

    fn refused(retry_after_us: u64) -> Decision {
        Decision {
            allowed: false,
            retry_after_us,
            reset_after_us: retry_after_us * 2,
            ..Decision::default()
        }
    }

    #[test]
    fn a_refusal_answers_equal_or_costlier_requests_until_it_ends() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let quota = Quota::per_minute(10);
        let two = BucketCheck::new(&name, "ana", quota, 2).unwrap();
        refusals.remember(&two, &refused(1_000), 10_000);
        let mut out = [Decision::default()];
        assert_eq!(refusals.answer(&[two], 10_400, &mut out), Some(0));
        assert_eq!(out[0].retry_after_us, 600);
        let three = BucketCheck::new(&name, "ana", quota, 3).unwrap();
        assert_eq!(refusals.answer(&[three], 10_400, &mut out), Some(0));
        // Cheaper: it may fit, so it is not answered from memory.
        let one = BucketCheck::new(&name, "ana", quota, 1).unwrap();
        assert_eq!(refusals.answer(&[one], 10_400, &mut out), None);
        // Ended; another quota is another entry; a shadow limit is never
        // answered from memory.
        assert_eq!(refusals.answer(&[two], 11_000, &mut out), None);
        let other =
            BucketCheck::new(&name, "ana", Quota::per_minute(20), 2).unwrap();
        assert_eq!(refusals.answer(&[other], 10_400, &mut out), None);
        assert_eq!(
            refusals.answer(&[two.shadow(true)], 10_400, &mut out),
            None
        );
    }

    #[test]
    fn the_memory_is_bounded() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let quota = Quota::per_minute(10);
        for i in 0..4 * SHARDS * PER_SHARD {
            let user = format!("user-{i}");
            let check = BucketCheck::new(&name, &user, quota, 1).unwrap();
            refusals.remember(&check, &refused(1_000_000), 0);
        }
        assert!(refusals.len() <= SHARDS * PER_SHARD, "{}", refusals.len());
    }
}
