//! `gcra_check_all`: gcra-core's joint decision against an oracle written
//! here from the rules, in i128 arithmetic (no overflow to reason about).

use gcra_core::{
    Charge, CheckError, Decision, JointError, MAX_TIME_US, Quota, check_all,
};

use crate::Bytes;

/// The rules of one bucket (gcra-core's crate docs), exactly.
fn oracle_one(
    quota: &Quota,
    stored: Option<u64>,
    now: u64,
    cost: u32,
) -> Result<Decision, CheckError> {
    let (t, tau) = (
        i128::from(quota.emission_interval_us()),
        i128::from(quota.burst_offset_us()),
    );
    let ceiling = tau + i128::from(quota.max_debt_us());
    let max = i128::from(MAX_TIME_US);
    let now = i128::from(now);
    if cost > 0 && i128::from(cost) * t > tau {
        return Err(CheckError::CostExceedsBurst {
            cost,
            burst: quota.burst(),
        });
    }
    if now > max {
        return Err(CheckError::TimeOutOfRange);
    }
    let mut tat = stored
        .map(i128::from)
        .filter(|&s| s <= max && s >= now)
        .unwrap_or(now);
    let capped = tat > now + ceiling;
    if capped {
        tat = now + ceiling;
    }
    let u = |v: i128| u64::try_from(v).unwrap_or(u64::MAX);
    let store = |tat: i128| gcra_core::StoreTat {
        tat_us: u(tat),
        ttl_ms: u((tat - now + 999) / 1000),
    };
    let remaining = |ahead: i128| u(((tau - ahead).max(0)) / t);
    if cost == 0 {
        // A read: refused only while the bucket is in debt.
        let debt = (tat - now - tau).max(0);
        return Ok(Decision {
            allowed: debt == 0,
            remaining: remaining(tat - now),
            retry_after_us: u(debt),
            reset_after_us: u(tat - now),
            store: None,
        });
    }
    let new_tat = tat + t * i128::from(cost);
    if new_tat > max {
        return Err(CheckError::TimeOutOfRange);
    }
    if new_tat - tau > now {
        return Ok(Decision {
            allowed: false,
            remaining: 0,
            retry_after_us: u(new_tat - tau - now),
            reset_after_us: u(tat - now),
            store: capped.then(|| store(tat)),
        });
    }
    Ok(Decision {
        allowed: true,
        remaining: remaining(new_tat - now),
        retry_after_us: 0,
        reset_after_us: u(new_tat - now),
        store: Some(store(new_tat)),
    })
}

/// A quota from fuzz bytes, or none when they cannot make one.
fn quota(bytes: &mut Bytes<'_>) -> Option<Quota> {
    let limit = bytes.u32() % 2_000 + 1;
    let period = std::time::Duration::from_micros(bytes.u64() % (1 << 40));
    let mut quota = Quota::new(limit, period).ok()?;
    if bytes.u8().is_multiple_of(2) {
        quota = quota.try_allow_burst(bytes.u32() % 5_000).ok()?;
    }
    match bytes.u8() % 4 {
        0 => quota = quota.unbounded_debt(),
        1 => {
            quota = quota
                .try_allow_debt(std::time::Duration::from_micros(
                    bytes.u64() % (1 << 45),
                ))
                .ok()?
        }
        _ => {}
    }
    Some(quota)
}

/// Several limits decided by [`check_all`] and by the oracle: the same
/// verdict, the same parts, the same writes, to the microsecond.
pub fn gcra_check_all(data: &[u8]) {
    let mut bytes = Bytes(data);
    let count = usize::from(bytes.u8() % 5) + 1;
    let now = bytes.u64() % (MAX_TIME_US + 2);
    let mut charges = Vec::new();
    let mut stored = Vec::new();
    for _ in 0..count {
        let Some(quota) = quota(&mut bytes) else {
            return;
        };
        let cost = match bytes.u8() % 4 {
            0 => 0,
            1 => quota.burst(),
            2 => quota.burst().saturating_add(1),
            _ => bytes.u32() % (quota.burst() + 1),
        };
        let shadow = bytes.u8() % 3 == 0;
        charges.push(Charge {
            quota,
            cost,
            shadow,
        });
        stored.push(match bytes.u8() % 4 {
            0 => None,
            1 => Some(bytes.u64()),
            _ => Some(
                now.saturating_add(bytes.u64() % (1 << 52))
                    .saturating_sub(1 << 40),
            ),
        });
    }
    let mut out = vec![Decision::default(); count];
    let decided = check_all(&charges, &stored, now, &mut out);

    // The oracle: each bucket alone, then all or nothing.
    let mut alone = Vec::new();
    for (index, (c, tat)) in charges.iter().zip(&stored).enumerate() {
        match oracle_one(&c.quota, *tat, now, c.cost) {
            Ok(d) => alone.push(d),
            Err(error) => {
                assert_eq!(
                    decided,
                    Err(JointError::Charge { index, error }),
                    "{charges:?} {stored:?} {now}"
                );
                return;
            }
        }
    }
    let verdict =
        decided.unwrap_or_else(|e| panic!("{e}: {charges:?} {stored:?} {now}"));
    let mut refused_by: Option<usize> = None;
    for (i, (c, d)) in charges.iter().zip(&alone).enumerate() {
        let longer = refused_by
            .is_none_or(|r| d.retry_after_us > alone[r].retry_after_us);
        if !c.shadow && !d.allowed && longer {
            refused_by = Some(i);
        }
    }
    assert_eq!(verdict.allowed, refused_by.is_none());
    assert_eq!(verdict.refused_by, refused_by);
    assert_eq!(
        verdict.retry_after_us,
        refused_by.map_or(0, |r| alone[r].retry_after_us)
    );
    for (i, (c, d)) in charges.iter().zip(&alone).enumerate() {
        let expected = if refused_by.is_some() && d.allowed && c.cost > 0 {
            // Not charged: the bucket as it stands, a cap its only write.
            let peek =
                oracle_one(&c.quota, stored[i], now, 0).unwrap_or_default();
            Decision {
                store: capped_write(&c.quota, stored[i], now),
                ..peek
            }
        } else {
            *d
        };
        assert_eq!(
            out[i], expected,
            "bucket {i}: {charges:?} {stored:?} {now}"
        );
    }
}

/// The write of a bucket left uncharged: only a TAT capped after the clock
/// went back.
fn capped_write(
    quota: &Quota,
    stored: Option<u64>,
    now: u64,
) -> Option<gcra_core::StoreTat> {
    let ceiling = i128::from(quota.ceiling_us());
    let (max, now_i) = (i128::from(MAX_TIME_US), i128::from(now));
    let tat = stored.map(i128::from).filter(|&s| s <= max && s >= now_i)?;
    (tat > now_i + ceiling).then(|| {
        let tat = now_i + ceiling;
        gcra_core::StoreTat {
            tat_us: u64::try_from(tat).unwrap_or(u64::MAX),
            ttl_ms: u64::try_from((tat - now_i + 999) / 1000)
                .unwrap_or(u64::MAX),
        }
    })
}
