//! A provider killed at each point of a start, simulated by running the start's
//! steps up to that point: a fresh provider on the same state directory finds
//! what was started, starts nothing twice, and destroys it all.

use std::path::Path;

use corbel_provider_process::RESOURCE_TYPE;
use corbel_provider_process::config::ServiceConfig;
use corbel_provider_process::lifecycle;
use corbel_provider_process::state::{Phase, StateDir};
use corbel_provider_sdk::proto;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{messages, outcome};

use super::{cleanup, host_in, pid_of, resource, running, tagged};

fn sleeper(key: &str) -> (proto::Resource, ServiceConfig) {
    let config = json!({ "command": "sleep", "args": ["30"], "port": true });
    let service = ServiceConfig::parse(&config.to_string()).unwrap();
    (resource(RESOURCE_TYPE, key, config), service)
}

fn phase(state: &Path, resource: &proto::Resource) -> Option<Phase> {
    StateDir::new(state)
        .read(&resource.resource_id)
        .unwrap()
        .map(|r| r.phase)
}

#[tokio::test]
async fn after_spawn_the_process_is_found_adopted_and_destroyed() {
    let dir = tempfile::tempdir().unwrap();
    let (svc, service) = sleeper("adopted");
    let _cleanup = cleanup(&svc);
    let state = StateDir::new(dir.path());
    let intent = lifecycle::record_intent(&state, &svc.resource_id, &service)
        .await
        .unwrap();
    let spawned = lifecycle::spawn_tagged(&intent, &service, &[]).unwrap();
    let pid = spawned.pid;
    let port = intent.port.expect("a chosen port");
    // The provider dies here: its running record is never written.
    drop((spawned, intent, state));
    assert_eq!(phase(dir.path(), &svc), Some(Phase::Intent));

    let host = host_in(dir.path()).await;
    let inspected = host.inspect(svc.clone()).await.unwrap();
    assert!(inspected.present);
    let expected = json!({ "pid": pid, "port": port });
    assert_eq!(
        serde_json::from_str::<Value>(&inspected.outputs_json).unwrap(),
        expected
    );
    assert_eq!(
        phase(dir.path(), &svc),
        Some(Phase::Intent),
        "inspect changes nothing"
    );

    let events = host.deploy(svc.clone()).await.unwrap();
    assert_eq!(outcome(&events).unwrap(), expected, "{events:?}");
    assert!(
        messages(&events).iter().any(|m| m.contains("adopting")),
        "{events:?}"
    );
    assert_eq!(tagged(&svc), [pid], "no second process");
    assert!(matches!(
        phase(dir.path(), &svc),
        Some(Phase::Running(running)) if running.pid == pid
    ));
    // And again: the running record answers.
    assert_eq!(
        outcome(&host.deploy(svc.clone()).await.unwrap()).unwrap(),
        expected
    );
    assert_eq!(tagged(&svc), [pid]);

    outcome(&host.destroy(svc.clone(), expected).await.unwrap()).unwrap();
    assert!(!running(pid));
    assert!(tagged(&svc).is_empty());
    assert_eq!(phase(dir.path(), &svc), None);
    assert!(!host.inspect(svc).await.unwrap().present);
}

#[tokio::test]
async fn after_spawn_a_destroy_stops_the_unrecorded_process() {
    let dir = tempfile::tempdir().unwrap();
    let (svc, service) = sleeper("orphan");
    let _cleanup = cleanup(&svc);
    let state = StateDir::new(dir.path());
    let intent = lifecycle::record_intent(&state, &svc.resource_id, &service)
        .await
        .unwrap();
    let pid = lifecycle::spawn_tagged(&intent, &service, &[]).unwrap().pid;

    let host = host_in(dir.path()).await;
    // Corbel never saw outputs: it destroys with none.
    let events = host.destroy(svc.clone(), json!({})).await.unwrap();
    outcome(&events).unwrap();
    assert!(!running(pid), "{events:?}");
    assert!(tagged(&svc).is_empty());
    assert_eq!(phase(dir.path(), &svc), None);
}

#[tokio::test]
async fn after_the_intent_nothing_runs_and_a_deploy_starts_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let (svc, service) = sleeper("intended");
    let _cleanup = cleanup(&svc);
    let state = StateDir::new(dir.path());
    lifecycle::record_intent(&state, &svc.resource_id, &service)
        .await
        .unwrap();
    // The provider dies here, before spawning.

    let host = host_in(dir.path()).await;
    assert!(!host.inspect(svc.clone()).await.unwrap().present);
    assert!(tagged(&svc).is_empty());
    let outputs = outcome(&host.deploy(svc.clone()).await.unwrap()).unwrap();
    let pid = pid_of(&outputs);
    assert_eq!(tagged(&svc), [pid], "exactly one process");
    assert!(host.inspect(svc.clone()).await.unwrap().present);

    outcome(&host.destroy(svc.clone(), outputs).await.unwrap()).unwrap();
    assert!(!running(pid));
    assert!(tagged(&svc).is_empty());
    assert_eq!(phase(dir.path(), &svc), None);
}

#[tokio::test]
async fn after_the_intent_a_destroy_removes_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let (svc, service) = sleeper("abandoned");
    let state = StateDir::new(dir.path());
    lifecycle::record_intent(&state, &svc.resource_id, &service)
        .await
        .unwrap();

    let host = host_in(dir.path()).await;
    outcome(&host.destroy(svc.clone(), json!({})).await.unwrap()).unwrap();
    assert_eq!(phase(dir.path(), &svc), None);
    assert!(!host.inspect(svc).await.unwrap().present);
}
