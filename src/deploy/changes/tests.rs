use super::*;
use serde_json::json;

fn bp(yaml: &str) -> Blueprint {
    blueprint::parse(yaml).expect("a valid blueprint")
}

fn node(key: &str, replica: i32, config: Value, outputs: Value) -> NodeView {
    NodeView {
        id: Uuid::new_v4(),
        key: key.into(),
        replica,
        generation: 0,
        resource_type: "t.v1.x".into(),
        provider_id: Some(Uuid::nil()),
        node: Some("n1".into()),
        deployed: true,
        state: NodeState::Complete,
        config: Some(config),
        outputs: Some(outputs),
    }
}

fn caps(keys: &[&str], updatable: Option<&[&str]>) -> BTreeMap<String, Capability> {
    keys.iter()
        .map(|k| {
            (
                k.to_string(),
                Capability {
                    provider_id: Uuid::nil(),
                    provider_name: "p".into(),
                    updatable: updatable.map(|u| u.iter().map(|s| s.to_string()).collect()),
                    destroy_first: false,
                },
            )
        })
        .collect()
}

fn actions(draft: &Draft) -> Vec<(String, i32, String)> {
    draft
        .changes
        .iter()
        .map(|c| (c.key.clone(), c.replica, c.action.clone()))
        .collect()
}

const OLD: &str = r#"
version: "1"
variables:
  label: {type: string, default: a}
  port: {type: int, default: 1}
  n: {type: int, default: 1}
resources:
  db:
    type: t.v1.x
    config: {label: "{{ label }}", port: "{{ port }}"}
  web:
    type: t.v1.x
    depends_on: [db]
    replicas: "{{ n }}"
    config: {upstream: "{{ resources.db.outputs.addr }}", name: web}
"#;

fn running() -> Vec<NodeView> {
    vec![
        node(
            "db",
            0,
            json!({"label": "a", "port": 1}),
            json!({"addr": "db:1"}),
        ),
        node(
            "web",
            0,
            json!({"upstream": "db:1", "name": "web"}),
            json!({}),
        ),
    ]
}

fn vars(pairs: Value) -> BTreeMap<String, Value> {
    let bp = bp(OLD);
    blueprint::bind(&bp, pairs.as_object().unwrap()).unwrap()
}

#[test]
fn nothing_changed_keeps_everything() {
    let (old, nodes) = (bp(OLD), running());
    let variables = vars(json!({}));
    let capabilities = caps(&["db", "web"], Some(&["label"]));
    let draft = compute(&Input {
        old: &old,
        new: &old,
        variables: &variables,
        nodes: &nodes,
        capabilities: &capabilities,
    })
    .unwrap();
    assert_eq!(
        actions(&draft),
        vec![
            ("db".into(), 0, "KEEP".into()),
            ("web".into(), 0, "KEEP".into())
        ]
    );
}

#[test]
fn an_updatable_key_updates_and_ripples_to_what_reads_its_outputs() {
    let (old, nodes) = (bp(OLD), running());
    let variables = vars(json!({"label": "b"}));
    let capabilities = caps(&["db", "web"], Some(&["label"]));
    let draft = compute(&Input {
        old: &old,
        new: &old,
        variables: &variables,
        nodes: &nodes,
        capabilities: &capabilities,
    })
    .unwrap();
    assert_eq!(
        actions(&draft),
        vec![
            ("db".into(), 0, "UPDATE".into()),
            ("web".into(), 0, "REPLACE".into())
        ]
    );
    let db = &draft.changes[0];
    assert_eq!(db.config.len(), 1);
    assert_eq!(db.config[0].before, Some(json!("a")));
    assert_eq!(db.config[0].after, Some(json!("b")));
    let web = &draft.changes[1];
    assert_eq!(web.ripples_from, vec!["db".to_owned()]);
    assert!(!web.config[0].known);
    assert!(web.reason.as_deref().unwrap().contains("`upstream`"));
}

#[test]
fn a_provider_that_cannot_hold_both_gets_its_replacements_destroyed_first() {
    let (old, nodes) = (bp(OLD), running());
    let variables = vars(json!({"port": 2}));
    let mut capabilities = caps(&["db", "web"], Some(&["label"]));
    for c in capabilities.values_mut() {
        c.destroy_first = true;
    }
    let draft = compute(&Input {
        old: &old,
        new: &old,
        variables: &variables,
        nodes: &nodes,
        capabilities: &capabilities,
    })
    .unwrap();
    let change = &draft.changes[0];
    assert_eq!(change.action, "REPLACE");
    assert!(!change.create_before_destroy);
    assert_eq!(change.placement, change.placement_before);
    let reason = change.reason.as_deref().unwrap();
    assert!(
        reason.contains("cannot update them in place")
            && reason.contains("destroyed before it is made again: provider `p` says"),
        "{reason}"
    );
}

#[test]
fn a_key_the_provider_cannot_update_replaces_and_an_old_provider_always_replaces() {
    let (old, nodes) = (bp(OLD), running());
    let variables = vars(json!({"port": 2}));
    let capabilities = caps(&["db", "web"], Some(&["label"]));
    let draft = compute(&Input {
        old: &old,
        new: &old,
        variables: &variables,
        nodes: &nodes,
        capabilities: &capabilities,
    })
    .unwrap();
    assert_eq!(draft.changes[0].action, "REPLACE");
    assert!(draft.changes[0].create_before_destroy);
    assert!(
        draft.changes[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("cannot update them in place")
    );
    let variables = vars(json!({"label": "b"}));
    let capabilities = caps(&["db", "web"], None);
    let draft = compute(&Input {
        old: &old,
        new: &old,
        variables: &variables,
        nodes: &nodes,
        capabilities: &capabilities,
    })
    .unwrap();
    assert_eq!(draft.changes[0].action, "REPLACE");
    assert!(
        draft.changes[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("protocol version 1")
    );
}

#[test]
fn replicas_up_and_down_and_resources_added_and_removed() {
    let old = bp(OLD);
    let mut nodes = running();
    nodes.push(node(
        "web",
        1,
        json!({"upstream": "db:1", "name": "web"}),
        json!({}),
    ));
    let variables = vars(json!({"n": 3}));
    let capabilities = caps(&["db", "web"], Some(&[]));
    let draft = compute(&Input {
        old: &old,
        new: &old,
        variables: &variables,
        nodes: &nodes,
        capabilities: &capabilities,
    })
    .unwrap();
    assert_eq!(
        actions(&draft),
        vec![
            ("db".into(), 0, "KEEP".into()),
            ("web".into(), 0, "KEEP".into()),
            ("web".into(), 1, "KEEP".into()),
            ("web".into(), 2, "CREATE".into())
        ]
    );
    let new = bp(r#"
version: "1"
variables:
  label: {type: string, default: a}
  port: {type: int, default: 1}
resources:
  db:
    type: t.v1.x
    config: {label: "{{ label }}", port: "{{ port }}"}
  cache:
    type: t.v1.x
    config: {}
"#);
    let variables = blueprint::bind(&new, &serde_json::Map::new()).unwrap();
    let capabilities = caps(&["db", "cache"], Some(&[]));
    let draft = compute(&Input {
        old: &old,
        new: &new,
        variables: &variables,
        nodes: &nodes,
        capabilities: &capabilities,
    })
    .unwrap();
    assert_eq!(
        actions(&draft),
        vec![
            ("db".into(), 0, "KEEP".into()),
            ("cache".into(), 0, "CREATE".into()),
            ("web".into(), 0, "DESTROY".into()),
            ("web".into(), 1, "DESTROY".into())
        ]
    );
}

#[test]
fn a_secret_looking_key_is_masked_and_a_failed_node_is_created_again() {
    let old = bp(r#"
version: "1"
variables:
  pw: {type: string, default: one}
resources:
  db:
    type: t.v1.x
    config: {password: "{{ pw }}"}
"#);
    let nodes = vec![node("db", 0, json!({"password": "one"}), json!({}))];
    let mut failed = nodes.clone();
    failed[0].deployed = false;
    failed[0].state = NodeState::Failed;
    let variables = blueprint::bind(&old, json!({"pw": "two"}).as_object().unwrap()).unwrap();
    let capabilities = caps(&["db"], Some(&["password"]));
    let input = |nodes| Input {
        old: &old,
        new: &old,
        variables: &variables,
        nodes,
        capabilities: &capabilities,
    };
    let draft = compute(&input(&nodes)).unwrap();
    let change = &draft.changes[0].config[0];
    assert!(change.secret);
    assert_eq!(change.before, Some(json!(MASK)));
    assert_eq!(change.after, Some(json!(MASK)));
    assert!(!serde_json::to_string(&draft).unwrap().contains("two"));
    let draft = compute(&input(&failed)).unwrap();
    assert_eq!(draft.changes[0].action, "CREATE");
    assert_eq!(draft.changes[0].node_id, Some(failed[0].id));
}

#[test]
fn a_change_of_only_restart_keeps_everything() {
    let old = bp(OLD);
    let healed = OLD.replace(
        "    type: t.v1.x\n    config: {label",
        "    type: t.v1.x\n    restart: {policy: always, attempts: 3, delay: 2s}\n    config: {label",
    );
    let new = bp(&healed);
    assert_ne!(
        new.resource("db").unwrap().restart,
        old.resource("db").unwrap().restart
    );
    let (nodes, variables) = (running(), vars(json!({})));
    for updatable in [Some(&["label"][..]), None] {
        let capabilities = caps(&["db", "web"], updatable);
        let draft = compute(&Input {
            old: &old,
            new: &new,
            variables: &variables,
            nodes: &nodes,
            capabilities: &capabilities,
        })
        .unwrap();
        assert_eq!(
            actions(&draft),
            vec![
                ("db".into(), 0, "KEEP".into()),
                ("web".into(), 0, "KEEP".into())
            ]
        );
        assert!(draft.changes.iter().all(|c| c.config.is_empty()));
    }
}
