//! The PostgreSQL functions' arguments, as `int8`s checked to fit: a
//! check's five per bucket (those of the Redis scripts), the mixed
//! function's six, and the slots' ids for a release or a renewal.

use gcra_core::{Adjust, Lease, Quota};

use crate::bucket::BucketCheck;
use crate::key::KeyLayout;
use crate::rule::{Rule, ScriptArg, script_rule};
use crate::storage::StorageError;

/// `v` as an `int8`, or a protocol error: every argument is checked, none
/// wraps.
pub(super) fn int8(v: impl Into<i128>) -> Result<i64, StorageError> {
    let v = v.into();
    i64::try_from(v).map_err(|_| {
        StorageError::Protocol(format!(
            "argument {v} is beyond PostgreSQL's int8"
        ))
    })
}

/// The mixed function's 6 arguments of a bucket: see
/// [`PostgresStorage::mixed_args`](super::PostgresStorage::mixed_args).
pub(super) fn mixed_args(
    check: &BucketCheck<'_>,
    lease: Lease,
) -> Result<[i64; 6], StorageError> {
    let mut args = [0; 4];
    let wire = script_rule(&check.rule(), check.quota(), lease, check.lease());
    for (arg, wire) in args.iter_mut().zip(wire) {
        *arg = match wire {
            ScriptArg::Number(n) => int8(n)?,
            ScriptArg::SlotId(id) => slot_id(id),
        };
    }
    let [tag, a, b, c] = args;
    Ok([
        tag,
        a,
        b,
        c,
        i64::from(check.cost()),
        i64::from(check.is_shadow()),
    ])
}

/// The id of a request's slots as an `int8`: its 64 bits.
pub(super) fn slot_id(id: u64) -> i64 {
    i64::from_ne_bytes(id.to_ne_bytes())
}

/// The keys of `slots` and 2 arguments each, the id and `second(check)`
/// (the units or the lease): the release and renew functions' arguments.
/// Every check must be a concurrency limit's.
pub(super) fn slots_args(
    slots: &[BucketCheck<'_>],
    second: impl Fn(&BucketCheck<'_>) -> i64,
) -> Result<(Vec<String>, Vec<i64>), StorageError> {
    let mut keys = Vec::with_capacity(slots.len());
    let mut args = Vec::with_capacity(slots.len() * 2);
    for check in slots {
        if !matches!(check.rule(), Rule::Concurrency(_)) {
            return Err(StorageError::Unsupported(
                "releasing or renewing a bucket that is not a concurrency limit",
            ));
        }
        keys.push(check.key(KeyLayout::Single));
        args.extend([slot_id(check.lease()), second(check)]);
    }
    Ok((keys, args))
}

/// The functions' arguments of `checks`: 5 per bucket (see
/// [`BucketCheck::script_args`]).
pub(super) fn check_args(
    checks: &[BucketCheck<'_>],
) -> Result<Vec<i64>, StorageError> {
    let mut args = Vec::with_capacity(checks.len() * 5);
    for check in checks {
        for arg in check.script_args() {
            // Every argument is at most 2^50 (a window) or 2^32 (a cost).
            args.push(int8(arg)?);
        }
    }
    Ok(args)
}

/// The settle function's 4 arguments of one bucket: `T`, `tau`, the signed
/// units of `adjust` (a refund negative) and the max debt.
pub(super) fn settle_args(
    quota: Quota,
    adjust: Adjust,
) -> Result<[i64; 4], StorageError> {
    let units = match adjust {
        Adjust::Charge(units) => i64::from(units),
        Adjust::Refund(units) => -i64::from(units),
    };
    Ok([
        int8(quota.emission_interval_us())?,
        int8(quota.burst_offset_us())?,
        units,
        int8(quota.max_debt_us())?,
    ])
}
