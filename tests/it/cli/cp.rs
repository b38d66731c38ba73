//! `corbel cp`: a directory tree into a resource and back, byte for byte.

use super::Cli;
use crate::exec::deployed_app;

fn tree(root: &std::path::Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::write(root.join("a.txt"), "alpha\n").unwrap();
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("sub/b.bin"), bytes).unwrap();
    std::fs::write(root.join("sub/deeper/c.txt"), "").unwrap();
}

/// Each file under `root` with its bytes, and each directory, sorted.
fn contents(root: &std::path::Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            if path.is_dir() {
                out.push((name, None));
                stack.push(path);
            } else {
                out.push((name, Some(std::fs::read(&path).unwrap())));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn cp_copies_a_directory_tree_in_and_out_byte_for_byte() {
    let cwd = tempfile::tempdir().unwrap();
    let (app, _, _) = deployed_app(cwd.path()).await;
    let cli = Cli::admin(format!("http://{}", app.addr));
    let local = tempfile::tempdir().unwrap();
    let site = local.path().join("site");
    tree(&site);

    let ran = cli
        .run(&["cp", site.to_str().unwrap(), "shell-1:app:."])
        .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.contains("bytes copied into"), "{ran:?}");
    assert_eq!(contents(&cwd.path().join("site")), contents(&site));

    let back = local.path().join("back");
    let ran = cli
        .run(&["cp", "shell-1:app:site", back.to_str().unwrap()])
        .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(contents(&back.join("site")), contents(&site));

    // A single file, and a refusal with the API's code.
    let ran = cli
        .run(&[
            "cp",
            site.join("a.txt").to_str().unwrap(),
            "shell-1:app:site/sub",
        ])
        .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(
        std::fs::read(cwd.path().join("site/sub/a.txt")).unwrap(),
        b"alpha\n"
    );
    let ran = cli
        .run(&["cp", "shell-1:app:no-such", back.to_str().unwrap()])
        .await;
    assert_eq!(ran.code, 4, "NOT_FOUND: {ran:?}");
}
