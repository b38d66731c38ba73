//! Users as server admins manage them: a disabled user's sessions and API
//! tokens stop at once, and the last server admin can be neither disabled,
//! deleted nor demoted.

use serde_json::json;

use super::{login, user};
use crate::support::{TestApp, data, error_code};

#[tokio::test]
async fn a_disabled_user_stops_at_once_and_the_last_admin_stays() {
    let app = TestApp::spawn().await;
    let dana = user(&app, "dana", "USER").await;
    let me = app
        .gql_as(Some(&dana), "{ me { username role disabled } }", json!({}))
        .await;
    assert_eq!(
        data(&me)["me"],
        json!({ "username": "dana", "role": "USER", "disabled": false })
    );
    // A second session, and an API token: all stop when dana is disabled.
    let second = login(&app, "dana").await;
    let api = app
        .gql_as(
            Some(&dana),
            "mutation { createApiToken(name: \"ci\") { token } }",
            json!({}),
        )
        .await;
    let api = data(&api)["createApiToken"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let users = app.gql("{ users { id username } }", json!({})).await;
    let id = data(&users)["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["username"] == "dana")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let off = app
        .gql(
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { disabled } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&off)["setUserDisabled"]["disabled"], true);
    for token in [&dana, &second, &api] {
        let refused = app
            .gql_as(Some(token), "{ me { username } }", json!({}))
            .await;
        assert_eq!(error_code(&refused), Some("UNAUTHENTICATED"), "{refused}");
    }
    let again = app
        .gql_as(
            None,
            "mutation { login(username: \"dana\", password: \"a long enough password 42\") { token } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&again), Some("UNAUTHENTICATED"), "{again}");
    // Enabled again: the API token works again; sessions were ended for good.
    let on = app
        .gql(
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: false) { disabled } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&on)["setUserDisabled"]["disabled"], false);
    let works = app
        .gql_as(Some(&api), "{ me { username } }", json!({}))
        .await;
    assert_eq!(data(&works)["me"]["username"], "dana");
    let ended = app
        .gql_as(Some(&second), "{ me { username } }", json!({}))
        .await;
    assert_eq!(error_code(&ended), Some("UNAUTHENTICATED"), "{ended}");

    // The last server admin can be neither disabled nor deleted, nor demoted.
    let admin_id = data(&users)["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["username"] == "admin")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ops = user(&app, "ops", "ADMIN").await;
    for mutation in [
        "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { id } }",
        "mutation($id: ID!) { setUserRole(id: $id, role: USER) { id } }",
        "mutation($id: ID!) { deleteUser(id: $id) }",
    ] {
        let body = app
            .gql_as(Some(&ops), mutation, json!({ "id": admin_id }))
            .await;
        assert!(body.get("errors").is_none(), "ops may act on admin: {body}");
        if mutation.contains("disabled: true") {
            let back = app
                .gql_as(
                    Some(&ops),
                    "mutation($id: ID!) { setUserDisabled(id: $id, disabled: false) { id } }",
                    json!({ "id": admin_id }),
                )
                .await;
            data(&back);
        }
        if mutation.contains("role: USER") {
            let back = app
                .gql_as(
                    Some(&ops),
                    "mutation($id: ID!) { setUserRole(id: $id, role: ADMIN) { id } }",
                    json!({ "id": admin_id }),
                )
                .await;
            data(&back);
        }
    }
    // admin is deleted now; ops is the last admin and cannot remove itself.
    let ops_id = {
        let me = app.gql_as(Some(&ops), "{ me { id } }", json!({})).await;
        data(&me)["me"]["id"].as_str().unwrap().to_owned()
    };
    let refused = app
        .gql_as(
            Some(&ops),
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { id } }",
            json!({ "id": ops_id }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    let dana_made_admin = app
        .gql_as(
            Some(&ops),
            "mutation($id: ID!) { setUserRole(id: $id, role: ADMIN) { role } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&dana_made_admin)["setUserRole"]["role"], "ADMIN");
}
