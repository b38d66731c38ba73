//! The command line: `serve`, `migrate`, `schema`, `config`, `secret-key`,
//! `provider check`, `--version`; and the client's commands (`login`,
//! `deploy`, `get`…), which `crate::client` runs against a server's API.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::app::{App, shutdown_signal};
use crate::client::{ClientArgs, ClientCommand};
use crate::config::{Config, Overrides};
use crate::store::lock::{Holder, ServerLock};

#[derive(Debug, Parser)]
#[command(
    name = "corbel",
    version,
    about = "Corbel: providers, repositories and deployments behind one GraphQL API",
    after_help = crate::client::EXIT_CODES
)]
pub struct Cli {
    /// Optional TOML file with the same settings as the flags, in the form
    /// `corbel config` prints.
    #[arg(long, env = "CORBEL_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub overrides: Overrides,

    #[command(flatten)]
    pub client: ClientArgs,

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
    /// The key that seals providers' `secretConfig` at rest.
    SecretKey {
        #[command(subcommand)]
        command: SecretKeyCommand,
    },
    /// Print the shell's completion script for corbel: `source <(corbel
    /// completion bash)`, `corbel completion zsh > ~/.zfunc/_corbel`,
    /// `corbel completion fish > ~/.config/fish/completions/corbel.fish`.
    Completion {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Tools for provider authors.
    Provider {
        #[command(subcommand)]
        command: ProviderCommand,
    },
    /// The client's commands, run against a server's API.
    #[command(flatten)]
    Client(ClientCommand),
}

/// The shells `corbel completion` writes for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Subcommand)]
pub enum ProviderCommand {
    /// Conformance run: load a provider as `serve` would (fetch, build, run,
    /// handshake, register) against a host of its own, drive the protocol
    /// (Configure, ListNodes, DescribeResources, a deploy and destroy of each
    /// resource type with a sample in `check.resources`, idempotence, Inspect
    /// after a lost deploy, stream endings, deadlines, SIGTERM, the host going
    /// away) and print a table of results. Exits 1 if any check failed. Needs
    /// no server and no database; the `[provider]` settings apply.
    Check {
        /// A git URL or a local path to a git repository (committed work is
        /// what gets checked, as `serve` would load it).
        source: String,
        /// A tag, branch or commit; the default branch if not given.
        #[arg(long = "ref", default_value = "", hide_default_value = true)]
        reference: String,
        /// The provider's directory in the repository (a monorepo); the
        /// root if not given.
        #[arg(long, default_value = "", hide_default_value = true)]
        path: String,
        /// Keep the scratch directory (checkout, build output, state) and
        /// print where it is.
        #[arg(long)]
        keep: bool,
        /// How long after it registered the provider must still run and
        /// answer health checks (probed all along), in milliseconds: one
        /// that dies in its first seconds fails.
        #[arg(long, default_value_t = 3000)]
        settle_ms: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretKeyCommand {
    /// Print the id of the configured secret key (the id errors name).
    Id,
    /// Seal every stored secret under a new key in one transaction, then
    /// install the new key in place of the current key file. Takes the server
    /// lock: stop the server first. If interrupted, run it again with the same
    /// new key file: it finishes the job.
    Rotate {
        /// The new key (64 hex characters, mode 0600); made here if the file
        /// does not exist. Keep it until this command has succeeded.
        #[arg(long)]
        new_key_file: PathBuf,
    },
}

pub fn main() -> ExitCode {
    let command = command();
    let matches = match command.clone().try_get_matches() {
        Ok(matches) => matches,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            if let Some(help) = client_help(&command, std::env::args_os()) {
                print!("{help}");
                return ExitCode::SUCCESS;
            }
            e.exit()
        }
        Err(e) => e.exit(),
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Not kept for the server's life (160 KB of every argument's help).
    drop((command, matches));
    let Cli {
        config,
        overrides,
        client,
        command,
    } = cli;
    let command = match command {
        // A client command needs none of the server's configuration.
        Command::Client(command) => return crate::client::run(client, command),
        Command::Completion { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            let mut line = self::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut line, "corbel", &mut script);
            // A reader that stops early (`| head`) is not an error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            return ExitCode::SUCCESS;
        }
        command => command,
    };
    contain_self();
    match run(&overrides, config.as_deref(), command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corbel: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What the server's own process keeps from the programs beside it (issue
/// 38): it is made non-dumpable, so a process of the same user (a provider, a
/// workload) can neither trace it nor read its `/proc/<pid>/environ`, `mem`
/// or `fd`; and every `CORBEL_*` variable (the admin token, a database URL
/// with its password…) leaves its environment once the command line has been
/// read. Called before any thread starts: removing a variable is only sound
/// while no other thread can read the environment (the SDK's `run` does the
/// same for providers).
fn contain_self() {
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("corbel: cannot make the process non-dumpable: {e}");
    }
    let single_threaded =
        std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1);
    if !single_threaded {
        eprintln!("corbel: other threads run: the CORBEL_* variables stay in the environment");
        return;
    }
    // SAFETY: one thread, as above; the entries are C strings the C library
    // keeps, overwritten within their own length.
    unsafe { scrub_environment_block() };
    let ours: Vec<_> = std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| name.to_string_lossy().starts_with("CORBEL_"))
        .collect();
    for name in ours {
        // SAFETY: this process runs one thread (checked just above, on this
        // thread), so nothing reads or writes the environment meanwhile.
        unsafe { std::env::remove_var(name) };
    }
}

/// Overwrites the value of every `CORBEL_*` entry of the environment where
/// it lies with zero bytes: `/proc/<pid>/environ` shows the block the process
/// started with, which removing a variable leaves as it was (root, who can
/// still read a non-dumpable process's, sees `CORBEL_ADMIN_TOKEN=` and
/// nothing after it).
///
/// # Safety
/// Only while the process runs one thread: nothing else may read or change
/// the environment meanwhile.
unsafe fn scrub_environment_block() {
    unsafe extern "C" {
        static environ: *const *mut std::ffi::c_char;
    }
    // SAFETY: `environ` is the C library's null-terminated array of
    // null-terminated strings; each is written only within its length.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let text = std::ffi::CStr::from_ptr(*entry).to_bytes();
            if text.starts_with(b"CORBEL_")
                && let Some(equals) = text.iter().position(|b| *b == b'=')
            {
                let value = (*entry).add(equals + 1);
                std::ptr::write_bytes(value, 0, text.len() - equals - 1);
            }
            entry = entry.add(1);
        }
    }
}

/// The command line, each setting's help showing its default. The flags are
/// `Option`s (unset means "the file or the default decides"), so clap has no
/// default of its own to show: it is read from [`Config::default`], the one
/// place defaults are written, by the flag's key in the config file.
pub fn command() -> clap::Command {
    let defaults = toml::Table::try_from(Config::default()).expect("the defaults serialise");
    Cli::command().mut_args(|arg| {
        let Some(shown) = arg
            .get_long()
            .and_then(|long| default_shown(&defaults, long))
        else {
            return arg;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        arg.help(format!("{help} [default: {shown}]"))
    })
}

/// The help of a client command (`corbel get --help`, `corbel help get`):
/// its own arguments and the client's flags, not the server's (which clap
/// shows on every command, since `serve` and the others take them after
/// their name). `None` for a server command, whose help is clap's.
fn client_help(
    root: &clap::Command,
    args: impl Iterator<Item = std::ffi::OsString>,
) -> Option<String> {
    const CLIENT_FLAGS: [&str; 3] = ["server", "token", "output"];
    let mut current = root.clone();
    let mut path = vec![root.get_name().to_owned()];
    let mut client = false;
    let words = args.skip(1).filter_map(|a| a.into_string().ok());
    for word in words.filter(|w| !w.starts_with('-') && w != "help") {
        // A flag's value, or a positional argument.
        let Some(sub) = current.find_subcommand(&word).cloned() else {
            continue;
        };
        if path.len() == 1 {
            let names = ClientCommand::augment_subcommands(clap::Command::new("client"));
            client = names.find_subcommand(sub.get_name()).is_some();
        }
        path.push(sub.get_name().to_owned());
        current = sub;
    }
    if !client {
        return None;
    }
    let mut help = current
        .bin_name(path.join(" "))
        .after_help(crate::client::EXIT_CODES);
    for flag in root
        .get_arguments()
        .filter(|a| CLIENT_FLAGS.contains(&a.get_id().as_str()))
    {
        help = help.arg(flag.clone().global(false));
    }
    Some(help.render_help().to_string())
}

/// The default of the setting a flag sets, as the help shows it.
fn default_shown(defaults: &toml::Table, long: &str) -> Option<String> {
    match long {
        "database-url" => return Some("SQLite at <data-dir>/corbel.db".to_owned()),
        "admin-token" => return Some("made at first start and printed once".to_owned()),
        "secret-key-file" => return Some("<data-dir>/secret.key, made at first start".to_owned()),
        "login-trusted-proxy" => return Some("none".to_owned()),
        "provider-docker-host" => {
            return Some("$DOCKER_HOST, else unix:///var/run/docker.sock".to_owned());
        }
        "server" => {
            return Some(format!(
                "the one `corbel login` signed in to, else {}",
                crate::client::DEFAULT_SERVER
            ));
        }
        "token" => return Some("the one `corbel login` stored for that server".to_owned()),
        "output" => return Some("text".to_owned()),
        "advertise-url" => return Some("http://<the address it listens on>".to_owned()),
        "cluster" => return Some("false: one server".to_owned()),
        "provider-state-dir" => return Some("<data-dir>/providers/<id>/state".to_owned()),
        "provider-listen" => return Some("none: remote providers off".to_owned()),
        "provider-ca-cert" | "provider-ca-key" => {
            return Some("<data-dir>/provider-ca.pem, made with --provider-listen".to_owned());
        }
        _ => {}
    }
    const SECTIONS: [(&str, &str); 7] = [
        ("graphql-", "graphql"),
        ("api-", "api"),
        ("cluster-", "cluster"),
        ("login-", "login"),
        ("repo-", "repository"),
        ("provider-", "provider"),
        ("deploy-", "deploy"),
    ];
    let (table, key) = match SECTIONS
        .iter()
        .find_map(|(prefix, section)| Some((*section, long.strip_prefix(prefix)?)))
    {
        Some((section, rest)) => (defaults.get(section)?.as_table()?, rest),
        None => (defaults, long),
    };
    let shown = match table.get(&key.replace('-', "_"))? {
        toml::Value::String(text) => text.clone(),
        toml::Value::Array(items) if items.is_empty() => "none".to_owned(),
        toml::Value::Array(items) => items
            .iter()
            .map(|item| match item {
                toml::Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    Some(shown)
}

fn run(
    overrides: &Overrides,
    config_file: Option<&std::path::Path>,
    command: Command,
) -> anyhow::Result<()> {
    let config = Config::load(overrides, config_file)?;
    match command {
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
        Command::SecretKey {
            command: SecretKeyCommand::Id,
        } => {
            let file = config.secret_key_file();
            let key = crate::seal::SecretKey::load(&file.path)?;
            println!("{}", key.id());
            Ok(())
        }
        Command::SecretKey {
            command: SecretKeyCommand::Rotate { new_key_file },
        } => runtime()?.block_on(rotate_secret_key(config, new_key_file)),
        Command::Provider {
            command:
                ProviderCommand::Check {
                    source,
                    reference,
                    path,
                    keep,
                    settle_ms,
                },
        } => {
            let options = crate::provider::check::CheckOptions {
                source,
                reference,
                path,
                settings: config.provider.clone(),
                keep,
                settle: std::time::Duration::from_millis(settle_ms),
            };
            runtime()?.block_on(check_provider(options))
        }
        Command::Client(_) | Command::Completion { .. } => {
            unreachable!("`main` runs the client's commands and completion")
        }
    }
}

/// `corbel provider check`: progress on stderr, the table on stdout.
async fn check_provider(options: crate::provider::check::CheckOptions) -> anyhow::Result<()> {
    let report = crate::provider::check::run(options, |line| eprintln!("{line}")).await;
    print!("\n{}", report.table());
    if let Some(dir) = &report.kept {
        println!("kept {}", dir.display());
    }
    match report.failures() {
        0 => Ok(()),
        n => anyhow::bail!("{n} check(s) failed"),
    }
}

/// `corbel secret-key rotate`: under the server lock, every `secretConfig`
/// is sealed under the new key in one transaction ([`crate::provider::reseal`]),
/// and only then is the new key installed (an atomic rename) at the key file.
/// A crash before the commit changes nothing; one after it leaves the rows
/// under the new key and the old key file, and running the command again
/// keeps those rows and installs the key.
async fn rotate_secret_key(config: Config, new_key_file: PathBuf) -> anyhow::Result<()> {
    use crate::seal::SecretKey;
    crate::telemetry::init_logging(config.log_format, &config.log_filter);
    let file = config.secret_key_file();
    let location = config.database()?;
    let data_dir = std::path::absolute(&config.data_dir).context("resolving the data directory")?;
    if std::path::absolute(&new_key_file)? == std::path::absolute(&file.path)? {
        anyhow::bail!(
            "--new-key-file {} is the current key file: give the new key in another file",
            new_key_file.display()
        );
    }
    let lock = ServerLock::acquire(
        Some(&data_dir),
        &location,
        Holder::me("secret-key rotate", None),
    )
    .await?;
    let rotated = async {
        let new = if std::fs::symlink_metadata(&new_key_file).is_ok() {
            SecretKey::load(&new_key_file)?
        } else {
            let key = SecretKey::generate();
            key.write_new(&new_key_file)?;
            key
        };
        let current = file.load()?;
        let db = crate::store::connect(&location).await?;
        crate::store::migrate(&db).await?;
        let done = crate::provider::reseal(&db, &current, &new).await;
        // Repositories' credentials next: a crash between the two leaves the
        // providers under the new key, kept when this runs again.
        let repositories = match &done {
            Ok(_) => Some(crate::repository::reseal(&db, &current, &new).await),
            Err(_) => None,
        };
        db.close().await?;
        let done = done?;
        let repositories = repositories.expect("resealed after the providers")?;
        new.install(&file.path)?;
        anyhow::Ok((current, new, done, repositories))
    }
    .await;
    lock.release().await;
    let (current, new, done, repositories) = rotated?;
    println!(
        "Secret key {} installed at {} (was {}): {} secretConfig(s) sealed again, \
         {} sealed for the first time, {} already under the new key; {} repository \
         credential(s) sealed again, {} for the first time, {} already under it.\n\
         Back up {} now; {} is no longer needed.",
        new.id(),
        file.path.display(),
        current.id(),
        done.rotated,
        done.plain,
        done.kept,
        repositories.rotated,
        repositories.plain,
        repositories.kept,
        file.path.display(),
        new_key_file.display(),
    );
    Ok(())
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
    if config.cluster.enabled {
        return serve_replica(config, shutdown).await;
    }
    let app = App::build(&config).await?;
    app.show_new_admin_token();
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

/// `serve --cluster`: a standby until this replica leads, then the server.
async fn serve_replica(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let stopping = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping.cancel();
    });
    let database = config.database()?.redacted();
    let data_dir = config.data_dir.display().to_string();
    let ran = crate::standby::serve(&config, stop, |addr, leading| {
        tracing::info!(
            url = %format!("http://{addr}"),
            database = %database,
            data_dir = %data_dir,
            role = if leading { "leader" } else { "standby" },
            "corbel {} listening on http://{addr} as a replica",
            crate::VERSION,
        );
    })
    .await;
    if let Err(e) = &ran
        && e.is::<crate::standby::LostLeadership>()
    {
        tracing::error!(error = %e, "stopping");
        // Nothing of the lost leader's may go on: no drain, no more writes.
        std::process::exit(75);
    }
    ran
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_flag_shows_its_default() {
        let command = command();
        command.clone().debug_assert();
        let mut checked = 0;
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["config", "help", "version"].contains(&long) {
                continue;
            }
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            assert!(help.contains("[default: "), "--{long}: {help}");
            checked += 1;
        }
        assert!(checked > 40, "{checked} flags");
        let help = |long: &str| {
            command
                .get_arguments()
                .find(|a| a.get_long() == Some(long))
                .and_then(|a| a.get_help())
                .map(ToString::to_string)
                .unwrap()
        };
        assert!(help("listen").ends_with("[default: 127.0.0.1:8080]"));
        assert!(help("provider-call-timeout-ms").ends_with("[default: 30000]"));
        assert!(help("provider-git-schemes").ends_with("[default: https,http,git,ssh,file]"));
        assert!(help("log-format").ends_with("[default: pretty]"));
    }
}
