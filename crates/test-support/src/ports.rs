//! Free loopback ports.
//!
//! A port is chosen at random below the kernel's ephemeral range (where
//! `bind(0)` and outgoing connections take theirs), so that a client's own
//! connection can never hold the port of a server that is being restarted.
//! It is checked free by binding it on 127.0.0.1, and never handed out twice
//! by one process. Port 6379 (the machine's shared Redis) and its cluster bus
//! port are never chosen.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::net::{Ipv4Addr, TcpListener};
use std::ops::RangeInclusive;
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The port of the machine's shared Redis: never started, stopped, flushed or
/// contacted by these helpers.
pub const SHARED_REDIS_PORT: u16 = 6379;

/// A Redis Cluster node's bus port is its port plus this (Redis's default).
pub(crate) const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// The ports chosen from: below Linux's default ephemeral range (32768 and
/// up), with room for the cluster bus ports above them.
const CANDIDATES: RangeInclusive<u16> = 10_000..=22_767;

/// Ports this process has handed out: never handed out again.
static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A loopback port that is free (checked by binding it) and that this
/// process has not handed out before; never 6379.
///
/// # Panics
///
/// If no port is free after many tries (see [`try_free_port`]).
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("{e}"))
}

/// [`free_port`], as a `Result`.
pub fn try_free_port() -> Result<u16> {
    Ok(free_ports(1, false)?[0])
}

/// `n` distinct free ports; with `cluster_bus`, `port + 10000` is free too.
pub(crate) fn free_ports(n: usize, cluster_bus: bool) -> Result<Vec<u16>> {
    let ephemeral = ephemeral_range();
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut ports = Vec::with_capacity(n);
    let span = u64::from(CANDIDATES.end() - CANDIDATES.start()) + 1;
    let random = RandomState::new();
    for attempt in 0..10_000_u64 {
        if ports.len() == n {
            break;
        }
        let mut hasher = random.build_hasher();
        hasher.write_u64(attempt);
        let offset = u16::try_from(hasher.finish() % span)
            .expect("the span of candidates fits in u16");
        let port = CANDIDATES.start() + offset;
        let bus = port + CLUSTER_BUS_OFFSET;
        // Where the ephemeral range covers every candidate (a tuned
        // kernel), the later attempts take any free port.
        let outside_ephemeral =
            |p: u16| attempt >= 5_000 || !ephemeral.contains(&p);
        let usable = |p: u16| {
            p != SHARED_REDIS_PORT
                && p != SHARED_REDIS_PORT + CLUSTER_BUS_OFFSET
                && outside_ephemeral(p)
                && !given.contains(&p)
                && bindable(p)
        };
        if usable(port) && (!cluster_bus || usable(bus)) {
            given.insert(port);
            if cluster_bus {
                given.insert(bus);
            }
            ports.push(port);
        }
    }
    if ports.len() == n {
        Ok(ports)
    } else {
        Err(Error::new(format!(
            "could not find {n} free loopback ports in {}..={}{}",
            CANDIDATES.start(),
            CANDIDATES.end(),
            if cluster_bus {
                " (with their cluster bus ports, +10000)"
            } else {
                ""
            }
        )))
    }
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The kernel's ephemeral port range (Linux: `ip_local_port_range`); the
/// usual default where it cannot be read.
fn ephemeral_range() -> RangeInclusive<u16> {
    const DEFAULT: RangeInclusive<u16> = 32_768..=60_999;
    let Ok(text) =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
    else {
        return DEFAULT;
    };
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    match (bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => low..=high,
        _ => DEFAULT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_never_the_shared_redis() {
        let ports = free_ports(20, true).unwrap();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 20);
        for port in ports {
            assert_ne!(port, SHARED_REDIS_PORT);
            assert!(CANDIDATES.contains(&port));
            assert!(bindable(port), "{port} is free");
            assert!(bindable(port + CLUSTER_BUS_OFFSET));
        }
        assert!(!free_ports(1, false).unwrap().contains(&SHARED_REDIS_PORT));
    }
}
