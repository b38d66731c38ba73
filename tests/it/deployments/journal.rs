//! The engine's group commit (`store::deployments::commit_group`) on the real
//! database: a group of writes leaves what writing them one after the other
//! leaves, whatever their mix, and a group that cannot be written leaves
//! nothing.

use corbel::store::deployments::{self as rows, CallStart, GroupWrite, NewEvent, NodeChange};
use corbel::store::states::{DeploymentState, NodeState};
use uuid::Uuid;

use corbel::store::direct::Direct;

use crate::support::TestStore;

fn event(message: &str) -> NewEvent {
    NewEvent {
        kind: "LOG".into(),
        node_key: None,
        state: None,
        message: message.into(),
    }
}

fn begin(deployment: Uuid, node: Uuid, provider: Uuid, message: &str) -> (Uuid, GroupWrite) {
    let entry = Uuid::now_v7();
    let call = CallStart {
        entry,
        deployment_id: deployment,
        node_id: node,
        provider_id: provider,
        intent: "DEPLOY".into(),
        change: Some(NodeChange {
            config: Some(format!("{{\"for\":\"{message}\"}}")),
            run_id: Some(Some(Uuid::now_v7())),
            ..NodeChange::to(NodeState::InProgress)
        }),
    };
    (
        entry,
        GroupWrite::Begin {
            call,
            event: Some(event(message)),
        },
    )
}

/// A call's entry written ahead of its call: the node unchanged.
fn ahead(deployment: Uuid, node: Uuid, provider: Uuid) -> (Uuid, GroupWrite) {
    let (entry, write) = begin(deployment, node, provider, "unused");
    let GroupWrite::Begin { mut call, .. } = write else {
        unreachable!("begin writes a Begin")
    };
    call.change = None;
    (entry, GroupWrite::Begin { call, event: None })
}

/// Commits a group through the pool, or through the engine writer's own
/// SQLite connection.
async fn commit(
    db: &corbel::store::Db,
    direct: &mut Option<Direct>,
    writes: &[&GroupWrite],
) -> Result<Vec<Option<rows::EventRow>>, corbel::store::DbErr> {
    match direct {
        Some(direct) => direct.commit_group(writes),
        None => rows::commit_group(db, writes, None).await,
    }
}

#[tokio::test]
async fn a_group_of_writes_leaves_what_writing_them_in_order_leaves() {
    a_group_leaves_what_its_writes_in_order_leave(false).await;
}

/// The same on SQLite through the connection the engine's writer owns
/// (`store::direct`): its rows read back through the pool as the pool's own.
#[tokio::test]
async fn a_group_through_the_writers_own_sqlite_connection_leaves_the_same() {
    a_group_leaves_what_its_writes_in_order_leave(true).await;
}

async fn a_group_leaves_what_its_writes_in_order_leave(through_direct: bool) {
    let store = TestStore::fresh().await;
    let db = corbel::store::connect(&store.config().database().unwrap())
        .await
        .unwrap();
    corbel::store::migrate(&db).await.unwrap();
    let mut direct = if through_direct {
        match Direct::open(&db) {
            Some(opened) => Some(opened.unwrap()),
            // PostgreSQL: the writer runs on the pool; the other test covers it.
            None => {
                assert!(store.is_postgres());
                return;
            }
        }
    } else {
        None
    };
    let project = corbel::store::projects::ensure_project(&db, "default")
        .await
        .unwrap();
    let deployment = rows::insert_deployment(
        &db,
        rows::NewDeployment {
            project_id: project,
            name: "group".into(),
            blueprint_id: None,
            element_id: None,
            source: "resources: {}".into(),
            variables: "{}".into(),
            on_failure: "ROLLBACK".into(),
            expires_at: None,
            created_by: None,
        },
        DeploymentState::InProgress,
        "DEPLOY",
    )
    .await
    .unwrap()
    .id;
    let new_node = |key: &str| rows::NewNode {
        key: key.into(),
        replica: 0,
        resource_type: "fixture.v1.noop".into(),
        provider_id: None,
        node: None,
        quota: None,
    };
    rows::insert_nodes(
        &db,
        deployment,
        vec![new_node("a"), new_node("b"), new_node("c")],
        NodeState::ToDeploy,
        DeploymentState::InProgress,
    )
    .await
    .unwrap();
    let nodes = rows::nodes_of(&db, deployment).await.unwrap();
    let id = |key: &str| nodes.iter().find(|n| n.key == key).unwrap().id;
    let (a, b, c) = (id("a"), id("b"), id("c"));
    let provider = Uuid::new_v4();

    // First group: a's and b's calls begin.
    let (a1, begin_a) = begin(deployment, a, provider, "a begins");
    let (b1, begin_b) = begin(deployment, b, provider, "b begins");
    commit(&db, &mut direct, &[&begin_a, &begin_b])
        .await
        .unwrap();
    let mut journal = rows::journal_of(&db, deployment).await.unwrap();
    journal.sort_by_key(|e| e.node_id);
    let mut expected = vec![(a1, a), (b1, b)];
    expected.sort_by_key(|(_, node)| *node);
    assert_eq!(
        journal
            .iter()
            .map(|e| (e.id, e.node_id))
            .collect::<Vec<_>>(),
        expected
    );

    // Second group, in this order: a log line; a's call ends (outputs set,
    // the error cleared); c's call begins twice (the second supersedes the
    // first in the same group); b's call begins again (superseding b1), its
    // entry written ahead of the call, and then its node changes as the call
    // starts; a's call begins again and ends, its run cleared.
    let finish_a = GroupWrite::Finish {
        deployment,
        node: a,
        entry: a1,
        change: NodeChange {
            outputs: Some(Some("{\"pid\":1}".into())),
            error: Some(None),
            ..NodeChange::to(NodeState::Complete)
        },
        event: Some(event("a deployed")),
    };
    let (_, begin_c) = begin(deployment, c, provider, "c begins");
    let (c2, begin_c_again) = begin(deployment, c, provider, "c begins again");
    let (b2, begin_b_again) = ahead(deployment, b, provider);
    let start_b = GroupWrite::Node {
        deployment,
        node: b,
        change: NodeChange {
            config: Some("{\"for\":\"b starts\"}".into()),
            ..NodeChange::to(NodeState::InProgress)
        },
        event: event("b starts"),
    };
    let (a2, begin_a_again) = begin(deployment, a, provider, "a begins again");
    let finish_a_again = GroupWrite::Finish {
        deployment,
        node: a,
        entry: a2,
        change: NodeChange {
            error: Some(Some("gone".into())),
            run_id: Some(None),
            ..NodeChange::to(NodeState::Failed)
        },
        event: None,
    };
    let log = GroupWrite::Event {
        deployment,
        event: event("a log line"),
    };
    let group = [
        &log,
        &finish_a,
        &begin_c,
        &begin_c_again,
        &begin_b_again,
        &start_b,
        &begin_a_again,
        &finish_a_again,
    ];
    let stored = commit(&db, &mut direct, &group).await.unwrap();

    // One event per write that has one, numbered in the group's order.
    let messages: Vec<Option<String>> = stored
        .iter()
        .map(|e| e.as_ref().map(|e| e.message.clone()))
        .collect();
    assert_eq!(
        messages,
        [
            Some("a log line"),
            Some("a deployed"),
            Some("c begins"),
            Some("c begins again"),
            None,
            Some("b starts"),
            Some("a begins again"),
            None,
        ]
        .map(|m| m.map(str::to_owned))
    );
    let ids: Vec<i64> = stored.iter().flatten().map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in order: {ids:?}");
    let history = rows::events_of(&db, deployment, 0, 100).await.unwrap();
    // What the commit answered is what the pool reads back, field by field
    // (the time included, to the nanosecond).
    for event in stored.iter().flatten() {
        let read = history.iter().find(|e| e.id == event.id).expect("stored");
        assert_eq!(read, event);
    }
    assert_eq!(
        history
            .iter()
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>(),
        [
            "a begins",
            "b begins",
            "a log line",
            "a deployed",
            "c begins",
            "c begins again",
            "b starts",
            "a begins again",
        ]
    );

    // The journal: b's and c's latest entries; a's ended.
    let mut journal = rows::journal_of(&db, deployment).await.unwrap();
    journal.sort_by_key(|e| e.node_id);
    let mut expected = vec![(b2, b), (c2, c)];
    expected.sort_by_key(|(_, node)| *node);
    assert_eq!(
        journal
            .iter()
            .map(|e| (e.id, e.node_id))
            .collect::<Vec<_>>(),
        expected
    );

    // Each node as its changes in order leave it.
    let nodes = rows::nodes_of(&db, deployment).await.unwrap();
    let node = |id: Uuid| nodes.iter().find(|n| n.id == id).unwrap();
    assert_eq!(node(a).state, NodeState::Failed);
    assert_eq!(node(a).outputs.as_deref(), Some("{\"pid\":1}"));
    assert_eq!(node(a).error.as_deref(), Some("gone"));
    assert_eq!(node(a).run_id, None);
    assert_eq!(
        node(a).config.as_deref(),
        Some("{\"for\":\"a begins again\"}")
    );
    assert_eq!(node(b).state, NodeState::InProgress);
    assert_eq!(node(b).config.as_deref(), Some("{\"for\":\"b starts\"}"));
    assert_eq!(node(b).outputs, None);
    assert!(node(b).run_id.is_some());
    assert_eq!(
        node(c).config.as_deref(),
        Some("{\"for\":\"c begins again\"}")
    );

    // A group with a write that cannot be stored (an event of a deployment
    // that does not exist) leaves nothing of the others.
    let before = rows::events_of(&db, deployment, 0, 100)
        .await
        .unwrap()
        .len();
    let finish_b = GroupWrite::Finish {
        deployment,
        node: b,
        entry: b2,
        change: NodeChange::to(NodeState::Complete),
        event: Some(event("b deployed")),
    };
    let orphan = GroupWrite::Event {
        deployment: Uuid::new_v4(),
        event: event("nobody's"),
    };
    assert!(
        commit(&db, &mut direct, &[&finish_b, &orphan])
            .await
            .is_err()
    );
    assert_eq!(
        rows::events_of(&db, deployment, 0, 100)
            .await
            .unwrap()
            .len(),
        before
    );
    assert_eq!(
        rows::find_node(&db, b).await.unwrap().unwrap().state,
        NodeState::InProgress
    );
    assert_eq!(rows::journal_of(&db, deployment).await.unwrap().len(), 2);
}
