//! The config reloads on change (an edit, a rename over the file, a
//! ConfigMap's link swap); a broken config is reported and the old one
//! keeps serving. The shutdown lets requests in flight finish.
//!
//! The waits here are real file-system watches (polled every 20 ms, up to
//! 5 s), the point of these tests.

mod support;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use gcra_core::Decision;
use rate_tier_service::{Service, ServiceOptions, StoreChoice};
use rate_tier_storage::{Answer, Mode, StorageExt};
use rate_tier_storage::{
    BucketCheck, Decided, MemoryStorage, Storage, StorageError,
};
use support::*;
use tokio::sync::Semaphore;

const WATCH: Duration = Duration::from_secs(5);

async fn start(path: &Path) -> rate_tier_service::Running {
    let mut options = ServiceOptions::new(path);
    options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
    options.http_addr = "127.0.0.1:0".parse().expect("addr");
    options.reload_debounce = Duration::from_millis(50);
    Service::start(options).await.expect("starts")
}

/// One decision for `key=value` in `domain`.
async fn decide(
    running: &rate_tier_service::Running,
    domain: &str,
    key: &str,
    value: &str,
) -> RateLimitResponse {
    client(running.grpc_addr())
        .await
        .should_rate_limit(request(domain, vec![desc(&[(key, value)])]))
        .await
        .expect("a decision")
        .into_inner()
}

/// The name of the rule that `key=ana` gets in `domain`, if any.
async fn rule_of(
    running: &rate_tier_service::Running,
    domain: &str,
    key: &str,
) -> Option<String> {
    decide(running, domain, key, "ana").await.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.name.clone())
}

/// The code of one decision for `key=value` in `domain`.
async fn code_of(
    running: &rate_tier_service::Running,
    domain: &str,
    key: &str,
    value: &str,
) -> i32 {
    decide(running, domain, key, value).await.overall_code
}

fn rules(domain: &str, key: &str, name: &str) -> String {
    config(
        domain,
        &format!(
            "  - key: {key}\n    rate_limit: {{name: {name}, unit: hour, requests_per_unit: 5}}\n"
        ),
    )
}

/// Replaces `path` the way editors and deploy tools do: a new file, renamed
/// over the old one.
fn rename_over(path: &Path, text: &str) {
    let temp = path.with_file_name(".incoming.tmp");
    std::fs::write(&temp, text).expect("write");
    std::fs::rename(&temp, path).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_reloads_and_a_broken_file_keeps_the_old_config() {
    let dir = TempDir::new();
    let domain = unique("reload");
    let file = dir.write("config.yaml", &rules(&domain, "a", "first"));
    let running = start(dir.path()).await;
    assert_eq!(
        rule_of(&running, &domain, "a").await.as_deref(),
        Some("first")
    );

    // An edit in place.
    std::fs::write(&file, rules(&domain, "b", "second")).expect("write");
    assert!(
        eventually(WATCH, || async {
            rule_of(&running, &domain, "b").await.as_deref() == Some("second")
        })
        .await,
        "the edit was reloaded"
    );

    // A rename over the file.
    rename_over(&file, &rules(&domain, "c", "third"));
    assert!(
        eventually(WATCH, || async {
            rule_of(&running, &domain, "c").await.as_deref() == Some("third")
        })
        .await,
        "the rename was reloaded"
    );

    // A broken file: reported, counted, and the old config stays.
    rename_over(
        &file,
        "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight}\n",
    );
    let http_addr = running.http_addr();
    assert!(
        eventually(WATCH, || async {
            let m = http(http_addr, "GET", "/metrics", b"").await.body;
            metric(&m, "ratelimit_service_config_load_total{result=\"error\"}")
                .is_some_and(|n| n >= 1.0)
        })
        .await,
        "the broken config was seen"
    );
    assert_eq!(
        rule_of(&running, &domain, "c").await.as_deref(),
        Some("third")
    );
    assert!(!running.reload().await, "still broken: nothing changes");

    // A new file beside it, then the fix.
    dir.write("more.yaml", &rules(&unique("other"), "z", "z"));
    rename_over(&file, &rules(&domain, "d", "fourth"));
    assert!(
        eventually(WATCH, || async {
            rule_of(&running, &domain, "d").await.as_deref() == Some("fourth")
        })
        .await,
        "the fixed config was reloaded"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_directory_keeps_the_running_config_until_files_return() {
    let dir = TempDir::new();
    let domain = unique("emptied");
    let file = dir.write("config.yaml", &rules(&domain, "a", "first"));
    let running = start(dir.path()).await;
    for _ in 0..5 {
        assert_eq!(code_of(&running, &domain, "a", "bob").await, OK);
    }
    assert_eq!(code_of(&running, &domain, "a", "bob").await, OVER_LIMIT);

    // A deploy removes the files before it writes the new ones.
    std::fs::remove_file(&file).expect("rm");
    let http_addr = running.http_addr();
    let kept = || async {
        let m = http(http_addr, "GET", "/metrics", b"").await.body;
        metric(
            &m,
            "ratelimit_service_config_load_total{result=\"kept_empty\"}",
        )
        .is_some_and(|n| n >= 1.0)
    };
    assert!(
        eventually(WATCH, || async {
            kept().await || rule_of(&running, &domain, "a").await.is_none()
        })
        .await,
        "the reload never saw the empty directory"
    );
    assert_eq!(
        rule_of(&running, &domain, "a").await.as_deref(),
        Some("first"),
        "an empty directory switched the rules off"
    );
    assert_eq!(
        code_of(&running, &domain, "a", "bob").await,
        OVER_LIMIT,
        "still limiting"
    );
    assert!(kept().await, "counted as kept");
    assert!(
        !running.reload().await,
        "an empty directory changes nothing"
    );

    // The files return: reloaded.
    let file = dir.write("config.yaml", &rules(&domain, "a", "second"));
    assert!(
        eventually(WATCH, || async {
            rule_of(&running, &domain, "a").await.as_deref() == Some("second")
        })
        .await,
        "the returned files were reloaded"
    );
    assert_eq!(code_of(&running, &domain, "a", "bob").await, OVER_LIMIT);

    // Emptiness said on purpose: a domain with no descriptors.
    rename_over(&file, &format!("domain: {domain}\n"));
    assert!(
        eventually(WATCH, || async {
            rule_of(&running, &domain, "a").await.is_none()
        })
        .await,
        "an explicit empty config is installed"
    );
    assert_eq!(code_of(&running, &domain, "a", "bob").await, OK);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_config_directory_does_not_start_but_an_explicit_one_does() {
    let dir = TempDir::new();
    dir.write(".hidden.yaml", "domain: skipped\n");
    let mut options = ServiceOptions::new(dir.path());
    options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
    options.http_addr = "127.0.0.1:0".parse().expect("addr");
    let error = Service::start(options.clone())
        .await
        .expect_err("no rules: refused");
    let shown = error.to_string();
    assert!(shown.contains("no config file found"), "{shown}");
    assert!(shown.contains("domain:"), "names the explicit way: {shown}");

    dir.write("none.yaml", "domain: none\n");
    let running = Service::start(options).await.expect("explicit: starts");
    assert_eq!(code_of(&running, "none", "a", "bob").await, OK);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_file_reloads_after_a_rename_over_it() {
    let dir = TempDir::new();
    let domain = unique("file");
    let file = dir.write("rl.yaml", &rules(&domain, "a", "first"));
    let running = start(&file).await;
    assert_eq!(
        rule_of(&running, &domain, "a").await.as_deref(),
        Some("first")
    );
    rename_over(&file, &rules(&domain, "b", "second"));
    assert!(
        eventually(WATCH, || async {
            rule_of(&running, &domain, "b").await.as_deref() == Some("second")
        })
        .await
    );
    running.stop().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_update_is_seen() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new();
    let domain = unique("cm");
    dir.write("..v1/config.yaml", &rules(&domain, "a", "first"));
    symlink("..v1", dir.path().join("..data")).expect("link");
    symlink("..data/config.yaml", dir.path().join("config.yaml"))
        .expect("link");
    let running = start(dir.path()).await;
    assert_eq!(
        rule_of(&running, &domain, "a").await.as_deref(),
        Some("first")
    );

    // Kubernetes: a new directory, a new link renamed over `..data`.
    dir.write("..v2/config.yaml", &rules(&domain, "b", "second"));
    symlink("..v2", dir.path().join("..data_tmp")).expect("link");
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data"))
        .expect("swap");
    std::fs::remove_dir_all(dir.path().join("..v1")).expect("rm");
    assert!(
        eventually(WATCH, || async {
            rule_of(&running, &domain, "b").await.as_deref() == Some("second")
        })
        .await
    );
    running.stop().await;
}

/// Whether a new connection to `addr` gets an answer (within 500 ms: a
/// real network timeout).
async fn served(addr: std::net::SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request =
        b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return false;
    }
    let mut buf = [0_u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await,
        Ok(Ok(n)) if n > 0
    )
}

/// A store that holds each check until the test lets it go.
#[derive(Debug)]
struct Gate {
    inner: MemoryStorage,
    entered: Semaphore,
    release: Semaphore,
}

impl Gate {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.entered.add_permits(1);
        self.release.acquire().await.expect("open").forget();
        self.inner.check(checks, out).await
    }
}

impl Storage for Gate {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_requests_in_flight_finish() {
    let gate = Arc::new(Gate {
        inner: MemoryStorage::new(),
        entered: Semaphore::new(0),
        release: Semaphore::new(0),
    });
    let dir = TempDir::new();
    let domain = unique("drain");
    dir.write("c.yaml", &rules(&domain, "a", "first"));
    let mut options = ServiceOptions::new(dir.path());
    options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
    options.http_addr = "127.0.0.1:0".parse().expect("addr");
    options.store = StoreChoice::Custom(gate.clone());
    let running = Service::start(options).await.expect("starts");

    let mut grpc = client(running.grpc_addr()).await;
    let in_flight_grpc = tokio::spawn({
        let domain = domain.clone();
        async move {
            grpc.should_rate_limit(request(
                &domain,
                vec![desc(&[("a", "ana")])],
            ))
            .await
        }
    });
    let http_addr = running.http_addr();
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"a","value":"bea"}}]}}]}}"#
    );
    let in_flight_json = tokio::spawn(async move {
        http(http_addr, "POST", "/json", body.as_bytes()).await
    });
    // Both are inside the store now.
    gate.entered.acquire_many(2).await.expect("open").forget();

    running.shutdown().await;
    // The accept loops see the signal on their next poll, so a connection
    // made in the same instant may still be taken; soon none is.
    let closed = tokio::time::timeout(TEST_TIMEOUT, async {
        while served(http_addr).await {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "no new request is served once the shutdown began"
    );
    gate.release.add_permits(2);
    let grpc = in_flight_grpc.await.expect("no panic").expect("answered");
    assert_eq!(grpc.into_inner().statuses[0].limit_remaining, 4);
    let json = in_flight_json.await.expect("no panic");
    assert_eq!(json.status, 200, "{json:?}");
    tokio::time::timeout(TEST_TIMEOUT, running.wait())
        .await
        .expect("both servers stop once the requests are done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_of_events_starves_neither_the_reload_nor_the_shutdown()
{
    // Regression: a quiet period that waits for a pause in the events never
    // ends while a file beside the config is written every few ms: the
    // reload would never come, and the task would never see the shutdown.
    let dir = TempDir::new();
    let domain = unique("stream");
    let file = dir.write("config.yaml", &rules(&domain, "a", "first"));
    let running = start(dir.path()).await;
    // Hidden: not a config file (as upstream, files starting with a dot
    // are skipped), but every write is an event in the watched directory.
    let noise = dir.path().join(".noise.log");
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let writing = writing.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let _ = std::fs::write(&noise, n.to_string());
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    std::fs::write(&file, rules(&domain, "b", "second")).expect("write");
    let started = std::time::Instant::now();
    while rule_of(&running, &domain, "b").await.as_deref() != Some("second") {
        assert!(started.elapsed() < WATCH, "never reloaded under the stream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 50 ms debounce, at most 10 of them: well before the 5 s bound.
    println!(
        "reloaded {:?} after the edit, under a stream of events",
        started.elapsed()
    );
    let stopping = std::time::Instant::now();
    tokio::time::timeout(WATCH, running.shutdown())
        .await
        .expect("the shutdown finished under the stream");
    println!("shut down in {:?}", stopping.elapsed());
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.join().expect("writer");
}
