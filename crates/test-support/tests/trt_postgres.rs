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
    match value("TRT_POSTGRES_BACKEND").as_str() {
        "process" => {
            let bin_dir = value("TRT_POSTGRES_BIN_DIR");
            assert!(
                std::path::Path::new(&bin_dir).join("initdb").exists(),
                "{bin_dir}"
            );
        }
        "docker" => assert!(!value("TRT_POSTGRES_IMAGE").is_empty()),
        other => panic!("TRT_POSTGRES_BACKEND={other}"),
    }
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

/// Runs `trt-postgres` with `args` and `env` (`None`: removed), expecting
/// it to fail with exit code 1 and print no environment: its stderr.
fn failing(args: &[&str], env: &[(&str, Option<&str>)]) -> String {
    let mut command = Command::new(BIN);
    command.args(args).stdin(Stdio::null());
    for &(key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "no environment is printed");
    stderr
}

#[test]
fn without_the_binaries_up_fails_with_what_to_do() {
    let stderr = failing(
        &["up"],
        &[
            ("TRT_POSTGRES_BACKEND", None),
            ("TRT_POSTGRES_BIN_DIR", Some("/nonexistent/postgresql/bin")),
        ],
    );
    assert!(
        stderr.contains("TRT_POSTGRES_BIN_DIR=/nonexistent/postgresql/bin"),
        "{stderr}"
    );
}

#[test]
fn docker_forced_without_an_engine_is_an_error() {
    for args in [&["up", "--docker"][..], &["up"]] {
        let stderr = failing(
            args,
            &[
                ("TRT_POSTGRES_BACKEND", Some("docker")),
                ("DOCKER_HOST", Some("unix:///nonexistent/docker.sock")),
            ],
        );
        for needle in [
            "TRT_POSTGRES_BACKEND=docker",
            "no Docker engine answered",
            "/nonexistent/docker.sock",
        ] {
            assert!(stderr.contains(needle), "{needle:?} in {stderr}");
        }
    }
}

#[test]
fn image_names_the_image_of_the_docker_path() {
    let image = |value: Option<&str>| {
        let mut command = Command::new(BIN);
        command.arg("image");
        match value {
            Some(value) => command.env("TRT_POSTGRES_IMAGE", value),
            None => command.env_remove("TRT_POSTGRES_IMAGE"),
        };
        let output = command.output().unwrap();
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(image(None), "postgres:15");
    assert_eq!(image(Some("localhost:5000/pg:16")), "localhost:5000/pg:16");
}

#[test]
fn help_and_bad_arguments() {
    let help = Command::new(BIN).arg("help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("TRT_POSTGRES_URL"));
    for bad in [&["up", "--bogus"][..], &["up", "--docker", "--process"]] {
        let bad = Command::new(BIN).args(bad).output().unwrap();
        assert_eq!(bad.status.code(), Some(2));
    }
}
