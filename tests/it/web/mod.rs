//! The web console and GraphiQL in real headless Chromium (WebDriver), with
//! the network limited to loopback: the pages, their live updates and the
//! errors they show, against the real server. Screenshots go to
//! `target/screenshots/`.

use serde_json::json;

use crate::support::TestApp;
use crate::support::browser::{Browser, PASSWORD, set_admin_password};

mod audit;
mod blueprints;
mod deployments;
mod overview;
mod providers;
mod repositories;
mod teams;

#[tokio::test]
async fn every_page_leads_to_sign_in_and_back_after_it() {
    let app = TestApp::spawn().await;
    set_admin_password(&app).await;
    let browser = Browser::open(&app).await;
    browser.goto("/deployments?state=FAILED").await;
    browser.find("#sign-in").await;
    assert_eq!(
        browser.path().await,
        "/sign-in?next=%2Fdeployments%3Fstate%3DFAILED"
    );
    // A wrong password is refused where it was typed, with its code.
    browser.fill("#sign-in [name=username]", "admin").await;
    browser
        .fill("#sign-in [name=password]", "not-the-password")
        .await;
    browser.click("#sign-in button[type=submit]").await;
    let error = browser
        .wait_text("#sign-in [role=alert]", "UNAUTHENTICATED")
        .await;
    assert!(!error.contains(PASSWORD), "{error}");
    browser.screenshot("sign-in-refused").await;

    browser.fill("#sign-in [name=password]", PASSWORD).await;
    browser.click("#sign-in button[type=submit]").await;
    browser.wait_text("#signed-in-as", "admin").await;
    assert_eq!(browser.path().await, "/deployments?state=FAILED");
    // The session is the HttpOnly cookie: the page's script cannot read it.
    assert_eq!(browser.js("return document.cookie;").await, json!(""));

    // Reload keeps the route and the session; back goes where it was.
    browser.goto("/account").await;
    browser.wait_text("h1", "Account").await;
    browser.client.refresh().await.unwrap();
    browser.wait_text("#signed-in-as", "admin").await;
    browser.wait_text("h1", "Account").await;
    browser.client.back().await.unwrap();
    browser.wait_text("h1", "Deployments").await;

    browser.click("#sign-out").await;
    browser.find("#sign-in").await;
    browser.goto("/providers").await;
    browser.find("#sign-in").await;
    assert!(browser.foreign_requests().await.is_empty());
    browser.close().await;
}

#[tokio::test]
async fn a_first_start_sets_the_admin_password_with_the_printed_token() {
    let app = TestApp::spawn().await;
    let browser = Browser::open(&app).await;
    browser.goto("/").await;
    browser.click("details summary").await;
    browser
        .fill("#first-start [name=token]", crate::support::ADMIN_TOKEN)
        .await;
    browser
        .fill("#first-start [name=new-password]", "short")
        .await;
    browser.click("#first-start button[type=submit]").await;
    // The browser's own check (minlength) keeps the form from being sent.
    assert_eq!(browser.path().await, "/sign-in?next=%2F");
    browser
        .fill("#first-start [name=new-password]", "a-good-password")
        .await;
    browser.click("#first-start button[type=submit]").await;
    browser.wait_text("#signed-in-as", "admin").await;
    browser.wait_text("h1", "Overview").await;
    // The token was used once and kept nowhere the page can read.
    let stored = browser
        .js("return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie;")
        .await;
    assert!(
        !stored
            .as_str()
            .unwrap_or_default()
            .contains(crate::support::ADMIN_TOKEN)
    );
    browser.close().await;
}

#[tokio::test]
async fn the_overview_counts_and_names_what_needs_attention() {
    let app = TestApp::spawn().await;
    let browser = Browser::sign_in(&app).await;
    browser
        .wait_text("#overview", "Nothing needs attention")
        .await;
    // The overview redraws on server events: read the count once drawn.
    assert_eq!(
        browser
            .wait_text("[data-count=Providers] strong", "0")
            .await,
        "0",
        "no providers yet"
    );
    browser.wait_text("#overview", "Add a provider").await;
    // A repository whose source is missing fails its sync: it shows up,
    // live (serverEvents), as a link to it.
    let missing = tempfile::tempdir().unwrap();
    let gone = missing.path().join("gone");
    let body = app
        .gql(
            "mutation($input: CreateRepositoryInput!) { createRepository(input: $input) { id } }",
            json!({ "input": { "name": "broken", "driver": { "local": { "path": gone } } } }),
        )
        .await;
    let id = crate::support::data(&body)["createRepository"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    browser.wait_text("#attention", "broken").await;
    browser
        .wait_text("[data-count=Repositories] strong", "1")
        .await;
    browser.screenshot("overview").await;
    browser.click("#attention a").await;
    assert_eq!(browser.path().await, format!("/repositories/{id}"));
    browser.close().await;
}

#[tokio::test]
async fn api_tokens_are_shown_once_and_revoked_from_the_account_page() {
    let app = TestApp::spawn().await;
    let browser = Browser::sign_in(&app).await;
    browser.goto("/account").await;
    // The session this browser signed in with is listed; no API token yet.
    browser.wait_text("#tokens", "SESSION").await;
    assert!(browser.all("[data-revoke]").await.is_empty());
    browser.fill("#create-token [name=token-name]", "ci").await;
    browser.click("#create-token button[type=submit]").await;
    let secret = browser.text("#token-secret").await;
    assert!(secret.len() > 20, "{secret}");
    browser.find("tr[data-token=ci]").await;
    // The token works for a script...
    let me = app
        .gql_as(Some(&secret), "{ me { username } }", json!({}))
        .await;
    assert_eq!(me["data"]["me"]["username"], "admin", "{me}");
    // ...and is never shown again.
    browser.client.refresh().await.unwrap();
    browser.find("tr[data-token=ci]").await;
    let page = browser.text("body").await;
    assert!(!page.contains(&secret));

    browser.click("[data-revoke=ci]").await;
    browser.client.accept_alert().await.unwrap();
    crate::support::eventually(crate::support::browser::WAIT, "the row goes", || async {
        browser
            .all("tr[data-token=ci]")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let after = app
        .gql_as(Some(&secret), "{ me { username } }", json!({}))
        .await;
    assert_eq!(crate::support::error_code(&after), Some("UNAUTHENTICATED"));

    // A wrong current password is refused beside the form.
    browser
        .fill("#change-password [name=current-password]", "wrong-password")
        .await;
    browser
        .fill("#change-password [name=new-password]", "another-password")
        .await;
    browser.click("#change-password button[type=submit]").await;
    browser
        .wait_text("#change-password [role=alert]", "currentPassword is wrong")
        .await;
    browser.close().await;
}

#[tokio::test]
async fn graphiql_runs_a_query_and_a_subscription_with_no_network() {
    let app = TestApp::spawn().await;
    let browser = Browser::sign_in(&app).await;
    browser.goto("/graphql").await;
    browser.find(".graphiql-container").await;
    browser.wait_text("#who", "Signed in as admin").await;
    // The default query runs with the session's cookie.
    browser
        .click(".graphiql-execute-button, button[aria-label^='Execute']")
        .await;
    browser
        .wait_js(
            "the query's result",
            "document.querySelector('.result-window') && document.querySelector('.result-window').textContent.includes('\"username\": \"admin\"')",
        )
        .await;
    browser.screenshot("graphiql").await;
    // What loading it cost: every file the page fetched, as sent (brotli),
    // fonts included once they are drawn; only the faces it uses.
    let sent = browser
        .js("return document.fonts.ready.then(() => { \
            const files = [performance.getEntriesByType('navigation')[0], \
              ...performance.getEntriesByType('resource')] \
              .filter(e => !['fetch', 'xmlhttprequest'].includes(e.initiatorType)); \
            return { bytes: files.reduce((n, e) => n + e.transferSize, 0), files: files.length, \
              fonts: files.filter(e => e.name.includes('/fonts/')).length }; })")
        .await;
    let bytes = sent["bytes"].as_u64().unwrap_or(u64::MAX);
    println!("GraphiQL's page: {sent}");
    assert!(bytes < 500_000, "GraphiQL's transfer: {sent}");
    let fonts = sent["fonts"].as_u64().unwrap_or(99);
    assert!((1..=6).contains(&fonts), "only the faces drawn: {sent}");

    // A subscription over /graphql/ws: the editor's text is replaced through
    // CodeMirror, then an event is caused through the API.
    browser
        .js("document.querySelector('.graphiql-query-editor .CodeMirror').CodeMirror.setValue('subscription { serverEvents { __typename ... on ApiTokenCreated { name } } }'); return true;")
        .await;
    browser
        .click(".graphiql-execute-button, button[aria-label^='Execute']")
        .await;
    // Subscribed once the socket has sent `subscribe`: retry making the event
    // until the result window shows it.
    let deadline = std::time::Instant::now() + crate::support::browser::WAIT;
    let mut n = 0;
    loop {
        n += 1;
        let name = format!("from-graphiql-{n}");
        let body = app
            .gql(
                "mutation($n: String!) { createApiToken(name: $n) { token } }",
                json!({ "n": name }),
            )
            .await;
        crate::support::data(&body);
        let shown = browser
            .js("return document.querySelector('.result-window').textContent;")
            .await;
        let shown_text = shown.as_str().unwrap_or_default();
        if shown_text.contains("from-graphiql-") {
            break;
        }
        if shown_text.contains("not supported on this transport") {
            // GraphiQL parses the editor's text after a pause: run before it
            // had, it took the new text for the old query and sent it over
            // HTTP. Run it again, now that it has.
            browser
                .click(".graphiql-execute-button, button[aria-label^='Execute']")
                .await;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the subscription showed no event: {shown}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let foreign = browser.foreign_requests().await;
    assert!(foreign.is_empty(), "requests off this server: {foreign:?}");
    browser.close().await;
}

#[tokio::test]
async fn the_console_is_served_whole_from_the_binary_with_a_strict_policy() {
    let app = TestApp::spawn().await;
    for path in ["/", "/providers/some-id", "/sign-in", "/graphql"] {
        let response = app
            .client
            .get(app.url(path))
            .header("Accept", "text/html")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let csp = response.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert_eq!(response.headers()["x-frame-options"], "DENY");
        let html = response.text().await.unwrap();
        assert!(
            !html.contains("https://"),
            "{path} loads nothing from elsewhere"
        );
    }
    // A mistyped address: the console's own "Not found" page for a browser
    // (status 404), a plain 404 for anything else; the icon every page asks for.
    let lost = app
        .client
        .get(app.url("/no-such-page"))
        .header("Accept", "text/html");
    let lost = lost.send().await.unwrap();
    assert_eq!(lost.status(), 404);
    assert!(lost.text().await.unwrap().contains("/ui/js/app.js"));
    let plain = app
        .client
        .get(app.url("/no-such-page"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 404);
    assert_eq!(plain.text().await.unwrap(), "not found\n");
    let icon = app
        .client
        .get(app.url("/favicon.ico"))
        .send()
        .await
        .unwrap();
    assert_eq!(icon.status(), 200);
    assert_eq!(icon.headers()["content-type"], "image/svg+xml");
    // Assets are revalidated by ETag: unchanged, they cost a 304.
    let first = app
        .client
        .get(app.url("/ui/js/app.js"))
        .send()
        .await
        .unwrap();
    let etag = first.headers()["etag"].clone();
    let again = app
        .client
        .get(app.url("/ui/js/app.js"))
        .header("If-None-Match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    // Text goes compressed to a client that takes it, brotli before gzip,
    // the same bytes once inflated; GraphiQL's files together in well under
    // half their size.
    let mut sent = (0, 0, 0);
    for file in [
        "graphiql.html",
        "js/graphiql-init.js",
        "vendor/graphiql/graphiql.min.js",
        "vendor/graphiql/graphiql.min.css",
        "vendor/graphiql/react.production.min.js",
        "vendor/graphiql/react-dom.production.min.js",
        "vendor/graphiql/graphql-ws.min.js",
    ] {
        let get = |accepted: Option<&str>| {
            let request = app.client.get(app.url(&format!("/ui/{file}")));
            match accepted {
                Some(accepted) => request.header("Accept-Encoding", accepted),
                None => request,
            }
        };
        let plain = get(None).send().await.unwrap();
        assert_eq!(plain.headers().get("content-encoding"), None, "{file}");
        let plain = plain.bytes().await.unwrap();
        let mut sizes = Vec::new();
        for (accepted, coding) in [("gzip", "gzip"), ("br;q=1, gzip;q=0.8", "br")] {
            let packed = get(Some(accepted)).send().await.unwrap();
            if plain.len() < 1024 {
                // Too small to be worth it.
                assert_eq!(packed.headers().get("content-encoding"), None, "{file}");
                sizes.push(plain.len());
                continue;
            }
            assert_eq!(packed.headers()["content-encoding"], coding, "{file}");
            assert_eq!(packed.headers()["vary"], "accept-encoding", "{file}");
            let packed = packed.bytes().await.unwrap();
            let mut inflated = Vec::new();
            let reader: Box<dyn std::io::Read> = match coding {
                "gzip" => Box::new(flate2::read::GzDecoder::new(&packed[..])),
                _ => Box::new(brotli::Decompressor::new(&packed[..], 4096)),
            };
            std::io::Read::read_to_end(&mut { reader }, &mut inflated).unwrap();
            assert_eq!(inflated, plain, "{file} ({coding})");
            sizes.push(packed.len());
        }
        sent = (sent.0 + plain.len(), sent.1 + sizes[0], sent.2 + sizes[1]);
    }
    // (1,139 KB as they are since the CSS's fonts are files of their own,
    // 1,505 KB before; gzip and brotli send a third of it or less.)
    println!(
        "GraphiQL's files: {} bytes, {} gzipped, {} with brotli",
        sent.0, sent.1, sent.2
    );
    assert!(sent.1 * 3 < sent.0, "gzipped: {sent:?}");
    assert!(sent.2 < sent.1, "brotli smaller than gzip: {sent:?}");
    // Refused by name, even beside `*`; taken through `*`.
    for (accepted, gzipped) in [
        ("gzip;q=0, br;q=0, identity", false),
        ("gzip;q=0, br;q=0, *", false),
        ("br;q=0, *", true),
        ("*", true),
    ] {
        let answer = app
            .client
            .get(app.url("/ui/js/app.js"))
            .header("Accept-Encoding", accepted)
            .send()
            .await
            .unwrap();
        let encoding = answer.headers().get("content-encoding");
        assert_eq!(encoding.is_some(), gzipped, "{accepted}: {encoding:?}");
    }
    assert_eq!(
        app.client
            .get(app.url("/nothing-here"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

/// The console's own code (not the vendored GraphiQL) stays small, counted
/// gzipped: its JavaScript and CSS as one stream (the size of what it says,
/// not of how it is split in files). Comment lines are not counted: the
/// budget is on the code, and the comments that explain it are not traded
/// for room.
#[test]
fn the_consoles_own_code_stays_under_60_kb_gzipped() {
    use std::io::Write;
    let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut raw = 0;
    let mut stack = vec![web.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != web.join("vendor") {
                    stack.push(path);
                }
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("js" | "css")
            ) {
                for line in std::fs::read_to_string(&path).unwrap().lines() {
                    if !line.trim_start().starts_with(['/', '*']) {
                        writeln!(gz, "{line}").unwrap();
                        raw += line.len() + 1;
                    }
                }
            }
        }
    }
    let total = gz.finish().unwrap().len();
    assert!(
        total <= 60 * 1024,
        "web/ without vendor is {total} bytes of code gzipped ({raw} raw)"
    );
}

#[tokio::test]
async fn the_shell_works_by_keyboard_and_fits_420_px() {
    let app = TestApp::spawn().await;
    set_admin_password(&app).await;
    let browser = Browser::open_sized(&app, 420).await;
    assert_eq!(browser.js("return window.innerWidth;").await, json!(420));
    let fits = "document.documentElement.scrollWidth <= 420";
    browser.goto("/").await;
    browser.find("#sign-in").await;
    browser.wait_js("sign-in fits", fits).await;
    // The username field has the focus; Tab moves to the password, Enter
    // sends the form: no mouse.
    let focused = browser
        .js("return document.activeElement.getAttribute('name');")
        .await;
    assert_eq!(focused, json!("username"));
    let active = browser.client.active_element().await.unwrap();
    active
        .send_keys(&format!("admin\u{E004}{PASSWORD}\u{E007}"))
        .await
        .unwrap();
    browser.wait_text("#signed-in-as", "admin").await;
    browser.wait_text("h1", "Overview").await;
    browser.wait_js("the overview fits", fits).await;
    browser.screenshot("overview-narrow").await;
    // Every navigation link is reachable by Tab, in order, after the skip link.
    let order = browser
        .js("return [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')].filter(e => e.tabIndex >= 0).slice(0, 12).map(e => e.textContent.trim());")
        .await;
    assert_eq!(
        order,
        json!([
            "Skip to content",
            "Corbel",
            "Overview",
            "Providers",
            "Repositories",
            "Elements",
            "Blueprints",
            "Deployments",
            "Projects",
            "Users",
            "Audit",
            "GraphQL"
        ])
    );
    browser.goto("/account").await;
    browser.wait_text("h1", "Account").await;
    browser.wait_js("the account page fits", fits).await;
    // What a page logs as an error is kept across page loads, for `close`
    // to fail the test: none so far, then a logged and a thrown error (one
    // thrown by a script WebDriver ran is "Script error.": its text is
    // hidden from the page).
    assert_eq!(browser.console_errors().await, Vec::<String>::new());
    browser
        .js("console.error('logged in the test'); setTimeout(() => { throw new Error('thrown in the test'); });")
        .await;
    let two = "JSON.parse(sessionStorage.getItem('corbel-test-errors') || '[]').length === 2";
    browser.wait_js("both errors are kept", two).await;
    browser.goto("/").await;
    browser.wait_text("h1", "Overview").await;
    let errors = browser.console_errors().await;
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0], "/account: logged in the test", "{errors:?}");
    assert!(errors[1].starts_with("/account: "), "{errors:?}");
    browser.close().await;
}

#[tokio::test]
async fn the_session_cookie_counts_only_from_this_origin() {
    let app = TestApp::spawn().await;
    set_admin_password(&app).await;
    let login = app
        .client
        .post(app.url("/graphql"))
        .json(&json!({ "query": "mutation($p: String!) { login(username: \"admin\", password: $p) { user { username } } }", "variables": { "p": PASSWORD } }))
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let me = |origin: Option<String>| {
        let mut request = app
            .client
            .post(app.url("/graphql"))
            .header("Cookie", cookie.clone())
            .json(&json!({ "query": "{ me { username } }" }));
        if let Some(origin) = origin {
            request = request.header("Origin", origin);
        }
        async move {
            request
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let own = me(Some(app.url(""))).await;
    assert_eq!(own["data"]["me"]["username"], "admin", "{own}");
    let port = app.addr.port() + 1;
    let other = me(Some(format!("http://127.0.0.1:{port}"))).await;
    assert_eq!(
        crate::support::error_code(&other),
        Some("UNAUTHENTICATED"),
        "another port of the same host: {other}"
    );
}
