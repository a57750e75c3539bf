//! The admin API (`--admin ADDR --admin-token-file FILE`): reset, peek and
//! the rules, behind a bearer token, on a listener of its own.
//!
//! The memory tests run with `cargo test`; the `redis_` and `postgres_`
//! ones need `cargo xtask test-redis -- -p rate-tier-service --test
//! admin_api`, which sets `TRT_REDIS_URL` and `TRT_POSTGRES_URL` (they fail
//! without it, never pass silently). Tokens are made here, at test
//! time, into temporary files.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use rate_tier_service::{
    AdminOptions, Running, Service, ServiceOptions, StartError, StoreChoice,
};
use serde_json::{Value, json};
use support::*;

const RULES: &str = concat!(
    "  - key: user\n",
    "    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}\n",
    "  - key: plan\n",
    "    value: free\n",
    "    descriptors:\n",
    "      - key: user\n",
    "        rate_limit: {unit: hour, requests_per_unit: 5}\n",
    "  - key: open\n",
    "    rate_limit: {unlimited: true}\n",
    "  - key: quiet\n",
    "    shadow_mode: true\n",
    "    rate_limit: {unit: second, requests_per_unit: 1}\n",
);

/// A service with its admin API on loopback port 0.
struct Admin {
    running: Running,
    _dir: TempDir,
    domain: String,
    token: String,
}

fn token() -> String {
    format!("{}-admin-secret", unique("tok"))
}

/// A service over `store` in `domain`, with the admin API.
async fn start_in(store: StoreChoice, domain: &str) -> Admin {
    let dir = TempDir::new();
    dir.write("config.yaml", &config(domain, RULES));
    let token = token();
    // Trimmed: the newline of an `echo` is not part of the token.
    let token_file = dir.write("admin-token", &format!("  {token}\n"));
    let mut options = ServiceOptions::new(dir.path().join("config.yaml"));
    options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
    options.http_addr = "127.0.0.1:0".parse().expect("addr");
    options.store = store;
    options.redis_timeout = TEST_TIMEOUT;
    options.watch = false;
    options.admin = Some(AdminOptions {
        addr: "127.0.0.1:0".parse().expect("addr"),
        token_file,
    });
    let running = Service::start(options).await.expect("the service starts");
    Admin {
        running,
        _dir: dir,
        domain: domain.to_owned(),
        token,
    }
}

async fn start(store: StoreChoice) -> Admin {
    start_in(store, &unique("admin")).await
}

fn redis() -> StoreChoice {
    StoreChoice::Redis(rate_tier_test_support::redis_url())
}

/// PostgreSQL as `--postgres URL` chooses it, its table migrated first.
fn on_postgres() -> StoreChoice {
    drop(support::postgres());
    StoreChoice::Postgres(rate_tier_test_support::env::postgres_url())
}

/// The `/json` (and admin) body of one descriptor.
fn body(domain: &str, entries: &[(&str, &str)]) -> Vec<u8> {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    json!({"domain": domain, "descriptors": [{"entries": entries}]})
        .to_string()
        .into_bytes()
}

impl Admin {
    fn addr(&self) -> SocketAddr {
        self.running.admin_addr().expect("the admin API is served")
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// A call to the admin API with this `authorization` header (or none).
    async fn call(
        &self,
        method: &str,
        path: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> HttpResponse {
        let headers: Vec<(&str, &str)> = authorization
            .map(|a| vec![("authorization", a)])
            .unwrap_or_default();
        http_with(self.addr(), method, path, &headers, body).await
    }

    /// A call with the right token; the answer's JSON.
    async fn admin(&self, method: &str, path: &str, body: &[u8]) -> Value {
        let response =
            self.call(method, path, Some(&self.bearer()), body).await;
        assert_eq!(response.status, 200, "{response:?}");
        assert!(
            response
                .headers
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{response:?}"
        );
        serde_json::from_str(&response.body).expect("JSON")
    }

    /// A decision on the public `/json`: its status (200 or 429).
    async fn decide(&self, entries: &[(&str, &str)]) -> u16 {
        http(
            self.running.http_addr(),
            "POST",
            "/json",
            &body(&self.domain, entries),
        )
        .await
        .status
    }
}

const ANA: &[(&str, &str)] = &[("user", "ana")];

/// Spends `user=ana`'s 2 per minute: the next decision is refused.
async fn spend(svc: &Admin) {
    assert_eq!(svc.decide(ANA).await, 200);
    assert_eq!(svc.decide(ANA).await, 200);
    assert_eq!(svc.decide(ANA).await, 429);
}

async fn reset_passes_a_limited_descriptor_again(svc: &Admin) {
    spend(svc).await;
    let bob = [("user", "bob")];
    assert_eq!(svc.decide(&bob).await, 200);
    let answer = svc
        .admin("POST", "/admin/reset", &body(&svc.domain, ANA))
        .await;
    assert_eq!(
        answer,
        json!({
            "descriptors_reset": 1,
            "descriptors": [{
                "limit": {"name": "per_user", "requests_per_unit": 2, "unit": "MINUTE"},
                "unlimited": false,
                "reset": true,
            }],
        })
    );
    // Full again: two more, then refused.
    spend(svc).await;
    // Another value's bucket is its own: bob's one request still counts.
    assert_eq!(svc.decide(&bob).await, 200);
    assert_eq!(svc.decide(&bob).await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_makes_a_limited_descriptor_pass_again() {
    reset_passes_a_limited_descriptor_again(&start(StoreChoice::Memory).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_of_several_descriptors_and_what_has_no_bucket() {
    let svc = start(StoreChoice::Memory).await;
    let nested = [("plan", "free"), ("user", "ana")];
    for _ in 0..5 {
        assert_eq!(svc.decide(&nested).await, 200);
    }
    assert_eq!(svc.decide(&nested).await, 429);
    spend(&svc).await;
    let request = json!({
        "domain": svc.domain,
        "descriptors": [
            {"entries": [{"key": "plan", "value": "free"}, {"key": "user", "value": "ana"}]},
            {"entries": [{"key": "user", "value": "ana"}]},
            {"entries": [{"key": "open", "value": "x"}]},
            {"entries": [{"key": "nobody", "value": "x"}]},
        ],
    });
    let answer = svc
        .admin("POST", "/admin/reset", request.to_string().as_bytes())
        .await;
    assert_eq!(answer["descriptors_reset"], 2, "{answer}");
    let d = &answer["descriptors"];
    assert_eq!(d[0]["reset"], true);
    assert_eq!(d[0]["limit"]["name"], Value::Null);
    assert_eq!(d[0]["limit"]["unit"], "HOUR");
    assert_eq!(d[1]["reset"], true);
    assert_eq!(
        d[2],
        json!({"limit": null, "unlimited": true, "reset": false})
    );
    assert_eq!(
        d[3],
        json!({"limit": null, "unlimited": false, "reset": false})
    );
    assert_eq!(svc.decide(&nested).await, 200);
    assert_eq!(svc.decide(ANA).await, 200);
}

async fn peek_reads_without_charging(svc: &Admin) {
    let request = body(&svc.domain, ANA);
    let fresh = svc.admin("POST", "/admin/peek", &request).await;
    assert_eq!(
        fresh,
        json!({"descriptors": [{
            "code": "OK",
            "limit": {"name": "per_user", "requests_per_unit": 2, "unit": "MINUTE"},
            "unlimited": false,
            "remaining": 2,
            "reset_after_seconds": 0,
        }]})
    );
    // Peeking again charged nothing.
    assert_eq!(svc.admin("POST", "/admin/peek", &request).await, fresh);
    assert_eq!(svc.decide(ANA).await, 200);
    let after = svc.admin("POST", "/admin/peek", &request).await;
    assert_eq!(after["descriptors"][0]["remaining"], 1, "{after}");
    // 2 per minute: one comes back every 30 s, full 30 s after one spent.
    assert_eq!(
        after["descriptors"][0]["reset_after_seconds"], 30,
        "{after}"
    );
    assert_eq!(svc.decide(ANA).await, 200);
    let spent = svc.admin("POST", "/admin/peek", &request).await;
    assert_eq!(spent["descriptors"][0]["remaining"], 0, "{spent}");
    assert_eq!(
        spent["descriptors"][0]["reset_after_seconds"], 60,
        "{spent}"
    );
    assert_eq!(svc.decide(ANA).await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_reports_remaining_and_reset_without_charging() {
    let svc = start(StoreChoice::Memory).await;
    peek_reads_without_charging(&svc).await;
    // No limit, unlimited.
    let request = json!({
        "domain": svc.domain,
        "descriptors": [
            {"entries": [{"key": "open", "value": "x"}]},
            {"entries": [{"key": "nobody", "value": "x"}]},
        ],
    });
    let answer = svc
        .admin("POST", "/admin/peek", request.to_string().as_bytes())
        .await;
    assert_eq!(
        answer["descriptors"],
        json!([
            {"code": "OK", "limit": null, "unlimited": true,
             "remaining": u32::MAX, "reset_after_seconds": null},
            {"code": "OK", "limit": null, "unlimited": false,
             "remaining": null, "reset_after_seconds": null},
        ])
    );
    // Peeks are not decisions: the calls' metric counts the /json ones only.
    let metrics = http(svc.running.http_addr(), "GET", "/metrics", b"")
        .await
        .body;
    assert_eq!(
        metric(
            &metrics,
            "ratelimit_service_should_rate_limit_total{transport=\"json\",code=\"ok\"}"
        ),
        Some(2.0),
        "{metrics}"
    );
    assert!(!metrics.contains("transport=\"admin\""), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_lists_the_loaded_rules() {
    let svc = start(StoreChoice::Memory).await;
    let answer = svc.admin("GET", "/admin/rules", b"").await;
    let d = &svc.domain;
    assert_eq!(
        answer,
        json!({"rules": [
            {"domain": d, "descriptors": [{"key": "user", "value": null}],
             "path": "user", "name": "per_user", "unlimited": false,
             "requests_per_unit": 2, "unit": "MINUTE", "shadow": false, "replaces": []},
            {"domain": d,
             "descriptors": [{"key": "plan", "value": "free"}, {"key": "user", "value": null}],
             "path": "plan_free.user", "name": null, "unlimited": false,
             "requests_per_unit": 5, "unit": "HOUR", "shadow": false, "replaces": []},
            {"domain": d, "descriptors": [{"key": "open", "value": null}],
             "path": "open", "name": null, "unlimited": true,
             "requests_per_unit": null, "unit": null, "shadow": false, "replaces": []},
            {"domain": d, "descriptors": [{"key": "quiet", "value": null}],
             "path": "quiet", "name": null, "unlimited": false,
             "requests_per_unit": 1, "unit": "SECOND", "shadow": true, "replaces": []},
        ]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_answered_with_an_error() {
    let svc = start(StoreChoice::Memory).await;
    let bearer = svc.bearer();
    let auth = Some(bearer.as_str());
    for path in ["/admin/reset", "/admin/peek"] {
        let r = svc.call("POST", path, auth, b"not json").await;
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.body.contains("\"error\""), "{r:?}");
        let r = svc
            .call("POST", path, auth, &body("no-such-domain", ANA))
            .await;
        assert_eq!(r.status, 404, "{r:?}");
        let empty = json!({"domain": svc.domain, "descriptors": []});
        let r = svc
            .call("POST", path, auth, empty.to_string().as_bytes())
            .await;
        assert_eq!(r.status, 400, "{r:?}");
        let r = svc.call("GET", path, auth, b"").await;
        assert_eq!(r.status, 405, "{r:?}");
    }
    let r = svc.call("GET", "/admin/nothing", auth, b"").await;
    assert_eq!(r.status, 404, "{r:?}");
    // The public listener has no admin routes.
    let r = http(svc.running.http_addr(), "GET", "/admin/rules", b"").await;
    assert_eq!(r.status, 404, "{r:?}");
}

/// Every way of not having the token, for every endpoint: 401, a
/// `www-authenticate: Bearer` challenge, and nothing done.
async fn refusals_do_nothing(svc: &Admin) {
    spend(svc).await;
    let mut last_byte = svc.token.clone().into_bytes();
    *last_byte.last_mut().expect("a token") ^= 1;
    let last_byte = String::from_utf8(last_byte).expect("ASCII");
    let wrong = [
        None,
        Some("Bearer".to_owned()),
        Some("Bearer ".to_owned()),
        Some("Bearer wrong".to_owned()),
        Some(format!("Bearer {last_byte}")),
        // The token alone, and with a prefix of it: still not the token.
        Some(svc.token.clone()),
        Some(format!("Bearer {}", &svc.token[..svc.token.len() - 1])),
        Some(format!("Bearer {}x", svc.token)),
        Some(format!("Basic {}", svc.token)),
        Some(format!("Basic {}", base64(&format!("admin:{}", svc.token)))),
    ];
    let reset = body(&svc.domain, ANA);
    let calls: [(&str, &str, &[u8]); 4] = [
        ("POST", "/admin/reset", &reset),
        ("POST", "/admin/peek", &reset),
        ("GET", "/admin/rules", b""),
        ("GET", "/admin/nothing", b""),
    ];
    for authorization in &wrong {
        for (method, path, body) in calls {
            let r =
                svc.call(method, path, authorization.as_deref(), body).await;
            assert_eq!(r.status, 401, "{authorization:?} {path}: {r:?}");
            assert!(
                r.headers
                    .to_ascii_lowercase()
                    .contains("www-authenticate: bearer"),
                "{r:?}"
            );
            assert!(!r.body.contains("per_user"), "nothing told: {r:?}");
        }
    }
    // Still limited after every refused reset.
    assert_eq!(svc.decide(ANA).await, 429);
    // The scheme's case does not matter (RFC 7235); the token's does.
    let lower = format!("bearer {}", svc.token);
    let r = svc.call("GET", "/admin/rules", Some(&lower), b"").await;
    assert_eq!(r.status, 200, "{r:?}");
    let upper = format!("Bearer {}", svc.token.to_uppercase());
    let r = svc.call("GET", "/admin/rules", Some(&upper), b"").await;
    assert_eq!(r.status, 401, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_right_token_401_and_nothing_changes() {
    refusals_do_nothing(&start(StoreChoice::Memory).await).await;
}

/// RFC 4648 base64, for a `Basic` header.
fn base64(text: &str) -> String {
    const ALPHABET: &[u8] =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(
                    ALPHABET[(n >> (18 - 6 * i)) as usize & 63],
                ));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_admin_listener_without_admin() {
    let dir = TempDir::new();
    dir.write("config.yaml", &config("d", RULES));
    let mut options = ServiceOptions::new(dir.path());
    options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
    options.http_addr = "127.0.0.1:0".parse().expect("addr");
    options.watch = false;
    let running = Service::start(options).await.expect("starts");
    assert_eq!(running.admin_addr(), None);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_unreadable_token_file_is_a_start_up_error() {
    let dir = TempDir::new();
    dir.write("config.yaml", &config("d", RULES));
    for (file, expected) in [
        (dir.write("empty", " \n\t\n"), "is empty"),
        (dir.path().join("missing"), "cannot read"),
    ] {
        let mut options = ServiceOptions::new(dir.path().join("config.yaml"));
        options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
        options.http_addr = "127.0.0.1:0".parse().expect("addr");
        options.watch = false;
        options.admin = Some(AdminOptions {
            addr: "127.0.0.1:0".parse().expect("addr"),
            token_file: file,
        });
        let error = Service::start(options).await.expect_err("refused");
        assert!(matches!(error, StartError::AdminToken(_)), "{error}");
        assert!(error.to_string().contains(expected), "{error}");
    }
}

/// A loopback port that was free a moment ago.
/// The admin API's log lines among JSON logs.
fn admin_calls(logs: &str) -> Vec<Value> {
    logs.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "rate_tier_service::admin")
        .collect()
}

#[test]
fn admin_without_a_token_file_is_a_start_up_error() {
    let dir = TempDir::new();
    let config_file = dir.write("config.yaml", &config("d", RULES));
    let out = binary()
        .arg("--config")
        .arg(&config_file)
        .args(["--admin", "6071"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--admin needs --admin-token-file FILE"),
        "{stderr}"
    );

    let empty = dir.write("token", "\n");
    let out = binary()
        .arg("--config")
        .arg(&config_file)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(["--admin", "127.0.0.1:0", "--admin-token-file"])
        .arg(&empty)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1), "cannot start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("admin token file"), "{stderr}");
    assert!(stderr.contains("is empty"), "{stderr}");

    let help = binary().arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    for text in [
        "--admin <ADDR>",
        "--admin-token-file <FILE>",
        "POST /admin/reset",
        "POST /admin/peek",
        "GET  /admin/rules",
    ] {
        assert!(help.contains(text), "{text} in {help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_admin_api_only_when_asked_and_logs_each_call() {
    let dir = TempDir::new();
    let domain = unique("bin");
    let config_file = dir.write("config.yaml", &config(&domain, RULES));
    let token = token();
    let token_file = dir.write("token", &format!("{token}\n"));
    let (http_port, admin_port) = (free_port(), free_port());

    // Without --admin: what it says it serves has no admin API. (Read from
    // its own line: a probe of a free port races with other listeners.)
    let child = Child::new(
        binary()
            .arg("--config")
            .arg(&config_file)
            .args(["--grpc", "127.0.0.1:0"])
            .args(["--http", &format!("127.0.0.1:{http_port}")])
            .args(["--log-format", "json"]),
    );
    until_listening(http_port).await;
    let serving = |logs: &str| {
        logs.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["fields"]["message"] == "serving")
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            serving(&child.stderr()).is_some()
        })
        .await,
        "a serving line: {}",
        child.stderr()
    );
    let fields = serving(&child.stderr()).map(|line| line["fields"].clone());
    let fields = fields.unwrap_or_default();
    assert!(fields["http_addr"].is_string(), "{fields}");
    assert!(fields.get("admin_addr").is_none(), "{fields}");
    drop(child);

    // With it, a port alone (loopback), JSON logs.
    let child = Child::new(
        binary()
            .arg("--config")
            .arg(&config_file)
            .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(["--admin", &admin_port.to_string(), "--admin-token-file"])
            .arg(&token_file)
            .args(["--log-format", "json"]),
    );
    until_listening(admin_port).await;
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let bearer = format!("Bearer {token}");
    let auth = [("authorization", bearer.as_str())];
    let secret_value = "value-never-logged";
    let reset = body(&domain, &[("user", secret_value)]);
    let r = http_with(admin, "POST", "/admin/reset", &auth, &reset).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = http_with(admin, "POST", "/admin/peek", &auth, &reset).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = http_with(admin, "GET", "/admin/rules", &auth, b"").await;
    assert_eq!(r.status, 200, "{r:?}");
    let wrong = [("authorization", "Bearer nope")];
    let r = http_with(admin, "POST", "/admin/reset", &wrong, &reset).await;
    assert_eq!(r.status, 401, "{r:?}");
    // Each call is logged once answered: wait (bounded) for the fourth.
    assert!(
        eventually(Duration::from_secs(10), || async {
            admin_calls(&child.stderr()).len() >= 4
        })
        .await,
        "four admin log lines: {}",
        child.stderr()
    );
    let logs = child.stop();

    let calls = admin_calls(&logs);
    let fields: Vec<(String, String)> = calls
        .iter()
        .map(|c| {
            let f = &c["fields"];
            (
                f["endpoint"].as_str().unwrap_or_default().to_owned(),
                f["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("reset", "ok"),
        ("peek", "ok"),
        ("rules", "ok"),
        ("reset", "unauthorized"),
    ]
    .iter()
    .map(|(e, o)| ((*e).to_owned(), (*o).to_owned()))
    .collect();
    assert_eq!(fields, expected, "{logs}");
    for call in &calls {
        let caller = call["fields"]["caller"].as_str().unwrap_or_default();
        assert!(caller.starts_with("127.0.0.1:"), "{call}");
    }
    assert!(!logs.contains(secret_value), "no request value: {logs}");
    assert!(!logs.contains(&domain), "no domain: {logs}");
    assert!(!logs.contains(&token), "no token: {logs}");
    assert!(!logs.contains("nope"), "no wrong token: {logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_beyond_loopback_is_served_with_a_warning() {
    let dir = TempDir::new();
    let config_file = dir.write("config.yaml", &config("d", RULES));
    let token_file = dir.write("token", &token());
    let port = free_port();
    let child = Child::new(
        binary()
            .arg("--config")
            .arg(&config_file)
            .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(["--admin", &format!("0.0.0.0:{port}"), "--admin-token-file"])
            .arg(&token_file),
    );
    // Its own words first: a port that accepts could be another test's,
    // picked in the moment between `free_port` and the bind.
    assert!(
        eventually(Duration::from_secs(20), || async {
            child.stderr().contains("not a loopback address")
        })
        .await,
        "{}",
        child.stderr()
    );
    until_listening(port).await;
    let stderr = child.stop();
    assert!(stderr.contains("warning: --admin 0.0.0.0:"), "{stderr}");
    assert!(stderr.contains("not a loopback address"), "{stderr}");
}

// On Redis (with its fallback): the reset goes to the shared buckets, so a
// second instance on the same Redis sees it too.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reset_makes_a_limited_descriptor_pass_again() {
    reset_passes_a_limited_descriptor_again(&start(redis()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reset_on_one_instance_resets_the_shared_bucket() {
    let domain = unique("shared");
    let a = start_in(redis(), &domain).await;
    let b = start_in(redis(), &domain).await;
    spend(&a).await;
    assert_eq!(b.decide(ANA).await, 429, "one bucket");
    b.admin("POST", "/admin/reset", &body(&domain, ANA)).await;
    assert_eq!(b.decide(ANA).await, 200);
    // The shared bucket was reset: `a` reads it from Redis (a peek is
    // cheaper than the refusal it remembers, so it is asked).
    let peek = a.admin("POST", "/admin/peek", &body(&domain, ANA)).await;
    assert_eq!(peek["descriptors"][0]["remaining"], 1, "{peek}");
    // `a` forgets its remembered refusal when it is asked to reset (see
    // the admin docs: an operator resets through every instance).
    a.admin("POST", "/admin/reset", &body(&domain, ANA)).await;
    assert_eq!(a.decide(ANA).await, 200);
    assert_eq!(a.decide(ANA).await, 200);
    assert_eq!(b.decide(ANA).await, 429, "still one bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_peek_reports_remaining_and_reset_without_charging() {
    peek_reads_without_charging(&start(redis()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_the_right_token_401_and_nothing_changes() {
    refusals_do_nothing(&start(redis()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rules_are_listed() {
    let svc = start(redis()).await;
    let answer = svc.admin("GET", "/admin/rules", b"").await;
    assert_eq!(
        answer["rules"].as_array().map(Vec::len),
        Some(4),
        "{answer}"
    );
}

// On PostgreSQL (`--postgres URL`, with its fallback): the reset is one
// transaction on the shared buckets; no instance remembers a refusal, so
// the other sees it at once.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reset_makes_a_limited_descriptor_pass_again() {
    reset_passes_a_limited_descriptor_again(&start(on_postgres()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reset_on_one_instance_resets_the_shared_bucket() {
    let domain = unique("shared");
    let a = start_in(on_postgres(), &domain).await;
    let b = start_in(on_postgres(), &domain).await;
    spend(&a).await;
    assert_eq!(b.decide(ANA).await, 429, "one bucket");
    b.admin("POST", "/admin/reset", &body(&domain, ANA)).await;
    let peek = a.admin("POST", "/admin/peek", &body(&domain, ANA)).await;
    assert_eq!(peek["descriptors"][0]["remaining"], 2, "{peek}");
    // Without a reset of its own: `a` asks the store every time.
    assert_eq!(a.decide(ANA).await, 200);
    assert_eq!(b.decide(ANA).await, 200);
    assert_eq!(a.decide(ANA).await, 429, "still one bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_peek_reports_remaining_and_reset_without_charging() {
    peek_reads_without_charging(&start(on_postgres()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_the_right_token_401_and_nothing_changes() {
    refusals_do_nothing(&start(on_postgres()).await).await;
}
