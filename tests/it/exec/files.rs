//! `PUT`/`GET /files/{nodeId}`: what is refused is refused with its reason,
//! and writes nothing.

use serde_json::Value;

use super::deployed_app_with;
use crate::support::{ADMIN_TOKEN, TestApp};

async fn put(app: &TestApp, node: &str, path: &str, body: Vec<u8>) -> (u16, Value) {
    let answer = app
        .client
        .put(format!("http://{}/files/{node}", app.addr))
        .query(&[("path", path)])
        .bearer_auth(ADMIN_TOKEN)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    build(&mut builder);
    builder.into_inner().unwrap()
}

fn file(builder: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
    let mut header = tar::Header::new_gnu();
    header.set_size(body.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut header, path, body).unwrap();
}

/// Everything under `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut all: Vec<String> = walk(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    all.sort();
    all
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[tokio::test]
async fn bad_uploads_are_refused_with_their_reason_and_write_nothing() {
    let outer = tempfile::tempdir().unwrap();
    let cwd = outer.path().join("app");
    std::fs::create_dir(&cwd).unwrap();
    let (app, node, _) = deployed_app_with(&cwd, |config| {
        config.api.max_upload_bytes = 64 * 1024;
    })
    .await;

    // A good one lands, for contrast.
    let good = archive(|b| file(b, "ok.txt", b"fine"));
    let (status, body) = put(&app, &node, ".", good).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read(cwd.join("ok.txt")).unwrap(), b"fine");
    let before = listing(outer.path());

    // A path climbing out, made by hand (`tar` will not write one).
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..13].copy_from_slice(b"../escaped.sh");
    header.set_size(1);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut climbing = header.as_bytes().to_vec();
    climbing.extend_from_slice(&[b'x'; 512]);
    climbing.extend_from_slice(&[0; 1024]);
    let symlink = archive(|b| {
        file(b, "first.txt", b"x");
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        b.append_link(&mut header, "link", "/etc/shadow").unwrap();
    });
    let oversized = archive(|b| file(b, "big.bin", &vec![7u8; 100 * 1024]));
    let cut = archive(|b| file(b, "cut.bin", &[1u8; 4096]))[..2048].to_vec();
    for (what, path, body, want_status, want) in [
        ("climbing", ".", climbing, 400, "climbing out"),
        ("a symlink", ".", symlink, 400, "symbolic link"),
        ("too large", ".", oversized, 413, "api.max_upload_bytes"),
        ("cut short", ".", cut, 400, "cut short"),
        ("not tar", ".", b"hello".to_vec(), 400, "tar"),
        (
            "a path with ..",
            "../",
            archive(|b| file(b, "x", b"x")),
            400,
            "..",
        ),
    ] {
        let (status, body) = put(&app, &node, path, body).await;
        assert_eq!(status, want_status, "{what}: {body}");
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(want), "{what}: {message}");
    }
    assert_eq!(listing(outer.path()), before, "nothing was written");

    // Reading what is not there is NOT_FOUND; the audit log has each try.
    let answer = app
        .client
        .get(format!("http://{}/files/{node}", app.addr))
        .query(&[("path", "no-such-file")])
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 404);
    let body = app
        .gql(
            "{ auditLog(filter: { actions: [\"putFiles\", \"getFiles\"] }) { edges { node { action outcome } } } }",
            serde_json::json!({}),
        )
        .await;
    let entries = body["data"]["auditLog"]["edges"].as_array().unwrap().len();
    assert_eq!(entries, 8, "{body}");
}
