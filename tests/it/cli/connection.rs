//! Reaching and signing in to a server: `login` stores a private token that
//! later commands use and `logout` revokes, a bad token exits 3, and a
//! server that cannot be reached exits 6.

use std::os::unix::fs::PermissionsExt as _;

use serde_json::{Value, json};

use super::Cli;
use crate::support::{TestApp, data, error_code};

#[tokio::test]
async fn login_stores_a_private_token_that_later_commands_use_and_logout_revokes() {
    let app = TestApp::spawn().await;
    data(
        &app.gql(
            r#"mutation { setPassword(newPassword: "correct horse battery") }"#,
            json!({}),
        )
        .await,
    );
    let cli = Cli::new(format!("http://{}", app.addr));

    let refused = cli
        .run_with_stdin(
            &["login", "--user", "admin", "--password-stdin"],
            "wrong horse\n",
        )
        .await;
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(refused.stderr.contains("UNAUTHENTICATED"), "{refused:?}");
    assert!(!cli.credentials().exists());
    cli.expect(&["get", "providers"], 3).await;

    let signed_in = cli
        .run_with_stdin(
            &["login", "--user", "admin", "--password-stdin"],
            "correct horse battery\n",
        )
        .await;
    assert_eq!(signed_in.code, 0, "{signed_in:?}");
    let file = cli.credentials();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", file.display());
    let dir_mode = std::fs::metadata(file.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    let stored: toml::Table = std::fs::read_to_string(&file).unwrap().parse().unwrap();
    let token = stored["token"].as_str().unwrap().to_owned();
    assert_eq!(stored["server"].as_str(), Some(cli.server.as_str()));
    assert!(
        !signed_in.stdout.contains(&token) && !signed_in.stderr.contains(&token),
        "the token is never printed: {signed_in:?}"
    );
    // An API token of the CLI's own, and the session that made it ended.
    let tokens = app
        .gql_as(
            Some(&token),
            "{ me { apiTokens { nodes { name kind } } } }",
            json!({}),
        )
        .await;
    let tokens = data(&tokens)["me"]["apiTokens"]["nodes"].clone();
    let tokens = tokens.as_array().unwrap();
    assert!(
        tokens
            .iter()
            .any(|t| t["kind"] == "API" && t["name"].as_str().unwrap().starts_with("cli@")),
        "{tokens:?}"
    );
    assert!(
        !tokens.iter().any(|t| t["kind"] == "SESSION"),
        "the login session is ended: {tokens:?}"
    );

    // Later commands sign in with it: no flag, no variable.
    let listed = cli.expect(&["get", "providers"], 0).await;
    assert!(listed.stdout.starts_with("NAME"), "{listed:?}");
    assert_eq!(
        cli.expect(&["-o", "json", "get", "providers"], 0)
            .await
            .json(),
        json!([])
    );
    let unknown = cli.expect(&["get", "providers", "nowhere"], 4).await;
    assert!(unknown.stderr.contains("`nowhere`"), "{unknown:?}");

    // The replicas: this server, alive and leading.
    let replicas = cli.expect(&["get", "replicas"], 0).await;
    let row = replicas
        .stdout
        .lines()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert!(
        replicas.stdout.starts_with("ID") && row.contains("ALIVE") && row.contains("yes"),
        "{replicas:?}"
    );
    let replicas = cli
        .expect(&["-o", "json", "get", "replicas"], 0)
        .await
        .json();
    assert_eq!(replicas.as_array().map(Vec::len), Some(1), "{replicas}");
    assert_eq!(replicas[0]["advertiseUrl"], format!("http://{}", app.addr));

    cli.expect(&["logout"], 0).await;
    assert!(!cli.credentials().exists());
    let after = app
        .gql_as(Some(&token), "{ me { username } }", json!({}))
        .await;
    assert_eq!(
        error_code(&after),
        Some("UNAUTHENTICATED"),
        "revoked: {after}"
    );
    cli.expect(&["get", "providers"], 3).await;

    let bogus = Cli {
        token: Some("cbl_not_a_token".to_owned()),
        ..Cli::new(cli.server.clone())
    };
    let refused = bogus.expect(&["-o", "json", "get", "deployments"], 3).await;
    let error: Value = serde_json::from_str(refused.stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "UNAUTHENTICATED", "{refused:?}");
    assert!(refused.stdout.is_empty());
}

#[tokio::test]
async fn an_unreachable_server_exits_6() {
    // A port that was free a moment ago: nothing listens there now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cli = Cli::admin(format!("http://127.0.0.1:{port}"));
    let ran = cli.expect(&["get", "deployments"], 6).await;
    assert!(ran.stderr.contains("cannot reach"), "{ran:?}");
    // With no token either: the server is unreachable, not the user
    // unsigned; the text names the code as JSON does.
    let nobody = Cli::new(format!("http://127.0.0.1:{port}"));
    let ran = nobody.expect(&["get", "deployment", "web"], 6).await;
    assert!(
        ran.stderr.starts_with(&format!(
            "corbel: UNREACHABLE: cannot reach the server at http://127.0.0.1:{port}"
        )),
        "{ran:?}"
    );
    let ran = nobody
        .expect(&["-o", "yaml", "get", "deployment", "web"], 6)
        .await;
    let error: serde_json::Value = serde_yaml_ng::from_str(&ran.stderr).unwrap();
    assert_eq!(error["error"]["code"], "UNREACHABLE", "{ran:?}");
    assert_eq!(error["error"]["exitCode"], 6, "{ran:?}");
    let ran = cli
        .expect(&["-o", "json", "events", "deployment", "web"], 6)
        .await;
    assert!(ran.stdout.is_empty(), "{ran:?}");
    let error: Value = serde_json::from_str(ran.stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "UNREACHABLE");
    assert_eq!(error["error"]["exitCode"], 6);

    let help = cli.expect(&["--help"], 0).await;
    assert!(
        help.stdout.contains("Exit codes")
            && help.stdout.contains("6  the server cannot be reached"),
        "{help:?}"
    );
    cli.expect(&["get", "everything"], 2).await;
}
