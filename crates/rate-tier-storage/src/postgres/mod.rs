//! GCRA buckets in PostgreSQL: [`PostgresStorage`].

mod args;
mod builder;
mod job;
mod migrate;
mod reserve;
mod reset;
mod schema;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use gcra_core::{Decision, Lease, Verdict};
use smallvec::SmallVec;
use tokio_postgres::types::ToSql;

use self::args::{check_args, mixed_args, settle_args, slot_id, slots_args};
pub use self::builder::{PostgresConfigError, PostgresStorageBuilder};
use self::job::{Call, Layout};
use self::migrate::AutoMigrate;
pub use self::schema::InvalidTable;
use self::schema::{MissingSchema, Schema};
use crate::bucket::{BucketCheck, BucketSettle};
use crate::key::KeyLayout;
use crate::storage::{
    Adjustment, Answer, Capabilities, Decided, Mode, Storage, StorageError,
    validate,
};

/// GCRA buckets in PostgreSQL, shared by every instance that uses the same
/// database: for the services that run PostgreSQL and no Redis.
///
/// - **One statement per decision**: a PL/pgSQL function (see
///   [`migration_sql`](Self::migration_sql)) locks the buckets, decides them
///   as one all-or-nothing decision with gcra-core's rules, and writes
///   them, in one round trip. Several limits of a request are locked in one
///   fixed order (of their keys' hashes), so two decisions over the same
///   buckets never deadlock, and a bucket without a row is locked like any
///   other. The common case, one bucket that passes, is a plain upsert
///   with the same rules and the same lock, which costs the database about
///   half as much as the function; only when it does not pass (a refusal)
///   does the function decide it, in a second round trip.
/// - **Windows and periods** ([`Rule::Window`](crate::Rule::Window),
///   [`Rule::Period`](crate::Rule::Period)) too, in the same table and the
///   same decisions: a decision with one of them is
///   one call of another function (`<table>_decide_mixed`), which locks
///   its buckets with the same locks in the same order (so it never
///   deadlocks with, nor interleaves with, a decision of rates over the
///   same rows) and decides every kind all or nothing, as gcra-core's
///   crate docs say ("Several kinds in one decision") and the memory and
///   Redis stores do: a window or a period that refuses charges no rate, a
///   rate that refuses charges no window or period. A window's row keeps
///   its log (an `int8[]`, at most its limit of timestamps), a period's its
///   start and count; a row of another kind than the check's is read as
///   absent (a limit whose kind changed starts fresh). The rates'
///   statements are the same as without them.
/// - **Concurrency limits**
///   ([`Rule::Concurrency`](crate::Rule::Concurrency)) with leases, in the
///   same decisions: a row keeps one slot per request that holds one (the
///   request's id, [`BucketCheck::lease_id`], its cost, and when its lease
///   ends), and a decision counts the units of the slots still live, by
///   [`Concurrency::acquire`](gcra_core::Concurrency::acquire)'s rules. A
///   pass that stands takes its cost under the request's id, for the
///   store's [`lease`](PostgresStorageBuilder::lease) (30 s by default);
///   [`release`](crate::StorageExt::release) gives back that id's slots and
///   [`renew`](crate::StorageExt::renew) sets their expiry to now + the lease (the
///   limiter renews them every third of it while the request runs), both
///   under the same locks. Slots an instance never releases nor renews (it
///   died) are free once their lease ends, and their row goes by the
///   cleanup. A check without an id (0) takes anonymous slots: a release
///   gives back its cost of them, a renewal renews them all.
/// - **Reservations** of rates ([`StorageExt::reserve`](crate::StorageExt::reserve)): the earliest slot
///   at which every rate passes, by [`gcra_core::reserve_all`]'s rules, in
///   one call of `<table>_reserve` under the locks of a check, in the same
///   order, the clock read once they are held (so the reservations of one
///   bucket are in turn, each slot after the last); all or nothing, and a
///   wait too long writes nothing. [`StorageExt::cancel`](crate::StorageExt::cancel) gives them back
///   (`<table>_cancel`, [`Quota::cancel`](gcra_core::Quota::cancel) per
///   bucket: exact while last, else the slot stays taken). A reservation is
///   sent once and never retried: a reply lost after it ran leaves at most
///   a lost slot, never a second one; one that comes after its caller left
///   is given back.
/// - **The database's clock** (`clock_timestamp()`), as Redis's `TIME`:
///   every instance measures against one clock. Every statement and
///   function reads it once it holds its buckets' locks, so that a
///   decision that waited for a lock is decided at the end of its wait.
/// - **One row per bucket**: the same hashed key as Redis (never a user id
///   in clear), its TAT in µs, and its expiry. Expired rows are removed in
///   the background in bounded batches (every minute, 1000 rows a
///   statement, unless the builder says otherwise); a row read after its
///   expiry is a full bucket anyway. A TAT that is corrupt or out of range
///   is treated as absent (in the past) or capped (too far ahead), as in
///   Redis.
/// - **Bounded calls**: each call waits at most the builder's
///   [`timeout`](PostgresStorageBuilder::timeout) (500 ms by default);
///   behind a [`FallbackStorage`](crate::FallbackStorage), a stopped or
///   hung PostgreSQL is decided locally. A decision whose caller stopped
///   waiting is run to its end and its charges refunded, so that no
///   request is charged twice: its rates are refunded and its slots
///   released; a window's entry or a period's count stays charged (an
///   over-charge, never a request forgiven; see `job.rs`). Connections
///   come from a pool (deadpool-postgres); a lost one is replaced.
/// - **Never silently at start**: the table and its functions are created
///   by [`migrate`](Self::migrate) (or the SQL of
///   [`migration_sql`](Self::migration_sql), run by hand);
///   [`connect`](PostgresStorageBuilder::connect) checks they are there and
///   fails with an error naming the migration when they are not. A store
///   built with [`auto_migrate`](PostgresStorageBuilder::auto_migrate)
///   creates them itself, when the database first answers (an instance
///   may start while its database is down) and whenever a call finds them
///   missing.
///
/// ```no_run
/// use rate_tier_storage::{BucketCheck, LimitName, PostgresStorage, Storage, StorageExt};
/// use gcra_core::{Decision, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "postgres://app@127.0.0.1/app";
/// // Once, at deploy time:
/// PostgresStorage::builder(url)?.build()?.migrate().await?;
/// // In every instance:
/// let store = PostgresStorage::builder(url)?.connect().await?;
/// let free = LimitName::new("free")?;
/// let check = [BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?];
/// let mut out = [Decision::default()];
/// assert!(store.check(&check, &mut out).await?.verdict.allowed);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresStorage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pool: Pool,
    schema: Schema,
    timeout: Duration,
    unlogged: bool,
    lease: Lease,
    /// For a store that migrates by itself: whether it did.
    auto_migrate: Option<AutoMigrate>,
}

impl PostgresStorage {
    /// How long a call may take before it fails with
    /// [`StorageError::Timeout`], unless set with
    /// [`PostgresStorageBuilder::timeout`].
    ///
    /// ```
    /// assert_eq!(
    ///     rate_tier_storage::PostgresStorage::DEFAULT_TIMEOUT,
    ///     std::time::Duration::from_millis(500)
    /// );
    /// ```
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

    /// A builder for the database at `url` (`postgres://user:pass@host/db`,
    /// or libpq's `key=value` form).
    ///
    /// TLS (rustls) is libpq's `sslmode`: `require`, `verify-ca` or
    /// `verify-full` connect with TLS and always check the server's
    /// certificate, its chain against `sslrootcert` (a CA file: a managed
    /// database's provider CA) or else the public roots built in, and its
    /// name against the host (stricter than libpq's `require` and
    /// `verify-ca`, which check less); absent, `disable` or `prefer`:
    /// no TLS.
    ///
    /// # Errors
    ///
    /// A URL that does not parse; an unknown `sslmode`; an `sslrootcert`
    /// that cannot be read or holds no certificate
    /// ([`PostgresConfigError::Tls`]).
    ///
    /// ```
    /// use rate_tier_storage::{PostgresConfigError, PostgresStorage};
    /// assert!(PostgresStorage::builder("postgres://app@db.internal/app").is_ok());
    /// assert!(PostgresStorage::builder("postgres://app@db:port/app").is_err());
    /// // TLS, the certificate checked against the public roots.
    /// assert!(PostgresStorage::builder("postgres://app@db.example.com/app?sslmode=verify-full").is_ok());
    /// let missing = "postgres://app@db/app?sslmode=verify-full&sslrootcert=/nonexistent.pem";
    /// assert!(matches!(PostgresStorage::builder(missing), Err(PostgresConfigError::Tls(_))));
    /// ```
    pub fn builder(
        url: &str,
    ) -> Result<PostgresStorageBuilder, PostgresConfigError> {
        PostgresStorageBuilder::new(url)
    }

    /// The statement a check of one enforced bucket sends first (it answers
    /// only a bucket that passes; see [`PostgresStorage`]): at the
    /// database's clock as the store sends it, or with the time as its
    /// parameter `$5` (µs since the epoch) for the tests that drive time.
    /// For tests and benchmarks.
    #[doc(hidden)]
    pub fn one_bucket_sql(
        table: &str,
        time_as_parameter: bool,
    ) -> Result<String, InvalidTable> {
        let schema = Schema::new(table)?;
        Ok(if time_as_parameter {
            schema::one_bucket(&schema.table, "$5::int8")
        } else {
            schema.check_one
        })
    }

    /// The statement of a decision with a window, a period or a
    /// concurrency limit (see [`PostgresStorage::mixed_args`]): `$1` the
    /// keys, `$2` the arguments,
    /// at the database's clock as the store sends it, or with the time as
    /// its parameter `$3` (µs since the epoch) for the tests that drive
    /// time. For tests and benchmarks.
    #[doc(hidden)]
    pub fn mixed_sql(
        table: &str,
        time_as_parameter: bool,
    ) -> Result<String, InvalidTable> {
        let schema = Schema::new(table)?;
        Ok(if time_as_parameter {
            format!(
                "SELECT {table}_decide_mixed_at($1::text[], $2::int8[], $3::int8)"
            )
        } else {
            schema.decide_mixed
        })
    }

    /// The statement that releases slots (`renew` false: 2 arguments per
    /// key in `$2`, the id and the units) or renews them (`renew` true: the
    /// id and the lease in µs), `$1` the keys, at the database's clock as
    /// the store sends it, or with the time as its parameter `$3` (µs
    /// since the epoch). For tests.
    #[doc(hidden)]
    pub fn slots_sql(
        table: &str,
        renew: bool,
        time_as_parameter: bool,
    ) -> Result<String, InvalidTable> {
        let schema = Schema::new(table)?;
        let function = if renew { "renew" } else { "release" };
        Ok(match (time_as_parameter, renew) {
            (true, _) => format!(
                "SELECT {table}_{function}_at($1::text[], $2::int8[], $3::int8)"
            ),
            (false, true) => schema.renew,
            (false, false) => schema.release,
        })
    }

    /// The id of slots as the functions take it: the 64 bits of
    /// [`BucketCheck::lease`] as an `int8`. For tests.
    #[doc(hidden)]
    pub fn slot_id(id: u64) -> i64 {
        slot_id(id)
    }

    /// The cleanup statement (`$1` the most rows it removes) at the
    /// database's clock, or with the time as its parameter `$2` (µs since
    /// the epoch). For tests.
    #[doc(hidden)]
    pub fn cleanup_sql(
        table: &str,
        time_as_parameter: bool,
    ) -> Result<String, InvalidTable> {
        let schema = Schema::new(table)?;
        Ok(if time_as_parameter {
            schema::cleanup(table, "$2::int8")
        } else {
            schema.cleanup
        })
    }

    /// The 6 arguments of `check` in a decision of
    /// [`mixed_sql`](Self::mixed_sql), as a store whose lease is
    /// `lease_us` sends them: a tag (0 a rate, 1 a window, 2 a period, 3 a
    /// concurrency limit), three numbers of the rule (a rate's `T`, `tau`
    /// and max debt; a window's limit, length in µs and 0; a period's
    /// limit, unit (0 day, 1 ISO week, 2 month) and offset from UTC in s;
    /// a concurrency limit's limit, the lease in µs and the slots' id, see
    /// [`slot_id`](Self::slot_id)), the cost and the shadow flag. For
    /// tests.
    ///
    /// # Errors
    ///
    /// A lease out of range ([`StorageError::Protocol`]).
    #[doc(hidden)]
    pub fn mixed_args(
        check: &BucketCheck<'_>,
        lease_us: u64,
    ) -> Result<[i64; 6], StorageError> {
        let lease = Lease::new(Duration::from_micros(lease_us))
            .map_err(|e| StorageError::Protocol(e.to_string()))?;
        mixed_args(check, lease)
    }

    /// The SQL that [`migrate`](Self::migrate) runs, for a table named
    /// `table` (`rate_tier_buckets` by default), `UNLOGGED` or not: to read,
    /// or to run with your own migration tool.
    ///
    /// # Errors
    ///
    /// A table name that cannot be used.
    ///
    /// ```
    /// use rate_tier_storage::PostgresStorage;
    /// let sql = PostgresStorage::migration_sql("rate_tier_buckets", false)?;
    /// assert!(sql.contains("CREATE  TABLE IF NOT EXISTS rate_tier_buckets ("));
    /// assert!(sql.contains("FUNCTION rate_tier_buckets_check(keys text[], args bigint[])"));
    /// # Ok::<(), rate_tier_storage::InvalidTable>(())
    /// ```
    pub fn migration_sql(
        table: &str,
        unlogged: bool,
    ) -> Result<String, InvalidTable> {
        Ok(Schema::new(table)?.migration(unlogged))
    }

    /// Creates the table (if it is not there; a table of an earlier
    /// version gets the columns of windows, periods and concurrency slots)
    /// and (re)creates its functions. Safe to run again, and by several
    /// instances at once (they wait for each other). Run by the store by
    /// itself only if it was built with
    /// [`auto_migrate`](PostgresStorageBuilder::auto_migrate).
    ///
    /// # Errors
    ///
    /// The database refused (a connection that fails, a user without the
    /// right to create).
    pub async fn migrate(&self) -> Result<(), StorageError> {
        let sql = self.inner.schema.migration(self.inner.unlogged);
        let client = self.inner.connection().await?;
        client.batch_execute(&sql).await.map_err(backend)?;
        if let Some(auto) = &self.inner.auto_migrate {
            auto.ran();
        }
        Ok(())
    }

    /// Whether the table and its functions are there.
    ///
    /// # Errors
    ///
    /// The database cannot be reached.
    pub async fn is_migrated(&self) -> Result<bool, StorageError> {
        let client = self.inner.connection().await?;
        let row = client
            .query_one(&self.inner.schema.exists, &[])
            .await
            .map_err(backend)?;
        row.try_get(0).map_err(backend)
    }

    /// Nothing when the table and its functions are there; else an error
    /// naming the table and the migration to run.
    ///
    /// # Errors
    ///
    /// The schema is missing ([`StorageError::Backend`]), or the database
    /// cannot be reached.
    pub async fn ensure_migrated(&self) -> Result<(), StorageError> {
        if self.is_migrated().await? {
            return Ok(());
        }
        Err(StorageError::Backend(Box::new(MissingSchema {
            table: self.inner.schema.table.clone(),
        })))
    }

    /// Removes up to `batch` expired rows, rows being decided skipped;
    /// returns how many. The store does it by itself every
    /// [`cleanup_every`](PostgresStorageBuilder::cleanup_every).
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn cleanup(&self, batch: u32) -> Result<u64, StorageError> {
        self.inner.cleanup(batch).await
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.schema.table
    }
}

impl Inner {
    /// A pooled connection, within the store's timeout, for the schema's
    /// own statements (the migration and its check).
    async fn connection(
        &self,
    ) -> Result<deadpool_postgres::Client, StorageError> {
        match tokio::time::timeout(self.timeout, self.pool.get()).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(error)) => Err(StorageError::Backend(Box::new(error))),
            Err(_) => Err(StorageError::Timeout(self.timeout)),
        }
    }

    /// A pooled connection, within the store's timeout, ready for the
    /// schema's tables and functions (see [`Inner::ready`]).
    async fn client(&self) -> Result<deadpool_postgres::Client, StorageError> {
        match tokio::time::timeout(self.timeout, self.ready()).await {
            Ok(ready) => ready,
            Err(_) => Err(StorageError::Timeout(self.timeout)),
        }
    }

    /// A pooled connection, once the schema is in place for a store that
    /// migrates by itself. Unbounded: its callers bound it.
    async fn ready(&self) -> Result<deadpool_postgres::Client, StorageError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| StorageError::Backend(Box::new(e)))?;
        if let Some(auto) = &self.auto_migrate {
            auto.ensure(&client).await.map_err(backend)?;
        }
        Ok(client)
    }

    /// One call of a function of the schema: its reply, `expected` numbers.
    pub(super) async fn call(
        &self,
        statement: &str,
        keys: &[String],
        args: &[i64],
        expected: usize,
    ) -> Result<Vec<i64>, StorageError> {
        self.reply(statement, &[&keys, &args], expected)
            .await?
            .ok_or_else(|| {
                StorageError::Protocol(format!("{statement} returned no row"))
            })
    }

    /// A decision. Of rates: one enforced bucket that passes by the
    /// one-bucket statement ([`schema::one_bucket`]), anything else
    /// (several buckets, a peek, a shadow, a refusal) by the check
    /// function, whose reply it is either way. With a window, a period or
    /// a concurrency limit: the mixed function, one call.
    async fn check(
        &self,
        layout: Layout,
        keys: &[String],
        args: &[i64],
    ) -> Result<Vec<i64>, StorageError> {
        if layout == Layout::Mixed {
            return self
                .call(&self.schema.decide_mixed, keys, args, keys.len() * 4)
                .await;
        }
        if let ([key], &[t, tau, cost, 0, _]) = (keys, args)
            && cost > 0
        {
            let params: [&(dyn ToSql + Sync); 4] = [key, &t, &tau, &cost];
            if let Some(reply) =
                self.reply(&self.schema.check_one, &params, 4).await?
            {
                return Ok(reply);
            }
        }
        self.call(&self.schema.check, keys, args, keys.len() * 4)
            .await
    }

    /// `statement` with `params` on a pooled connection, prepared once per
    /// connection: its one row's `expected` non-negative integers, or
    /// `None` when it answers no row. Bounded by the caller
    /// (`job::within`), not by the store's timeout: a decision whose caller
    /// left still runs to its end.
    async fn reply(
        &self,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
        expected: usize,
    ) -> Result<Option<Vec<i64>>, StorageError> {
        let client = self.ready().await?;
        let prepared = client
            .prepare_cached(statement)
            .await
            .map_err(|e| self.error(e))?;
        let Some(row) = client
            .query_opt(&prepared, params)
            .await
            .map_err(|e| self.error(e))?
        else {
            return Ok(None);
        };
        let reply: Vec<i64> = row.try_get(0).map_err(backend)?;
        if reply.len() != expected || reply.iter().any(|&n| n < 0) {
            return Err(StorageError::Protocol(format!(
                "{statement} returned {reply:?}, expected {expected} non-negative integers"
            )));
        }
        Ok(Some(reply))
    }

    async fn cleanup(&self, batch: u32) -> Result<u64, StorageError> {
        let client = self.client().await?;
        let limit = i64::from(batch);
        client
            .execute(&self.schema.cleanup, &[&limit])
            .await
            .map_err(|e| self.error(e))
    }

    /// A database error, the missing schema said as such (and, for a store
    /// that migrates by itself, migrated again by the next call).
    fn error(&self, error: tokio_postgres::Error) -> StorageError {
        use tokio_postgres::error::SqlState;
        let missing = error.code().is_some_and(|code| {
            *code == SqlState::UNDEFINED_FUNCTION
                || *code == SqlState::UNDEFINED_TABLE
        });
        if missing {
            if let Some(auto) = &self.auto_migrate {
                auto.missing();
            }
            return StorageError::Backend(Box::new(MissingSchema {
                table: self.schema.table.clone(),
            }));
        }
        backend(error)
    }
}

fn backend(error: tokio_postgres::Error) -> StorageError {
    StorageError::Backend(Box::new(error))
}

impl PostgresStorage {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        validate(checks, out)?;
        let (layout, args) = if checks.iter().all(BucketCheck::is_rate) {
            (Layout::Rates, check_args(checks)?)
        } else {
            let mut args = Vec::with_capacity(checks.len() * 6);
            for check in checks {
                args.extend(mixed_args(check, self.inner.lease)?);
            }
            (Layout::Mixed, args)
        };
        let keys: Vec<String> =
            checks.iter().map(|c| c.key(KeyLayout::Single)).collect();
        let reply = job::decide(&self.inner, layout, keys, args).await?;
        for (slot, n) in out.iter_mut().zip(reply.chunks_exact(4)) {
            let allowed = match n[0] {
                0 => false,
                1 => true,
                other => {
                    return Err(StorageError::Protocol(format!(
                        "{}_{} returned allowed = {other}",
                        self.inner.schema.table,
                        layout.function()
                    )));
                }
            };
            // Non-negative: checked by `call`.
            let [remaining, retry_after_us, reset_after_us] =
                [n[1], n[2], n[3]].map(|v| u64::try_from(v).unwrap_or(0));
            *slot = Decision {
                allowed,
                remaining,
                retry_after_us,
                reset_after_us,
                store: None,
            };
        }
        let shadows: SmallVec<[bool; 4]> =
            checks.iter().map(BucketCheck::is_shadow).collect();
        Ok(Decided::new(Verdict::of(shadows, out), None, "postgres"))
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        if settles.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = settles
            .iter()
            .map(|s| s.bucket.key(KeyLayout::Single))
            .collect();
        let mut args = Vec::with_capacity(settles.len() * 4);
        for settle in settles {
            let quota = settle.bucket.quota();
            args.extend(settle_args(quota, settle.adjust)?);
        }
        job::settle(&self.inner, keys, args).await
    }

    /// Gives back each check's slots: at most its cost of the slots its id
    /// ([`BucketCheck::lease`]) holds on its bucket, in one statement under
    /// the buckets' locks; run to its end once sent, whether or not the
    /// caller waits. Slots already expired are dropped with them. A check
    /// that is not a concurrency limit's is [`StorageError::Unsupported`].
    async fn release_slots(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        if slots.is_empty() {
            return Ok(());
        }
        let (keys, args) = slots_args(slots, |c| i64::from(c.cost()))?;
        job::run(&self.inner, Call::Release, keys, args)
            .await
            .map(drop)
    }

    /// Sets the expiry of each check's live slots (those of its id) to the
    /// lease from now, at the database's clock, in one statement under the
    /// buckets' locks. An expired slot is not taken again: its request
    /// lost it (a limit that another request may now hold).
    async fn renew_slots(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        if slots.is_empty() {
            return Ok(());
        }
        let lease = i64::try_from(self.inner.lease.lease_us())
            .map_err(|_| StorageError::Protocol("lease beyond int8".into()))?;
        let (keys, args) = slots_args(slots, |_| lease)?;
        job::run(&self.inner, Call::Renew, keys, args)
            .await
            .map(drop)
    }
}

impl Storage for PostgresStorage {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { max_wait } => {
                Answer::pending(self.reserve_rates(checks, max_wait, out))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        Answer::pending(async move {
            match adjustment {
                Adjustment::Settle(settles) => {
                    self.settle_buckets(settles).await
                }
                Adjustment::Cancel(reserved) => {
                    self.cancel_rates(reserved).await
                }
                Adjustment::Release(slots) => self.release_slots(slots).await,
                Adjustment::Renew(slots) => self.renew_slots(slots).await,
            }
        })
    }

    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        Answer::pending(self.reset_buckets(buckets))
    }

    /// Every kind, reservations, and slots with the store's lease (see
    /// [`PostgresStorageBuilder::lease`]).
    fn capabilities(&self) -> Capabilities {
        let mut postgres = Capabilities::new("postgres")
            .with_every_kind()
            .always_pending();
        postgres.reserves = true;
        postgres.lease =
            Some(Duration::from_micros(self.inner.lease.lease_us()));
        postgres
    }
}
