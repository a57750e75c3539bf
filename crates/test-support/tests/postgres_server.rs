//! PostgresServer against a real server, with whatever backend the
//! environment chooses: the installed server binaries, or containers with
//! `TRT_POSTGRES_BACKEND=docker` (what `cargo xtask test-redis --docker`
//! sets). Without PostgreSQL (neither the binaries nor Docker) these tests
//! fail with what to install, never skip.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use rate_tier_test_support::{
    POSTGRES_BACKEND_VAR, POSTGRES_SUPERUSER, PostgresServer,
    SHARED_POSTGRES_PORT,
};

/// A connection speaking the PostgreSQL protocol itself (simple queries,
/// trust authentication): no client library, and a read timeout of our
/// choosing, to see whether an open connection still gets answers.
struct RawClient {
    stream: TcpStream,
}

impl RawClient {
    fn connect(addr: SocketAddr) -> Self {
        let stream =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut client = Self { stream };
        let mut body = 196_608_i32.to_be_bytes().to_vec(); // protocol 3.0
        for field in ["user", POSTGRES_SUPERUSER, "database", "postgres"] {
            body.extend_from_slice(field.as_bytes());
            body.push(0);
        }
        body.push(0);
        let len = i32::try_from(body.len() + 4).unwrap();
        client.stream.write_all(&len.to_be_bytes()).unwrap();
        client.stream.write_all(&body).unwrap();
        client.read_until_ready().unwrap();
        client
    }

    /// Sends a simple query without waiting for its answer.
    fn send(&mut self, sql: &str) -> io::Result<()> {
        let mut message = b"Q".to_vec();
        let len = i32::try_from(sql.len() + 5).unwrap();
        message.extend_from_slice(&len.to_be_bytes());
        message.extend_from_slice(sql.as_bytes());
        message.push(0);
        self.stream.write_all(&message)
    }

    /// Reads messages up to ReadyForQuery; the first column of the last
    /// data row, if any.
    fn read_until_ready(&mut self) -> io::Result<Option<String>> {
        let mut value = None;
        loop {
            let mut header = [0_u8; 5];
            self.stream.read_exact(&mut header)?;
            let len = i32::from_be_bytes(header[1..].try_into().unwrap());
            let mut body = vec![0_u8; usize::try_from(len - 4).unwrap()];
            self.stream.read_exact(&mut body)?;
            match header[0] {
                b'Z' => return Ok(value),
                b'E' => panic!("error: {}", String::from_utf8_lossy(&body)),
                b'D' => {
                    let n = i32::from_be_bytes(body[2..6].try_into().unwrap());
                    value = Some(
                        String::from_utf8_lossy(
                            &body[6..6 + usize::try_from(n).unwrap()],
                        )
                        .into_owned(),
                    );
                }
                _ => {}
            }
        }
    }

    fn query(&mut self, sql: &str) -> Option<String> {
        self.send(sql).unwrap();
        self.read_until_ready().unwrap()
    }
}

/// The postmaster's pid for a process (a container's processes are not
/// this machine's to watch): `None` exactly for Docker.
fn postmaster_of(server: &PostgresServer) -> Option<u32> {
    let pid = server.postmaster_pid();
    assert_eq!(
        pid.is_some(),
        server.backend() == "process",
        "{server:?}: a process has a postmaster pid, a container none"
    );
    pid
}

fn is_gone(pid: u32) -> bool {
    // Gone, or a zombie nobody reaps (init in some containers).
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .unwrap()
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn a_server_answers_on_a_loopback_port_of_its_own_and_is_removed_on_drop() {
    let started = Instant::now();
    let server = PostgresServer::start();
    eprintln!("start took {:?}", started.elapsed());
    assert_ne!(server.port(), SHARED_POSTGRES_PORT);
    assert_eq!(
        server.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", server.port())
    );
    assert!(server.is_running() && !server.is_paused());
    assert!(server.answers(Duration::from_secs(1)));
    assert_eq!(server.psql("select 1").unwrap(), "1\n");
    assert_eq!(
        RawClient::connect(server.addr())
            .query("select current_user")
            .as_deref(),
        Some("postgres")
    );
    assert!(
        server
            .logs()
            .contains("database system is ready to accept connections"),
        "{}",
        server.logs()
    );
    let other = PostgresServer::start();
    assert_ne!(other.port(), server.port());
    assert_ne!(other.dir(), server.dir());

    let (dir, addr) = (server.dir().to_path_buf(), server.addr());
    let postmaster = postmaster_of(&server);
    drop(server);
    assert!(!dir.exists(), "{} was removed", dir.display());
    if let Some(postmaster) = postmaster {
        assert!(is_gone(postmaster), "the postmaster was stopped");
    }
    assert!(TcpStream::connect(addr).is_err(), "nothing listens");
    assert!(
        other.answers(Duration::from_secs(1)),
        "the other one runs on"
    );
}

#[test]
fn the_backend_is_the_one_asked_for_and_the_server_is_alike_whatever_runs_it() {
    let server = PostgresServer::start();
    match std::env::var(POSTGRES_BACKEND_VAR)
        .as_deref()
        .map(str::trim)
    {
        Ok("docker") => assert_eq!(server.backend(), "docker"),
        Ok("process") => assert_eq!(server.backend(), "process"),
        // Chosen by what is installed: either.
        _ => assert!(matches!(server.backend(), "process" | "docker")),
    }
    eprintln!("backend: {server:?}");
    assert_eq!(
        server
            .psql(
                "select current_setting('server_encoding') || ' ' || \
                 current_setting('lc_collate') || ' ' || current_user"
            )
            .unwrap(),
        "UTF8 C postgres\n"
    );
    // The binaries' directory is the server's own (inside the image, for a
    // container).
    assert_eq!(
        server
            .psql("select setting from pg_config where name = 'BINDIR'")
            .unwrap()
            .trim(),
        server.bin_dir().to_str().unwrap()
    );
    assert!(server.dir().is_dir());
    let e = server.psql("select * from no_such_table").unwrap_err();
    assert!(
        e.message().contains("no_such_table")
            && e.message().contains(&server.to_string()),
        "{e}"
    );
}

#[test]
fn data_survives_a_restart_and_a_kill() {
    let mut server = PostgresServer::start();
    let port = server.port();
    server
        .psql("create table kept (k int primary key); insert into kept values (1)")
        .unwrap();

    server.restart(); // a clean stop, then a start
    assert_eq!(server.port(), port);
    assert_eq!(server.psql("select count(*) from kept").unwrap(), "1\n");
    server.psql("insert into kept values (2)").unwrap();

    let mut idle = RawClient::connect(server.addr());
    let postmaster = postmaster_of(&server);
    server.kill();
    assert!(!server.is_running());
    assert_eq!(server.postmaster_pid(), None);
    if let Some(postmaster) = postmaster {
        assert!(is_gone(postmaster));
    }
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "connections are refused"
    );
    assert!(!server.answers(Duration::from_millis(500)));
    // The open connection was closed under its client, not left hanging.
    idle.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = idle.send("select 1"); // may fail already (EPIPE)
    let mut byte = [0_u8; 1];
    let read = idle.stream.read(&mut byte);
    if server.backend() == "process" {
        // Closed with no word from the server (a FATAL message would mean
        // it saw its end coming: `kill` stops the postmaster first).
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}: {byte:?}");
    } else {
        // `docker kill` ends the container's first process, and the kernel
        // its others after it: a backend may have the time to say
        // "unexpected postmaster exit" ('E', an error) before it goes. Closed
        // all the same, never left hanging.
        let mut rest = Vec::new();
        let end = idle.stream.read_to_end(&mut rest);
        assert!(
            matches!(read, Ok(0) | Err(_)) || (byte == *b"E" && end.is_ok()),
            "{read:?}: {byte:?}, then {end:?}"
        );
    }

    let started = Instant::now();
    server.restart(); // crash recovery
    eprintln!("restart after kill took {:?}", started.elapsed());
    assert_eq!(server.port(), port);
    assert!(server.is_running());
    assert_eq!(
        server
            .psql("select string_agg(k::text, ',' order by k) from kept")
            .unwrap(),
        "1,2\n",
        "every committed row survived the kill"
    );
    assert!(
        server.logs().contains("database system was interrupted"),
        "crash recovery ran:\n{}",
        server.logs()
    );
}

#[test]
fn a_stopped_server_restarts_with_its_data() {
    let mut server = PostgresServer::start();
    server.psql("create table t (k int)").unwrap();
    server.stop();
    assert!(!server.is_running());
    assert!(TcpStream::connect(server.addr()).is_err());
    server.restart();
    assert_eq!(server.psql("select count(*) from t").unwrap(), "0\n");
}

#[test]
fn a_paused_server_accepts_connections_but_answers_nothing_until_resumed() {
    let mut server = PostgresServer::start();
    let mut open = RawClient::connect(server.addr());
    assert_eq!(open.query("select 41 + 1").as_deref(), Some("42"));

    server.pause();
    assert!(server.is_paused() && server.is_running());
    // The kernel still accepts connections; the server answers none.
    let mut new =
        TcpStream::connect_timeout(&server.addr(), Duration::from_secs(1))
            .expect("a paused server's port accepts connections");
    new.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    new.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .unwrap();
    let mut byte = [0_u8; 1];
    let err = new.read(&mut byte).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err}"
    );
    assert!(!server.answers(Duration::from_millis(300)));
    // An open connection's backend is frozen too: its query hangs.
    open.stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    open.send("select 'after the pause'").unwrap();
    let err = open.read_until_ready().unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err}"
    );

    server.resume();
    assert!(!server.is_paused());
    open.stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        open.read_until_ready().unwrap().as_deref(),
        Some("after the pause"),
        "the query sent meanwhile is answered"
    );
    assert!(server.answers(Duration::from_secs(1)));
    assert_eq!(server.psql("select 1").unwrap(), "1\n");
}

#[test]
fn a_paused_server_can_be_killed_restarted_and_dropped() {
    let mut server = PostgresServer::start();
    let _open = RawClient::connect(server.addr());
    server.pause();
    server.kill();
    assert!(!server.is_running() && !server.is_paused());
    server.restart();
    assert_eq!(server.psql("select 1").unwrap(), "1\n");
    server.pause();
    let dir = server.dir().to_path_buf();
    drop(server); // paused: resumed, then stopped
    assert!(!dir.exists());
}

#[test]
fn a_directory_without_the_binaries_is_a_clear_error() {
    let e = PostgresServer::start_with(Path::new("/nonexistent/pg/bin"))
        .unwrap_err();
    assert!(e.message().contains("/nonexistent/pg/bin"), "{e}");
    assert!(e.message().contains("apt-get install -y postgresql"), "{e}");
}
