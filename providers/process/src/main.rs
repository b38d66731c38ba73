//! `corbel-provider-process`: started by Corbel, which sets the environment.

use std::process::ExitCode;

use corbel_provider_process::ProcessProvider;

#[tokio::main]
async fn main() -> ExitCode {
    corbel_provider_sdk::serve(ProcessProvider::from_env()).await
}
