//! Real headless Chromium driven through WebDriver (Debian's `chromedriver`,
//! `fantoccini`), with the network limited to loopback: every name resolves
//! to nothing but `127.0.0.1`/`localhost`, and anything else goes to a proxy
//! that is not there. Pages are waited for by condition with a deadline, never
//! by sleeping; screenshots go to `target/screenshots/`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::TestApp;

/// How long a page gets to show what a step waits for.
pub const WAIT: Duration = Duration::from_secs(30);

/// The admin's password in browser tests (set with the admin token).
pub const PASSWORD: &str = "console-password-1";

pub struct Browser {
    pub client: Client,
    pub base: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn installed(candidates: &[&str]) -> PathBuf {
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("one of {candidates:?} is installed (scripts/test.sh installs it)")
        })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Browser {
    /// Chromium at `width`×900 pointed at `app`, not signed in.
    pub async fn open(app: &TestApp) -> Browser {
        Self::open_sized(app, 1280).await
    }

    pub async fn open_sized(app: &TestApp, width: u32) -> Browser {
        let chromium = installed(&["/usr/bin/chromium", "/usr/bin/chromium-browser"]);
        let chromedriver = installed(&["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]);
        let port = free_port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().expect("a profile directory");
        let caps = json!({
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-features=Translate,OptimizationHints,MediaRouter",
                    format!("--window-size={width},900"),
                    format!("--user-data-dir={}", profile.path().display()),
                    // Loopback only: names other than localhost resolve to
                    // nothing, and what is not loopback goes to a dead proxy.
                    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
                    // (Chromium never sends loopback through a proxy.)
                    "--proxy-server=http://127.0.0.1:9",
                ],
            }
        });
        let caps = match caps {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + WAIT;
        let client = loop {
            // chromedriver is on loopback over plain HTTP: no TLS stack.
            let mut builder = ClientBuilder::new(HttpConnector::new());
            builder.capabilities(caps.clone());
            match builder.connect(&url).await {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("chromedriver not ready: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("chromedriver at {url} did not start a session: {e}"),
            }
        };
        if width < 500 {
            // Chromium's window is never narrower than 500 px: a narrower
            // screen is emulated through the DevTools protocol.
            client
                .issue_cmd(Cdp(json!({
                    "cmd": "Emulation.setDeviceMetricsOverride",
                    "params": { "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": false },
                })))
                .await
                .expect("a narrow screen is emulated");
        }
        // Every page records its uncaught errors, unhandled rejections and
        // console.error calls (in sessionStorage: they outlive a page load);
        // `close` fails the test on any.
        client
            .issue_cmd(Cdp(json!({
                "cmd": "Page.addScriptToEvaluateOnNewDocument",
                "params": { "source": RECORD_ERRORS },
            })))
            .await
            .expect("the error recorder is installed");
        Browser {
            client,
            base: app.url(""),
            driver,
            _profile: profile,
        }
    }

    /// Sets the admin's password with the admin token (once per app), opens
    /// sign-in and signs in through the form. Ends on the overview.
    pub async fn sign_in(app: &TestApp) -> Browser {
        set_admin_password(app).await;
        let browser = Self::open(app).await;
        browser.sign_in_as("admin", PASSWORD).await;
        browser
    }

    pub async fn sign_in_as(&self, username: &str, password: &str) {
        self.goto("/sign-in").await;
        self.fill("#sign-in [name=username]", username).await;
        self.fill("#sign-in [name=password]", password).await;
        self.click("#sign-in button[type=submit]").await;
        self.wait_text("#signed-in-as", username).await;
    }

    pub async fn goto(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.base))
            .await
            .unwrap_or_else(|e| panic!("opening {path}: {e}"));
    }

    /// The page's path and query now.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("a current URL");
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// The first element matching `css`, waiting for it to be there.
    pub async fn find(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(WAIT)
            .every(Duration::from_millis(25))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no `{css}` on {} within {WAIT:?}: {e}", self.base))
    }

    /// Every element matching `css` now (none is not an error).
    pub async fn all(&self, css: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_default()
    }

    /// Clicks the element at `css` (see [`Self::on_live`]).
    pub async fn click(&self, css: &str) {
        self.on_live(css, "clicking", async |el| el.click().await.map(drop))
            .await
    }

    /// Runs `act` on the element at `css`. A page that redraws a part live (a
    /// node's panel on each event, a list row on each status) may replace the
    /// element between finding it and acting on it: then the new one is found
    /// and `act` runs again.
    async fn on_live<T>(
        &self,
        css: &str,
        what: &str,
        act: impl AsyncFn(Element) -> Result<T, fantoccini::error::CmdError>,
    ) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            match act(self.find(css).await).await {
                Ok(value) => return value,
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference
                        && Instant::now() < deadline => {}
                Err(e) => panic!("{what} `{css}`: {e}"),
            }
        }
    }

    /// Clears the input or textarea at `css` and types `text`.
    pub async fn fill(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        el.clear().await.ok();
        el.send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("typing into `{css}`: {e}"));
    }

    /// Sets a field's value at once (long texts: a blueprint, JSON) and fires
    /// `input` and `change` as typing would.
    pub async fn set_value(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        self.client
            .execute(
                "arguments[0].value = arguments[1];
                 arguments[0].dispatchEvent(new Event('input', { bubbles: true }));
                 arguments[0].dispatchEvent(new Event('change', { bubbles: true }));",
                vec![
                    serde_json::to_value(&el).expect("element as JSON"),
                    json!(text),
                ],
            )
            .await
            .unwrap_or_else(|e| panic!("setting `{css}`: {e}"));
    }

    /// Chooses the `<option>` with `value` in the select at `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.find(css)
            .await
            .select_by_value(value)
            .await
            .unwrap_or_else(|e| panic!("choosing `{value}` in `{css}`: {e}"));
    }

    /// The text of the first `css` element (waiting for it).
    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.unwrap_or_default()
    }

    /// `css`'s attribute `name` now (see [`Self::on_live`]).
    pub async fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.on_live(css, &format!("reading {name} of"), async |el| {
            el.attr(name).await
        })
        .await
    }

    /// Waits until the text of some `css` element contains `want`; returns it.
    pub async fn wait_text(&self, css: &str, want: &str) -> String {
        let deadline = Instant::now() + WAIT;
        let mut last = Vec::new();
        loop {
            last.clear();
            for el in self.all(css).await {
                let text = el.text().await.unwrap_or_default();
                if text.contains(want) {
                    return text;
                }
                last.push(text);
            }
            if Instant::now() > deadline {
                self.screenshot("failed-wait").await;
                panic!("no `{css}` containing {want:?} within {WAIT:?}; saw {last:?}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until the `attr` of the first `css` element is `want`.
    pub async fn wait_attr(&self, css: &str, attr: &str, want: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let now = match self.client.find(Locator::Css(css)).await {
                Ok(el) => el.attr(attr).await.ok().flatten(),
                Err(_) => None,
            };
            if now.as_deref() == Some(want) {
                return;
            }
            if Instant::now() > deadline {
                self.screenshot("failed-wait").await;
                panic!("`{css}` has {attr}={now:?}, not {want:?}, after {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until `script` (a JavaScript expression) is true in the page.
    pub async fn wait_js(&self, what: &str, script: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let value = self
                .client
                .execute(&format!("return !!({script});"), vec![])
                .await;
            if let Ok(Value::Bool(true)) = value {
                return;
            }
            if Instant::now() > deadline {
                self.screenshot("failed-wait").await;
                panic!("{what}: `{script}` was not true within {WAIT:?} (last: {value:?})");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("running `{script}`: {e}"))
    }

    /// Every URL the page has loaded or fetched that is not on this server.
    pub async fn foreign_requests(&self) -> Vec<String> {
        let value = self
            .js("return performance.getEntriesByType('resource').map(e => e.name).concat([location.href]);")
            .await;
        let urls: Vec<String> = serde_json::from_value(value).unwrap_or_default();
        let origin = self.base.trim_end_matches('/').to_owned();
        let ws = origin.replacen("http://", "ws://", 1);
        urls.into_iter()
            .filter(|u| !u.starts_with(&origin) && !u.starts_with(&ws))
            .collect()
    }

    /// Saves a PNG of the page as `target/screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let dir = screenshots_dir();
        std::fs::create_dir_all(&dir).ok();
        let path = dir.join(format!("{name}.png"));
        if let Ok(png) = self.client.screenshot().await {
            std::fs::write(&path, png).ok();
        }
        path
    }

    /// The console errors recorded so far (uncaught errors, unhandled
    /// rejections, `console.error`), each with its page's path; forgotten
    /// once read.
    pub async fn console_errors(&self) -> Vec<String> {
        let read = self
            .client
            .execute(
                "try { const all = JSON.parse(sessionStorage.getItem('corbel-test-errors') || '[]'); \
                 sessionStorage.removeItem('corbel-test-errors'); return all; } catch (e) { return []; }",
                vec![],
            )
            .await;
        read.ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default()
    }

    /// Closes the browser; fails the test if a page it visited logged an
    /// error (read it first with [`Self::console_errors`] where one is meant).
    pub async fn close(mut self) {
        let errors = self.console_errors().await;
        self.client.clone().close().await.ok();
        self.driver.kill().await.ok();
        assert!(errors.is_empty(), "the pages logged errors: {errors:#?}");
    }
}

/// Run before each page's own scripts: keeps what the page logs as an error.
const RECORD_ERRORS: &str = r#"(() => {
  const key = "corbel-test-errors";
  const keep = (text) => {
    try {
      const all = JSON.parse(sessionStorage.getItem(key) || "[]");
      all.push(`${location.pathname}: ${text}`);
      sessionStorage.setItem(key, JSON.stringify(all));
    } catch {}
  };
  addEventListener("error", (e) => keep(`${e.message} (${e.filename}:${e.lineno})`));
  addEventListener("unhandledrejection", (e) => keep(`unhandled rejection: ${e.reason?.stack ?? e.reason}`));
  const error = console.error.bind(console);
  console.error = (...args) => { keep(args.map(String).join(" ")); error(...args); };
})();"#;

/// A DevTools protocol command through chromedriver's `goog/cdp/execute`.
#[derive(Debug)]
struct Cdp(Value);

impl WebDriverCompatibleCommand for Cdp {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!(
            "session/{}/goog/cdp/execute",
            session.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.0.to_string()))
    }
}

/// `target/screenshots` of this workspace (or of `CARGO_TARGET_DIR`).
pub fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("screenshots")
}

/// Gives the admin a password (with the admin token) unless it has one.
pub async fn set_admin_password(app: &TestApp) {
    let me = app.gql("{ me { hasPassword } }", json!({})).await;
    if me["data"]["me"]["hasPassword"] == json!(true) {
        return;
    }
    let body = app
        .gql(
            "mutation($p: String!) { setPassword(newPassword: $p) }",
            json!({ "p": PASSWORD }),
        )
        .await;
    super::data(&body);
}
