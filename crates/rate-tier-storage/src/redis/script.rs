//! The Lua scripts and their arguments (their replies are read in
//! `reply.rs`): one place for what a single Redis and a Redis Cluster send
//! alike.
//!
//! | script | for | `KEYS` | `ARGV` per key | reply per key |
//! |---|---|---|---|---|
//! | `gcra.lua` | one enforced bucket, cost >= 1 | 1 | `T`, `tau`, cost, and the max debt unless it is `tau` | allowed, remaining, retry_after_us, reset_after_us |
//! | `gcra_all.lua` | any other decision of rates only (several buckets, a peek, a shadow limit) | n | `T`, `tau`, cost, shadow, max debt | the same |
//! | `decide_mixed.lua` | a decision with a window, a period or a concurrency limit (rates beside them included) | n | tag (0 rate, 1 window, 2 period, 3 concurrency), a, b, c, cost, shadow (see its header) | the same |
//! | `gcra_settle.lua` | settlements | n | `T`, `tau`, units (+ debt, - refund), max debt | remaining, reset_after_us |
//! | `release.lua` | the slots a request took, given back (several keys, or more than [`ZREM_MEMBERS`] slots; else a plain `ZREM`, [`zrem`]) | n | slot id, cost | slots released |
//! | `renew.lua` | the slots a request holds, renewed | n | slot id, cost, lease (µs) | slots renewed |
//! | `reserve.lua` | a reservation of rates ([`gcra_core::reserve_all`]) | n | `gcra_all.lua`'s five, then the max wait once | its four, then the TAT written; then reserved, wait, by, most, now |
//! | `cancel.lua` | reservations given back ([`gcra_core::Quota::cancel`]) | n | `T`, cost, the TAT reserved | 0 kept, 1 moved back, 2 cleared |

use std::sync::LazyLock;

use std::time::Duration;

use ::redis::{Cmd, Script, Value};
use gcra_core::{Adjust, Charge, Lease, MAX_TIME_US, Quota};
use smallvec::SmallVec;

use super::backend;
use crate::bucket::script_args;
use crate::rule::{Rule, ScriptArg, script_rule};
use crate::storage::StorageError;

/// The source of `gcra.lua`.
pub(super) const GCRA_SOURCE: &str = include_str!("gcra.lua");
/// The source of `gcra_all.lua`.
pub(super) const GCRA_ALL_SOURCE: &str = include_str!("gcra_all.lua");
/// The source of `gcra_settle.lua`.
pub(super) const GCRA_SETTLE_SOURCE: &str = include_str!("gcra_settle.lua");
/// The source of `decide_mixed.lua`.
pub(super) const DECIDE_MIXED_SOURCE: &str = include_str!("decide_mixed.lua");
/// The source of `release.lua`.
pub(super) const RELEASE_SOURCE: &str = include_str!("release.lua");
/// The source of `renew.lua`.
pub(super) const RENEW_SOURCE: &str = include_str!("renew.lua");

/// The source of `reserve.lua`.
pub(super) const RESERVE_SOURCE: &str = include_str!("reserve.lua");
/// The source of `cancel.lua`.
pub(super) const CANCEL_SOURCE: &str = include_str!("cancel.lua");

/// A script and its hash, built once per process.
pub(super) struct Lua {
    pub(super) script: LazyLock<Script>,
    pub(super) source: &'static str,
    pub(super) name: &'static str,
}

pub(super) static GCRA: Lua = Lua {
    script: LazyLock::new(|| Script::new(GCRA_SOURCE)),
    source: GCRA_SOURCE,
    name: "gcra.lua",
};
pub(super) static GCRA_ALL: Lua = Lua {
    script: LazyLock::new(|| Script::new(GCRA_ALL_SOURCE)),
    source: GCRA_ALL_SOURCE,
    name: "gcra_all.lua",
};
pub(super) static GCRA_SETTLE: Lua = Lua {
    script: LazyLock::new(|| Script::new(GCRA_SETTLE_SOURCE)),
    source: GCRA_SETTLE_SOURCE,
    name: "gcra_settle.lua",
};
pub(super) static DECIDE_MIXED: Lua = Lua {
    script: LazyLock::new(|| Script::new(DECIDE_MIXED_SOURCE)),
    source: DECIDE_MIXED_SOURCE,
    name: "decide_mixed.lua",
};
pub(super) static RELEASE: Lua = Lua {
    script: LazyLock::new(|| Script::new(RELEASE_SOURCE)),
    source: RELEASE_SOURCE,
    name: "release.lua",
};
pub(super) static RENEW: Lua = Lua {
    script: LazyLock::new(|| Script::new(RENEW_SOURCE)),
    source: RENEW_SOURCE,
    name: "renew.lua",
};

pub(super) static RESERVE: Lua = Lua {
    script: LazyLock::new(|| Script::new(RESERVE_SOURCE)),
    source: RESERVE_SOURCE,
    name: "reserve.lua",
};
pub(super) static CANCEL: Lua = Lua {
    script: LazyLock::new(|| Script::new(CANCEL_SOURCE)),
    source: CANCEL_SOURCE,
    name: "cancel.lua",
};

/// How long a decision's task waits for an answer its caller may have given
/// up on: long enough for a slow Redis, short enough that a silent one does
/// not pile up tasks (a fallback's breaker stops the calls after a few
/// failures).
pub(super) const LATE_ANSWER: Duration = Duration::from_secs(1);

/// Runs a call within `bound`, its errors as the store's.
pub(super) async fn within(
    bound: Duration,
    call: impl Future<Output = Result<Value, ::redis::RedisError>>,
) -> Result<Value, StorageError> {
    match tokio::time::timeout(bound, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) if error.is_timeout() => {
            Err(StorageError::Timeout(bound))
        }
        Ok(Err(error)) => Err(backend(error)),
        Err(_) => Err(StorageError::Timeout(bound)),
    }
}

/// One script call: which script, its keys and its arguments (integers,
/// sent in their canonical decimal form: an `i128` holds both a negative
/// refund and a slot id up to 2^64 - 1).
pub(super) struct Call<'k> {
    pub(super) lua: &'static Lua,
    pub(super) keys: SmallVec<[&'k str; 4]>,
    pub(super) args: Vec<i128>,
}

impl<'k> Call<'k> {
    /// The decision over the buckets `keys` under `charges`: `gcra.lua` for
    /// the common case of one enforced charge, `gcra_all.lua` otherwise.
    pub(super) fn check(
        keys: impl IntoIterator<Item = &'k str>,
        charges: &[Charge],
    ) -> Call<'k> {
        let keys = keys.into_iter().collect();
        match charges {
            [one] if one.cost > 0 && !one.shadow => {
                let [t, tau, cost, _, debt] = script_args(one);
                let mut args = vec![t.into(), tau.into(), cost.into()];
                // The common case sends the three arguments SPEC names: the
                // script's default debt is gcra-core's.
                let default =
                    gcra_core::saturating_micros(gcra_core::DEFAULT_MAX_DEBT);
                if debt != tau.max(default) {
                    args.push(debt.into());
                }
                Call {
                    lua: &GCRA,
                    keys,
                    args,
                }
            }
            _ => Call {
                lua: &GCRA_ALL,
                keys,
                args: charges
                    .iter()
                    .flat_map(|c| script_args(c).map(i128::from))
                    .collect(),
            },
        }
    }

    /// The decision over the buckets `keys` under `charges` (their costs
    /// and shadow flags) and `rules` (what each enforces), with at least
    /// one window, period or concurrency limit among them:
    /// `decide_mixed.lua`, 6 arguments per key (tag, a, b, c, cost, shadow;
    /// see the script's header). A rate there takes gcra_all.lua's `T`,
    /// `tau` and max debt; a concurrency limit its limit, the store's
    /// `lease` and its slot id (`ids`, by position).
    pub(super) fn mixed(
        keys: impl IntoIterator<Item = &'k str>,
        charges: &[Charge],
        rules: &[Rule],
        ids: &[u64],
        lease: Lease,
    ) -> Call<'k> {
        let args = charges
            .iter()
            .zip(rules)
            .zip(ids.iter().copied().chain(std::iter::repeat(0)))
            .flat_map(|((charge, rule), id)| {
                let [tag, a, b, c] = script_rule(rule, charge.quota, lease, id)
                    .map(|arg| match arg {
                        ScriptArg::Number(n) => n,
                        ScriptArg::SlotId(id) => i128::from(id),
                    });
                [tag, a, b, c, charge.cost.into(), i128::from(charge.shadow)]
            })
            .collect();
        Call {
            lua: &DECIDE_MIXED,
            keys: keys.into_iter().collect(),
            args,
        }
    }

    /// The settlement of the buckets `keys`, each under its quota.
    pub(super) fn settle(
        keys: impl IntoIterator<Item = &'k str>,
        adjusts: &[(Quota, Adjust)],
    ) -> Call<'k> {
        Call {
            lua: &GCRA_SETTLE,
            keys: keys.into_iter().collect(),
            args: adjusts
                .iter()
                .flat_map(|&(quota, adjust)| {
                    let units = match adjust {
                        Adjust::Charge(units) => i128::from(units),
                        Adjust::Refund(units) => -i128::from(units),
                    };
                    [
                        quota.emission_interval_us().into(),
                        quota.burst_offset_us().into(),
                        units,
                        quota.max_debt_us().into(),
                    ]
                })
                .collect(),
        }
    }

    /// The release of the slots `(id, cost)` of the keys `keys`, by
    /// position: `release.lua`.
    pub(super) fn release(
        keys: impl IntoIterator<Item = &'k str>,
        slots: &[(u64, u32)],
    ) -> Call<'k> {
        Call {
            lua: &RELEASE,
            keys: keys.into_iter().collect(),
            args: slots
                .iter()
                .flat_map(|&(id, cost)| [id.into(), cost.into()])
                .collect(),
        }
    }

    /// The renewal of the slots `(id, cost)` of the keys `keys`, by
    /// position, for `lease` from now: `renew.lua`.
    pub(super) fn renew(
        keys: impl IntoIterator<Item = &'k str>,
        slots: &[(u64, u32)],
        lease: Lease,
    ) -> Call<'k> {
        Call {
            lua: &RENEW,
            keys: keys.into_iter().collect(),
            args: slots
                .iter()
                .flat_map(|&(id, cost)| {
                    [id.into(), cost.into(), lease.lease_us().into()]
                })
                .collect(),
        }
    }

    /// The reservation of the buckets `keys` under `charges` for at most
    /// `max_wait_us`: `reserve.lua`, `gcra_all.lua`'s five arguments per
    /// key and the wait last (capped at [`MAX_TIME_US`], past which no wait
    /// can come: every wait is from a TAT within it).
    pub(super) fn reserve(
        keys: impl IntoIterator<Item = &'k str>,
        charges: &[Charge],
        max_wait_us: u64,
    ) -> Call<'k> {
        let mut args: Vec<i128> = charges
            .iter()
            .flat_map(|c| script_args(c).map(i128::from))
            .collect();
        args.push(max_wait_us.min(MAX_TIME_US).into());
        Call {
            lua: &RESERVE,
            keys: keys.into_iter().collect(),
            args,
        }
    }

    /// The reservations `(T, cost, TAT reserved)` of the keys `keys` given
    /// back, by position: `cancel.lua`.
    pub(super) fn cancel(
        keys: impl IntoIterator<Item = &'k str>,
        reserved: &[(u64, u32, u64)],
    ) -> Call<'k> {
        Call {
            lua: &CANCEL,
            keys: keys.into_iter().collect(),
            args: reserved
                .iter()
                .flat_map(|&(t, cost, tat)| [t.into(), cost.into(), tat.into()])
                .collect(),
        }
    }

    /// `EVALSHA` (or `EVAL` with `source`) of this call, as a command.
    pub(super) fn command(&self, verb: &str) -> Cmd {
        let mut cmd = ::redis::cmd(verb);
        match verb {
            "EVAL" => cmd.arg(self.lua.source),
            _ => cmd.arg(self.lua.script.get_hash()),
        };
        cmd.arg(self.keys.len())
            .arg(self.keys.as_slice())
            .arg(&self.args);
        cmd
    }

    /// The invocation redis-rs runs (`EVALSHA`, and on `NOSCRIPT` a
    /// `SCRIPT LOAD` and the `EVALSHA` again).
    pub(super) fn invocation(&self) -> ::redis::ScriptInvocation<'static> {
        let mut invocation = self.lua.script.prepare_invoke();
        for key in &self.keys {
            invocation.key(*key);
        }
        for arg in &self.args {
            invocation.arg(arg);
        }
        invocation
    }
}

/// The most slots a release of one key names in a plain `ZREM` instead of
/// `release.lua`. The common release (one concurrency limit, one slot)
/// then runs no script: about a third less of a loopback round trip than
/// the script's (`redis-benchmark -c 1`: 24k `ZREM`s a second, 15k calls
/// of `release.lua`). The script stays for more, batching inside Redis.
pub(super) const ZREM_MEMBERS: u32 = 64;

/// The release of `key`'s slots taken under `(id, cost)` as one plain
/// `ZREM key <id>:1 .. <id>:<cost>`, the members `decide_mixed.lua` adds;
/// `None` past [`ZREM_MEMBERS`]. What it leaves to the next take, which
/// drops them, `release.lua` drops too: the key's expired slots.
pub(super) fn zrem(key: &str, (id, cost): (u64, u32)) -> Option<Cmd> {
    if cost > ZREM_MEMBERS {
        return None;
    }
    let mut cmd = ::redis::cmd("ZREM");
    cmd.arg(key);
    for k in 1..=cost {
        cmd.arg(format!("{id}:{k}"));
    }
    Some(cmd)
}

/// Runs a [`zrem`] of `key`'s slots `taken` within `bound`: the slots
/// released; `None` when the release is `release.lua`'s (too many).
pub(super) async fn release_by_zrem(
    conn: &mut (impl ::redis::aio::ConnectionLike + Send),
    key: &str,
    taken: (u64, u32),
    bound: Duration,
) -> Option<Result<u64, StorageError>> {
    let cmd = zrem(key, taken)?;
    let reply = tokio::time::timeout(bound, cmd.query_async::<Value>(conn));
    Some(match reply.await {
        Ok(Ok(Value::Int(released))) => u64::try_from(released).map_err(|_| {
            StorageError::Protocol(format!("ZREM answered {released}"))
        }),
        Ok(Ok(other)) => Err(StorageError::Protocol(format!(
            "ZREM answered {other:?}, not an integer"
        ))),
        // A key of another type holds none of them: 0, as release.lua.
        Ok(Err(error)) if error.code() == Some("WRONGTYPE") => Ok(0),
        Ok(Err(error)) if error.is_timeout() => {
            Err(StorageError::Timeout(bound))
        }
        Ok(Err(error)) => Err(backend(error)),
        Err(_) => Err(StorageError::Timeout(bound)),
    })
}

#[cfg(test)]
mod tests {
    use gcra_core::PeriodUnit;

    use super::*;
    use sha1::{Digest, Sha1};

    #[test]
    fn a_call_sends_each_bucket_as_the_scripts_read_it() {
        use crate::bucket::{BucketCheck, LimitName};
        use crate::key::KeyLayout;

        let plan = LimitName::new("free").unwrap();
        let search = LimitName::new("search").unwrap();
        let ten = Quota::per_minute(10);
        let three = Quota::per_minute(3);
        let one = BucketCheck::new(&plan, "ana", ten, 2).unwrap();
        let other = BucketCheck::new(&search, "ana", three, 1).unwrap();
        let check = |checks: &[BucketCheck<'_>], layout| {
            let keys: Vec<String> =
                checks.iter().map(|c| c.key(layout)).collect();
            let charges: Vec<Charge> =
                checks.iter().map(BucketCheck::charge).collect();
            let call = Call::check(keys.iter().map(String::as_str), &charges);
            let owned: Vec<String> =
                call.keys.iter().map(|k| k.to_string()).collect();
            (call.lua.name, owned, call.args)
        };

        // One enforced charge: gcra.lua, T, tau and the cost.
        let (lua, keys, args) = check(&[one], KeyLayout::Single);
        assert_eq!(lua, "gcra.lua");
        assert_eq!(keys, [one.key(KeyLayout::Single)]);
        assert_eq!(args, [6_000_000, 60_000_000, 2]);
        // A max debt of its own is the fourth.
        let debtor =
            BucketCheck::new(&plan, "ana", ten.unbounded_debt(), 2).unwrap();
        let (_, _, args) = check(&[debtor], KeyLayout::Single);
        assert_eq!(args, [6_000_000, 60_000_000, 2, 1_125_899_906_842_624]);

        // Anything else: gcra_all.lua, 5 per bucket (T, tau, cost, shadow,
        // max debt), in the order of the checks.
        let peek = BucketCheck::peek(&plan, "ana", ten);
        let hour = 3_600_000_000;
        for (checks, expected) in [
            (vec![peek], vec![6_000_000, 60_000_000, 0, 0, hour]),
            (
                vec![one.shadow(true)],
                vec![6_000_000, 60_000_000, 2, 1, hour],
            ),
            (
                vec![other, one],
                vec![
                    20_000_000, 60_000_000, 1, 0, hour, 6_000_000, 60_000_000,
                    2, 0, hour,
                ],
            ),
        ] {
            let (lua, keys, args) = check(&checks, KeyLayout::Cluster);
            assert_eq!(lua, "gcra_all.lua");
            let expected_keys: Vec<String> =
                checks.iter().map(|c| c.key(KeyLayout::Cluster)).collect();
            assert_eq!(keys, expected_keys);
            assert_eq!(args, expected);
            let from_checks: Vec<i128> = checks
                .iter()
                .flat_map(|c| c.script_args().map(i128::from))
                .collect();
            assert_eq!(args, from_checks);
        }

        // Settlements: T, tau, the units (negative for a refund), max debt.
        let keys = [one.key(KeyLayout::Cluster), other.key(KeyLayout::Cluster)];
        let call = Call::settle(
            keys.iter().map(String::as_str),
            &[(ten, Adjust::Refund(3)), (three, Adjust::Charge(u32::MAX))],
        );
        assert_eq!(call.lua.name, "gcra_settle.lua");
        assert_eq!(call.keys.as_slice(), [keys[0].as_str(), keys[1].as_str()]);
        assert_eq!(
            call.args,
            [
                6_000_000,
                60_000_000,
                -3,
                3_600_000_000,
                20_000_000,
                60_000_000,
                4_294_967_295,
                3_600_000_000
            ]
        );
    }

    #[test]
    fn a_few_slots_are_released_by_a_plain_zrem_of_their_members() {
        let packed = |cmd: Cmd| String::from_utf8(cmd.get_packed_command());
        let cmd = zrem("trt:limit/up:abc", (u64::MAX, 2)).unwrap();
        let sent = packed(cmd).unwrap();
        assert!(sent.contains("ZREM"), "{sent}");
        assert!(sent.contains("18446744073709551615:1"), "{sent}");
        assert!(sent.contains("18446744073709551615:2"), "{sent}");
        assert!(!sent.contains(":3"), "{sent}");
        assert!(zrem("k", (7, ZREM_MEMBERS)).is_some());
        assert!(zrem("k", (7, ZREM_MEMBERS + 1)).is_none());
    }

    #[test]
    fn a_mixed_call_sends_six_arguments_per_key() {
        use crate::bucket::{BucketCheck, LimitName};
        use gcra_core::{Period, Window};

        let (plan, login, exports) = (
            LimitName::new("free").unwrap(),
            LimitName::of_limit("login").unwrap(),
            LimitName::of_limit("exports").unwrap(),
        );
        let window =
            Window::new(5, std::time::Duration::from_secs(60)).unwrap();
        let period = Period::new(1000, PeriodUnit::Month, -3600).unwrap();
        let checks = [
            BucketCheck::new(&plan, "ana", Quota::per_minute(10), 2).unwrap(),
            BucketCheck::of_rule(&login, "ana", window.into(), 1)
                .unwrap()
                .shadow(true),
            BucketCheck::of_rule(&exports, "ana", period.into(), 0).unwrap(),
        ];
        let charges: Vec<Charge> =
            checks.iter().map(BucketCheck::charge).collect();
        let rules: Vec<Rule> = checks.iter().map(BucketCheck::rule).collect();
        let lease = Lease::new(std::time::Duration::from_secs(30)).unwrap();
        let call = Call::mixed(["a", "b", "c"], &charges, &rules, &[], lease);
        assert_eq!(call.lua.name, "decide_mixed.lua");
        assert_eq!(call.keys.as_slice(), ["a", "b", "c"]);
        assert_eq!(
            call.args,
            [
                0,
                6_000_000,
                60_000_000,
                3_600_000_000,
                2,
                0, // the rate
                1,
                5,
                60_000_000,
                0,
                1,
                1, // the window, in shadow
                2,
                1000,
                2,
                -3600,
                0,
                0, // the period, a peek
            ]
        );

        // A concurrency limit: its limit, the store's lease, its slot id.
        let uploads = LimitName::of_limit("uploads").unwrap();
        let slot = BucketCheck::of_rule(
            &uploads,
            "ana",
            gcra_core::Concurrency::new(2).unwrap().into(),
            1,
        )
        .unwrap()
        .lease_id(u64::MAX);
        let call = Call::mixed(
            ["a", "b"],
            &[checks[0].charge(), slot.charge()],
            &[checks[0].rule(), slot.rule()],
            &[0, slot.lease()],
            lease,
        );
        assert_eq!(
            call.args[6..],
            [3, 2, 30_000_000, i128::from(u64::MAX), 1, 0]
        );
        let keys = ["a", "b"];
        let release = Call::release(keys, &[(u64::MAX, 2), (7, 1)]);
        assert_eq!(release.lua.name, "release.lua");
        assert_eq!(release.args, [i128::from(u64::MAX), 2, 7, 1]);
        let renew = Call::renew(keys, &[(9, 1)], lease);
        assert_eq!(renew.lua.name, "renew.lua");
        assert_eq!(renew.args, [9, 1, 30_000_000]);
        // Sent as the canonical decimal forms the scripts read.
        let sent = release.command("EVALSHA").get_packed_command();
        assert!(
            String::from_utf8_lossy(&sent).contains("18446744073709551615"),
            "{}",
            String::from_utf8_lossy(&sent)
        );
    }

    #[test]
    fn a_reservation_sends_gcra_all_arguments_and_the_wait_capped() {
        let one = Quota::per_second(10).allow_burst(1);
        let charges = [Charge::new(one, 1), Charge::new(one, 0).shadow()];
        let call = Call::reserve(["a", "b"], &charges, u64::MAX);
        assert_eq!(call.lua.name, "reserve.lua");
        assert_eq!(
            call.args,
            [
                100_000,
                100_000,
                1,
                0,
                3_600_000_000,
                100_000,
                100_000,
                0,
                1,
                3_600_000_000,
                i128::from(MAX_TIME_US)
            ]
        );
        let cancel = Call::cancel(["a"], &[(100_000, 2, 9_000_000)]);
        assert_eq!(cancel.lua.name, "cancel.lua");
        assert_eq!(cancel.args, [100_000, 2, 9_000_000]);
    }

    #[test]
    fn each_script_is_its_file_and_its_hash_is_the_sha1_of_it() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/redis/");
        let all = [
            &GCRA,
            &GCRA_ALL,
            &GCRA_SETTLE,
            &DECIDE_MIXED,
            &RELEASE,
            &RENEW,
            &RESERVE,
            &CANCEL,
        ];
        for lua in all {
            let on_disk =
                std::fs::read_to_string(format!("{dir}{}", lua.name)).unwrap();
            assert_eq!(lua.source, on_disk, "{} is not the file", lua.name);
            let sha1 = hex::encode(Sha1::digest(on_disk.as_bytes()));
            assert_eq!(lua.script.get_hash(), sha1, "{}", lua.name);
        }
        let hashes = all.map(|lua| lua.script.get_hash().to_owned());
        for (i, hash) in hashes.iter().enumerate() {
            assert!(!hashes[..i].contains(hash), "two scripts, one hash");
        }
    }
}
