//! Each broker's client crate is linked by its own folder of
//! `host/src/broker/` only, so the rest of outboxd sees the `Publisher` and
//! `MessageSource` traits and a new broker is a folder, not edits across
//! the tree.

use std::path::{Path, PathBuf};

/// (the crate's path in Rust code, the only folder that may name it).
const CLIENTS: &[(&str, &str)] = &[
    ("rdkafka", "broker/kafka/"),
    ("async_nats", "broker/nats/"),
    ("lapin", "broker/rabbitmq/"),
    ("redis", "broker/redis/"),
];

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// Every place outside its folder where a client crate is named in code
/// (comment lines aside), as `file:line: crate`. A name that continues a
/// path (`broker::redis::connect`, `config::redis::stream_key`) is
/// outboxd's own module of that name, not the crate; `::redis::` at the
/// start of a path is the crate.
fn outside_their_folder(src: &Path, files: &[(String, String)]) -> Vec<String> {
    let _ = src;
    let mut found = Vec::new();
    for (rel, text) in files {
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for (krate, folder) in CLIENTS {
                let named = code.match_indices(krate).any(|(i, _)| {
                    let before = code[..i].chars().next_back();
                    let after = &code[i + krate.len()..];
                    let in_path = code[..i].strip_suffix("::").is_some_and(|p| {
                        p.chars()
                            .next_back()
                            .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    });
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                        && !in_path
                        && after.starts_with("::")
                });
                if named && !rel.starts_with(folder) {
                    found.push(format!("{rel}:{}: {krate}", n + 1));
                }
            }
        }
    }
    found
}

#[test]
fn each_brokers_client_crate_stays_in_its_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let files: Vec<(String, String)> = paths
        .iter()
        .map(|p| {
            (
                p.strip_prefix(&src)
                    .expect("under src")
                    .to_string_lossy()
                    .replace('\\', "/"),
                std::fs::read_to_string(p).expect("read"),
            )
        })
        .collect();
    let found = outside_their_folder(&src, &files);
    assert!(
        found.is_empty(),
        "a broker's client crate is named outside its folder; move that code into the folder or behind the broker traits:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_client_crate_outside_its_folder_is_found() {
    let files = vec![
        (
            "daemon/mod.rs".to_string(),
            "let c = async_nats::connect(url);\n// async_nats::x in a comment\n".to_string(),
        ),
        (
            "broker/nats/mod.rs".to_string(),
            "use async_nats::HeaderMap;\n".to_string(),
        ),
        (
            "relay/mod.rs".to_string(),
            "use rdkafka::producer::FutureProducer;\nlet my_rdkafka::x;\n".to_string(),
        ),
        (
            "daemon/consumers.rs".to_string(),
            "crate::broker::redis::client(s);\nlet c = ::redis::Client::open(u);\n".to_string(),
        ),
    ];
    assert_eq!(
        outside_their_folder(Path::new("."), &files),
        vec![
            "daemon/mod.rs:1: async_nats".to_string(),
            "relay/mod.rs:1: rdkafka".to_string(),
            "daemon/consumers.rs:2: redis".to_string()
        ]
    );
}
