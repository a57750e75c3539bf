// Ventana fija frente a GCRA, con el mismo límite: 10 por minuto.
// Llegan 10 peticiones en el segundo 59 y otras 10 en el 60.
use std::time::Duration;

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier};

#[tokio::main]
async fn main() {
    let arrivals = [(59, 10), (60, 10)];

    // Ventana fija: un contador por minuto que vuelve a 0 al cambiar.
    let (mut minute, mut used, mut fixed) = (0, 0, 0);
    for (t, count) in arrivals {
        if t / 60 != minute {
            (minute, used) = (t / 60, 0);
        }
        let ok = count.min(10 - used);
        used += ok;
        fixed += ok;
    }

    // GCRA, con tower-rate-tier y un reloj falso.
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .build();
    let (mut now, mut gcra) = (0, 0);
    for (t, count) in arrivals {
        clock.advance(Duration::from_secs(t - now));
        now = t;
        for _ in 0..count {
            if limiter.check("ana", "free", 1).await.unwrap().is_ok() {
                gcra += 1;
            }
        }
    }

    println!("fixed window: {fixed} of 20 allowed in 2 seconds");
    println!("GCRA:         {gcra} of 20 allowed in 2 seconds");
}
