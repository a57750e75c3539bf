//! `rate-tier-service`: a GCRA drop-in for envoyproxy/ratelimit.
//!
//! ```text
//! cargo run -p rate-tier-service -- --config examples/ratelimit
//! cargo run -p rate-tier-service -- check-config examples/ratelimit
//! ```
//!
//! See `--help` and the crate docs of `rate_tier_service`.

use std::process::ExitCode;

use rate_tier_service::cli::{self, Command, LogFormat};
use rate_tier_service::{Config, Service, runtime};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

fn init_logs(format: LogFormat, level: tracing::Level) {
    let filter: Targets = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(level));
    let registry = tracing_subscriber::registry().with(filter);
    // Logs go to stderr; colours only on a terminal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => registry.with(layer).init(),
        LogFormat::Json => registry.with(layer.json()).init(),
    }
}

/// SIGTERM or Ctrl-C.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn main() -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let command = match cli::parse_with_env(std::env::args_os().skip(1), env) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("rate-tier-service: {}", message.trim_end());
            return ExitCode::from(2);
        }
    };
    let serve = match command {
        Command::Print(text) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Command::CheckConfig(path) => {
            return match Config::load(&path) {
                Ok(config) => {
                    for warning in config.warnings() {
                        eprintln!("warning: {warning}");
                    }
                    println!(
                        "{}: valid: {} domain(s), {} rule(s)",
                        path.display(),
                        config.domains().count(),
                        config.rule_count()
                    );
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("{error}");
                    ExitCode::from(1)
                }
            };
        }
        Command::Migrate(url) => return migrate(&url),
        Command::Serve(serve) => serve,
        _ => return ExitCode::from(2),
    };
    if let Some(admin) = &serve.options.admin
        && !admin.addr.ip().is_loopback()
    {
        eprintln!(
            "warning: --admin {}: not a loopback address: the admin API is reachable from the network, \
             guarded by its token alone",
            admin.addr
        );
    }
    let available = std::thread::available_parallelism()
        .unwrap_or(std::num::NonZeroUsize::MIN);
    let threads =
        match runtime::threads(env(runtime::THREADS_VAR).as_deref(), available)
        {
            Ok(threads) => threads,
            Err(message) => {
                eprintln!("rate-tier-service: {message}");
                return ExitCode::from(2);
            }
        };
    init_logs(serve.log_format, serve.log_level);
    let drain = serve.drain;
    let runtime = match runtime::build(threads) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("rate-tier-service: cannot start the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    tracing::info!("running on {}", runtime::describe(threads));
    runtime.block_on(async move {
        let running = match Service::start(serve.options).await {
            Ok(running) => running,
            Err(error) => {
                tracing::error!(%error, "cannot start");
                return ExitCode::from(1);
            }
        };
        stop_signal().await;
        // Health says not serving at once; requests are still answered
        // while load balancers notice, then the listeners close. A second
        // signal ends the drain.
        running.stop_serving().await;
        tracing::info!(?drain, "draining: health says not serving, requests are still answered");
        tokio::select! {
            () = tokio::time::sleep(drain) => {}
            () = stop_signal() => tracing::info!("a second signal: the drain ends now"),
        }
        tracing::info!("shutting down: finishing the requests in flight");
        running.stop().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

/// `migrate --postgres URL`: the store's schema, created or updated.
fn migrate(url: &str) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("rate-tier-service: cannot start a runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(rate_tier_service::server::migrate_postgres(url)) {
        Ok(table) => {
            println!("migrated: table {table} and its functions are in place");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("rate-tier-service: migrate: {error}");
            ExitCode::from(1)
        }
    }
}
