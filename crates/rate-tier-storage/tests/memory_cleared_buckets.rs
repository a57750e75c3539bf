//! A bucket reset, or refunded back to full, keeps its place in the memory
//! store: a later decision over it and a new bucket takes one place, for
//! the new bucket, so the capacity stays an exact bound and a store with
//! room for the decision's buckets neither refuses it nor evicts for it.
#![allow(clippy::unwrap_used)]

use gcra_core::{Adjust, Decision, Period, PeriodUnit, Quota};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage};

const START_US: u64 = 1_000_000_000;

fn store(capacity: usize) -> MemoryStorage {
    MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(capacity)
        .build()
}

struct Names {
    free: LimitName,
    search: LimitName,
    daily: LimitName,
}

fn names() -> Names {
    Names {
        free: LimitName::new("free").unwrap(),
        search: LimitName::of_limit("search").unwrap(),
        daily: LimitName::of_limit("daily").unwrap(),
    }
}

fn rate<'a>(name: &'a LimitName, user: &'a str) -> BucketCheck<'a> {
    BucketCheck::new(name, user, Quota::per_minute(10), 1).unwrap()
}

fn day<'a>(name: &'a LimitName, user: &'a str) -> BucketCheck<'a> {
    let period = Period::new(100, PeriodUnit::Day, 0).unwrap();
    BucketCheck::of_rule(name, user, period.into(), 1).unwrap()
}

fn passes(store: &MemoryStorage, checks: &[BucketCheck<'_>]) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check_sync(checks, &mut out).unwrap();
    assert!(decided.verdict.allowed, "{out:?}");
}

/// How a charged bucket is brought back to full.
#[derive(Debug, Clone, Copy)]
enum Clear {
    Reset,
    Refund,
}

/// ana's tier charged and cleared, then decided with a new bucket (and a
/// period the store holds, with `period`), in a store with room for one
/// more: the decision passes, and the last place is still free.
fn a_cleared_bucket_keeps_its_place(clear: Clear, period: bool) {
    let n = names();
    let daily = day(&n.daily, "ana");
    let (plan, search) = (rate(&n.free, "ana"), rate(&n.search, "ana"));
    let store = store(usize::from(period) + 3);
    if period {
        passes(&store, &[daily]);
    }
    passes(&store, &[plan]);
    match clear {
        Clear::Reset => store.reset_sync(&[plan]).unwrap(),
        Clear::Refund => {
            store
                .settle_sync(&[plan.settle(Adjust::Refund(1))])
                .unwrap();
        }
    }
    let joint = [daily, plan, search];
    passes(&store, &joint[usize::from(!period)..]);
    passes(&store, &[rate(&n.free, "bea")]);
    assert_eq!(
        (store.len(), store.evictions()),
        (store.capacity(), 0),
        "{clear:?}"
    );
}

#[test]
fn a_rate_reset_or_refunded_to_full_keeps_its_place_in_a_joint_decision() {
    for clear in [Clear::Reset, Clear::Refund] {
        a_cleared_bucket_keeps_its_place(clear, false);
    }
}

#[test]
fn a_rate_reset_or_refunded_to_full_keeps_its_place_beside_a_period() {
    for clear in [Clear::Reset, Clear::Refund] {
        a_cleared_bucket_keeps_its_place(clear, true);
    }
}
