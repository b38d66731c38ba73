//! Parsing and loading `corbel-provider.yaml`: what each runtime reads as, and
//! every error naming its field.

use super::*;

const SHELL: &str = "\
name: process
description: Runs resources as local processes
version: 0.1.0
author: someone
runtime: shell
shell:
  build: cargo build --release
  run: target/release/corbel-provider-process
features: [deploy, destroy, inspect, nodes]
resource_types: [process.v1.service]
";

fn error(text: &str) -> String {
    match parse(text) {
        Ok(metadata) => panic!("expected an error, parsed {metadata:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn parses_a_shell_provider() {
    let metadata = parse(SHELL).expect("valid");
    assert_eq!(
        metadata,
        Metadata {
            name: "process".into(),
            description: "Runs resources as local processes".into(),
            version: "0.1.0".into(),
            author: Some("someone".into()),
            runtime: Runtime::Shell {
                build: Some("cargo build --release".into()),
                run: "target/release/corbel-provider-process".into(),
            },
            features: ["deploy", "destroy", "inspect", "nodes"]
                .map(String::from)
                .to_vec(),
            resource_types: vec!["process.v1.service".into()],
            check: Check::default(),
        }
    );
}

#[test]
fn parses_a_docker_provider_with_defaults() {
    let text = "name: docker\nversion: 1.2.0\nruntime: docker\n\
                shell:\n  run: ignored\nfeatures: [deploy, teleport]\n";
    let metadata = parse(text).expect("valid");
    assert_eq!(
        metadata.runtime,
        Runtime::Docker(DockerSpec {
            dockerfile: "Dockerfile".into(),
            context: ".".into(),
            build_args: Default::default(),
            command: None,
            memory: None,
            nano_cpus: None,
        })
    );
    assert_eq!(metadata.author, None);
    assert_eq!(metadata.description, "");
    // An unknown feature is kept for a newer provider, not refused.
    assert_eq!(metadata.features, ["deploy", "teleport"]);
    assert!(metadata.resource_types.is_empty());

    let text = "name: d\nversion: '1'\nruntime: docker\n\
                docker: {dockerfile: build/Containerfile, context: build}\n";
    assert_eq!(
        parse(text).expect("valid").runtime,
        Runtime::Docker(DockerSpec {
            dockerfile: "build/Containerfile".into(),
            context: "build".into(),
            build_args: Default::default(),
            command: None,
            memory: None,
            nano_cpus: None,
        })
    );

    let text = "name: d\nversion: '1'\nruntime: docker\ndocker:\n  \
                build_args: {PROFILE: release}\n  command: [/provider, --quiet]\n  \
                limits: {memory: 256m, cpus: 1.5}\n";
    assert_eq!(
        parse(text).expect("valid").runtime,
        Runtime::Docker(DockerSpec {
            dockerfile: "Dockerfile".into(),
            context: ".".into(),
            build_args: [("PROFILE".to_owned(), "release".to_owned())].into(),
            command: Some(vec!["/provider".into(), "--quiet".into()]),
            memory: Some(256 * 1024 * 1024),
            nano_cpus: Some(1_500_000_000),
        })
    );
}

#[test]
fn check_updates_name_a_sampled_type_and_a_mapping() {
    let with = |check: &str| {
        format!(
            "name: p\nversion: '1'\nruntime: shell\nshell: {{run: x}}\n\
             resource_types: [a.v1.x, a.v1.y]\ncheck:\n{check}"
        )
    };
    let parsed = parse(&with(
        "  resources: {a.v1.x: {n: 1}}\n  updates: {a.v1.x: {n: 2}}\n",
    ))
    .unwrap();
    assert_eq!(parsed.check.updates["a.v1.x"], serde_json::json!({"n": 2}));
    for (check, expected) in [
        (
            "  resources: {a.v1.x: {}}\n  updates: {a.v1.y: {n: 2}}\n",
            "check.updates.a.v1.y: has no sample under check.resources",
        ),
        (
            "  resources: {a.v1.x: {}}\n  updates: {a.v1.x: 2}\n",
            "check.updates.a.v1.x: must be a mapping",
        ),
    ] {
        let message = error(&with(check));
        assert!(message.contains(expected), "{check}: {message}");
    }
}

#[test]
fn check_kill_names_a_sampled_type_and_a_command() {
    let with = |check: &str| {
        format!(
            "name: p\nversion: '1'\nruntime: shell\nshell: {{run: x}}\n\
             resource_types: [a.v1.x, a.v1.y]\ncheck:\n{check}"
        )
    };
    let parsed = parse(&with(
        "  resources: {a.v1.x: {n: 1}}\n  kill: {a.v1.x: 'rm \"$CORBEL_OUTPUT_PATH\"'}\n",
    ))
    .unwrap();
    assert_eq!(parsed.check.kill["a.v1.x"], "rm \"$CORBEL_OUTPUT_PATH\"");
    for (check, expected) in [
        (
            "  resources: {a.v1.x: {}}\n  kill: {a.v1.y: 'kill 1'}\n",
            "check.kill.a.v1.y: has no sample under check.resources",
        ),
        (
            "  resources: {a.v1.x: {}}\n  kill: {a.v1.x: ' '}\n",
            "check.kill.a.v1.x: is empty",
        ),
    ] {
        let message = error(&with(check));
        assert!(message.contains(expected), "{check}: {message}");
    }
}

#[test]
fn docker_limits_are_checked() {
    let with = |limits: &str| {
        format!("name: d\nversion: '1'\nruntime: docker\ndocker:\n  limits: {limits}\n")
    };
    let memory = |text: &str| match parse(text).map(|m| m.runtime) {
        Ok(Runtime::Docker(spec)) => Ok(spec.memory),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.to_string()),
    };
    assert_eq!(memory(&with("{memory: 8388608}")), Ok(Some(8 << 20)));
    assert_eq!(memory(&with("{memory: 1G}")), Ok(Some(1 << 30)));
    assert_eq!(memory(&with("{memory: 512MiB}")), Ok(Some(512 << 20)));
    for (limits, expected) in [
        ("{memory: 1m}", "docker.limits.memory: must be at least 6m"),
        (
            "{memory: 12t}",
            "docker.limits.memory: `12t`: the unit must be",
        ),
        (
            "{memory: lots}",
            "docker.limits.memory: `lots`: the unit must be",
        ),
        ("{cpus: 0}", "docker.limits.cpus: `0` must be more than 0"),
        ("{cpus: -1}", "docker.limits.cpus: `-1` must be more than 0"),
        ("{swap: 1}", "docker.limits.swap: unknown field `swap`"),
    ] {
        let message = memory(&with(limits)).unwrap_err();
        assert!(message.contains(expected), "{limits}: {message}");
    }
    let empty = "name: d\nversion: '1'\nruntime: docker\ndocker: {command: []}\n";
    assert!(error(empty).contains("docker.command: must name a program"));
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            "- a\n".to_owned(),
            "corbel-provider.yaml: invalid type: sequence, expected a mapping with name",
        ),
        (
            SHELL.replace("author:", "autor:"),
            "corbel-provider.yaml: autor: unknown field `autor`, expected one of `name`",
        ),
        (
            SHELL.replace(
                "  run: target/release/corbel-provider-process",
                "  run: [a, b]",
            ),
            "corbel-provider.yaml: shell.run: invalid type: sequence, expected a string",
        ),
        (
            SHELL.replace("  build:", "  biuld:"),
            "corbel-provider.yaml: shell.biuld: unknown field `biuld`",
        ),
        (
            SHELL.replace("version: 0.1.0\n", ""),
            "corbel-provider.yaml: missing field `version`",
        ),
        (
            SHELL.replace("name: process", "name: my provider"),
            "corbel-provider.yaml: name: `my provider` may only contain",
        ),
        (
            SHELL.replace("name: process", "name: ''"),
            "corbel-provider.yaml: name: must not be empty",
        ),
        (
            SHELL.replace("name: process", &format!("name: {}", "x".repeat(65))),
            "corbel-provider.yaml: name: must be at most 64 characters",
        ),
        (
            SHELL.replace("version: 0.1.0", "version: ''"),
            "corbel-provider.yaml: version: must not be empty",
        ),
        (
            SHELL.replace("  run: target/release/corbel-provider-process\n", ""),
            "corbel-provider.yaml: shell.run: must not be empty",
        ),
        (
            "name: a\nversion: '1'\nruntime: shell\n".to_owned(),
            "corbel-provider.yaml: shell: is required when runtime is `shell`",
        ),
        (
            SHELL.replace("runtime: shell", "runtime: podman"),
            "corbel-provider.yaml: runtime: unknown runtime `podman` (expected one of: shell, docker, remote)",
        ),
        (
            SHELL.replace("[deploy, destroy", "[deploy, ''"),
            "corbel-provider.yaml: features[1]: must not be empty",
        ),
        (
            SHELL.replace("[process.v1.service]", "[ok, 'a b']"),
            "corbel-provider.yaml: resource_types[1]: `a b` must be non-empty and without whitespace",
        ),
        (
            "name: d\nversion: '1'\nruntime: docker\ndocker: {context: ../..}\n".to_owned(),
            "corbel-provider.yaml: docker.context: `../..` must be a relative path",
        ),
    ];
    for (text, expected) in cases {
        let message = error(&text);
        assert!(
            message.starts_with(expected),
            "got: {message}\nwanted: {expected}"
        );
    }
    // Wrong types carry the YAML position.
    let message = error(&SHELL.replace(
        "  run: target/release/corbel-provider-process",
        "  run: [a, b]",
    ));
    assert!(message.contains("line 8"), "{message}");
}

#[test]
fn alias_bomb_is_refused_quickly() {
    let mut text = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for level in b'b'..=b'i' {
        let previous = (level - 1) as char;
        let level = level as char;
        let refs = vec![format!("*{previous}"); 9].join(",");
        text.push_str(&format!("{level}: &{level} [{refs}]\n"));
    }
    text.push_str("features: *i\n");
    let started = std::time::Instant::now();
    let message = error(&text);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(message.starts_with("corbel-provider.yaml: "), "{message}");
    // It is a real bomb: expanded in full, serde_yaml_ng stops it.
    let expanded = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text);
    let expanded = expanded.expect_err("repetition limit").to_string();
    assert!(expanded.contains("repetition limit exceeded"), "{expanded}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn load_reads_the_file_from_a_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let error = load(dir.path()).expect_err("missing");
    assert!(matches!(error, MetadataError::Missing { .. }));
    assert_eq!(
        error.to_string(),
        format!("corbel-provider.yaml not found in {}", dir.path().display())
    );

    std::fs::write(dir.path().join(FILE_NAME), SHELL).expect("write");
    assert_eq!(load(dir.path()).expect("valid").name, "process");

    let big = format!("{SHELL}#{}\n", "x".repeat(MAX_SIZE as usize));
    std::fs::write(dir.path().join(FILE_NAME), big).expect("write");
    assert!(matches!(
        load(dir.path()),
        Err(MetadataError::TooLarge { .. })
    ));

    let other = tempfile::tempdir().expect("tempdir");
    std::fs::remove_file(dir.path().join(FILE_NAME)).expect("rm");
    std::fs::write(other.path().join("secret"), SHELL).expect("write");
    std::os::unix::fs::symlink(other.path().join("secret"), dir.path().join(FILE_NAME))
        .expect("symlink");
    assert!(matches!(
        load(dir.path()),
        Err(MetadataError::NotAFile { .. })
    ));
}
