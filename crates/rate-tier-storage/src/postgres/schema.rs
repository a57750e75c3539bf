//! The schema's SQL, for one table name: the migration and the statements.

use std::fmt;

/// The migration, with `__TABLE__`, `__UNLOGGED__` and `__LOCKS__` to fill.
const MIGRATION: &str = include_str!("migration.sql");

/// The table's name when none is chosen.
pub(super) const DEFAULT_TABLE: &str = "rate_tier_buckets";

/// A table name that cannot be used.
///
/// ```
/// use rate_tier_storage::PostgresStorage;
/// let error = PostgresStorage::builder("postgres://localhost/app")
///     .unwrap()
///     .table("buckets; drop table users")
///     .unwrap_err();
/// assert!(error.to_string().contains("lowercase letters"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} cannot name the buckets' table: 1 to 48 lowercase letters, digits and `_`, starting with a letter or `_`, optionally after a schema and a dot of the same kind"
)]
pub struct InvalidTable(pub String);

/// A checked table name (`table` or `schema.table`) and what is built from
/// it.
#[derive(Debug, Clone)]
pub(super) struct Schema {
    pub(super) table: String,
    pub(super) check: String,
    /// One enforced bucket, at the database's clock: see [`one_bucket`].
    pub(super) check_one: String,
    /// A decision with a window, a period or a concurrency limit:
    /// `<table>_decide_mixed`.
    pub(super) decide_mixed: String,
    /// Slots given back: `<table>_release`.
    pub(super) release: String,
    /// Slots kept longer: `<table>_renew`.
    pub(super) renew: String,
    pub(super) settle: String,
    /// A reservation, at the database's clock: `<table>_reserve`.
    pub(super) reserve: String,
    /// Reservations given back: `<table>_cancel`.
    pub(super) cancel: String,
    pub(super) cleanup: String,
    pub(super) exists: String,
}

impl Schema {
    pub(super) fn new(table: &str) -> Result<Schema, InvalidTable> {
        let valid = |part: &str| {
            (1..=48).contains(&part.len())
                && part
                    .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && part.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
                })
        };
        let ok = match table.split_once('.') {
            Some((schema, name)) => valid(schema) && valid(name),
            None => valid(table),
        };
        if !ok {
            return Err(InvalidTable(table.to_owned()));
        }
        Ok(Schema {
            table: table.to_owned(),
            check: format!("SELECT {table}_check($1::text[], $2::int8[])"),
            check_one: one_bucket(table, NOW),
            decide_mixed: format!(
                "SELECT {table}_decide_mixed($1::text[], $2::int8[])"
            ),
            release: format!("SELECT {table}_release($1::text[], $2::int8[])"),
            renew: format!("SELECT {table}_renew($1::text[], $2::int8[])"),
            settle: format!("SELECT {table}_settle($1::text[], $2::int8[])"),
            reserve: format!(
                "SELECT {table}_reserve($1::text[], $2::int8[], $3::int8)"
            ),
            cancel: format!("SELECT {table}_cancel($1::text[], $2::int8[])"),
            cleanup: cleanup(table, NOW),
            // The functions of the other kinds and of reservations too: a
            // table migrated by an earlier version (rates only, without
            // concurrency limits or reservations) is migrated again first.
            exists: format!(
                "SELECT to_regclass('{table}') IS NOT NULL \
                 AND to_regprocedure('{table}_check(text[], int8[])') IS NOT NULL \
                 AND to_regprocedure('{table}_settle(text[], int8[])') IS NOT NULL \
                 AND to_regprocedure('{table}_decide_mixed(text[], int8[])') IS NOT NULL \
                 AND to_regprocedure('{table}_release(text[], int8[])') IS NOT NULL \
                 AND to_regprocedure('{table}_renew(text[], int8[])') IS NOT NULL \
                 AND to_regprocedure('{table}_reserve(text[], int8[], int8)') IS NOT NULL \
                 AND to_regprocedure('{table}_cancel(text[], int8[])') IS NOT NULL"
            ),
        })
    }

    /// The migration's SQL for this table.
    pub(super) fn migration(&self, unlogged: bool) -> String {
        MIGRATION
            .replace("__UNLOGGED__", if unlogged { "UNLOGGED" } else { "" })
            .replace("__LOCKS__", &lock_class(&self.table).to_string())
            .replace("__TABLE__", &self.table)
    }
}

/// The database's clock, in µs since the epoch, as the functions read it.
const NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::int8";

/// The cleanup at the time `now` (an SQL expression): up to `$1` rows whose
/// expiry has passed, in bounded batches, rows being decided skipped. The
/// expiry is not indexed (see migration.sql), so each batch scans until it
/// has found its rows. Every kind's rows: a rate's expires when its bucket
/// is full, a window's when its newest entry left the window, a period's
/// when the next period starts, a concurrency limit's when its latest
/// slot's lease ends (its slots never renewed nor released: an instance
/// that died holding them).
pub(super) fn cleanup(table: &str, now: &str) -> String {
    format!(
        "DELETE FROM {table} WHERE key IN (SELECT key FROM {table} \
         WHERE expires_us <= {now} LIMIT $1 FOR UPDATE SKIP LOCKED) \
         AND expires_us <= {now}"
    )
}

/// The statement that decides one enforced bucket (a cost of at least 1,
/// not a shadow) without a function call, at the time `now` (an SQL
/// expression): `$1` the key, `$2` T, `$3` tau, `$4` the cost (µs, units).
/// Only a bucket that passes is decided here: it answers the check
/// function's reply, in one row, and charges the bucket. Any other outcome
/// (a refusal, an argument or a time out of range) answers no row and
/// writes nothing, and the check function then decides (its reply says
/// why, and it writes what gcra-core would).
///
/// The rules are those of `<table>_check_at` (migration.sql) for one
/// bucket, and its lock: the same advisory lock, taken before the row is
/// read, so that this statement and the functions never decide a bucket at
/// the same time; the clock is read once the lock is held (`c` reads it
/// from the row of `l`), so that a check that waited for the lock is
/// charged at the end of its wait. A stored TAT in the past or out of range is now; one
/// beyond tau + the most debt needs no cap here, as a bucket that far
/// ahead refuses (the function caps it). A plain upsert costs the database
/// less than a PL/pgSQL call, whose every expression and statement the
/// interpreter runs, and most checks are one bucket that passes.
///
/// In the update, the time is the inserted row's TAT less the charge:
/// `excluded.tat_us - T * cost`.
pub(super) fn one_bucket(table: &str, now: &str) -> String {
    const MAX_TIME: &str = "9007199254740992";
    let locks = lock_class(table);
    let charge = "$2::int8 * $4::int8";
    let now_in_update = format!("(excluded.tat_us - {charge})");
    let tat = format!(
        "(CASE WHEN b.tat_us >= {n} AND b.tat_us <= {MAX_TIME} \
         THEN b.tat_us ELSE {n} END + {charge})",
        n = now_in_update
    );
    format!(
        "WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock({locks}, hashtext($1::text))), \
         c AS MATERIALIZED (SELECT {now} AS n FROM l), \
         up AS (INSERT INTO {table} AS b (key, tat_us, expires_us) \
         SELECT $1::text, c.n + {charge}, c.n + (({charge} + 999) / 1000) * 1000 FROM c \
         WHERE c.n >= 0 AND c.n <= {MAX_TIME} \
         AND $2::int8 >= 1 AND $3::int8 >= $2::int8 AND $3::int8 <= 1125899906842624 \
         AND $4::int8 >= 1 AND $4::int8 <= 4294967295 AND $2::int8 <= $3::int8 / $4::int8 \
         AND c.n + {charge} <= {MAX_TIME} \
         ON CONFLICT (key) DO UPDATE SET tat_us = {tat}, \
         expires_us = {now_in_update} + (({tat} - {now_in_update} + 999) / 1000) * 1000 \
         WHERE {tat} - {now_in_update} <= $3::int8 AND {tat} <= {MAX_TIME} \
         RETURNING b.tat_us) \
         SELECT ARRAY[1, ($3::int8 - (up.tat_us - c.n)) / $2::int8, 0, up.tat_us - c.n] FROM up, c"
    )
}

/// The class of the table's advisory locks: a fixed 32-bit number of its
/// name (FNV-1a), so that two tables never share a lock and the locks of
/// other code (`pg_advisory_lock(bigint)`, another key space) are apart.
fn lock_class(table: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in table.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    i32::from_ne_bytes(hash.to_ne_bytes())
}

/// The schema is not there: the migration was not run.
#[derive(Debug)]
pub(super) struct MissingSchema {
    pub(super) table: String,
}

impl fmt::Display for MissingSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the table `{table}` or its functions `{table}_check`, `{table}_settle`, \
             `{table}_decide_mixed`, `{table}_release`, `{table}_renew`, `{table}_reserve` \
             and `{table}_cancel` are missing: \
             run PostgresStorage::migrate() once (or the SQL of PostgresStorage::migration_sql())",
            table = self.table
        )
    }
}

impl std::error::Error for MissingSchema {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_filled_in_everywhere() {
        let schema = Schema::new("limits.buckets").unwrap();
        let sql = schema.migration(true);
        assert!(
            sql.contains(
                "CREATE UNLOGGED TABLE IF NOT EXISTS limits.buckets ("
            )
        );
        assert!(sql.contains("FUNCTION limits.buckets_check("));
        assert!(sql.contains("FUNCTION limits.buckets_decide_mixed("));
        assert!(sql.contains("FUNCTION limits.buckets_release("));
        assert!(sql.contains("FUNCTION limits.buckets_renew("));
        assert!(sql.contains("FUNCTION limits.buckets_reserve("));
        assert!(sql.contains("FUNCTION limits.buckets_cancel("));
        assert!(sql.contains("ALTER TABLE limits.buckets"));
        assert!(!sql.contains("__"));
        for bad in ["", "Buckets", "a-b", "a.b.c", "1a", "x;y", &"a".repeat(49)]
        {
            assert!(Schema::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_table_has_its_own_lock_class() {
        assert_ne!(lock_class("a"), lock_class("b"));
        assert_eq!(lock_class(DEFAULT_TABLE), lock_class(DEFAULT_TABLE));
    }
}
