//! What the service's tests share: a service on loopback port 0 with its
//! config in a throwaway directory, a tonic client built from the same
//! protos, a small HTTP/1.1 client, and a store that counts its calls.
#![allow(dead_code, unreachable_pub, unused_macros)]

/// One `#[tokio::test]` per semantic in [`semantics`], on `$backend`: the
/// same list for every store.
macro_rules! every_semantic {
    ($backend:expr) => {
        every_semantic!(@each $backend;
            remaining_and_reset_from_gcra,
            all_or_nothing,
            no_match_is_ok_without_limit,
            unlimited_touches_no_store,
            zero_refuses_everything,
            shadow_rule_answers_ok,
            global_shadow,
            hits_addend,
            cost_above_limit,
            rule_on_the_last_entry,
            wildcards_and_buckets,
            limit_override,
            replaces,
            same_bucket_twice,
            response_headers,
        );
    };
    (@each $backend:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                support::semantics::$name(&$backend).await;
            }
        )*
    };
}

pub mod semantics;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rate_tier_storage::{Adjustment, Answer, Capabilities, Mode, StorageExt};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use gcra_core::Decision;
use rate_tier_service::{Running, Service, ServiceOptions, StoreChoice};
use rate_tier_storage::{
    BucketCheck, BucketSettle, Decided, FallbackStorage, MemoryStorage, PostgresStorage, RedisStorage, Storage,
    StorageError, StorageListener, Subscription,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

pub use rate_tier_test_support::{TEST_TIMEOUT, unique};

/// Where a test's buckets live.
#[derive(Debug, Clone)]
pub enum Backend {
    Memory,
    Redis,
    Cluster,
    Postgres,
}

/// A store that counts the checks it is asked for, around another.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn Storage>,
    pub checks: AtomicUsize,
}

impl Counting {
    pub fn new(inner: Arc<dyn Storage>) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            checks: AtomicUsize::new(0),
        })
    }

    pub fn calls(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
}

impl Counting {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.inner.check(checks, out).await
    }

    fn check_in_process(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Option<Result<Decided, StorageError>> {
        let result = self.inner.check(checks, out).ready();
        if result.is_some() {
            self.checks.fetch_add(1, Ordering::SeqCst);
        }
        result
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.inner.settle(settles).await
    }

    fn label(&self) -> &'static str {
        self.inner.kind()
    }
}

impl Storage for Counting {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => match self.check_in_process(checks, out) {
                Some(decided) => Answer::Ready(decided),
                None => Answer::pending(self.check_buckets(checks, out)),
            },
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(_) => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
            Adjustment::Release(_) => Answer::Ready(Err(
                StorageError::Unsupported("concurrency limits"),
            )),
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(self.label())
    }

    fn subscribe(&self, listener: StorageListener) -> Subscription {
        self.inner.subscribe(listener)
    }
}

impl Backend {
    /// The store of this backend (inside a runtime).
    pub fn store(&self) -> Arc<dyn Storage> {
        match self {
            Backend::Memory => Arc::new(MemoryStorage::new()),
            Backend::Redis => {
                let redis = RedisStorage::from_url(
                    &rate_tier_test_support::redis_url(),
                )
                .expect("TRT_REDIS_URL")
                .timeout(TEST_TIMEOUT);
                Arc::new(FallbackStorage::builder(Arc::new(redis)).build())
            }
            Backend::Cluster => {
                let redis = RedisStorage::from_cluster_urls(
                    rate_tier_test_support::cluster_urls(3),
                )
                .expect("TRT_REDIS_CLUSTER_URLS")
                .timeout(TEST_TIMEOUT);
                Arc::new(FallbackStorage::builder(Arc::new(redis)).build())
            }
            // No fallback: a failure of the store fails the test.
            Backend::Postgres => Arc::new(postgres()),
        }
    }
}

/// The tests' PostgreSQL store (`TRT_POSTGRES_URL`), its default table
/// migrated once per process: every test has a domain of its own, so its
/// buckets never meet another test's.
pub fn postgres() -> PostgresStorage {
    static MIGRATED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let url = rate_tier_test_support::env::postgres_url();
    MIGRATED.get_or_init(|| {
        let url = url.clone();
        // Its own thread and runtime: this may run inside a test's runtime.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let store = PostgresStorage::builder(&url)
                .expect("TRT_POSTGRES_URL")
                .build()
                .expect("a pool");
            runtime.block_on(store.migrate()).expect("the migration");
        })
        .join()
        .expect("the migration thread");
    });
    PostgresStorage::builder(&url)
        .expect("TRT_POSTGRES_URL")
        .timeout(TEST_TIMEOUT)
        .build()
        .expect("a pool")
}

/// A directory that is removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let dir = std::env::temp_dir().join(unique("rts-test"));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create dirs");
        }
        std::fs::write(&path, text).expect("write a config");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running service with its config directory.
pub struct Svc {
    pub running: Running,
    pub dir: TempDir,
    pub domain: String,
    pub store: Arc<Counting>,
}

/// A config for `domain`: `rules` is the YAML list under `descriptors:`.
pub fn config(domain: &str, rules: &str) -> String {
    format!("domain: {domain}\ndescriptors:\n{rules}")
}

impl Svc {
    /// A service over `backend` serving `rules` (see [`config`]) in a new
    /// domain, on loopback port 0, with `tweak` applied to its options.
    pub async fn start(
        backend: &Backend,
        rules: &str,
        tweak: impl FnOnce(&mut ServiceOptions),
    ) -> Svc {
        let domain = unique("d");
        Svc::start_in(backend.store(), &domain, rules, tweak).await
    }

    /// The same, on `store` and in `domain` (two instances share both).
    pub async fn start_in(
        store: Arc<dyn Storage>,
        domain: &str,
        rules: &str,
        tweak: impl FnOnce(&mut ServiceOptions),
    ) -> Svc {
        let dir = TempDir::new();
        dir.write("config.yaml", &config(domain, rules));
        let counting = Counting::new(store);
        let mut options = ServiceOptions::new(dir.path());
        options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
        options.http_addr = "127.0.0.1:0".parse().expect("addr");
        options.store = StoreChoice::Custom(counting.clone());
        options.watch = false;
        tweak(&mut options);
        let running =
            Service::start(options).await.expect("the service starts");
        Svc {
            running,
            dir,
            domain: domain.to_owned(),
            store: counting,
        }
    }

    pub fn grpc(&self) -> SocketAddr {
        self.running.grpc_addr()
    }

    pub fn http(&self) -> SocketAddr {
        self.running.http_addr()
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client(self.grpc()).await
    }

    /// One call on a new connection.
    pub async fn call(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// A call in this service's domain with these descriptors.
    pub async fn ask(
        &self,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> RateLimitResponse {
        self.call(request(&self.domain, descriptors))
            .await
            .expect("a decision")
    }

    pub async fn metrics(&self) -> String {
        http(self.http(), "GET", "/metrics", b"").await.body
    }
}

pub async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the gRPC server")
}

/// One `ShouldRateLimit` call of any message, on a new connection: what a
/// client that does not use Envoy's protos can send. Answers of any size
/// are read, so that a test sees how large one is.
pub async fn raw_call<M>(
    addr: SocketAddr,
    message: M,
) -> Result<RateLimitResponse, tonic::Status>
where
    M: prost::Message + Send + Sync + 'static,
{
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut grpc =
        tonic::client::Grpc::new(channel).max_decoding_message_size(usize::MAX);
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<M, RateLimitResponse>::default();
    let path = http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(message), path, codec)
        .await
        .map(tonic::Response::into_inner)
}

pub fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

/// A descriptor of `(key, value)` entries.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| entry(k, v)).collect(),
        ..RateLimitDescriptor::default()
    }
}

/// The same with its own `hits_addend`.
pub fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..desc(entries)
    }
}

/// The same with a `limit` override.
pub fn desc_override(
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: i32,
) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit,
            unit,
        }),
        ..desc(entries)
    }
}

pub fn request(
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// An HTTP response, read whole.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// One HTTP/1.1 request on a new connection (`Connection: close`).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> HttpResponse {
    http_with(addr, method, path, &[], body).await
}

/// The same with extra headers.
pub async fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let mut stream =
        tokio::net::TcpStream::connect(addr).await.expect("connect");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    stream.write_all(body).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(TEST_TIMEOUT, stream.read_to_end(&mut raw))
        .await
        .expect("the server answers in time")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    HttpResponse {
        status,
        headers: head.to_owned(),
        body: body.to_owned(),
    }
}

/// The value of the metric line that starts with `prefix` (name and
/// labels), if any.
pub fn metric(exposition: &str, prefix: &str) -> Option<f64> {
    exposition
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `condition` every 20 ms until it holds or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rules of three limits, for two instances sharing them.
pub const SHARED: &str = concat!(
    "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 20}\n",
    "  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 30}\n",
    "  - key: search\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
);

/// `concurrent` calls of `descriptors`, alternately on `a` and `b`, all at
/// once: how many were OK.
pub async fn concurrent_oks(
    a: &Svc,
    b: &Svc,
    concurrent: usize,
    descriptors: impl Fn() -> Vec<RateLimitDescriptor>,
) -> usize {
    let clients = [a.client().await, b.client().await];
    let tasks: Vec<_> = (0..concurrent)
        .map(|i| {
            let mut client = clients[i % 2].clone();
            let request = request(&a.domain, descriptors());
            tokio::spawn(async move {
                client
                    .should_rate_limit(request)
                    .await
                    .expect("a decision")
                    .into_inner()
                    .overall_code
                    == OK
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += usize::from(task.await.expect("no panic"));
    }
    ok
}

// --- the binary ------------------------------------------------------------

/// The service's binary, its debug listener on a free port (its default,
/// 6070, would be shared by the tests that run at once).
pub fn binary() -> std::process::Command {
    let mut command =
        std::process::Command::new(env!("CARGO_BIN_EXE_rate-tier-service"));
    command.env("DEBUG_PORT", "0");
    command
}

/// Waits until `port` on loopback accepts a connection.
pub async fn until_listening(port: u16) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(
        eventually(Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(addr).await.is_ok()
        })
        .await,
        "the service listens on {port}"
    );
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The binary, killed on drop; its stderr read as it is written.
pub struct Child {
    process: Option<std::process::Child>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(child) = &mut self.process {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Child {
    pub fn new(command: &mut std::process::Command) -> Child {
        use std::io::BufRead;
        let mut process = command
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starts");
        let pipe = process.stderr.take().expect("its stderr");
        let stderr: std::sync::Arc<std::sync::Mutex<String>> =
            std::sync::Arc::default();
        let lines = std::sync::Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut text = lines
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                text.push_str(&line);
                text.push('\n');
            }
        });
        Child {
            process: Some(process),
            stderr,
            reader: Some(reader),
        }
    }

    /// Sends it SIGTERM, as an orchestrator stops it.
    pub fn terminate(&self) {
        let pid = self.process.as_ref().expect("running").id();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM {pid}");
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.process.as_mut()?.try_wait().ok().flatten()
    }

    /// What it wrote on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Stops it and returns what it wrote on stderr.
    pub fn stop(mut self) -> String {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The pipe is closed once it is gone: the reader ends.
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.stderr()
    }
}
