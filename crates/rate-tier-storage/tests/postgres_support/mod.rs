//! The tests' PostgreSQL (`cargo xtask test` starts it and sets
//! `TRT_POSTGRES_URL`): a client on a schema of its own, migrated, and the
//! rates' rows read and corrupted as the property tests need them.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use rate_tier_storage::PostgresStorage;
use tokio_postgres::{Client, NoTls};

use crate::lua_support::Corrupt;

/// Rows as they must be: key -> (TAT, expiry), in µs.
pub type Rows = BTreeMap<String, (i64, i64)>;

/// A current-thread runtime for the property tests' synchronous bodies.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// A client on the tests' PostgreSQL, and the table of a new schema named
/// after `prefix`, migrated.
pub async fn connect(prefix: &str) -> (Client, String) {
    let url = rate_tier_test_support::env::postgres_url();
    let (db, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("the tests' PostgreSQL does not answer: {e}")
        });
    tokio::spawn(connection);
    let schema = rate_tier_test_support::unique(prefix).replace('-', "_");
    let table = format!("{schema}.buckets");
    db.batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("CREATE SCHEMA");
    let sql = PostgresStorage::migration_sql(&table, false)
        .expect("a valid table name");
    db.batch_execute(&sql).await.expect("the migration");
    (db, table)
}

/// The database's clock, in µs since the epoch, as the functions read it.
pub async fn db_now(db: &Client) -> i64 {
    db.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8",
        &[],
    )
    .await
    .expect("the database's clock")
    .get(0)
}

/// Every row's TAT and expiry.
pub async fn rows(db: &Client, table: &str) -> Rows {
    db.query(&format!("SELECT key, tat_us, expires_us FROM {table}"), &[])
        .await
        .expect("SELECT the rows")
        .into_iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect()
}

/// Writes a corrupted TAT at `key`, and in `rows`; what gcra-core is
/// handed for it. A bigint column holds no garbage: a negative TAT
/// (another kind's row) stands for it.
pub async fn corrupt(
    db: &Client,
    table: &str,
    rows: &mut Rows,
    key: &str,
    corrupt: &Corrupt,
    now: u64,
) -> Option<u64> {
    let (raw, seen) = match corrupt {
        Corrupt::Garbage(_) | Corrupt::WrongType => (-1i64, None),
        Corrupt::Relative(offset) => {
            let v = now.saturating_add_signed(*offset);
            (i64::try_from(v).expect("a time within int8"), Some(v))
        }
        Corrupt::Absolute(v) => {
            let raw = i64::try_from(*v).unwrap_or(i64::MAX);
            (raw, Some(raw as u64))
        }
    };
    let expires = raw.saturating_add(1_000);
    db.execute(
        &format!(
            "INSERT INTO {table} VALUES ($1, $2, $3) ON CONFLICT (key) DO UPDATE \
             SET tat_us = excluded.tat_us, expires_us = excluded.expires_us"
        ),
        &[&key, &raw, &expires],
    )
    .await
    .expect("write the corrupted row");
    rows.insert(key.to_owned(), (raw, expires));
    seen
}
