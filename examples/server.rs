//! The post's example service: plans free (10/min) and pro (100/min), routes
//! of cost 1, 5 and 50, 401 without a key.
//!
//! Run it from the repository root:
//!
//! ```text
//! cargo run --example server -- 3000                       # in memory
//! cargo run --example server -- 3000 --redis redis://127.0.0.1:6379/
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example server -- 3001
//! ```
//!
//! With Redis, a local limiter behind a circuit breaker takes over while
//! Redis is down; breaker changes are printed on stderr.
//!
//! API keys: key_ana (free), key_bea (pro), key_eva (gold, a plan the
//! limiter does not know: she gets the default plan's quota, and every such
//! request is reported on stderr).
use std::sync::Arc;

use axum::http::StatusCode;
use axum::{Router, routing::get};
use tower_rate_tier::{
    FallbackStorage, LimitEvent, OnMissing, Quota, RateTier, RedisStorage,
    StorageEvent, TierIdentity, TierLimitLayer,
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

const USAGE: &str =
    "usage: server [PORT] [--redis URL]   (REDIS_URL also selects Redis)";

struct Args {
    port: u16,
    redis: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut port = 3000;
    let mut redis = std::env::var("REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => {
                redis = Some(args.next().ok_or("--redis needs a URL")?)
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ if arg.starts_with('-') => {
                return Err(format!("unknown option {arg}\n{USAGE}"));
            }
            _ => {
                port = arg
                    .parse()
                    .map_err(|_| format!("bad port {arg:?}\n{USAGE}"))?
            }
        }
    }
    Ok(Args { port, redis })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };

    let mut tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        // No key, or a key that does not exist: 401.
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED));
    let backend = match &args.redis {
        Some(url) => {
            let conn = redis::Client::open(url.as_str())?
                .get_connection_manager()
                .await?;
            // While Redis is down, limit locally behind a circuit breaker
            // instead of making every request wait for a timeout.
            let redis = Arc::new(RedisStorage::new(conn));
            tiers = tiers
                .storage(Arc::new(FallbackStorage::builder(redis).build()));
            "redis, with local fallback"
        }
        None => "memory",
    };
    let tiers = tiers.build();

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
            _ => {}
        });

    let app = Router::new()
        .route("/data", get(|| async { "data\n" }))
        .route("/report", get(|| async { "report\n" }))
        .route("/backup", get(|| async { "backup\n" }))
        .layer(layer);

    let addr = format!("127.0.0.1:{}", args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("listening on {addr} ({backend} storage)");
    axum::serve(listener, app).await?;
    Ok(())
}
