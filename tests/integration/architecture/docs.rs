//! ARCHITECTURE.md names, for each invariant, the test that fails when it
//! breaks. This checks those names against the tree: every cited test
//! exists (and is a test, not a helper), and every source folder has its
//! entry in the code map, so the map cannot drift from the code unseen.
//!
//! A citation is an inline code span of one of these forms:
//!
//! - `dir/file.rs::name`: a test in `tests/integration/dir/file.rs`, either
//!   a `#[test]`/`#[tokio::test]` fn, an `on_both!(name)` test or a `mod
//!   name` of tests; `dir/file.rs::module::name` names one test inside;
//! - `a::b::tests::name`: a unit test in the module file of `a::b` under
//!   `host/src` or `host/core/src` (`a/b.rs`, `a/b/mod.rs`, `a/b/tests.rs`);
//! - `::name`: another test of the file or module cited just before;
//! - any of these followed by ` (both)`: an `on_both!` test, so the file
//!   must hold `on_both!(name)`;
//! - `tests/…`: a test script or folder, which must exist.
//!
//! A span that mentions `.rs::` or `tests::` or ends in `(both)` but fits
//! none of these forms is reported too, so a typo cannot slip through as
//! prose.

use std::path::{Path, PathBuf};

/// The root of the workspace (this package is `host/`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// The crates whose source folders the code map covers.
const SOURCE_ROOTS: &[&str] = &["host/src", "host/core/src"];

/// The inline code spans of a Markdown text, fenced blocks left out, each
/// with its whitespace (line breaks included) collapsed to single spaces.
fn code_spans(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `a::b::c` as its segments, if each is an identifier.
fn idents(path: &str) -> Option<Vec<&str>> {
    let segments: Vec<&str> = path.split("::").collect();
    segments.iter().all(|s| is_ident(s)).then_some(segments)
}

/// What a citation points into.
#[derive(Clone, Debug)]
enum Target {
    /// A file of the integration tests, relative to `tests/integration/`.
    Integration(String),
    /// A module path of `host/src` or `host/core/src` (before `tests`).
    Unit(String),
}

/// Whether an attribute line (`#[test]`, `#[tokio::test(…)]`) marks a test.
fn is_test_attribute(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("#[") else {
        return false;
    };
    let path = rest.split(['(', ']']).next().unwrap_or("");
    path.rsplit("::").next() == Some("test")
}

fn strip_item_prefixes(line: &str) -> &str {
    let mut line = line;
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "async "] {
        line = line.strip_prefix(prefix).unwrap_or(line);
    }
    line
}

/// Whether `code` declares `fn name` under a test attribute.
fn has_test_fn(code: &str, name: &str) -> bool {
    let lines: Vec<&str> = code.lines().map(str::trim).collect();
    lines.iter().enumerate().any(|(i, line)| {
        let Some(rest) = strip_item_prefixes(line)
            .strip_prefix("fn ")
            .and_then(|l| l.strip_prefix(name))
        else {
            return false;
        };
        if !rest.starts_with(['(', '<']) {
            return false;
        }
        lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
            .any(|l| is_test_attribute(l))
    })
}

/// Whether `code` runs `name` on both databases with `on_both!`.
fn has_on_both(code: &str, name: &str) -> bool {
    let compact: String = code.split_whitespace().collect();
    compact.contains(&format!("on_both!({name})"))
}

/// Whether `code` declares `mod name { … }` holding tests.
fn has_test_mod(code: &str, name: &str) -> bool {
    code.lines().any(|line| {
        strip_item_prefixes(line.trim())
            .strip_prefix("mod ")
            .and_then(|l| l.strip_prefix(name))
            .is_some_and(|rest| rest.trim_start().starts_with('{'))
    }) && code.lines().any(|l| is_test_attribute(l.trim()))
}

/// The files a unit citation's module may hold its tests in.
fn unit_files(root: &Path, module: &str) -> Vec<PathBuf> {
    let rel: PathBuf = module.split("::").collect();
    let mut files = Vec::new();
    for src in SOURCE_ROOTS {
        let base = root.join(src).join(&rel);
        let mut candidates = vec![
            base.with_extension("rs"),
            base.join("mod.rs"),
            base.join("tests.rs"),
        ];
        if let Ok(dir) = std::fs::read_dir(base.join("tests")) {
            candidates.extend(dir.filter_map(|e| e.ok()).map(|e| e.path()));
        }
        files.extend(candidates.into_iter().filter(|p| p.is_file()));
    }
    files
}

/// Why `file` (relative to `tests/integration/`) is not compiled into the
/// test binary, if it is not: each folder on its way and the file itself
/// must be declared with `mod` in the `main.rs` or `mod.rs` above it.
fn undeclared(root: &Path, file: &str) -> Option<String> {
    let parts: Vec<&str> = file.trim_end_matches(".rs").split('/').collect();
    for (depth, name) in parts.iter().enumerate() {
        let parent = match depth {
            0 => "main.rs".to_string(),
            _ => format!("{}/mod.rs", parts[..depth].join("/")),
        };
        let code = std::fs::read_to_string(root.join("tests/integration").join(&parent))
            .unwrap_or_default();
        let declared = code.lines().any(|line| {
            strip_item_prefixes(line.trim()).strip_prefix("mod ") == Some(&format!("{name};"))
        });
        if !declared {
            return Some(format!(
                "tests/integration/{parent} declares no `mod {name};`, so {file} never runs"
            ));
        }
    }
    None
}

/// Checks one citation of `names` (the first, and the last when there are
/// more) in `target`; `None` when it holds, else why not.
fn check_one(root: &Path, target: &Target, names: &[&str], both: bool) -> Option<String> {
    let first = names[0];
    let last = names[names.len() - 1];
    match target {
        Target::Integration(file) => {
            let path = root.join("tests/integration").join(file);
            let Ok(code) = std::fs::read_to_string(&path) else {
                return Some(format!("tests/integration/{file} does not exist"));
            };
            if let Some(problem) = undeclared(root, file) {
                return Some(problem);
            }
            if both {
                return (!has_on_both(&code, first))
                    .then(|| format!("{file} has no on_both!({first})"));
            }
            let found = if names.len() == 1 {
                has_test_fn(&code, first) || has_on_both(&code, first) || has_test_mod(&code, first)
            } else {
                has_test_mod(&code, first) && has_test_fn(&code, last)
            };
            (!found).then(|| format!("{file} has no test {}", names.join("::")))
        }
        Target::Unit(module) => {
            let files = unit_files(root, module);
            if files.is_empty() {
                return Some(format!(
                    "no file of module {module} under {}",
                    SOURCE_ROOTS.join(" or ")
                ));
            }
            let found = files
                .iter()
                .any(|f| std::fs::read_to_string(f).is_ok_and(|code| has_test_fn(&code, last)));
            (!found).then(|| format!("module {module} has no unit test {last}"))
        }
    }
}

/// Every citation of `text` checked against the tree at `root`: how many
/// were checked, and one line per citation that does not hold.
fn check_citations(text: &str, root: &Path) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut problems = Vec::new();
    let mut previous: Option<Target> = None;
    for span in code_spans(text) {
        let (body, both) = match span.strip_suffix(" (both)") {
            Some(body) => (body, true),
            None => (span.as_str(), false),
        };
        let looks_cited = both || body.contains(".rs::") || body.contains("tests::");
        let cited: Option<(Target, Vec<&str>)> = if let Some(rest) = body.strip_prefix("::") {
            match (&previous, idents(rest)) {
                (Some(target), Some(names)) => Some((target.clone(), names)),
                (None, Some(_)) => {
                    problems.push(format!("`{span}`: continues no citation before it"));
                    continue;
                }
                (_, None) => None,
            }
        } else if let Some((file, rest)) = body.split_once(".rs::") {
            let file = file.strip_prefix("tests/integration/").unwrap_or(file);
            let file_ok = file.split('/').all(is_ident);
            match idents(rest) {
                Some(names) if file_ok => Some((Target::Integration(format!("{file}.rs")), names)),
                _ => None,
            }
        } else if let Some(segments) = idents(body) {
            match segments.iter().rposition(|s| *s == "tests") {
                Some(at) if at > 0 && at + 1 < segments.len() => Some((
                    Target::Unit(segments[..at].join("::")),
                    segments[at + 1..].to_vec(),
                )),
                _ => None,
            }
        } else {
            None
        };
        match cited {
            Some((target, names)) => {
                checked += 1;
                if let Some(problem) = check_one(root, &target, &names, both) {
                    problems.push(format!("`{span}`: {problem}"));
                }
                previous = Some(target);
            }
            None if looks_cited => {
                problems.push(format!("`{span}`: not a citation form this check reads"));
            }
            None if body.starts_with("tests/") && !body.contains(' ') => {
                checked += 1;
                if !root.join(body).exists() {
                    problems.push(format!("`{span}`: no such file or folder"));
                }
            }
            None => {}
        }
    }
    (checked, problems)
}

/// The source folders (two levels deep) and top-level module files the
/// code map must name, as `dir/`, `dir/sub/` and `file.rs`.
fn source_entries(root: &Path) -> Vec<String> {
    fn children(dir: &Path) -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .map(|p| {
                let name = p
                    .file_name()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned();
                (name, p.is_dir())
            })
            .collect();
        out.sort();
        out
    }
    let mut entries = Vec::new();
    for src in SOURCE_ROOTS {
        let src = root.join(src);
        for (name, is_dir) in children(&src) {
            if !is_dir {
                if name.ends_with(".rs") {
                    entries.push(name);
                }
                continue;
            }
            entries.push(format!("{name}/"));
            for (sub, sub_is_dir) in children(&src.join(&name)) {
                if sub_is_dir {
                    entries.push(format!("{name}/{sub}/"));
                }
            }
        }
    }
    entries.sort();
    entries.dedup();
    entries
}

/// The entries of `source_entries` that `text` never names in backticks.
fn missing_entries(text: &str, entries: &[String]) -> Vec<String> {
    let spans = code_spans(text);
    entries
        .iter()
        .filter(|entry| !spans.iter().any(|s| s == *entry))
        .cloned()
        .collect()
}

fn architecture_md() -> String {
    let path = workspace_root().join("ARCHITECTURE.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn architecture_cites_only_tests_that_exist() {
    let (checked, problems) = check_citations(&architecture_md(), &workspace_root());
    // A parser that stopped reading citations would pass vacuously.
    assert!(
        checked >= 50,
        "read only {checked} citations in ARCHITECTURE.md"
    );
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md cites tests that do not exist; rename the citation or the test:\n{}",
        problems.join("\n")
    );
}

#[test]
fn architecture_has_an_entry_for_every_source_folder() {
    let entries = source_entries(&workspace_root());
    assert!(
        entries.iter().any(|e| e == "store/backend/"),
        "did not read the source tree: {entries:?}"
    );
    let missing = missing_entries(&architecture_md(), &entries);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map has no entry naming these (in backticks, as written here): {missing:?}"
    );
}

#[test]
fn a_citation_of_a_missing_test_is_found() {
    let root = workspace_root();
    let text = "\
An invariant (`relay/ordering.rs::commit_order_gap_is_closed_on_postgres`,
`::no_such_ordering_test`), a helper that is no test
(`relay/ordering.rs::write_one`), a test not run on both
(`relay/backoff.rs::backoff_on_postgres (both)`), a file that is not there
(`relay/no_such_file.rs::a_test`), a unit test that is not there
(`relay::wal::state::tests::no_such_unit_test`), a module that is not there
(`relay::no_such_module::tests::a_test`), a typo
(`relay/ordering.rs::commit order`), a script that is not there
(`tests/no_such_script.sh`), and prose (`Db::listen`, `store/`).

```
`relay/ordering.rs::inside_a_fence_is_not_read`
```
";
    let (checked, problems) = check_citations(text, &root);
    assert_eq!(checked, 8, "{problems:#?}");
    for expected in [
        "no_such_ordering_test",
        "write_one",
        "on_both!(backoff_on_postgres)",
        "no_such_file.rs does not exist",
        "no_such_unit_test",
        "no file of module relay::no_such_module",
        "commit order",
        "tests/no_such_script.sh",
    ] {
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "`{expected}` was not reported: {problems:#?}"
        );
    }
    assert_eq!(problems.len(), 8, "{problems:#?}");

    let entries = ["store/".to_string(), "store/backend/".to_string()];
    let map = "**`store/`**: the durable half; the backend and `store/backends/`.";
    assert_eq!(missing_entries(map, &entries), ["store/backend/"]);
}

#[test]
fn a_test_file_outside_the_module_tree_is_found() {
    let root = std::env::temp_dir().join(format!("outboxd-docs-{}", std::process::id()));
    let dir = root.join("tests/integration/area");
    std::fs::create_dir_all(&dir).expect("create a test tree");
    let test = "#[test]\nfn a_test() {}\n";
    for (path, text) in [
        ("tests/integration/main.rs", "mod area;\n"),
        ("tests/integration/area/mod.rs", "mod declared;\n"),
        ("tests/integration/area/declared.rs", test),
        ("tests/integration/area/forgotten.rs", test),
    ] {
        std::fs::write(root.join(path), text).expect("write a test file");
    }
    let (checked, problems) = check_citations(
        "`area/declared.rs::a_test`, `area/forgotten.rs::a_test`",
        &root,
    );
    std::fs::remove_dir_all(&root).expect("remove the test tree");
    assert_eq!(checked, 2);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("no `mod forgotten;`"), "{problems:#?}");
}
