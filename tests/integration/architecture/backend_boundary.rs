//! The architecture invariant "only `store/` knows which database it runs
//! on", checked on the source: no file of `host/src` outside `store/`
//! matches on the backend (`Db::Postgres`, `InboxTx::Sqlite`, `DbKind::`…),
//! names a backend's pool, connection or store module, or runs a statement
//! of its own.

use std::path::{Path, PathBuf};

/// What only `store/` may write: a match on the backend, a handle that is
/// one backend's, or a statement (whose text one backend may refuse).
const BACKEND_NAMES: &[&str] = &[
    "Db::Postgres",
    "Db::Sqlite",
    "InboxTx::Postgres",
    "InboxTx::Sqlite",
    "AnyStore::Postgres",
    "AnyStore::Sqlite",
    "AnyBatch::",
    "DbKind::",
    "PgPool",
    "SqlitePool",
    "PgConnection",
    "SqliteConnection",
    "store::postgres::",
    "store::sqlite::",
    "sqlx::query(",
    "sqlx::query_as(",
    "sqlx::query_scalar(",
    "sqlx::raw_sql(",
];

/// `path:line: text` for each line of `text` that names a backend, comments
/// aside.
fn backend_matches(path: &str, text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| BACKEND_NAMES.iter().any(|name| line.contains(name)))
        .map(|(i, line)| format!("{path}:{}: {}", i + 1, line.trim()))
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read host/src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_store_knows_which_database_it_runs_on() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 50,
        "found only {} files in {src:?}",
        files.len()
    );
    let mut found = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .expect("below host/src")
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("store/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        found.extend(backend_matches(&rel, &text));
    }
    assert!(
        found.is_empty(),
        "only host/src/store/ may know which database it runs on; move this SQL or match behind a store function (ARCHITECTURE.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_backend_match_outside_store_is_found() {
    let text = "fn ping(db: &Db) {\n    // Db::Postgres in a comment is no match.\n    if let Db::Postgres(pool) = db {}\n    let p: &sqlx::SqlitePool;\n}\n";
    assert_eq!(
        backend_matches("admin/routes.rs", text),
        vec![
            "admin/routes.rs:3: if let Db::Postgres(pool) = db {}".to_string(),
            "admin/routes.rs:4: let p: &sqlx::SqlitePool;".to_string(),
        ]
    );
    assert!(backend_matches("admin/routes.rs", "db.ping().await?;").is_empty());
}
