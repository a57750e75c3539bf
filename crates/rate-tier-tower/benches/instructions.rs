//! Instructions per check, counted by callgrind: figures that other load
//! on the machine does not move, beside the times of check.rs, limits.rs
//! and http.rs.
//!
//! `cargo bench -p tower-rate-tier --bench instructions` runs each case in
//! a child process under `valgrind --tool=callgrind`, counting only inside
//! the case's measured loop (`--toggle-collect`), twice (`n` and `2n`
//! checks: the difference is exactly `n` checks), and prints instructions
//! per check: ours against governor's keyed `check_key` on the same keys
//! in check.rs's loops, the memory store alone, three limits in one
//! decision (limits.rs), and a request to http.rs's apps called in process
//! (no layer, a layer that does nothing, ours, tower_governor's). `--out
//! FILE` writes them (`InstructionsResults`, JSON); `--case NAME [--n N]` runs one case without
//! valgrind (what the child does; also the way to profile one); `--time`
//! times ours against governor round by round in one process, a quick
//! look where check.rs is the reference.
//!
//! The loops are `#[inline(never)]` functions named `loop_*`.
// `&String` keys, as governor's are: the same value passed the same way.
#![allow(clippy::unwrap_used, clippy::ptr_arg, missing_docs)]

mod support;

use std::hint::black_box;
use std::process::Command;

use rate_tier_bench_results::InstructionsResults;
use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage};
use support::hot::{self, Governor, governor, ours, ready};
use support::{Args, apps, write_results};
use tower_rate_tier::sync::SyncTier;
use tower_rate_tier::{Quota, RateTier};

const KEYS: usize = 100_000;

/// Where a case's figure goes in the results.
type Field = fn(&mut InstructionsResults) -> &mut Option<f64>;

/// Each case: (name, what it is, its field of the results).
const CASES: [(&str, &str, Field); 12] = [
    ("ours_one_key", "RateTier::check, 1 hot key", |r| {
        &mut r.ours_one_key
    }),
    ("governor_one_key", "governor check_key, 1 hot key", |r| {
        &mut r.governor_one_key
    }),
    (
        "ours_100k_keys",
        "RateTier::check, 100k keys round-robin",
        |r| &mut r.ours_100k_keys,
    ),
    ("governor_100k_keys", "governor check_key, 100k keys", |r| {
        &mut r.governor_100k_keys
    }),
    ("sync_one_key", "SyncTier::check, 1 hot key", |r| {
        &mut r.sync_one_key
    }),
    (
        "sync_100k_keys",
        "SyncTier::check, 100k keys round-robin",
        |r| &mut r.sync_100k_keys,
    ),
    (
        "store_one_key",
        "MemoryStorage::check_sync alone, 1 hot key",
        |r| &mut r.store_one_key,
    ),
    (
        "ours_three_limits",
        "RateTier::decide, plan + 2 limits, 1 user",
        |r| &mut r.ours_three_limits,
    ),
    (
        "http_no_layer",
        "axum hello world in process, per request",
        |r| &mut r.http_no_layer,
    ),
    (
        "http_noop_layer",
        "the same with a layer that does nothing",
        |r| &mut r.http_noop_layer,
    ),
    ("http_ours", "the same with TierLimitLayer (memory)", |r| {
        &mut r.http_ours
    }),
    (
        "http_governor",
        "the same with tower_governor's layer",
        |r| &mut r.http_governor,
    ),
];

/// The HTTP cases' keys: http.rs's rotation of 1000 ids.
const HTTP_KEYS: usize = 1000;

fn user_ids() -> Vec<String> {
    hot::user_ids(KEYS)
}

#[inline(never)]
fn loop_ours_one_key(limiter: &RateTier, key: &String, n: usize) {
    for _ in 0..n {
        let _ = black_box(ready(limiter.check(black_box(key), "free", 1)));
    }
}

#[inline(never)]
fn loop_governor_one_key(gov: &Governor, key: &String, n: usize) {
    for _ in 0..n {
        black_box(gov.check_key(black_box(key)).is_ok());
    }
}

#[inline(never)]
fn loop_ours_keys(limiter: &RateTier, users: &[String], n: usize) {
    let mut i = 0;
    for _ in 0..n {
        i = (i + 1) % users.len();
        let _ = black_box(ready(limiter.check(&users[i], "free", 1)));
    }
}

#[inline(never)]
fn loop_sync_one_key(free: &SyncTier, key: &String, n: usize) {
    for _ in 0..n {
        let _ = black_box(free.check(black_box(key), 1));
    }
}

#[inline(never)]
fn loop_sync_keys(free: &SyncTier, users: &[String], n: usize) {
    let mut i = 0;
    for _ in 0..n {
        i = (i + 1) % users.len();
        let _ = black_box(free.check(&users[i], 1));
    }
}

#[inline(never)]
fn loop_three_limits(
    limiter: &RateTier,
    key: &String,
    route: &tower_rate_tier::Limit,
    tokens: &tower_rate_tier::Limit,
    n: usize,
) {
    for _ in 0..n {
        let request =
            tower_rate_tier::LimitRequest::new(black_box(key), "free", 1)
                .limit(route, 1)
                .limit(tokens, 1);
        let _ = black_box(ready(limiter.decide(&request)));
    }
}

#[inline(never)]
fn loop_governor_keys(gov: &Governor, users: &[String], n: usize) {
    let mut i = 0;
    for _ in 0..n {
        i = (i + 1) % users.len();
        black_box(gov.check_key(&users[i]).is_ok());
    }
}

#[inline(never)]
fn loop_store_one_key(
    store: &MemoryStorage,
    free: &LimitName,
    quota: Quota,
    key: &String,
    n: usize,
) {
    for _ in 0..n {
        let check = [BucketCheck::new(free, black_box(key), quota, 1).unwrap()];
        let mut out = [Decision::default()];
        store.check_sync(&check, &mut out).unwrap();
        black_box(out[0]);
    }
}

/// Runs `case`: a warm-up outside the measured loop (every bucket made,
/// every lazy initialization done), then `n` measured checks.
fn run(case: &str, n: usize) {
    match case {
        "ours_one_key" => {
            let limiter = ours();
            let key = "user-1".to_owned();
            for _ in 0..100 {
                ready(limiter.check(&key, "free", 1)).unwrap().unwrap();
            }
            loop_ours_one_key(&limiter, &key, n);
        }
        "governor_one_key" => {
            let gov = governor();
            let key = "user-1".to_owned();
            for _ in 0..100 {
                black_box(gov.check_key(&key).is_ok());
            }
            loop_governor_one_key(&gov, &key, n);
        }
        "ours_100k_keys" => {
            let limiter = ours();
            let users = user_ids();
            for user in &users {
                ready(limiter.check(user, "free", 1)).unwrap().unwrap();
            }
            loop_ours_keys(&limiter, &users, n);
        }
        "governor_100k_keys" => {
            let gov = governor();
            let users = user_ids();
            for user in &users {
                gov.check_key(user).unwrap();
            }
            loop_governor_keys(&gov, &users, n);
        }
        "sync_one_key" => {
            let limiter = ours();
            let free = limiter.sync_tier("free").unwrap();
            let key = "user-1".to_owned();
            for _ in 0..100 {
                assert!(free.check(&key, 1).unwrap().allowed);
            }
            loop_sync_one_key(&free, &key, n);
        }
        "sync_100k_keys" => {
            let limiter = ours();
            let free = limiter.sync_tier("free").unwrap();
            let users = user_ids();
            for user in &users {
                assert!(free.check(user, 1).unwrap().allowed);
            }
            loop_sync_keys(&free, &users, n);
        }
        "store_one_key" => {
            let store = MemoryStorage::new();
            let free = LimitName::new("free").unwrap();
            let quota = Quota::per_second(1_000_000);
            for _ in 0..100 {
                let check =
                    [BucketCheck::new(&free, "user-1", quota, 1).unwrap()];
                let mut out = [Decision::default()];
                store.check_sync(&check, &mut out).unwrap();
            }
            loop_store_one_key(&store, &free, quota, &"user-1".to_owned(), n);
        }
        // limits.rs's three limits in one decision, one hot user.
        "ours_three_limits" => {
            let limiter = ours();
            let key = "user-1".to_owned();
            let route = tower_rate_tier::Limit::new(
                "route",
                Quota::per_second(1_000_000).allow_burst(u32::MAX),
            );
            let tokens = tower_rate_tier::Limit::new(
                "tokens",
                Quota::per_second(1_000_000).allow_burst(u32::MAX),
            );
            for _ in 0..100 {
                let request =
                    tower_rate_tier::LimitRequest::new(&key, "free", 1)
                        .limit(&route, 1)
                        .limit(&tokens, 1);
                ready(limiter.decide(&request)).unwrap().unwrap();
            }
            loop_three_limits(&limiter, &key, &route, &tokens, n);
        }
        // For profiling (not counted by default): two threads, one key.
        "ours_two_threads" => {
            let limiter = ours();
            let key = "user-1".to_owned();
            std::thread::scope(|scope| {
                scope.spawn(|| loop_ours_one_key(&limiter, &key, n / 2));
                scope.spawn(|| loop_ours_one_key(&limiter, &key, n / 2));
            });
        }
        "governor_two_threads" => {
            let gov = governor();
            let key = "user-1".to_owned();
            std::thread::scope(|scope| {
                scope.spawn(|| loop_governor_one_key(&gov, &key, n / 2));
                scope.spawn(|| loop_governor_one_key(&gov, &key, n / 2));
            });
        }
        "http_no_layer" => http_loop(apps::no_layer(), n),
        "http_ours" => http_loop(apps::with_tower_rate_tier(), n),
        "http_governor" => http_loop(apps::with_tower_governor(), n),
        // A layer that does nothing: what axum's wrapping of a route costs
        // by itself.
        "http_noop_layer" => http_loop(
            apps::no_layer().layer(tower::util::MapRequestLayer::new(
                |r: http::Request<axum::body::Body>| r,
            )),
            n,
        ),
        other => panic!("unknown case {other:?}"),
    }
}

/// Requests to `app`, called in process as hyper calls it (a request with
/// the key header, the response's body read): a warm-up round of every
/// key, then `n` measured requests.
fn http_loop(mut app: axum::Router, n: usize) {
    let keys: Vec<http::HeaderValue> = (1..=HTTP_KEYS)
        .map(|i| http::HeaderValue::from_str(&format!("user-{i:04}")).unwrap())
        .collect();
    requests(&mut app, &keys, HTTP_KEYS);
    loop_http(&mut app, &keys, n);
}

#[inline(never)]
fn loop_http(app: &mut axum::Router, keys: &[http::HeaderValue], n: usize) {
    requests(app, keys, n);
}

#[inline(always)]
fn requests(app: &mut axum::Router, keys: &[http::HeaderValue], n: usize) {
    use tower::Service;
    let mut i = 0;
    for _ in 0..n {
        i = (i + 1) % keys.len();
        let request = http::Request::builder()
            .uri("/")
            .header(apps::API_KEY, keys[i].clone())
            .body(axum::body::Body::empty())
            .unwrap();
        let response = ready(app.call(request)).unwrap();
        assert_eq!(response.status(), 200);
        let body =
            ready(http_body_util::BodyExt::collect(response.into_body()));
        black_box(body.unwrap());
    }
}

/// Instructions callgrind counted inside `case`'s loop of `n` checks.
fn count(exe: &std::path::Path, case: &str, n: usize) -> Option<u64> {
    let out = std::env::temp_dir()
        .join(format!("trt-callgrind-{}-{case}.out", std::process::id()));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--toggle-collect=instructions::loop_*")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .args(["--case", case, "--n", &n.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    let text = std::fs::read_to_string(&out).ok();
    let _ = std::fs::remove_file(&out);
    if !status.success() {
        return None;
    }
    text?.lines().find_map(|line| {
        let rest = line
            .strip_prefix("summary:")
            .or_else(|| line.strip_prefix("totals:"))?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn main() {
    let args = Args::parse();
    let n: usize = args.num("n", KEYS);
    if let Some(case) = args.get("case") {
        run(case, n);
        return;
    }
    if args.get("time").is_some() {
        time(args.num("rounds", 20));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut results = InstructionsResults {
        checks: Some(n as u64),
        ..InstructionsResults::default()
    };
    for (case, what, field) in CASES {
        // Two counts, n and 2n checks: the difference is n checks exactly,
        // without the call of the loop.
        let per_check = count(&exe, case, n)
            .zip(count(&exe, case, 2 * n))
            .map(|(one, two)| two.saturating_sub(one) as f64 / n as f64);
        match per_check {
            Some(per_check) => {
                println!(
                    "{case:>20}: {per_check:8.1} instructions per check ({what})"
                );
                *field(&mut results) = Some(per_check);
            }
            None => {
                println!("{case:>20}: no count (is valgrind installed?)");
            }
        }
    }
    write_results(&results, &args);
}

/// Nanoseconds per check, ours against governor, interleaved round by
/// round in one process (the best round of each): a quick look at time,
/// where check.rs is the reference.
fn time(rounds: usize) {
    use std::sync::Arc;
    use std::time::Instant;
    const N: usize = 1_000_000;
    let limiter = ours();
    let gov = governor();
    let key = "user-1".to_owned();
    let users = Arc::new(user_ids());
    for user in users.iter() {
        ready(limiter.check(user, "free", 1)).unwrap().unwrap();
        gov.check_key(user).unwrap();
    }
    let two = |work: &(dyn Fn(usize, usize) + Sync)| {
        let start = Instant::now();
        std::thread::scope(|scope| {
            scope.spawn(|| work(0, N / 2));
            scope.spawn(|| work(1, N / 2));
        });
        start.elapsed()
    };
    type Case<'a> = (&'a str, Box<dyn Fn() -> std::time::Duration + 'a>);
    let cases: Vec<(Case<'_>, Case<'_>)> = vec![
        (
            (
                "one_key ours",
                Box::new(|| {
                    let start = Instant::now();
                    loop_ours_one_key(&limiter, &key, N);
                    start.elapsed()
                }),
            ),
            (
                "gov",
                Box::new(|| {
                    let start = Instant::now();
                    loop_governor_one_key(&gov, &key, N);
                    start.elapsed()
                }),
            ),
        ),
        (
            (
                "100k ours",
                Box::new(|| {
                    let start = Instant::now();
                    loop_ours_keys(&limiter, &users, N);
                    start.elapsed()
                }),
            ),
            (
                "gov",
                Box::new(|| {
                    let start = Instant::now();
                    loop_governor_keys(&gov, &users, N);
                    start.elapsed()
                }),
            ),
        ),
        (
            (
                "2 threads one_key ours",
                Box::new(|| two(&|_, n| loop_ours_one_key(&limiter, &key, n))),
            ),
            (
                "gov",
                Box::new(|| two(&|_, n| loop_governor_one_key(&gov, &key, n))),
            ),
        ),
        (
            (
                "2 threads 100k ours",
                Box::new(|| {
                    two(&|t, n| loop_ours_keys(&limiter, &users[t * 7919..], n))
                }),
            ),
            (
                "gov",
                Box::new(|| {
                    two(&|t, n| loop_governor_keys(&gov, &users[t * 7919..], n))
                }),
            ),
        ),
    ];
    for ((name, ours), (_, peer)) in &cases {
        let (mut a, mut b) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            a = a.min(ours().as_nanos() as f64 / N as f64);
            b = b.min(peer().as_nanos() as f64 / N as f64);
        }
        println!(
            "{name:>24}: {a:6.1} ns, governor {b:6.1} ns, ratio {:.3}",
            a / b
        );
    }
}
