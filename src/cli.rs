//! The command line: `serve`, `migrate`, `schema`, `config`, `--version`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::app::{App, shutdown_signal};
use crate::config::{Config, Overrides};
use crate::store::lock::{Holder, ServerLock};

#[derive(Debug, Parser)]
#[command(
    name = "corbel",
    version,
    about = "Corbel: providers, repositories and deployments behind one GraphQL API"
)]
pub struct Cli {
    /// Optional TOML file with the same settings as the flags (snake_case keys).
    #[arg(long, env = "CORBEL_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub overrides: Overrides,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Print the GraphQL schema (SDL).
    Schema,
    /// Print the effective configuration, secrets redacted.
    Config,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corbel: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(&cli.overrides, cli.config.as_deref())?;
    match cli.command {
        Command::Schema => {
            print!("{}", crate::api::sdl());
            Ok(())
        }
        Command::Config => {
            print!("{}", config.to_redacted_toml());
            Ok(())
        }
        Command::Migrate => runtime()?.block_on(async {
            crate::telemetry::init_logging(config.log_format, &config.log_filter);
            let location = config.database()?;
            // Not under a running server: it would serve a schema that changes
            // under it. The database's lock only (the data directory is
            // not used), released when done.
            let lock = ServerLock::acquire(None, &location, Holder::me("migrate", None)).await?;
            let migrated = async {
                let db = crate::store::connect(&location).await?;
                crate::store::migrate(&db).await?;
                db.close().await?;
                anyhow::Ok(())
            }
            .await;
            lock.release().await;
            migrated?;
            tracing::info!(database = %location.redacted(), "migrations applied");
            Ok(())
        }),
        Command::Serve => runtime()?.block_on(serve(config)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn serve(config: Config) -> anyhow::Result<()> {
    crate::telemetry::init_logging(config.log_format, &config.log_filter);
    let shutdown = shutdown_signal()?;
    let app = App::build(&config).await?;
    if let Some(token) = app.new_admin_token() {
        // Shown on the terminal once, never through the logs.
        println!(
            "\nCreated user `admin`. Its token, shown only this once:\n\n    {token}\n\n\
             Send it as `Authorization: Bearer <token>`; set a password with `setPassword`.\n"
        );
    }
    tracing::info!(
        url = %format!("http://{}", app.local_addr()),
        database = %config.database()?.redacted(),
        data_dir = %config.data_dir.display(),
        "corbel {} listening on http://{}",
        crate::VERSION,
        app.local_addr()
    );
    app.run_until_stopped(shutdown).await
}
