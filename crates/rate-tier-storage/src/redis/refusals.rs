//! Refusals remembered in process: a client hammering past its limit costs
//! no Redis call until GCRA says it could pass. Other instances only push a
//! bucket's TAT further, so until the refused call's send time plus its
//! `retry_after` the same request, or a costlier one, is refused again
//! exactly; it is answered from here, as Redis would answer it. Only a
//! rate's refusal is remembered (the reasoning is GCRA's). Refunds are the
//! exception: this store's own forget the refusal at once, another
//! instance's can make a bucket pass at most that refusal's wait early, and
//! a reset through any instance voids every memory (`resets.rs`). Entries
//! are keyed by the bucket's real key and bounded per shard.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

use gcra_core::Decision;

use crate::bucket::BucketCheck;

const SHARDS: usize = 16;
const PER_SHARD: usize = 4096;

/// One remembered refusal.
#[derive(Debug, Clone)]
struct Refusal {
    /// The quota it was decided under (a reload that changes it makes the
    /// refusal moot).
    quota: (u64, u64, u64),
    /// Until when (local µs) the same request is refused.
    until_us: u64,
    /// The smallest cost refused.
    cost: u32,
    /// The bucket's reset, as of `until_us`.
    reset_at_us: u64,
    /// The other buckets of the refused decision, as they stood: a request
    /// over them is answered from memory with their state, and a request
    /// over any bucket not among them goes to Redis. Empty (no allocation)
    /// for a decision of one bucket.
    others: Box<[Other]>,
}

/// A bucket of a remembered refused decision, beside the one that refused.
#[derive(Debug, Clone, Copy)]
struct Other {
    /// [`Refusals::key`] of its bucket key.
    key: u64,
    decision: Decision,
    /// When its wait (if it refused too) and its reset end, local µs.
    until_us: u64,
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

/// What a refusal depends on of a bucket's quota.
fn quota_of(check: &BucketCheck<'_>) -> (u64, u64, u64) {
    let quota = check.quota();
    (
        quota.emission_interval_us(),
        quota.burst_offset_us(),
        quota.max_debt_us(),
    )
}

impl Refusals {
    /// The bucket's entry: its real key, hashed under a random key of this
    /// process (ids cannot be aimed at one entry).
    fn key(&self, bucket_key: &str) -> u64 {
        self.hasher.hash_one(bucket_key)
    }

    fn shard(&self, key: u64) -> &Mutex<HashMap<u64, Refusal>> {
        &self.shards[(key as usize) % SHARDS]
    }

    /// Answers `checks` (whose keys are `keys`) from memory if an enforced
    /// bucket among them is remembered refused for a cost no larger than
    /// its cost now, under the same quota, and every other bucket of the
    /// request was in that refused decision: `out` then holds each bucket
    /// as it stood then (times counted from `now_us`) and the refusing
    /// index is returned.
    pub(super) fn answer(
        &self,
        checks: &[BucketCheck<'_>],
        keys: &[String],
        now_us: u64,
        out: &mut [Decision],
    ) -> Option<usize> {
        let (index, refusal, more) =
            checks.iter().zip(keys).enumerate().find_map(
                |(i, (check, bucket_key))| {
                    // A window or a period under a key a rate's refusal was
                    // remembered under (a tier reload changed its kind) is not
                    // that rate: its nominal quota may even be the same.
                    if check.is_shadow() || !check.is_rate() {
                        return None;
                    }
                    let key = self.key(bucket_key);
                    let shard = self
                        .shard(key)
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    let found = shard.get(&key)?;
                    (found.until_us > now_us
                        && found.cost <= check.cost()
                        && found.quota == quota_of(check))
                    .then(|| {
                        // Each unit of cost more moves the TAT T further.
                        let units = u64::from(check.cost() - found.cost);
                        (i, found.clone(), found.quota.0.saturating_mul(units))
                    })
                },
            )?;
        // A state the decision reads (a ban's end) may have changed since a
        // charge's refusal was remembered (this very refusal may have
        // banned): the memory vouches for it only where it refused.
        let reads_state = checks.iter().enumerate().any(|(i, check)| {
            i != index && check.cost() == 0 && !check.is_shadow()
        });
        if reads_state && checks[index].cost() > 0 {
            return None;
        }
        for (i, (slot, bucket_key)) in out.iter_mut().zip(keys).enumerate() {
            *slot = if i == index {
                Decision {
                    allowed: false,
                    remaining: 0,
                    retry_after_us: refusal
                        .until_us
                        .saturating_sub(now_us)
                        .saturating_add(more),
                    reset_after_us: refusal.reset_at_us.saturating_sub(now_us),
                    store: None,
                }
            } else {
                let key = self.key(bucket_key);
                let other = refusal.others.iter().find(|o| o.key == key)?;
                Decision {
                    retry_after_us: match other.decision.allowed {
                        true => 0,
                        false => other.until_us.saturating_sub(now_us).max(1),
                    },
                    reset_after_us: other.reset_at_us.saturating_sub(now_us),
                    ..other.decision
                }
            };
        }
        Some(index)
    }

    /// Remembers the refusal of `checks[index]` in a decision whose buckets'
    /// keys are `keys` and whose parts are `out`, decided by a call sent at
    /// `sent_us` (local clock). A refusal by a window or a period is not
    /// remembered (see the module docs).
    pub(super) fn remember(
        &self,
        checks: &[BucketCheck<'_>],
        keys: &[String],
        out: &[Decision],
        index: usize,
        sent_us: u64,
    ) {
        let (Some(check), Some(bucket_key), Some(decision)) =
            (checks.get(index), keys.get(index), out.get(index))
        else {
            return;
        };
        if decision.allowed || check.is_shadow() || !check.is_rate() {
            return;
        }
        let key = self.key(bucket_key);
        let others = keys
            .iter()
            .zip(out)
            .enumerate()
            .filter(|&(i, _)| i != index)
            .map(|(_, (other_key, decision))| Other {
                key: self.key(other_key),
                decision: *decision,
                until_us: sent_us.saturating_add(decision.retry_after_us),
                reset_at_us: sent_us.saturating_add(decision.reset_after_us),
            })
            .collect();
        let refusal = Refusal {
            quota: quota_of(check),
            until_us: sent_us.saturating_add(decision.retry_after_us),
            cost: check.cost(),
            reset_at_us: sent_us.saturating_add(decision.reset_after_us),
            others,
        };
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = shard.get_mut(&key) {
            // The cheapest refused cost is the most useful to remember.
            if refusal.cost <= slot.cost
                || slot.until_us <= sent_us
                || slot.quota != refusal.quota
            {
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

    /// Forgets the refusal of the bucket whose key is `bucket_key` (it was
    /// refunded here: it may pass now).
    pub(super) fn forget(&self, bucket_key: &str) {
        let key = self.key(bucket_key);
        self.shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
    }

    /// Forgets every refusal (a reset somewhere: see `resets.rs`).
    pub(super) fn clear(&self) {
        for shard in &self.shards {
            shard.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
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

    fn key_of(check: &BucketCheck<'_>) -> Vec<String> {
        vec![check.key(crate::KeyLayout::Single)]
    }

    fn keys_of(checks: &[BucketCheck<'_>]) -> Vec<String> {
        checks.iter().flat_map(key_of).collect()
    }

    #[test]
    fn a_refusal_answers_equal_or_costlier_requests_until_it_ends() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let quota = Quota::per_minute(10);
        let two = BucketCheck::new(&name, "ana", quota, 2).unwrap();
        let key = key_of(&two);
        refusals.remember(&[two], &key, &[refused(1_000)], 0, 10_000);
        let mut out = [Decision::default()];
        assert_eq!(refusals.answer(&[two], &key, 10_400, &mut out), Some(0));
        assert_eq!(out[0].retry_after_us, 600);
        // Costlier: refused too, told to wait one interval (6 s) more.
        let three = BucketCheck::new(&name, "ana", quota, 3).unwrap();
        assert_eq!(refusals.answer(&[three], &key, 10_400, &mut out), Some(0));
        assert_eq!(out[0].retry_after_us, 600 + 6_000_000);
        // Cheaper: it may fit, so it is not answered from memory.
        let one = BucketCheck::new(&name, "ana", quota, 1).unwrap();
        assert_eq!(refusals.answer(&[one], &key, 10_400, &mut out), None);
        // Ended; another quota is moot; a shadow limit is never answered
        // from memory.
        assert_eq!(refusals.answer(&[two], &key, 11_000, &mut out), None);
        let other =
            BucketCheck::new(&name, "ana", Quota::per_minute(20), 2).unwrap();
        assert_eq!(refusals.answer(&[other], &key, 10_400, &mut out), None);
        let debtor =
            BucketCheck::new(&name, "ana", quota.unbounded_debt(), 2).unwrap();
        assert_eq!(refusals.answer(&[debtor], &key, 10_400, &mut out), None);
        assert_eq!(
            refusals.answer(&[two.shadow(true)], &key, 10_400, &mut out),
            None
        );
    }

    #[test]
    fn another_key_secret_is_another_bucket_and_a_refund_forgets() {
        use crate::key::KeySecret;
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let (a, b) =
            (KeySecret::new("a").unwrap(), KeySecret::new("b").unwrap());
        let quota = Quota::per_minute(10);
        let under_a = BucketCheck::new(&name, "ana", quota, 1)
            .unwrap()
            .key_secret(Some(&a));
        let under_b = under_a.key_secret(Some(&b));
        refusals.remember(
            &[under_a],
            &key_of(&under_a),
            &[refused(1_000)],
            0,
            0,
        );
        let mut out = [Decision::default()];
        assert_eq!(
            refusals.answer(&[under_a], &key_of(&under_a), 10, &mut out),
            Some(0)
        );
        assert_eq!(
            refusals.answer(&[under_b], &key_of(&under_b), 10, &mut out),
            None,
            "a limiter with another secret is answered from its refusal"
        );
        refusals.forget(&key_of(&under_a)[0]);
        assert_eq!(
            refusals.answer(&[under_a], &key_of(&under_a), 10, &mut out),
            None
        );
    }

    #[test]
    fn the_other_buckets_are_answered_as_they_stood_or_not_at_all() {
        // Regression: the other buckets of a remembered refusal must not be
        // reported passing with 0 remaining and a reset of 0.
        let refusals = Refusals::default();
        let (plan, ip) = (
            LimitName::new("free").unwrap(),
            LimitName::new("ip").unwrap(),
        );
        let quota = Quota::per_minute(10);
        let checks = [
            BucketCheck::new(&ip, "203.0.113.7", quota, 1).unwrap(),
            BucketCheck::new(&plan, "ana", quota, 1).unwrap(),
        ];
        let keys: Vec<String> = checks
            .iter()
            .map(|c| c.key(crate::KeyLayout::Single))
            .collect();
        let passing = Decision {
            allowed: true,
            remaining: 7,
            reset_after_us: 18_000,
            ..Decision::default()
        };
        refusals.remember(&checks, &keys, &[passing, refused(6_000)], 1, 1_000);
        let mut out = [Decision::default(); 2];
        assert_eq!(refusals.answer(&checks, &keys, 3_000, &mut out), Some(1));
        assert_eq!(
            (out[0].allowed, out[0].remaining, out[0].reset_after_us),
            (true, 7, 16_000)
        );
        assert_eq!(out[1].retry_after_us, 4_000);
        // The tier alone was part of it too; another bucket was not.
        let mut one = [Decision::default()];
        assert_eq!(
            refusals.answer(&checks[1..], &keys[1..], 3_000, &mut one),
            Some(0)
        );
        let search = LimitName::new("search").unwrap();
        let wider = [
            checks[1],
            BucketCheck::new(&search, "ana", quota, 1).unwrap(),
        ];
        let wider_keys: Vec<String> = wider
            .iter()
            .map(|c| c.key(crate::KeyLayout::Single))
            .collect();
        assert_eq!(refusals.answer(&wider, &wider_keys, 3_000, &mut out), None);
    }

    #[test]
    fn only_a_rate_refusal_is_remembered_and_answers() {
        use gcra_core::Window;
        let refusals = Refusals::default();
        let name = LimitName::of_limit("login").unwrap();
        let window =
            Window::new(5, std::time::Duration::from_secs(60)).unwrap();
        let in_window =
            BucketCheck::of_rule(&name, "ana", window.into(), 1).unwrap();
        // Its nominal rate is a rate of the same numbers.
        let rate =
            BucketCheck::new(&name, "ana", Quota::per_minute(5), 1).unwrap();
        assert_eq!(in_window.quota(), rate.quota());
        let key = key_of(&in_window);
        assert_eq!(key, key_of(&rate));

        refusals.remember(&[in_window], &key, &[refused(1_000)], 0, 0);
        assert_eq!(refusals.len(), 0, "a window's refusal is remembered");

        // A rate's refusal does not answer a window under its key.
        refusals.remember(&[rate], &key, &[refused(1_000)], 0, 0);
        let mut out = [Decision::default()];
        assert_eq!(refusals.answer(&[rate], &key, 10, &mut out), Some(0));
        assert_eq!(refusals.answer(&[in_window], &key, 10, &mut out), None);

        // A rate's refusal beside a window answers the same decision, the
        // window as it stood.
        let plan = LimitName::new("free").unwrap();
        let checks = [
            BucketCheck::new(&plan, "ana", Quota::per_minute(10), 1).unwrap(),
            in_window,
        ];
        let keys: Vec<String> = checks
            .iter()
            .map(|c| c.key(crate::KeyLayout::Single))
            .collect();
        let peek = Decision {
            allowed: true,
            remaining: 4,
            reset_after_us: 60_000,
            ..Decision::default()
        };
        refusals.remember(&checks, &keys, &[refused(5_000), peek], 0, 1_000);
        let mut two = [Decision::default(); 2];
        assert_eq!(refusals.answer(&checks, &keys, 2_000, &mut two), Some(0));
        assert_eq!((two[1].allowed, two[1].remaining), (true, 4));
    }

    #[test]
    fn a_peek_refused_in_debt_answers_every_request_on_its_bucket() {
        // A ban's end: a peek of a bucket 10 ms in debt, T = 1 ms.
        let refusals = Refusals::default();
        let name = LimitName::new("ban").unwrap();
        let quota = Quota::per_second(1000).allow_burst(1);
        let peek = BucketCheck::peek(&name, "eva", quota);
        let key = key_of(&peek);
        refusals.remember(&[peek], &key, &[refused(10_000)], 0, 0);
        let mut out = [Decision::default()];
        assert_eq!(refusals.answer(&[peek], &key, 4_000, &mut out), Some(0));
        assert_eq!(out[0].retry_after_us, 6_000);
        let charged = BucketCheck::new(&name, "eva", quota, 1).unwrap();
        assert_eq!(refusals.answer(&[charged], &key, 4_000, &mut out), Some(0));
        assert_eq!(out[0].retry_after_us, 6_000 + 1_000);
        // Ended; or forgotten at once (a reset anywhere).
        assert_eq!(refusals.answer(&[peek], &key, 10_000, &mut out), None);
        refusals.clear();
        assert_eq!(refusals.answer(&[peek], &key, 4_000, &mut out), None);
    }

    #[test]
    fn a_charge_refused_beside_a_state_it_reads_is_not_answered_from_memory() {
        let refusals = Refusals::default();
        let (plan, ban) = (
            LimitName::new("free").unwrap(),
            LimitName::new("ban").unwrap(),
        );
        let checks = [
            BucketCheck::new(&plan, "eva", Quota::per_minute(10), 1).unwrap(),
            BucketCheck::peek(
                &ban,
                "eva",
                Quota::per_second(1000).allow_burst(1),
            ),
        ];
        let keys: Vec<String> = checks
            .iter()
            .map(|c| c.key(crate::KeyLayout::Single))
            .collect();
        let read = Decision {
            allowed: true,
            ..Decision::default()
        };
        refusals.remember(&checks, &keys, &[refused(6_000), read], 0, 0);
        let mut out = [Decision::default(); 2];
        assert_eq!(refusals.answer(&checks, &keys, 10, &mut out), None);
        // Alone, the charge's refusal answers.
        let mut one = [Decision::default()];
        assert_eq!(
            refusals.answer(&checks[..1], &keys[..1], 10, &mut one),
            Some(0)
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
            refusals.remember(
                &[check],
                &key_of(&check),
                &[refused(1_000_000)],
                0,
                0,
            );
        }
        assert!(refusals.len() <= SHARDS * PER_SHARD, "{}", refusals.len());
    }

    #[test]
    fn a_read_refused_beside_another_read_is_answered_from_memory() {
        // A ban's end in debt, read beside a read of the tier: the refusal
        // is that read's own, and holds until its end.
        let refusals = Refusals::default();
        let (ban, plan) = (
            LimitName::new("ban").unwrap(),
            LimitName::new("free").unwrap(),
        );
        let checks = [
            BucketCheck::peek(
                &ban,
                "eva",
                Quota::per_second(1000).allow_burst(1),
            ),
            BucketCheck::peek(&plan, "eva", Quota::per_minute(10)),
        ];
        let keys = keys_of(&checks);
        let read = Decision {
            allowed: true,
            remaining: 10,
            ..Decision::default()
        };
        refusals.remember(&checks, &keys, &[refused(10_000), read], 0, 0);
        let mut out = [Decision::default(); 2];
        assert_eq!(refusals.answer(&checks, &keys, 4_000, &mut out), Some(0));
        assert_eq!(out[0].retry_after_us, 6_000);
        assert_eq!((out[1].allowed, out[1].remaining), (true, 10));
    }

    #[test]
    fn another_refusing_bucket_is_told_the_time_left_of_its_own_wait() {
        let refusals = Refusals::default();
        let (plan, search) = (
            LimitName::new("free").unwrap(),
            LimitName::new("search").unwrap(),
        );
        let quota = Quota::per_minute(10);
        let checks = [
            BucketCheck::new(&plan, "ana", quota, 1).unwrap(),
            BucketCheck::new(&search, "ana", quota, 1).unwrap(),
        ];
        let keys = keys_of(&checks);
        // Both refused, sent at 1 000: the tier for 6 000 more, `search`
        // for 2 000.
        refusals.remember(
            &checks,
            &keys,
            &[refused(6_000), refused(2_000)],
            0,
            1_000,
        );
        let mut out = [Decision::default(); 2];
        assert_eq!(refusals.answer(&checks, &keys, 2_500, &mut out), Some(0));
        assert_eq!(
            (out[0].retry_after_us, out[1].retry_after_us),
            (4_500, 500)
        );
        assert_eq!(out[1].reset_after_us, 4_000 + 1_000 - 2_500);
        // Its wait over, it is still reported as it stood: refused, for
        // the least wait there is.
        assert_eq!(refusals.answer(&checks, &keys, 3_500, &mut out), Some(0));
        assert_eq!((out[1].allowed, out[1].retry_after_us), (false, 1));
    }

    #[test]
    fn the_debug_form_shows_no_bucket_it_remembers() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let check =
            BucketCheck::new(&name, "mallory", Quota::per_minute(10), 1)
                .unwrap();
        let key = key_of(&check);
        refusals.remember(&[check], &key, &[refused(1_000)], 0, 0);
        let shown = format!("{refusals:?}");
        assert!(shown.starts_with("Refusals"), "{shown}");
        assert!(
            !shown.contains(&key[0]) && !shown.contains("1000"),
            "{shown}"
        );
    }

    #[test]
    fn the_cheapest_refused_cost_is_kept_while_its_refusal_lasts() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let quota = Quota::per_minute(10);
        let costing =
            |cost| BucketCheck::new(&name, "ana", quota, cost).unwrap();
        let key = key_of(&costing(1));
        let mut out = [Decision::default()];
        refusals.remember(&[costing(2)], &key, &[refused(10_000)], 0, 0);
        assert_eq!(refusals.answer(&[costing(1)], &key, 500, &mut out), None);
        // A cheaper request, sent and refused: it answers from then on.
        refusals.remember(&[costing(1)], &key, &[refused(8_000)], 0, 1_000);
        assert_eq!(
            refusals.answer(&[costing(1)], &key, 2_000, &mut out),
            Some(0)
        );
        assert_eq!(out[0].retry_after_us, 7_000);
        // A costlier one refused meanwhile does not take its place.
        refusals.remember(&[costing(3)], &key, &[refused(20_000)], 0, 3_000);
        assert_eq!(
            refusals.answer(&[costing(1)], &key, 4_000, &mut out),
            Some(0)
        );
        assert_eq!(out[0].retry_after_us, 5_000);
    }

    #[test]
    fn a_full_shard_forgets_the_ended_refusals_first_else_half() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let quota = Quota::per_minute(10);
        // Users whose refusals land in the first shard: one in SHARDS of
        // them, found among four times as many as that takes (a search
        // that finds too few fails, never runs on).
        let users: Vec<String> = (0..4 * SHARDS * (PER_SHARD + 2))
            .map(|i| format!("user-{i}"))
            .filter(|user| {
                let check = BucketCheck::new(&name, user, quota, 1).unwrap();
                (refusals.key(&key_of(&check)[0]) as usize)
                    .is_multiple_of(SHARDS)
            })
            .take(PER_SHARD + 2)
            .collect();
        assert_eq!(users.len(), PER_SHARD + 2, "users of the first shard");
        let remember = |user: &str, retry_after_us, sent_us| {
            let check = BucketCheck::new(&name, user, quota, 1).unwrap();
            let key = key_of(&check);
            refusals.remember(
                &[check],
                &key,
                &[refused(retry_after_us)],
                0,
                sent_us,
            );
        };
        let answered = |users: &[String], now_us| {
            users
                .iter()
                .filter(|user| {
                    let check =
                        BucketCheck::new(&name, user, quota, 1).unwrap();
                    let mut out = [Decision::default()];
                    refusals
                        .answer(&[check], &key_of(&check), now_us, &mut out)
                        .is_some()
                })
                .count()
        };
        let (ending, lasting) = users[..PER_SHARD].split_at(PER_SHARD / 2);
        // Full: half of them end at 10, half an hour later.
        for user in ending {
            remember(user, 10, 0);
        }
        for user in lasting {
            remember(user, 1_800_000_000, 0);
        }
        assert_eq!(refusals.len(), PER_SHARD);
        // One more at 10: the ended ones go, every lasting one stays.
        remember(&users[PER_SHARD], 1_800_000_000, 10);
        assert_eq!(refusals.len(), PER_SHARD / 2 + 1);
        assert_eq!(answered(lasting, 20), lasting.len());
        // Full of lasting ones, none ended: about half of them go.
        for user in &ending[1..] {
            remember(user, 1_800_000_000, 20);
        }
        assert_eq!(refusals.len(), PER_SHARD);
        remember(&users[PER_SHARD + 1], 1_800_000_000, 30);
        // The first PER_SHARD / 2 - 1 in the table's order go: the rest
        // stay, and the new one with them.
        assert_eq!(refusals.len(), PER_SHARD / 2 + 2);
        assert_eq!(answered(&users[PER_SHARD + 1..], 40), 1);
    }

    #[test]
    fn neither_a_pass_nor_a_shadow_limits_refusal_is_remembered() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let check =
            BucketCheck::new(&name, "ana", Quota::per_minute(10), 1).unwrap();
        let key = key_of(&check);
        let passed = Decision {
            allowed: true,
            ..refused(1_000)
        };
        refusals.remember(&[check], &key, &[passed], 0, 0);
        refusals.remember(&[check.shadow(true)], &key, &[refused(1_000)], 0, 0);
        assert_eq!(refusals.len(), 0);
        let mut out = [Decision::default()];
        assert_eq!(refusals.answer(&[check], &key, 500, &mut out), None);
    }

    #[test]
    fn a_refusal_under_another_quota_replaces_a_cheaper_one_that_lasts() {
        let refusals = Refusals::default();
        let name = LimitName::new("free").unwrap();
        let old = BucketCheck::new(&name, "ana", Quota::per_minute(10), 1);
        let old = old.unwrap();
        let key = key_of(&old);
        refusals.remember(&[old], &key, &[refused(10_000)], 0, 0);
        // A tier reload: a costlier request under the new quota is refused
        // while the old refusal lasts. It is the one remembered now.
        let new = BucketCheck::new(&name, "ana", Quota::per_minute(20), 2);
        let new = new.unwrap();
        refusals.remember(&[new], &key, &[refused(8_000)], 0, 1_000);
        let mut out = [Decision::default()];
        assert_eq!(refusals.answer(&[new], &key, 2_000, &mut out), Some(0));
        assert_eq!(out[0].retry_after_us, 7_000);
        assert_eq!(refusals.answer(&[old], &key, 2_000, &mut out), None);
    }
}
