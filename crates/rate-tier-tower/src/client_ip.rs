//! Which address a request comes from, for limits per address.
//!
//! A limit keyed on the raw `X-Forwarded-For` header limits nothing: the
//! client writes that header. Rotating it escapes the limit, and naming a
//! victim's address spends theirs. The address a limit may trust is the
//! one the proxy in front of the service wrote: the **rightmost** entry of
//! the last `X-Forwarded-For` (or `Forwarded`) header, which the proxy
//! appended, or the header a particular proxy sets
//! (`X-Envoy-External-Address`, `CF-Connecting-IP`, ...), or, without a
//! proxy, the connection's peer address. Choose the one that matches the
//! deployment ([`ClientIp`]); `client-ip` (the framework-independent core
//! of `axum-client-ip`) reads them.
//!
//! [`Limit::per_client_ip`](crate::Limit::per_client_ip) keys a limit on
//! it. IPv6 addresses are grouped by their /64 (one host usually holds a
//! whole /64, and rotating within it would escape a per-address limit),
//! IPv4-mapped IPv6 addresses are IPv4. A request whose header cannot be
//! read (missing or malformed: what a client can do) is not let off: it
//! shares one bucket, `unknown`, with every other such request. A source
//! that reads the connection ([`ClientIp::PEER`], `rate_tier_axum`'s
//! `CONNECT_INFO`) always has an address unless the server was not set up
//! to give it (axum served without `into_make_service_with_connect_info`):
//! that mistake would put every client in one bucket, so the request is
//! answered 500 instead, with [`LimitEvent::NoClientAddress`](crate::LimitEvent::NoClientAddress)
//! naming the fix.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::request::Parts;

/// Where a request's client address is read: see the
/// [module docs](crate::client_ip).
///
/// ```
/// use http::Request;
/// use tower_rate_tier::client_ip::ClientIp;
///
/// let (parts, ()) = Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7")
///     .body(())
///     .unwrap()
///     .into_parts();
/// // The client wrote 6.6.6.6; the proxy appended 203.0.113.7.
/// assert_eq!(ClientIp::RIGHTMOST_X_FORWARDED_FOR.of(&parts), Some("203.0.113.7".parse().unwrap()));
/// assert_eq!(ClientIp::RIGHTMOST_X_FORWARDED_FOR.partition(&parts), "203.0.113.7");
/// assert_eq!(ClientIp::X_REAL_IP.partition(&parts), "unknown");
/// ```
#[derive(Clone, Copy)]
pub struct ClientIp {
    name: &'static str,
    read: fn(&Parts) -> Option<IpAddr>,
    /// Reads the connection, which always has an address: none is the
    /// server's mistake, not the client's.
    connection: bool,
}

impl fmt::Debug for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ClientIp").field(&self.name).finish()
    }
}

/// The partition of requests whose address cannot be read.
pub const UNKNOWN_CLIENT: &str = "unknown";

impl ClientIp {
    /// The rightmost address of the last `X-Forwarded-For` header: the one
    /// the proxy in front of the service appended (one proxy; behind two,
    /// read the header the outer one sets).
    pub const RIGHTMOST_X_FORWARDED_FOR: ClientIp = ClientIp {
        name: "rightmost X-Forwarded-For",
        read: |parts| client_ip::rightmost_x_forwarded_for(&parts.headers).ok(),
        connection: false,
    };
    /// The rightmost `for=` of the last `Forwarded` header (RFC 7239).
    pub const RIGHTMOST_FORWARDED: ClientIp = ClientIp {
        name: "rightmost Forwarded",
        read: |parts| client_ip::rightmost_forwarded(&parts.headers).ok(),
        connection: false,
    };
    /// `X-Envoy-External-Address` (Envoy, Istio).
    pub const X_ENVOY_EXTERNAL_ADDRESS: ClientIp = ClientIp {
        name: "X-Envoy-External-Address",
        read: |parts| client_ip::x_envoy_external_address(&parts.headers).ok(),
        connection: false,
    };
    /// `X-Real-Ip` (nginx).
    pub const X_REAL_IP: ClientIp = ClientIp {
        name: "X-Real-Ip",
        read: |parts| client_ip::x_real_ip(&parts.headers).ok(),
        connection: false,
    };
    /// `CF-Connecting-IP` (Cloudflare).
    pub const CF_CONNECTING_IP: ClientIp = ClientIp {
        name: "CF-Connecting-IP",
        read: |parts| client_ip::cf_connecting_ip(&parts.headers).ok(),
        connection: false,
    };
    /// `True-Client-IP` (Akamai, Cloudflare).
    pub const TRUE_CLIENT_IP: ClientIp = ClientIp {
        name: "True-Client-IP",
        read: |parts| client_ip::true_client_ip(&parts.headers).ok(),
        connection: false,
    };
    /// `Fly-Client-IP` (Fly.io).
    pub const FLY_CLIENT_IP: ClientIp = ClientIp {
        name: "Fly-Client-IP",
        read: |parts| client_ip::fly_client_ip(&parts.headers).ok(),
        connection: false,
    };
    /// `CloudFront-Viewer-Address` (AWS CloudFront).
    pub const CLOUDFRONT_VIEWER_ADDRESS: ClientIp = ClientIp {
        name: "CloudFront-Viewer-Address",
        read: |parts| client_ip::cloudfront_viewer_address(&parts.headers).ok(),
        connection: false,
    };
    /// The connection's peer, as a [`SocketAddr`] in the request's
    /// extensions (a server that puts one there; with axum, use
    /// `rate_tier_axum::CONNECT_INFO`, which reads its `ConnectInfo`).
    pub const PEER: ClientIp = ClientIp {
        name: "peer",
        read: |parts| parts.extensions.get::<SocketAddr>().map(SocketAddr::ip),
        connection: true,
    };

    /// A source of your own, named `name` (for `Debug`).
    ///
    /// ```
    /// use tower_rate_tier::client_ip::ClientIp;
    /// let from_extension = ClientIp::from_fn("my proxy", |parts| {
    ///     parts.extensions.get::<std::net::IpAddr>().copied()
    /// });
    /// assert_eq!(format!("{from_extension:?}"), r#"ClientIp("my proxy")"#);
    /// ```
    pub const fn from_fn(
        name: &'static str,
        read: fn(&Parts) -> Option<IpAddr>,
    ) -> ClientIp {
        ClientIp {
            name,
            read,
            connection: false,
        }
    }

    /// A source that reads the connection (what the server puts in the
    /// request's extensions): a request without an address is the server's
    /// mistake, answered 500 by a limit per address, never a shared bucket.
    ///
    /// ```
    /// use tower_rate_tier::client_ip::ClientIp;
    /// let peer = ClientIp::from_connection("my server", |parts| {
    ///     parts.extensions.get::<std::net::SocketAddr>().map(|a| a.ip())
    /// });
    /// assert!(peer.reads_connection() && !ClientIp::X_REAL_IP.reads_connection());
    /// ```
    pub const fn from_connection(
        name: &'static str,
        read: fn(&Parts) -> Option<IpAddr>,
    ) -> ClientIp {
        ClientIp {
            name,
            read,
            connection: true,
        }
    }

    /// Whether this source reads the connection, not a header.
    pub const fn reads_connection(&self) -> bool {
        self.connection
    }

    /// The source's name, as `Debug` shows it.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The request's client address, if it can be read.
    pub fn of(&self, parts: &Parts) -> Option<IpAddr> {
        (self.read)(parts)
    }

    /// The bucket of the request's client: the address (IPv6 by its /64),
    /// or [`UNKNOWN_CLIENT`] when it cannot be read.
    ///
    /// ```
    /// use http::Request;
    /// use tower_rate_tier::client_ip::ClientIp;
    /// let ask = |xff: &str| {
    ///     let (parts, ()) = Request::get("/").header("x-forwarded-for", xff).body(()).unwrap().into_parts();
    ///     ClientIp::RIGHTMOST_X_FORWARDED_FOR.partition(&parts)
    /// };
    /// assert_eq!(ask("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
    /// assert_eq!(ask("2001:db8:1:2:ffff::1"), "2001:db8:1:2::/64");
    /// assert_eq!(ask("::ffff:203.0.113.7"), "203.0.113.7");
    /// assert_eq!(ask("not an address"), "unknown");
    /// ```
    pub fn partition(&self, parts: &Parts) -> String {
        match self.of(parts) {
            Some(ip) => partition_of(ip),
            None => UNKNOWN_CLIENT.to_owned(),
        }
    }

    /// The bucket of the request's client, or `None` when a source that
    /// reads the connection found no address there (the server's mistake:
    /// see the [module docs](crate::client_ip)).
    pub(crate) fn partition_or_mistake(&self, parts: &Parts) -> Option<String> {
        match self.of(parts) {
            Some(ip) => Some(partition_of(ip)),
            None if self.connection => None,
            None => Some(UNKNOWN_CLIENT.to_owned()),
        }
    }
}

/// An address's bucket: IPv4 as it is, IPv6 by its /64.
fn partition_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let net = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
        },
    }
}
