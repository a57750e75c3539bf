//! The example server's limits beside the rate, over real HTTP: `/login`
//! (at most 5 in any 60 s per user, an exact window) and `/export` (3 per
//! calendar month UTC on free, 100 on pro) and `/upload` (2 in flight per
//! user on free), in memory, and on two servers sharing Redis, a Redis
//! Cluster or PostgreSQL, each behind the fallback the example puts in
//! front of them, given time enough that the shared store decides every
//! request (checked: no fallback decision, no breaker moved).
#![allow(clippy::unwrap_used)]

mod support;

use std::ops::RangeInclusive;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rate_tier_test_support::PostgresServer;
use support::{Response, Server};
use tower_rate_tier::{Concurrency, Period, PeriodUnit};

fn now_us() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_micros()).unwrap()
}

fn header_u64(r: &Response, name: &str) -> u64 {
    r.header(name)
        .unwrap_or_else(|| panic!("no {name}: {r:?}"))
        .parse()
        .unwrap()
}

#[test]
fn login_is_an_exact_window_and_its_refusal_charges_the_plan_nothing() {
    let server = Server::start(&[], &[]);
    for left in (0..5).rev() {
        let r = server.get("/login", Some("key_ana"));
        assert_eq!((r.status, r.body.as_str()), (200, "login\n"), "{r:?}");
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"), "{r:?}");
        assert_eq!(header_u64(&r, "x-ratelimit-remaining"), left, "{r:?}");
    }
    let before_s = now_us() / 1_000_000;
    let refused = server.get("/login", Some("key_ana"));
    assert_eq!(refused.status, 429, "{refused:?}");
    // Until the first login leaves the window: 60 s, rounded up.
    let wait = header_u64(&refused, "retry-after");
    assert!((59..=60).contains(&wait), "{refused:?}");
    assert_eq!(
        refused.body,
        format!(
            r#"{{"error":"rate limit exceeded","tier":"free","limit":"login","retry_after":{wait}}}"#
        )
    );
    let reset = header_u64(&refused, "x-ratelimit-reset");
    assert!(
        (before_s + 58..=before_s + 61).contains(&reset),
        "{refused:?}"
    );
    // The tier was charged by the 5 logins only, and another user has
    // logins of her own.
    let data = server.get("/data", Some("key_ana"));
    assert_eq!(header_u64(&data, "x-ratelimit-remaining"), 4, "{data:?}");
    assert_eq!(server.get("/login", Some("key_bea")).status, 200);
}

#[test]
fn export_is_a_calendar_month_per_plan_until_the_first_of_the_next() {
    let server = Server::start(&["--headers", "both"], &[]);
    for left in (0..3).rev() {
        let r = server.get("/export", Some("key_ana"));
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(header_u64(&r, "x-ratelimit-remaining"), left, "{r:?}");
    }
    a_refused_export_waits_for_the_next_month(
        server.port,
        ("key_ana", "free"),
        3,
    );

    // Pro exports 100 a month (a tier of 100 a minute: the tier refuses
    // the 101st on its own, so only 100 are asked for).
    for k in 0..100 {
        let r = server.get("/export", Some("key_bea"));
        assert_eq!(r.status, 200, "export {k}: {r:?}");
    }
    let r = server.get("/quota", Some("key_bea"));
    assert!(
        r.body
            .contains(r#"{"name":"exports","limit":100,"remaining":0,"#),
        "{r:?}"
    );
}

/// `key` (whose tier lets `limit` uploads run at once: 2 on free, 10 on
/// pro) starts `n` uploads of 1.5 s at once, spread over the servers at
/// `ports`: exactly `limit` run, the others are refused at once
/// (`retry-after: 1`); once they ended (and, on a shared store, their
/// release landed), their slots are back.
fn only_the_limit_of_uploads_runs_at_once(
    ports: &[u16],
    (key, limit): (&'static str, usize),
    n: usize,
) {
    let statuses: Vec<(u16, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let port = ports[i % ports.len()];
                scope.spawn(move || {
                    let r = support::get(port, "/upload?ms=1500", Some(key));
                    (r.status, r.header("retry-after").map(str::to_owned))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let passed = statuses.iter().filter(|(s, _)| *s == 200).count();
    let refused: Vec<_> = statuses.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!((passed, refused.len()), (limit, n - limit), "{statuses:?}");
    assert!(
        refused
            .iter()
            .all(|(_, wait)| *wait == Some(slot_hint_secs().to_string())),
        "{statuses:?}"
    );
    // On a shared store a slot is released by a task once the response
    // ended, a moment after the client read it: a bounded wait until both
    // are back (read, not charged).
    let back =
        format!(r#"{{"name":"uploads","limit":{limit},"remaining":{limit},"#);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !support::get(ports[0], "/quota", Some(key))
        .body
        .contains(&back)
    {
        assert!(Instant::now() < deadline, "the slots never came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    for &port in ports {
        let r = support::get(port, "/upload?ms=0", Some(key));
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "uploaded in 0 ms\n"),
            "{r:?}"
        );
        let limit = limit.to_string();
        assert_eq!(r.header("x-ratelimit-limit"), Some(&*limit), "{r:?}");
    }
}

#[test]
fn upload_holds_one_of_two_slots_per_user_while_it_runs() {
    let server = Server::start(&[], &[]);
    only_the_limit_of_uploads_runs_at_once(&[server.port], ("key_ana", 2), 3);
}

#[test]
fn a_client_that_goes_away_gives_its_upload_slot_back() {
    let server = Server::start(&["--headers", "both"], &[]);
    a_client_that_goes_away_gives_its_upload_slot_back_on(
        &[server.port],
        ("key_ana", "free"),
        2,
    );
}

/// A stretch of this machine's clock, in µs since the Unix epoch: when a
/// server (or its store, on this machine too) read its clock for a request
/// sent and answered within it.
#[derive(Debug, Clone, Copy)]
struct Span {
    before: u64,
    after: u64,
}

impl Span {
    fn around<T>(what: impl FnOnce() -> T) -> (T, Span) {
        let before = now_us();
        let out = what();
        (
            out,
            Span {
                before,
                after: now_us(),
            },
        )
    }

    fn plus(self, us: u64) -> Span {
        Span {
            before: self.before + us,
            after: self.after + us,
        }
    }
}

/// The clocks of the test, the servers and the stores are this machine's,
/// read at different moments: how far apart they may be, in µs.
const SLACK_US: u64 = 100_000;

/// The whole seconds (rounded up) of a wait asked within `asked` for an
/// instant within `until`.
fn wait_secs(until: Span, asked: Span) -> RangeInclusive<u64> {
    let least = until.before.saturating_sub(asked.after + SLACK_US);
    let most = (until.after + SLACK_US).saturating_sub(asked.before);
    least.div_ceil(1_000_000)..=most.div_ceil(1_000_000)
}

/// The Unix seconds (rounded up) of an instant within `at`.
fn unix_secs(at: Span) -> RangeInclusive<u64> {
    (at.before - SLACK_US).div_ceil(1_000_000)
        ..=(at.after + SLACK_US).div_ceil(1_000_000)
}

/// What a concurrency limit's refusal says to wait, in whole seconds.
fn slot_hint_secs() -> u64 {
    let full = Concurrency::new(1).unwrap().acquire(1, 1).unwrap();
    Duration::from_micros(full.retry_after_us).as_secs()
}

/// The 429 body of `tier`'s request refused by the limit `limit`.
fn refusal_body(tier: &str, limit: &str, wait: u64) -> String {
    format!(
        r#"{{"error":"rate limit exceeded","tier":"{tier}","limit":"{limit}","retry_after":{wait}}}"#
    )
}

/// Asserts the IETF fields (`--headers both`) of a refusal by `limit`:
/// its policy `q` (and `w` seconds, for a limit with a window), and its
/// state: nothing left until the wait.
fn assert_ietf(refused: &Response, limit: &str, q: u64, w: Option<u64>) {
    let items = |name: &str| -> Vec<String> {
        let field = refused.header(name).unwrap_or_else(|| panic!("no {name}"));
        field.split(", ").map(str::to_owned).collect()
    };
    let policy = match w {
        Some(w) => format!("\"{limit}\";q={q};w={w}"),
        None => format!("\"{limit}\";q={q}"),
    };
    let policies = items("ratelimit-policy");
    assert!(policies.contains(&policy), "{policy} in {policies:?}");
    let wait = header_u64(refused, "retry-after");
    let state = format!("\"{limit}\";r=0;t={wait}");
    let states = items("ratelimit");
    assert!(states.contains(&state), "{state} in {states:?}");
}

/// `key` (on `tier`, whose tier has room for 6 requests, with no login in
/// the last minute) logs in 5 times over the servers at `ports`: 2, then
/// 3 more a second later; the 6th is refused until the first login leaves
/// the window, and `x-ratelimit-reset` is that instant.
fn a_refused_login_waits_for_the_oldest_to_leave(
    ports: &[u16],
    (key, tier): (&str, &str),
) {
    const WINDOW: Duration = Duration::from_secs(60);
    let login =
        |i: usize| support::get(ports[i % ports.len()], "/login", Some(key));
    let (first, oldest) = Span::around(|| [login(0), login(1)]);
    // A real wait (real servers, real clocks), the one of this file: the
    // oldest login and the newest then leave the window in different
    // seconds, whatever the rounding (1 s apart, plus twice SLACK_US).
    std::thread::sleep(Duration::from_millis(1200));
    for r in first.iter().chain(&[login(2), login(3), login(4)]) {
        assert_eq!(r.status, 200, "{r:?}");
    }
    let (refused, asked) = Span::around(|| login(5));
    assert_eq!(refused.status, 429, "{refused:?}");
    let leaves = oldest.plus(u64::try_from(WINDOW.as_micros()).unwrap());
    let wait = header_u64(&refused, "retry-after");
    assert!(
        wait_secs(leaves, asked).contains(&wait),
        "{wait} not in {:?}: {refused:?}",
        wait_secs(leaves, asked)
    );
    let reset = header_u64(&refused, "x-ratelimit-reset");
    assert!(
        unix_secs(leaves).contains(&reset),
        "{reset} not in {:?} (the oldest login leaving): {refused:?}",
        unix_secs(leaves)
    );
    assert_eq!(
        refused.header("x-ratelimit-limit"),
        Some("5"),
        "{refused:?}"
    );
    assert_eq!(refused.body, refusal_body(tier, "login", wait));
    assert_ietf(&refused, "login", 5, Some(WINDOW.as_secs()));
}

/// `key` (on `tier`, whose exports are `limit` a month, all spent) is
/// refused the next through `port` until the first instant (UTC) of the
/// next month, and `x-ratelimit-reset` is that instant.
fn a_refused_export_waits_for_the_next_month(
    port: u16,
    (key, tier): (&str, &str),
    limit: u32,
) {
    let (refused, asked) =
        Span::around(|| support::get(port, "/export", Some(key)));
    assert_eq!(refused.status, 429, "{refused:?}");
    let monthly = Period::new(limit, PeriodUnit::Month, 0).unwrap();
    let start = monthly.start_of(asked.before).unwrap();
    let next = monthly.next_start(asked.before).unwrap();
    assert_eq!(
        monthly.next_start(asked.after).unwrap(),
        next,
        "a new month"
    );
    let wait = header_u64(&refused, "retry-after");
    let next_span = Span {
        before: next,
        after: next,
    };
    assert!(
        wait_secs(next_span, asked).contains(&wait),
        "{wait} not in {:?}: {refused:?}",
        wait_secs(next_span, asked)
    );
    assert_eq!(
        header_u64(&refused, "x-ratelimit-reset"),
        next.div_ceil(1_000_000),
        "{refused:?}"
    );
    assert_eq!(refused.body, refusal_body(tier, "exports", wait));
    // The IETF policy's window is this month's length.
    let month = (next - start) / 1_000_000;
    assert_ietf(&refused, "exports", limit.into(), Some(month));
}

/// `key` (on `tier`, whose tier lets `limit` uploads run at once) starts
/// `limit` uploads of 10 s over the servers at `ports`, their connections
/// kept open: one more is refused (retry-after the slot hint, reset that
/// far from now); then the clients go away, and the server drops their
/// requests, and their slots with them, long before the 10 s are over.
fn a_client_that_goes_away_gives_its_upload_slot_back_on(
    ports: &[u16],
    (key, tier): (&str, &str),
    limit: usize,
) {
    const UPLOAD: Duration = Duration::from_secs(10);
    let sent = Instant::now();
    let streams: Vec<std::net::TcpStream> = (0..limit)
        .map(|i| {
            let port = ports[i % ports.len()];
            support::send(
                port,
                &format!(
                    "GET /upload?ms={} HTTP/1.1\r\nhost: x\r\nx-api-key: {key}\r\n\r\n",
                    UPLOAD.as_millis()
                ),
            )
        })
        .collect();
    // Bounded waits on real servers (their handlers run for real): until
    // every upload holds its slot, then until every slot is back, which
    // must be before the uploads would have ended by themselves.
    let until = |what: &str, left: usize, by: Instant| loop {
        // Read, not charged: the tier is not spent by the waiting.
        let r = support::get(ports[0], "/quota", Some(key));
        let slots = format!(
            r#"{{"name":"uploads","limit":{limit},"remaining":{left},"#
        );
        if r.body.contains(&slots) {
            return;
        }
        assert!(Instant::now() < by, "{what}: {r:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    until("the uploads never held their slots", 0, sent + UPLOAD / 2);

    let last = ports[ports.len() - 1];
    let (refused, asked) =
        Span::around(|| support::get(last, "/upload?ms=0", Some(key)));
    assert_eq!(refused.status, 429, "{refused:?}");
    let hint = slot_hint_secs();
    assert_eq!(header_u64(&refused, "retry-after"), hint, "{refused:?}");
    // Reset: when the client is told to try again.
    let reset = header_u64(&refused, "x-ratelimit-reset");
    let retry = asked.plus(hint * 1_000_000);
    assert!(
        unix_secs(retry).contains(&reset),
        "{reset} not in {:?}: {refused:?}",
        unix_secs(retry)
    );
    let limit_text = limit.to_string();
    assert_eq!(
        refused.header("x-ratelimit-limit"),
        Some(&*limit_text),
        "{refused:?}"
    );
    assert_eq!(refused.body, refusal_body(tier, "uploads", hint));
    assert_ietf(&refused, "uploads", limit as u64, None);

    drop(streams);
    until(
        "the slots were not given back",
        limit,
        sent + UPLOAD * 9 / 10,
    );
}

/// Asserts that no check of `server` was decided by its local fallback,
/// that its store never failed and no breaker moved: its `/metrics`.
fn assert_the_store_decided_everything(server: &Server) {
    let metrics = server.get("/metrics", None);
    assert_eq!(metrics.status, 200, "{metrics:?}");
    let counted = |name: &str| -> f64 {
        metrics
            .body
            .lines()
            .filter(|line| line.starts_with(name))
            .map(|line| {
                line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
            })
            .sum()
    };
    // Checks were counted (the scrape reads what it should)...
    assert!(counted("rate_tier_checks_total{") > 0.0, "{}", metrics.body);
    // ...and none of them failed over.
    for name in [
        "rate_tier_fallback_decisions_total{",
        "rate_tier_storage_errors_total{",
        "rate_tier_breaker_transitions_total{",
    ] {
        assert_eq!(counted(name), 0.0, "{name}: {}", metrics.body);
    }
    let log = server.stderr();
    assert!(
        log.iter().all(|line| !line.contains("breaker")),
        "a breaker opened: {log:?}"
    );
}

/// The buckets of the scenario of two servers on one store, by name and
/// user: bea's, ana's and ada's, and their bans'.
const SHARED_BUCKETS: [(&str, &str); 18] = [
    ("limit/login", "key_bea"),
    ("limit/exports", "key_bea"),
    ("pro", "key_bea"),
    ("limit/uploads", "key_ana"),
    ("free", "key_ana"),
    ("limit/exports", "key_ana"),
    ("limit/login", "key_ada"),
    ("limit/exports", "key_ada"),
    ("limit/uploads", "key_ada"),
    ("pro", "key_ada"),
    ("ban/until", "key_bea"),
    ("ban/refusals", "key_bea"),
    ("ban/level", "key_bea"),
    ("ban/until", "key_ana"),
    ("ban/refusals", "key_ana"),
    ("ban/level", "key_ana"),
    ("ban/until", "key_ada"),
    ("ban/refusals", "key_ada"),
];

/// How long each server's check waits for the shared store before its
/// local fallback decides: exactness is the shared store's, so on a loaded
/// machine the store gets all the time it needs (no breaker may open).
const STORE_TIMEOUT: [&str; 2] = ["--store-timeout-ms", "10000"];

/// Each server's options beside its store: the IETF fields too.
const SHARED_ARGS: [&str; 4] =
    [STORE_TIMEOUT[0], STORE_TIMEOUT[1], "--headers", "both"];

/// Two servers sharing one store: the window, the period and the uploads
/// are exact over both, each refusal says when and why, and the store
/// decided every request.
fn kinds_shared_exactly(a: &Server, b: &Server) {
    let ports = [a.port, b.port];
    let at_once = |key: &'static str, path: &'static str, n: usize| {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let port = ports[i % 2];
                    scope.spawn(move || {
                        support::get(port, path, Some(key)).status
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<u16>>()
        })
    };
    let passed = |statuses: &[u16]| {
        assert!(
            statuses.iter().all(|&s| s == 200 || s == 429),
            "{statuses:?}"
        );
        statuses.iter().filter(|&&s| s == 200).count()
    };
    // Bea (pro, 100 a minute on the tier): 5 logins in any 60 s, over both
    // (15 refused: fewer than the 20 that would ban her).
    let logins = at_once("key_bea", "/login", 20);
    assert_eq!(
        passed(&logins),
        5,
        "{logins:?}\n{:?}",
        [a.stderr(), b.stderr()]
    );
    // 100 exports a month on pro, of which 5 logins left the tier 95.
    let exports = at_once("key_bea", "/export", 90);
    assert_eq!(passed(&exports), 90, "{exports:?}");
    let r = a.get("/quota", Some("key_bea"));
    assert!(
        r.body
            .contains(r#"{"name":"exports","limit":100,"remaining":10,"#),
        "{r:?}"
    );
    // Ada (pro, her own 500 a minute: the tier never refuses her here)
    // exports pro's 100 at once over both, and no more.
    let exports = at_once("key_ada", "/export", 100);
    assert_eq!(passed(&exports), 100, "{exports:?}");
    a_refused_export_waits_for_the_next_month(b.port, ("key_ada", "pro"), 100);
    // Ana (free): 3 a month, over both.
    for (i, port) in ports.iter().cycle().take(3).enumerate() {
        let r = support::get(*port, "/export", Some("key_ana"));
        assert_eq!(r.status, 200, "export {i}: {r:?}");
    }
    a_refused_export_waits_for_the_next_month(b.port, ("key_ana", "free"), 3);

    // Uploads are a concurrency limit, shared: 2 in flight over both on
    // free, 10 on pro.
    only_the_limit_of_uploads_runs_at_once(&ports, ("key_ana", 2), 6);
    only_the_limit_of_uploads_runs_at_once(&ports, ("key_ada", 10), 13);
    a_client_that_goes_away_gives_its_upload_slot_back_on(
        &ports,
        ("key_ana", "free"),
        2,
    );
    a_refused_login_waits_for_the_oldest_to_leave(&ports, ("key_ada", "pro"));
    assert_the_store_decided_everything(a);
    assert_the_store_decided_everything(b);
}

#[test]
fn two_servers_on_one_redis_share_the_window_the_period_and_the_uploads_exactly()
 {
    let url = rate_tier_test_support::redis_url();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = SHARED_BUCKETS
        .iter()
        .map(|(name, user)| {
            tower_rate_tier::storage::key::bucket_key(name, user, None)
        })
        .collect();
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
    let a =
        Server::start(&[&["--redis", &url][..], &SHARED_ARGS].concat(), &[]);
    let b = Server::start(&SHARED_ARGS, &[("REDIS_URL", &url)]);
    kinds_shared_exactly(&a, &b);
    // The window is a list, the period a string, under hashed keys; ada's
    // 5 logins are in the list.
    let kind: String =
        redis::cmd("TYPE").arg(&keys[0]).query(&mut conn).unwrap();
    assert_eq!(kind, "list");
    let kind: String =
        redis::cmd("TYPE").arg(&keys[1]).query(&mut conn).unwrap();
    assert_eq!(kind, "string");
    let logins: u64 =
        redis::cmd("LLEN").arg(&keys[6]).query(&mut conn).unwrap();
    assert_eq!(logins, 5);
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
}

#[test]
fn two_servers_on_one_redis_cluster_share_the_window_the_period_and_the_uploads_exactly()
 {
    let urls = rate_tier_test_support::cluster_urls(2);
    let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
    let mut conn = client.get_connection().unwrap();
    // Each user's buckets share the user's hash tag: one slot each.
    let keys: Vec<String> = SHARED_BUCKETS
        .iter()
        .map(|(name, user)| {
            tower_rate_tier::storage::key::cluster_bucket_key(name, user, None)
        })
        .collect();
    let clear = |conn: &mut redis::cluster::ClusterConnection| {
        for key in &keys {
            let _: () = redis::cmd("DEL").arg(key).query(conn).unwrap();
        }
    };
    clear(&mut conn);
    let start = |url: &str| {
        Server::start(
            &[&["--redis-cluster", url][..], &SHARED_ARGS].concat(),
            &[],
        )
    };
    let (a, b) = (start(&urls[0]), start(&urls[1]));
    kinds_shared_exactly(&a, &b);
    let kind: String =
        redis::cmd("TYPE").arg(&keys[0]).query(&mut conn).unwrap();
    assert_eq!(kind, "list", "the login window, on the cluster");
    let logins: u64 =
        redis::cmd("LLEN").arg(&keys[6]).query(&mut conn).unwrap();
    assert_eq!(logins, 5);
    clear(&mut conn);
}

#[test]
fn two_servers_on_one_postgres_share_the_window_the_period_and_the_uploads_exactly()
 {
    let postgres = PostgresServer::start();
    let url = postgres.url();
    let a =
        Server::start(&[&["--postgres", &url][..], &SHARED_ARGS].concat(), &[]);
    // The second finds the table the first created, and its URL in the
    // environment.
    let b = Server::start(&SHARED_ARGS, &[("DATABASE_URL", &url)]);
    a.wait_for_stderr("postgres, with local fallback");
    b.wait_for_stderr("postgres, with local fallback");
    kinds_shared_exactly(&a, &b);
    // What the table holds: ada's 5 logins in her window's log, and each
    // month's exports counted in the period's row.
    let read = |column: &str, (name, user): (&str, &str)| {
        let key = tower_rate_tier::storage::key::bucket_key(name, user, None);
        postgres
            .psql(&format!(
                "SELECT {column} FROM rate_tier_buckets WHERE key = '{key}'"
            ))
            .unwrap()
            .trim()
            .to_owned()
    };
    let logins = read("cardinality(log_us)", ("limit/login", "key_ada"));
    assert_eq!(logins, "5");
    for (user, count) in
        [("key_ada", "100"), ("key_ana", "3"), ("key_bea", "90")]
    {
        let exports = read("period_count", ("limit/exports", user));
        assert_eq!(exports, count, "{user}");
    }
}
