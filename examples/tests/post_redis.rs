//! The 0.3 example's Redis transcripts: two example servers on one Redis share one
//! limit. Needs `TRT_REDIS_URL` (a throwaway Redis: `cargo xtask test-redis`).
#![allow(clippy::unwrap_used)]

mod support;

use rate_tier_test_support::redis_url;
use support::Server;

fn redis() -> redis::Connection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap()
}

// printf key_ana | sha1sum
const ANA_KEY: &str = "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a";

#[test]
fn two_servers_on_one_redis_share_one_limit() {
    let mut conn = redis();
    // This test owns the 0.3 example's fixed users on its throwaway Redis.
    let bea_key = "trt:pro:2cf9c90680e790a456a17c6cd1ffcfb89a4d5b6c";
    let _: () = redis::cmd("DEL")
        .arg(ANA_KEY)
        .arg(bea_key)
        .query(&mut conn)
        .unwrap();

    let url = redis_url();
    let a = Server::start(&["--redis", &url], &[]);
    // The second takes its URL from the environment, as `examples/server.rs` allows.
    let b = Server::start(&[], &[("REDIS_URL", &url)]);
    let servers = [&a, &b];

    // Ana alternates between the two instances: 10 pass, the 11th does not.
    let statuses: Vec<u16> = (1..=11)
        .map(|i| servers[i % 2].get("/data", Some("key_ana")).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429]
    );
    let refused = a.get("/data", Some("key_ana"));
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("6"));
    assert_eq!(
        refused.body,
        r#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );

    // One key per user and tier: the tier and the SHA-1 of the id; it
    // expires when the bucket is full again (about a minute).
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("trt:free:*")
        .query(&mut conn)
        .unwrap();
    assert!(keys.contains(&ANA_KEY.to_owned()), "{keys:?}");
    assert!(keys.iter().all(|k| !k.contains("key_ana")));
    let pttl: i64 = redis::cmd("PTTL").arg(ANA_KEY).query(&mut conn).unwrap();
    assert!((55_000..=60_000).contains(&pttl), "PTTL {pttl}");
    let tat: String = redis::cmd("GET").arg(ANA_KEY).query(&mut conn).unwrap();
    assert!(tat.bytes().all(|b| b.is_ascii_digit()), "TAT {tat:?}");

    // Bea (pro): /data costs 1 and /report 5, whichever instance answers.
    let data = a.get("/data", Some("key_bea"));
    assert_eq!(data.header("x-ratelimit-remaining"), Some("99"));
    let report = b.get("/report", Some("key_bea"));
    assert_eq!(report.header("x-ratelimit-remaining"), Some("94"));
    let exists: bool =
        redis::cmd("EXISTS").arg(bea_key).query(&mut conn).unwrap();
    assert!(exists, "bea's key is trt:pro:sha1(key_bea)");

    // Eva: unknown tier, default quota; /backup can never pass; no key: 401.
    let eva = b.get("/data", Some("key_eva"));
    assert_eq!(
        (eva.status, eva.header("x-ratelimit-limit")),
        (200, Some("10"))
    );
    assert_eq!(a.get("/backup", Some("key_eva")).status, 403);
    assert_eq!(a.get("/data", None).status, 401);
}
