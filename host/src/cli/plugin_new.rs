//! `outboxd plugin new NAME --world W --lang L`: writes a ready plugin
//! project from the templates under `cli/templates/` (embedded in the
//! binary): the source, a build script, a sample input, the report
//! `outboxd plugin test --json` prints for it (`expected.json`), and a
//! README. Python and JavaScript projects also get the WIT and the
//! outboxd helper modules, so they build outside this repository; a Rust
//! project depends on the guest SDK by path.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum World {
    Transformer,
    Consumer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Lang {
    Rust,
    Python,
    Js,
}

#[derive(Debug, clap::Args)]
pub(super) struct NewArgs {
    /// The plugin's name: lowercase letters, digits and `-`, starting with
    /// a letter. It names the directory and the component (NAME.wasm).
    name: String,
    #[arg(long, value_enum)]
    world: World,
    #[arg(long, value_enum)]
    lang: Lang,
    /// Where to create the project directory NAME (default: here).
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// Rust: the guest SDK's directory (default: this outboxd's source
    /// tree, where it was built).
    #[arg(long, value_name = "PATH")]
    sdk_path: Option<PathBuf>,
}

/// The componentize-py version `plugin build` installs; plugins/build.sh
/// pins the same.
pub(super) const COMPONENTIZE_PY: &str = "0.25.1";

macro_rules! file {
    ($path:literal) => {
        include_str!(concat!("templates/", $path))
    };
}
macro_rules! repo_file {
    ($path:literal) => {
        include_str!(concat!("../../../", $path))
    };
}

/// The WIT, for the projects whose toolchain reads it (Python, JS).
const WIT: [(&str, &str); 4] = [
    ("wit/outbox-plugin.wit", repo_file!("wit/outbox-plugin.wit")),
    ("wit/deps/io/io.wit", repo_file!("wit/deps/io/io.wit")),
    (
        "wit/deps/clocks/clocks.wit",
        repo_file!("wit/deps/clocks/clocks.wit"),
    ),
    (
        "wit/deps/http/http.wit",
        repo_file!("wit/deps/http/http.wit"),
    ),
];

/// The files of one project: (relative path, template text).
fn files(world: World, lang: Lang) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![
        ("README.md", file!("common/README.md")),
        (".gitignore", file!("common/gitignore")),
    ];
    out.extend(match world {
        World::Transformer => [
            ("sample.json", file!("common/transformer-sample.json")),
            ("expected.json", file!("common/transformer-expected.json")),
        ],
        World::Consumer => [
            ("sample.json", file!("common/consumer-sample.json")),
            ("expected.json", file!("common/consumer-expected.json")),
        ],
    });
    if world == World::Consumer {
        out.push(("setup.sql", file!("common/consumer-setup.sql")));
    }
    match lang {
        Lang::Rust => {
            out.push(("Cargo.toml", file!("rust/Cargo.toml")));
            out.push(("build.sh", file!("rust/build.sh")));
            out.push(match world {
                World::Transformer => ("src/lib.rs", file!("rust/transformer.rs")),
                World::Consumer => ("src/lib.rs", file!("rust/consumer.rs")),
            });
        }
        Lang::Python => {
            out.extend(WIT);
            out.push(("build.sh", file!("python/build.sh")));
            out.push(match world {
                World::Transformer => ("app.py", file!("python/transformer.py")),
                World::Consumer => ("app.py", file!("python/consumer.py")),
            });
            if world == World::Consumer {
                out.push((
                    "outboxd_guest.py",
                    repo_file!("guest-sdk/python/outboxd_guest.py"),
                ));
                out.push((
                    "outboxd_http.py",
                    repo_file!("guest-sdk/python/outboxd_http.py"),
                ));
            }
        }
        Lang::Js => {
            out.extend(WIT);
            out.push(("build.sh", file!("js/build.sh")));
            out.push(("build.mjs", repo_file!("plugins/js-tag/build.mjs")));
            out.push(("package.json", file!("js/package.json")));
            out.push((
                "package-lock.json",
                repo_file!("plugins/js-tag/package-lock.json"),
            ));
            out.push(match world {
                World::Transformer => ("src/app.js", file!("js/transformer.js")),
                World::Consumer => ("src/app.js", file!("js/consumer.js")),
            });
            if world == World::Consumer {
                out.push((
                    "src/outboxd_guest.js",
                    repo_file!("guest-sdk/js/outboxd_guest.js"),
                ));
                out.push((
                    "src/outboxd_http.js",
                    repo_file!("guest-sdk/js/outboxd_http.js"),
                ));
            }
        }
    }
    out
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !ok {
        bail!(
            "plugin name `{name}`: use lowercase letters, digits and `-`, starting with a letter \
             (at most 64 characters), for example `order-audit`"
        );
    }
    Ok(())
}

/// The guest SDK to depend on: `--sdk-path`, else the source tree this
/// binary was built from.
fn sdk_path(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(p) => p.to_path_buf(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk"),
    };
    let path = std::fs::canonicalize(&path).with_context(|| {
        format!(
            "the outboxd guest SDK is not at {}: pass --sdk-path DIR (the guest-sdk directory of \
             an outboxd checkout), or edit Cargo.toml to use the git dependency it shows",
            path.display()
        )
    })?;
    if !path.join("Cargo.toml").is_file() || !path.join("consumer/Cargo.toml").is_file() {
        bail!(
            "--sdk-path {}: not the outboxd guest SDK (no Cargo.toml and consumer/Cargo.toml)",
            path.display()
        );
    }
    Ok(path)
}

pub(super) fn run(a: &NewArgs) -> anyhow::Result<()> {
    check_name(&a.name)?;
    let root = a.dir.join(&a.name);
    if root.exists() {
        bail!(
            "{} already exists: choose another name or --dir",
            root.display()
        );
    }
    let world = match a.world {
        World::Transformer => "transformer",
        World::Consumer => "consumer",
    };
    let (sdk_crate, sdk_path) = match (a.lang, a.world) {
        (Lang::Rust, World::Transformer) => ("outboxd-guest", sdk_path(a.sdk_path.as_deref())?),
        (Lang::Rust, World::Consumer) => (
            "outboxd-guest-consumer",
            sdk_path(a.sdk_path.as_deref())?.join("consumer"),
        ),
        _ => ("", PathBuf::new()),
    };
    let vars = [
        ("{{name}}", a.name.clone()),
        ("{{crate}}", a.name.replace('-', "_")),
        ("{{world}}", world.to_string()),
        ("{{sdk_crate}}", sdk_crate.to_string()),
        ("{{sdk_path}}", sdk_path.display().to_string()),
        ("{{componentize_py}}", COMPONENTIZE_PY.to_string()),
        ("{{lang}}", format!("{:?}", a.lang).to_lowercase()),
        ("{{test}}", test_command(&a.name, a.world)),
        ("\"outboxd-js-tag\"", format!("\"{}\"", a.name)),
    ];
    for (rel, template) in files(a.world, a.lang) {
        let mut text = template.to_string();
        for (k, v) in &vars {
            text = text.replace(k, v);
        }
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        if rel.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    println!(
        "created {} ({world}, {:?}); next:\n  cd {}\n  outboxd plugin build\n  {}",
        root.display(),
        a.lang,
        root.display(),
        test_command(&a.name, a.world)
    );
    Ok(())
}

/// The `plugin test` line the README shows (and tests/scaffolds.sh runs).
pub(super) fn test_command(name: &str, world: World) -> String {
    match world {
        World::Transformer => {
            format!(
                "outboxd plugin test {name}.wasm --event sample.json --timeout-ms 5000 \
                 --expect expected.json"
            )
        }
        World::Consumer => format!(
            "outboxd plugin test {name}.wasm --message sample.json --setup setup.sql \
             --write orders_seen --timeout-ms 5000 --expect expected.json"
        ),
    }
}
