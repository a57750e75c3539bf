//! Property tests of `Concurrency` and `Lease` against oracles written here
//! from their rules: the requests in flight as a list of holders (each with
//! its cost, and with leases its expiry), never a counter.

mod common;

use core::time::Duration;

use gcra_core::{
    CheckError, Concurrency, ConcurrencyDecision, ConcurrencyError, Lease,
    MAX_TIME_US, MAX_WINDOW_US, RETRY_HINT_US,
};
use proptest::prelude::*;

fn spec_acquire(
    limit: u32,
    in_flight: u32,
    cost: u32,
) -> Result<ConcurrencyDecision, CheckError> {
    if cost > limit {
        return Err(CheckError::CostExceedsBurst { cost, burst: limit });
    }
    let (limit, held, c) =
        (i128::from(limit), i128::from(in_flight), i128::from(cost));
    let remaining = |r: i128| u64::try_from(r.max(0)).unwrap();
    Ok(if c == 0 {
        ConcurrencyDecision {
            allowed: true,
            remaining: remaining(limit - held),
            retry_after_us: 0,
            write: None,
        }
    } else if held + c > limit {
        ConcurrencyDecision {
            allowed: false,
            remaining: 0,
            retry_after_us: RETRY_HINT_US,
            write: None,
        }
    } else {
        ConcurrencyDecision {
            allowed: true,
            remaining: remaining(limit - held - c),
            retry_after_us: 0,
            write: Some(u32::try_from(held + c).unwrap()),
        }
    })
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(u32),
    /// Releases the holder at this index (mod the number held).
    Release(usize),
    /// Time passes (leases only).
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..=5).prop_map(Op::Acquire),
        3 => any::<usize>().prop_map(Op::Release),
        2 => (0u64..=40).prop_map(Op::Wait),
    ]
}

proptest! {
    #![proptest_config(common::config(
        1024,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/concurrency.txt"),
    ))]

    #[test]
    fn acquire_matches_the_rules(
        limit in prop_oneof![1u32..=8, any::<u32>().prop_map(|l| l.max(1))],
        in_flight in prop_oneof![0u32..=10, any::<u32>()],
        cost in prop_oneof![0u32..=10, any::<u32>()],
    ) {
        let c = Concurrency::new(limit).unwrap();
        prop_assert_eq!(c.acquire(in_flight, cost), spec_acquire(limit, in_flight, cost));
        prop_assert_eq!(
            u64::from(c.release(in_flight, cost)),
            u64::from(in_flight).saturating_sub(u64::from(cost))
        );
    }

    /// A counter store: acquires and releases in any order never hold more
    /// than `N`, and a refusal happens exactly when the holders leave no
    /// room.
    #[test]
    fn a_counter_never_exceeds_the_limit(
        limit in 1u32..=6,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let c = Concurrency::new(limit).unwrap();
        let mut count = 0u32; // the store
        let mut holders: Vec<u32> = Vec::new(); // the oracle
        for op in ops {
            match op {
                Op::Acquire(cost) => {
                    let cost = cost.min(limit);
                    let held: u32 = holders.iter().sum();
                    let d = c.acquire(count, cost).unwrap();
                    prop_assert_eq!(d.allowed, cost == 0 || held + cost <= limit);
                    if let Some(next) = d.write {
                        count = next;
                        holders.push(cost);
                    }
                }
                Op::Release(i) if !holders.is_empty() => {
                    let cost = holders.swap_remove(i % holders.len());
                    count = c.release(count, cost);
                }
                _ => {}
            }
            prop_assert_eq!(count, holders.iter().sum::<u32>());
            prop_assert!(count <= limit);
        }
    }

    /// A leased store (one expiry per slot, any order): the live slots are
    /// the holders whose lease has not run out, and never more than `N`.
    #[test]
    fn leases_free_what_is_never_released(
        limit in 1u32..=6,
        lease_us in 1u64..=50,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let c = Concurrency::new(limit).unwrap();
        let lease = Lease::new(Duration::from_micros(lease_us)).unwrap();
        let mut now = 1000u64;
        let mut slots: Vec<u64> = Vec::new(); // the store: expiries
        let mut holders: Vec<(u32, u64)> = Vec::new(); // the oracle: cost, expiry
        for op in ops {
            match op {
                Op::Acquire(cost) => {
                    let cost = cost.min(limit);
                    let live = Lease::live(&slots, now);
                    let held: u32 = holders
                        .iter()
                        .filter(|&&(_, expiry)| now < expiry)
                        .map(|&(cost, _)| cost)
                        .sum();
                    prop_assert_eq!(live, held, "at {}", now);
                    let d = c.acquire(live, cost).unwrap();
                    prop_assert_eq!(d.allowed, cost == 0 || held + cost <= limit);
                    if d.write.is_some() {
                        let expiry = lease.expiry(now).unwrap();
                        prop_assert_eq!(expiry, now + lease_us);
                        slots.retain(|&e| e > now);
                        slots.extend(std::iter::repeat_n(expiry, cost as usize));
                        holders.push((cost, expiry));
                    }
                }
                Op::Release(i) if !holders.is_empty() => {
                    let (cost, expiry) = holders.swap_remove(i % holders.len());
                    // Removes the holder's own slots, if still there.
                    for _ in 0..cost {
                        if let Some(at) = slots.iter().position(|&e| e == expiry) {
                            slots.swap_remove(at);
                        }
                    }
                }
                Op::Wait(dt) => now += dt,
                _ => {}
            }
            prop_assert!(Lease::live(&slots, now) <= limit);
        }
    }

    #[test]
    fn live_counts_expiries_after_now(
        expiries in prop::collection::vec(
            prop_oneof![0u64..100, Just(MAX_TIME_US), MAX_TIME_US + 1..=u64::MAX],
            0..20,
        ),
        now in 0u64..110,
    ) {
        let naive = expiries.iter().filter(|&&e| e > now && e <= MAX_TIME_US).count();
        prop_assert_eq!(Lease::live(&expiries, now) as usize, naive);
    }
}

#[test]
fn construction_bounds() {
    assert_eq!(Concurrency::new(0), Err(ConcurrencyError::ZeroLimit));
    assert_eq!(Concurrency::new(u32::MAX).unwrap().limit(), u32::MAX);
    assert_eq!(Lease::new(Duration::ZERO), Err(ConcurrencyError::ZeroLease));
    assert_eq!(
        Lease::new(Duration::from_nanos(999)),
        Err(ConcurrencyError::ZeroLease)
    );
    let longest = Duration::from_micros(MAX_WINDOW_US);
    assert_eq!(Lease::new(longest).unwrap().lease_us(), MAX_WINDOW_US);
    assert_eq!(
        Lease::new(longest + Duration::from_micros(1)),
        Err(ConcurrencyError::LeaseOutOfRange)
    );
}

#[test]
fn error_messages() {
    assert_eq!(
        ConcurrencyError::ZeroLimit.to_string(),
        "concurrency limit must be at least 1"
    );
    assert_eq!(
        ConcurrencyError::ZeroLease.to_string(),
        "lease must be at least 1 microsecond"
    );
    assert_eq!(
        ConcurrencyError::LeaseOutOfRange.to_string(),
        "lease exceeds 2^50 microseconds"
    );
}

#[test]
fn lease_expiry_and_ttl() {
    let lease = Lease::new(Duration::from_micros(1500)).unwrap();
    assert_eq!(lease.ttl_ms(), 2, "rounded up");
    assert_eq!(lease.expiry(MAX_TIME_US - 1500), Ok(MAX_TIME_US));
    assert_eq!(
        lease.expiry(MAX_TIME_US - 1499),
        Err(CheckError::TimeOutOfRange)
    );
    assert_eq!(
        lease.expiry(MAX_TIME_US + 1),
        Err(CheckError::TimeOutOfRange)
    );
    // A slot is held up to, not at, its expiry.
    assert_eq!(Lease::live(&[10], 9), 1);
    assert_eq!(Lease::live(&[10], 10), 0);
}

#[test]
fn a_refusal_hints_one_second() {
    let c = Concurrency::new(1).unwrap();
    let d = c.acquire(1, 1).unwrap();
    assert_eq!(
        d,
        ConcurrencyDecision {
            allowed: false,
            remaining: 0,
            retry_after_us: 1_000_000,
            write: None,
        }
    );
    assert_eq!(d.as_decision().reset_after_us, 0);
}
