//! `process.v1.job` through the test host: a job runs to its end once (a
//! repeated deploy answers the recorded result), a failing one is run again
//! `retries` times and fails with its last lines, one past its timeout is
//! killed with what it started, and destroy removes what it left.

use corbel_provider_process::job::JOB_TYPE;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::outcome;

use super::{cleanup, host_in, resource, tagged};

fn runs(dir: &std::path::Path) -> usize {
    std::fs::read_to_string(dir.join("runs"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_job_runs_to_its_end_once_and_destroy_removes_what_it_left() {
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let job = resource(
        JOB_TYPE,
        "migrate",
        json!({ "command": "sh", "args": ["-c", "echo run >> runs; echo one; echo two >&2"],
                "cwd": work.path() }),
    );
    let _cleanup = cleanup(&job);

    let outputs = outcome(&host.deploy(job.clone()).await.unwrap()).unwrap();
    assert_eq!(outputs["exitStatus"], 0, "{outputs}");
    assert_eq!(outputs["output"], "one\ntwo", "{outputs}");
    assert!(outputs["durationMs"].as_u64().is_some(), "{outputs}");
    assert_eq!(runs(work.path()), 1);

    // A repeated deploy (a replayed journal) answers the result, runs nothing.
    let again = outcome(&host.deploy(job.clone()).await.unwrap()).unwrap();
    assert_eq!(again, outputs);
    assert_eq!(runs(work.path()), 1, "run once");
    let inspected = host.inspect(job.clone()).await.unwrap();
    assert!(inspected.present, "{inspected:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&inspected.outputs_json).unwrap(),
        outputs
    );

    outcome(&host.destroy(job.clone(), outputs).await.unwrap()).unwrap();
    for dir in ["resources", "logs", "jobs"] {
        let left: Vec<_> = std::fs::read_dir(state.path().join(dir))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{dir}: {left:?}");
    }
    assert!(!host.inspect(job.clone()).await.unwrap().present);
    // Deployed again after its destroy, it runs again.
    outcome(&host.deploy(job.clone()).await.unwrap()).unwrap();
    assert_eq!(runs(work.path()), 2);
}

#[tokio::test]
async fn a_failing_job_runs_retries_more_times_then_fails_with_its_last_lines() {
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let script = "echo run >> runs; for i in $(seq 30); do echo line $i; done; \
                  echo \"run $(wc -l < runs) failed\"; exit 3";
    let job = resource(
        JOB_TYPE,
        "seed",
        json!({ "command": "sh", "args": ["-c", script], "cwd": work.path(), "retries": 2 }),
    );
    let _cleanup = cleanup(&job);

    let failure = outcome(&host.deploy(job.clone()).await.unwrap()).unwrap_err();
    let message = failure.message;
    assert!(
        message.contains("exited with status 3 (run 3 of 3)"),
        "{message}"
    );
    assert!(message.ends_with("line 30\nrun 3 failed"), "{message}");
    assert!(
        !message.contains("line 10\n"),
        "the last 20 lines only: {message}"
    );
    assert_eq!(runs(work.path()), 3, "the first run and 2 retries");

    let again = outcome(&host.deploy(job.clone()).await.unwrap()).unwrap_err();
    assert_eq!(again.message, message, "answered again, not run again");
    assert_eq!(runs(work.path()), 3);
    assert!(!host.inspect(job).await.unwrap().present);
}

#[tokio::test]
async fn a_job_past_its_timeout_is_killed_with_what_it_started() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let job = resource(
        JOB_TYPE,
        "hangs",
        json!({ "command": "sh", "args": ["-c", "setsid sleep 60 & echo started; wait"],
                "timeout_seconds": 1 }),
    );
    let _cleanup = cleanup(&job);
    let started = std::time::Instant::now();
    let failure = outcome(&host.deploy(job.clone()).await.unwrap()).unwrap_err();
    assert!(
        failure.message.contains("timed out after 1 s"),
        "{}",
        failure.message
    );
    assert!(failure.message.ends_with("started"), "{}", failure.message);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(tagged(&job).is_empty(), "{:?}", tagged(&job));
}
