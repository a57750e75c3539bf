//! The example server's limits beside the rate, over real HTTP: `/login`
//! (at most 5 in any 60 s per user, an exact window) and `/export` (3 per
//! calendar month UTC on free, 100 on pro) and `/upload` (2 in flight per
//! user on free), in memory, on two servers sharing Redis, on two sharing
//! a Redis Cluster and on PostgreSQL, each behind the fallback the example
//! puts in front of them.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use rate_tier_test_support::PostgresServer;
use support::{Response, Server};
use tower_rate_tier::{Period, PeriodUnit};

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
    // The plan was charged by the 5 logins only, and another user has
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
    let now = now_us();
    let monthly = Period::new(3, PeriodUnit::Month, 0).unwrap();
    let (start, next) = (
        monthly.start_of(now).unwrap(),
        monthly.next_start(now).unwrap(),
    );
    let refused = server.get("/export", Some("key_ana"));
    assert_eq!(refused.status, 429, "{refused:?}");
    let wait = header_u64(&refused, "retry-after");
    let until_next = (next - now).div_ceil(1_000_000);
    assert!(
        wait.abs_diff(until_next) <= 2,
        "{wait} vs {until_next}: {refused:?}"
    );
    assert_eq!(
        header_u64(&refused, "x-ratelimit-reset"),
        next.div_ceil(1_000_000),
        "{refused:?}"
    );
    // The IETF policy's window is this month's length.
    let policy = refused.header("ratelimit-policy").unwrap();
    let month_s = (next - start) / 1_000_000;
    assert!(
        policy.contains(&format!("\"exports\";q=3;w={month_s}")),
        "{policy}"
    );
    assert!(refused.body.contains(r#""limit":"exports""#), "{refused:?}");

    // Pro exports 100 a month (a plan of 100 a minute: the plan refuses
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

/// `key` (whose plan lets `limit` uploads run at once: 2 on free, 10 on
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
        refused.iter().all(|(_, wait)| wait.as_deref() == Some("1")),
        "{statuses:?}"
    );
    // On a shared store a slot is released by a task once the response
    // ended, a moment after the client read it: a bounded wait until both
    // are back (read, not charged).
    let back =
        format!(r#"{{"name":"uploads","limit":{limit},"remaining":{limit},"#);
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !support::get(ports[0], "/quota", Some(key))
        .body
        .contains(&back)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the slots never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
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
    use std::io::Write;
    use std::time::{Duration, Instant};
    let server = Server::start(&[], &[]);
    // Two uploads of 10 s, their connections kept open for now.
    let streams: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut stream =
                std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
            stream
                .write_all(
                    b"GET /upload?ms=10000 HTTP/1.1\r\nhost: x\r\nx-api-key: key_ana\r\n\r\n",
                )
                .unwrap();
            stream
        })
        .collect();
    // Bounded waits on a real server: until both hold their slots...
    let until = |what: &str, done: &dyn Fn(&Response) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // Read, not charged: the plan is not spent by the waiting.
            let r = server.get("/quota", Some("key_ana"));
            if done(&r) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {r:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let uploads_left = |n: u32| {
        move |r: &Response| {
            r.body.contains(&format!(
                r#"{{"name":"uploads","limit":2,"remaining":{n},"#
            ))
        }
    };
    until("the two uploads never held their slots", &uploads_left(0));
    // ...then, the clients gone, until both slots are back: the server
    // drops a request's future when its connection closes, and the slot
    // with it, long before the 10 s are over.
    drop(streams);
    until("the slots were not given back", &uploads_left(2));
}

/// Bea's and ana's buckets of the kinds scenario, by name.
const SHARED_BUCKETS: [(&str, &str); 8] = [
    ("limit/login", "key_bea"),
    ("limit/exports", "key_bea"),
    ("pro", "key_bea"),
    ("limit/uploads", "key_ana"),
    ("free", "key_ana"),
    ("ban/until", "key_bea"),
    ("ban/refusals", "key_bea"),
    ("ban/level", "key_bea"),
];

/// How long each server's check waits for the shared store before its
/// local fallback decides: exactness is the shared store's, so on a loaded
/// machine the store gets all the time it needs (no breaker may open).
const STORE_TIMEOUT: [&str; 2] = ["--store-timeout-ms", "10000"];

/// Two servers sharing one store: the window, the period and the uploads
/// are exact over both, and the store decided every request.
fn kinds_shared_exactly(a: &Server, b: &Server) {
    let ports = [a.port, b.port];
    let at_once = |path: &'static str, n: usize| -> Vec<u16> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let port = ports[i % 2];
                    scope.spawn(move || {
                        support::get(port, path, Some("key_bea")).status
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    // Bea (pro, 100 a minute on the plan): 5 logins in any 60 s, over both
    // (15 refused: fewer than the 20 that would ban her).
    let logins = at_once("/login", 20);
    assert_eq!(
        logins.iter().filter(|&&s| s == 200).count(),
        5,
        "{logins:?}\n{:?}",
        [a.stderr(), b.stderr()]
    );
    assert!(logins.iter().all(|&s| s == 200 || s == 429), "{logins:?}");
    // 100 exports a month on pro, of which 5 logins left the plan 95.
    let exports = at_once("/export", 90);
    assert_eq!(
        exports.iter().filter(|&&s| s == 200).count(),
        90,
        "{exports:?}"
    );
    let r = a.get("/quota", Some("key_bea"));
    assert!(
        r.body
            .contains(r#"{"name":"exports","limit":100,"remaining":10,"#),
        "{r:?}"
    );
    // Uploads are a concurrency limit, shared: 2 in flight over both.
    only_the_limit_of_uploads_runs_at_once(&ports, ("key_ana", 2), 6);
    let logs = [a.stderr(), b.stderr()];
    assert!(
        logs.iter().flatten().all(|line| !line.contains("breaker")),
        "a breaker opened: {logs:?}"
    );
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
        .map(|(name, user)| tower_rate_tier::key::bucket_key(name, user, None))
        .collect();
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
    let a = Server::start(
        &["--redis", &url, STORE_TIMEOUT[0], STORE_TIMEOUT[1]],
        &[],
    );
    let b = Server::start(&STORE_TIMEOUT, &[("REDIS_URL", &url)]);
    kinds_shared_exactly(&a, &b);
    // The window is a list, the period a string, under hashed keys.
    let kind: String =
        redis::cmd("TYPE").arg(&keys[0]).query(&mut conn).unwrap();
    assert_eq!(kind, "list");
    let kind: String =
        redis::cmd("TYPE").arg(&keys[1]).query(&mut conn).unwrap();
    assert_eq!(kind, "string");
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
            tower_rate_tier::key::cluster_bucket_key(name, user, None)
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
            &["--redis-cluster", url, STORE_TIMEOUT[0], STORE_TIMEOUT[1]],
            &[],
        )
    };
    let (a, b) = (start(&urls[0]), start(&urls[1]));
    kinds_shared_exactly(&a, &b);
    let kind: String =
        redis::cmd("TYPE").arg(&keys[0]).query(&mut conn).unwrap();
    assert_eq!(kind, "list", "the login window, on the cluster");
    clear(&mut conn);
}

#[test]
fn on_postgres_every_kind_is_decided() {
    let postgres = PostgresServer::start();
    let server = Server::start(&["--postgres", &postgres.url()], &[]);
    server.wait_for_stderr("postgres, with local fallback");
    only_the_limit_of_uploads_runs_at_once(&[server.port], ("key_bea", 10), 13);
    let logins: Vec<u16> = (0..6)
        .map(|_| server.get("/login", Some("key_ana")).status)
        .collect();
    assert_eq!(logins, [200, 200, 200, 200, 200, 429]);
    let exports: Vec<u16> = (0..4)
        .map(|_| server.get("/export", Some("key_ana")).status)
        .collect();
    assert_eq!(exports, [200, 200, 200, 429]);
    // The rest of the service is limited as always.
    assert_eq!(server.get("/data", Some("key_ana")).status, 200);
}
