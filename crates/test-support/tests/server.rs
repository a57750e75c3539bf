//! RedisServer against a real server, with whatever backend the environment
//! chooses (`TRT_REDIS_BACKEND=docker` for containers).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rate_tier_test_support::{RedisServer, SHARED_REDIS_PORT};

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn ping(
    connection: &mut redis::aio::MultiplexedConnection,
) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(connection).await
}

#[test]
fn a_server_answers_on_a_loopback_port_of_its_own() {
    let server = RedisServer::start();
    assert_ne!(server.port(), SHARED_REDIS_PORT);
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
    assert!(
        server.logs().contains("Ready to accept connections"),
        "{}",
        server.logs()
    );
    let other = RedisServer::start();
    assert_ne!(other.port(), server.port());
}

#[test]
fn a_killed_server_refuses_and_restarts_empty_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert_eq!(server.command(&["SET", "k", "v"]).unwrap(), "OK");
    let mut idle = TcpStream::connect(server.addr()).unwrap();

    server.kill();
    assert!(!server.is_running());
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "connections are refused"
    );
    // The client's connection was closed under it, not left hanging.
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = idle.write_all(b"*1\r\n$4\r\nPING\r\n");
    let mut reply = [0_u8; 16];
    assert!(matches!(idle.read(&mut reply), Ok(0) | Err(_)));

    let started = Instant::now();
    server.restart();
    eprintln!(
        "restart ({}) took {:?}",
        server.backend(),
        started.elapsed()
    );
    assert_eq!(server.port(), port);
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
    assert_eq!(
        server.command(&["GET", "k"]).unwrap(),
        "",
        "nothing was saved"
    );
}

#[tokio::test]
async fn a_paused_server_accepts_connections_but_times_out_its_clients() {
    let mut server = RedisServer::start();
    let mut client = connect(&server.url()).await;
    assert_eq!(ping(&mut client).await.unwrap(), "PONG");

    server.pause();
    assert!(server.is_paused());
    let late =
        tokio::time::timeout(Duration::from_millis(300), ping(&mut client))
            .await;
    assert!(
        !matches!(late, Ok(Ok(_))),
        "a paused server answered: {late:?}"
    );
    // The kernel still accepts a new connection: a hung server, not a dead one.
    let mut fresh = TcpStream::connect(server.addr()).unwrap();
    fresh
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    fresh.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut reply = [0_u8; 7];
    let unanswered = fresh.read(&mut reply);
    assert!(
        matches!(&unanswered, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "{unanswered:?}"
    );

    server.resume();
    // What it was sent meanwhile is answered now.
    fresh
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    fresh.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ping(&mut client).await {
            Ok(pong) => break assert_eq!(pong, "PONG"),
            Err(e) => assert!(
                Instant::now() < deadline,
                "no answer after resume: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_paused_server_can_be_killed_and_restarted() {
    let mut server = RedisServer::start();
    server.pause();
    server.kill();
    server.restart();
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
}

#[test]
fn misuse_panics_with_the_reason() {
    let mut server = RedisServer::start();
    let restart =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            server.restart()
        }));
    let message = *restart.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains("still running"), "{message}");
}
