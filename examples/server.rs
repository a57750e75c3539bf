//! The example service of 0.3: tiers free (10/min) and pro (100/min), routes
//! of cost 1, 5 and 50, 401 without a key; and limits of their own beside
//! the tier, decided with it as one decision.
//!
//! | route | what |
//! |---|---|
//! | `GET /data`, `/report`, `/backup` | cost 1, 5, 50 on the tier |
//! | `GET /search` | cost 1 on the tier, and a limit `search` of 3 per minute per user: all or nothing |
//! | `GET /quota` | reads every limit of the user without charging any: `{"tier":..,"limits":[{"name":..,"limit":..,"remaining":..,"reset":..},..]}` |
//! | `GET /generate?tokens=N` | cost 1 on the tier, and a limit `tokens` (free 1000/min, pro 10000/min) charged 1 up front, settled to the `x-tokens-used: N` the handler answers |
//! | `GET /login` | cost 1 on the tier, and a limit `login`: at most 5 in any 60 s per user, exactly (a window) |
//! | `GET /export` | cost 1 on the tier, and a limit `exports`: 3 per calendar month (UTC) on free, 100 on pro (a period) |
//! | `GET /upload?ms=N` | cost 1 on the tier, and a limit `uploads`: at most 2 in flight per user on free, 10 on pro (concurrency); answers after N ms (at most 10 s) |
//! | `GET /metrics` | Prometheus metrics, not limited |
//! | `GET /healthcheck` | `OK`, not limited; 503 while draining |
//!
//! Run it from the repository root:
//!
//! ```text
//! cargo run --example server -- 3000                       # in memory
//! cargo run --example server -- 3000 --redis redis://127.0.0.1:6379/
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example server -- 3001
//! cargo run --example server -- 3002 --redis-cluster 127.0.0.1:7000,127.0.0.1:7001
//! cargo run --example server -- 3003 --postgres postgres://app@127.0.0.1/app
//! DATABASE_URL=postgres://app@127.0.0.1/app cargo run --example server -- 3004
//! ```
//!
//! `--redis-cluster` takes one or more nodes of a Redis Cluster (any of
//! them: the others are found from it); a node may also be given as a
//! `redis://` URL, e.g. to pass a password. `rediss://` URLs are TLS, the
//! server checked against the public roots or `--redis-ca FILE`.
//!
//! `--tiers FILE` reads the tiers from a TOML file instead (see
//! `tiers.example.toml`) and reloads them, without a restart and without
//! losing anyone's bucket, when the file changes or on SIGHUP. A file that
//! does not validate is reported (with its line) and the running tiers
//! stay. `--headers x|ietf|both` chooses the rate-limit headers: 0.3's
//! `x-ratelimit-*` (the default), the IETF `RateLimit-Policy`/`RateLimit`
//! fields, or both. `--shadow` puts every limit in shadow mode: nothing is
//! refused for its rate, and `/metrics` counts what would have been
//! (`outcome="shadow_limited"`). `--wait-up-to SECONDS` lets a request
//! that a rate would refuse wait up to SECONDS for its slot instead, and
//! then be served (`RateTierBuilder::wait_up_to`; at most 1024 wait at
//! once, beyond that they are refused).
//!
//! `--postgres URL` (or `DATABASE_URL`) shares the limits through
//! PostgreSQL instead, for services without Redis: the example creates the
//! table at start (`PostgresStorage::migrate`; the library never does it by
//! itself).
//!
//! With Redis or PostgreSQL, a local limiter behind a circuit breaker takes
//! over while the store is down; breaker changes are printed on stderr.
//! `--store-timeout-ms MS` is how long a check waits for the store before
//! that local limiter decides it (the store's default when not given).
//!
//! `GET /metrics` (no key, not limited) serves the limiter's Prometheus
//! metrics: checks by tier and outcome, latency, store errors, breaker.
//!
//! SIGTERM or SIGINT drains: `/healthcheck` answers 503 at once while
//! every request is still served for `--drain SECONDS` (or `DRAIN_PERIOD`,
//! default 5; a second signal ends it), then the server stops accepting
//! and finishes the requests in flight.
//!
//! Every tier bans a key for 60 s after 20 refusals within 60 s (doubling
//! while it keeps going, at most an hour): its 429s then say
//! `"banned":true`.
//!
//! `--admin-token-file FILE` serves `POST /admin/reset?key=KEY` (not
//! limited) to callers that send `authorization: Bearer <the file's
//! content>`: the key's buckets back to full, on every tier and its own
//! limits (`RateTier::reset`); 401 and nothing done otherwise. Without the
//! flag there is no such route (404).
//!
//! API keys: key_ana (free), key_bea (pro), key_ada (pro, with her own 500
//! a minute: `TierIdentity::with_quota`), key_eva (gold, a tier the
//! limiter does not know: she gets the default tier's quota, and every such
//! request is reported on stderr).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::routing::{MethodRouter, get, post};
// For /metrics.
use axum::http::header;
use axum::response::{IntoResponse, Response};
use rate_tier_axum::{RateLimit, api_key};
use tokio::signal::unix::{SignalKind, signal};
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
use tower_rate_tier::metrics::prometheus_client::registry::Registry;
use tower_rate_tier::metrics::{self, RateLimitMetrics};
use tower_rate_tier::{
    Ban, Concurrency, FallbackStorage, Limit, LimitEvent, OnMissing, Period,
    PeriodUnit, PostgresStorage, Quota, RateTier, RedisStorage, Settle,
    TierIdentity, TierLimitLayer, Tiers, TiersBuilder, Window,
    storage::StorageEvent,
};

// In a real service, this would come from the database.
fn plan_of(api_key: &str) -> Option<&'static str> {
    match api_key {
        "key_ana" => Some("free"),
        "key_bea" => Some("pro"),
        "key_ada" => Some("pro"), // with her own 500 a minute: see `identify`
        "key_eva" => Some("gold"), // a plan the limiter does not know
        _ => None,
    }
}

const USAGE: &str = "\
usage: server [PORT] [OPTIONS]
  --redis URL                           share limits through Redis (or REDIS_URL)
  --redis-cluster HOST:PORT[,HOST:PORT] share limits through a Redis Cluster
  --redis-ca FILE                       the CA certificate (PEM) a rediss:// Redis is checked against
                                        (default: the public roots)
  --postgres URL                        share limits through PostgreSQL (or DATABASE_URL);
                                        creates its table at start if missing
  --store-timeout-ms MS                 how long a check waits for the shared store before
                                        the local fallback decides it (default: Redis 100,
                                        PostgreSQL 500)
  --plans FILE                          plans from TOML, reloaded on change and SIGHUP
  --plans-poll-ms MS                    how often FILE is checked (default 1000)
  --headers x|ietf|both                 rate-limit headers (default x)
  --shadow                              every limit in shadow mode: nothing refused for rate
  --wait-up-to SECONDS                  a request refused for a rate waits up to SECONDS for its slot instead
  --admin-token-file FILE               serve POST /admin/reset?key=KEY to callers with this bearer token
  --drain SECONDS                       after SIGTERM or SIGINT, /healthcheck says 503 while requests are
                                        still served for SECONDS, then the server stops (or DRAIN_PERIOD,
                                        e.g. 5s; default 5)";

struct Args {
    port: u16,
    redis: Option<String>,
    /// Node URLs of a Redis Cluster; when set, `redis` is not used.
    redis_cluster: Option<Vec<String>>,
    /// The CA file a `rediss://` Redis's certificate is checked against.
    redis_ca: Option<PathBuf>,
    postgres: Option<String>,
    /// The shared store's timeout; `None`: the store's default.
    store_timeout: Option<Duration>,
    plans: Option<PathBuf>,
    plans_poll: Duration,
    headers: HeaderStyle,
    shadow: bool,
    /// How long a request may wait for its slot instead of a 429.
    wait_up_to: Option<Duration>,
    /// The file holding the bearer token of `/admin/reset`.
    admin_token_file: Option<PathBuf>,
    /// After SIGTERM or SIGINT, how long `/healthcheck` says 503 while
    /// requests are still served.
    drain: Duration,
}

/// `host:port[,host:port...]` into node URLs (`redis://host:port/`); an
/// item that already is a URL is kept as it is.
fn cluster_urls(nodes: &str) -> Result<Vec<String>, String> {
    nodes
        .split(',')
        .map(|node| match node.trim() {
            "" => Err(format!("--redis-cluster: empty node in {nodes:?}")),
            url if url.contains("://") => Ok(url.to_owned()),
            addr => match addr.rsplit_once(':') {
                Some((host, port))
                    if !host.is_empty() && port.parse::<u16>().is_ok() =>
                {
                    Ok(format!("redis://{addr}/"))
                }
                _ => Err(format!("--redis-cluster: {addr:?} is not HOST:PORT")),
            },
        })
        .collect()
}

/// Whole seconds of drain, 0 to 3600 (0: stop at once).
fn drain_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .ok()
        .filter(|&s| s <= 3600)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is not whole seconds, at most 3600"))
}

/// SIGTERM or SIGINT.
async fn stop_signal() {
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Waits for a stop signal, turns `serving` off (`/healthcheck` 503)
/// while requests are still served for `drain` (or until a second
/// signal), then returns: the server then stops accepting and finishes the
/// requests in flight.
async fn drained(serving: Arc<AtomicBool>, drain: Duration) {
    stop_signal().await;
    serving.store(false, Ordering::Release);
    eprintln!(
        "draining for {drain:?}: /healthcheck says 503, requests are still served"
    );
    tokio::select! {
        () = tokio::time::sleep(drain) => {}
        () = stop_signal() => {}
    }
    eprintln!("stopping: finishing the requests in flight");
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut args = Args {
        port: 3000,
        redis: std::env::var("REDIS_URL")
            .ok()
            .filter(|url| !url.is_empty()),
        redis_cluster: None,
        redis_ca: None,
        postgres: std::env::var("DATABASE_URL")
            .ok()
            .filter(|url| !url.is_empty()),
        store_timeout: None,
        plans: None,
        plans_poll: Duration::from_secs(1),
        headers: HeaderStyle::XRateLimit,
        shadow: false,
        wait_up_to: None,
        admin_token_file: None,
        drain: match std::env::var("DRAIN_PERIOD") {
            Ok(period) => drain_seconds(period.trim_end_matches('s'))
                .map_err(|e| format!("DRAIN_PERIOD: {e}"))?,
            Err(_) => Duration::from_secs(5),
        },
    };
    let mut redis_flag = false;
    let mut postgres_flag = false;
    let mut parser = lexopt::Parser::from_env();
    let text = |value: std::ffi::OsString| -> Result<String, String> {
        value.string().map_err(|e| e.to_string())
    };
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("redis") => {
                args.redis = Some(text(value(&mut parser)?)?);
                redis_flag = true;
            }
            Long("postgres") => {
                args.postgres = Some(text(value(&mut parser)?)?);
                postgres_flag = true;
            }
            Long("redis-ca") => {
                args.redis_ca = Some(value(&mut parser)?.into())
            }
            Long("redis-cluster") => {
                args.redis_cluster =
                    Some(cluster_urls(&text(value(&mut parser)?)?)?);
            }
            Long("store-timeout-ms") => {
                let ms: u64 = text(value(&mut parser)?)?
                    .parse()
                    .ok()
                    .filter(|&ms| ms > 0)
                    .ok_or("--store-timeout-ms needs milliseconds, above 0")?;
                args.store_timeout = Some(Duration::from_millis(ms));
            }
            Long("plans") => args.plans = Some(value(&mut parser)?.into()),
            Long("plans-poll-ms") => {
                let ms: u64 = text(value(&mut parser)?)?
                    .parse()
                    .map_err(|_| "--plans-poll-ms needs milliseconds")?;
                args.plans_poll = Duration::from_millis(ms.max(10));
            }
            Long("headers") => {
                args.headers = match text(value(&mut parser)?)?.as_str() {
                    "x" => HeaderStyle::XRateLimit,
                    "ietf" => HeaderStyle::Ietf,
                    "both" => HeaderStyle::Both,
                    other => {
                        return Err(format!(
                            "--headers: {other:?} is not x, ietf or both"
                        ));
                    }
                }
            }
            Long("shadow") => args.shadow = true,
            Long("admin-token-file") => {
                args.admin_token_file = Some(value(&mut parser)?.into());
            }
            Long("wait-up-to") => {
                let seconds: f64 = text(value(&mut parser)?)?
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                    .ok_or(
                        "--wait-up-to needs seconds, above 0 and at most 3600",
                    )?;
                args.wait_up_to = Some(Duration::from_secs_f64(seconds));
            }
            Long("drain") => {
                args.drain = drain_seconds(&text(value(&mut parser)?)?)
                    .map_err(|e| format!("--drain: {e}"))?;
            }
            Short('h') | Long("help") => return Err(String::new()),
            Value(port) => {
                let port = text(port)?;
                args.port =
                    port.parse().map_err(|_| format!("bad port {port:?}"))?;
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    if redis_flag && args.redis_cluster.is_some() {
        return Err("--redis and --redis-cluster: choose one".into());
    }
    if postgres_flag && (redis_flag || args.redis_cluster.is_some()) {
        return Err(
            "--postgres and --redis or --redis-cluster: choose one".into()
        );
    }
    // A DATABASE_URL in the environment does not outrank an explicit Redis.
    if !postgres_flag && (redis_flag || args.redis_cluster.is_some()) {
        args.postgres = None;
    }
    Ok(args)
}

fn value(parser: &mut lexopt::Parser) -> Result<std::ffi::OsString, String> {
    parser.value().map_err(|e| e.to_string())
}

/// The tiers in `path`, with this service's policies.
fn load_plans(path: &Path) -> Result<Tiers, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    policies()
        .from_toml(&text)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .build()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// What does not fit a tier: no key, or a key that does not exist, is 401.
fn policies() -> TiersBuilder {
    Tiers::builder().on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
}

/// Reloads the tiers when the file changes, and on SIGHUP.
async fn watch_plans(path: PathBuf, tiers: RateTier, poll: Duration) {
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => Some(hangup),
        Err(error) => {
            eprintln!("no SIGHUP reload: {error}");
            None
        }
    };
    let mut seen = std::fs::read(&path).ok();
    loop {
        let forced = tokio::select! {
            _ = tokio::time::sleep(poll) => false,
            Some(()) = async { hangup.as_mut()?.recv().await } => true,
        };
        let now = std::fs::read(&path).ok();
        if !forced && now == seen {
            continue;
        }
        seen = now;
        match load_plans(&path) {
            // Reported by on_event as LimitEvent::TiersReloaded.
            Ok(plans) => tiers.reload(plans),
            Err(error) => {
                eprintln!("plans not reloaded, the running ones stay: {error}")
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("{message}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };

    let plans = match &args.plans {
        Some(path) => {
            let read = std::fs::read_to_string(path).map_err(|e| e.to_string());
            match read.and_then(|t| {
                policies().from_toml(&t).map_err(|e| e.to_string())
            }) {
                Ok(plans) => plans,
                Err(error) => {
                    eprintln!("{}: {error}", path.display());
                    std::process::exit(1);
                }
            }
        }
        // The 0.3 example's tiers.
        None => policies()
            .tier("free", Quota::per_minute(10))
            .tier("pro", Quota::per_minute(100))
            .default_tier("free"),
    };
    // The limiter's Prometheus metrics, served at /metrics: every check
    // and every event of the limiter, counted once.
    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    let registry = Arc::new(registry);

    // The shared store the breaker guards, as its log lines name it.
    let primary = match (&args.redis_cluster, &args.redis, &args.postgres) {
        (None, _, Some(_)) => "postgres",
        _ => "redis",
    };
    let mut tiers = RateTier::builder()
        .tiers(plans)
        .observe(metrics)
        // A key that keeps going after 20 refusals in a minute is refused
        // everything for a minute, doubling while it keeps at it, up to an
        // hour; /admin/reset lifts it.
        .ban(
            Ban::after(20, Duration::from_secs(60))
                .lasting(Duration::from_secs(60))
                .up_to(Duration::from_secs(3600)),
        )
        // What the limiter and its store do by themselves.
        .on_event(move |event| match event {
            LimitEvent::Storage(StorageEvent::Breaker {
                domain,
                from,
                to,
                cause,
                ..
            }) => {
                let domain = domain.as_deref().unwrap_or(primary);
                let cause = cause.as_deref().unwrap_or("-");
                eprintln!("breaker {domain} {from:?} -> {to:?} ({cause})");
            }
            LimitEvent::TiersReloaded { tiers, fresh } => {
                eprintln!("plans reloaded: {}", tiers.join(", "));
                if !fresh.is_empty() {
                    eprintln!(
                        "plans changed kind, their buckets start fresh: {}",
                        fresh.join(", ")
                    );
                }
            }
            LimitEvent::TiersRefused { error } => {
                eprintln!("plans refused, the running ones stay: {error}");
            }
            _ => {}
        });
    let with_timeout = |redis: RedisStorage| match args.store_timeout {
        Some(timeout) => redis.timeout(timeout),
        None => redis,
    };
    let redis_ca = match &args.redis_ca {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| format!("--redis-ca {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let backend = match (&args.redis_cluster, &args.redis, &args.postgres) {
        (None, _, Some(url)) => {
            // An example may create its table: at start, or (auto_migrate)
            // when a PostgreSQL that was down first answers. Then, like
            // Redis, a local limiter behind a circuit breaker decides while
            // PostgreSQL is down.
            let mut postgres =
                PostgresStorage::builder(url)?.auto_migrate(true);
            if let Some(timeout) = args.store_timeout {
                postgres = postgres.timeout(timeout);
            }
            let postgres = postgres.build()?;
            if let Err(error) = postgres.migrate().await {
                eprintln!(
                    "postgres: cannot create the table yet ({error}); limiting locally until it answers, then creating it"
                );
            }
            tiers = tiers.storage(Arc::new(
                FallbackStorage::builder(Arc::new(postgres)).build(),
            ));
            "postgres, with local fallback"
        }
        (Some(urls), _, _) => {
            // Connected lazily: the server starts even while the cluster
            // is down, and the fallback limits locally until it is back.
            let redis = match &redis_ca {
                Some(ca) => RedisStorage::from_cluster_urls_with_ca(urls, ca)?,
                None => RedisStorage::from_cluster_urls(urls)?,
            };
            let redis = Arc::new(with_timeout(redis));
            tiers = tiers
                .storage(Arc::new(FallbackStorage::builder(redis).build()));
            "redis cluster, with local fallback"
        }
        (None, Some(url), None) => {
            // Connected lazily, so the server starts while Redis is down;
            // then a local limiter behind a circuit breaker decides instead
            // of making every request wait for a timeout.
            let redis = match &redis_ca {
                Some(ca) => RedisStorage::from_url_with_ca(url, ca)?,
                None => RedisStorage::from_url(url)?,
            };
            let redis = Arc::new(with_timeout(redis));
            tiers = tiers
                .storage(Arc::new(FallbackStorage::builder(redis).build()));
            "redis, with local fallback"
        }
        (None, None, None) => "memory",
    };
    if let Some(wait) = args.wait_up_to {
        tiers = tiers.wait_up_to(wait);
    }
    let tiers = tiers.try_build()?;
    if let Some(path) = args.plans.clone() {
        tokio::spawn(watch_plans(path, tiers.clone(), args.plans_poll));
    }

    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn(identify())
        .cost_fn(|req| match req.uri.path() {
            "/report" => 5,
            "/backup" => 50, // more than the free plan gives in a minute
            _ => 1,
        })
        // Expensive searches: 3 a minute per user, beside the tier.
        .limit(
            Limit::new("search", Quota::per_minute(3))
                .when(|req| req.uri.path() == "/search"),
        )
        // Generated tokens, per tier: an estimate of 1 up front, settled
        // to what the answer really used (a debt the next requests wait
        // for), and refunded if the generation fails.
        .limit(
            Limit::new("tokens", Quota::per_minute(1000))
                .tier("pro", Quota::per_minute(10_000))
                .when(|req| req.uri.path() == "/generate")
                .settle(
                    Settle::from_header("x-tokens-used")
                        .refund_on_server_error(),
                ),
        )
        .peek_when(|req| req.uri.path() == "/quota")
        .shadow(args.shadow)
        .on_event(|event| {
            if let LimitEvent::UnknownTier { user_id, tier, .. } = event {
                eprintln!("unknown tier {tier:?} for {user_id}");
            }
        })
        .headers(args.headers);
    let (layer, unserved) = with_counted_limits(layer)?;
    // A route whose limit the store cannot decide says why, never served.
    let served = |route: &'static str, handler: MethodRouter| match unserved
        .iter()
        .find(|(r, _)| *r == route)
    {
        None => handler,
        Some((_, reason)) => {
            let reason = reason.clone();
            get(
                move || async move { (StatusCode::SERVICE_UNAVAILABLE, reason) },
            )
        }
    };

    let app = Router::new()
        .route("/login", served("/login", get(|| async { "login\n" })))
        .route("/export", served("/export", get(|| async { "export\n" })))
        .route("/upload", served("/upload", get(upload)))
        .route("/data", get(|| async { "data\n" }))
        .route("/report", get(|| async { "report\n" }))
        .route("/backup", get(|| async { "backup\n" }))
        .route("/search", get(|| async { "search\n" }))
        .route("/quota", get(quota))
        .route("/generate", get(generate))
        .layer(layer)
        // Added after `.layer`: the limiter does not apply to them.
        .route("/metrics", get(move || serve_metrics(registry.clone())));
    let serving = Arc::new(AtomicBool::new(true));
    let health = serving.clone();
    let app = app.route(
        "/healthcheck",
        get(move || async move {
            match health.load(Ordering::Acquire) {
                true => (StatusCode::OK, "OK\n"),
                false => (StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
            }
        }),
    );
    // Without a token file there is no admin route: 404, like any other.
    let app = match &args.admin_token_file {
        Some(path) => {
            let token = std::fs::read_to_string(path)
                .map_err(|e| {
                    format!("--admin-token-file {}: {e}", path.display())
                })?
                .trim()
                .to_owned();
            if token.is_empty() {
                return Err(format!(
                    "--admin-token-file {}: empty",
                    path.display()
                )
                .into());
            }
            let admin = Admin {
                tiers: tiers.clone(),
                token: Arc::from(token),
            };
            app.route(
                "/admin/reset",
                post(move |q, h| admin_reset(admin.clone(), q, h)),
            )
        }
        None => app,
    };

    let addr = format!("127.0.0.1:{}", args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("listening on {addr} ({backend} storage)");
    axum::serve(listener, app)
        .with_graceful_shutdown(drained(serving, args.drain))
        .await?;
    eprintln!("stopped");
    Ok(())
}

/// Who the caller is: the tier of their key; key_ada has negotiated her
/// own 500 a minute on pro (an account field, in a real service).
fn identify() -> impl Fn(&axum::http::HeaderMap) -> Option<TierIdentity<'_>>
+ Send
+ Sync
+ 'static {
    let by_key = api_key("x-api-key", plan_of);
    move |headers| {
        let identity = by_key(headers)?;
        Some(match identity.user() {
            "key_ada" => identity.with_quota("pro", Quota::per_minute(500)),
            _ => identity,
        })
    }
}

/// What `/admin/reset` needs: the limiter, and the token it asks for.
#[derive(Clone)]
struct Admin {
    tiers: RateTier,
    token: Arc<str>,
}

#[derive(serde::Deserialize)]
struct ResetQuery {
    key: String,
}

/// The token of an `authorization: Bearer <token>` header: the scheme in
/// any case (RFC 9110 §11.1), the token without the spaces around it.
fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// `POST /admin/reset?key=KEY` with `authorization: Bearer <token>`: the
/// key's buckets back to full (every tier, and its own limits). 401, and
/// nothing done, without the right token (compared in constant time),
/// whatever else the request holds: the token is checked before the query
/// is read (a caller without it learns nothing of what the route expects).
async fn admin_reset(
    admin: Admin,
    query: Result<Query<ResetQuery>, QueryRejection>,
    headers: axum::http::HeaderMap,
) -> Response {
    use subtle::ConstantTimeEq;
    let given = bearer(&headers).unwrap_or("");
    if !bool::from(given.as_bytes().ct_eq(admin.token.as_bytes())) {
        eprintln!("admin: reset refused (no or wrong token)");
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "unauthorized\n",
        )
            .into_response();
    }
    let key = match query {
        Ok(Query(ResetQuery { key })) => key,
        Err(rejection) => return rejection.into_response(),
    };
    // The limits of a user's own: their buckets are the key's.
    let limits = user_limits();
    let limits: Vec<&Limit> = limits.iter().collect();
    match admin.tiers.reset(&key, &limits).await {
        Ok(()) => {
            eprintln!("admin: reset done");
            (StatusCode::OK, "reset\n").into_response()
        }
        Err(error) => {
            eprintln!("admin: reset failed: {error}");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("reset failed: {error}\n"),
            )
                .into_response()
        }
    }
}

/// The limits of the example that are a user's own (their names are their
/// buckets' names): what a reset refills beside the tiers.
fn user_limits() -> Vec<Limit> {
    let mut limits = vec![
        Limit::new("search", Quota::per_minute(3)),
        Limit::new("tokens", Quota::per_minute(1000)),
    ];
    if let Ok(window) = Window::new(5, Duration::from_secs(60)) {
        limits.push(Limit::new("login", window));
    }
    if let Ok(period) = Period::new(3, PeriodUnit::Month, 0) {
        limits.push(Limit::new("exports", period));
    }
    limits
}

/// Routes whose limit the store cannot decide, and why.
type Unserved = Vec<(&'static str, String)>;

/// Logins, at most 5 in any 60 s per user, exactly; exports, 3 per
/// calendar month (UTC) on free and 100 on pro; uploads, 2 in flight per
/// user on free and 10 on pro. A store that cannot decide one of them: the
/// layer refuses it, and its route answers 503 saying why (never served
/// unlimited). The routes left so.
fn with_counted_limits(
    mut layer: TierLimitLayer,
) -> Result<(TierLimitLayer, Unserved), Box<dyn std::error::Error>> {
    let login = Limit::new("login", Window::new(5, Duration::from_secs(60))?)
        .when(|req| req.uri.path() == "/login");
    let exports = Limit::new("exports", Period::new(3, PeriodUnit::Month, 0)?)
        .tier("pro", Period::new(100, PeriodUnit::Month, 0)?)
        .when(|req| req.uri.path() == "/export");
    let uploads = Limit::new("uploads", Concurrency::new(2)?)
        .tier("pro", Concurrency::new(10)?)
        .when(|req| req.uri.path() == "/upload");
    let mut unserved = Vec::new();
    let counted = [
        ("/login", login),
        ("/export", exports),
        ("/upload", uploads),
    ];
    for (route, limit) in counted {
        match layer.clone().try_limit(limit) {
            Ok(with) => layer = with,
            Err(error) => {
                eprintln!("{route} is not served: {error}");
                unserved.push((route, format!("{error}\n")));
            }
        }
    }
    Ok((layer, unserved))
}

/// `GET /quota`: every limit of the caller, read and not charged.
async fn quota(RateLimit(info): RateLimit) -> Response {
    let limits: Vec<String> = info
        .limits()
        .map(|limit| {
            format!(
                r#"{{"name":"{}","limit":{},"remaining":{},"reset":{}}}"#,
                limit.name,
                limit.limit,
                limit.remaining,
                limit.reset_unix_secs(info.now_us),
            )
        })
        .collect();
    let body = format!(
        r#"{{"tier":"{}","limits":[{}]}}"#,
        info.tier,
        limits.join(",")
    );
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[derive(serde::Deserialize)]
struct Upload {
    #[serde(default)]
    ms: u64,
}

/// The longest `/upload` (ms): a client cannot hold a slot, or a
/// connection, for longer.
const UPLOAD_MAX_MS: u64 = 10_000;

/// `GET /upload?ms=N`: "uploads" for N ms (at most 10 s), holding one of
/// the user's upload slots until its answer is sent.
async fn upload(Query(Upload { ms }): Query<Upload>) -> String {
    let ms = ms.min(UPLOAD_MAX_MS);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("uploaded in {ms} ms\n")
}

#[derive(serde::Deserialize)]
struct Generate {
    tokens: u32,
}

/// `GET /generate?tokens=N`: "generates" N tokens, and says how many it
/// used, for the limiter to settle.
async fn generate(Query(Generate { tokens }): Query<Generate>) -> Response {
    (
        [("x-tokens-used", tokens.to_string())],
        format!("generated {tokens} tokens\n"),
    )
        .into_response()
}

/// `GET /metrics`: the registry in the OpenMetrics text format.
async fn serve_metrics(registry: Arc<Registry>) -> Response {
    let mut body = String::new();
    match encode(&mut body, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body)
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The route's documented cap, on Tokio's paused clock (the process
    /// tests in tests/server_kinds.rs cover the route over HTTP).
    #[tokio::test(start_paused = true)]
    async fn an_upload_lasts_at_most_10_s_whatever_it_asks() {
        for (asked, lasted) in
            [(0, 0), (1_500, 1_500), (10_001, 10_000), (u64::MAX, 10_000)]
        {
            let started = tokio::time::Instant::now();
            let answer = upload(Query(Upload { ms: asked })).await;
            assert_eq!(answer, format!("uploaded in {lasted} ms\n"));
            assert_eq!(started.elapsed(), Duration::from_millis(lasted));
        }
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        let with = |value: &str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            bearer(&headers).map(str::to_owned)
        };
        for value in ["Bearer t0k", "bearer t0k", "BEARER  t0k "] {
            assert_eq!(with(value).as_deref(), Some("t0k"), "{value:?}");
        }
        assert_eq!(with("Basic dXNlcjpwYXNz"), None);
        assert_eq!(with("Bearer"), None);
        assert_eq!(bearer(&axum::http::HeaderMap::new()), None);
    }

    /// Without the token, a request missing its `key` is 401 like any
    /// other: the token is checked first.
    #[tokio::test]
    async fn the_token_is_checked_before_the_query() {
        use tower::ServiceExt;
        let admin = Admin {
            tiers: RateTier::builder()
                .tier("free", Quota::per_minute(10))
                .build(),
            token: Arc::from("s3cret"),
        };
        let app = Router::new().route(
            "/admin/reset",
            post(move |q, h| admin_reset(admin.clone(), q, h)),
        );
        let send = |auth: Option<&str>, path: &str| {
            let mut request = axum::http::Request::post(path);
            if let Some(auth) = auth {
                request = request.header(header::AUTHORIZATION, auth);
            }
            app.clone()
                .oneshot(request.body(axum::body::Body::empty()).unwrap())
        };
        let status = |r: Result<Response, _>| r.map(|r| r.status());
        assert_eq!(
            status(send(None, "/admin/reset").await),
            Ok(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(send(Some("Bearer wrong"), "/admin/reset").await),
            Ok(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(send(Some("bearer s3cret"), "/admin/reset").await),
            Ok(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            status(
                send(Some("bearer s3cret"), "/admin/reset?key=key_ana").await
            ),
            Ok(StatusCode::OK)
        );
    }
}
