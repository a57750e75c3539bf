//! Property tests: `Quota::check` and `Quota` construction against naive
//! oracles written here from the rules in gcra-core's crate docs, not from
//! the crate's code.
//!
//! Two oracles decide every request:
//!
//! - `spec_check`: the SPEC's four rules transcribed literally in `i128`
//!   (nothing can overflow, no saturation), stateless over the crate's store;
//! - `LeakyBucket`: the same contract seen as a leaky bucket with its own
//!   state. Its water level is how far the bucket's TAT is ahead of now
//!   (at most `tau`); a request pours `cost * T` of water; it fits if the
//!   level stays within `tau`; `remaining` is counted unit by unit.
//!
//! Both must agree with the crate on every field of every `Decision` (or the
//! error), and the TAT the crate asks the store to keep must be the bucket's.

mod common;

use core::time::Duration;

use common::{
    Cost, MAX, Params, Tick, cost, medium_params, small_params, tick, u,
};
use gcra_core::{
    CheckError, Decision, MAX_TIME_US, MAX_WINDOW_US, Quota, QuotaError,
    StoreTat,
};
use proptest::prelude::*;

fn ceil_ms(us: i128) -> u64 {
    assert!(us >= 0);
    u64::try_from((us + 999) / 1000).unwrap()
}

/// The crate docs' "The rules, exactly", rule by rule. The error cases follow the
/// crate docs: cost 0, `T * c > tau`, `now` beyond 2^53, a new TAT beyond
/// 2^53; a stored TAT beyond 2^53 counts as missing (a corrupted value).
fn spec_check(
    p: &Params,
    stored: Option<u64>,
    now: u64,
    cost: u32,
) -> Result<Decision, CheckError> {
    let t = p.t();
    let tau = p.tau();
    let c = i128::from(cost);
    let now = i128::from(now);
    if c == 0 {
        return Err(CheckError::ZeroCost);
    }
    if t * c > tau {
        return Err(CheckError::CostExceedsBurst {
            cost,
            burst: p.burst(),
        });
    }
    if now > MAX {
        return Err(CheckError::TimeOutOfRange);
    }
    // 1. tat = stored TAT; if missing (or corrupted) or < now: tat = now.
    let mut tat = match stored.map(i128::from) {
        Some(s) if s <= MAX => s,
        _ => now,
    };
    if tat < now {
        tat = now;
    }
    //    If tat > now + tau + max debt (beyond any debt a settle leaves:
    //    the clock went back): tat = that ceiling, and store it that way.
    let mut capped = false;
    if tat > now + p.ceiling() {
        tat = now + p.ceiling();
        capped = true;
    }
    // 2. new_tat = tat + T * c; allow_at = new_tat - tau.
    let new_tat = tat + t * c;
    if new_tat > MAX {
        return Err(CheckError::TimeOutOfRange);
    }
    let allow_at = new_tat - tau;
    if allow_at > now {
        // 3. Denied. Nothing stored unless capped.
        Ok(Decision {
            allowed: false,
            remaining: 0,
            retry_after_us: u(allow_at - now),
            reset_after_us: u(tat - now),
            store: capped.then(|| StoreTat {
                tat_us: u(tat),
                ttl_ms: ceil_ms(tat - now),
            }),
        })
    } else {
        // 4. Allowed.
        Ok(Decision {
            allowed: true,
            remaining: u((tau - (new_tat - now)).div_euclid(t)),
            retry_after_us: 0,
            reset_after_us: u(new_tat - now),
            store: Some(StoreTat {
                tat_us: u(new_tat),
                ttl_ms: ceil_ms(new_tat - now),
            }),
        })
    }
}

/// A leaky bucket with its own state: the instant `full_at` at which all the
/// water poured so far has drained (what a store calls the TAT).
#[derive(Debug, Clone, Copy)]
struct LeakyBucket {
    full_at: Option<i128>,
}

impl LeakyBucket {
    fn check(
        &mut self,
        p: &Params,
        now: i128,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let t = p.t();
        let capacity = p.tau(); // water the bucket holds, in µs of draining
        let pour = t * i128::from(cost);
        if cost == 0 {
            return Err(CheckError::ZeroCost);
        }
        if pour > capacity {
            return Err(CheckError::CostExceedsBurst {
                cost,
                burst: p.burst(),
            });
        }
        if now > MAX {
            return Err(CheckError::TimeOutOfRange);
        }
        // The water left now. A value past the end of time is garbage: empty.
        let full_at = self.full_at.filter(|&f| f <= MAX);
        let raw_level = full_at.map_or(0, |f| (f - now).max(0));
        // Up to the quota's max debt of overflow is a debt (a settlement;
        // an hour, or a capacity if larger, by default); more means the
        // clock went back: spill the excess, and remember the level.
        let brim = capacity
            + p.max_debt.map_or(capacity.max(3_600_000_000), i128::from);
        let spilled = raw_level > brim;
        let level = raw_level.min(brim);
        if now + level + pour > MAX {
            return Err(CheckError::TimeOutOfRange);
        }
        if level + pour > capacity {
            if spilled {
                self.full_at = Some(now + level);
            }
            return Ok(Decision {
                allowed: false,
                remaining: 0,
                retry_after_us: u(level + pour - capacity),
                reset_after_us: u(level),
                store: spilled.then(|| StoreTat {
                    tat_us: u(now + level),
                    ttl_ms: ceil_ms(level),
                }),
            });
        }
        let level = level + pour;
        self.full_at = Some(now + level);
        // How many more requests of cost 1 would fit right now, one by one.
        let remaining = if p.burst() <= 4096 {
            let mut n = 0;
            let mut l = level;
            while l + t <= capacity {
                l += t;
                n += 1;
            }
            n
        } else {
            (capacity - level) / t
        };
        Ok(Decision {
            allowed: true,
            remaining: u(remaining),
            retry_after_us: 0,
            reset_after_us: u(level),
            store: Some(StoreTat {
                tat_us: u(now + level),
                ttl_ms: ceil_ms(level),
            }),
        })
    }
}

// ---------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------

fn large_params() -> impl Strategy<Value = Params> {
    prop_oneof![
        Just(Params {
            limit: u32::MAX,
            period_us: 86_400_000_000,
            burst: None,
            max_debt: None,
        }),
        Just(Params {
            limit: 1,
            period_us: 86_400_000_000,
            burst: None,
            max_debt: None,
        }),
        Just(Params {
            limit: 1,
            period_us: MAX_WINDOW_US,
            burst: None,
            max_debt: None,
        }),
        Just(Params {
            limit: u32::MAX,
            period_us: MAX_WINDOW_US - u64::from(u32::MAX),
            burst: None,
            max_debt: None,
        }),
        Just(Params {
            limit: 1_000_000,
            period_us: 1_000_000,
            burst: None,
            max_debt: None,
        }),
        // The longest window and the largest debt: both 2^50.
        Just(Params {
            limit: 1,
            period_us: MAX_WINDOW_US,
            burst: None,
            max_debt: Some(MAX_WINDOW_US),
        }),
        // The longest window a quota may have: about 31.7 years.
        Just(Params {
            limit: 1,
            period_us: 1_000_000,
            burst: Some(1_000_000_000),
            max_debt: None,
        }),
        Just(Params {
            limit: 10,
            period_us: 60_000_000,
            burst: Some(3),
            max_debt: None,
        }),
        // tau = ceil(P / L) * L < P + L: within the window bound.
        (1u32..=u32::MAX, 1u64..=MAX_WINDOW_US - u64::from(u32::MAX)).prop_map(
            |(limit, period)| {
                Params {
                    limit,
                    period_us: period.max(u64::from(limit)),
                    burst: None,
                    max_debt: None,
                }
            }
        ),
    ]
}

fn params() -> impl Strategy<Value = Params> {
    prop_oneof![6 => small_params(), 2 => medium_params(), 1 => large_params()]
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Check(Tick, Cost),
    /// Keys whose ttl has run out (at `now`) disappear from the store.
    Expire,
    /// The store lost the key (eviction, restart).
    Evict,
    /// Someone wrote a value: anything, garbage included.
    Overwrite(u64),
    /// Someone wrote a TAT near now (e.g. another instance with a skewed clock).
    OverwriteNear(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => (tick(), cost())
            .prop_map(|(t, c)| Step::Check(t, c)),
        2 => Just(Step::Expire),
        1 => Just(Step::Evict),
        1 => any::<u64>().prop_map(Step::Overwrite),
        1 => any::<u64>().prop_map(Step::OverwriteNear),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Start {
    Early(u64),
    NearEnd(u64),
    Anywhere(u64),
}

fn start() -> impl Strategy<Value = Start> {
    prop_oneof![
        5 => any::<u64>().prop_map(Start::Early),
        2 => any::<u64>().prop_map(Start::NearEnd),
        1 => any::<u64>().prop_map(Start::Anywhere),
    ]
}

impl Start {
    fn resolve(self, tau: i128) -> i128 {
        match self {
            Start::Early(raw) => i128::from(raw % 1000),
            Start::NearEnd(raw) => {
                (MAX - i128::from(raw) % (4 * tau + 4)).max(0)
            }
            Start::Anywhere(raw) => i128::from(raw) % MAX,
        }
    }
}

/// The store the crate's decisions are applied to: one key, with its expiry.
#[derive(Debug, Default)]
struct Store {
    tat: Option<u64>,
    expires_at: Option<i128>,
}

proptest! {
    #![proptest_config(common::config(
        1024,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/oracle.txt"),
    ))]

    #[test]
    fn check_matches_oracles(
        p in params(),
        start in start(),
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let quota = p.quota();
        prop_assert_eq!(i128::from(quota.emission_interval_us()), p.t());
        prop_assert_eq!(i128::from(quota.burst_offset_us()), p.tau());
        prop_assert_eq!(quota.burst(), p.burst());
        prop_assert_eq!(quota.limit(), p.limit);
        let (t, tau) = (p.t(), p.tau());

        let mut now = start.resolve(tau);
        let mut store = Store::default();
        let mut bucket = LeakyBucket { full_at: None };

        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Check(tick, cost) => {
                    now = tick.apply(now, t, tau);
                    let cost = cost.resolve(p.burst());
                    let now_u = u(now);
                    let got = quota.check(store.tat, now_u, cost);
                    let spec = spec_check(&p, store.tat, now_u, cost);
                    let leaky = bucket.check(&p, now, cost);
                    prop_assert_eq!(
                        got, spec,
                        "step {}: spec, tat {:?} now {} cost {}",
                        i, store.tat, now, cost
                    );
                    prop_assert_eq!(got, leaky, "step {}: leaky bucket", i);
                    if let Ok(Decision { store: Some(s), .. }) = got {
                        store.tat = Some(s.tat_us);
                        store.expires_at = Some(now + i128::from(s.ttl_ms) * 1000);
                    }
                }
                Step::Expire => {
                    if store.expires_at.is_some_and(|e| e <= now) {
                        // Expiry must never change a decision: the bucket
                        // is full again by the time the key disappears.
                        let tat = i128::from(store.tat.unwrap());
                        prop_assert!(
                            tat <= now,
                            "key expired at {} with TAT {} ahead", now, tat
                        );
                        store = Store::default();
                        bucket.full_at = None;
                    }
                }
                Step::Evict => {
                    store = Store::default();
                    bucket.full_at = None;
                }
                Step::Overwrite(v) => {
                    store = Store { tat: Some(v), expires_at: None };
                    bucket.full_at = Some(i128::from(v));
                }
                Step::OverwriteNear(raw) => {
                    let v = (now - tau + i128::from(raw) % (3 * tau + 1)).max(0);
                    store = Store { tat: Some(u(v)), expires_at: None };
                    bucket.full_at = Some(v);
                }
            }
            // The state the store threads matches the bucket's own.
            prop_assert_eq!(
                store.tat.map(i128::from), bucket.full_at,
                "step {}: stored TAT", i
            );
        }
    }

    #[test]
    fn construction_matches_oracle(
        limit in prop_oneof![Just(0u32), 1u32..=10, any::<u32>()],
        period_ns in prop_oneof![
            Just(0u128),
            0u128..5_000,
            any::<u64>().prop_map(u128::from),
            (MAX_TIME_US - 10..=MAX_TIME_US + 10).prop_map(|us| u128::from(us) * 1000),
            any::<u128>(),
        ],
        burst in prop::option::of(prop_oneof![Just(0u32), 1u32..=10, any::<u32>()]),
    ) {
        // Any Duration: up to u64::MAX seconds.
        let period = Duration::new(
            u64::try_from(period_ns / 1_000_000_000 % (1 << 64)).unwrap(),
            u32::try_from(period_ns % 1_000_000_000).unwrap(),
        );
        let micros = period.as_nanos() / 1000; // truncated, as documented
        // Every error that applies; when several do, any of them is right.
        let mut errors = Vec::new();
        if limit == 0 {
            errors.push(QuotaError::ZeroLimit);
        }
        if micros == 0 {
            errors.push(QuotaError::ZeroPeriod);
        }
        if micros > u128::from(MAX_TIME_US) {
            errors.push(QuotaError::OutOfRange);
        }
        if limit > 0 && micros > 0 && micros < u128::from(limit) {
            errors.push(QuotaError::IntervalTooSmall);
        }
        // T rounded up: never more than the rate.
        let t = if limit > 0 { micros.div_ceil(u128::from(limit)) } else { 0 };
        if t * u128::from(limit) > u128::from(MAX_WINDOW_US) {
            errors.push(QuotaError::OutOfRange);
        }
        let base = Quota::new(limit, period);
        if errors.is_empty() {
            let q = base.unwrap();
            prop_assert_eq!(u128::from(q.emission_interval_us()), t);
            prop_assert_eq!(u128::from(q.burst_offset_us()), t * u128::from(limit));
            let period_us = u64::try_from(micros).unwrap();
            prop_assert_eq!(q.period(), Duration::from_micros(period_us));
            prop_assert_eq!((q.limit(), q.burst()), (limit, limit));
            if let Some(b) = burst {
                let tau = t * u128::from(b);
                match q.try_allow_burst(b) {
                    Ok(qb) => {
                        prop_assert!(b >= 1 && tau <= u128::from(MAX_WINDOW_US));
                        prop_assert_eq!(u128::from(qb.burst_offset_us()), tau);
                        prop_assert_eq!(
                            qb.emission_interval_us(),
                            q.emission_interval_us()
                        );
                        prop_assert_eq!(
                            (qb.limit(), qb.burst(), qb.period()),
                            (limit, b, q.period())
                        );
                    }
                    Err(e) => {
                        let expected = if b == 0 {
                            QuotaError::ZeroBurst
                        } else {
                            QuotaError::OutOfRange
                        };
                        prop_assert_eq!(e, expected);
                        prop_assert!(b == 0 || tau > u128::from(MAX_WINDOW_US));
                    }
                }
            }
        } else {
            let e = base.unwrap_err();
            prop_assert!(errors.contains(&e), "{:?} not in {:?}", e, errors);
        }
    }
}
