//! Building a [`PostgresStorage`]: its settings and their defaults, the
//! pool, and the background cleanup of expired rows.

use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use gcra_core::{ConcurrencyError, Lease};
use rustls::ClientConfig;
use tokio_postgres::NoTls;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::migrate::AutoMigrate;
use super::schema::{DEFAULT_TABLE, InvalidTable, Schema};
use super::{Inner, PostgresStorage};
use crate::storage::StorageError;

/// How often expired rows are removed, and how many at most per statement.
const DEFAULT_CLEANUP_EVERY: Duration = Duration::from_secs(60);
const DEFAULT_CLEANUP_BATCH: u32 = 1_000;

/// How long a slot of a concurrency limit is held without a renewal,
/// unless the builder says otherwise.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Builds a [`PostgresStorage`]: see [`PostgresStorage::builder`].
#[derive(Debug)]
pub struct PostgresStorageBuilder {
    config: tokio_postgres::Config,
    /// What the connection string's `sslmode` asks.
    tls: super::tls::Tls,
    schema: Schema,
    timeout: Duration,
    lease: Lease,
    pool_size: usize,
    unlogged: bool,
    auto_migrate: bool,
    cleanup_every: Option<Duration>,
    cleanup_batch: u32,
}

/// A URL or a setting that cannot make a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresConfigError {
    /// The connection URL (or `key=value` string) does not parse.
    #[error("invalid PostgreSQL connection string: {0}")]
    Url(#[source] tokio_postgres::Error),
    /// Its `sslmode` or `sslrootcert` cannot be used: an unknown mode, a
    /// root file that cannot be read or holds no certificate.
    #[error("PostgreSQL TLS: {0}")]
    Tls(String),
    /// The table's name.
    #[error(transparent)]
    Table(#[from] InvalidTable),
    /// The pool could not be built.
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
    /// The lease of concurrency slots is shorter than 1 µs or longer than
    /// [`gcra_core::MAX_WINDOW_US`].
    #[error("invalid lease of concurrency slots: {0}")]
    Lease(#[from] ConcurrencyError),
}

impl PostgresStorageBuilder {
    /// What [`PostgresStorage::builder`] answers: the defaults, for the
    /// database at `url`.
    pub(super) fn new(url: &str) -> Result<Self, PostgresConfigError> {
        let (url, tls) =
            super::tls::split(url).map_err(PostgresConfigError::Tls)?;
        let config = url
            .parse::<tokio_postgres::Config>()
            .map_err(PostgresConfigError::Url)?;
        Ok(PostgresStorageBuilder {
            config,
            tls,
            schema: Schema::new(DEFAULT_TABLE)?,
            timeout: PostgresStorage::DEFAULT_TIMEOUT,
            lease: Lease::new(DEFAULT_LEASE)?,
            pool_size: 16,
            unlogged: false,
            auto_migrate: false,
            cleanup_every: Some(DEFAULT_CLEANUP_EVERY),
            cleanup_batch: DEFAULT_CLEANUP_BATCH,
        })
    }

    /// The table of buckets (`rate_tier_buckets` by default; `schema.name`
    /// for another schema). Its functions are named after it.
    ///
    /// # Errors
    ///
    /// A name that is not lowercase letters, digits and `_`.
    pub fn table(mut self, table: &str) -> Result<Self, InvalidTable> {
        self.schema = Schema::new(table)?;
        Ok(self)
    }

    /// How long a call may take (500 ms by default): past it the caller
    /// gets [`StorageError::Timeout`] (a fallback then decides locally).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a slot of a concurrency limit is held unless it is renewed
    /// (30 s by default): what [`Capabilities::lease`](crate::Capabilities::lease)
    /// answers. A request holds its slots for as long as it runs, as the
    /// limiter renews them every third of the lease; the slots of an
    /// instance that died (never released nor renewed) are free once it
    /// ends. A shorter lease frees them sooner, at the cost of more
    /// renewals (one statement per request in flight every third of it).
    /// Instances that share a table should use the same lease.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::PostgresStorage;
    /// let builder = PostgresStorage::builder("postgres://app@db.internal/app")?;
    /// assert!(builder.lease(Duration::from_secs(10)).is_ok());
    /// let builder = PostgresStorage::builder("postgres://app@db.internal/app")?;
    /// assert!(builder.lease(Duration::ZERO).is_err());
    /// # Ok::<(), rate_tier_storage::PostgresConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A lease shorter than 1 µs or longer than [`gcra_core::MAX_WINDOW_US`]
    /// ([`PostgresConfigError::Lease`]).
    pub fn lease(
        mut self,
        lease: Duration,
    ) -> Result<Self, PostgresConfigError> {
        self.lease = Lease::new(lease)?;
        Ok(self)
    }

    /// At most this many connections (16 by default).
    #[must_use]
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Whether [`migrate`](PostgresStorage::migrate) creates the table
    /// `UNLOGGED`: faster writes, no WAL, and emptied after a crash of the
    /// server (every bucket full again) and absent from replicas. Off by
    /// default.
    #[must_use]
    pub fn unlogged(mut self, unlogged: bool) -> Self {
        self.unlogged = unlogged;
        self
    }

    /// Whether the store creates (or updates) its table and functions by
    /// itself, as [`migrate`](PostgresStorage::migrate) does (off by
    /// default: the schema is a deploy step). On, it migrates once, before
    /// the first call that reaches the database (so an instance started
    /// while its database was down creates the table once it answers), and
    /// again after a call finds the table or a function missing; several
    /// instances migrating at once wait for each other. Its database user
    /// needs the right to create them; until it has it, every call fails
    /// (behind a [`FallbackStorage`](crate::FallbackStorage), decided
    /// locally).
    ///
    /// ```no_run
    /// use rate_tier_storage::{FallbackStorage, PostgresStorage};
    /// use std::sync::Arc;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Built without a round trip: the database may be down.
    /// let store = PostgresStorage::builder("postgres://app@db.internal/app")?
    ///     .auto_migrate(true)
    ///     .build()?;
    /// let store = FallbackStorage::builder(Arc::new(store)).build();
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn auto_migrate(mut self, auto_migrate: bool) -> Self {
        self.auto_migrate = auto_migrate;
        self
    }

    /// How often expired rows are removed in the background (every minute
    /// by default; `None`: never, for a store that runs
    /// [`cleanup`](PostgresStorage::cleanup) itself), `batch` rows at most
    /// per statement, statements repeated while they find full batches.
    #[must_use]
    pub fn cleanup_every(
        mut self,
        every: Option<Duration>,
        batch: u32,
    ) -> Self {
        self.cleanup_every = every;
        self.cleanup_batch = batch.max(1);
        self
    }

    /// The store, without checking the schema (to [`migrate`](PostgresStorage::migrate)
    /// it). Connections are made when first needed. Built inside a Tokio
    /// runtime, it starts its background cleanup there.
    ///
    /// # Errors
    ///
    /// The pool cannot be built.
    pub fn build(self) -> Result<PostgresStorage, PostgresConfigError> {
        let recycling = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &self.tls.config {
            Some(tls) => Manager::from_config(
                self.config,
                MakeRustlsConnect::new(ClientConfig::clone(tls)),
                recycling,
            ),
            None => Manager::from_config(self.config, NoTls, recycling),
        };
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .build()
            .map_err(|e| PostgresConfigError::Pool(e.to_string()))?;
        let auto_migrate = self
            .auto_migrate
            .then(|| AutoMigrate::new(self.schema.migration(self.unlogged)));
        let store = PostgresStorage {
            inner: Arc::new(Inner {
                pool,
                auto_migrate,
                schema: self.schema,
                timeout: self.timeout,
                unlogged: self.unlogged,
                lease: self.lease,
            }),
        };
        if let (Some(every), Ok(runtime)) =
            (self.cleanup_every, tokio::runtime::Handle::try_current())
        {
            runtime.spawn(clean_while_alive(
                Arc::downgrade(&store.inner),
                every,
                self.cleanup_batch,
            ));
        }
        Ok(store)
    }

    /// The store, once the database answered and the schema is there
    /// (migrated first by a store built with
    /// [`auto_migrate`](Self::auto_migrate)).
    ///
    /// # Errors
    ///
    /// The database cannot be reached, or the table or its functions are
    /// missing ([`StorageError::Backend`], naming the migration to run), or
    /// the migration failed.
    pub async fn connect(self) -> Result<PostgresStorage, StorageError> {
        let auto_migrate = self.auto_migrate;
        let store = self
            .build()
            .map_err(|e| StorageError::Backend(Box::new(e)))?;
        if auto_migrate {
            store.migrate().await?;
        } else {
            store.ensure_migrated().await?;
        }
        Ok(store)
    }
}

/// Removes expired rows every `every`, while the store lives.
async fn clean_while_alive(inner: Weak<Inner>, every: Duration, batch: u32) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // A full batch: there may be more. Errors wait for the next tick.
        while let Ok(removed) = inner.cleanup(batch).await {
            if removed < u64::from(batch) {
                break;
            }
        }
    }
}
