//! The command line and environment of the `rate-tier-service` binary.
//!
//! Flags are parsed by clap; the environment is envoyproxy/ratelimit's
//! (`HOST`, `PORT`, `GRPC_HOST`, `GRPC_PORT`, `DEBUG_HOST`, `DEBUG_PORT`,
//! `RUNTIME_ROOT`, `REDIS_URL`, `SHADOW_MODE`, ..., see [`ENVIRONMENT`]),
//! read through a lookup so that a test gives its own. A flag wins over
//! the environment; the environment over the defaults.
//!
//! ```
//! use rate_tier_service::cli::{Command, parse, parse_with_env};
//! let command = parse(["--config", "rl.yaml", "--redis-cluster", "10.0.0.1:7000,10.0.0.2:7000"])?;
//! let Command::Serve(serve) = command else { unreachable!() };
//! assert_eq!(serve.options.config_path.to_str(), Some("rl.yaml"));
//! assert!(parse(["--config", "a", "--redis", "redis://x", "--redis-cluster", "y:1"]).is_err());
//! assert!(matches!(parse(["check-config", "rl.yaml"])?, Command::CheckConfig(_)));
//! assert!(matches!(parse(["migrate", "--postgres", "postgres://db/app"])?, Command::Migrate(_)));
//! assert!(parse(["--config", "a", "--redis", "redis://x", "--postgres", "postgres://db/app"]).is_err());
//!
//! // The admin API: a port alone is on loopback; it needs its token file.
//! let Command::Serve(serve) = parse(["--config", "a", "--admin", "6071", "--admin-token-file", "t"])? else {
//!     unreachable!()
//! };
//! let admin = serve.options.admin.expect("the admin API");
//! assert_eq!(admin.addr.to_string(), "127.0.0.1:6071");
//! assert_eq!(admin.token_file.to_str(), Some("t"));
//! assert!(parse(["--config", "a", "--admin", "6071"]).unwrap_err().contains("--admin-token-file"));
//!
//! // envoyproxy/ratelimit's environment alone.
//! let env = |name: &str| match name {
//!     "PORT" => Some("9080".to_owned()),
//!     "HOST" => Some("0.0.0.0".to_owned()),
//!     "RUNTIME_ROOT" => Some("/data".to_owned()),
//!     "RUNTIME_SUBDIRECTORY" => Some("ratelimit".to_owned()),
//!     _ => None,
//! };
//! let Command::Serve(serve) = parse_with_env(Vec::<String>::new(), env)? else { unreachable!() };
//! assert_eq!(serve.options.http_addr.to_string(), "0.0.0.0:9080");
//! assert_eq!(serve.options.config_path.to_str(), Some("/data/ratelimit/config"));
//! # Ok::<(), String>(())
//! ```

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};

mod environment;

use self::environment::{
    Environment, go_listen_addr, log_level, near_limit_ratio, path_of,
};
use crate::admin::AdminOptions;
use crate::server::{ServiceOptions, StoreChoice};
use tower_rate_tier::headers::HeaderStyle;

/// The environment variables the service reads: envoyproxy/ratelimit's
/// names and defaults where they mean something here, and its own. Shown
/// by `--help`; the service README maps every envoyproxy/ratelimit
/// setting.
pub const ENVIRONMENT: &str = "\
ENVIRONMENT (envoyproxy/ratelimit's names; a flag wins over its variable):
    HOST, PORT                  the HTTP listener (default 127.0.0.1, 8080)
    GRPC_HOST, GRPC_PORT        the gRPC listener (default 127.0.0.1, 8081)
    DEBUG_HOST, DEBUG_PORT      the debug listener: /rlconfig, /healthcheck, /status (default 127.0.0.1, 6070)
    RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY
                                without --config, the config directory is ROOT/SUBDIRECTORY/APPDIRECTORY
                                (default /srv/runtime_data/current, none, config)
    REDIS_URL                   HOST:PORT (a path with REDIS_SOCKET_TYPE=unix, or a redis:// URL):
                                share the limits through Redis; REDIS_TYPE=CLUSTER for a cluster
                                (its nodes comma-separated)
    REDIS_AUTH                  the Redis password, or USER:PASSWORD
    REDIS_TLS, REDIS_TLS_CACERT true: TLS (rediss://); the CA file its certificate is checked against
                                (default: the public roots)
    REDIS_TIMEOUT               a Redis call's bound before the local fallback decides (default 100ms)
    SHADOW_MODE                 true: decide and count, never refuse
    NEAR_LIMIT_RATIO            the share of a limit above which a pass counts as near it (default 0.8)
    LIMIT_RESPONSE_HEADERS_ENABLED
                                true: the IETF RateLimit-Policy and RateLimit fields on /json
    LOG_LEVEL, LOG_FORMAT       debug, info, warn or error (default info; RUST_LOG wins), text or json
    USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH
                                true: the metrics on a listener of their own too (default :9090, /metrics)
    POSTGRES_URL                share the limits through PostgreSQL (as --postgres)
    DRAIN_PERIOD                on SIGTERM, how long to keep answering while health says not serving
                                (default 5s)
A variable whose feature this service does not have (BACKEND_TYPE=memcache, REDIS_TYPE=SENTINEL,
REDIS_TLS_CLIENT_CERT, CONFIG_TYPE=GRPC_XDS, GRPC_SERVER_USE_TLS=true, ...) stops it at start.
";

const ADMIN_HELP: &str = "\
ADMIN API (every request with `authorization: Bearer TOKEN`, else 401; JSON in and out):
    POST /admin/reset   {\"domain\": D, \"descriptors\": [{\"entries\": [{\"key\": K, \"value\": V}]}]}
                        puts the buckets those descriptors map to back to full
    POST /admin/peek    the same body: each descriptor's limit, remaining and reset, charging nothing
    GET  /admin/rules   the rules in use: domain, descriptors, name, unit, requests_per_unit, shadow
";

/// The flags, as clap reads them.
#[derive(Debug, Parser)]
#[command(
    name = "rate-tier-service",
    version,
    about = "A GCRA drop-in for envoyproxy/ratelimit (Envoy RLS v3)",
    args_conflicts_with_subcommands = true,
    after_long_help = format!("{ENVIRONMENT}\n{ADMIN_HELP}"),
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    #[command(flatten)]
    serve: Flags,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Exits 0 when the config is valid, 1 with the file, the line and the
    /// reason otherwise.
    CheckConfig {
        /// A YAML file or a directory of them.
        path: PathBuf,
    },
    /// Creates (or updates) the PostgreSQL store's table and functions,
    /// then exits.
    Migrate {
        /// The database (or POSTGRES_URL).
        #[arg(long, value_name = "URL")]
        postgres: Option<String>,
    },
}

#[derive(Debug, Args)]
struct Flags {
    /// A YAML file or a directory of them (envoyproxy/ratelimit format);
    /// default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The gRPC listener (default GRPC_HOST:GRPC_PORT, 127.0.0.1:8081).
    #[arg(long, value_name = "ADDR")]
    grpc: Option<SocketAddr>,
    /// The HTTP listener: /json, /healthcheck, /metrics (default
    /// HOST:PORT, 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// The debug listener: /rlconfig, /healthcheck, /status (default
    /// DEBUG_HOST:DEBUG_PORT, 127.0.0.1:6070), or `off`.
    #[arg(long, value_name = "ADDR|off")]
    debug: Option<String>,
    /// Share the limits through one Redis (with a local fallback).
    #[arg(long, value_name = "URL", group = "store")]
    redis: Option<String>,
    /// ... or a Redis Cluster: HOST:PORT,HOST:PORT,... (or redis:// URLs).
    #[arg(long, value_name = "NODES", group = "store")]
    redis_cluster: Option<String>,
    /// The CA certificate (PEM) a `rediss://` Redis's certificate is
    /// checked against, instead of the public roots (or REDIS_TLS_CACERT).
    #[arg(long, value_name = "FILE")]
    redis_ca: Option<PathBuf>,
    /// ... or PostgreSQL (its table created beforehand by `migrate`).
    #[arg(long, value_name = "URL", group = "store")]
    postgres: Option<String>,
    /// How long a PostgreSQL call may take before the local fallback
    /// decides it: 750ms, 2s (default 500ms).
    #[arg(long, value_name = "TIME", value_parser = duration)]
    postgres_timeout: Option<Duration>,
    /// Decide and count, never refuse.
    #[arg(long)]
    shadow: bool,
    /// Response headers on /json: x, ietf, both or none (default none).
    #[arg(long, value_name = "MODE", value_parser = header_style)]
    headers: Option<HeaderStyle>,
    /// text or json (default text); the level comes from RUST_LOG, else
    /// LOG_LEVEL (default info).
    #[arg(long, value_name = "FORMAT", value_parser = log_format)]
    log_format: Option<LogFormat>,
    /// Serve the admin API on its own listener: a PORT (on 127.0.0.1) or
    /// IP:PORT (off by default; another address than loopback is allowed,
    /// with a warning).
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// The admin API's bearer token: the file's content, trimmed. The
    /// debug listener's status page asks for it too (as a bearer token, or
    /// as the password of HTTP Basic).
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// The status page shows the keys nearest their limit as sent, not as
    /// tags (keyed hashes).
    #[arg(long)]
    status_keys_in_clear: bool,
    /// On SIGTERM or SIGINT, how long to keep answering while the health
    /// checks say not serving, before the listeners close (default 5s).
    #[arg(long, value_name = "TIME", value_parser = duration)]
    drain: Option<Duration>,
}

/// How to write logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `--config ...`: serve.
#[derive(Debug, Clone)]
pub struct Serve {
    /// The service's options.
    pub options: ServiceOptions,
    /// The log format.
    pub log_format: LogFormat,
    /// The log level when `RUST_LOG` does not say (`LOG_LEVEL`).
    pub log_level: tracing::Level,
    /// How long to keep answering after SIGTERM, health not serving.
    pub drain: Duration,
}

/// What the command line asks.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Command {
    /// Serve.
    Serve(Box<Serve>),
    /// Validate a config and exit.
    CheckConfig(PathBuf),
    /// Create the PostgreSQL store's schema at this URL and exit.
    Migrate(String),
    /// Print this text (the help, or the version) and exit 0.
    Print(String),
}

/// The default drain period.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// The usage text, as `--help` prints it.
pub fn usage() -> String {
    Cli::command().render_long_help().to_string()
}

/// Whole milliseconds (`750ms`), seconds (`2s`), minutes (`1m`) or hours
/// (`1h`), above 0.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| invalid_duration(text))?;
    let parsed = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        _ => return Err(invalid_duration(text)),
    };
    if parsed.is_zero() {
        return Err(invalid_duration(text));
    }
    Ok(parsed)
}

fn invalid_duration(text: &str) -> String {
    format!("{text:?}: not a duration above 0 like 750ms, 2s or 1m")
}

fn header_style(text: &str) -> Result<HeaderStyle, String> {
    text.parse().map_err(|unknown| format!("{unknown}"))
}

fn log_format(text: &str) -> Result<LogFormat, String> {
    match text {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(format!("{other:?}: expected text or json")),
    }
}

/// Node URLs from `HOST:PORT,...` (items that are already URLs are kept).
fn cluster_urls(list: &str, source: &str) -> Result<Vec<String>, String> {
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|node| {
            if node.contains("://") {
                node.to_owned()
            } else {
                format!("redis://{node}/")
            }
        })
        .collect();
    if urls.is_empty() {
        return Err(format!("{source}: no node given"));
    }
    Ok(urls)
}

/// Parses the arguments (without the program name), with no environment.
///
/// # Errors
///
/// A message naming the bad argument (exit status 2).
pub fn parse<I>(args: I) -> Result<Command, String>
where
    I: IntoIterator,
    I::Item: Into<OsString> + Clone,
{
    parse_with_env(args, |_| None)
}

/// Parses the arguments (without the program name) and the environment
/// that `env` reads (`|name| std::env::var(name).ok()` for the process's).
///
/// # Errors
///
/// A message naming the bad argument or variable (exit status 2).
pub fn parse_with_env<I>(
    args: I,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Command, String>
where
    I: IntoIterator,
    I::Item: Into<OsString> + Clone,
{
    let program = std::iter::once(OsString::from("rate-tier-service"));
    let args = program.chain(args.into_iter().map(Into::into));
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            return match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    Ok(Command::Print(error.render().to_string()))
                }
                _ => Err(error.render().to_string()),
            };
        }
    };
    let env = Environment { lookup: env };
    match cli.command {
        Some(Sub::CheckConfig { path }) => Ok(Command::CheckConfig(path)),
        Some(Sub::Migrate { postgres }) => postgres
            .or_else(|| env.get("POSTGRES_URL"))
            .map(Command::Migrate)
            .ok_or_else(|| "migrate: --postgres URL is required".to_owned()),
        None => {
            serve(cli.serve, &env).map(|serve| Command::Serve(Box::new(serve)))
        }
    }
}

/// The options of `flags` over `env`, over the defaults.
fn serve<F: Fn(&str) -> Option<String>>(
    flags: Flags,
    env: &Environment<F>,
) -> Result<Serve, String> {
    env.refuse_unsupported()?;
    let config = match flags.config {
        Some(config) => config,
        None => {
            let root = env
                .get("RUNTIME_ROOT")
                .unwrap_or_else(|| "/srv/runtime_data/current".to_owned());
            let subdirectory =
                env.get("RUNTIME_SUBDIRECTORY").unwrap_or_default();
            let app = env
                .get("RUNTIME_APPDIRECTORY")
                .unwrap_or_else(|| "config".to_owned());
            PathBuf::from(root).join(subdirectory).join(app)
        }
    };
    let mut options = ServiceOptions::new(config);
    options.grpc_addr = match flags.grpc {
        Some(grpc) => grpc,
        None => env.addr("GRPC_HOST", "GRPC_PORT", options.grpc_addr)?,
    };
    options.http_addr = match flags.http {
        Some(http) => http,
        None => env.addr("HOST", "PORT", options.http_addr)?,
    };
    options.debug_addr = match flags.debug.as_deref() {
        Some("off") => None,
        Some(addr) => Some(addr.parse().map_err(|e| {
            format!("--debug {addr:?}: not an address like 127.0.0.1:6070, nor off ({e})")
        })?),
        None => Some(env.addr("DEBUG_HOST", "DEBUG_PORT", DEFAULT_DEBUG_ADDR)?),
    };
    if flags.postgres_timeout.is_some() && flags.postgres.is_none() {
        return Err(
            "--postgres-timeout is only used with --postgres URL".into()
        );
    }
    if let Some(timeout) = flags.postgres_timeout {
        options.postgres_timeout = timeout;
    }
    if let Some(timeout) = env.parsed("REDIS_TIMEOUT", duration)? {
        options.redis_timeout = timeout;
    }
    options.store = match (flags.redis, flags.redis_cluster, flags.postgres) {
        (Some(url), None, None) => StoreChoice::Redis(url),
        (None, Some(nodes), None) => {
            StoreChoice::RedisCluster(cluster_urls(&nodes, "--redis-cluster")?)
        }
        (None, None, Some(url)) => StoreChoice::Postgres(url),
        (None, None, None) => env.store()?,
        // clap's group already refuses two of them.
        _ => {
            return Err(
                "--redis, --redis-cluster and --postgres exclude each other"
                    .into(),
            );
        }
    };
    options.redis_ca = flags
        .redis_ca
        .or_else(|| env.get("REDIS_TLS_CACERT").map(PathBuf::from));
    if options.redis_ca.is_some()
        && !matches!(
            options.store,
            StoreChoice::Redis(_) | StoreChoice::RedisCluster(_)
        )
    {
        return Err(
            "--redis-ca (REDIS_TLS_CACERT) is only used with Redis".into()
        );
    }
    options
        .status_token_file
        .clone_from(&flags.admin_token_file);
    options.decide.status_keys_in_clear = flags.status_keys_in_clear;
    options.admin = match (flags.admin, flags.admin_token_file) {
        (Some(addr), Some(token_file)) => Some(AdminOptions {
            addr: crate::admin::parse_addr(&addr)?,
            token_file,
        }),
        (Some(_), None) => {
            return Err(
                "--admin needs --admin-token-file FILE (the bearer token)"
                    .into(),
            );
        }
        (None, _) => None,
    };
    options.decide.shadow = flags.shadow || env.flag("SHADOW_MODE")?;
    options.decide.headers = match flags.headers {
        Some(headers) => headers,
        None if env.flag("LIMIT_RESPONSE_HEADERS_ENABLED")? => {
            HeaderStyle::Ietf
        }
        None => HeaderStyle::None,
    };
    if let Some(ratio) = env.parsed("NEAR_LIMIT_RATIO", near_limit_ratio)? {
        options.decide.near_limit_ratio = ratio;
    }
    if env.flag("USE_PROMETHEUS")? {
        let addr = env.get("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        let path = env
            .get("PROMETHEUS_PATH")
            .unwrap_or_else(|| "/metrics".into());
        options.prometheus = Some(crate::server::PrometheusOptions {
            addr: go_listen_addr(&addr)
                .map_err(|e| format!("PROMETHEUS_ADDR: {e}"))?,
            path: path_of(&path)
                .map_err(|e| format!("PROMETHEUS_PATH: {e}"))?,
        });
    }
    let log_format = match flags.log_format {
        Some(format) => format,
        None => env.parsed("LOG_FORMAT", log_format)?.unwrap_or_default(),
    };
    let log_level = env
        .parsed("LOG_LEVEL", log_level)?
        .unwrap_or(tracing::Level::INFO);
    let drain = match flags.drain {
        Some(drain) => drain,
        None => env
            .parsed("DRAIN_PERIOD", duration)?
            .unwrap_or(DEFAULT_DRAIN),
    };
    Ok(Serve {
        options,
        log_format,
        log_level,
        drain,
    })
}

/// The debug listener's default: envoyproxy/ratelimit's port, on loopback.
pub const DEFAULT_DEBUG_ADDR: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 6070);

#[cfg(test)]
mod tests {
    use super::*;
    use rate_tier_storage::{PostgresStorage, RedisStorage};

    fn serve_with(
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Serve, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let lookup = |name: &str| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        };
        match parse_with_env(args, lookup)? {
            Command::Serve(serve) => Ok(*serve),
            other => Err(format!("{other:?}")),
        }
    }

    fn serve(args: &[&str]) -> Result<ServiceOptions, String> {
        serve_with(args, &[]).map(|serve| serve.options)
    }

    #[test]
    fn postgres_calls_wait_the_store_s_own_default_or_the_flag_s() {
        let on_postgres = ["--config", "a", "--postgres", "postgres://db/app"];
        let options = serve(&on_postgres).expect("valid");
        assert_eq!(options.postgres_timeout, PostgresStorage::DEFAULT_TIMEOUT);
        assert_eq!(options.postgres_timeout, Duration::from_millis(500));
        assert_eq!(options.redis_timeout, RedisStorage::DEFAULT_TIMEOUT);
        for (flag, expected) in [("750ms", 750), ("2s", 2000), ("50ms", 50)] {
            let args =
                [&on_postgres[..], &["--postgres-timeout", flag]].concat();
            let options = serve(&args).expect("valid");
            assert_eq!(
                options.postgres_timeout,
                Duration::from_millis(expected)
            );
        }
        // A value that looks like a flag is refused as one.
        let args = [&on_postgres[..], &["--postgres-timeout", "-1s"]].concat();
        assert!(serve(&args).is_err());
        for bad in ["0ms", "0s", "500", "1.5s", "ms", "2 s", "1d"] {
            let args =
                [&on_postgres[..], &["--postgres-timeout", bad]].concat();
            let error = serve(&args).expect_err(bad);
            assert!(error.contains("--postgres-timeout"), "{bad}: {error}");
        }
        let error = serve(&["--config", "a", "--postgres-timeout", "1s"])
            .expect_err("without --postgres");
        assert!(error.contains("--postgres URL"), "{error}");
    }

    #[test]
    fn envoyproxy_s_environment_alone_configures_the_service() {
        let serve = serve_with(
            &[],
            &[
                ("HOST", "0.0.0.0"),
                ("PORT", "8080"),
                ("GRPC_HOST", "0.0.0.0"),
                ("GRPC_PORT", "8081"),
                ("DEBUG_HOST", "0.0.0.0"),
                ("DEBUG_PORT", "6070"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("RUNTIME_WATCH_ROOT", "false"),
                ("USE_STATSD", "false"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis:6379"),
                ("REDIS_AUTH", "s3cret/pass"),
                ("REDIS_TIMEOUT", "250ms"),
                ("SHADOW_MODE", "True"),
                ("NEAR_LIMIT_RATIO", "0.9"),
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
                ("LOG_LEVEL", "debug"),
                ("LOG_FORMAT", "json"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", ":9090"),
                ("DRAIN_PERIOD", "15s"),
            ],
        )
        .expect("valid");
        let options = &serve.options;
        assert_eq!(options.http_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(options.grpc_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(
            options.debug_addr.map(|a| a.to_string()).as_deref(),
            Some("0.0.0.0:6070")
        );
        assert_eq!(
            options.config_path,
            PathBuf::from("/data/ratelimit/config")
        );
        match &options.store {
            StoreChoice::Redis(url) => {
                assert_eq!(url, "redis://:s3cret%2Fpass@redis:6379/");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(options.redis_timeout, Duration::from_millis(250));
        assert!(options.decide.shadow);
        assert_eq!(options.decide.near_limit_ratio, 0.9);
        assert_eq!(options.decide.headers, HeaderStyle::Ietf);
        assert_eq!(serve.log_level, tracing::Level::DEBUG);
        assert_eq!(serve.log_format, LogFormat::Json);
        let prometheus = options.prometheus.as_ref().expect("its listener");
        assert_eq!(prometheus.addr.to_string(), "0.0.0.0:9090");
        assert_eq!(prometheus.path, "/metrics");
        assert_eq!(serve.drain, Duration::from_secs(15));
    }

    #[test]
    fn flags_win_over_the_environment() {
        let env = [
            ("PORT", "9000"),
            ("GRPC_PORT", "9001"),
            ("DEBUG_PORT", "9002"),
            ("REDIS_URL", "redis:6379"),
            ("LOG_FORMAT", "json"),
            ("DRAIN_PERIOD", "15s"),
            ("RUNTIME_ROOT", "/data"),
        ];
        let serve = serve_with(
            &[
                "--config",
                "rules",
                "--http",
                "127.0.0.1:1",
                "--grpc",
                "127.0.0.1:2",
                "--debug",
                "off",
                "--postgres",
                "postgres://db/app",
                "--log-format",
                "text",
                "--drain",
                "1s",
            ],
            &env,
        )
        .expect("valid");
        let options = &serve.options;
        assert_eq!(options.config_path, PathBuf::from("rules"));
        assert_eq!(options.http_addr.to_string(), "127.0.0.1:1");
        assert_eq!(options.grpc_addr.to_string(), "127.0.0.1:2");
        assert_eq!(options.debug_addr, None);
        assert!(matches!(options.store, StoreChoice::Postgres(_)));
        assert_eq!(serve.log_format, LogFormat::Text);
        assert_eq!(serve.drain, Duration::from_secs(1));
        // Half an address from the environment, half from the defaults.
        let options =
            serve_with(&[], &[("PORT", "9000")]).expect("valid").options;
        assert_eq!(options.http_addr.to_string(), "127.0.0.1:9000");
        assert_eq!(options.grpc_addr.to_string(), "127.0.0.1:8081");
        assert_eq!(options.debug_addr, Some(DEFAULT_DEBUG_ADDR));
        assert_eq!(
            options.config_path,
            PathBuf::from("/srv/runtime_data/current/config")
        );
        assert!(matches!(options.store, StoreChoice::Memory));
    }

    #[test]
    fn redis_urls_of_envoyproxy_s_forms() {
        let store = |env: &[(&str, &str)]| {
            serve_with(&["--config", "a"], env).map(|s| s.options.store)
        };
        let cluster = store(&[
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "10.0.0.1:7000, 10.0.0.2:7000"),
            ("REDIS_AUTH", "app:pw"),
        ]);
        match cluster.expect("valid") {
            StoreChoice::RedisCluster(urls) => assert_eq!(
                urls,
                [
                    "redis://app:pw@10.0.0.1:7000/",
                    "redis://app:pw@10.0.0.2:7000/"
                ]
            ),
            other => panic!("{other:?}"),
        }
        // envoyproxy/ratelimit's default socket type, unix, for a path.
        match store(&[("REDIS_URL", "/var/run/redis.sock")]).expect("valid") {
            StoreChoice::Redis(url) => {
                assert_eq!(url, "redis+unix:///var/run/redis.sock");
            }
            other => panic!("{other:?}"),
        }
        match store(&[("REDIS_URL", "rediss://cache:6380/2")]).expect("valid") {
            StoreChoice::Redis(url) => assert_eq!(url, "rediss://cache:6380/2"),
            other => panic!("{other:?}"),
        }
        match store(&[("POSTGRES_URL", "postgres://db/app")]).expect("valid") {
            StoreChoice::Postgres(url) => assert_eq!(url, "postgres://db/app"),
            other => panic!("{other:?}"),
        }
        // TLS, with the CA file its certificate is checked against.
        let serve = serve_with(
            &["--config", "a"],
            &[
                ("REDIS_URL", "cache.internal:6380"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CACERT", "/etc/ca.pem"),
            ],
        )
        .expect("valid");
        match &serve.options.store {
            StoreChoice::Redis(url) => {
                assert_eq!(url, "rediss://cache.internal:6380/")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(serve.options.redis_ca, Some(PathBuf::from("/etc/ca.pem")));
        let flag = serve_with(
            &[
                "--config",
                "a",
                "--redis",
                "rediss://c:6380/",
                "--redis-ca",
                "/x.pem",
            ],
            &[("REDIS_TLS_CACERT", "/etc/ca.pem")],
        )
        .expect("valid");
        assert_eq!(flag.options.redis_ca, Some(PathBuf::from("/x.pem")));
        let memory =
            serve_with(&["--config", "a", "--redis-ca", "/x.pem"], &[]);
        assert!(memory.unwrap_err().contains("only used with Redis"));
        let unix =
            store(&[("REDIS_URL", "/run/r.sock"), ("REDIS_TLS", "true")]);
        assert!(unix.unwrap_err().contains("REDIS_TLS"));
        let both =
            store(&[("REDIS_URL", "r:1"), ("POSTGRES_URL", "postgres://db")]);
        assert!(both.unwrap_err().contains("exclude"));
    }

    #[test]
    fn what_the_service_cannot_do_stops_it_naming_the_variable() {
        for (name, value) in [
            ("BACKEND_TYPE", "memcache"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_TLS_CLIENT_CERT", "/client.pem"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            ("CONFIG_TYPE", "GRPC_XDS"),
            ("GRPC_SERVER_USE_TLS", "yes"),
            ("QUOTA_MODE", "true"),
        ] {
            let error = serve_with(&["--config", "a"], &[(name, value)])
                .expect_err(name);
            assert!(error.contains(name), "{name}: {error}");
        }
        // Their defaults, or the settings that mean nothing here, pass.
        for (name, value) in [
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TYPE", "SINGLE"),
            ("REDIS_TLS", "false"),
            ("CONFIG_TYPE", "FILE"),
            ("USE_STATSD", "true"),
            ("REDIS_POOL_SIZE", "10"),
        ] {
            serve_with(&["--config", "a"], &[(name, value)])
                .unwrap_or_else(|e| panic!("{name}={value}: {e}"));
        }
        for (name, value) in [
            ("PORT", "http"),
            ("HOST", "localhost:1"),
            ("SHADOW_MODE", "yes"),
            ("NEAR_LIMIT_RATIO", "1.5"),
            ("NEAR_LIMIT_RATIO", "0"),
            ("LOG_LEVEL", "loud"),
            ("REDIS_TIMEOUT", "10"),
            ("PROMETHEUS_ADDR", "9090"),
        ] {
            let env = [(name, value), ("USE_PROMETHEUS", "true")];
            let error = serve_with(&["--config", "a"], &env).expect_err(name);
            assert!(error.starts_with(name), "{name}={value}: {error}");
        }
    }

    #[test]
    fn help_names_the_environment_and_version_prints_it() {
        let Ok(Command::Print(help)) = parse(["--help"]) else {
            panic!("--help prints");
        };
        for name in [
            "REDIS_URL",
            "DEBUG_PORT",
            "RUNTIME_ROOT",
            "--drain",
            "/rlconfig",
        ] {
            assert!(help.contains(name), "{name} in --help");
        }
        let Ok(Command::Print(version)) = parse(["-V"]) else {
            panic!("-V prints");
        };
        assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    }
}
