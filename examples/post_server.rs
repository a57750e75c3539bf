// Un servicio con planes. La clave de API decide el tier, Redis guarda
// los límites (los comparten todas las instancias) y cada ruta tiene su
// coste. Uso: cargo run --example server -- <puerto>
use std::sync::Arc;

use axum::http::StatusCode;
use axum::{Router, routing::get};
use tower_rate_tier::{
    LimitEvent, OnMissing, Quota, RateTier, RedisStorage, TierIdentity,
    TierLimitLayer,
};

// En un servicio real, esto saldría de la base de datos.
fn plan_of(api_key: &str) -> Option<&'static str> {
    match api_key {
        "key_ana" => Some("free"),
        "key_bea" => Some("pro"),
        "key_eva" => Some("gold"), // un plan que el limitador no conoce
        _ => None,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::args().nth(1).unwrap_or("3000".into());
    let conn = redis::Client::open("redis://127.0.0.1:6379")?
        .get_connection_manager()
        .await?;

    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        // Sin clave, o con una clave que no existe: 401.
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        .storage(Arc::new(RedisStorage::new(conn)))
        .build();

    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .cost_fn(|req| match req.uri.path() {
            "/report" => 5,
            "/backup" => 50, // más de lo que el plan free da en un minuto
            _ => 1,
        })
        .on_event(|event| {
            if let LimitEvent::UnknownTier { user_id, tier, .. } = event {
                eprintln!("unknown tier {tier:?} for {user_id}");
            }
        });

    let app = Router::new()
        .route("/data", get(|| async { "data\n" }))
        .route("/report", get(|| async { "report\n" }))
        .route("/backup", get(|| async { "backup\n" }))
        .layer(layer);

    let addr = format!("127.0.0.1:{port}");
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
