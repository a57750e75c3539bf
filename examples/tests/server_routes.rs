//! The example server's routes added after 0.3, over real HTTP:
//! `/search` (3 a minute per user beside the tier, all or nothing),
//! `/quota` (every limit, read and not charged, as `{"tier":..,"limits":[..]}`),
//! `/generate?tokens=N` (tokens settled after the answer: a debt the next
//! generation waits for) and `--shadow` (nothing refused for rate, counted
//! in `/metrics`), in memory, with `--redis` (two servers on one Redis)
//! and with `--redis-cluster` (two servers on a Redis Cluster).
//!
//! The Redis tests need `cargo xtask test-redis` (`TRT_REDIS_URL`), the
//! Cluster test `cargo xtask test-cluster` (`TRT_REDIS_CLUSTER_URLS`); this
//! file's tests on a shared store own the example's fixed users there, and
//! clear their buckets first.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_parse::{Scrape, Value};
use rate_tier_test_support::{cluster_urls, redis_url};
use support::{Response, Server};
use tower_rate_tier::storage::key::{bucket_key, cluster_bucket_key};

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `/quota`'s body with every `"reset":N` replaced by `"reset":R`, and the
/// N, in order.
fn without_resets(body: &str) -> (String, Vec<u64>) {
    let mut shape = String::new();
    let mut resets = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find("\"reset\":") {
        let (before, after) = rest.split_at(at + "\"reset\":".len());
        shape.push_str(before);
        shape.push('R');
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        resets.push(after[..digits].parse().unwrap());
        rest = &after[digits..];
    }
    shape.push_str(rest);
    (shape, resets)
}

/// `/quota` for `key`: the JSON shape (resets as `R`) and the resets.
fn quota(server: &Server, key: &str) -> (String, Vec<u64>) {
    let r = server.get("/quota", Some(key));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    without_resets(&r.body)
}

/// The example's limits of other kinds than a rate: every store decides
/// them all (concurrency too, behind the fallback).
const OTHER_KINDS: &[&str] = &["login", "exports", "uploads"];

/// The JSON `/quota` answers, with `R` for each reset: `limits`, then
/// those of `login`, `exports` and `uploads` the store decides (this
/// file's scenarios never charge them).
fn quota_json(
    counted: &[&str],
    tier: &str,
    limits: &[(&str, u32, u64)],
) -> String {
    let pro = tier == "pro";
    let (exports, uploads) = if pro { (100, 10) } else { (3, 2) };
    let kinds = [
        ("login", 5, 5),
        ("exports", exports, u64::from(exports)),
        ("uploads", uploads, u64::from(uploads)),
    ];
    let kinds: Vec<_> = kinds
        .into_iter()
        .filter(|(name, ..)| counted.contains(name))
        .collect();
    let limits: Vec<String> = limits
        .iter()
        .chain(&kinds)
        .map(|(name, limit, remaining)| {
            format!(
                r#"{{"name":"{name}","limit":{limit},"remaining":{remaining},"reset":R}}"#
            )
        })
        .collect();
    format!(r#"{{"tier":"{tier}","limits":[{}]}}"#, limits.join(","))
}

fn retry_after(r: &Response) -> u64 {
    r.header("retry-after").unwrap().parse().unwrap()
}

/// The 0.3 example's users and the example's routes, on `a` and `b` (one server
/// twice in memory, two servers sharing a store otherwise).
fn routes_scenario(a: &Server, b: &Server, counted: &[&str]) {
    // Search: 3 a minute per user beside the tier, whichever server.
    for (k, server) in [a, b, a].into_iter().enumerate() {
        let r = server.get("/search", Some("key_ana"));
        assert_eq!(r.status, 200, "search {k}: {r:?}");
        assert_eq!(r.body, "search\n");
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(&*(2 - k).to_string())
        );
    }
    for server in [b, a] {
        let refused = server.get("/search", Some("key_ana"));
        assert_eq!(refused.status, 429, "{refused:?}");
        assert_eq!(refused.header("content-type"), Some("application/json"));
        let wait = retry_after(&refused);
        assert!((19..=20).contains(&wait), "{refused:?}");
        assert_eq!(
            refused.body,
            format!(
                r#"{{"error":"rate limit exceeded","tier":"free","limit":"search","retry_after":{wait}}}"#
            )
        );
    }

    // Quota: every limit, read and not charged: the refusals charged
    // nothing, and reading twice reads the same.
    let before = now_secs();
    let (shape, resets) = quota(b, "key_ana");
    assert_eq!(
        shape,
        quota_json(
            counted,
            "free",
            &[("free", 10, 7), ("search", 3, 0), ("tokens", 1000, 1000)]
        )
    );
    // Free: full 18 s from now; search: 60 s; tokens: full now.
    assert!(
        (before + 16..=before + 20).contains(&resets[0]),
        "{resets:?}"
    );
    assert!(
        (before + 58..=before + 62).contains(&resets[1]),
        "{resets:?}"
    );
    assert!((before..=before + 2).contains(&resets[2]), "{resets:?}");
    assert_eq!(quota(a, "key_ana").0, shape);
    // Pro's tokens are 10000 a minute; Eva's unknown tier is free's.
    assert_eq!(
        quota(a, "key_bea").0,
        quota_json(
            counted,
            "pro",
            &[
                ("pro", 100, 100),
                ("search", 3, 3),
                ("tokens", 10_000, 10_000)
            ]
        )
    );
    assert_eq!(
        quota(b, "key_eva").0,
        quota_json(
            counted,
            "free",
            &[("free", 10, 10), ("search", 3, 3), ("tokens", 1000, 1000)]
        )
    );
    // No key, or a key made up to look like a tier: 401, never a tier.
    assert_eq!(a.get("/quota", None).status, 401);
    assert_eq!(a.get("/data", Some("pro_0123456789")).status, 401);

    // Generate: 1200 tokens on free (1000 a minute) leave a debt that the
    // next generation waits for, about 12 s, on every server.
    let r = a.get("/generate?tokens=1200", Some("key_ana"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-tokens-used"), Some("1200"));
    assert_eq!(r.body, "generated 1200 tokens\n");
    for server in [b, a] {
        let refused = server.get("/generate?tokens=1", Some("key_ana"));
        assert_eq!(refused.status, 429, "{refused:?}");
        let wait = retry_after(&refused);
        assert!((12..=13).contains(&wait), "{refused:?}");
        assert!(
            refused.body.contains(r#""limit":"tokens""#),
            "{}",
            refused.body
        );
    }
    let (shape, resets) = quota(b, "key_ana");
    assert_eq!(
        shape,
        quota_json(
            counted,
            "free",
            &[("free", 10, 6), ("search", 3, 0), ("tokens", 1000, 0)]
        )
    );
    // The tokens bucket is full again 72 s from now (the debt included).
    let now = now_secs();
    assert!((now + 69..=now + 73).contains(&resets[2]), "{resets:?}");
    // Bea (pro, 10000 tokens a minute): 1200 is well within. (A token
    // comes back every 6 ms: the read may see a few of them.)
    let r = b.get("/generate?tokens=1200", Some("key_bea"));
    assert_eq!(r.status, 200);
    let (shape, _) = quota(a, "key_bea");
    let tokens_at = shape.find("\"name\":\"tokens\"").unwrap();
    let at = tokens_at
        + shape[tokens_at..].find("\"remaining\":").unwrap()
        + "\"remaining\":".len();
    let digits = shape[at..].chars().take_while(char::is_ascii_digit).count();
    let tokens: u64 = shape[at..at + digits].parse().unwrap();
    assert!((8_800..=8_820).contains(&tokens), "{shape}");
    assert_eq!(
        format!("{}8800{}", &shape[..at], &shape[at + digits..]),
        quota_json(
            counted,
            "pro",
            &[
                ("pro", 100, 99),
                ("search", 3, 3),
                ("tokens", 10_000, 8_800)
            ]
        )
    );
    // Regression: 1,000,000 tokens on free (1000 a minute) are a debt of
    // about 1000 minutes, waited for whole on every server (not capped at
    // two bursts, where the next generation would wait 61 s).
    let r = a.get("/generate?tokens=1000000", Some("key_eva"));
    assert_eq!(r.status, 200, "{r:?}");
    for server in [b, a] {
        let refused = server.get("/generate?tokens=1", Some("key_eva"));
        assert_eq!(refused.status, 429, "{refused:?}");
        let minutes = retry_after(&refused) / 60;
        assert!((998..=1000).contains(&minutes), "{refused:?}");
    }
}

/// `--shadow`: nothing is refused for rate; `/metrics` counts what would
/// have been.
fn shadow_scenario(server: &Server) {
    for _ in 0..5 {
        let r = server.get("/search", Some("key_ana"));
        assert_eq!(r.status, 200, "{r:?}");
    }
    for _ in 0..10 {
        let r = server.get("/data", Some("key_ana"));
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Not a rate: still refused.
    assert_eq!(server.get("/data", None).status, 401);

    let metrics = server.get("/metrics", None);
    assert_eq!(metrics.status, 200);
    let scrape =
        Scrape::parse(metrics.body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        let sample = scrape.samples.iter().find(|s| {
            s.metric == name
                && s.labels.len() == labels.len()
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })?;
        match sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        }
    };
    let checks = |outcome| {
        value(
            "rate_tier_checks_total",
            &[("tier", "free"), ("outcome", outcome)],
        )
    };
    // 5 searches: the tier pays 5; search passes 3 and would refuse 2.
    // 10 data: the tier's 5 left pass, 5 would be refused.
    assert_eq!(checks("allowed"), Some(8.0), "{}", metrics.body);
    assert_eq!(checks("shadow_limited"), Some(7.0), "{}", metrics.body);
    assert_eq!(checks("limited"), None, "{}", metrics.body);
    assert_eq!(
        value("rate_tier_shadow_limited_total", &[("limit", "search")]),
        Some(2.0)
    );
    assert_eq!(
        value("rate_tier_shadow_limited_total", &[("limit", "free")]),
        Some(5.0)
    );
}

/// The 0.3 example's users' buckets on a shared store, by layout.
fn fixed_keys(cluster: bool) -> Vec<String> {
    let mut keys = Vec::new();
    for (user, tier) in
        [("key_ana", "free"), ("key_bea", "pro"), ("key_eva", "free")]
    {
        // A limit's buckets are in the limits' namespace: `limit/<name>`.
        let limits = [
            tier,
            "limit/search",
            "limit/tokens",
            "limit/login",
            "limit/exports",
        ];
        for name in limits {
            keys.push(if cluster {
                cluster_bucket_key(name, user, None)
            } else {
                bucket_key(name, user, None)
            });
        }
    }
    keys
}

// ---------------------------------------------------------------------------

#[test]
fn server_routes_in_memory() {
    let server = Server::start(&[], &[]);
    routes_scenario(&server, &server, OTHER_KINDS);
    let shadow = Server::start(&["--shadow"], &[]);
    shadow_scenario(&shadow);
}

fn clear_redis() {
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    for key in fixed_keys(false) {
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    }
}

#[test]
fn server_routes_on_two_servers_sharing_redis() {
    let url = redis_url();
    clear_redis();
    let a = Server::start(&["--redis", &url], &[]);
    let b = Server::start(&[], &[("REDIS_URL", &url)]);
    routes_scenario(&a, &b, OTHER_KINDS);
    // The buckets are in Redis, keyed by limit and user.
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(bucket_key("limit/search", "key_ana", None))
        .arg(bucket_key("limit/tokens", "key_ana", None))
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, 2);
    drop((a, b));

    clear_redis();
    let shadow = Server::start(&["--redis", &url, "--shadow"], &[]);
    shadow_scenario(&shadow);
}

fn clear_cluster() {
    let client = redis::cluster::ClusterClient::new(cluster_urls(2)).unwrap();
    let mut conn = client.get_connection().unwrap();
    for key in fixed_keys(true) {
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    }
}

#[test]
fn server_routes_on_two_servers_sharing_a_redis_cluster() {
    let urls = cluster_urls(2);
    assert!(urls.len() >= 2, "{urls:?}");
    clear_cluster();
    // Each server knows one node; the others are found from it.
    let a = Server::start(&["--redis-cluster", &urls[0]], &[]);
    let b = Server::start(&["--redis-cluster", &urls[1]], &[]);
    routes_scenario(&a, &b, OTHER_KINDS);
    // One user's buckets share the user's hash tag: one slot, one node.
    let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
    let mut conn = client.get_connection().unwrap();
    for name in ["free", "limit/search", "limit/tokens"] {
        let key = cluster_bucket_key(name, "key_ana", None);
        let exists: i64 =
            redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
        assert_eq!(exists, 1, "{key}");
    }
    drop((a, b));

    clear_cluster();
    let shadow =
        Server::start(&["--redis-cluster", &urls.join(","), "--shadow"], &[]);
    shadow_scenario(&shadow);
}
