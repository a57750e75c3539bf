//! Running the example binaries and talking HTTP/1.1 to them.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `target/<profile>/examples/<name>`: cargo builds examples for `cargo test`.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test-binary>
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test` (it builds examples)",
        bin.display()
    );
    bin
}

pub use rate_tier_test_support::free_port;

/// A running example server; killed on drop. Its stderr is collected.
pub struct Server {
    pub port: u16,
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let mut command = Command::new(example_bin("server"));
        command
            .arg(port.to_string())
            .args(args)
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        });
        let server = Server {
            port,
            child,
            stderr,
        };
        server.wait_until_listening();
        server
    }

    fn wait_until_listening(&self) {
        let port = self.port;
        until(&format!("server listening on {port}"), self, || {
            TcpStream::connect(("127.0.0.1", port))
                .is_ok()
                .then_some(())
        });
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends it SIGTERM, as an orchestrator stops it.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {}", self.pid());
    }

    /// Waits (bounded) until it exits: its status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let stderr = self.stderr.clone();
        let child = &mut self.child;
        until_with("the server exiting", &stderr, || child.try_wait().unwrap())
    }

    /// Waits (bounded) until a stderr line contains `needle`.
    pub fn wait_for_stderr(&self, needle: &str) -> String {
        until(&format!("a stderr line with {needle:?}"), self, || {
            self.stderr().into_iter().find(|l| l.contains(needle))
        })
    }

    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    pub fn get(&self, path: &str, api_key: Option<&str>) -> Response {
        get(self.port, path, api_key)
    }
}

/// Polls `ready` (every 10 ms, at most 20 s) until it gives a value;
/// panics naming `what` with the server's stderr.
fn until<T>(
    what: &str,
    server: &Server,
    ready: impl FnMut() -> Option<T>,
) -> T {
    until_with(what, &server.stderr, ready)
}

fn until_with<T>(
    what: &str,
    stderr: &Mutex<Vec<String>>,
    mut ready: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within 20 s; stderr: {:?}",
            stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Lower-case names, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A connection to the server on `port`. A connect that is reset or
/// refused sent nothing, so it is tried again (see [`retried`]).
pub fn connect(port: u16) -> TcpStream {
    retried(&format!("connect to {port}"), || {
        TcpStream::connect(("127.0.0.1", port))
    })
}

/// A fresh connection with `request` (a whole HTTP/1.1 request) written
/// on it in one piece: a write that fails left the server without a
/// complete request, so it is sent again on a new connection (see
/// [`retried`]).
pub fn send(port: u16, request: &str) -> TcpStream {
    retried(&format!("send to {port}"), || {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.write_all(request.as_bytes())?;
        Ok(stream)
    })
}

/// `attempt`'s value; tried again, a few times and each one reported on
/// stderr, while it fails as a connection that the server refused or reset
/// before it read a whole request (so it served nothing); then the test
/// fails, naming `what`.
fn retried<T>(
    what: &str,
    mut attempt: impl FnMut() -> std::io::Result<T>,
) -> T {
    use std::io::ErrorKind::{BrokenPipe, ConnectionRefused, ConnectionReset};
    let mut tries = 0;
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(error)
                if tries < 5
                    && matches!(
                        error.kind(),
                        ConnectionReset | ConnectionRefused | BrokenPipe
                    ) =>
            {
                tries += 1;
                eprintln!("{what}: {error}; trying again");
                // A real server's socket: a short real pause, bounded.
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => panic!("{what}: {error}"),
        }
    }
}

/// [`send`]s `request` (asking `connection: close`) and reads the answer
/// to the end.
pub fn exchange(port: u16, request: &str) -> Vec<u8> {
    let mut stream = send(port, request);
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Read to the end; a reset once the answer is in (the server closed
    // the connection under a client still reading) loses nothing of it.
    let mut bytes = Vec::new();
    if let Err(error) = stream.read_to_end(&mut bytes) {
        let whole = String::from_utf8_lossy(&bytes).contains("\r\n\r\n");
        assert!(
            error.kind() == std::io::ErrorKind::ConnectionReset && whole,
            "{request:?} to {port}: {error} after {bytes:?}"
        );
    }
    bytes
}

/// One GET over a fresh connection, as `curl -s` would do it.
pub fn get(port: u16, path: &str, api_key: Option<&str>) -> Response {
    let key = api_key
        .map(|k| format!("x-api-key: {k}\r\n"))
        .unwrap_or_default();
    let bytes = exchange(
        port,
        &format!(
            "GET {path} HTTP/1.1\r\nhost: localhost:{port}\r\n{key}connection: close\r\n\r\n"
        ),
    );
    let raw = String::from_utf8(bytes).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    Response {
        status: status.parse().unwrap(),
        headers: lines
            .map(|line| {
                let (name, value) = line.split_once(':').unwrap();
                (name.to_ascii_lowercase(), value.trim().to_owned())
            })
            .collect(),
        body: body.to_owned(),
    }
}
