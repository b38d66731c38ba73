//! `corbel-provider-docker`: started by Corbel, which sets the environment.
//! `run` takes Corbel's variables out of the environment before any thread
//! starts.

use std::process::ExitCode;

use corbel_provider_docker::DockerProvider;
use corbel_provider_sdk::records::StateLock;

fn main() -> ExitCode {
    corbel_provider_sdk::run(|env| async move {
        // The provider keeps no state of its own (labels on the engine are its
        // state), but two instances at once (an old one finishing its calls
        // after Corbel went away, and its successor) could still race on one
        // resource: the state directory's lock keeps them apart.
        let _only_instance = match env.state_dir() {
            Some(dir) => {
                let acquired = tokio::task::spawn_blocking(move || {
                    if let Some(lock) = StateLock::try_acquire(&dir)? {
                        return Ok(lock);
                    }
                    eprintln!(
                        "docker: another instance holds {}; waiting for it to exit",
                        StateLock::path(&dir).display()
                    );
                    StateLock::acquire(&dir)
                })
                .await;
                match acquired {
                    Ok(Ok(lock)) => Some(lock),
                    Ok(Err(error)) => {
                        eprintln!("docker: {error}");
                        return ExitCode::FAILURE;
                    }
                    Err(error) => {
                        eprintln!("docker: {error}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            None => None,
        };
        corbel_provider_sdk::serve_env(env, DockerProvider::new()).await
    })
}
