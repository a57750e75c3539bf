//! `trt-postgres`: the throwaway PostgreSQL of `cargo xtask`, from this
//! crate's `PostgresServer`, whatever runs it. Run `trt-postgres help` for
//! the commands.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use rate_tier_test_support::{
    Error, Image, POSTGRES_BACKEND_VAR, POSTGRES_BIN_DIR_VAR,
    POSTGRES_IMAGE_VAR, PostgresBackend, PostgresServer,
    build_local_postgres_image, find_postgres_bin_dir,
};

const USAGE: &str = "\
trt-postgres: a throwaway PostgreSQL for the tests of the tower-rate-tier workspace

Usage:
  trt-postgres up [--docker | --process]
  trt-postgres image
  trt-postgres build-image [IMAGE]
  trt-postgres help

up           starts a PostgreSQL on a free loopback port (never 5432) and prints the
             tests' environment on standard output, one KEY=VALUE a line:
               TRT_POSTGRES_BACKEND=process|docker
               TRT_POSTGRES_BIN_DIR=<dir>   (process: the initdb, pg_ctl and postgres
                                            it runs) or TRT_POSTGRES_IMAGE=<image> (docker)
               TRT_POSTGRES_URL=postgres://postgres@127.0.0.1:<port>/postgres
               TRT_POSTGRES_READY=1         (last: the server accepts connections)
             Then it stays up until its standard input closes (end of file) or it is
             killed, and stops the server and removes its directory or container.
             A process: a cluster in a new temporary directory (initdb), started with
             pg_ctl; as root, run as the `postgres` system user. A container (Docker,
             through testcontainers, on the host network): its image's entrypoint
             creates the cluster.
             --docker forces a container, --process the installed binaries;
             otherwise TRT_POSTGRES_BACKEND decides, else the binaries
             (TRT_POSTGRES_BIN_DIR, else initdb on PATH, else the newest
             /usr/lib/postgresql/<version>/bin), else a Docker engine that answers,
             else an error (apt-get install -y postgresql, or start Docker).
image        prints the image the Docker path runs (TRT_POSTGRES_IMAGE, default
             postgres:15)
build-image  builds that image (or IMAGE) from the installed PostgreSQL (FROM
             scratch: its binaries, modules and data files, the libraries ldd lists,
             /bin/sh and an entrypoint that creates the cluster), for a machine with
             Docker but no registry; elsewhere the official image is pulled
help         prints this message
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("up")
            if args.len() == 1
                || args.len() == 2
                    && matches!(args[1].as_str(), "--docker" | "--process") =>
        {
            up(args.get(1).map(String::as_str))
        }
        Some("image") if args.len() == 1 => {
            println!("{}", PostgresBackend::image_from_env());
            Ok(())
        }
        Some("build-image") if args.len() <= 2 => build_image(args.get(1)),
        Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!(
                "trt-postgres: error: unexpected arguments {args:?}\n\n{USAGE}"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trt-postgres: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `up`, with `--docker`, `--process` or neither.
fn up(forced: Option<&str>) -> Result<(), Error> {
    let backend = match forced {
        Some("--docker") => PostgresBackend::docker()?,
        Some("--process") => PostgresBackend::process()?,
        _ => PostgresBackend::from_env()?,
    };
    eprintln!("trt-postgres: starting with {backend}");
    let server = PostgresServer::start_on(&backend)?;
    eprintln!("trt-postgres: {server} is up");
    let mut lines = vec![format!("{POSTGRES_BACKEND_VAR}={}", backend.name())];
    match &backend {
        PostgresBackend::Process { bin_dir } => {
            lines.push(format!("{POSTGRES_BIN_DIR_VAR}={}", bin_dir.display()));
        }
        PostgresBackend::Docker { image } => {
            lines.push(format!("{POSTGRES_IMAGE_VAR}={image}"));
        }
        _ => {}
    }
    lines.push(format!("TRT_POSTGRES_URL={}", server.url()));
    lines.push("TRT_POSTGRES_READY=1".to_owned());
    let mut stdout = io::stdout().lock();
    for line in &lines {
        writeln!(stdout, "{line}")
            .map_err(|e| Error::new(format!("stdout: {e}")))?;
    }
    stdout
        .flush()
        .map_err(|e| Error::new(format!("stdout: {e}")))?;
    drop(stdout);

    // Up until standard input ends (xtask closes its end; a person presses
    // Ctrl-D) or reading it fails.
    let mut stdin = io::stdin().lock();
    let mut buffer = [0_u8; 256];
    while matches!(stdin.read(&mut buffer), Ok(n) if n > 0) {}

    drop(server);
    eprintln!("trt-postgres: stopped");
    Ok(())
}

fn build_image(image: Option<&String>) -> Result<(), Error> {
    let image =
        image.map_or_else(PostgresBackend::image_from_env, |i| Image::parse(i));
    build_local_postgres_image(&image, &find_postgres_bin_dir()?)
}
