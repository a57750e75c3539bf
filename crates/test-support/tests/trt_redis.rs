//! The `trt-redis` binary that `cargo xtask` runs: its environment lines, its
//! life bound to its standard input, and its errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_trt-redis");

fn ping(url: &str) -> bool {
    let port = url
        .trim_start_matches("redis://127.0.0.1:")
        .trim_end_matches('/');
    let Ok(mut stream) =
        TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap()))
    else {
        return false;
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut reply = [0_u8; 7];
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

#[test]
fn up_prints_the_environment_and_stops_everything_when_stdin_closes() {
    let mut child = Command::new(BIN)
        .arg("up")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line == "TRT_REDIS_READY=1" {
            break;
        }
        lines.push(line);
    }
    let value = |key: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} line in {lines:?}"))
            .to_owned()
    };
    let backend = value("TRT_REDIS_BACKEND");
    assert!(backend == "process" || backend == "docker", "{backend}");
    let url = value("TRT_REDIS_URL");
    assert!(ping(&url), "{url} answers");
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("TRT_REDIS_CLUSTER_URLS"))
    );

    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "trt-redis did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(!ping(&url), "the server was stopped");
}

fn without_redis_or_docker(args: &[&str]) -> (i32, String) {
    let output = Command::new(BIN)
        .args(args)
        .env_remove("TRT_REDIS_BACKEND")
        .env_remove("TRT_REDIS_SERVER_BIN")
        .env("PATH", "/nonexistent")
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.stdout.is_empty(), "no environment is printed");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn with_neither_redis_server_nor_docker_the_error_says_how_to_get_one() {
    let (code, stderr) = without_redis_or_docker(&["up"]);
    assert_eq!(code, 1, "{stderr}");
    for needle in [
        "no Redis for the tests",
        "redis-server` is not on PATH",
        "no Docker engine answered",
        "/nonexistent/docker.sock",
        "apt-get install redis-server",
    ] {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
}

#[test]
fn docker_forced_without_an_engine_is_an_error() {
    let (code, stderr) = without_redis_or_docker(&["up", "--docker"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no Docker engine answered"), "{stderr}");
}

#[test]
fn usage_errors_exit_with_2() {
    let (code, stderr) = without_redis_or_docker(&["bogus"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, stderr) = without_redis_or_docker(&["up", "--masters"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("--masters takes a number"), "{stderr}");
}
