//! `corbel exec`: the command's output where it belongs and its exit status
//! as the CLI's, stdin with `-i`.

use super::Cli;
use crate::exec::deployed_app;

#[tokio::test]
async fn exec_prints_the_commands_output_and_exits_with_its_status() {
    let cwd = tempfile::tempdir().unwrap();
    let (app, _, _) = deployed_app(cwd.path()).await;
    let cli = Cli::admin(format!("http://{}", app.addr));

    let ran = cli
        .run(&[
            "exec",
            "shell-1",
            "app",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ])
        .await;
    assert_eq!(ran.code, 7, "{ran:?}");
    assert_eq!(ran.stdout, "out\n");
    assert_eq!(ran.stderr, "err\n");

    let ran = cli
        .run_with_stdin(&["exec", "-i", "shell-1", "app", "--", "cat"], "piped in")
        .await;
    assert_eq!((ran.code, ran.stdout.as_str()), (0, "piped in"), "{ran:?}");

    let ran = cli
        .run(&[
            "exec",
            "--timeout",
            "1",
            "shell-1",
            "app",
            "--",
            "sleep",
            "60",
        ])
        .await;
    assert_eq!(
        ran.code,
        128 + 9,
        "killed by SIGKILL, as a shell says: {ran:?}"
    );

    let ran = cli.run(&["exec", "shell-1", "nothing", "--", "true"]).await;
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("nothing"), "{ran:?}");
}
