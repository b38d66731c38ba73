//! `corbel-provider-process`: started by Corbel, which sets the environment.

use std::process::ExitCode;

use corbel_provider_process::ProcessProvider;

#[tokio::main]
async fn main() -> ExitCode {
    let provider = ProcessProvider::from_env();
    // Held until exit: a previous instance may still be finishing a call.
    let _only_instance = match provider.lock_state_dir().await {
        Ok(lock) => lock,
        Err(error) => {
            eprintln!("process: {error}");
            return ExitCode::FAILURE;
        }
    };
    corbel_provider_sdk::serve(provider).await
}
