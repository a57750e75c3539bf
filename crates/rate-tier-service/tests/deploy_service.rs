//! The service as an orchestrator runs it: configured by envoyproxy/
//! ratelimit's environment alone, its debug listener, and the drain on
//! SIGTERM (health not serving at once, requests answered for the drain,
//! then the listeners close) that lets a rolling restart lose no call.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const RULE: &str = "  - key: remote_address\n    rate_limit: {name: per_address, unit: minute, requests_per_unit: 60}\n";

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One decision on `/json` for an address.
async fn decide_json(http: SocketAddr, domain: &str) -> HttpResponse {
    decide_json_for(http, domain, "10.0.0.1").await
}

async fn decide_json_for(
    http: SocketAddr,
    domain: &str,
    address: &str,
) -> HttpResponse {
    let body = json!({
        "domain": domain,
        "descriptors": [{"entries": [{"key": "remote_address", "value": address}]}],
    });
    http_with(http, "POST", "/json", &[], body.to_string().as_bytes()).await
}

/// One decision on gRPC for an address: its overall code.
async fn decide_grpc(port: u16, domain: &str, address: &str) -> i32 {
    support::client(loopback(port))
        .await
        .should_rate_limit(request(
            domain,
            vec![desc(&[("remote_address", address)])],
        ))
        .await
        .expect("a decision")
        .into_inner()
        .overall_code
}

/// A server's reply that is one number (`DBSIZE`, a `count(*)`).
fn count<E: std::fmt::Debug>(reply: Result<String, E>) -> u64 {
    reply.expect("a reply").trim().parse().expect("a count")
}

/// Ports for one instance: HTTP, gRPC, debug.
struct Ports {
    http: u16,
    grpc: u16,
    debug: u16,
}

impl Ports {
    fn free() -> Ports {
        Ports {
            http: free_port(),
            grpc: free_port(),
            debug: free_port(),
        }
    }
}

/// The binary with nothing but envoyproxy/ratelimit's environment: the
/// rules under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
fn from_environment(
    root: &TempDir,
    ports: &Ports,
    extra: &[(&str, &str)],
) -> Child {
    let command =
        std::process::Command::new(env!("CARGO_BIN_EXE_rate-tier-service"));
    with_environment(command, root, ports, extra)
}

/// [`from_environment`], the binary on CPU 0 alone (`taskset -c 0`), as a
/// container of one CPU runs it.
fn on_one_cpu(root: &TempDir, ports: &Ports, extra: &[(&str, &str)]) -> Child {
    let mut command = std::process::Command::new("taskset");
    command.args(["-c", "0", env!("CARGO_BIN_EXE_rate-tier-service")]);
    with_environment(command, root, ports, extra)
}

fn with_environment(
    mut command: std::process::Command,
    root: &TempDir,
    ports: &Ports,
    extra: &[(&str, &str)],
) -> Child {
    command
        .env_clear()
        .env("HOST", "127.0.0.1")
        .env("PORT", ports.http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", ports.grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", ports.debug.to_string())
        .env("RUNTIME_ROOT", root.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("USE_STATSD", "false")
        .env("LOG_LEVEL", "warn");
    for (name, value) in extra {
        command.env(name, value);
    }
    Child::new(&mut command)
}

/// Waits until the health check on `web` says not serving.
async fn until_draining(web: SocketAddr) {
    let draining = eventually(Duration::from_secs(5), || async {
        http(web, "GET", "/healthcheck", b"").await.status == 503
    })
    .await;
    assert!(draining, "health turns to 503");
}

/// Waits until `child` exits (`what` says why it should).
async fn until_exited(child: &mut Child, what: &str) {
    let exited = eventually(Duration::from_secs(20), || {
        let exited = child.exited();
        async move { exited.is_some() }
    })
    .await;
    assert!(exited, "{what}");
}

fn rules_in(root: &TempDir, domain: &str) {
    root.write("ratelimit/config/config.yaml", &config(domain, RULE));
}

#[tokio::test]
async fn envoyproxy_s_environment_alone_starts_the_service() {
    let root = TempDir::new();
    let domain = unique("d");
    rules_in(&root, &domain);
    let ports = Ports::free();
    let child = from_environment(&root, &ports, &[("SHADOW_MODE", "false")]);
    until_listening(ports.http).await;
    until_listening(ports.debug).await;

    let web = loopback(ports.http);
    assert_eq!(http(web, "GET", "/healthcheck", b"").await.status, 200);
    let decided = decide_json(web, &domain).await;
    assert_eq!(decided.status, 200, "{decided:?}");
    let body: Value = serde_json::from_str(&decided.body).expect("JSON");
    assert_eq!(body["overallCode"], "OK");
    assert_eq!(body["statuses"][0]["limitRemaining"], 59);

    // The same rules on gRPC.
    assert_eq!(decide_grpc(ports.grpc, &domain, "10.0.0.2").await, OK);

    // The debug listener: the rules as envoyproxy/ratelimit prints them.
    let debug = loopback(ports.debug);
    let rlconfig = http(debug, "GET", "/rlconfig", b"").await;
    assert_eq!(rlconfig.status, 200);
    assert_eq!(
        rlconfig.body,
        format!(
            "{domain}.remote_address: unit=MINUTE requests_per_unit=60, shadow_mode: false, quota_mode: false\n"
        )
    );
    assert_eq!(http(debug, "GET", "/healthcheck", b"").await.status, 200);
    let index = http(debug, "GET", "/", b"").await.body;
    assert!(index.contains("/rlconfig"), "{index}");
    let stderr = child.stop();
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

/// Starts the binary with `env` and waits for it to stop at start: its
/// exit code and what it said.
async fn start_up_error(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let root = TempDir::new();
    rules_in(&root, "d");
    let mut child = from_environment(&root, &Ports::free(), env);
    until_exited(&mut child, "it stops at start").await;
    let code = child.exited().expect("exited").code();
    (code, child.stop())
}

#[tokio::test]
async fn a_variable_for_what_the_service_cannot_do_stops_it_at_start() {
    // A client certificate (mutual TLS) is not supported: refused, never
    // ignored.
    let (code, stderr) =
        start_up_error(&[("REDIS_TLS_CLIENT_CERT", "/etc/client.pem")]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("REDIS_TLS_CLIENT_CERT"), "{stderr}");
}

/// SIGTERM to the instance `start` starts (on free ports, with `domain`'s
/// rules, `DRAIN_PERIOD=3s`): health says not serving at once on both
/// listeners while every request is still answered, then it exits with
/// success and its listeners are closed. What it said.
async fn drains_then_closes(
    start: fn(&TempDir, &Ports, &[(&str, &str)]) -> Child,
) -> String {
    let root = TempDir::new();
    let domain = unique("d");
    rules_in(&root, &domain);
    let ports = Ports::free();
    let mut child = start(
        &root,
        &ports,
        &[("DRAIN_PERIOD", "3s"), ("LOG_LEVEL", "info")],
    );
    until_listening(ports.http).await;
    let web = loopback(ports.http);

    child.terminate();
    // Health says not serving at once, on both listeners ...
    until_draining(web).await;
    assert_eq!(
        http(loopback(ports.debug), "GET", "/healthcheck", b"")
            .await
            .status,
        503
    );
    // ... while every request is still answered.
    let decided = decide_json(web, &domain).await;
    assert_eq!(decided.status, 200, "{decided:?}");
    assert_eq!(decide_grpc(ports.grpc, &domain, "10.0.0.3").await, OK);

    // Then it stops by itself, with success, and its listeners are closed.
    until_exited(&mut child, "it exits after the drain").await;
    assert!(child.exited().expect("exited").success());
    assert!(tokio::net::TcpStream::connect(web).await.is_err());
    let stderr = child.stop();
    assert!(stderr.contains("draining"), "{stderr}");
    stderr
}

#[tokio::test]
async fn sigterm_drains_then_closes() {
    let stderr = drains_then_closes(from_environment).await;
    assert!(stderr.contains("running on "), "{stderr}");
}

/// On one CPU the service runs on one thread, a current-thread runtime:
/// it serves, drains and stops as on several.
#[tokio::test]
async fn on_one_cpu_it_runs_on_one_thread_and_drains_the_same() {
    let stderr = drains_then_closes(on_one_cpu).await;
    assert!(
        stderr.contains("running on 1 thread (a current-thread runtime)"),
        "{stderr}"
    );
}

/// `TOKIO_WORKER_THREADS` (Tokio's variable) sets the threads; a value
/// that is not a number of threads stops it at start, named.
#[tokio::test]
async fn tokio_worker_threads_sets_the_threads() {
    let root = TempDir::new();
    rules_in(&root, "d");
    let ports = Ports::free();
    let child = from_environment(
        &root,
        &ports,
        &[("TOKIO_WORKER_THREADS", "3"), ("LOG_LEVEL", "info")],
    );
    until_listening(ports.http).await;
    let stderr = child.stop();
    assert!(stderr.contains("running on 3 threads"), "{stderr}");

    for bad in ["0", "many"] {
        let (code, stderr) =
            start_up_error(&[("TOKIO_WORKER_THREADS", bad)]).await;
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("TOKIO_WORKER_THREADS"), "{stderr}");
    }
}

#[tokio::test]
async fn a_second_signal_ends_the_drain() {
    let root = TempDir::new();
    rules_in(&root, "d");
    let ports = Ports::free();
    let mut child = from_environment(&root, &ports, &[("DRAIN_PERIOD", "1h")]);
    until_listening(ports.http).await;
    let web = loopback(ports.http);
    child.terminate();
    until_draining(web).await;
    child.terminate();
    until_exited(&mut child, "it stops long before its hour of drain").await;
    assert!(child.exited().expect("exited").success());
}

/// A rolling restart as Kubernetes does it: the balancer sends each call
/// to an instance whose last health probe passed; the old instance gets
/// SIGTERM. Every call is answered.
#[tokio::test]
async fn a_drained_rolling_restart_loses_no_call() {
    let root = TempDir::new();
    let domain = unique("d");
    rules_in(&root, &domain);
    let (old_ports, new_ports) = (Ports::free(), Ports::free());
    let mut old =
        from_environment(&root, &old_ports, &[("DRAIN_PERIOD", "2s")]);
    let new = from_environment(&root, &new_ports, &[("DRAIN_PERIOD", "2s")]);
    until_listening(old_ports.http).await;
    until_listening(new_ports.http).await;
    let (old_http, new_http) =
        (loopback(old_ports.http), loopback(new_ports.http));

    let mut old_ready = true;
    let (mut on_old, mut on_new) = (0, 0);
    old.terminate();
    let mut calls = 0;
    while old.exited().is_none() || calls < 50 {
        calls += 1;
        // The readiness probe, every 20 calls (a few milliseconds here;
        // Kubernetes probes every few seconds, and a drain is longer):
        // in between, calls go where the last probe said. Without the
        // drain, the calls between SIGTERM and the next probe would find
        // the old listener closed.
        if old_ready && calls % 20 == 0 {
            let probe = tokio::net::TcpStream::connect(old_http).await.is_ok()
                && http(old_http, "GET", "/healthcheck", b"").await.status
                    == 200;
            old_ready = probe;
        }
        let target = if old_ready { old_http } else { new_http };
        // An address per call: each is allowed, so a failure is a lost call.
        let address = format!("10.1.{}.{}", calls / 256, calls % 256);
        let decided = decide_json_for(target, &domain, &address).await;
        assert_eq!(
            decided.status, 200,
            "call {calls} to {target}: {decided:?}"
        );
        if old_ready {
            on_old += 1;
        } else {
            on_new += 1;
        }
        assert!(calls < 60_000, "the old instance never exits");
    }
    assert!(old.exited().expect("exited").success());
    assert!(
        on_new > 0,
        "the new instance took over ({on_old} on the old)"
    );
    drop(new);
}

/// The library's form: `Running::stop_serving` turns health off (HTTP and
/// gRPC) and keeps answering until `shutdown`.
#[tokio::test]
async fn stop_serving_turns_health_off_and_keeps_answering() {
    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;
    svc.running.stop_serving().await;
    assert_eq!(
        http(svc.http(), "GET", "/healthcheck", b"").await.status,
        503
    );
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Channel::from_shared(format!(
            "http://{}",
            svc.grpc()
        ))
        .expect("uri")
        .connect()
        .await
        .expect("connect"),
    );
    for service in ["", "ratelimit"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health answers")
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::NotServing
                as i32,
            "{service:?}"
        );
    }
    let decided = decide_json(svc.http(), &svc.domain).await;
    assert_eq!(decided.status, 200, "{decided:?}");
    assert_eq!(
        svc.ask(vec![desc(&[("remote_address", "10.0.0.4")])])
            .await
            .overall_code,
        OK
    );
    let http_addr = svc.http();
    svc.running.stop().await;
    assert!(tokio::net::TcpStream::connect(http_addr).await.is_err());
}

/// `REDIS_TLS` and `REDIS_TLS_CACERT`: the limits shared through a Redis
/// that speaks TLS only on its port, its certificate signed by a CA the
/// test makes.
#[tokio::test]
async fn envoyproxy_s_redis_tls_settings_share_the_limits_through_tls() {
    let ca = rate_tier_test_support::TestCa::generate().expect("a test CA");
    let (redis, tls_port) =
        rate_tier_test_support::RedisServer::try_start_tls(&ca)
            .unwrap_or_else(|e| panic!("{e}"));
    let root = TempDir::new();
    let domain = unique("d");
    rules_in(&root, &domain);
    let ports = Ports::free();
    let ca_file = ca.ca_file();
    let redis_url = format!("127.0.0.1:{tls_port}");
    let child = from_environment(
        &root,
        &ports,
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", ca_file.to_str().expect("UTF-8")),
        ],
    );
    until_listening(ports.http).await;
    let web = loopback(ports.http);
    for remaining in [59, 58] {
        let decided = decide_json(web, &domain).await;
        let body: Value = serde_json::from_str(&decided.body).expect("JSON");
        assert_eq!(
            body["statuses"][0]["limitRemaining"], remaining,
            "{decided:?}"
        );
    }
    // The bucket is in that Redis: decided there, through TLS (a decision
    // made locally, by the fallback, would write nothing).
    let keys = count(redis.command(&["DBSIZE"]));
    assert!(keys >= 1, "{keys} keys");
    let stderr = child.stop();
    assert!(!stderr.contains("breaker"), "{stderr}");
}

#[tokio::test]
async fn a_redis_ca_file_that_cannot_be_read_stops_it_at_start() {
    let (code, stderr) = start_up_error(&[
        ("REDIS_URL", "127.0.0.1:6380"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", "/nonexistent/ca.pem"),
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("/nonexistent/ca.pem"), "{stderr}");
}

/// PostgreSQL over TLS: `sslmode=verify-full` and `sslrootcert` in the
/// connection string, for `migrate` and for the service, against a server
/// with `ssl = on` whose certificate a CA made by the test signed.
#[tokio::test]
async fn postgres_verify_full_shares_the_limits_through_tls() {
    let ca = rate_tier_test_support::TestCa::generate().expect("a test CA");
    let mut server = rate_tier_test_support::PostgresServer::start();
    server.enable_tls(&ca).expect("TLS on");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url(),
        ca.ca_file().display()
    );
    let migrated = binary()
        .args(["migrate", "--postgres", &url])
        .output()
        .expect("runs");
    assert!(migrated.status.success(), "{migrated:?}");

    let root = TempDir::new();
    let domain = unique("d");
    rules_in(&root, &domain);
    let ports = Ports::free();
    let child = from_environment(&root, &ports, &[("POSTGRES_URL", &url)]);
    until_listening(ports.http).await;
    for remaining in [59, 58] {
        let decided = decide_json(loopback(ports.http), &domain).await;
        let body: Value = serde_json::from_str(&decided.body).expect("JSON");
        assert_eq!(
            body["statuses"][0]["limitRemaining"], remaining,
            "{decided:?}"
        );
    }
    let tls = count(server.psql("SELECT count(*) FROM pg_stat_ssl WHERE ssl"));
    assert!(tls >= 1, "the service's connections are TLS");
    let stderr = child.stop();
    assert!(!stderr.contains("breaker"), "{stderr}");
}
