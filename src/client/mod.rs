//! The command line client: `corbel login`, `deploy`, `get`, `logs`,
//! `events`, `destroy`… speaking the GraphQL API the web console speaks,
//! over HTTP and the `graphql-transport-ws` websocket, with nothing of the
//! server's own types: it imports no area of this crate.
//!
//! The map: `api.rs` (GraphQL over HTTP), `ws.rs` (subscriptions),
//! `credentials.rs` (what `login` stores), `error.rs` (errors and their exit
//! codes), `output.rs` (text and JSON), `resolve.rs` (names to objects),
//! `follow.rs` (a run followed to its end); one file per command group
//! (`login.rs`, `deploy.rs`, `plan.rs`, `get.rs`, `logs.rs`). A new command is a variant
//! of [`ClientCommand`], its function in a file of its own, and an arm in
//! [`run`].

mod api;
mod cp;
mod credentials;
mod deploy;
mod error;
mod exec;
mod follow;
mod get;
mod login;
mod logs;
mod output;
mod plan;
mod resolve;
mod watch;
mod ws;

use std::process::ExitCode;

pub use self::api::Api;
pub use self::error::{ClientError, exit};
pub use self::output::{Format, Output};
pub use self::ws::Subscription;

/// Where the client goes when neither a flag, `CORBEL_URL` nor a login says.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// The client's exit codes, as `corbel --help` shows them.
pub const EXIT_CODES: &str = "\
Exit codes of the client commands (login, logout, deploy, plan, apply, rollback, revisions, destroy, get, logs, events):
  0  success
  1  the operation ran and failed (a deployment ended FAILED)
  2  usage error (a bad flag; a name several live deployments share)
  3  not signed in, or the token is not valid or not allowed (UNAUTHENTICATED, FORBIDDEN)
  4  not found (an unknown name or id)
  5  conflict (CONFLICT, ALREADY_INSTALLED, HAS_DEPENDENTS; a live deployment of that name)
  6  the server cannot be reached, or did not answer as a Corbel server
  7  any other error (the API's code is printed with its message)
130  interrupted while waiting (the run goes on on the server)";

/// The flags every client command takes.
#[derive(Debug, Default, clap::Args)]
pub struct ClientArgs {
    /// The server's URL, for the client commands.
    #[arg(long, env = "CORBEL_URL", global = true, value_name = "URL")]
    pub server: Option<String>,
    /// An API token, for the client commands.
    #[arg(long, env = "CORBEL_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// How the client commands show results: `json` prints only JSON on
    /// stdout, and errors as JSON on stderr; `yaml` the same as YAML.
    #[arg(short = 'o', long, global = true, value_enum)]
    pub output: Option<Format>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Sign in to a server and keep an API token for the other commands in
    /// $XDG_CONFIG_HOME/corbel/credentials.toml (mode 0600).
    Login {
        /// The user name (asked on the terminal when not given).
        #[arg(long)]
        user: Option<String>,
        /// Read the password from stdin instead of asking on the terminal.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Revoke the stored token and remove the credentials.
    Logout,
    /// Store a blueprint from a file (made or updated) and deploy it.
    Deploy(deploy::DeployArgs),
    /// Destroy a deployment (dependents first).
    Destroy(deploy::DestroyArgs),
    /// Plan a change to a deployment (a blueprint file, variables) and show
    /// it as a diff; nothing runs.
    Plan(plan::PlanArgs),
    /// Apply a plan (refused when the deployment moved since it was made).
    Apply(plan::ApplyArgs),
    /// Plan and apply a deployment back to an earlier revision.
    Rollback(plan::RollbackArgs),
    /// A deployment's revisions: every deploy and apply, who, when, outcome.
    Revisions(plan::RevisionsArgs),
    /// List deployments, providers or repositories, or show one.
    Get {
        /// Then print each item again whenever it changes, until Ctrl-C
        /// (not for replicas).
        #[arg(short = 'w', long, global = true)]
        watch: bool,
        #[command(subcommand)]
        what: get::GetCommand,
    },
    /// A provider's output.
    Logs {
        #[command(subcommand)]
        what: logs::LogsCommand,
    },
    /// A deployment's events.
    Events {
        #[command(subcommand)]
        what: logs::EventsCommand,
    },
    /// Run a command in a deployed resource (`corbel exec web-1 db -- ls
    /// /`); the exit status is the command's.
    Exec(exec::ExecArgs),
    /// Copy files into or out of a deployed resource (`corbel cp ./site
    /// web-1:web:/srv`, `corbel cp web-1:db:data ./backup`).
    Cp(cp::CpArgs),
}

/// What a command runs with: the API at the chosen server, with the chosen
/// token, and how to show results.
pub struct Context {
    pub api: Api,
    pub output: Output,
    /// What `corbel login` stored, if anything.
    pub stored: Option<credentials::Credentials>,
}

impl Context {
    /// The server is the flag's, else `CORBEL_URL`, else the stored one,
    /// else [`DEFAULT_SERVER`]; the token the flag's, else `CORBEL_TOKEN`,
    /// else the stored one, only if it was stored for that same server.
    pub fn new(args: ClientArgs) -> Result<Context, ClientError> {
        let output = Output {
            format: args.output.unwrap_or_default(),
        };
        let stored = credentials::load()?;
        let server = args
            .server
            .or_else(|| stored.as_ref().map(|c| c.server.clone()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_owned());
        let server = server.trim_end_matches('/').to_owned();
        let token = args.token.or_else(|| {
            stored
                .as_ref()
                .filter(|c| c.server == server)
                .map(|c| c.token.clone())
        });
        Ok(Context {
            api: Api::new(&server, token)?,
            output,
            stored,
        })
    }

    /// The API, once there is a token to send. Without one, the server is
    /// asked first: one that cannot be reached says so (exit 6), not that
    /// nobody signed in.
    pub async fn signed_in(&self) -> Result<&Api, ClientError> {
        if self.api.token().is_some() {
            return Ok(&self.api);
        }
        if let Err(unreachable @ ClientError::Transport(_)) = self
            .api
            .request("{ __typename }", serde_json::Value::Null)
            .await
        {
            return Err(unreachable);
        }
        Err(ClientError::NotSignedIn(format!(
            "not signed in to {}: run `corbel login`, or give --token or CORBEL_TOKEN",
            self.api.server
        )))
    }
}

/// Runs a client command; errors are printed here (text or JSON) and
/// become the exit code.
pub fn run(args: ClientArgs, command: ClientCommand) -> ExitCode {
    let output = Output {
        format: args.output.unwrap_or_default(),
    };
    let ran = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClientError::Local(format!("starting the async runtime: {e}")))
        .and_then(|runtime| {
            runtime.block_on(async {
                let context = Context::new(args)?;
                dispatch(&context, command).await
            })
        });
    match ran {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            output.error(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs `command`; answers the exit status (0, or an exec's command's).
async fn dispatch(context: &Context, command: ClientCommand) -> Result<u8, ClientError> {
    match command {
        ClientCommand::Login {
            user,
            password_stdin,
        } => login::login(context, user, password_stdin).await,
        ClientCommand::Logout => login::logout(context).await,
        ClientCommand::Deploy(args) => deploy::deploy(context, args).await,
        ClientCommand::Destroy(args) => deploy::destroy(context, args).await,
        ClientCommand::Plan(args) => plan::plan(context, args).await,
        ClientCommand::Apply(args) => plan::apply(context, args).await,
        ClientCommand::Rollback(args) => plan::rollback(context, args).await,
        ClientCommand::Revisions(args) => plan::revisions(context, args).await,
        ClientCommand::Get { what, watch } => {
            let shown = get::get(context, &what, watch).await?;
            if watch {
                watch::follow(context, &what, &shown).await?;
            }
            Ok(())
        }
        ClientCommand::Logs { what } => logs::logs(context, what).await,
        ClientCommand::Events { what } => logs::events(context, what).await,
        ClientCommand::Exec(args) => return exec::exec(context, args).await,
        ClientCommand::Cp(args) => cp::cp(context, args).await,
    }
    .map(|()| 0)
}

/// An error with its causes, `: `-separated (reqwest's and tungstenite's
/// top-level messages leave out why).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let shown = cause.to_string();
        if !text.contains(&shown) {
            text.push_str(": ");
            text.push_str(&shown);
        }
        source = cause.source();
    }
    text
}
