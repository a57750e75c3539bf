//! gcra-core over PostgreSQL rows against the PL/pgSQL of
//! `PostgresStorage`, on one throwaway server of this machine: checks per
//! second, the server's CPU per check, and what contention does to each.
//!
//! `cargo bench -p rate-tier-storage --features postgres --bench postgres_cells`
//! (`-- --seconds N --clients 8,32`; 10 s per case, 8 and 32 clients by
//! default). Needs Debian's `postgresql` package (pgbench included).
//!
//! `PgCells` below is a [`Cells`] over one table (`key text PRIMARY KEY,
//! value bytea, version int8`): a read is one `SELECT ... WHERE key =
//! ANY($1)`; a conditional write is one conditional statement per cell
//! (`UPDATE ... WHERE key = $1 AND version = $old`, `INSERT ... ON CONFLICT
//! DO NOTHING` for a cell read absent, `DELETE ... WHERE version = $old`,
//! `SELECT ... FOR SHARE` for a cell that only holds the write), each of
//! which must touch one row, in one transaction (one statement, its own
//! transaction, when a single cell changes), rolled back if any touched
//! none. `CellStorage<PgCells>` then decides with gcra-core in this
//! process: a check is a read and a write, two round trips, where
//! `PostgresStorage` sends one statement.
//!
//! For each client count, in turn, 10 s each: `PostgresStorage` on one hot
//! key; on 10,000 keys; `CellStorage<PgCells>` on one hot key; on 10,000
//! keys; pgbench (`-M prepared`) running a plain `UPDATE` of one row by
//! primary key, one hot row, then 10,000 rows, the machine's ceiling for a
//! one-row write. Every store's client is a task of a 2-worker runtime
//! sharing one pool of as many connections as clients. The quota never
//! refuses (1,000,000 a minute), so every check writes its row; every key
//! is checked once before the first measure, so no case measures inserts.
//! The server's CPU is the postmaster's and its backends' user and system
//! time (`/proc`). Then the exactness check: a quota of 2,000 in 30 days on
//! one hot key, the largest client count hammering it for the same time:
//! exactly 2,000 checks must pass on each store.
#![allow(clippy::unwrap_used, missing_docs)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::{
    GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod,
};
use rate_tier_storage::StorageExt;
use rate_tier_storage::cells::{
    CellStorage, CellWrite, Cells, Change, Snapshot,
};
use rate_tier_storage::{
    BucketCheck, Decision, LimitName, PostgresStorage, Quota, Storage,
    StorageError,
};
use rate_tier_test_support::PostgresServer;
use rate_tier_test_support::bench::{
    Args, own_cpu_secs, pgbench, process_tree_cpu_secs,
};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

const USERS: usize = 10_000;
const TABLE: &str = "rate_tier_cells";

/// A [`Cells`] over PostgreSQL: see the file's docs.
#[derive(Debug)]
struct PgCells {
    pool: Pool,
    /// Conditional writes refused: a cell changed since its read.
    lost: AtomicU64,
}

impl PgCells {
    fn new(url: &str, connections: usize) -> PgCells {
        let manager = Manager::from_config(
            url.parse().unwrap(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(connections)
            .build()
            .unwrap();
        PgCells {
            pool,
            lost: AtomicU64::new(0),
        }
    }

    /// The table, and the sequence a cell's first version is drawn from:
    /// a cell deleted and created again never comes back at a version
    /// seen before (a write read at the old one must fail), as it would if
    /// every new cell started at 1.
    async fn migrate(&self) {
        let client = self.pool.get().await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {TABLE} \
                 (key text PRIMARY KEY, value bytea NOT NULL, version int8 NOT NULL); \
                 CREATE SEQUENCE IF NOT EXISTS {TABLE}_generation;"
            ))
            .await
            .unwrap();
    }

    /// One cell's condition and change: whether it touched its row.
    async fn apply(
        client: &impl GenericClient,
        write: &CellWrite<'_>,
    ) -> Result<bool, tokio_postgres::Error> {
        let key = write.key;
        let touched = match (&write.change, write.expected) {
            (Change::Put { value, .. }, Some(version)) => {
                let sql = format!(
                    "UPDATE {TABLE} SET value = $2, version = version + 1 \
                     WHERE key = $1 AND version = $3"
                );
                let statement = client.prepare_cached(&sql).await?;
                let version = version as i64;
                client.execute(&statement, &[&key, value, &version]).await?
            }
            (Change::Put { value, .. }, None) => {
                let sql = format!(
                    "INSERT INTO {TABLE} (key, value, version) \
                     VALUES ($1, $2, nextval('{TABLE}_generation') << 32) \
                     ON CONFLICT DO NOTHING"
                );
                let statement = client.prepare_cached(&sql).await?;
                client.execute(&statement, &[&key, value]).await?
            }
            (Change::Delete, Some(version)) => {
                let sql = format!(
                    "DELETE FROM {TABLE} WHERE key = $1 AND version = $2"
                );
                let statement = client.prepare_cached(&sql).await?;
                client
                    .execute(&statement, &[&key, &(version as i64)])
                    .await?
            }
            (Change::Keep, Some(version)) => {
                // Locked until the end of the transaction: a change of it
                // waits, then finds the version it holds.
                let sql = format!(
                    "SELECT 1 FROM {TABLE} WHERE key = $1 AND version = $2 FOR SHARE"
                );
                let statement = client.prepare_cached(&sql).await?;
                client
                    .execute(&statement, &[&key, &(version as i64)])
                    .await?
            }
            (Change::Keep | Change::Delete, None) => {
                // Absent, and kept so until the end of the transaction: a
                // row of our own, uncommitted, makes whoever inserts the key
                // wait; deleted at once, nobody ever reads it.
                let sql = format!(
                    "INSERT INTO {TABLE} (key, value, version) VALUES ($1, '', 0) \
                     ON CONFLICT DO NOTHING"
                );
                let statement = client.prepare_cached(&sql).await?;
                let touched = client.execute(&statement, &[&key]).await?;
                let sql = format!("DELETE FROM {TABLE} WHERE key = $1");
                let statement = client.prepare_cached(&sql).await?;
                client.execute(&statement, &[&key]).await?;
                touched
            }
        };
        Ok(touched == 1)
    }

    async fn write_all(
        &self,
        writes: &[CellWrite<'_>],
    ) -> Result<bool, tokio_postgres::Error> {
        let mut client = self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => e,
            e => panic!("the pool failed: {e}"),
        })?;
        if let [write] = writes
            && write.change != Change::Keep
        {
            return Self::apply(&client, write).await;
        }
        // In the keys' order, so that two writes of the same cells lock
        // them in the same order and never deadlock.
        let mut ordered: Vec<&CellWrite<'_>> = writes.iter().collect();
        ordered.sort_unstable_by_key(|write| write.key);
        let transaction = client.transaction().await?;
        for write in ordered {
            if !Self::apply(&transaction, write).await? {
                transaction.rollback().await?;
                return Ok(false);
            }
        }
        transaction.commit().await?;
        Ok(true)
    }
}

fn backend(e: impl std::error::Error + Send + Sync + 'static) -> StorageError {
    StorageError::Backend(Box::new(e))
}

#[async_trait::async_trait]
impl Cells for PgCells {
    async fn read(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<Snapshot>>, StorageError> {
        let client = self.pool.get().await.map_err(backend)?;
        let sql = format!(
            "SELECT key, value, version FROM {TABLE} WHERE key = ANY($1)"
        );
        let statement = client.prepare_cached(&sql).await.map_err(backend)?;
        let rows = client.query(&statement, &[&keys]).await.map_err(backend)?;
        let mut cells = vec![None; keys.len()];
        for row in rows {
            let key: &str = row.get(0);
            if let Some(i) = keys.iter().position(|k| k == key) {
                let version: i64 = row.get(2);
                cells[i] = Some(Snapshot::new(row.get(1), version as u64));
            }
        }
        Ok(cells)
    }

    async fn write_if(
        &self,
        writes: &[CellWrite<'_>],
    ) -> Result<bool, StorageError> {
        let written = match self.write_all(writes).await {
            Ok(written) => written,
            // Rolled back by the server: nothing was written.
            Err(e)
                if e.code().is_some_and(|code| {
                    *code == SqlState::T_R_DEADLOCK_DETECTED
                        || *code == SqlState::T_R_SERIALIZATION_FAILURE
                }) =>
            {
                false
            }
            Err(e) => return Err(backend(e)),
        };
        if !written {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        Ok(written)
    }

    fn kind(&self) -> &'static str {
        "postgres-cells"
    }
}

/// What one case counted.
#[derive(Debug, Default)]
struct Run {
    allowed: u64,
    refused: u64,
    contended: u64,
    errors: u64,
    lost: u64,
    seconds: f64,
    server_cpu: f64,
    client_cpu: f64,
}

impl Run {
    fn checks(&self) -> u64 {
        self.allowed + self.refused
    }

    fn per_sec(&self) -> f64 {
        self.checks() as f64 / self.seconds
    }

    fn server_us(&self) -> f64 {
        self.server_cpu / self.checks() as f64 * 1e6
    }

    fn client_us(&self) -> f64 {
        self.client_cpu / self.checks() as f64 * 1e6
    }
}

/// A store under test and its cells' count of lost writes, if any.
struct Subject {
    name: &'static str,
    store: Arc<dyn Storage>,
    cells: Option<Arc<PgCells>>,
}

/// The id of a user: `n` of 10,000, or the one hot user.
fn user(n: Option<usize>) -> String {
    n.map_or_else(|| "hot".to_owned(), |n| format!("user-{n}"))
}

/// `clients` tasks checking `limit` with `quota` for `seconds`, each on the
/// hot user (`spread` false) or on users of 10,000.
async fn drive(
    server: &PostgresServer,
    subject: &Subject,
    limit: &str,
    quota: Quota,
    spread: bool,
    clients: usize,
    seconds: f64,
) -> Run {
    let lost = || {
        subject
            .cells
            .as_ref()
            .map_or(0, |cells| cells.lost.load(Ordering::Relaxed))
    };
    let limit = Arc::new(LimitName::new(limit.to_owned()).unwrap());
    let counts: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let stop = Arc::new(AtomicBool::new(false));
    let pid = server.postmaster_pid().unwrap();
    let (lost_before, server_before, client_before) =
        (lost(), process_tree_cpu_secs(pid), own_cpu_secs());
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|t| {
            let (store, limit, counts, stop) = (
                subject.store.clone(),
                limit.clone(),
                counts.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut n = t * 7919;
                while !stop.load(Ordering::Relaxed) {
                    n = (n * 31 + 17) % USERS;
                    let id = user(spread.then_some(n));
                    let check =
                        [BucketCheck::new(&limit, &id, quota, 1).unwrap()];
                    let mut out = [Decision::default()];
                    let counted = match store.check(&check, &mut out).await {
                        Ok(decided) if decided.verdict.allowed => 0,
                        Ok(_) => 1,
                        Err(StorageError::Contended { .. }) => 2,
                        Err(e) => {
                            eprintln!("check failed: {e}");
                            3
                        }
                    };
                    counts[counted].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let [allowed, refused, contended, errors] =
        counts.each_ref().map(|n| n.load(Ordering::Relaxed));
    Run {
        allowed,
        refused,
        contended,
        errors,
        lost: lost() - lost_before,
        seconds: started.elapsed().as_secs_f64(),
        server_cpu: process_tree_cpu_secs(pid) - server_before,
        client_cpu: own_cpu_secs() - client_before,
    }
}

/// Every key of the run checked once (and a connection per client
/// opened), so that the measures update rows and never insert them.
async fn prefill(subject: &Subject, quota: Quota, clients: usize) {
    let limit = Arc::new(LimitName::new("free").unwrap());
    let tasks: Vec<_> = (0..clients)
        .map(|t| {
            let (store, limit) = (subject.store.clone(), limit.clone());
            tokio::spawn(async move {
                let users = (t..USERS).step_by(clients).map(Some);
                for n in users.chain((t == 0).then_some(None)) {
                    let id = user(n);
                    let check =
                        [BucketCheck::new(&limit, &id, quota, 1).unwrap()];
                    let mut out = [Decision::default()];
                    store.check(&check, &mut out).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let seconds: f64 = args.num("seconds", 10.0);
    let clients: Vec<usize> = args
        .get("clients")
        .unwrap_or("8,32")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    let most = clients.iter().copied().max().unwrap();
    let server = PostgresServer::start();
    let version = Command::new(server.bin_dir().join("postgres"))
        .arg("--version")
        .output()
        .unwrap();
    println!("{}", String::from_utf8_lossy(&version.stdout).trim());
    server
        .psql(&format!(
            "CREATE TABLE plain (key int PRIMARY KEY, n int8 NOT NULL) WITH (fillfactor = 70); \
             INSERT INTO plain SELECT g, 0 FROM generate_series(0, {}) g;",
            USERS - 1
        ))
        .unwrap();

    let plsql = PostgresStorage::builder(&server.url())
        .unwrap()
        .pool_size(most)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    plsql.migrate().await.unwrap();
    let cells = Arc::new(PgCells::new(&server.url(), most));
    cells.migrate().await;
    let subjects = [
        Subject {
            name: "PostgresStorage (PL/pgSQL)",
            store: Arc::new(plsql),
            cells: None,
        },
        Subject {
            name: "CellStorage<PgCells>",
            store: Arc::new(CellStorage::new(cells.clone())),
            cells: Some(cells),
        },
    ];
    // Never refuses: every check writes its row.
    let quota = Quota::per_minute(1_000_000);
    for subject in &subjects {
        prefill(subject, quota, most).await;
    }

    println!(
        "| clients | keys | what | checks/s | server CPU µs/check | client CPU µs/check | lost CAS / check | Contended | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &n in &clients {
        for subject in &subjects {
            for spread in [false, true] {
                let run =
                    drive(&server, subject, "free", quota, spread, n, seconds)
                        .await;
                let lost = if subject.cells.is_some() {
                    format!("{:.3}", run.lost as f64 / run.checks() as f64)
                } else {
                    "-".to_owned()
                };
                println!(
                    "| {n} | {} | {} | {:.0} | {:.1} | {:.1} | {lost} | {} | {} |",
                    if spread { "10,000" } else { "1 hot" },
                    subject.name,
                    run.per_sec(),
                    run.server_us(),
                    run.client_us(),
                    run.contended,
                    run.errors + run.refused,
                );
            }
        }
        for (keys, pick) in [
            ("1 hot", "\\set k 0\n".to_owned()),
            ("10,000", format!("\\set k random(0, {})\n", USERS - 1)),
        ] {
            let script =
                format!("{pick}UPDATE plain SET n = n + 1 WHERE key = :k;\n");
            let (tps, cpu) = pgbench(&server, &script, n, seconds);
            println!(
                "| {n} | {keys} | pgbench `UPDATE plain SET n = n + 1 WHERE key = :k` | {tps:.0} | {cpu:.1} | - | - | - | - |"
            );
        }
    }

    // Exactness: a finite quota on one hot key, every client on it.
    let exact = Quota::new(2_000, Duration::from_secs(30 * 86_400)).unwrap();
    for (i, subject) in subjects.iter().enumerate() {
        let limit = format!("exact{i}");
        let run =
            drive(&server, subject, &limit, exact, false, most, seconds).await;
        println!(
            "exactness, {}: {} clients, {} checks, {} passed of a quota of {}, {} refused, {} Contended, {} errors, {} lost CAS",
            subject.name,
            most,
            run.checks(),
            run.allowed,
            exact.burst(),
            run.refused,
            run.contended,
            run.errors,
            run.lost,
        );
        assert_eq!(run.allowed, u64::from(exact.burst()), "{}", subject.name);
    }
}
