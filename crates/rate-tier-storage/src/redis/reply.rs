//! What the Lua scripts answer, read: each reply checked for the shape
//! its script promises (see the table in `script.rs`), anything else a
//! [`StorageError::Protocol`], never a decision made of it.

use ::redis::Value;
use gcra_core::{Decision, JointReservation, MAX_TIME_US, StoreTat};

use super::script::Lua;
use crate::storage::StorageError;

/// The reply of a check call into `out`: 4 non-negative integers per key.
pub(super) fn read_decisions(
    lua: &Lua,
    reply: Value,
    out: &mut [Decision],
) -> Result<(), StorageError> {
    let numbers = integers(lua, reply, out.len().saturating_mul(4))?;
    for (slot, n) in out.iter_mut().zip(numbers.chunks_exact(4)) {
        let allowed = match n[0] {
            1 => true,
            0 => false,
            other => {
                return Err(StorageError::Protocol(format!(
                    "{} returned allowed = {other}, expected 0 or 1",
                    lua.name
                )));
            }
        };
        *slot = Decision {
            allowed,
            remaining: n[1],
            retry_after_us: n[2],
            reset_after_us: n[3],
            store: None,
        };
    }
    Ok(())
}

/// The reply of `reserve.lua` into `out` (5 non-negative integers per
/// key, then 5 for the reservation), and the reservation. Each decision's
/// `store` is the TAT the script wrote (what [`StorageExt::cancel`] compares,
/// its expiry from the script's now), `None` where it wrote nothing.
/// `max_wait_us` is the caller's wait, before [`Call::reserve`] capped it.
/// Also Redis's `TIME` when the script ran, in µs.
///
/// [`StorageExt::cancel`]: crate::StorageExt::cancel
/// [`Call::reserve`]: super::script::Call::reserve
pub(super) fn read_reservation(
    lua: &Lua,
    reply: Value,
    max_wait_us: u64,
    out: &mut [Decision],
) -> Result<(JointReservation, u64), StorageError> {
    let n = out.len();
    let numbers = integers(lua, reply, n.saturating_add(1).saturating_mul(5))?;
    let (per_key, tail) = numbers.split_at(n.saturating_mul(5));
    let &[reserved, wait_us, by, most_us, now_us] = tail else {
        return Err(StorageError::Protocol(format!(
            "{} returned no reservation",
            lua.name
        )));
    };
    let flag = |value: u64, what: &str| match value {
        1 => Ok(true),
        0 => Ok(false),
        other => Err(StorageError::Protocol(format!(
            "{} returned {what} = {other}, expected 0 or 1",
            lua.name
        ))),
    };
    for (slot, n) in out.iter_mut().zip(per_key.chunks_exact(5)) {
        *slot = Decision {
            allowed: flag(n[0], "allowed")?,
            remaining: n[1],
            retry_after_us: n[2],
            reset_after_us: n[3],
            store: (n[4] > 0).then(|| StoreTat {
                tat_us: n[4],
                ttl_ms: n[4].saturating_sub(now_us).div_ceil(1000),
            }),
        };
    }
    let by = match usize::try_from(by) {
        Ok(0) => None,
        Ok(position) if position <= n => Some(position - 1),
        _ => {
            return Err(StorageError::Protocol(format!(
                "{} returned by = {by} for {n} keys",
                lua.name
            )));
        }
    };
    // The most is the caller's wait unless a quota's is less: the script
    // saw it capped.
    let sent = max_wait_us.min(MAX_TIME_US);
    let joint = JointReservation {
        reserved: flag(reserved, "reserved")?,
        wait_us,
        by,
        most_us: if most_us >= sent {
            max_wait_us
        } else {
            most_us
        },
    };
    Ok((joint, now_us))
}

/// The reply of a release or a renewal: 1 non-negative integer per key
/// (the slots released or renewed).
pub(super) fn read_counts(
    lua: &Lua,
    reply: Value,
    keys: usize,
) -> Result<Vec<u64>, StorageError> {
    integers(lua, reply, keys)
}

/// The reply of a settle call: 2 non-negative integers per key.
pub(super) fn read_settled(
    lua: &Lua,
    reply: Value,
    keys: usize,
) -> Result<Vec<(u64, u64)>, StorageError> {
    let numbers = integers(lua, reply, keys.saturating_mul(2))?;
    Ok(numbers.chunks_exact(2).map(|n| (n[0], n[1])).collect())
}

/// `expected` non-negative integers, or a [`StorageError::Protocol`]
/// saying what was wrong.
fn integers(
    lua: &Lua,
    reply: Value,
    expected: usize,
) -> Result<Vec<u64>, StorageError> {
    let items = match reply {
        Value::Array(items) if items.len() == expected => items,
        Value::Array(items) => {
            return Err(StorageError::Protocol(format!(
                "{} returned {} values, expected {expected}",
                lua.name,
                items.len()
            )));
        }
        other => {
            return Err(StorageError::Protocol(format!(
                "{} returned {other:?}, expected an array of {expected} integers",
                lua.name
            )));
        }
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::Int(n) => u64::try_from(n).map_err(|_| {
                StorageError::Protocol(format!(
                    "{} returned a negative value: {n}",
                    lua.name
                ))
            }),
            other => Err(StorageError::Protocol(format!(
                "{} returned {other:?} where an integer was expected",
                lua.name
            ))),
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::script::{GCRA, GCRA_ALL, GCRA_SETTLE, RELEASE, RESERVE};

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().copied().map(Value::Int).collect())
    }

    /// Each of `bad`, read by `read`, is a protocol error.
    fn each_refused<T: std::fmt::Debug>(
        bad: impl IntoIterator<Item = Value>,
        mut read: impl FnMut(Value) -> Result<T, StorageError>,
    ) {
        for reply in bad {
            let shown = format!("{reply:?}");
            let read = read(reply);
            assert!(
                matches!(read, Err(StorageError::Protocol(_))),
                "{shown} was accepted: {read:?}"
            );
        }
    }
    #[test]
    fn decodes_an_allowed_and_a_refused_reply() {
        let mut out = [Decision::default(); 2];
        read_decisions(
            &GCRA_ALL,
            ints(&[1, 9, 0, 6_000_000, 0, 0, 6_000_000, 60_000_000]),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out[0],
            Decision {
                allowed: true,
                remaining: 9,
                retry_after_us: 0,
                reset_after_us: 6_000_000,
                store: None,
            }
        );
        assert!(!out[1].allowed);
        assert_eq!(out[1].retry_after_us, 6_000_000);
    }

    #[test]
    fn anything_else_is_a_protocol_error() {
        let bad = [
            ints(&[1, 9, 0]),
            ints(&[1, 9, 0, 1, 1]),
            ints(&[2, 0, 0, 0]),
            ints(&[1, -1, 0, 0]),
            ints(&[0, 0, -6, 0]),
            Value::Nil,
            Value::Int(1),
            Value::Okay,
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"9".to_vec()),
                Value::Int(0),
                Value::Int(0),
            ]),
        ];
        each_refused(bad, |reply| {
            read_decisions(&GCRA, reply, &mut [Decision::default()])
        });
    }

    #[test]
    fn decodes_a_settle_reply_and_refuses_anything_else() {
        assert_eq!(
            read_settled(
                &GCRA_SETTLE,
                ints(&[8, 12_000_000, 0, 72_000_000]),
                2
            )
            .unwrap(),
            [(8, 12_000_000), (0, 72_000_000)]
        );
        let bad = [ints(&[8]), ints(&[8, -1]), ints(&[1, 2, 3]), Value::Nil];
        each_refused(bad, |reply| read_settled(&GCRA_SETTLE, reply, 1));
    }

    #[test]
    fn decodes_a_release_reply_and_refuses_anything_else() {
        assert_eq!(
            read_counts(&RELEASE, ints(&[2, 0, 1]), 3).unwrap(),
            [2, 0, 1]
        );
        let bad = [ints(&[1]), ints(&[1, -1]), ints(&[1, 2, 3]), Value::Nil];
        each_refused(bad, |reply| read_counts(&RELEASE, reply, 2));
    }

    #[test]
    fn decodes_a_reservation_and_refuses_anything_else() {
        let mut out = [Decision::default(); 2];
        let reply = ints(&[
            1,
            0,
            0,
            300,
            1_300, // charged: TAT 1300 at now 1000
            1,
            5,
            0,
            0,
            0, // a peek
            1,
            200,
            2,
            9_007_199_254_740_992,
            1_000, // most: 2^53, as sent
        ]);
        let (joint, now) =
            read_reservation(&RESERVE, reply, u64::MAX, &mut out)
                .expect("a reservation");
        assert_eq!(now, 1_000);
        assert_eq!(
            joint,
            JointReservation {
                reserved: true,
                wait_us: 200,
                by: Some(1),
                most_us: u64::MAX, // the caller's, not the capped one sent
            }
        );
        assert_eq!(
            out[0].store,
            Some(StoreTat {
                tat_us: 1_300,
                ttl_ms: 1
            })
        );
        assert_eq!((out[1].remaining, out[1].store), (5, None));
        // A quota's wait is less than the caller's: the script's.
        let reply = ints(&[1, 0, 0, 0, 0, 0, 9, 0, 400, 1]);
        let mut one = [Decision::default()];
        let (joint, _) =
            read_reservation(&RESERVE, reply, 500, &mut one).expect("read");
        assert_eq!(
            (joint.reserved, joint.by, joint.most_us),
            (false, None, 400)
        );

        let bad = [
            ints(&[1, 0, 0, 0, 0]),
            ints(&[1, 0, 0, 0, 0, 2, 0, 0, 0, 1]),
            ints(&[2, 0, 0, 0, 0, 1, 0, 0, 0, 1]),
            ints(&[1, 0, 0, 0, 0, 1, 0, 2, 0, 1]),
            ints(&[1, 0, 0, 0, -1, 1, 0, 0, 0, 1]),
            Value::Nil,
        ];
        each_refused(bad, |reply| {
            read_reservation(&RESERVE, reply, 0, &mut [Decision::default()])
        });
    }
}
