//! The example server drains on SIGTERM: `/healthcheck` says 503 at once
//! while requests are still served, then it stops by itself.

mod support;

use support::Server;

#[test]
fn sigterm_turns_health_off_serves_the_drain_then_stops() {
    let mut server = Server::start(&["--drain", "3"], &[]);
    assert_eq!(server.get("/healthcheck", None).status, 200);
    server.terminate();
    // Said once health says 503.
    server.wait_for_stderr("draining for 3s");
    assert_eq!(server.get("/healthcheck", None).status, 503);
    // Still served, and still limited, during the drain.
    let data = server.get("/data", Some("key_ana"));
    assert_eq!(data.status, 200);
    assert_eq!(data.header("x-ratelimit-remaining"), Some("9"));
    assert_eq!(server.get("/data", None).status, 401);
    assert!(server.wait_exit().success());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", server.port)).is_err(),
        "the listener is closed"
    );
}

#[test]
fn the_drain_period_comes_from_the_environment_too() {
    let mut server = Server::start(&[], &[("DRAIN_PERIOD", "0s")]);
    server.terminate();
    assert!(server.wait_exit().success());
    server.wait_for_stderr("draining for 0ns");
}
