//! A store that puts its schema in place by itself
//! ([`PostgresStorageBuilder::auto_migrate`](super::PostgresStorageBuilder::auto_migrate)):
//! the migration runs before the first call that reaches the database, and
//! again after a call finds the table or a function missing.
//!
//! One migration at a time in a process (a mutex), and across processes:
//! the migration is one transaction that first takes its table's advisory
//! lock (migration.sql), so instances that start together wait for each
//! other, and each finds the schema the other made.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Mutex;
use tokio_postgres::Client;

/// Whether the schema is known to be in place, and the migration to run
/// when it is not.
#[derive(Debug)]
pub(super) struct AutoMigrate {
    sql: String,
    done: AtomicBool,
    running: Mutex<()>,
}

impl AutoMigrate {
    /// For the migration `sql`, not yet run.
    pub(super) fn new(sql: String) -> AutoMigrate {
        AutoMigrate {
            sql,
            done: AtomicBool::new(false),
            running: Mutex::new(()),
        }
    }

    /// Runs the migration on `client` unless it ran (or runs) already.
    pub(super) async fn ensure(
        &self,
        client: &Client,
    ) -> Result<(), tokio_postgres::Error> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one_at_a_time = self.running.lock().await;
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        client.batch_execute(&self.sql).await?;
        self.ran();
        Ok(())
    }

    /// The schema is in place (the migration ran).
    pub(super) fn ran(&self) {
        self.done.store(true, Ordering::Release);
    }

    /// A call found the schema missing (the table dropped, another
    /// database behind the same address): the next call migrates.
    pub(super) fn missing(&self) {
        self.done.store(false, Ordering::Release);
    }
}
