//! Remote providers: the process provider run by hand, as its operator would
//! on another host, registers over TCP with mutual TLS (`--provider-listen`,
//! `runtime: remote`), and Corbel dials it back over TLS. The registry refuses
//! a plaintext client, a certificate from another CA, and a certificate that
//! names another provider; the SDK refuses a plaintext registry that is not
//! on loopback. A deployment runs through it, and a lost link is waited out.
//! Then the same from another host: the provider in a container on a private
//! Docker network (the busybox image with the host's `/usr`, as the
//! partition test runs its replicas).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::deployments::{create_blueprint, deploy, destroy_and_wait, pids, settled};
use crate::support::docker::{Net, docker, ip};
use crate::support::processes::{alive, parent};
use crate::support::provider_repos::{ProviderRepo, workspace_bin};
use crate::support::providers::{create_provider, logs, provider, wait_status};
use crate::support::settings::{fast_reaper, quick};
use crate::support::{TestApp, TestStore, data, eventually};

const METADATA: &str = "name: process\nversion: 0.1.0\ndescription: run on another host\n\
     runtime: remote\nfeatures: [deploy, destroy, inspect, nodes]\n\
     resource_types: [process.v1.service]\n";

const BLUEPRINT: &str = r#"
version: "1"
resources:
  app:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
"#;

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A certificate, its key and the CA, as `issueProviderCertificate` gives them.
struct Issued {
    certificate: String,
    key: String,
    ca: String,
}

async fn issue(app: &TestApp, id: &str) -> Issued {
    let body = app
        .gql(
            "mutation($id: ID!) { issueProviderCertificate(id: $id) { certificate key ca serverName } }",
            json!({ "id": id }),
        )
        .await;
    let issued = &data(&body)["issueProviderCertificate"];
    assert_eq!(issued["serverName"], "registry.corbel");
    let text = |field: &str| issued[field].as_str().unwrap().to_owned();
    Issued {
        certificate: text("certificate"),
        key: text("key"),
        ca: text("ca"),
    }
}

/// The process provider, started by hand with `env`; its output goes to
/// `<dir>/out`.
struct Remote {
    child: tokio::process::Child,
    out: PathBuf,
}

impl Remote {
    fn start(dir: &Path, env: &[(&str, String)]) -> Remote {
        let out = dir.join(format!("out-{}", uuid::Uuid::new_v4()));
        let file = std::fs::File::create(&out).unwrap();
        let mut command = tokio::process::Command::new(workspace_bin("corbel-provider-process"));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        Remote {
            child: command.spawn().unwrap(),
            out,
        }
    }

    /// Waits for it to exit; its code and what it said.
    async fn exited(mut self) -> (i32, String) {
        let Ok(status) = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await
        else {
            panic!(
                "the refused provider did not exit; it said: {}",
                self.said()
            );
        };
        let status = status.unwrap();
        (
            status.code().unwrap_or(-1),
            std::fs::read_to_string(&self.out).unwrap(),
        )
    }

    fn said(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

/// What a remote provider is given: its id and token, the files of `tls`,
/// the registry, where to listen and its state directory.
fn remote_env(
    dir: &Path,
    id: &str,
    token: &str,
    tls: &Issued,
    registry: &str,
    listen: u16,
) -> Vec<(&'static str, String)> {
    let tag = uuid::Uuid::new_v4();
    let write = |name: &str, text: &str| {
        let path = dir.join(format!("{tag}-{name}"));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    vec![
        ("CORBEL_REGISTRY", registry.to_owned()),
        ("CORBEL_PROVIDER_ID", id.to_owned()),
        ("CORBEL_PROVIDER_TOKEN", token.to_owned()),
        ("CORBEL_TLS_CERT", write("cert.pem", &tls.certificate)),
        ("CORBEL_TLS_KEY", write("key.pem", &tls.key)),
        ("CORBEL_TLS_CA", write("ca.pem", &tls.ca)),
        ("CORBEL_PROVIDER_LISTEN", format!("127.0.0.1:{listen}")),
        ("CORBEL_STATE_DIR", dir.join("state").display().to_string()),
    ]
}

async fn create_remote(app: &TestApp, repo: &ProviderRepo, name: &str) -> (String, String) {
    create_provider(
        app,
        json!({ "name": name, "gitUrl": repo.url(), "config": { "capacity": 50, "grace_ms": 2000 } }),
    )
    .await
}

#[tokio::test]
async fn a_remote_provider_registers_over_mutual_tls_and_runs_a_deployment() {
    let port = free_port();
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        fast_reaper(config);
        // Checks too rare to find a killed provider: its health watch must.
        config.provider.health_interval = Duration::from_secs(120);
        config.provider.listen = Some(([127, 0, 0, 1], port).into());
    })
    .await;
    let registry = format!("https://127.0.0.1:{port}");
    let data_dir = app.store.data_dir();
    // The CA was made at the first start; its key is sealed at rest.
    let ca = std::fs::read_to_string(data_dir.join("provider-ca.pem")).unwrap();
    assert!(ca.contains("BEGIN CERTIFICATE"));
    let sealed = std::fs::read_to_string(data_dir.join("provider-ca.key")).unwrap();
    assert!(!sealed.contains("PRIVATE KEY"), "the CA key is sealed");

    let repo = ProviderRepo::new(METADATA, &[]);
    let (id, token) = create_remote(&app, &repo, "far").await;
    let waiting = wait_status(&app, &id, "REGISTERING").await;
    let message = waiting.status_message.unwrap_or_default();
    assert!(
        message.contains(&format!("register at 127.0.0.1:{port}, over mutual TLS")),
        "{message}"
    );
    let issued = issue(&app, &id).await;
    assert_eq!(issued.ca, ca, "the CA given is the one Corbel made");
    let dir = tempfile::tempdir().unwrap();

    // Refused: plaintext to the TLS listener.
    let plaintext = |registry: String| {
        let mut env = remote_env(dir.path(), &id, &token, &issued, &registry, free_port());
        env.retain(|(name, _)| {
            !name.starts_with("CORBEL_TLS_") && *name != "CORBEL_PROVIDER_LISTEN"
        });
        env.push((
            "CORBEL_SOCKET_DIR",
            dir.path().join("sockets").display().to_string(),
        ));
        env
    };
    let plain = plaintext(format!("http://127.0.0.1:{port}"));
    let (code, said) = Remote::start(dir.path(), &plain).exited().await;
    assert_eq!(code, 1, "{said}");
    // The TLS listener drops the plaintext connection at its first call:
    // a connection that failed, not a refusal of protocol versions.
    assert!(said.contains("cannot connect to the registry"), "{said}");
    assert!(!said.contains("this provider speaks"), "{said}");
    assert!(!said.contains("registered"), "{said}");

    // Refused by the SDK itself: a registry on another host without TLS.
    let far = plaintext("http://192.0.2.1:7000".to_owned());
    let (code, said) = Remote::start(dir.path(), &far).exited().await;
    assert_eq!(code, 2, "{said}");
    assert!(said.contains("reached over TLS"), "{said}");

    // Refused: a certificate for this very id from another CA.
    let other_ca_dir = tempfile::tempdir().unwrap();
    let other_ca =
        corbel::provider::tls::ProviderTls::load(corbel::provider::tls::CaSource::DataDir {
            data_dir: other_ca_dir.path(),
            key: &corbel::seal::SecretKey::generate(),
        })
        .unwrap();
    let foreign = other_ca.issue(id.parse().unwrap()).unwrap();
    let foreign = Issued {
        certificate: foreign.certificate,
        key: foreign.key,
        ca: issued.ca.clone(),
    };
    let env = remote_env(dir.path(), &id, &token, &foreign, &registry, free_port());
    let (code, said) = Remote::start(dir.path(), &env).exited().await;
    assert_eq!(code, 1, "{said}");
    // Said as what it is: the TLS handshake, not protocol versions. What
    // was wrong, the provider's side knows only when the registry's alert
    // arrives before the connection closes (TLS 1.3 checks the client's
    // certificate after the client is done, so its first write may meet a
    // closed connection: "broken pipe", "connection closed").
    assert!(said.contains("the TLS handshake failed"), "{said}");
    // The registry's side always knows: it counts the refusal by reason
    // (and logs it with the peer's address).
    eventually(
        Duration::from_secs(10),
        "the unknown_ca refusal counted",
        || async {
            let metrics = app
                .client
                .get(app.url("/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            metrics
                .lines()
                .any(|l| {
                    l.starts_with(corbel::provider::tls::REFUSALS)
                        && l.contains("reason=\"unknown_ca\"")
                })
                .then_some(())
        },
    )
    .await;

    // Refused: another provider's certificate, with this one's id and token.
    let (other, _) = create_remote(&app, &repo, "other").await;
    let theirs = issue(&app, &other).await;
    let env = remote_env(dir.path(), &id, &token, &theirs, &registry, free_port());
    let (code, said) = Remote::start(dir.path(), &env).exited().await;
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("PermissionDenied"), "{said}");
    assert!(said.contains("is not provider"), "{said}");
    assert_eq!(provider(&app, &id).await.status, "REGISTERING");

    // Its own certificate: registered, and dialled back over TLS.
    let listen = free_port();
    let env = remote_env(dir.path(), &id, &token, &issued, &registry, listen);
    let remote = Remote::start(dir.path(), &env);
    wait_status(&app, &id, "CONNECTED").await;
    let log = logs(&app, &id).await;
    assert!(
        log.contains(&format!("at https://127.0.0.1:{listen}")),
        "{log}"
    );
    assert!(!log.contains(&token), "the token stays out of the log");

    let blueprint = create_blueprint(&app, "far-app", BLUEPRINT).await;
    let deployment = deploy(&app, &blueprint, "far-app-1", json!({})).await;
    let done = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let running = pids(&done);
    let provider_pid = remote.child.id().unwrap() as i32;
    for pid in &running {
        assert!(alive(*pid), "{pid} runs");
        assert_eq!(
            parent(*pid),
            Some(provider_pid),
            "started by the remote provider"
        );
    }

    // The provider killed: its health watch breaks with its connection, and
    // the link is dropped at once, two minutes before a check would find it.
    drop(remote);
    let killed = std::time::Instant::now();
    eventually(Duration::from_secs(20), "DISCONNECTED", || async {
        (provider(&app, &id).await.status == "DISCONNECTED").then_some(())
    })
    .await;
    eprintln!("DISCONNECTED {:?} after the SIGKILL", killed.elapsed());
    let said = logs(&app, &id).await;
    assert!(said.contains("the health watch broke"), "{said}");
    // Corbel waits for it again, and it comes back. A deploy asked while the
    // provider is away waits for its next registration instead of spending
    // its tries on the dead link.
    // Named: `other` announces the same type, and neither is connected now.
    let named = create_blueprint(
        &app,
        "far-app-named",
        &BLUEPRINT.replace(
            "type: process.v1.service",
            "type: process.v1.service\n    provider: far",
        ),
    )
    .await;
    let second = deploy(&app, &named, "far-app-2", json!({ "onFailure": "KEEP" })).await;
    // The health check may say so first ("health check failed"); the
    // supervisor's word follows.
    eventually(
        Duration::from_secs(30),
        "waiting for it to register again",
        || async {
            let lost = provider(&app, &id).await;
            (lost.status == "DISCONNECTED"
                && lost
                    .status_message
                    .unwrap_or_default()
                    .contains("waiting for it to register again"))
            .then_some(())
        },
    )
    .await;
    let env = remote_env(dir.path(), &id, &token, &issued, &registry, free_port());
    let again = Remote::start(dir.path(), &env);
    wait_status(&app, &id, "CONNECTED").await;
    let waited = settled(&app, &second, &["COMPLETE", "FAILED"]).await;
    assert_eq!(waited.state, "COMPLETE", "{waited:?}");
    destroy_and_wait(&app, &second, &pids(&waited)).await;
    destroy_and_wait(&app, &deployment, &running).await;
    assert!(again.said().contains("registered"), "{}", again.said());

    // A provider that is not remote cannot register over TLS, even with a
    // certificate naming it.
    unload(&app, &id).await;
    wait_status(&app, &id, "UNLOADED").await;
    drop(again);
    let env = remote_env(dir.path(), &id, &token, &issued, &registry, free_port());
    let (code, said) = Remote::start(dir.path(), &env).exited().await;
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("is not loaded as a remote provider"),
        "{said}"
    );
    app.stop().await;
}

/// Without `--provider-listen` no certificate is issued, and no CA is made.
#[tokio::test]
async fn certificates_are_refused_without_a_listener() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = ProviderRepo::new(METADATA, &[]);
    let (id, _) = create_remote(&app, &repo, "far").await;
    let body = app
        .gql(
            "mutation($id: ID!) { issueProviderCertificate(id: $id) { key } }",
            json!({ "id": id }),
        )
        .await;
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--provider-listen"), "{body}");
    assert!(body["data"].is_null() || body["data"]["issueProviderCertificate"].is_null());
    assert!(!app.store.data_dir().join("provider-ca.pem").exists());
    // Loaded, it says why it cannot register.
    let waiting = eventually(Duration::from_secs(30), "the waiting message", || async {
        let p = provider(&app, &id).await;
        (p.status == "REGISTERING").then_some(p)
    })
    .await;
    assert!(
        waiting
            .status_message
            .unwrap_or_default()
            .contains("no --provider-listen"),
    );
    app.stop().await;
}

async fn unload(app: &TestApp, id: &str) {
    let body: Value = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
}

/// A provider on another host: the process provider in a container on a
/// private network registers with the server on this host through the
/// network's gateway, is dialled back at the container's own address over
/// TLS, and runs the deployment's service in its container.
#[tokio::test]
async fn a_provider_on_another_network_registers_and_runs_a_deployment() {
    let net = Net::new("corbel-remote");
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        fast_reaper(config);
        config.provider.listen = Some(([0, 0, 0, 0], port).into());
    })
    .await;
    let repo = ProviderRepo::new(METADATA, &[]);
    let (id, token) = create_remote(&app, &repo, "far").await;
    wait_status(&app, &id, "REGISTERING").await;
    let issued = issue(&app, &id).await;
    let tls = net.files.path();
    for (name, text) in [
        ("cert.pem", &issued.certificate),
        ("key.pem", &issued.key),
        ("ca.pem", &issued.ca),
    ] {
        std::fs::write(tls.join(name), text).unwrap();
    }
    let bin = workspace_bin("corbel-provider-process");
    let mut extra = vec![
        "--tmpfs".to_owned(),
        "/tmp:mode=1777".to_owned(),
        "-v".to_owned(),
        format!("{}:/tls:ro", tls.display()),
        "-v".to_owned(),
        format!("{0}:{0}:ro", bin.parent().unwrap().display()),
    ];
    let registry = format!("https://{}:{port}", net.gateway());
    for (name, value) in [
        ("CORBEL_REGISTRY", registry.as_str()),
        ("CORBEL_PROVIDER_ID", &id),
        ("CORBEL_PROVIDER_TOKEN", &token),
        ("CORBEL_TLS_CERT", "/tls/cert.pem"),
        ("CORBEL_TLS_KEY", "/tls/key.pem"),
        ("CORBEL_TLS_CA", "/tls/ca.pem"),
        ("CORBEL_PROVIDER_LISTEN", "0.0.0.0:7444"),
        ("CORBEL_STATE_DIR", "/tmp/state"),
        ("PATH", "/bin"),
    ] {
        extra.extend(["-e".to_owned(), format!("{name}={value}")]);
    }
    // It says where it is reached: its own address on the network.
    let container = net.run(
        "provider",
        &extra,
        &format!(
            "export CORBEL_PROVIDER_ENDPOINT=https://$(hostname -i):7444; exec {}",
            bin.display()
        ),
    );
    let address = ip(&container);
    eventually(
        Duration::from_secs(60),
        "the provider in the container to connect",
        || async {
            let p = provider(&app, &id).await;
            if p.status == "CONNECTED" {
                return Some(());
            }
            let said = docker(&["logs", &container]);
            assert!(
                !said.contains("refused") && !said.contains("cannot connect"),
                "the provider in the container gave up: {said}"
            );
            None
        },
    )
    .await;
    let log = logs(&app, &id).await;
    assert!(log.contains(&format!("at https://{address}:7444")), "{log}");
    assert!(!address.starts_with("127."), "reached across the network");

    let blueprint = create_blueprint(&app, "far-app", BLUEPRINT).await;
    let deployment = deploy(&app, &blueprint, "far-app-1", json!({})).await;
    let done = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let top = || docker(&["top", &container, "-o", "pid,args"]);
    assert!(
        top().contains("sleep 300"),
        "the service runs in the container: {}",
        top()
    );
    destroy_and_wait(&app, &deployment, &[]).await;
    eventually(
        Duration::from_secs(30),
        "the service to be gone",
        || async { (!top().contains("sleep 300")).then_some(()) },
    )
    .await;
    app.stop().await;
}
