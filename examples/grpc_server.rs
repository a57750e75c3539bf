//! The example service over gRPC: the standard health service
//! (`grpc.health.v1.Health`, from tonic-health: no protoc, no codegen)
//! behind the tier limit, with the HTTP server's tiers: free (10/min) and
//! pro (100/min), default free, UNAUTHENTICATED without a key.
//!
//! Run it from the repository root:
//!
//! ```text
//! cargo run --example grpc_server -- 50051
//! ```
//!
//! The API key travels as `x-api-key` metadata: key_ana (free), key_bea
//! (pro), key_eva (gold, a tier the limiter does not know: the default
//! tier's quota, reported on stderr). `Check` costs 1, `Watch` 5.
//!
//! A refused call ends with `RESOURCE_EXHAUSTED`, a `google.rpc.RetryInfo`
//! in the status details and `retry-after` (seconds) in the metadata, so a
//! gRPC client can back off; every allowed call carries `x-ratelimit-limit`,
//! `x-ratelimit-remaining` and `x-ratelimit-reset` in its response metadata.
use axum::http::StatusCode;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tower_rate_tier::{
    LimitEvent, OnMissing, Quota, RateTier, TierIdentity, TierLimitLayer,
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
    "usage: grpc_server [PORT]   (default 50051; 0 picks a free port)";

fn parse_port() -> Result<u16, String> {
    let mut port = 50051;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "-h" | "--help" => return Err(USAGE.into()),
            _ => {
                port = arg
                    .parse()
                    .map_err(|_| format!("bad port {arg:?}\n{USAGE}"))?
            }
        }
    }
    Ok(port)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = match parse_port() {
        Ok(port) => port,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };

    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        // No key, or a key that does not exist: UNAUTHENTICATED.
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        .build();

    let layer = TierLimitLayer::new(tiers)
        // gRPC metadata are HTTP/2 headers.
        .identifier_fn(|metadata| {
            let key = metadata.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        // The cost of each method, by its path.
        .cost_fn(|call| match call.uri.path() {
            "/grpc.health.v1.Health/Watch" => 5,
            _ => 1,
        })
        .on_event(|event| {
            if let LimitEvent::UnknownTier { user_id, tier, .. } = event {
                eprintln!("unknown tier {tier:?} for {user_id}");
            }
        })
        .grpc();

    // Reports SERVING for the server as a whole ("").
    let (_reporter, health) = tonic_health::server::health_reporter();

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    eprintln!("gRPC listening on {addr} (memory storage)");
    Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
