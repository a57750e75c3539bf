//! The GCRA rate-limit decision, as pure arithmetic over integer microseconds.
//!
//! `#![no_std]`, no dependencies, no allocation, no `unsafe`: this crate is the
//! math every store of `tower-rate-tier` (memory, Redis's Lua script, the
//! fallback) applies atomically around one number per bucket (or, for the
//! [other kinds of limit](#other-kinds-of-limit), one small record or list).
//! It can also be used alone, in custom code or on a microcontroller.
//!
//! # GCRA in three numbers
//!
//! The Generic Cell Rate Algorithm keeps, per bucket, a single timestamp: the
//! **TAT** (theoretical arrival time), the instant at which the bucket would be
//! full again. A [`Quota`] of `L` requests per period `P` with a burst `B`
//! (by default `B = L`) gives:
//!
//! - the **emission interval** `T = P / L` (in whole microseconds, rounded
//!   up: never faster than the tier): how far one request of cost 1 moves
//!   the TAT into the future;
//! - the **burst offset** `tau = T * B`: how far ahead of now the TAT may run.
//!
//! A request of cost `c` at `now` moves the TAT to `max(TAT, now) + T * c`,
//! and is allowed if the new TAT is at most `tau` ahead of `now`. Otherwise it
//! is refused, and the answer says exactly when it would pass.
//!
//! With 10 requests per minute, `T` is 6 s and `tau` is 60 s. Ten requests at
//! once move the TAT from 0 s to 60 s; the eleventh would move it to 66 s, 6 s
//! too far, so it must wait 6 s:
//!
//! ```
//! use gcra_core::Quota;
//!
//! const SECOND: u64 = 1_000_000; // times are microseconds
//! let quota = Quota::per_minute(10);
//! assert_eq!(quota.emission_interval_us(), 6 * SECOND);
//! assert_eq!(quota.burst_offset_us(), 60 * SECOND);
//!
//! // The store's job: keep the TAT a decision returns, hand it back next time.
//! let mut tat = None;
//! for expected_remaining in (0..10).rev() {
//!     let decision = quota.check(tat, 0, 1)?;
//!     assert!(decision.allowed);
//!     assert_eq!(decision.remaining, expected_remaining);
//!     tat = decision.store.map(|s| s.tat_us);
//! }
//! assert_eq!(tat, Some(60 * SECOND));
//!
//! let eleventh = quota.check(tat, 0, 1)?;
//! assert!(!eleventh.allowed);
//! assert_eq!(eleventh.retry_after_us, 6 * SECOND);
//! assert_eq!(eleventh.store, None); // a refusal changes nothing
//! # Ok::<(), gcra_core::CheckError>(())
//! ```
//!
//! The quota then comes back at the tier's pace, not all at once. At 6 s one
//! request fits (the TAT goes to 66 s). At 36 s the TAT is only 30 s ahead:
//! 30 s free at 6 s per request is 5 requests, and the sixth waits 6 s:
//!
//! ```
//! # use gcra_core::Quota;
//! # const SECOND: u64 = 1_000_000;
//! let quota = Quota::per_minute(10);
//! let at_6s = quota.check(Some(60 * SECOND), 6 * SECOND, 1)?;
//! assert!(at_6s.allowed);
//! assert_eq!(at_6s.remaining, 0);
//!
//! let mut tat = at_6s.store.map(|s| s.tat_us);
//! assert_eq!(tat, Some(66 * SECOND));
//! for expected_remaining in [4, 3, 2, 1, 0] {
//!     let decision = quota.check(tat, 36 * SECOND, 1)?;
//!     assert!(decision.allowed);
//!     assert_eq!(decision.remaining, expected_remaining);
//!     tat = decision.store.map(|s| s.tat_us);
//! }
//! let sixth = quota.check(tat, 36 * SECOND, 1)?;
//! assert!(!sixth.allowed);
//! assert_eq!(sixth.retry_after_us, 6 * SECOND);
//! # Ok::<(), gcra_core::CheckError>(())
//! ```
//!
//! # The rules, exactly
//!
//! [`Quota::check`] implements these steps, which every store of the crate
//! family (including the Redis Lua script) follows to the microsecond:
//!
//! 1. `tat` = the stored TAT; if there is none, or it is above
//!    [`MAX_TIME_US`] (a corrupted value), or it is before `now`: `tat = now`.
//!    If `tat > now + tau + max_debt` the clock went backwards:
//!    `tat = now + tau + max_debt` (the [ceiling](Quota::ceiling_us);
//!    `max_debt` is [`DEFAULT_MAX_DEBT`], an hour, or `tau` if longer,
//!    unless the quota says otherwise: [`Quota::allow_debt`]), and that
//!    capped value is stored even on a refusal, so the user is not locked
//!    out for longer than the ceiling. (A TAT between `tau` and the ceiling
//!    ahead is a debt left by [`Quota::settle`] or a slot reserved by
//!    [`Quota::reserve`]; the cap must not erase it, whatever the instance
//!    that reads it waits for.)
//! 2. `new_tat = tat + T * cost`; `allow_at = new_tat - tau`.
//! 3. If `allow_at > now`: refused, `retry_after = allow_at - now`,
//!    `reset_after = tat - now`, remaining 0.
//! 4. Else allowed: store `new_tat` for `ceil((new_tat - now) / 1000)` ms,
//!    `remaining = floor((tau - (new_tat - now)) / T)`,
//!    `reset_after = new_tat - now`.
//! 5. A cost with `T * cost > tau` can never pass, whatever the wait: it is
//!    [`CheckError::CostExceedsBurst`], decided before any state is read.
//!
//! No arithmetic here can overflow or panic: every time value is kept within
//! [`MAX_TIME_US`] (2^53, the range in which Lua numbers are exact integers)
//! and anything outside it is a typed error. A quota's burst window is at
//! most [`MAX_WINDOW_US`], and so is its largest debt, so that the ceiling
//! `now + tau + max_debt` fits beside any real clock.
//!
//! # Beyond one request, one bucket
//!
//! - [`Quota::peek`]: a bucket read without a charge (a cost of 0).
//! - [`Quota::settle`]: a charge adjusted after the request was served (a
//!   debt to wait for, or a refund).
//! - [`check_all`]: several limits (a tier, an endpoint, an IP) decided as
//!   one, all or nothing, with shadow limits that report without refusing.
//! - [`Quota::reserve`]: waiting instead of refusing (shaping): the next
//!   slot a request may go at, if its wait is short enough, and
//!   [`Quota::cancel`] to give it back when its caller went away;
//!   [`reserve_all`] for several limits as one slot.
//!
//! # Other kinds of limit
//!
//! Beside the GCRA rate, three kinds of limit, each pure and allocation-free
//! in the same way, with its rules in its docs:
//!
//! - [`Window`]: an exact sliding window log, at most `N` requests in any
//!   window of `W` µs. Its state is the log of the counted requests'
//!   timestamps (at most [`MAX_WINDOW_LIMIT`] of them), read as a slice.
//! - [`Period`]: at most `N` requests per calendar day, ISO week or month,
//!   in UTC or at a fixed offset from it, reset at the period's first
//!   instant. Its state is the period's start and its count.
//! - [`Concurrency`]: at most `N` requests in flight, counted or held as
//!   [`Lease`]s that expire.
//!
//! Each one answers like [`Quota::check`]: `allowed`, `remaining`,
//! `retry_after_us`, `reset_after_us` (none for concurrency), and
//! `write`, what the store must write, `None` for nothing. A cost above the
//! limit is [`CheckError::CostExceedsBurst`]; unlike [`Quota::check`], a
//! cost of 0 is a peek (the answer of [`Quota::peek`]), as in a
//! [`Charge`].
//!
//! ```
//! use std::time::Duration;
//! use gcra_core::{Concurrency, Period, PeriodUnit, Window};
//!
//! let window = Window::new(5, Duration::from_secs(1))?;
//! assert_eq!(window.check(&[], 0, 1)?.remaining, 4);
//! let daily = Period::new(1000, PeriodUnit::Day, 0)?;
//! assert_eq!(daily.check(None, 0, 1)?.reset_after_us, 86_400_000_000);
//! let in_flight = Concurrency::new(10)?;
//! assert_eq!(in_flight.acquire(9, 1)?.write, Some(10));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Several kinds in one decision
//!
//! [`check_all`] decides GCRA buckets; limits of several kinds are decided
//! as one, all or nothing, by the store, which reads every key in the same
//! atomic step and then:
//!
//! 1. decides each limit on its own (its `check` or `acquire`);
//! 2. takes the verdict with [`Verdict::of`] over the answers, each as a
//!    [`Decision`] (`as_decision()` on the new kinds), with each limit's
//!    shadow flag;
//! 3. if the verdict allows, applies every limit's `write` (a shadow limit
//!    that refused has none to charge);
//! 4. if it refuses, applies no write of a limit that passed: a pass's
//!    write is always its charge. A refusal's write is never a charge,
//!    only a repair (a GCRA TAT capped after the clock went back, a window's
//!    entries re-stamped): applying it is right, skipping it only delays it
//!    to the next decision. A limit that passed reports the key as it
//!    stands with a peek (cost 0).
//!
//! A [`Concurrency`] slot acquired by a decision that passed must be
//! released when the request ends; one that was not acquired, not.
#![no_std]
#![forbid(unsafe_code)]
#![warn(clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::panic)]

mod concurrency;
mod decision;
mod joint;
mod period;
mod quota;
mod reserve;
mod window;

pub use concurrency::{
    Concurrency, ConcurrencyDecision, ConcurrencyError, Lease, RETRY_HINT_US,
};
pub use decision::{Adjust, CheckError, Decision, Settled, StoreTat, Write};
pub use joint::{Charge, JointError, Verdict, check_all};
pub use period::{
    MAX_OFFSET_S, Period, PeriodDecision, PeriodError, PeriodUnit, PeriodWrite,
};
pub use quota::{DEFAULT_MAX_DEBT, Quota, QuotaError};
pub use reserve::{JointReservation, Reservation, Reserve, reserve_all};
pub use window::{
    LogWrite, MAX_WINDOW_LIMIT, Window, WindowDecision, WindowError,
};

/// The largest time value, in microseconds, this crate accepts or produces:
/// 2^53, the range in which a Lua (and JSON) number is an exact integer.
///
/// It is about 285 years after the Unix epoch, so a clock in microseconds
/// since 1970 stays inside it until the year 2255.
///
/// ```
/// assert_eq!(gcra_core::MAX_TIME_US, 9_007_199_254_740_992);
/// ```
pub const MAX_TIME_US: u64 = 1 << 53;

/// `duration` in whole microseconds, saturating at `u64::MAX`: a wait or a
/// lease longer than about 584,000 years is as good as forever, and every
/// quota and time of this crate is far below it.
///
/// ```
/// use core::time::Duration;
/// assert_eq!(gcra_core::saturating_micros(Duration::from_millis(1500)), 1_500_000);
/// assert_eq!(gcra_core::saturating_micros(Duration::from_nanos(1999)), 1);
/// assert_eq!(gcra_core::saturating_micros(Duration::MAX), u64::MAX);
/// ```
#[must_use]
pub const fn saturating_micros(duration: core::time::Duration) -> u64 {
    let micros = duration.as_micros();
    if micros > u64::MAX as u128 {
        u64::MAX
    } else {
        // Checked just above: it fits.
        micros as u64
    }
}

/// The longest burst window (`tau = T * burst`) a [`Quota`] may have, in
/// microseconds: 2^50, about 35.7 years.
///
/// It also bounds the debt a settlement may leave ([`Quota::allow_debt`]). A
/// bucket's TAT runs at most `tau + max_debt <= 2^51` ahead of now (a debt,
/// see [`Quota::settle`]), so with this bound every clock before the year 2184
/// keeps each TAT within [`MAX_TIME_US`]. A longer window (one request a
/// day with a burst of 100 000: 274 years) could never be checked and is
/// refused when the quota is built.
///
/// ```
/// assert_eq!(gcra_core::MAX_WINDOW_US, 1_125_899_906_842_624);
/// ```
pub const MAX_WINDOW_US: u64 = 1 << 50;

// The README's examples, run as doctests so that they never drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
