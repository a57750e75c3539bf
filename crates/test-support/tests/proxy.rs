//! TcpProxy: forwarding, freeze, blackhole, cut, heal and retargeting, on an
//! echo server that counts what reaches it, and on a real Redis.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rate_tier_test_support::{RedisServer, TcpProxy};

/// A server that answers each chunk with `tag` followed by the chunk, and
/// counts the connections and bytes that reach it.
struct Echo {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
}

impl Echo {
    fn start(tag: &'static [u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let bytes = Arc::new(AtomicUsize::new(0));
        let (count, total) = (connections.clone(), bytes.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let total = total.clone();
                thread::spawn(move || {
                    let mut buffer = [0_u8; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buffer) {
                        total.fetch_add(n, Ordering::SeqCst);
                        let mut reply = tag.to_vec();
                        reply.extend_from_slice(&buffer[..n]);
                        if stream.write_all(&reply).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            connections,
            bytes,
        }
    }
}

fn connect(proxy: &TcpProxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

/// Sends `message` and reads the answer (`tag` + `message`).
fn round_trip(stream: &mut TcpStream, message: &[u8], tag: &[u8]) {
    stream.write_all(message).unwrap();
    let mut reply = vec![0_u8; tag.len() + message.len()];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..tag.len()], tag);
    assert_eq!(&reply[tag.len()..], message);
}

/// Nothing arrives within `wait`: no data, no end of stream.
fn silent(stream: &mut TcpStream, wait: Duration) {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buffer = [0_u8; 64];
    let read = stream.read(&mut buffer);
    assert!(
        matches!(&read, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "expected silence, got {read:?}"
    );
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
}

fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn it_forwards_both_ways_and_counts_connections() {
    let echo = Echo::start(b"a:");
    let proxy = TcpProxy::start(echo.addr);
    assert_eq!(proxy.target(), echo.addr);
    let mut one = connect(&proxy);
    round_trip(&mut one, b"hello", b"a:");
    let mut two = connect(&proxy);
    round_trip(&mut two, b"world", b"a:");
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.open(), 2);
    assert_eq!(proxy.frozen(), 0);
    drop(one);
    wait_for("the closed connection to be gone", || proxy.open() == 1);
    round_trip(&mut two, b"still", b"a:");
}

#[test]
fn freeze_silences_existing_connections_and_lets_new_ones_through() {
    let echo = Echo::start(b"a:");
    let proxy = TcpProxy::start(echo.addr);
    let mut old = connect(&proxy);
    round_trip(&mut old, b"before", b"a:");
    let reached = echo.bytes.load(Ordering::SeqCst);

    proxy.freeze();
    assert_eq!((proxy.open(), proxy.frozen()), (1, 1));
    old.write_all(b"during").unwrap();
    silent(&mut old, Duration::from_millis(300));
    assert_eq!(
        echo.bytes.load(Ordering::SeqCst),
        reached,
        "nothing was forwarded"
    );

    let mut new = connect(&proxy);
    round_trip(&mut new, b"new path", b"a:");
    assert_eq!((proxy.open(), proxy.frozen()), (2, 1));

    // The old connection is silent, not closed: it holds until healed, and
    // then what was sent meanwhile is delivered.
    silent(&mut old, Duration::from_millis(100));
    proxy.heal();
    let mut reply = [0_u8; 8];
    old.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"a:during");
    assert_eq!(proxy.frozen(), 0);
}

#[test]
fn a_frozen_connection_ignores_its_peer_closing() {
    let echo = Echo::start(b"a:");
    let proxy = TcpProxy::start(echo.addr);
    let mut client = connect(&proxy);
    round_trip(&mut client, b"x", b"a:");
    proxy.freeze();
    drop(client);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(proxy.open(), 1, "the proxy keeps its sockets while frozen");
    proxy.heal();
    wait_for("the close to be seen after heal", || proxy.open() == 0);
}

#[test]
fn blackhole_holds_new_connections_silent_until_healed() {
    let echo = Echo::start(b"a:");
    let proxy = TcpProxy::start(echo.addr);
    proxy.blackhole();
    let mut held = connect(&proxy);
    held.write_all(b"held").unwrap();
    silent(&mut held, Duration::from_millis(300));
    assert_eq!(
        echo.connections.load(Ordering::SeqCst),
        0,
        "never reached the target"
    );
    assert_eq!((proxy.open(), proxy.frozen()), (1, 1));

    proxy.heal();
    let mut reply = [0_u8; 6];
    held.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"a:held");
    assert_eq!(echo.connections.load(Ordering::SeqCst), 1);
}

#[test]
fn cut_closes_everything_and_refuses_new_connections_until_healed() {
    let echo = Echo::start(b"a:");
    let proxy = TcpProxy::start(echo.addr);
    let mut live = connect(&proxy);
    round_trip(&mut live, b"x", b"a:");
    let mut frozen = connect(&proxy);
    round_trip(&mut frozen, b"y", b"a:");
    proxy.freeze();

    proxy.cut();
    assert_eq!(proxy.open(), 0);
    for stream in [&mut live, &mut frozen] {
        let mut buffer = [0_u8; 8];
        assert!(matches!(stream.read(&mut buffer), Ok(0) | Err(_)), "closed");
    }
    let refused = TcpStream::connect(proxy.addr());
    assert!(refused.is_err(), "new connections are refused: {refused:?}");

    proxy.heal();
    let mut again = connect(&proxy);
    round_trip(&mut again, b"back", b"a:");
}

#[test]
fn set_target_sends_only_new_connections_elsewhere() {
    let (a, b) = (Echo::start(b"a:"), Echo::start(b"b:"));
    let proxy = TcpProxy::start(a.addr);
    let mut old = connect(&proxy);
    round_trip(&mut old, b"1", b"a:");
    proxy.set_target(b.addr);
    let mut new = connect(&proxy);
    round_trip(&mut new, b"2", b"b:");
    round_trip(&mut old, b"3", b"a:");
}

#[test]
fn dropping_the_proxy_closes_its_connections_and_its_port() {
    let echo = Echo::start(b"a:");
    let proxy = TcpProxy::start(echo.addr);
    let addr = proxy.addr();
    let mut client = connect(&proxy);
    round_trip(&mut client, b"x", b"a:");
    proxy.freeze();
    drop(proxy);
    let mut buffer = [0_u8; 8];
    assert!(matches!(client.read(&mut buffer), Ok(0) | Err(_)));
    assert!(TcpStream::connect(addr).is_err());
}

#[tokio::test]
async fn a_frozen_redis_connection_times_out_while_a_new_one_is_answered() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr());
    let client = redis::Client::open(proxy.redis_url()).unwrap();
    let mut old = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut old).await.unwrap();
    assert_eq!(pong, "PONG");

    proxy.freeze();
    let stuck = tokio::time::timeout(
        Duration::from_millis(300),
        redis::cmd("PING").query_async::<String>(&mut old),
    )
    .await;
    assert!(
        !matches!(stuck, Ok(Ok(_))),
        "a frozen connection answered: {stuck:?}"
    );

    let mut new = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut new).await.unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!((proxy.accepted(), proxy.frozen()), (2, 1));
}

#[test]
fn many_connections_with_large_transfers_arrive_intact() {
    const CONNECTIONS: usize = 16;
    const BYTES: usize = 512 * 1024;
    let echo = Echo::start(b"");
    let proxy = TcpProxy::start(echo.addr);
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let stream = connect(&proxy);
            thread::spawn(move || {
                let data: Vec<u8> =
                    (0..BYTES).map(|i| (i * 31 + c * 7) as u8).collect();
                let mut writer = stream.try_clone().unwrap();
                let sent = data.clone();
                let write = thread::spawn(move || {
                    for chunk in sent.chunks(7_919) {
                        writer.write_all(chunk).unwrap();
                    }
                });
                let mut reader = stream;
                let mut back = vec![0_u8; BYTES];
                reader.read_exact(&mut back).unwrap();
                write.join().unwrap();
                assert!(back == data, "connection {c} arrived intact");
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    assert_eq!(proxy.accepted(), CONNECTIONS as u64);
    assert_eq!(echo.bytes.load(Ordering::SeqCst), CONNECTIONS * BYTES);
}
