//! Which bans a limiter takes (`RateTierBuilder::ban`): a ban that cannot
//! be kept is `ConfigError::InvalidBan` when the limiter is built, and a
//! ban at each of the bounds is taken.
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Duration;

use tower_rate_tier::{Ban, ConfigError, Quota, RateTier};

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);
/// The most refusals a window counts (gcra-core's `MAX_WINDOW_LIMIT`).
const MOST_REFUSALS: u32 = 1024;

fn build(ban: Ban) -> Result<RateTier, ConfigError> {
    RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .ban(ban)
        .try_build()
}

#[test]
fn a_ban_that_cannot_be_kept_is_refused_when_the_limiter_is_built() {
    let fine = Ban::after(3, MINUTE).lasting(MINUTE).up_to(DAY);
    // Each breaks one rule only.
    for (why, ban) in [
        ("no refusal", Ban::after(0, MINUTE).lasting(MINUTE)),
        (
            "more refusals than a window counts",
            Ban::after(MOST_REFUSALS + 1, MINUTE),
        ),
        (
            "no time to count refusals in",
            Ban::after(3, Duration::ZERO),
        ),
        ("a first ban of no time", fine.lasting(Duration::ZERO)),
        (
            "a first ban beyond the longest",
            fine.lasting(2 * MINUTE).up_to(MINUTE),
        ),
        (
            "a longest ban beyond a day",
            fine.up_to(DAY + Duration::from_secs(1)),
        ),
        (
            "refusals counted over centuries",
            Ban::after(3, 100_000 * 365 * DAY),
        ),
    ] {
        match build(ban) {
            Err(ConfigError::InvalidBan(shown)) => {
                assert!(shown.contains("Ban"), "{why}: {shown}");
            }
            Err(other) => panic!("{why}: {other}"),
            Ok(_) => panic!("{why}: taken"),
        }
    }
}

#[test]
fn a_ban_at_each_bound_is_taken() {
    for (why, ban) in [
        ("one refusal", Ban::after(1, MINUTE)),
        (
            "as many refusals as a window counts",
            Ban::after(MOST_REFUSALS, MINUTE),
        ),
        (
            "a first ban as long as the longest",
            Ban::after(3, MINUTE).lasting(DAY).up_to(DAY),
        ),
        (
            "the shortest first ban",
            Ban::after(3, MINUTE).lasting(Duration::from_micros(1)),
        ),
    ] {
        assert!(build(ban).is_ok(), "{why}");
    }
}
