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
    pub(super) settle: String,
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
            settle: format!("SELECT {table}_settle($1::text[], $2::int8[])"),
            // Bounded batches, rows being decided skipped: the expiry is
            // not indexed (see migration.sql), so each batch scans until it
            // has found its rows.
            cleanup: format!(
                "DELETE FROM {table} WHERE key IN (SELECT key FROM {table} \
                 WHERE expires_us <= (extract(epoch FROM clock_timestamp()) * 1000000)::int8 \
                 LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 AND expires_us <= (extract(epoch FROM clock_timestamp()) * 1000000)::int8"
            ),
            exists: format!(
                "SELECT to_regclass('{table}') IS NOT NULL \
                 AND to_regprocedure('{table}_check(text[], int8[])') IS NOT NULL \
                 AND to_regprocedure('{table}_settle(text[], int8[])') IS NOT NULL"
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
            "the table `{table}` or its functions `{table}_check` and `{table}_settle` are missing: \
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
