//! envoyproxy/ratelimit's environment: its variables read through a
//! lookup (the process's, or a test's), in the formats its Go code reads
//! them (`strconv.ParseBool`, logrus levels, `:9090` listen addresses,
//! `REDIS_URL`'s `HOST:PORT`).

use std::net::{IpAddr, SocketAddr};

use super::cluster_urls;
use crate::server::StoreChoice;

/// envoyproxy/ratelimit's environment, read through `lookup`.
pub(super) struct Environment<F> {
    pub(super) lookup: F,
}

impl<F: Fn(&str) -> Option<String>> Environment<F> {
    /// The variable's value; an empty one is unset, as envconfig reads it.
    pub(super) fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|value| !value.trim().is_empty())
    }

    pub(super) fn parsed<T>(
        &self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        self.get(name)
            .map(|value| {
                parse(value.trim()).map_err(|e| format!("{name}: {e}"))
            })
            .transpose()
    }

    /// Go's `strconv.ParseBool`, as envconfig reads a bool.
    pub(super) fn flag(&self, name: &str) -> Result<bool, String> {
        Ok(self.parsed(name, go_bool)?.unwrap_or(false))
    }

    /// `HOST`/`PORT` pairs: an address, with the defaults of either half.
    pub(super) fn addr(
        &self,
        host: &str,
        port: &str,
        default: SocketAddr,
    ) -> Result<SocketAddr, String> {
        let ip = self.parsed(host, |text| {
            text.parse::<IpAddr>()
                .map_err(|e| format!("{text:?}: not an IP address ({e})"))
        })?;
        let port = self.parsed(port, |text| {
            text.parse::<u16>()
                .map_err(|e| format!("{text:?}: not a port ({e})"))
        })?;
        Ok(SocketAddr::new(
            ip.unwrap_or(default.ip()),
            port.unwrap_or(default.port()),
        ))
    }

    /// What this service does not do, set to what would need it.
    pub(super) fn refuse_unsupported(&self) -> Result<(), String> {
        let unsupported: [(&str, Needs); 10] = [
            ("BACKEND_TYPE", |v| !v.eq_ignore_ascii_case("redis")),
            ("REDIS_TYPE", |v| {
                !v.eq_ignore_ascii_case("single")
                    && !v.eq_ignore_ascii_case("cluster")
            }),
            ("REDIS_TLS_CLIENT_CERT", |_| true),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", is_true),
            ("REDIS_PERSECOND", is_true),
            ("CONFIG_TYPE", |v| !v.eq_ignore_ascii_case("file")),
            ("GRPC_SERVER_USE_TLS", is_true),
            ("GRPC_UDS", |_| true),
            ("QUOTA_MODE", is_true),
            ("MERGE_DOMAIN_CONFIG", is_true),
        ];
        for (name, needs) in unsupported {
            if let Some(value) = self.get(name)
                && needs(value.trim())
            {
                return Err(format!(
                    "{name}={value}: not supported by rate-tier-service (see its README)"
                ));
            }
        }
        Ok(())
    }

    /// The store `REDIS_*` (and `POSTGRES_URL`) ask for.
    pub(super) fn store(&self) -> Result<StoreChoice, String> {
        let postgres = self.get("POSTGRES_URL");
        let Some(url) = self.get("REDIS_URL") else {
            return Ok(
                postgres.map_or(StoreChoice::Memory, StoreChoice::Postgres)
            );
        };
        if postgres.is_some() {
            return Err("REDIS_URL and POSTGRES_URL exclude each other".into());
        }
        let auth = self.get("REDIS_AUTH");
        let unix = match self.get("REDIS_SOCKET_TYPE") {
            Some(kind) if kind.eq_ignore_ascii_case("unix") => true,
            Some(kind) if kind.eq_ignore_ascii_case("tcp") => false,
            Some(kind) => {
                return Err(format!(
                    "REDIS_SOCKET_TYPE={kind}: expected tcp or unix"
                ));
            }
            // envoyproxy/ratelimit defaults to unix; a HOST:PORT says tcp.
            None => url.starts_with('/'),
        };
        let cluster = self
            .get("REDIS_TYPE")
            .is_some_and(|kind| kind.eq_ignore_ascii_case("cluster"));
        let tls = self.flag("REDIS_TLS")?;
        if tls && unix {
            return Err("REDIS_TLS=true: a unix socket has no TLS".into());
        }
        let node = |node: &str| redis_url(node, unix, tls, auth.as_deref());
        if cluster {
            let nodes: Vec<String> = url
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(node)
                .collect();
            return cluster_urls(&nodes.join(","), "REDIS_URL")
                .map(StoreChoice::RedisCluster);
        }
        Ok(StoreChoice::Redis(node(url.trim())))
    }
}

/// Whether a variable's value asks for what this service does not have.
type Needs = fn(&str) -> bool;

fn is_true(value: &str) -> bool {
    go_bool(value).unwrap_or(true)
}

/// Go's `strconv.ParseBool`.
fn go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!("{other:?}: expected true or false")),
    }
}

/// A Redis URL of envoyproxy/ratelimit's `REDIS_URL` node: `HOST:PORT`, a
/// socket path, or already a URL; `rediss://` with `REDIS_TLS`; with
/// `REDIS_AUTH` as its password (`USER:PASSWORD` gives both).
fn redis_url(node: &str, unix: bool, tls: bool, auth: Option<&str>) -> String {
    if node.contains("://") {
        return node.to_owned();
    }
    let userinfo = match auth {
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => {
                format!("{}:{}@", encode(user), encode(password))
            }
            None => format!(":{}@", encode(auth)),
        },
        None => String::new(),
    };
    if unix {
        // redis-rs reads the password of a socket from the query.
        return match auth {
            Some(auth) => {
                let password = auth.split_once(':').map_or(auth, |(_, p)| p);
                format!("redis+unix://{node}?pass={}", encode(password))
            }
            None => format!("redis+unix://{node}"),
        };
    }
    let scheme = if tls { "rediss" } else { "redis" };
    format!("{scheme}://{userinfo}{node}/")
}

/// Percent-encodes what is not unreserved in a URL's user info.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'.'
            | b'_'
            | b'~' => out.push(char::from(byte)),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

pub(super) fn near_limit_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ratio) if ratio > 0.0 && ratio <= 1.0 => Ok(ratio),
        _ => Err(format!("{text:?}: expected a ratio above 0, at most 1")),
    }
}

/// logrus's levels, as envoyproxy/ratelimit reads `LOG_LEVEL`.
pub(super) fn log_level(text: &str) -> Result<tracing::Level, String> {
    match text.to_ascii_lowercase().as_str() {
        "trace" => Ok(tracing::Level::TRACE),
        "debug" => Ok(tracing::Level::DEBUG),
        "info" => Ok(tracing::Level::INFO),
        "warn" | "warning" => Ok(tracing::Level::WARN),
        "error" | "fatal" | "panic" => Ok(tracing::Level::ERROR),
        other => Err(format!("{other:?}: expected debug, info, warn or error")),
    }
}

/// Go's listen address: `HOST:PORT`, or `:PORT` for every interface.
pub(super) fn go_listen_addr(text: &str) -> Result<SocketAddr, String> {
    match text.strip_prefix(':') {
        Some(port) => port
            .parse::<u16>()
            .map(|port| SocketAddr::from(([0, 0, 0, 0], port)))
            .map_err(|e| format!("{text:?}: not a port ({e})")),
        None => text.parse().map_err(|e| {
            format!("{text:?}: not an address like 0.0.0.0:9090 ({e})")
        }),
    }
}

pub(super) fn path_of(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(['{', '}', '*']) {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?}: expected a path like /metrics"))
    }
}
