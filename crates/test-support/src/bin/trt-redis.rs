//! `trt-redis`: the throwaway Redis servers of `cargo xtask`, from one place
//! (this crate's `RedisServer` and `RedisCluster`), whatever runs them.
//! Run `trt-redis help` for the commands.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use rate_tier_test_support::{
    BACKEND_VAR, Backend, ClusterSpec, Error, IMAGE_VAR, Image, RedisServer,
    SERVER_BIN_VAR, build_local_image, find_cli, find_server,
};

const USAGE: &str = "\
trt-redis: throwaway Redis servers for the tests of the tower-rate-tier workspace

Usage:
  trt-redis up [--server] [--cluster] [--masters N] [--replicas R] [--docker | --process]
  trt-redis image
  trt-redis build-image [IMAGE]
  trt-redis help

up           starts a Redis server (--server; the default) and/or a Redis Cluster
             (--cluster: 3 masters and no replicas unless --masters/--replicas say
             otherwise) on free loopback ports (never 6379), and prints the tests'
             environment on standard output, one KEY=VALUE a line:
               TRT_REDIS_BACKEND=process|docker
               TRT_REDIS_SERVER_BIN=<path>      (process) or TRT_REDIS_IMAGE=<image> (docker)
               TRT_REDIS_URL=redis://127.0.0.1:<port>/
               TRT_REDIS_CLUSTER_URLS=redis://127.0.0.1:<p1>/,...
               TRT_REDIS_READY=1                (last: everything is up)
             Then it stays up until its standard input closes (end of file) or it
             is killed, and stops and removes everything it started.
             --docker forces Docker containers, --process forces redis-server
             processes; otherwise TRT_REDIS_BACKEND decides, else redis-server on
             PATH, else a Docker engine that answers, else an error.
image        prints the image the Docker path runs (TRT_REDIS_IMAGE, default redis:7.0)
build-image  builds that image (or IMAGE) from the installed redis-server and
             redis-cli (FROM scratch, with the libraries ldd lists), for a machine
             with Docker but no registry; elsewhere the official image is pulled
help         prints this message
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("up") => up(&args[1..]),
        Some("image") if args.len() == 1 => {
            println!("{}", Image::from_env());
            Ok(())
        }
        Some("build-image") if args.len() <= 2 => build_image(args.get(1)),
        Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!(
                "trt-redis: error: unexpected arguments {args:?}\n\n{USAGE}"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trt-redis: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What `up` starts.
struct Up {
    server: bool,
    cluster: bool,
    masters: usize,
    replicas: usize,
    backend: Option<Backend>,
}

fn parse_up(args: &[String]) -> Result<Up, Error> {
    let mut up = Up {
        server: false,
        cluster: false,
        masters: 3,
        replicas: 0,
        backend: None,
    };
    let usage = |message: String| Error::new(format!("{message}\n\n{USAGE}"));
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut count = |name: &str| -> Result<usize, Error> {
            args.next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| usage(format!("{name} takes a number")))
        };
        match arg.as_str() {
            "--server" => up.server = true,
            "--cluster" => up.cluster = true,
            "--masters" => up.masters = count("--masters")?,
            "--replicas" => up.replicas = count("--replicas")?,
            "--docker" => up.backend = Some(Backend::docker()?),
            "--process" => up.backend = Some(Backend::process()?),
            other => {
                return Err(usage(format!("unexpected argument {other:?}")));
            }
        }
    }
    if !up.server && !up.cluster {
        up.server = true;
    }
    Ok(up)
}

fn up(args: &[String]) -> Result<(), Error> {
    let up = parse_up(args)?;
    let backend = match up.backend {
        Some(backend) => backend,
        None => Backend::from_env()?,
    };
    eprintln!("trt-redis: starting with {backend}");
    let mut lines = vec![format!("{BACKEND_VAR}={}", backend.name())];
    match &backend {
        Backend::Process { server, .. } => {
            lines.push(format!("{SERVER_BIN_VAR}={}", server.display()));
        }
        Backend::Docker { image } => lines.push(format!("{IMAGE_VAR}={image}")),
        _ => {}
    }
    let server = if up.server {
        let server = RedisServer::start_with(&backend)?;
        eprintln!("trt-redis: {server} is up");
        lines.push(format!("TRT_REDIS_URL={}", server.url()));
        Some(server)
    } else {
        None
    };
    let cluster = if up.cluster {
        let cluster =
            ClusterSpec::new(up.masters, up.replicas).start_with(&backend)?;
        let ports: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|n| n.port().to_string())
            .collect();
        eprintln!(
            "trt-redis: Redis Cluster ({} masters, {} replicas each) is up on ports {}",
            up.masters,
            up.replicas,
            ports.join(", ")
        );
        lines.push(format!(
            "TRT_REDIS_CLUSTER_URLS={}",
            cluster.urls().join(",")
        ));
        Some(cluster)
    } else {
        None
    };
    lines.push("TRT_REDIS_READY=1".to_owned());
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

    drop(cluster);
    drop(server);
    eprintln!("trt-redis: stopped");
    Ok(())
}

fn build_image(image: Option<&String>) -> Result<(), Error> {
    let image = image.map_or_else(Image::from_env, |i| Image::parse(i));
    let server = find_server()?;
    let cli = find_cli(&server).ok_or_else(|| {
        Error::new(
            "`redis-cli` is not on PATH: the image holds it (it creates clusters). Install \
             it (`apt-get install redis-tools` on Debian/Ubuntu)",
        )
    })?;
    build_local_image(&image, &server, &cli)
}
