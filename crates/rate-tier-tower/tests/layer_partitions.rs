//! Windows, periods and concurrency limits of one decision in two
//! partitions, on a store that cannot decide them together (as a Redis
//! Cluster, whose every partition has a hash slot of its own): refused
//! when the layer takes the limit and when tiers are reloaded under a live
//! layer (`ConfigError::KindsInTwoPartitions`), never at request time;
//! and the same configurations accepted, and decided, in memory.
//!
//! The store here is memory saying what a cluster says
//! (`Capabilities::spans_partitions` false: `support::stores::Narrow`); `redis_cluster_limit.rs` does the
//! same on a real cluster, and `redis_limits.rs` on one Redis.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use support::http::get_as;
use support::stores::Narrow;
use tower_rate_tier::{
    Concurrency, ConfigError, Limit, LimitEvent, Period, PeriodUnit, Quota,
    RateTier, Storage, TierIdentity, TierLimitLayer, Tiers, Window,
};

/// Free (10 a minute) and pro (100), on `store` (`None`: memory).
fn tiers(store: Option<Arc<dyn Storage>>) -> RateTier {
    let builder = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100));
    match store {
        Some(store) => builder.storage(store),
        None => builder,
    }
    .build()
}

fn one_slot() -> Option<Arc<dyn Storage>> {
    Some(Arc::new(Narrow::one_partition()))
}

fn window(limit: u32) -> Window {
    Window::new(limit, Duration::from_secs(60)).unwrap()
}

fn monthly(limit: u32) -> Period {
    Period::new(limit, PeriodUnit::Month, 0).unwrap()
}

/// Two uploads in flight per user.
fn uploads() -> Limit {
    Limit::new("uploads", Concurrency::new(2).unwrap())
}

/// 100 logins in any minute, whoever logs in.
fn logins() -> Limit {
    Limit::new("logins", window(100))
        .global()
        .when(|req| req.uri.path() == "/login")
}

/// `limits` added in order to a layer over `tiers`: the first error.
fn layer_of(
    tiers: &RateTier,
    limits: impl IntoIterator<Item = Limit>,
) -> Result<TierLimitLayer, ConfigError> {
    limits.into_iter().try_fold(
        TierLimitLayer::new(tiers.clone()),
        TierLimitLayer::try_limit,
    )
}

#[test]
fn a_global_window_beside_a_per_user_concurrency_limit_is_refused_at_build() {
    let tiers = tiers(one_slot());
    let error = layer_of(&tiers, [uploads(), logins()]).unwrap_err();
    assert_eq!(
        error,
        ConfigError::KindsInTwoPartitions {
            limits: ["uploads".into(), "logins".into()],
            partitions: ["per user", "global"],
            tier: "free".into(),
            store: "one-slot",
        }
    );
    assert_eq!(
        error.to_string(),
        "\"uploads\" (per user) and \"logins\" (global) are windows, periods or \
         concurrency limits in different partitions that may meet in a request \
         of tier \"free\", which the one-slot store cannot decide together (on a \
         Redis Cluster each partition has a hash slot of its own): partition \
         them per user (the default), make one of them a rate, or use a single \
         Redis"
    );
    // In either order; `limit` panics with it.
    assert!(matches!(
        layer_of(&tiers, [logins(), uploads()]),
        Err(ConfigError::KindsInTwoPartitions { limits, .. }) if limits == ["logins", "uploads"]
    ));
    let layer = TierLimitLayer::new(tiers).limit(uploads());
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        layer.limit(logins())
    }))
    .unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains("partition them per user"), "{message}");
}

#[test]
fn keyed_limits_share_with_none_and_a_tiers_kind_is_found_in_its_tier() {
    let tiers = tiers(one_slot());
    let per_address = Limit::new("ip-logins", window(5))
        .keyed_by(|req| Some(req.uri.path().to_owned()));
    let per_tenant = Limit::new("tenant-exports", monthly(1000))
        .keyed_by(|req| Some(req.uri.path().to_owned()));
    // Two keyed ones: their keys may differ.
    assert!(matches!(
        layer_of(&tiers, [per_address.clone(), per_tenant]),
        Err(ConfigError::KindsInTwoPartitions {
            partitions: ["per key", "per key"],
            ..
        })
    ));
    // A keyed one beside a per-user one.
    assert!(matches!(
        layer_of(&tiers, [uploads(), per_address.clone()]),
        Err(ConfigError::KindsInTwoPartitions {
            partitions: ["per user", "per key"],
            ..
        })
    ));
    // A period on pro only, global: it meets the uploads in pro's
    // requests alone.
    let pro_exports = Limit::new("exports", Quota::per_minute(10))
        .tier("pro", monthly(100))
        .global();
    assert_eq!(
        layer_of(&tiers, [uploads(), pro_exports]).unwrap_err(),
        ConfigError::KindsInTwoPartitions {
            limits: ["uploads".into(), "exports".into()],
            partitions: ["per user", "global"],
            tier: "pro".into(),
            store: "one-slot",
        }
    );
    // A keyed window alone, beside rates of any partition, is fine.
    let _layer = layer_of(
        &tiers,
        [
            per_address,
            Limit::new("site", Quota::per_second(100)).global(),
            Limit::new("search", Quota::per_minute(5)),
        ],
    )
    .unwrap();
}

#[test]
fn a_plan_of_another_kind_beside_a_global_period_is_refused_at_build() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("hobby", window(20))
        .storage(Arc::new(Narrow::one_partition()))
        .build();
    let exports = Limit::new("exports", monthly(1000)).global();
    assert_eq!(
        layer_of(&tiers, [exports]).unwrap_err(),
        ConfigError::KindsInTwoPartitions {
            limits: ["hobby".into(), "exports".into()],
            partitions: ["the tier, per user", "global"],
            tier: "hobby".into(),
            store: "one-slot",
        }
    );
    // Per user, it shares the user's partition with the tier.
    let exports = Limit::new("exports", monthly(1000));
    let _layer = layer_of(&tiers, [exports, uploads()]).unwrap();
}

#[test]
fn limits_of_one_partition_are_accepted() {
    let tiers = tiers(one_slot());
    // Per user (the tier's partition too), global together, rates anywhere.
    let login = Limit::new("login", window(5));
    let exports = Limit::new("exports", monthly(3)).tier("pro", monthly(100));
    let _layer = layer_of(&tiers, [uploads(), login, exports]).unwrap();
    let site = Limit::new("site-exports", monthly(10_000)).global();
    let per_address =
        Limit::new("ip", Quota::per_minute(100)).keyed_by(|_| None);
    let _layer = layer_of(&tiers, [logins(), site, per_address]).unwrap();
}

/// Logins and uploads, each under its route, for the user of `x-api-key`.
fn app(layer: TierLimitLayer) -> Router {
    let ok = || axum::routing::get(|| async { "ok\n" });
    Router::new()
        .route("/login", ok())
        .route("/upload", ok())
        .layer(layer.identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, "free"))
        }))
}

#[tokio::test]
async fn in_memory_the_same_limits_are_accepted_and_decided_together() {
    let tiers = tiers(None);
    let layer = layer_of(&tiers, [uploads(), logins()]).unwrap();
    let app = app(layer);
    // Each login is in the global window and takes a slot of its user's.
    for _ in 0..5 {
        let r = get_as(&app, Some("key_ana"), "/login").await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    let (logins, uploads) = (logins(), uploads());
    let both = tower_rate_tier::LimitRequest::new("key_bea", "free", 0)
        .limit(&logins, 0)
        .limit(&uploads, 0);
    let read = tiers.decide(&both).await.unwrap().unwrap();
    let left: Vec<_> = read.limits().map(|l| (l.name, l.remaining)).collect();
    assert_eq!(left, [("free", 10), ("logins", 95), ("uploads", 2)]);
    // A reload of free to a window is fine here too.
    tiers
        .try_reload(Tiers::builder().tier("free", window(10)).build().unwrap())
        .unwrap();
}

#[tokio::test]
async fn a_reload_that_would_make_a_live_layers_limits_meet_is_refused() {
    let tiers = tiers(one_slot());
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = heard.clone();
    let _listening =
        tiers.subscribe(move |e| sink.lock().unwrap().push(e.clone()));
    let app = app(layer_of(&tiers, [logins()]).unwrap());
    let free_window =
        || Tiers::builder().tier("free", window(10)).build().unwrap();

    // Free becomes a window, per user, beside the global logins: refused,
    // reported, and the tiers in force stay.
    assert_eq!(
        tiers.try_reload(free_window()).unwrap_err(),
        ConfigError::KindsInTwoPartitions {
            limits: ["free".into(), "logins".into()],
            partitions: ["the tier, per user", "global"],
            tier: "free".into(),
            store: "one-slot",
        }
    );
    tiers.reload(free_window());
    assert_eq!(tiers.quota("free"), Some(Quota::per_minute(10)));
    // Both refusals reported, the error's and the event's.
    assert!(matches!(
        &heard.lock().unwrap()[..],
        [
            LimitEvent::TiersRefused {
                error: ConfigError::KindsInTwoPartitions { .. }
            },
            LimitEvent::TiersRefused {
                error: ConfigError::KindsInTwoPartitions { .. }
            },
        ]
    ));
    let r = get_as(&app, Some("key_ana"), "/login").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    // Another rate is fine.
    tiers
        .try_reload(
            Tiers::builder()
                .tier("free", Quota::per_minute(20))
                .build()
                .unwrap(),
        )
        .unwrap();

    // Once the layer and every service it made are gone, nothing is in
    // the way; a layer of rates alone never was.
    let _rates =
        layer_of(&tiers, [Limit::new("site", Quota::per_second(9)).global()])
            .unwrap();
    drop(app);
    tiers.try_reload(free_window()).unwrap();
    assert!(tiers.quota("free").is_none(), "free is a window now");
    // And now the layer is refused instead.
    assert!(matches!(
        layer_of(&tiers, [logins()]),
        Err(ConfigError::KindsInTwoPartitions { .. })
    ));
}
