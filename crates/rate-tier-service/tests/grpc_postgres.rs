//! Every semantic of the service over gRPC on PostgreSQL, two instances on
//! one PostgreSQL sharing a limit exactly, `migrate`, and a missing table
//! refused at start.
//!
//! Run with `cargo xtask test`: it starts a throwaway PostgreSQL and sets
//! `TRT_POSTGRES_URL`. Without it these tests fail, never pass silently.
//! Every test has a domain of its own, so bucket names never collide.

#[macro_use]
mod support;

use rate_tier_service::server::migrate_postgres;
use rate_tier_service::{Service, ServiceOptions, StartError, StoreChoice};
use rate_tier_test_support::PostgresServer;
use support::*;

every_semantic!(Backend::Postgres);

const RULE: &str =
    "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 20}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_postgres_pass_exactly_the_limit() {
    let domain = unique("shared");
    let a =
        Svc::start_in(Backend::Postgres.store(), &domain, RULE, |_| {}).await;
    let b =
        Svc::start_in(Backend::Postgres.store(), &domain, RULE, |_| {}).await;
    let oks =
        concurrent_oks(&a, &b, 200, || vec![desc(&[("user", "ana")])]).await;
    assert_eq!(oks, 20);
}

#[tokio::test]
async fn a_missing_table_is_refused_at_start_and_migrate_creates_it() {
    let server = PostgresServer::start();
    let url = server.url();
    let dir = TempDir::new();
    dir.write("config.yaml", &config("d", RULE));
    let options = || {
        let mut options = ServiceOptions::new(dir.path());
        options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
        options.http_addr = "127.0.0.1:0".parse().expect("addr");
        options.store = StoreChoice::Postgres(url.clone());
        options.watch = false;
        options
    };
    let Err(refused) = Service::start(options()).await else {
        panic!("a service without its table started");
    };
    assert!(matches!(refused, StartError::Store(_)), "{refused}");
    assert!(refused.to_string().contains("migrate"), "{refused}");
    assert_eq!(
        migrate_postgres(&url).await.expect("migrated"),
        "rate_tier_buckets"
    );
    let running = Service::start(options()).await.expect("the service starts");
    running.shutdown().await;
}
