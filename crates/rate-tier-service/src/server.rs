//! Running the service: the store, the two listeners (three with the
//! [admin API](crate::admin)), the reload, and a graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    FallbackStorage, MemoryStorage, PostgresStorage, RedisStorage, Storage,
    StorageError, StorageEvent,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

use crate::admin::AdminOptions;
use crate::config::{Config, ConfigError};
use crate::decide::{DecideOptions, Decider};
use crate::grpc::RlsService;
use crate::http::{self, Health};
use crate::metrics::Metrics;

/// The default gRPC address (envoyproxy/ratelimit's port, on loopback).
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:8081";
/// The default HTTP address.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";

/// Where the buckets live.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum StoreChoice {
    /// In this process ([`MemoryStorage`]): one instance only.
    #[default]
    Memory,
    /// One Redis, at this URL, behind a [`FallbackStorage`].
    Redis(String),
    /// A Redis Cluster, seeded with these node URLs, behind a
    /// [`FallbackStorage`] (a breaker per node).
    RedisCluster(Vec<String>),
    /// PostgreSQL at this URL, behind a [`FallbackStorage`]: its table must
    /// exist (`rate-tier-service migrate --postgres URL`).
    Postgres(String),
    /// A store built by the caller, used as it is.
    Custom(Arc<dyn Storage>),
}

/// Everything [`Service::start`] needs.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// The config file or directory.
    pub config_path: PathBuf,
    /// The gRPC listener.
    pub grpc_addr: SocketAddr,
    /// The HTTP listener.
    pub http_addr: SocketAddr,
    /// The store.
    pub store: StoreChoice,
    /// Shadow mode, headers, request bounds.
    pub decide: DecideOptions,
    /// Watch the config and reload it on change (default true).
    pub watch: bool,
    /// The quiet period after a file event before reloading (default 200 ms).
    pub reload_debounce: Duration,
    /// The periodic rescan of the config (default 60 s).
    pub rescan_every: Duration,
    /// The timeout of each Redis call (default 100 ms).
    pub redis_timeout: Duration,
    /// The timeout of each PostgreSQL call (default
    /// [`PostgresStorage::DEFAULT_TIMEOUT`], 500 ms): past it, the local
    /// fallback decides.
    pub postgres_timeout: Duration,
    /// The admin API's listener and token file (default none: no admin
    /// API). See [`admin`](crate::admin).
    pub admin: Option<AdminOptions>,
    /// The CA certificate file (PEM) a `rediss://` Redis's certificate is
    /// checked against (default none: the public roots).
    pub redis_ca: Option<PathBuf>,
    /// The debug listener: `/rlconfig` (the rules in use, as text),
    /// `/healthcheck` (default none; the binary's is 127.0.0.1:6070,
    /// envoyproxy/ratelimit's port).
    pub debug_addr: Option<SocketAddr>,
    /// The bearer token file the debug listener's status page asks for
    /// (default none: the page is open to whoever reaches the listener).
    /// The binary sets it from `--admin-token-file`.
    pub status_token_file: Option<PathBuf>,
    /// The metrics on a listener of their own too, as envoyproxy/ratelimit's
    /// `USE_PROMETHEUS` serves them (default none: `/metrics` on the HTTP
    /// listener only).
    pub prometheus: Option<PrometheusOptions>,
}

/// Where `USE_PROMETHEUS` serves the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusOptions {
    /// `PROMETHEUS_ADDR`.
    pub addr: SocketAddr,
    /// `PROMETHEUS_PATH`.
    pub path: String,
}

impl ServiceOptions {
    /// The defaults for `config_path`: loopback 8081 and 8080, memory.
    pub fn new(config_path: impl Into<PathBuf>) -> Self {
        ServiceOptions {
            config_path: config_path.into(),
            grpc_addr: DEFAULT_GRPC_ADDR
                .parse()
                .unwrap_or_else(|_| unreachable!()),
            http_addr: DEFAULT_HTTP_ADDR
                .parse()
                .unwrap_or_else(|_| unreachable!()),
            store: StoreChoice::Memory,
            decide: DecideOptions::default(),
            watch: true,
            reload_debounce: Duration::from_millis(200),
            rescan_every: Duration::from_secs(60),
            redis_timeout: RedisStorage::DEFAULT_TIMEOUT,
            postgres_timeout: PostgresStorage::DEFAULT_TIMEOUT,
            admin: None,
            redis_ca: None,
            debug_addr: None,
            status_token_file: None,
            prometheus: None,
        }
    }
}

/// Why the service did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The config is invalid.
    #[error("invalid config: {0}")]
    Config(#[from] ConfigError),
    /// The store could not be built (a bad Redis URL).
    #[error("cannot set up the store: {0}")]
    Store(#[from] StorageError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// The config could not be watched.
    #[error("cannot watch the config: {0}")]
    Watch(#[from] notify::Error),
    /// The admin API's token file cannot be read, or is empty.
    #[error("admin API: {0}")]
    AdminToken(String),
}

/// The service.
#[derive(Debug)]
pub struct Service;

/// A running service: its addresses, its decider, and the handle that stops
/// it.
#[derive(Debug)]
pub struct Running {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    debug_addr: Option<SocketAddr>,
    prometheus_addr: Option<SocketAddr>,
    decider: Arc<Decider>,
    config_path: PathBuf,
    health: Health,
    reporter: tonic_health::server::HealthReporter,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _events: rate_tier_storage::Subscription,
}

/// Builds the store of `choice`, and the fallback to report the breakers of.
async fn build_store(
    options: &ServiceOptions,
) -> Result<(Arc<dyn Storage>, Option<FallbackStorage>), StorageError> {
    let (redis_timeout, postgres_timeout) =
        (options.redis_timeout, options.postgres_timeout);
    // The CA file, read now: a bad one is a start-up error.
    let redis_ca = match &options.redis_ca {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            StorageError::Backend(
                format!("the Redis CA file {}: {e}", path.display()).into(),
            )
        })?),
        None => None,
    };
    let behind = |primary: Arc<dyn Storage>| {
        let fallback = FallbackStorage::builder(primary).build();
        (
            Arc::new(fallback.clone()) as Arc<dyn Storage>,
            Some(fallback),
        )
    };
    let wrap = |primary: RedisStorage| {
        behind(Arc::new(primary.timeout(redis_timeout)))
    };
    Ok(match &options.store {
        StoreChoice::Memory => (Arc::new(MemoryStorage::new()), None),
        StoreChoice::Redis(url) => wrap(match &redis_ca {
            Some(ca) => RedisStorage::from_url_with_ca(url, ca)?,
            None => RedisStorage::from_url(url)?,
        }),
        StoreChoice::RedisCluster(urls) => wrap(match &redis_ca {
            Some(ca) => RedisStorage::from_cluster_urls_with_ca(urls, ca)?,
            None => RedisStorage::from_cluster_urls(urls)?,
        }),
        StoreChoice::Postgres(url) => {
            let store = postgres(url, postgres_timeout)?;
            check_postgres(&store).await?;
            behind(Arc::new(store))
        }
        StoreChoice::Custom(store) => (store.clone(), None),
    })
}

/// The PostgreSQL store at `url`, each call bounded by `timeout`.
fn postgres(
    url: &str,
    timeout: Duration,
) -> Result<PostgresStorage, StorageError> {
    PostgresStorage::builder(url)
        .and_then(|builder| builder.timeout(timeout).build())
        .map_err(|e| StorageError::Backend(Box::new(e)))
}

/// Creates the PostgreSQL store's table and functions at `url`: the
/// `migrate` command.
///
/// # Errors
///
/// A bad URL, or the database refused.
pub async fn migrate_postgres(url: &str) -> Result<String, StorageError> {
    let store = postgres(url, Duration::from_secs(30))?;
    store.migrate().await?;
    Ok(store.table().to_owned())
}

/// At start, a PostgreSQL that answers must have its table: a missing one
/// is an error now, never a failure per request. One that does not answer
/// yet is decided locally by the fallback until it does, and watched
/// ([`watch_postgres`]).
async fn check_postgres(store: &PostgresStorage) -> Result<(), StorageError> {
    match store.is_migrated().await {
        Ok(true) => Ok(()),
        // The error that names the table and the migration.
        Ok(false) => store.ensure_migrated().await,
        Err(error) => {
            tracing::warn!(%error, "PostgreSQL does not answer yet: limiting locally until it does");
            tokio::spawn(watch_postgres(store.clone()));
            Ok(())
        }
    }
}

/// Polls a PostgreSQL that did not answer at start until it answers with
/// its table. The service never creates the table (`rate-tier-service
/// migrate` does, at deploy): while the database answers without it, every
/// decision stays local, and an error says so at once and every minute.
async fn watch_postgres(store: PostgresStorage) {
    const POLL: Duration = Duration::from_secs(1);
    const REPEAT: Duration = Duration::from_secs(60);
    let mut said: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(POLL).await;
        match store.is_migrated().await {
            Ok(true) => {
                tracing::info!(
                    table = store.table(),
                    "PostgreSQL answers and its table is in place: limits are shared"
                );
                return;
            }
            Ok(false) if said.is_none_or(|at| at.elapsed() >= REPEAT) => {
                tracing::error!(
                    table = store.table(),
                    "PostgreSQL answers without the table: every decision stays local \
                     until `rate-tier-service migrate --postgres URL` creates it"
                );
                said = Some(tokio::time::Instant::now());
            }
            // Still down, or said less than a minute ago.
            _ => {}
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| StartError::Bind { addr, error })
}

impl Service {
    /// Loads the config, builds the store, binds both listeners and serves
    /// until [`Running::shutdown`]. Call it inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`StartError`]: an invalid config, a bad Redis URL, an address in
    /// use.
    pub async fn start(options: ServiceOptions) -> Result<Running, StartError> {
        // The token first: a missing one fails before anything is built.
        let admin_token = match &options.admin {
            Some(admin) => Some(
                crate::admin::read_token(&admin.token_file)
                    .map_err(StartError::AdminToken)?,
            ),
            None => None,
        };
        let status_token = match &options.status_token_file {
            Some(file) => Some(
                crate::admin::read_token(file)
                    .map_err(StartError::AdminToken)?,
            ),
            None => None,
        };
        let path = options.config_path.clone();
        let config = tokio::task::spawn_blocking(move || Config::load(path))
            .await
            .map_err(|e| {
                StartError::Store(StorageError::Backend(Box::new(e)))
            })??;
        for warning in config.warnings() {
            tracing::warn!(%warning, "config");
        }
        let (store, fallback) = build_store(&options).await?;
        let events = store.subscribe(Arc::new(|event: &StorageEvent| {
            if let StorageEvent::Breaker {
                domain, from, to, ..
            } = event
            {
                tracing::warn!(
                    domain = domain.as_deref().unwrap_or("all"),
                    from = from.as_str(),
                    to = to.as_str(),
                    "circuit breaker of the shared store"
                );
            }
        }));
        let metrics = Arc::new(Metrics::new(fallback));
        tracing::info!(
            domains = config.domains().count(),
            rules = config.rule_count(),
            store = store.kind(),
            "config loaded"
        );
        let decider =
            Arc::new(Decider::new(config, store, options.decide, metrics));

        let grpc_listener = bind(options.grpc_addr).await?;
        let http_listener = bind(options.http_addr).await?;
        let admin_listener = match &options.admin {
            Some(admin) => Some(bind(admin.addr).await?),
            None => None,
        };
        let debug_listener = match options.debug_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let prometheus_listener = match &options.prometheus {
            Some(prometheus) => Some(bind(prometheus.addr).await?),
            None => None,
        };
        let debug_addr = debug_listener
            .as_ref()
            .zip(options.debug_addr)
            .map(|(listener, asked)| local(listener, asked));
        let prometheus_addr = prometheus_listener
            .as_ref()
            .zip(options.prometheus.as_ref())
            .map(|(listener, asked)| local(listener, asked.addr));
        let grpc_addr = local(&grpc_listener, options.grpc_addr);
        let http_addr = local(&http_listener, options.http_addr);
        let admin_addr = admin_listener
            .as_ref()
            .zip(options.admin.as_ref())
            .map(|(listener, admin)| local(listener, admin.addr));

        let (shutdown, stop) = watch::channel(false);
        let until_stop = |mut stop: watch::Receiver<bool>| async move {
            let _ = stop.wait_for(|s| *s).await;
        };

        let (reporter, health_service) =
            tonic_health::server::health_reporter();
        reporter.set_serving::<RlsService>().await;
        reporter
            .set_service_status(
                "ratelimit",
                tonic_health::ServingStatus::Serving,
            )
            .await;
        let mut tasks = Vec::new();

        let grpc = tonic::transport::Server::builder()
            .layer(tower::util::MapResponseLayer::new(
                crate::grpc::undecodable_is_invalid_argument,
            ))
            .add_service(health_service)
            .add_service(RlsService::new(decider.clone()));
        let incoming =
            TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
        let grpc_stop = until_stop(stop.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(error) =
                grpc.serve_with_incoming_shutdown(incoming, grpc_stop).await
            {
                tracing::error!(%error, "the gRPC server failed");
            }
        }));

        let health = Health::default();
        tasks.push(spawn_http(
            "public",
            http_listener,
            http::router(decider.clone(), health.clone()),
            until_stop(stop.clone()),
        ));

        if let (Some(listener), Some(token)) = (admin_listener, admin_token) {
            let app = crate::admin::router(decider.clone(), &token)
                .into_make_service_with_connect_info::<SocketAddr>();
            let admin_stop = until_stop(stop.clone());
            tasks.push(tokio::spawn(async move {
                if let Err(error) = axum::serve(listener, app)
                    .with_graceful_shutdown(admin_stop)
                    .await
                {
                    tracing::error!(%error, "the admin HTTP server failed");
                }
            }));
        }

        if let Some(listener) = debug_listener {
            tasks.push(spawn_http(
                "debug",
                listener,
                crate::debug::router(
                    decider.clone(),
                    health.clone(),
                    status_token.as_deref(),
                ),
                until_stop(stop.clone()),
            ));
            tasks.push(tokio::spawn(crate::status::sample_until(
                decider.clone(),
                until_stop(stop.clone()),
            )));
        }
        if let (Some(listener), Some(prometheus)) =
            (prometheus_listener, &options.prometheus)
        {
            let app = http::metrics_router(decider.clone(), &prometheus.path);
            let stopped = until_stop(stop.clone());
            tasks.push(spawn_http("metrics", listener, app, stopped));
        }

        if options.watch {
            tasks.push(crate::reload::spawn(
                options.config_path.clone(),
                decider.clone(),
                options.reload_debounce,
                options.rescan_every,
                stop,
            )?);
        }
        tracing::info!(
            %grpc_addr,
            %http_addr,
            admin_addr = admin_addr.map(tracing::field::display),
            debug_addr = debug_addr.map(tracing::field::display),
            metrics_addr = prometheus_addr.map(tracing::field::display),
            "serving"
        );
        Ok(Running {
            grpc_addr,
            http_addr,
            admin_addr,
            debug_addr,
            prometheus_addr,
            decider,
            config_path: options.config_path,
            health,
            reporter,
            shutdown,
            tasks,
            _events: events,
        })
    }
}

/// Serves `app` on `listener` until `stopped`; a failure is logged as the
/// `name` HTTP server's.
fn spawn_http(
    name: &'static str,
    listener: TcpListener,
    app: axum::Router,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(%error, "the {name} HTTP server failed");
        }
    })
}

fn local(listener: &TcpListener, asked: SocketAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(asked)
}

impl Running {
    /// The gRPC address (the real port when 0 was asked).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The admin API's address, when it is served.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The debug listener's address, when it is served.
    pub fn debug_addr(&self) -> Option<SocketAddr> {
        self.debug_addr
    }

    /// The address of the metrics' own listener (`USE_PROMETHEUS`), when
    /// it is served.
    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.prometheus_addr
    }

    /// The decision engine.
    pub fn decider(&self) -> &Arc<Decider> {
        &self.decider
    }

    /// Reloads the config now (as a file change would). Returns whether
    /// the config in use changed.
    pub async fn reload(&self) -> bool {
        crate::reload::reload(&self.config_path, &self.decider).await
    }

    /// Begins a drain: the health checks turn to not serving (HTTP
    /// `/healthcheck` 503, gRPC health `NOT_SERVING`) while every request
    /// is still answered, so that load balancers stop sending before the
    /// listeners close ([`Running::shutdown`]). The binary drains for
    /// `--drain` (5 s) after SIGTERM or SIGINT.
    pub async fn stop_serving(&self) {
        self.health.stop_serving();
        self.reporter
            .set_service_status(
                "ratelimit",
                tonic_health::ServingStatus::NotServing,
            )
            .await;
        self.reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    }

    /// Starts the graceful shutdown: the health checks turn to not serving,
    /// the listeners close, and the requests in flight finish.
    pub async fn shutdown(&self) {
        self.stop_serving().await;
        let _ = self.shutdown.send(true);
    }

    /// Waits until the servers have stopped (after [`Running::shutdown`]).
    pub async fn wait(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }

    /// [`Running::shutdown`], then [`Running::wait`].
    pub async fn stop(self) {
        self.shutdown().await;
        self.wait().await;
    }
}
