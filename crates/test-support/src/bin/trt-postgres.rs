//! `trt-postgres`: the throwaway PostgreSQL of `cargo xtask`, from this
//! crate's `PostgresServer`. Run `trt-postgres help` for the commands.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use rate_tier_test_support::{
    Error, POSTGRES_BIN_DIR_VAR, PostgresServer, find_postgres_bin_dir,
};

const USAGE: &str = "\
trt-postgres: a throwaway PostgreSQL for the tests of the tower-rate-tier workspace

Usage:
  trt-postgres up
  trt-postgres help

up      creates a PostgreSQL cluster in a new temporary directory (initdb), starts
        it on a free loopback port (never 5432) with pg_ctl, and prints the tests'
        environment on standard output, one KEY=VALUE a line:
          TRT_POSTGRES_BIN_DIR=<dir>   (the initdb, pg_ctl and postgres it runs)
          TRT_POSTGRES_URL=postgres://postgres@127.0.0.1:<port>/postgres
          TRT_POSTGRES_READY=1         (last: the server accepts connections)
        Then it stays up until its standard input closes (end of file) or it is
        killed, and stops the server and removes its directory.
        The binaries: TRT_POSTGRES_BIN_DIR, else initdb on PATH, else the newest
        /usr/lib/postgresql/<version>/bin, else an error (apt-get install -y
        postgresql). As root, the server runs as the `postgres` system user.
help    prints this message
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("up") if args.len() == 1 => up(),
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

fn up() -> Result<(), Error> {
    let bin_dir = find_postgres_bin_dir()?;
    eprintln!("trt-postgres: starting PostgreSQL ({})", bin_dir.display());
    let server = PostgresServer::start_with(&bin_dir)?;
    eprintln!("trt-postgres: {server} is up ({})", server.dir().display());
    let lines = [
        format!("{POSTGRES_BIN_DIR_VAR}={}", bin_dir.display()),
        format!("TRT_POSTGRES_URL={}", server.url()),
        "TRT_POSTGRES_READY=1".to_owned(),
    ];
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
