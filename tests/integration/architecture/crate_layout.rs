//! The crate boundaries ARCHITECTURE.md promises, read from the manifests,
//! `cargo tree` and the source tree: outboxd-core links no plugin engine and
//! no Kafka client, the fuzz workspace builds outboxd-core alone, and the
//! product crate carries no example domain, bench code or demo tables.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The root of the host workspace (this package is `host/`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

fn manifest(relative: &str) -> toml::Table {
    let path = workspace_root().join(relative);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Every dependency table of a manifest (`[dependencies]`,
/// `[build-dependencies]`, `[dev-dependencies]` and their `[target.*]`
/// forms), as (name, spec) pairs, when `dev` is true; without dev ones
/// otherwise.
fn dependencies(m: &toml::Table, dev: bool) -> Vec<(String, toml::Value)> {
    let mut kinds = vec!["dependencies", "build-dependencies"];
    if dev {
        kinds.push("dev-dependencies");
    }
    let mut tables: Vec<&toml::Table> = kinds
        .iter()
        .filter_map(|k| m.get(*k).and_then(toml::Value::as_table))
        .collect();
    if let Some(targets) = m.get("target").and_then(toml::Value::as_table) {
        for target in targets.values().filter_map(toml::Value::as_table) {
            tables.extend(
                kinds
                    .iter()
                    .filter_map(|k| target.get(*k).and_then(toml::Value::as_table)),
            );
        }
    }
    tables
        .into_iter()
        .flat_map(|t| t.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect()
}

/// The `path` of every path dependency among `deps`.
fn paths(deps: &[(String, toml::Value)]) -> BTreeSet<String> {
    deps.iter()
        .filter_map(|(_, spec)| spec.get("path").and_then(toml::Value::as_str))
        .map(String::from)
        .collect()
}

/// A `cargo tree` line names a crate at its start: rejecting by prefix
/// catches `wasmtime-wasi`, `cranelift-codegen` and `rdkafka-sys` as well.
#[test]
fn core_links_no_engine_or_kafka() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "-p",
            "outboxd-core",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p outboxd-core failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).expect("cargo tree prints UTF-8");
    // An empty or unrelated listing would pass the check below vacuously.
    assert!(
        tree.lines()
            .next()
            .is_some_and(|l| l.starts_with("outboxd-core ")),
        "cargo tree did not list outboxd-core first: {tree}"
    );
    assert!(
        tree.lines().count() > 1,
        "outboxd-core has no dependencies listed: {tree}"
    );
    let linked: Vec<&str> = tree
        .lines()
        .filter(|l| {
            ["wasmtime", "cranelift", "rdkafka"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    assert!(
        linked.is_empty(),
        "outboxd-core links {linked:?}; it must stay buildable without the plugin engine and Kafka"
    );
}

/// The fuzz workspace builds with coverage instrumentation: any host crate
/// besides outboxd-core would drag wasmtime and librdkafka into it.
#[test]
fn fuzz_depends_on_no_host_crate_but_core() {
    let fuzz = manifest("fuzz/Cargo.toml");
    let deps = dependencies(&fuzz, true);
    assert_eq!(
        paths(&deps),
        BTreeSet::from(["../host/core".to_string()]),
        "fuzz/Cargo.toml's only path dependency must be ../host/core"
    );
    for (name, _) in &deps {
        assert!(
            !["outboxd", "wasmtime", "rdkafka"]
                .iter()
                .any(|p| name.starts_with(p))
                || name == "outboxd-core",
            "fuzz/Cargo.toml depends on `{name}`"
        );
    }
    // Its own workspace, left out of the host's, so a host build never
    // compiles it with the host's flags.
    assert!(
        fuzz.get("workspace").is_some(),
        "fuzz/ must be its own workspace"
    );
    let root = manifest("Cargo.toml");
    let workspace = root["workspace"].as_table().expect("[workspace]");
    let listed = |key: &str| -> Vec<&str> {
        workspace
            .get(key)
            .and_then(toml::Value::as_array)
            .map(|a| a.iter().filter_map(toml::Value::as_str).collect())
            .unwrap_or_default()
    };
    assert!(
        listed("exclude").contains(&"fuzz"),
        "{:?}",
        listed("exclude")
    );
    assert!(!listed("members").iter().any(|m| m.starts_with("fuzz")));
}

/// What `outboxd` links (dev-dependencies aside, where tests may use the
/// example) comes from crates.io and outboxd-core only.
#[test]
fn the_product_crate_does_not_depend_on_the_example_or_the_benchmarks() {
    let host = manifest("host/Cargo.toml");
    let deps = dependencies(&host, false);
    for (name, _) in &deps {
        assert!(
            name != "outboxd-demo" && name != "outboxd-bench",
            "host/Cargo.toml's product dependencies include `{name}`"
        );
    }
    assert_eq!(
        paths(&deps),
        BTreeSet::from(["core".to_string()]),
        "the product's only path dependency must be outboxd-core"
    );
}

/// Every `.rs` file under `dir`, recursively.
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

/// The code of a source file without its unit tests, which sit at the end
/// after `#[cfg(test)]` and may create throwaway tables, and without its
/// comment lines, which may speak of `CREATE TABLE` in prose.
fn product_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read source");
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text,
    };
    without_comment_lines(code, "//")
}

fn without_comment_lines(text: &str, marker: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with(marker))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The tables `CREATE TABLE [IF NOT EXISTS] name` statements in `sql`
/// create, lowercased and without quotes or schema.
fn created_tables(sql: &str) -> Vec<String> {
    // Splitting at anything but a name, a dot or a quote also takes the
    // statement apart where a Rust string literal opens right before it.
    let words: Vec<String> = sql
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '"'))
        .map(|w| w.trim_matches('"').to_ascii_lowercase())
        .filter(|w| !w.is_empty())
        .collect();
    let mut tables = Vec::new();
    for (i, pair) in words.windows(2).enumerate() {
        if pair != ["create", "table"] {
            continue;
        }
        let mut rest = words[i + 2..].iter();
        let mut name = rest.next();
        if name.is_some_and(|n| n == "if") {
            name = rest.nth(2);
        }
        if let Some(n) = name {
            let n = n.rsplit('.').next().unwrap_or(n).trim_matches('"');
            tables.push(n.to_string());
        }
    }
    tables
}

#[test]
fn the_product_has_no_example_domain_bench_code_or_demo_tables() {
    let src = workspace_root().join("host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "host/src looks empty: {files:?}");

    for name in ["domain", "demo", "bench"] {
        for path in [src.join(name), src.join(format!("{name}.rs"))] {
            assert!(!path.exists(), "{} is in the product crate", path.display());
        }
    }
    let mut declared = Vec::new();
    for file in &files {
        for (n, line) in std::fs::read_to_string(file)
            .expect("read source")
            .lines()
            .enumerate()
        {
            let words: Vec<&str> = line
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            if words
                .windows(2)
                .any(|w| w[0] == "mod" && ["domain", "demo", "bench"].contains(&w[1]))
            {
                declared.push(format!("{}:{}: {line}", file.display(), n + 1));
            }
        }
    }
    assert!(
        declared.is_empty(),
        "example or bench modules: {declared:#?}"
    );

    // The tables the product creates, by its migrations and its code, are
    // all outboxd's own: an application table such as the example's
    // `invoices` or `orders` is the application's to create.
    let mut created = Vec::new();
    for file in &files {
        created.extend(created_tables(&product_code(file)));
    }
    for kind in ["postgres", "sqlite"] {
        let dir = workspace_root().join("migrations").join(kind);
        for entry in std::fs::read_dir(&dir).expect("migrations").flatten() {
            let sql = std::fs::read_to_string(entry.path()).expect("read migration");
            created.extend(created_tables(&without_comment_lines(&sql, "--")));
        }
    }
    assert!(
        created.iter().any(|t| t == "outbox"),
        "the scan found no CREATE TABLE outbox: {created:?}"
    );
    let foreign: Vec<&String> = created
        .iter()
        .filter(|t| !outboxd_core::sql_gate::is_host_table(t))
        .collect();
    assert!(foreign.is_empty(), "the product creates {foreign:?}");
}

/// The module import graph of `host/src`, read from its `use` lines by
/// `tests/tools/import_graph.py`: `(header, cycles)` at `depth`, each
/// cycle as its members.
fn import_cycles(depth: u32) -> (String, Vec<Vec<String>>) {
    let root = workspace_root();
    let out = std::process::Command::new("python3")
        .arg(root.join("tests/tools/import_graph.py"))
        .arg(root.join("host/src"))
        .args(["--depth", &depth.to_string(), "--cycles"])
        .output()
        .expect("run python3 tests/tools/import_graph.py (python3 is needed)");
    assert!(
        out.status.success(),
        "import_graph.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let header = text.lines().next().unwrap_or_default().to_string();
    let cycles = text
        .lines()
        .filter_map(|l| l.strip_prefix("cycle: "))
        .map(|l| l.split(" <-> ").map(str::to_string).collect())
        .collect();
    (header, cycles)
}

/// No import cycle between the product's modules, except inside one
/// concept's own folder: the top-level modules form none, and a cycle
/// between second-level modules stays within one folder.
#[test]
fn no_import_cycle_crosses_a_modules_folder() {
    let (header, top) = import_cycles(1);
    assert!(header.contains("modules"), "unexpected output: {header}");
    assert!(top.is_empty(), "cycles between top-level modules: {top:?}");
    let (header, nested) = import_cycles(2);
    assert!(header.contains("modules"), "unexpected output: {header}");
    for cycle in nested {
        let folders: BTreeSet<&str> = cycle
            .iter()
            .map(|m| m.split("::").next().unwrap_or_default())
            .collect();
        assert_eq!(
            folders.len(),
            1,
            "a cycle crosses module folders: {}",
            cycle.join(" <-> ")
        );
    }
}

/// No import cycle at all among the second-level modules either: each
/// folder's files depend on one another one way, so a reader can take
/// them in an order.
#[test]
fn no_import_cycle_among_second_level_modules() {
    let (header, nested) = import_cycles(2);
    assert!(header.contains("modules"), "unexpected output: {header}");
    let cycles: Vec<String> = nested.iter().map(|c| c.join(" <-> ")).collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

/// The `pub use` lines of `text` that re-export another module's items
/// (`crate::…`, `super::…`, `outboxd_core::…`), whatever their visibility;
/// a module re-exporting its own children (`pub use child::Item`) is fine.
fn foreign_reexports(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("pub use ") || l.starts_with("pub("))
        .filter_map(|l| {
            let rest = l.strip_prefix("pub")?;
            let rest = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')')?.1,
                None => rest,
            };
            let path = rest.trim_start().strip_prefix("use ")?.trim_start();
            ["crate::", "super::", "outboxd_core::"]
                .iter()
                .any(|p| path.starts_with(p))
                .then(|| l.to_string())
        })
        .collect()
}

#[test]
fn a_reexport_of_another_modules_item_is_found() {
    let text = "pub use child::Own;\npub(crate) use crate::store::InboxTx;\n    pub use super::x::Y;\npub use outboxd_core::config::Limits;\nuse crate::a::B;\n";
    assert_eq!(
        foreign_reexports(text),
        [
            "pub(crate) use crate::store::InboxTx;",
            "pub use super::x::Y;",
            "pub use outboxd_core::config::Limits;"
        ]
    );
}

/// Each item has one path: only `lib.rs`, the crate's façade, re-exports
/// items of other modules or of `outboxd-core`.
#[test]
fn only_lib_rs_re_exports_another_modules_items() {
    let src = workspace_root().join("host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !f.ends_with("lib.rs")) {
        let text = std::fs::read_to_string(f).expect("read source");
        for line in foreign_reexports(&text) {
            found.push(format!(
                "{}: {line}",
                f.strip_prefix(&src).unwrap_or(f).display()
            ));
        }
    }
    assert!(
        found.is_empty(),
        "re-exports outside lib.rs (use the item's own path, or add it to lib.rs's façade): {found:#?}"
    );
}
