// GCRA paso a paso: 10 peticiones por minuto, con un reloj falso.
use std::time::Duration;

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier};

#[tokio::main]
async fn main() {
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .build();

    // (segundos que espera, peticiones que lanza después)
    let mut t = 0;
    for (wait, count) in [(0, 11), (6, 2), (30, 6)] {
        clock.advance(Duration::from_secs(wait));
        t += wait;
        for _ in 0..count {
            match limiter.check("ana", "free", 1).await.unwrap() {
                Ok(info) => {
                    let left = info.remaining;
                    println!("t={t:>2}s  200  remaining {left}")
                }
                Err(limited) => {
                    let wait = limited.retry_after_secs();
                    println!("t={t:>2}s  429  retry after {wait} s")
                }
            }
        }
    }
}
