//! The helpers every test of the tower-rate-tier workspace shares, and that
//! `cargo xtask` uses to get its servers (through the `trt-redis` and
//! `trt-postgres` binaries). Not published.
//!
//! - [`RedisServer`]: a throwaway Redis on a free loopback port (never
//!   6379), the same API whatever runs it: kill (SIGKILL), restart on the
//!   same port, pause and resume (a server that accepts connections and never
//!   answers), logs in every error, everything stopped and removed on drop;
//!   [`RedisServer::start_at`] starts one whose wall clock reads a chosen
//!   instant (the end of a month) and runs on from there.
//! - [`RedisCluster`] (and [`ClusterSpec`]): N masters with R replicas each,
//!   created with `redis-cli --cluster create`; kill a master and wait for a
//!   replica to take over ([`RedisCluster::kill_master`],
//!   [`RedisCluster::wait_for_failover`]).
//! - [`PostgresServer`]: a throwaway PostgreSQL on a free loopback port
//!   (never 5432), the same API whatever runs it (`initdb` into a temporary
//!   directory and `pg_ctl`, or a container): kill (SIGKILL to every
//!   process), stop, restart on the same port with its data, pause and
//!   resume (the postmaster and every backend), logs in every error,
//!   everything stopped and removed on drop.
//! - [`TcpProxy`]: forwards loopback connections to a target, and freezes
//!   them (silent, sockets kept open), holds new ones, or cuts everything.
//! - [`free_port`]: free loopback ports, never 6379.
//! - [`env`](mod@env): the servers `cargo xtask` started (`TRT_REDIS_URL`,
//!   `TRT_REDIS_CLUSTER_URLS`, `TRT_POSTGRES_URL`), [`unique`] names,
//!   [`TEST_TIMEOUT`], [`concurrent_passes`].
//!
//! # Where the servers come from
//!
//! [`Backend::from_env`] chooses, once per process:
//!
//! | environment | servers |
//! |---|---|
//! | `TRT_REDIS_BACKEND=docker` (what `cargo xtask ... --docker` sets) | containers of `TRT_REDIS_IMAGE` (default `redis:7.0`), through testcontainers, on the host's network |
//! | `TRT_REDIS_BACKEND=process` | `redis-server` processes |
//! | `redis-server` on `PATH` (or `TRT_REDIS_SERVER_BIN`) | `redis-server` processes |
//! | otherwise, a Docker engine answers | containers, as above |
//! | neither | an error saying how to get either; a test that needs Redis fails, never passes silently |
//!
//! A machine with Docker but no registry builds the image from the installed
//! `redis-server` with `cargo xtask redis-image` ([`build_local_image`]).
//!
//! # Where PostgreSQL comes from
//!
//! [`PostgresBackend::from_env`] chooses, once per process, the same way:
//!
//! | environment | servers |
//! |---|---|
//! | `TRT_POSTGRES_BACKEND=docker` (what `cargo xtask ... --docker` sets) | containers of `TRT_POSTGRES_IMAGE` (default `postgres:15`), through testcontainers, on the host's network |
//! | `TRT_POSTGRES_BACKEND=process` | the installed server binaries |
//! | the server binaries found ([`find_postgres_bin_dir`]) | the installed server binaries |
//! | otherwise (and `TRT_POSTGRES_BIN_DIR` unset), a Docker engine answers | containers, as above |
//! | neither | an error saying how to get either (`apt-get install -y postgresql`, or Docker); a test that needs PostgreSQL fails, never passes silently |
//!
//! The server binaries (`initdb`, `pg_ctl`, `postgres`: Debian's
//! `postgresql` package) are found by [`find_postgres_bin_dir`]:
//!
//! | environment | binaries |
//! |---|---|
//! | `TRT_POSTGRES_BIN_DIR` (what `cargo xtask test` sets) | that directory; an error if they are not all there |
//! | `initdb` on `PATH` | its directory (where its symbolic link leads, else the `PATH` directory) |
//! | `/usr/lib/postgresql/<version>/bin` (Debian, Ubuntu) | the newest version |
//! | none | an error saying `apt-get install -y postgresql` |
//!
//! Each process server is a new cluster (`initdb -U postgres -A trust -E
//! UTF8 --locale=C`) in a temporary directory, started by `pg_ctl` on a free
//! loopback port with `listen_addresses=127.0.0.1`, its socket in that
//! directory, `fsync=off` and `full_page_writes=off`; its URL is
//! `postgres://postgres@127.0.0.1:<port>/postgres` (the superuser
//! `postgres`, trusted, no password, no TLS), whoever runs the tests.
//! PostgreSQL refuses to run as root: a root process runs `initdb` and
//! `pg_ctl` as the `postgres` system user (Debian's package creates it)
//! through `runuser -u postgres --` (else `su`), and gives it the directory;
//! without that user it is an error that says so.
//!
//! A container runs `postgres -p <port>` with the same settings, and its
//! image's entrypoint creates the same cluster in its empty data directory
//! (`POSTGRES_HOST_AUTH_METHOD=trust`); it is kept while it is down, so a
//! restart keeps the data. A machine with Docker but no registry builds the
//! image from the installed binaries with `cargo xtask postgres-image`
//! ([`build_local_postgres_image`]).
//!
//! `cargo xtask test` starts one for the whole run with `trt-postgres up` and
//! gives the tests its URL in `TRT_POSTGRES_URL` ([`postgres_url`]), and
//! `TRT_POSTGRES_BACKEND` with `TRT_POSTGRES_BIN_DIR` or
//! `TRT_POSTGRES_IMAGE`, so the servers the tests start themselves (to kill,
//! pause or restart them) run the same way.
//!
//! # Example
//!
//! ```no_run
//! use rate_tier_test_support::{PostgresServer, RedisServer, TcpProxy};
//!
//! let mut server = RedisServer::start();
//! let proxy = TcpProxy::start(server.addr());
//! // ... a client on `proxy.redis_url()` ...
//! proxy.freeze(); // its connections go silent; new ones go through
//! server.kill();
//! server.restart(); // same port, empty
//!
//! let mut postgres = PostgresServer::start();
//! postgres.psql("create table t (k int)").unwrap();
//! postgres.pause(); // the postmaster and every backend: SIGSTOP
//! postgres.resume();
//! postgres.kill();
//! postgres.restart(); // same port, same data: `t` is still there
//! ```

mod backend;
pub mod bench;
pub mod browser;
mod cluster;
mod docker;
pub mod env;
mod error;
mod fake_clock;
mod image;
mod keys;
mod monitor;
mod ports;
mod postgres;
mod process;
mod proxy;
mod resp;
mod server;
mod tls;

pub use backend::{
    BACKEND_VAR, Backend, DEFAULT_IMAGE, IMAGE_VAR, Image, SERVER_BIN_VAR,
    docker_engine, find_cli, find_server,
};
pub use cluster::{
    ClusterNode, ClusterSpec, Failover, KilledMaster, RedisCluster,
};
pub use env::{
    TEST_TIMEOUT, cluster_urls, concurrent_passes, postgres_url, redis_url,
    unique,
};
pub use error::{Error, Result};
pub use image::build_local_image;
pub use keys::scan_keys;
pub use monitor::Monitor;
pub use ports::{SHARED_REDIS_PORT, free_port, try_free_port};
pub use postgres::{
    DEFAULT_POSTGRES_IMAGE, POSTGRES_BACKEND_VAR, POSTGRES_BIN_DIR_VAR,
    POSTGRES_IMAGE_VAR, POSTGRES_SUPERUSER, POSTGRES_SYSTEM_USER,
    PostgresBackend, PostgresServer, SHARED_POSTGRES_PORT,
    build_local_postgres_image, find_postgres_bin_dir,
};
pub use proxy::TcpProxy;
pub use server::RedisServer;
pub use tls::TestCa;
