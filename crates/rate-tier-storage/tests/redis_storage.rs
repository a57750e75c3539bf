#![cfg(feature = "redis")]
//! `RedisStorage` against a real Redis (and a few fake servers).
//!
//! Run with `cargo xtask test-redis`, which starts a throwaway redis-server
//! and sets `TRT_REDIS_URL`. Without it these tests fail: they never pass
//! silently, and they never use the shared Redis on port 6379.
//!
//! Every test uses its own tier names and user ids, so the tests can run in
//! parallel on one server.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use gcra_core::{CheckError, Quota};
use hmac::{Hmac, Mac};
use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{BucketCheck, RedisStorage, Storage, StorageError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sha1::{Digest, Sha1};

#[path = "common/redis_env.rs"]
mod redis_env;
use redis_env::{TEST_TIMEOUT, concurrent_passes, redis_url, unique};

// ---------------------------------------------------------------------------
// Helpers

/// A new connection manager on the test server (connected now).
async fn connect() -> ConnectionManager {
    redis::Client::open(redis_url())
        .expect("valid URL")
        .get_connection_manager()
        .await
        .expect("TRT_REDIS_URL does not answer: is the test server running?")
}

/// A store with its own connection, like a separate instance.
async fn store() -> RedisStorage {
    RedisStorage::new(connect().await).timeout(TEST_TIMEOUT)
}

fn sha1_hex(data: &str) -> String {
    hex::encode(Sha1::digest(data.as_bytes()))
}

fn hmac_sha1_hex(secret: &[u8], data: &str) -> String {
    let mut mac =
        <Hmac<Sha1> as Mac>::new_from_slice(secret).expect("any key length");
    mac.update(data.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

async fn exists(conn: &mut ConnectionManager, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

async fn pttl(conn: &mut ConnectionManager, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// Every key on the server matching `pattern`, with SCAN.
async fn scan(conn: &mut ConnectionManager, pattern: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

// ---------------------------------------------------------------------------
// Sharing and atomicity

#[tokio::test]
async fn two_stores_share_one_limit() {
    let (a, b) = (store().await, store().await);
    let tier = unique("share");
    let check = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1);

    for (i, expected_remaining) in (0..10).rev().enumerate() {
        let instance = if i % 2 == 0 { &b } else { &a };
        let decision = instance.check(&check).await.expect("check");
        assert!(decision.allowed, "request {} refused", i + 1);
        assert_eq!(decision.remaining, expected_remaining);
        assert_eq!(decision.retry_after_us, 0);
        assert_eq!(decision.store, None, "Redis has already stored the TAT");
        // The TAT moves 6 s per request (less the few ms this loop takes).
        let full_in = 6_000_000 * (i as u64 + 1);
        assert!(
            decision.reset_after_us <= full_in
                && decision.reset_after_us > full_in - 1_000_000,
            "reset_after_us {} after {} requests",
            decision.reset_after_us,
            i + 1
        );
    }

    let eleventh = b.check(&check).await.expect("check");
    assert!(!eleventh.allowed);
    assert_eq!(eleventh.remaining, 0);
    assert!(
        eleventh.retry_after_us > 5_000_000
            && eleventh.retry_after_us <= 6_000_000,
        "retry_after_us {}",
        eleventh.retry_after_us
    );
    // Retry-After rounds up: 6 s, as in the post.
    assert_eq!(eleventh.retry_after_us.div_ceil(1_000_000), 6);
    assert!(
        eleventh.reset_after_us > 59_000_000
            && eleventh.reset_after_us <= 60_000_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_pass_exactly_the_quota() {
    for (quota, limit) in
        [(Quota::per_minute(10), 10), (Quota::per_minute(100), 100)]
    {
        let tier = unique("conc");
        let passed =
            concurrent_passes(store().await, store().await, 300, |store| {
                let tier = tier.clone();
                async move {
                    let check = BucketCheck::new(&tier, "ana", quota, 1);
                    store.check(&check).await.expect("check").allowed
                }
            })
            .await;
        assert_eq!(passed, limit);
    }
}

#[tokio::test]
async fn cost_is_charged_atomically() {
    let store = store().await;
    let tier = unique("cost");
    let quota = Quota::per_minute(10);
    let five = BucketCheck::new(&tier, "bea", quota, 5);
    assert_eq!(store.check(&five).await.expect("check").remaining, 5);
    assert_eq!(store.check(&five).await.expect("check").remaining, 0);
    let refused = store.check(&five).await.expect("check");
    assert!(!refused.allowed);
    // 5 requests' worth: 30 s.
    assert!(
        refused.retry_after_us > 29_000_000
            && refused.retry_after_us <= 30_000_000
    );
}

// ---------------------------------------------------------------------------
// Keys and values

#[tokio::test]
async fn key_is_tier_and_sha1_of_user_and_expires_when_full() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = unique("key");
    let user = unique("user");
    let check = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1);
    for _ in 0..10 {
        assert!(store.check(&check).await.expect("check").allowed);
    }

    let key = format!("trt:{tier}:{}", sha1_hex(&user));
    assert_eq!(check.shared_key(), key);
    assert!(exists(&mut conn, &key).await, "{key} is missing");
    let ttl = pttl(&mut conn, &key).await;
    assert!(ttl > 59_000 && ttl <= 60_000, "PTTL {ttl}");

    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("TYPE");
    assert_eq!(kind, "string");
    let value: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert!(
        !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
        "stored value {value:?} is not an integer string"
    );
    // The TAT, in µs on Redis's clock: about a minute ahead of Redis's TIME.
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("TIME");
    let now = secs * 1_000_000 + micros;
    let tat: u64 = value.parse().expect("integer");
    assert!(
        tat > now + 59_000_000 && tat <= now + 60_000_000,
        "tat {tat}, now {now}"
    );

    // Only this bucket's key was written for this tier.
    assert_eq!(scan(&mut conn, &format!("trt:{tier}:*")).await, vec![key]);
}

#[tokio::test]
async fn key_of_the_post_example() {
    // printf key_ana | sha1sum
    assert_eq!(
        sha1_hex("key_ana"),
        "33d2315cbeb866b8b237240a98d605f2e6e41b8a"
    );
    let store = store().await;
    let mut conn = connect().await;
    let tier = unique("free");
    let check = BucketCheck::new(&tier, "key_ana", Quota::per_minute(10), 1);
    store.check(&check).await.expect("check");
    let key = format!("trt:{tier}:33d2315cbeb866b8b237240a98d605f2e6e41b8a");
    assert!(exists(&mut conn, &key).await, "{key} is missing");
}

#[tokio::test]
async fn key_secret_makes_an_hmac_key_and_no_key_holds_the_user_id() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = unique("hmac");
    let user = unique("ana.secret.user");
    let secret = KeySecret::new(b"s3cret");
    let check = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1)
        .key_secret(Some(&secret));
    assert!(store.check(&check).await.expect("check").allowed);

    let hmac_key = format!("trt:{tier}:{}", hmac_sha1_hex(b"s3cret", &user));
    let sha1_key = format!("trt:{tier}:{}", sha1_hex(&user));
    assert!(exists(&mut conn, &hmac_key).await, "{hmac_key} is missing");
    assert!(!exists(&mut conn, &sha1_key).await, "{sha1_key} exists");
    let leaked: Vec<String> = scan(&mut conn, "*")
        .await
        .into_iter()
        .filter(|key| key.contains(&user))
        .collect();
    assert!(leaked.is_empty(), "keys holding the user id: {leaked:?}");
}

#[tokio::test]
async fn wrong_type_key_is_a_fresh_bucket() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = unique("type");
    let check = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1);
    let key = check.shared_key();
    let _: i64 = redis::cmd("LPUSH")
        .arg(&key)
        .arg("x")
        .query_async(&mut conn)
        .await
        .expect("LPUSH");

    let decision = store
        .check(&check)
        .await
        .expect("a list at the key is no error");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 9);
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("TYPE");
    assert_eq!(kind, "string", "the script overwrote the list with a TAT");
}

#[tokio::test]
async fn corrupted_values_are_fresh_buckets() {
    let store = store().await;
    let mut conn = connect().await;
    for value in [
        "abc",
        "1.5",
        "",
        "nan",
        "inf",
        "-inf",
        "2e15",
        " 7",
        "99999999999999999999",
    ] {
        let tier = unique("corrupt");
        let check = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1);
        let () = redis::cmd("SET")
            .arg(check.shared_key())
            .arg(value)
            .query_async(&mut conn)
            .await
            .expect("SET");
        let decision = store.check(&check).await.expect("check");
        assert!(decision.allowed, "value {value:?}");
        assert_eq!(
            decision.remaining, 9,
            "value {value:?} was not read as a fresh bucket"
        );
    }
}

#[tokio::test]
async fn key_expires_when_the_bucket_is_full_again() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = unique("expiry");
    let check = BucketCheck::new(&tier, "ana", Quota::per_second(1), 1);
    let key = check.shared_key();
    assert!(store.check(&check).await.expect("check").allowed);
    assert!(!store.check(&check).await.expect("check").allowed);
    let ttl = pttl(&mut conn, &key).await;
    assert!(ttl > 0 && ttl <= 1_000, "PTTL {ttl}");

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!exists(&mut conn, &key).await, "{key} outlived its bucket");
    let decision = store.check(&check).await.expect("check");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 0);
}

// ---------------------------------------------------------------------------
// The script

#[tokio::test]
async fn script_flush_is_recovered_from() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = unique("noscript");
    let check = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1);
    assert_eq!(store.check(&check).await.expect("check").remaining, 9);

    let script_sha = sha1_hex(include_str!("../src/redis/gcra.lua"));
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("FLUSH");
    let loaded: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&script_sha)
        .query_async(&mut conn)
        .await
        .expect("SCRIPT EXISTS");
    // Another test may have reloaded it already; usually it is gone.
    assert!(loaded == [0] || loaded == [1]);

    let decision = store.check(&check).await.expect("check after SCRIPT FLUSH");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 8, "the bucket survived the flush");
    let loaded: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&script_sha)
        .query_async(&mut conn)
        .await
        .expect("SCRIPT EXISTS");
    assert_eq!(loaded, [1], "the script was loaded again");
}

#[tokio::test]
async fn zero_cost_and_cost_above_burst_never_reach_redis() {
    // A fake server that records what it is sent.
    let fake = FakeRedis::start(|_| b"*4\r\n:1\r\n:0\r\n:0\r\n:0\r\n".to_vec());
    let store = RedisStorage::from_url(&fake.url).expect("store");
    let quota = Quota::per_minute(10);

    let zero = store
        .check(&BucketCheck::new("free", "ana", quota, 0))
        .await;
    assert!(
        matches!(zero, Err(StorageError::Check(CheckError::ZeroCost))),
        "{zero:?}"
    );
    let never = store
        .check(&BucketCheck::new("free", "ana", quota, 11))
        .await;
    assert!(
        matches!(
            never,
            Err(StorageError::Check(CheckError::CostExceedsBurst {
                cost: 11,
                burst: 10
            }))
        ),
        "{never:?}"
    );
    assert!(fake.commands().is_empty(), "sent: {:?}", fake.commands());

    // The burst itself is a request like any other.
    let burst = store
        .check(&BucketCheck::new("free", "ana", quota, 10))
        .await;
    assert!(burst.is_ok(), "{burst:?}");
    assert!(fake.commands().iter().any(|c| c[0] == "EVALSHA"));
}

// ---------------------------------------------------------------------------
// The protocol, against fake servers

#[tokio::test]
async fn evalsha_arguments_and_noscript_reload() {
    let script = include_str!("../src/redis/gcra.lua");
    let script_sha = sha1_hex(script);
    let evals = Arc::new(AtomicU64::new(0));
    let fake = {
        let (evals, script_sha) = (evals.clone(), script_sha.clone());
        FakeRedis::start(move |command| match command[0].as_str() {
            "EVALSHA" if evals.fetch_add(1, Ordering::SeqCst) == 0 => {
                b"-NOSCRIPT No matching script. Please use EVAL.\r\n".to_vec()
            }
            "EVALSHA" => b"*4\r\n:1\r\n:9\r\n:0\r\n:6000000\r\n".to_vec(),
            "SCRIPT" => format!("$40\r\n{script_sha}\r\n").into_bytes(),
            _ => b"+OK\r\n".to_vec(),
        })
    };
    let store = RedisStorage::from_url(&fake.url)
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let check = BucketCheck::new("free", "key_ana", Quota::per_minute(10), 1);
    let decision = store.check(&check).await.expect("check");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 9);
    assert_eq!(decision.reset_after_us, 6_000_000);
    assert_eq!(decision.store, None);

    let sent: Vec<Vec<String>> = fake
        .commands()
        .into_iter()
        .filter(|c| c[0] != "CLIENT")
        .collect();
    let evalsha = vec![
        "EVALSHA".to_owned(),
        script_sha.clone(),
        "1".to_owned(),
        "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a".to_owned(),
        "6000000".to_owned(),
        "60000000".to_owned(),
        "1".to_owned(),
    ];
    let load = vec!["SCRIPT".to_owned(), "LOAD".to_owned(), script.to_owned()];
    assert_eq!(sent, vec![evalsha.clone(), load, evalsha]);
}

#[tokio::test]
async fn script_error_reply_is_a_backend_error() {
    let fake = FakeRedis::start(|command| match command[0].as_str() {
        "EVALSHA" => {
            b"-ERR gcra: ARGV[3] (cost) must be an integer from 1 to 2^53\r\n"
                .to_vec()
        }
        _ => b"+OK\r\n".to_vec(),
    });
    let store = RedisStorage::from_url(&fake.url)
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let result = store
        .check(&BucketCheck::new("free", "ana", Quota::per_minute(10), 1))
        .await;
    match result {
        Err(StorageError::Backend(error)) => {
            assert!(error.to_string().contains("gcra: ARGV[3]"), "{error}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_replies_are_protocol_errors() {
    let replies: [&[u8]; 7] = [
        b"*3\r\n:1\r\n:9\r\n:0\r\n",
        b"*5\r\n:1\r\n:9\r\n:0\r\n:0\r\n:0\r\n",
        b"*4\r\n:1\r\n:-1\r\n:0\r\n:0\r\n",
        b"*4\r\n:2\r\n:0\r\n:0\r\n:0\r\n",
        b"*4\r\n:1\r\n$1\r\n9\r\n:0\r\n:0\r\n",
        b"$-1\r\n",
        b":1\r\n",
    ];
    for reply in replies {
        let fake = FakeRedis::start(move |command| match command[0].as_str() {
            "EVALSHA" => reply.to_vec(),
            _ => b"+OK\r\n".to_vec(),
        });
        let store = RedisStorage::from_url(&fake.url)
            .expect("store")
            .timeout(TEST_TIMEOUT);
        let result = store
            .check(&BucketCheck::new("free", "ana", Quota::per_minute(10), 1))
            .await;
        assert!(
            matches!(result, Err(StorageError::Protocol(_))),
            "reply {:?} gave {result:?}",
            String::from_utf8_lossy(reply)
        );
    }
}

// ---------------------------------------------------------------------------
// Timeouts

/// A server that accepts connections and never answers: holds every socket.
async fn silent_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("redis://127.0.0.1:{port}/")
}

async fn assert_times_out(
    store: &RedisStorage,
    check: &BucketCheck<'_>,
    timeout: Duration,
) {
    let started = Instant::now();
    let result = store.check(check).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(StorageError::Timeout(d)) if d == timeout),
        "expected a timeout, got {result:?}"
    );
    assert!(
        took >= timeout,
        "gave up after {took:?}, before the timeout"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[tokio::test]
async fn silent_server_times_out_with_from_url() {
    let url = silent_server().await;
    let timeout = Duration::from_millis(50);
    let started = Instant::now();
    let store = RedisStorage::from_url(&url)
        .expect("store")
        .timeout(timeout);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "from_url waited for the server"
    );
    // Every check, not only the first, ends at the timeout.
    let check = BucketCheck::new("free", "ana", Quota::per_minute(10), 1);
    for _ in 0..3 {
        assert_times_out(&store, &check, timeout).await;
    }
}

#[tokio::test]
async fn silent_server_times_out_with_a_lazy_connection_manager() {
    let url = silent_server().await;
    let conn = redis::Client::open(url)
        .expect("URL")
        .get_connection_manager_lazy(ConnectionManagerConfig::new())
        .expect("lazy manager");
    let timeout = Duration::from_millis(50);
    let store = RedisStorage::new(conn).timeout(timeout);
    let check = BucketCheck::new("free", "ana", Quota::per_minute(10), 1);
    assert_times_out(&store, &check, timeout).await;
    assert_times_out(&store, &check, timeout).await;
}

#[tokio::test]
async fn eager_connection_manager_waits_on_a_silent_server() {
    // What redis-rs does (documented in the module): connecting eagerly to a
    // server that never answers does not return within the storage timeout;
    // redis-rs retries its handshake (1 s per attempt) before failing.
    let url = silent_server().await;
    let client = redis::Client::open(url).expect("URL");
    let connect = tokio::time::timeout(
        Duration::from_millis(500),
        client.get_connection_manager(),
    );
    assert!(
        connect.await.is_err(),
        "connected to a server that never answers"
    );
}

/// A TCP proxy to the test server that can be frozen: while frozen, nothing
/// is forwarded either way (the bytes wait in the socket buffers).
struct Proxy {
    url: String,
    frozen: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        Proxy::on(listener, upstream)
    }

    fn on(listener: std::net::TcpListener, upstream: &str) -> Proxy {
        let client = redis::Client::open(upstream).expect("URL");
        let target = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => panic!(
                "the proxy test needs a TCP TRT_REDIS_URL, not {other:?}"
            ),
        };
        let port = listener.local_addr().expect("addr").port();
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = StdTcpStream::connect(&target) else {
                    return;
                };
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    let frozen = flag.clone();
                    thread::spawn(move || {
                        let mut buf = [0_u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            while frozen.load(Ordering::SeqCst) {
                                thread::sleep(Duration::from_millis(5));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Proxy {
            url: format!("redis://127.0.0.1:{port}/"),
            frozen,
        }
    }
}

#[tokio::test]
async fn stalled_server_times_out_and_the_store_recovers() {
    let proxy = Proxy::start(&redis_url());
    let conn = redis::Client::open(proxy.url.as_str())
        .expect("URL")
        .get_connection_manager()
        .await
        .expect("connect through the proxy");
    let timeout = Duration::from_millis(50);
    let store = RedisStorage::new(conn).timeout(timeout);
    // The same connection with room for a loaded machine, for the checks
    // that are not about the timeout.
    let patient = store.clone().timeout(TEST_TIMEOUT);
    let tier = unique("stall");
    let check = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1);
    assert_eq!(patient.check(&check).await.expect("check").remaining, 9);

    proxy.frozen.store(true, Ordering::SeqCst);
    assert_times_out(&store, &check, timeout).await;
    proxy.frozen.store(false, Ordering::SeqCst);

    // The timed-out check reached Redis once the proxy thawed: it was
    // charged (a timeout never gives a request away). Later answers are
    // matched to their own requests, not shifted by the late one.
    let decision = patient.check(&check).await.expect("after the stall");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 7);
    let decision = patient.check(&check).await.expect("after the stall");
    assert_eq!(decision.remaining, 6);
}

#[tokio::test]
async fn refused_connection_fails_fast_and_reconnects_later() {
    let upstream = redis_url();
    // A port with nothing on it (for now).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let store = RedisStorage::from_url(&format!("redis://127.0.0.1:{port}/"))
        .expect("store")
        .timeout(Duration::from_secs(2));
    let tier = unique("refused");
    let check = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1);
    for _ in 0..2 {
        let started = Instant::now();
        let result = store.check(&check).await;
        assert!(
            matches!(result, Err(StorageError::Backend(_))),
            "expected a backend error, got {result:?}"
        );
        // No redis-rs retries with back-off: well within the 2 s timeout.
        assert!(started.elapsed() < Duration::from_millis(500));
    }

    // Redis comes up at that address: the same store reconnects.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .expect("bind the same port again");
    let _proxy = Proxy::on(listener, &upstream);
    // The first check reconnects: the stale "refused" the connection
    // manager kept from the outage is retried once, within the timeout.
    let decision = store.check(&check).await.expect("reconnected");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 9);
}

#[test]
fn from_url_outside_a_runtime_is_an_error_not_a_panic() {
    let result = RedisStorage::from_url("redis://127.0.0.1:6390/");
    assert!(
        matches!(&result, Err(StorageError::Backend(e)) if e.to_string().contains("Tokio runtime")),
        "{result:?}"
    );
}

#[tokio::test]
async fn from_url_reads_what_redis_rs_reads() {
    for url in [
        "redis://127.0.0.1:6390/",
        "redis://:password@127.0.0.1:6390/2",
        "redis://user:password@localhost/",
        "redis+unix:///tmp/redis.sock",
    ] {
        assert!(RedisStorage::from_url(url).is_ok(), "{url}");
    }
    for url in ["", "not a url", "http://127.0.0.1/", "redis://127.0.0.1/x"] {
        assert!(
            matches!(
                RedisStorage::from_url(url),
                Err(StorageError::Backend(_))
            ),
            "{url}"
        );
    }
}

// ---------------------------------------------------------------------------
// A fake Redis that records commands and answers with a function of them.

struct FakeRedis {
    url: String,
    commands: Arc<Mutex<Vec<Vec<String>>>>,
}

impl FakeRedis {
    fn start(
        reply: impl Fn(&[String]) -> Vec<u8> + Send + Sync + 'static,
    ) -> FakeRedis {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let commands = Arc::new(Mutex::new(Vec::new()));
        let (log, reply) = (commands.clone(), Arc::new(reply));
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (log, reply) = (log.clone(), reply.clone());
                thread::spawn(move || {
                    let mut writer = stream.try_clone().expect("clone");
                    let mut reader = BufReader::new(stream);
                    while let Ok(Some(command)) = read_command(&mut reader) {
                        let answer = reply(&command);
                        log.lock().expect("log").push(command);
                        if writer.write_all(&answer).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeRedis {
            url: format!("redis://127.0.0.1:{port}/"),
            commands,
        }
    }

    fn commands(&self) -> Vec<Vec<String>> {
        self.commands.lock().expect("log").clone()
    }
}

/// One RESP command (an array of bulk strings), or `None` at end of stream.
fn read_command(reader: &mut impl BufRead) -> io::Result<Option<Vec<String>>> {
    fn bad(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
    }
    fn header(
        reader: &mut impl BufRead,
        prefix: char,
    ) -> io::Result<Option<usize>> {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let count = line
            .trim_end()
            .strip_prefix(prefix)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad("not a RESP header"))?;
        Ok(Some(count))
    }
    let Some(count) = header(reader, '*')? else {
        return Ok(None);
    };
    let mut command = Vec::with_capacity(count);
    for _ in 0..count {
        let len = header(reader, '$')?.ok_or_else(|| bad("truncated"))?;
        let mut bytes = vec![0; len + 2];
        reader.read_exact(&mut bytes)?;
        bytes.truncate(len);
        command.push(String::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?);
    }
    Ok(Some(command))
}
