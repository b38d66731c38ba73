//! `corbel-provider-process`: started by Corbel, which sets the environment.
//! `run` takes Corbel's variables out of the environment before any thread
//! starts, so no service inherits them.

use std::process::ExitCode;

use corbel_provider_process::ProcessProvider;

fn main() -> ExitCode {
    corbel_provider_sdk::run(|env| async move {
        let provider = ProcessProvider::new(env.state_dir());
        // Held until exit: a previous instance may still be finishing a call.
        let _only_instance = match provider.lock_state_dir().await {
            Ok(lock) => lock,
            Err(error) => {
                eprintln!("process: {error}");
                return ExitCode::FAILURE;
            }
        };
        let code = corbel_provider_sdk::serve_env(env, provider).await;
        // Exit now: the runtime would wait for blocking work that never ends
        // (the log follower, waits on services), holding the state dir's lock
        // from the next instance. The OS releases the lock with the process.
        // The code is kept: 2 says the environment was incomplete.
        let code = if code == ExitCode::SUCCESS {
            0
        } else if code == ExitCode::from(2) {
            2
        } else {
            1
        };
        std::process::exit(code)
    })
}
