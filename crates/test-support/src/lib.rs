//! The helpers every test of the tower-rate-tier workspace shares, and that
//! `cargo xtask` uses to get its servers (through the `trt-redis` binary).
//! Not published.
//!
//! - [`RedisServer`]: a throwaway Redis on a free loopback port (never
//!   6379), the same API whatever runs it: kill (SIGKILL), restart on the
//!   same port, pause and resume (a server that accepts connections and never
//!   answers), logs in every error, everything stopped and removed on drop.
//! - [`RedisCluster`] (and [`ClusterSpec`]): N masters with R replicas each,
//!   created with `redis-cli --cluster create`; kill a master and wait for a
//!   replica to take over ([`RedisCluster::kill_master`],
//!   [`RedisCluster::wait_for_failover`]).
//! - [`TcpProxy`]: forwards loopback connections to a target, and freezes
//!   them (silent, sockets kept open), holds new ones, or cuts everything.
//! - [`free_port`]: free loopback ports, never 6379.
//! - [`env`](mod@env): the servers `cargo xtask` started (`TRT_REDIS_URL`,
//!   `TRT_REDIS_CLUSTER_URLS`), [`unique`] names, [`TEST_TIMEOUT`],
//!   [`concurrent_passes`].
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
//! # Example
//!
//! ```no_run
//! use rate_tier_test_support::{RedisServer, TcpProxy};
//!
//! let mut server = RedisServer::start();
//! let proxy = TcpProxy::start(server.addr());
//! // ... a client on `proxy.redis_url()` ...
//! proxy.freeze(); // its connections go silent; new ones go through
//! server.kill();
//! server.restart(); // same port, empty
//! ```

mod backend;
pub mod bench;
mod cluster;
mod docker;
pub mod env;
mod error;
mod image;
mod keys;
mod monitor;
mod ports;
mod process;
mod proxy;
mod resp;
mod server;

pub use backend::{
    BACKEND_VAR, Backend, DEFAULT_IMAGE, IMAGE_VAR, Image, SERVER_BIN_VAR,
    docker_engine, find_cli, find_server,
};
pub use cluster::{
    ClusterNode, ClusterSpec, Failover, KilledMaster, RedisCluster,
};
pub use env::{
    TEST_TIMEOUT, cluster_urls, concurrent_passes, redis_url, unique,
};
pub use error::{Error, Result};
pub use image::build_local_image;
pub use keys::scan_keys;
pub use monitor::Monitor;
pub use ports::{SHARED_REDIS_PORT, free_port, try_free_port};
pub use proxy::TcpProxy;
pub use server::RedisServer;
