//! The fetch against real repositories: a bare one made with the git CLI,
//! served from disk, by `git daemon` on loopback, and by a server that never
//! answers.

use super::url_policy::sanitize;
use super::*;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// Runs the git CLI in `dir` with a fixed identity and no user or system config.
fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=Corbel Test",
            "-c",
            "user.email=test@corbel.invalid",
        ])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.file.allow=always",
        ])
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A bare repository `origin.git`: `main` (two commits, annotated tag `v1.0` on the
/// second, lightweight `v0.9` on the first) and `dev` (one commit on top of the first).
struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    work: PathBuf,
    bare: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_owned();
        let (work, bare) = (root.join("work"), root.join("origin.git"));
        git(&root, &["init", "-q", "work"]);
        let fixture = Self {
            _tmp: tmp,
            root,
            work,
            bare,
        };
        fixture.commit("README", "one");
        git(&fixture.work, &["tag", "v0.9"]);
        git(&fixture.work, &["checkout", "-q", "-b", "dev"]);
        fixture.commit("dev.txt", "dev");
        git(&fixture.work, &["checkout", "-q", "main"]);
        fixture.commit("README", "two");
        git(&fixture.work, &["tag", "-a", "v1.0", "-m", "release 1.0"]);
        git(&fixture.root, &["init", "-q", "--bare", "origin.git"]);
        fixture.push();
        fixture
    }

    fn commit(&self, file: &str, content: &str) {
        std::fs::write(self.work.join(file), content).expect("write");
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "-q", "-m", content]);
    }

    fn push(&self) {
        let bare = self.bare.to_str().expect("utf-8 path");
        let refs = ["refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"];
        git(&self.work, &["push", "-q", "-f", bare, refs[0], refs[1]]);
    }

    fn rev(&self, spec: &str) -> String {
        git(&self.bare, &["rev-parse", &format!("{spec}^{{commit}}")])
    }

    fn url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    fn dest(&self, name: &str) -> PathBuf {
        self.root.join("providers").join(name).join("src")
    }
}

fn settings() -> SourceSettings {
    SourceSettings {
        timeout: Duration::from_secs(60),
        ..SourceSettings::default()
    }
}

async fn fetch_ok(url: &str, reference: &str, dest: &Path) -> Fetched {
    match fetch(url, reference, dest, &settings(), |_| {}).await {
        Ok(fetched) => fetched,
        Err(e) => panic!("fetch {url} at `{reference}` failed: {e}"),
    }
}

/// Asserts that `dest` has `commit` checked out, detached, with a clean tree.
fn assert_checked_out(dest: &Path, commit: &str) {
    assert_eq!(git(dest, &["rev-parse", "HEAD"]), commit);
    let symbolic = Command::new("git")
        .arg("-C")
        .arg(dest)
        .args(["symbolic-ref", "-q", "HEAD"])
        .status()
        .expect("git runs");
    assert!(!symbolic.success(), "HEAD should be detached");
    assert_eq!(git(dest, &["status", "--porcelain"]), "");
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[tokio::test]
async fn clones_tags_branches_commits_and_the_default_branch() {
    let f = Fixture::new();
    let main = f.rev("main");
    let dev = f.rev("dev");
    let cases = [
        ("v1.0", f.rev("v1.0"), "tag v1.0".to_owned()),
        ("v0.9", f.rev("v0.9"), "tag v0.9".to_owned()),
        ("refs/tags/v1.0", f.rev("v1.0"), "tag v1.0".to_owned()),
        ("dev", dev.clone(), "branch dev".to_owned()),
        ("refs/heads/dev", dev.clone(), "branch dev".to_owned()),
        (main.as_str(), main.clone(), format!("commit {main}")),
        (&dev[..8], dev.clone(), format!("commit {dev}")),
        ("", main.clone(), "default branch main".to_owned()),
    ];
    for (i, (reference, commit, described)) in cases.into_iter().enumerate() {
        let dest = f.dest(&format!("case{i}"));
        let fetched = fetch_ok(&f.url(), reference, &dest).await;
        assert_eq!(fetched.commit, commit, "reference `{reference}`");
        assert_eq!(fetched.reference, described);
        assert_checked_out(&dest, &commit);
    }
    // The default branch is the remote's HEAD, not a guess.
    git(&f.bare, &["symbolic-ref", "HEAD", "refs/heads/dev"]);
    let fetched = fetch_ok(&f.url(), "", &f.dest("default-dev")).await;
    assert_eq!(fetched.commit, dev);
    assert_eq!(fetched.reference, "default branch dev");
}

#[tokio::test]
async fn fetches_again_into_the_same_directory() {
    let f = Fixture::new();
    let dest = f.dest("again");
    // A half-made directory that is not a repository is replaced.
    std::fs::create_dir_all(&dest).expect("mkdir");
    std::fs::write(dest.join("junk"), "x").expect("write");

    let first = fetch_ok(&f.url(), "main", &dest).await;
    assert_eq!(first.commit, f.rev("main"));
    assert!(!dest.join("junk").exists());

    f.commit("README", "three");
    f.push();
    std::fs::write(dest.join("README"), "local edit").expect("write");
    std::fs::write(dest.join("stray.txt"), "untracked").expect("write");
    let second = fetch_ok(&f.url(), "main", &dest).await;
    assert_eq!(second.commit, f.rev("main"));
    assert_ne!(second.commit, first.commit);
    assert_checked_out(&dest, &second.commit);
    assert_eq!(
        std::fs::read_to_string(dest.join("README")).ok().as_deref(),
        Some("three")
    );
    assert!(!dest.join("stray.txt").exists());

    let tag = fetch_ok(&f.url(), "v1.0", &dest).await;
    assert_eq!(tag.commit, f.rev("v1.0"));
    let branch = fetch_ok(&f.url(), "dev", &dest).await;
    assert_eq!(branch.commit, f.rev("dev"));
    assert_checked_out(&dest, &branch.commit);
    assert!(dest.join("dev.txt").exists());

    // A plain path (the same repository) works too, as does a moved branch.
    let plain = f.bare.to_str().expect("utf-8 path");
    let again = fetch_ok(plain, "refs/tags/v0.9", &dest).await;
    assert_eq!(again.commit, f.rev("v0.9"));
    assert!(!dest.join("dev.txt").exists());
}

#[tokio::test]
async fn missing_reference_is_named_with_what_exists() {
    let f = Fixture::new();
    for reference in ["nope", "refs/tags/v9", "deadbeef00"] {
        let error = fetch(&f.url(), reference, &f.dest("missing"), &settings(), |_| {})
            .await
            .expect_err("missing ref");
        let SourceError::RefNotFound {
            reference: named,
            branches,
            tags,
            ..
        } = &error
        else {
            panic!("expected RefNotFound, got {error:?}");
        };
        assert_eq!(named, reference);
        assert_eq!(branches, &["dev", "main"]);
        assert_eq!(tags, &["v0.9", "v1.0"]);
        let message = error.to_string();
        assert!(message.contains(&format!("`{reference}`")), "{message}");
        assert!(
            message.contains("branches: dev, main; tags: v0.9, v1.0"),
            "{message}"
        );
    }
    let error = fetch(&f.url(), "-x", &f.dest("m2"), &settings(), |_| {}).await;
    assert!(matches!(error, Err(SourceError::InvalidReference { .. })));
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn git_daemon_on_loopback_with_progress() {
    let f = Fixture::new();
    let port = closed_port();
    let root = f.root.to_str().expect("utf-8 path");
    let child = Command::new("git")
        .arg("daemon")
        .args(["--reuseaddr", "--export-all", "--listen=127.0.0.1"])
        .arg(format!("--port={port}"))
        .arg(format!("--base-path={root}"))
        .arg(root)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("git daemon starts");
    let _daemon = Daemon(child);
    wait_until("git daemon", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorder = seen.clone();
    let url = format!("git://127.0.0.1:{port}/origin.git");
    let fetched = fetch(&url, "v1.0", &f.dest("daemon"), &settings(), move |p| {
        recorder.lock().expect("lock").push(p);
    })
    .await
    .expect("fetch over git://");
    assert_eq!(fetched.commit, f.rev("v1.0"));

    let seen = seen.lock().expect("lock");
    assert_eq!(seen.first(), Some(&Progress::Connecting));
    assert_eq!(seen.last(), Some(&Progress::CheckingOut));
    let last_receiving = seen.iter().rev().find_map(|p| match p {
        Progress::Receiving {
            received_objects,
            total_objects,
            received_bytes,
        } => Some((*received_objects, *total_objects, *received_bytes)),
        _ => None,
    });
    let (received, total, bytes) = last_receiving.expect("receiving progress reported");
    assert!(total > 0 && received == total && bytes > 0, "{seen:?}");
}

#[tokio::test]
async fn closed_port_is_unreachable() {
    let dest = tempfile::tempdir().expect("tempdir");
    let url = format!("git://127.0.0.1:{}/x", closed_port());
    let error = fetch(&url, "", &dest.path().join("src"), &settings(), |_| {})
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(error, SourceError::Unreachable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains(&url), "{error}");

    // A missing local repository is named as such, before libgit2 would
    // call it an unsupported protocol: as a URL and as a path.
    let missing = dest.path().join("none.git");
    for url in [
        format!("file://{}", missing.display()),
        missing.display().to_string(),
    ] {
        let error = fetch(&url, "", &dest.path().join("src"), &settings(), |_| {})
            .await
            .expect_err("no repository");
        assert!(
            matches!(&error, SourceError::NoLocalRepository { path, .. } if *path == missing),
            "{error:?}"
        );
        assert!(error.to_string().contains("it does not exist"), "{error}");
    }
}

#[tokio::test]
async fn silent_server_times_out_promptly() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (release, released) = std::sync::mpsc::channel::<()>();
    // Accepts, never answers, and hangs up only when told to.
    std::thread::spawn(move || {
        let connection = listener.accept();
        let _ = released.recv_timeout(Duration::from_secs(60));
        drop(connection);
    });

    let dest = tempfile::tempdir().expect("tempdir");
    let url = format!("git://127.0.0.1:{port}/x");
    let quick = SourceSettings {
        timeout: Duration::from_secs(2),
        ..SourceSettings::default()
    };
    let started = Instant::now();
    let result = fetch(&url, "", &dest.path().join("src"), &quick, |_| {}).await;
    let elapsed = started.elapsed();
    // Lets the abandoned git thread see EOF, so the runtime can shut down.
    let _ = release.send(());
    let error = result.expect_err("the server never answers");
    assert!(
        matches!(&error, SourceError::Timeout { after, .. } if *after == quick.timeout),
        "{error:?}"
    );
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    assert_eq!(
        error.to_string(),
        format!("fetching {url} timed out after 2s")
    );
}

#[test]
fn schemes_are_checked() {
    let all = SourceSettings::default();
    for ok in [
        "https://example.com/a.git",
        "http://example.com/a.git",
        "git://127.0.0.1:9418/a",
        "ssh://git@example.com/a.git",
        "git+ssh://example.com/a.git",
        "git@example.com:org/a.git",
        "file:///srv/a.git",
        "/srv/a.git",
        "../a.git",
        "a.git",
    ] {
        assert!(check_url(ok, &all).is_ok(), "{ok} should be allowed");
    }
    for (url, scheme) in [
        ("ext::sh -c touch% /tmp/pwned", "ext"),
        ("fd::3", "fd"),
        ("ftp://example.com/a.git", "ftp"),
        ("transport+x::whatever", "transport+x"),
    ] {
        match check_url(url, &all) {
            Err(SourceError::SchemeRefused { scheme: s, .. }) => assert_eq!(s, scheme),
            other => panic!("{url}: expected SchemeRefused, got {other:?}"),
        }
    }
    // Helpers stay refused even when listed.
    let listed = SourceSettings {
        allowed_schemes: vec!["ext".into(), "git".into()],
        ..SourceSettings::default()
    };
    let error = check_url("ext::sh -c id", &listed).expect_err("helper");
    assert_eq!(
        error.to_string(),
        "git URL scheme `ext` is not allowed (allowed: git)"
    );

    let no_https = SourceSettings {
        allowed_schemes: vec!["git".into(), "file".into()],
        ..SourceSettings::default()
    };
    let error = check_url("https://user:hunter22@example.com/a.git", &no_https)
        .expect_err("https not listed");
    assert_eq!(
        error.to_string(),
        "git URL scheme `https` is not allowed (allowed: git, file)"
    );
    assert!(check_url("git@example.com:a.git", &no_https).is_err());

    for bad in [
        "",
        "  ",
        "https://exa\nmple.com/a",
        "-oProxyCommand=x",
        "https:///a",
    ] {
        assert!(
            matches!(check_url(bad, &all), Err(SourceError::InvalidUrl { .. })),
            "{bad:?} should be invalid"
        );
    }
}

#[tokio::test]
async fn refused_scheme_is_refused_before_any_io() {
    let dest = tempfile::tempdir().expect("tempdir");
    let target = dest.path().join("src");
    let error = fetch(
        "ext::sh -c touch% /tmp/pwned",
        "",
        &target,
        &settings(),
        |_| {},
    )
    .await
    .expect_err("refused");
    assert!(matches!(error, SourceError::SchemeRefused { .. }));
    assert!(!target.exists());
}

#[test]
fn urls_are_shown_without_credentials() {
    assert_eq!(
        display_url("https://user:hunter22@example.com/a.git"),
        "https://***@example.com/a.git"
    );
    assert_eq!(
        display_url("https://TOKEN@example.com/a@b.git"),
        "https://***@example.com/a@b.git"
    );
    assert_eq!(
        display_url("git@example.com:org/a.git"),
        "git@example.com:org/a.git"
    );
    assert_eq!(
        display_url("git:pw1234@example.com:org/a.git"),
        "git:***@example.com:org/a.git"
    );
    assert_eq!(display_url("/srv/a@b/repo"), "/srv/a@b/repo");
    assert_eq!(display_url("https://x\n/a"), "https://x\\n/a");
    let url = "https://user:hunter22@example.com/a.git";
    let message = sanitize(&format!("failed to reach {url} as user:hunter22"), url);
    assert!(!message.contains("hunter22"), "{message}");
}

#[tokio::test]
async fn submodules_only_when_asked() {
    let f = Fixture::new();
    let lib = f.root.join("lib-work");
    git(&f.root, &["init", "-q", "lib-work"]);
    std::fs::write(lib.join("lib.txt"), "lib").expect("write");
    git(&lib, &["add", "-A"]);
    git(&lib, &["commit", "-q", "-m", "lib"]);
    git(&f.work, &["checkout", "-q", "-b", "with-lib"]);
    let lib_path = lib.to_str().expect("utf-8 path");
    git(&f.work, &["submodule", "add", "-q", lib_path, "lib"]);
    git(&f.work, &["commit", "-q", "-m", "add lib"]);
    f.push();

    let without = f.dest("without");
    fetch_ok(&f.url(), "with-lib", &without).await;
    assert!(!without.join("lib/lib.txt").exists());

    let with = f.dest("with");
    let enabled = SourceSettings {
        submodules: true,
        ..settings()
    };
    fetch(&f.url(), "with-lib", &with, &enabled, |_| {})
        .await
        .expect("fetch with submodules");
    assert_eq!(
        std::fs::read_to_string(with.join("lib/lib.txt"))
            .ok()
            .as_deref(),
        Some("lib")
    );

    // A submodule URL is held to the same scheme list.
    let no_file = SourceSettings {
        allowed_schemes: vec!["file".into()],
        submodules: true,
        ..settings()
    };
    git(
        &f.work,
        &[
            "config",
            "-f",
            ".gitmodules",
            "submodule.lib.url",
            "ext::sh -c id",
        ],
    );
    git(&f.work, &["commit", "-q", "-am", "evil"]);
    f.push();
    let error = fetch(&f.url(), "with-lib", &f.dest("evil"), &no_file, |_| {})
        .await
        .expect_err("ext:: submodule");
    assert!(matches!(error, SourceError::Submodule { .. }), "{error:?}");
    assert!(
        error.to_string().contains("`ext` is not allowed"),
        "{error}"
    );
}
