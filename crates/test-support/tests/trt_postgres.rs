//! The `trt-postgres` binary that `cargo xtask` runs: its environment lines,
//! its life bound to its standard input, and its errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_trt-postgres");

/// Whether a PostgreSQL answers an SSLRequest on the URL's port.
fn answers(url: &str) -> bool {
    let port: u16 = url
        .strip_prefix("postgres://postgres@127.0.0.1:")
        .and_then(|rest| rest.strip_suffix("/postgres"))
        .unwrap_or_else(|| panic!("unexpected URL {url}"))
        .parse()
        .unwrap();
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut reply = [0_u8; 1];
    stream
        .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"N"
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
    let mut ready = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line == "TRT_POSTGRES_READY=1" {
            ready = true;
            break;
        }
        lines.push(line);
    }
    assert!(ready, "trt-postgres up failed (its message is above)");
    let value = |key: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} line in {lines:?}"))
            .to_owned()
    };
    let bin_dir = value("TRT_POSTGRES_BIN_DIR");
    assert!(
        std::path::Path::new(&bin_dir).join("initdb").exists(),
        "{bin_dir}"
    );
    let url = value("TRT_POSTGRES_URL");
    assert!(answers(&url), "{url} answers");

    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "trt-postgres did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(!answers(&url), "the server was stopped");
}

#[test]
fn without_the_binaries_up_fails_with_what_to_do() {
    let output = Command::new(BIN)
        .arg("up")
        .env("TRT_POSTGRES_BIN_DIR", "/nonexistent/postgresql/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(output.stdout.is_empty(), "no environment is printed");
    assert!(
        stderr.contains("TRT_POSTGRES_BIN_DIR=/nonexistent/postgresql/bin"),
        "{stderr}"
    );
}

#[test]
fn help_and_bad_arguments() {
    let help = Command::new(BIN).arg("help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("TRT_POSTGRES_URL"));
    let bad = Command::new(BIN).args(["up", "--bogus"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
