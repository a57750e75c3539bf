//! The post's GCRA steps (`gcra_steps.rs`) without async: a `SyncTier`
//! over the memory store, in a plain `fn main`. It prints the same lines.
use std::time::Duration;

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .build();
    let free = limiter.sync_tier("free")?;

    // (seconds waited, requests sent after)
    let mut t = 0;
    for (wait, count) in [(0, 11), (6, 2), (30, 6)] {
        clock.advance(Duration::from_secs(wait));
        t += wait;
        for _ in 0..count {
            let answer = free.check("ana", 1)?;
            if answer.allowed {
                let left = answer.remaining;
                println!("t={t:>2}s  200  remaining {left}");
            } else {
                let wait = answer.retry_after_secs();
                println!("t={t:>2}s  429  retry after {wait} s");
            }
        }
    }
    Ok(())
}
