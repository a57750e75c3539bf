//! The post's example service: plans free (10/min) and pro (100/min), routes
//! of cost 1, 5 and 50, 401 without a key.
//!
//! Run it from the repository root:
//!
//! ```text
//! cargo run --example server -- 3000                       # in memory
//! cargo run --example server -- 3000 --redis redis://127.0.0.1:6379/
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example server -- 3001
//! cargo run --example server -- 3002 --redis-cluster 127.0.0.1:7000,127.0.0.1:7001
//! ```
//!
//! `--redis-cluster` takes one or more nodes of a Redis Cluster (any of
//! them: the others are found from it); a node may also be given as a
//! `redis://` URL, e.g. to pass a password.
//!
//! `--plans FILE` reads the plans from a TOML file instead (see
//! `plans.example.toml`) and reloads them, without a restart and without
//! losing anyone's bucket, when the file changes or on SIGHUP. A file that
//! does not validate is reported (with its line) and the running plans
//! stay. `--headers x|ietf|both` chooses the rate-limit headers: the post's
//! `x-ratelimit-*` (the default), the IETF `RateLimit-Policy`/`RateLimit`
//! fields, or both.
//!
//! With Redis, a local limiter behind a circuit breaker takes over while
//! Redis is down; breaker changes are printed on stderr.
//!
//! `GET /metrics` (no key, not limited) serves the limiter's Prometheus
//! metrics: checks by tier and outcome, latency, store errors, breaker.
//!
//! API keys: key_ana (free), key_bea (pro), key_eva (gold, a plan the
//! limiter does not know: she gets the default plan's quota, and every such
//! request is reported on stderr).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::{Router, routing::get};
// For /metrics.
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::signal::unix::{SignalKind, signal};
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
use tower_rate_tier::metrics::prometheus_client::registry::Registry;
use tower_rate_tier::metrics::{self, RateLimitMetrics};
use tower_rate_tier::{
    FallbackStorage, LimitEvent, OnMissing, Plans, PlansBuilder, Quota,
    RateTier, RedisStorage, StorageEvent, TierIdentity, TierLimitLayer,
};

// In a real service, this would come from the database.
fn plan_of(api_key: &str) -> Option<&'static str> {
    match api_key {
        "key_ana" => Some("free"),
        "key_bea" => Some("pro"),
        "key_eva" => Some("gold"), // a plan the limiter does not know
        _ => None,
    }
}

const USAGE: &str = "\
usage: server [PORT] [OPTIONS]
  --redis URL                           share limits through Redis (or REDIS_URL)
  --redis-cluster HOST:PORT[,HOST:PORT] share limits through a Redis Cluster
  --plans FILE                          plans from TOML, reloaded on change and SIGHUP
  --plans-poll-ms MS                    how often FILE is checked (default 1000)
  --headers x|ietf|both                 rate-limit headers (default x)";

struct Args {
    port: u16,
    redis: Option<String>,
    /// Node URLs of a Redis Cluster; when set, `redis` is not used.
    redis_cluster: Option<Vec<String>>,
    plans: Option<PathBuf>,
    plans_poll: Duration,
    headers: HeaderStyle,
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

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut args = Args {
        port: 3000,
        redis: std::env::var("REDIS_URL")
            .ok()
            .filter(|url| !url.is_empty()),
        redis_cluster: None,
        plans: None,
        plans_poll: Duration::from_secs(1),
        headers: HeaderStyle::XRateLimit,
    };
    let mut redis_flag = false;
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
            Long("redis-cluster") => {
                args.redis_cluster =
                    Some(cluster_urls(&text(value(&mut parser)?)?)?);
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
    Ok(args)
}

fn value(parser: &mut lexopt::Parser) -> Result<std::ffi::OsString, String> {
    parser.value().map_err(|e| e.to_string())
}

/// The plans in `path`, with this service's policies.
fn load_plans(path: &Path) -> Result<Plans, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    policies()
        .from_toml(&text)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .build()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// What does not fit a plan: no key, or a key that does not exist, is 401.
fn policies() -> PlansBuilder {
    Plans::builder().on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
}

/// Reloads the plans when the file changes, and on SIGHUP.
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
            // Reported by on_event as LimitEvent::PlansReloaded.
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
        // The post's plans.
        None => policies()
            .tier("free", Quota::per_minute(10))
            .tier("pro", Quota::per_minute(100))
            .default_tier("free"),
    };
    let mut tiers = RateTier::builder().plans(plans);
    let backend = match (&args.redis_cluster, &args.redis) {
        (Some(urls), _) => {
            // Connected lazily: the server starts even while the cluster
            // is down, and the fallback limits locally until it is back.
            let redis = Arc::new(RedisStorage::from_cluster_urls(urls)?);
            tiers = tiers
                .storage(Arc::new(FallbackStorage::builder(redis).build()));
            "redis cluster, with local fallback"
        }
        (None, Some(url)) => {
            // Connected lazily, so the server starts while Redis is down;
            // then a local limiter behind a circuit breaker decides instead
            // of making every request wait for a timeout.
            let redis = Arc::new(RedisStorage::from_url(url)?);
            tiers = tiers
                .storage(Arc::new(FallbackStorage::builder(redis).build()));
            "redis, with local fallback"
        }
        (None, None) => "memory",
    };
    let tiers = tiers.try_build()?;
    if let Some(path) = args.plans.clone() {
        tokio::spawn(watch_plans(path, tiers.clone(), args.plans_poll));
    }

    // The limiter's Prometheus metrics, served at /metrics.
    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    let registry = Arc::new(registry);

    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .cost_fn(|req| match req.uri.path() {
            "/report" => 5,
            "/backup" => 50, // more than the free plan gives in a minute
            _ => 1,
        })
        .on_event(|event| match event {
            LimitEvent::UnknownTier { user_id, tier, .. } => {
                eprintln!("unknown tier {tier:?} for {user_id}");
            }
            LimitEvent::Storage(StorageEvent::Breaker { from, to, cause }) => {
                let cause = cause.as_deref().unwrap_or("-");
                eprintln!("breaker {from:?} -> {to:?} ({cause})");
            }
            LimitEvent::PlansReloaded { tiers } => {
                eprintln!("plans reloaded: {}", tiers.join(", "));
            }
            _ => {}
        })
        .observe(metrics)
        .headers(args.headers);

    let app = Router::new()
        .route("/data", get(|| async { "data\n" }))
        .route("/report", get(|| async { "report\n" }))
        .route("/backup", get(|| async { "backup\n" }))
        .layer(layer)
        // Added after `.layer`: the limiter does not apply to it.
        .route("/metrics", get(move || serve_metrics(registry.clone())));

    let addr = format!("127.0.0.1:{}", args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("listening on {addr} ({backend} storage)");
    axum::serve(listener, app).await?;
    Ok(())
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
