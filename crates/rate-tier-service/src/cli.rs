//! The command line of the `rate-tier-service` binary.
//!
//! ```text
//! rate-tier-service --config PATH [--grpc ADDR] [--http ADDR]
//!         [--redis URL | --redis-cluster HOST:PORT,... | --postgres URL [--postgres-timeout TIME]]
//!         [--shadow] [--headers x|ietf|both|none] [--log-format text|json]
//!         [--admin [IP:]PORT --admin-token-file FILE]
//! rate-tier-service check-config PATH
//! rate-tier-service migrate --postgres URL
//! ```
//!
//! ```
//! use rate_tier_service::cli::{Command, parse};
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
//! # Ok::<(), String>(())
//! ```

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::admin::AdminOptions;
use crate::server::{ServiceOptions, StoreChoice};
use tower_rate_tier::headers::HeaderStyle;

/// The usage text.
pub const USAGE: &str = "\
rate-tier-service: a GCRA drop-in for envoyproxy/ratelimit (Envoy RLS v3)

USAGE:
    rate-tier-service --config PATH [OPTIONS]
    rate-tier-service check-config PATH
    rate-tier-service migrate --postgres URL

OPTIONS:
    --config PATH              a YAML file or a directory of them (envoyproxy/ratelimit format)
    --grpc ADDR                gRPC listener (default 127.0.0.1:8081)
    --http ADDR                HTTP listener: /json, /healthcheck, /metrics (default 127.0.0.1:8080)
    --redis URL                share the limits through one Redis (with a local fallback)
    --redis-cluster NODES      ... or a Redis Cluster: HOST:PORT,HOST:PORT,... (or redis:// URLs)
    --postgres URL             ... or PostgreSQL (its table created beforehand by `migrate`)
    --postgres-timeout TIME    how long a PostgreSQL call may take before the local fallback decides it:
                               milliseconds (750ms) or seconds (2s) (default 500ms)
    --shadow                   decide and count, never refuse
    --headers MODE             response headers: x, ietf, both or none (default none)
    --log-format FORMAT        text or json (default text); the level comes from RUST_LOG (default info)
    --admin ADDR               serve the admin API on its own listener: a PORT (on 127.0.0.1) or IP:PORT
                               (off by default; an address other than loopback is allowed, with a warning)
    --admin-token-file FILE    the admin API's bearer token: the file's content, trimmed (required with --admin)
    -h, --help                 this text
    -V, --version              the version

check-config PATH exits 0 when the config is valid, 1 with the file and the reason otherwise.
migrate --postgres URL creates (or updates) the PostgreSQL store's table and functions, then exits.

ADMIN API (every request with `authorization: Bearer TOKEN`, else 401; JSON in and out):
    POST /admin/reset   {\"domain\": D, \"descriptors\": [{\"entries\": [{\"key\": K, \"value\": V}]}]}
                        puts the buckets those descriptors map to back to full
    POST /admin/peek    the same body: each descriptor's limit, remaining and reset, charging nothing
    GET  /admin/rules   the rules in use: domain, descriptors, name, unit, requests_per_unit, shadow
";

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
    /// Print the usage.
    Help,
    /// Print the version.
    Version,
}

fn addr(flag: &str, value: OsString) -> Result<SocketAddr, String> {
    let text = value
        .into_string()
        .map_err(|_| format!("{flag}: not UTF-8"))?;
    text.parse().map_err(|e| {
        format!("{flag} {text:?}: not an address like 127.0.0.1:8081 ({e})")
    })
}

fn text(flag: &str, value: OsString) -> Result<String, String> {
    value
        .into_string()
        .map_err(|_| format!("{flag}: not UTF-8"))
}

/// Whole milliseconds (`750ms`) or seconds (`2s`), above 0.
fn duration(flag: &str, value: OsString) -> Result<Duration, String> {
    let text = text(flag, value)?;
    let parsed = match text.strip_suffix("ms") {
        Some(ms) => ms.parse().ok().map(Duration::from_millis),
        None => text
            .strip_suffix('s')
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs),
    };
    parsed.filter(|d| !d.is_zero()).ok_or_else(|| {
        format!("{flag} {text:?}: not a duration above 0 like 750ms or 2s")
    })
}

/// Node URLs from `HOST:PORT,...` (items that are already URLs are kept).
fn cluster_urls(list: &str) -> Result<Vec<String>, String> {
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
        return Err("--redis-cluster: no node given".into());
    }
    Ok(urls)
}

/// Parses the arguments (without the program name).
///
/// # Errors
///
/// A message naming the bad argument (exit status 2).
pub fn parse<I>(args: I) -> Result<Command, String>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let mut config = None;
    let mut grpc = None;
    let mut http = None;
    let mut redis = None;
    let mut cluster = None;
    let mut postgres = None;
    let mut postgres_timeout = None;
    let mut migrate = false;
    let mut shadow = false;
    let mut headers = HeaderStyle::None;
    let mut log_format = LogFormat::Text;
    let mut check = None;
    let mut admin = None;
    let mut admin_token_file = None;
    let error = |e: lexopt::Error| e.to_string();
    while let Some(arg) = parser.next().map_err(error)? {
        match arg {
            Long("config") => {
                config = Some(PathBuf::from(parser.value().map_err(error)?))
            }
            Long("grpc") => {
                grpc = Some(addr("--grpc", parser.value().map_err(error)?)?)
            }
            Long("http") => {
                http = Some(addr("--http", parser.value().map_err(error)?)?)
            }
            Long("redis") => {
                redis = Some(text("--redis", parser.value().map_err(error)?)?)
            }
            Long("redis-cluster") => {
                let list =
                    text("--redis-cluster", parser.value().map_err(error)?)?;
                cluster = Some(cluster_urls(&list)?);
            }
            Long("postgres") => {
                postgres =
                    Some(text("--postgres", parser.value().map_err(error)?)?)
            }
            Long("postgres-timeout") => {
                let value = parser.value().map_err(error)?;
                postgres_timeout = Some(duration("--postgres-timeout", value)?);
            }
            Value(value)
                if !migrate
                    && check.is_none()
                    && config.is_none()
                    && value == "migrate" =>
            {
                migrate = true;
            }
            Long("shadow") => shadow = true,
            Long("admin") => {
                let value = text("--admin", parser.value().map_err(error)?)?;
                admin = Some(crate::admin::parse_addr(&value)?);
            }
            Long("admin-token-file") => {
                admin_token_file =
                    Some(PathBuf::from(parser.value().map_err(error)?));
            }
            Long("headers") => {
                headers = text("--headers", parser.value().map_err(error)?)?
                    .parse()
                    .map_err(|unknown| format!("{unknown}"))?;
            }
            Long("log-format") => {
                log_format =
                    match text("--log-format", parser.value().map_err(error)?)?
                        .as_str()
                    {
                        "text" => LogFormat::Text,
                        "json" => LogFormat::Json,
                        other => {
                            return Err(format!(
                                "--log-format {other:?}: expected text or json"
                            ));
                        }
                    }
            }
            Short('h') | Long("help") => return Ok(Command::Help),
            Short('V') | Long("version") => return Ok(Command::Version),
            Value(value)
                if check.is_none()
                    && config.is_none()
                    && value == "check-config" =>
            {
                let path = parser.value().map_err(|_| {
                    "check-config: the config PATH is missing".to_owned()
                })?;
                check = Some(PathBuf::from(path));
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    if let Some(path) = check {
        return Ok(Command::CheckConfig(path));
    }
    if migrate {
        return postgres
            .map(Command::Migrate)
            .ok_or_else(|| "migrate: --postgres URL is required".to_owned());
    }
    let Some(config) = config else {
        return Err("--config PATH is required (see --help)".into());
    };
    let mut options = ServiceOptions::new(config);
    if let Some(grpc) = grpc {
        options.grpc_addr = grpc;
    }
    if let Some(http) = http {
        options.http_addr = http;
    }
    if let Some(timeout) = postgres_timeout {
        if postgres.is_none() {
            return Err(
                "--postgres-timeout is only used with --postgres URL".into()
            );
        }
        options.postgres_timeout = timeout;
    }
    options.store = match (redis, cluster, postgres) {
        (Some(url), None, None) => StoreChoice::Redis(url),
        (None, Some(urls), None) => StoreChoice::RedisCluster(urls),
        (None, None, Some(url)) => StoreChoice::Postgres(url),
        (None, None, None) => StoreChoice::Memory,
        _ => {
            return Err(
                "--redis, --redis-cluster and --postgres exclude each other"
                    .into(),
            );
        }
    };
    options.admin = match (admin, admin_token_file) {
        (Some(addr), Some(token_file)) => {
            Some(AdminOptions { addr, token_file })
        }
        (Some(_), None) => {
            return Err(
                "--admin needs --admin-token-file FILE (the bearer token)"
                    .into(),
            );
        }
        (None, Some(_)) => {
            return Err(
                "--admin-token-file is only used with --admin ADDR".into()
            );
        }
        (None, None) => None,
    };
    options.decide.shadow = shadow;
    options.decide.headers = headers;
    Ok(Command::Serve(Box::new(Serve {
        options,
        log_format,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rate_tier_storage::{PostgresStorage, RedisStorage};

    fn serve(args: &[&str]) -> Result<ServiceOptions, String> {
        match parse(args)? {
            Command::Serve(serve) => Ok(serve.options),
            other => Err(format!("{other:?}")),
        }
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
        for bad in ["0ms", "0s", "500", "1.5s", "-1s", "ms", "2 s", "1m"] {
            let args =
                [&on_postgres[..], &["--postgres-timeout", bad]].concat();
            let error = serve(&args).expect_err(bad);
            assert!(error.contains("--postgres-timeout"), "{bad}: {error}");
        }
        let error = serve(&["--config", "a", "--postgres-timeout", "1s"])
            .expect_err("without --postgres");
        assert!(error.contains("--postgres URL"), "{error}");
    }
}
