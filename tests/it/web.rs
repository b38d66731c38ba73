//! The web UI in a real browser: headless Chromium loads `/`, runs its
//! JavaScript against the server, and the DOM shows `serverInfo`.

use crate::support::TestApp;

/// Chromium's binary, if installed (`scripts/test.sh` installs it).
fn chromium() -> std::path::PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
        .expect("chromium is installed (scripts/test.sh installs it)")
}

#[tokio::test]
async fn the_first_page_shows_server_info_in_chromium() {
    let app = TestApp::spawn().await;
    let profile = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            // Let the page's fetch finish (in virtual time) before the DOM is dumped.
            "--virtual-time-budget=10000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(app.url("/"))
        .output()
        .await
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(
        dom.contains(r#"id="server-info" data-state="ready""#),
        "{dom}"
    );
    let version = format!(
        r#"<dd data-field="version">{}</dd>"#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(dom.contains(&version), "{dom}");
    let database = if app.store.is_postgres() {
        "postgres"
    } else {
        "sqlite"
    };
    assert!(
        dom.contains(&format!(r#"<dd data-field="database">{database}</dd>"#)),
        "{dom}"
    );
}
