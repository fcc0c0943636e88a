//! Secrets never reach the terminal: `--help` of every command, connection
//! errors and config errors are run through the real binary with a
//! password in the database URL and a token in the environment, and the
//! output must not contain either.

use std::process::{Command, Output};

const PASSWORD: &str = "s3cr3tpw";
const URL: &str = "postgres://user:s3cr3tpw@127.0.0.1:1/db";
const TOKEN: &str = "tok-s3cr3tpw-0123456789";

/// The binary with the secrets in its environment (as an operator would
/// set them) and nothing else inherited that could change the outcome.
fn outboxd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OUTBOXD__DATABASE__URL", URL)
        .env("OUTBOXD__ADMIN__TOKEN", TOKEN)
        .output()
        .expect("run outboxd")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_no_secret(what: &str, out: &Output) {
    let all = text(out);
    assert!(!all.contains(PASSWORD), "{what} printed the secret:\n{all}");
}

/// Subcommand names listed under `Commands:` in a help text.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("  "))
        // A command's line; wrapped descriptions are indented further.
        .filter(|l| l.len() > 2 && !l[2..].starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn help_of_every_command_shows_no_secret() {
    let top = outboxd(&["--help"]);
    assert!(top.status.success(), "{}", text(&top));
    assert_no_secret("outboxd --help", &top);
    let commands = subcommands(&String::from_utf8_lossy(&top.stdout));
    assert!(commands.len() >= 8, "{commands:?}");
    let mut seen = 0;
    for cmd in &commands {
        let out = outboxd(&[cmd, "--help"]);
        assert!(out.status.success(), "{cmd} --help: {}", text(&out));
        assert_no_secret(&format!("outboxd {cmd} --help"), &out);
        seen += 1;
        for sub in subcommands(&String::from_utf8_lossy(&out.stdout)) {
            let out = outboxd(&[cmd, &sub, "--help"]);
            assert!(out.status.success(), "{cmd} {sub} --help: {}", text(&out));
            assert_no_secret(&format!("outboxd {cmd} {sub} --help"), &out);
            seen += 1;
        }
    }
    assert!(seen > commands.len(), "nested commands were found: {seen}");
}

#[test]
fn connection_errors_show_the_url_without_its_password() {
    // The flag is another way in; the config is validated again with it.
    let mysql = "mysql://user:s3cr3tpw@127.0.0.1:1/db";
    let runs: Vec<Vec<&str>> = vec![
        vec!["stats"],
        vec!["migrate"],
        vec!["run"],
        vec!["dead", "list"],
        vec!["--database-url", URL, "run"],
        vec!["--database-url", mysql, "run"],
    ];
    // Each waits out the pool's connect timeout: run them side by side.
    let outputs: Vec<Output> = std::thread::scope(|s| {
        let handles: Vec<_> = runs.iter().map(|args| s.spawn(|| outboxd(args))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for (args, out) in runs.iter().zip(&outputs) {
        assert!(!out.status.success(), "{args:?} cannot reach port 1");
        assert_no_secret(&format!("outboxd {args:?}"), out);
    }
    assert!(
        text(&outputs[0]).contains("user:***@127.0.0.1:1"),
        "{}",
        text(&outputs[0])
    );
}

#[test]
fn config_errors_show_no_secret() {
    let dir = tempfile::tempdir().expect("dir");
    let cases: &[(&str, &str)] = &[
        // An unsupported scheme is reported with the URL.
        (
            "scheme",
            "[database]\nurl = \"mysql://user:s3cr3tpw@127.0.0.1:1/db\"\n",
        ),
        // A TOML syntax error quotes the source line in toml's own message.
        (
            "syntax",
            "[database]\nurl = \"postgres://user:s3cr3tpw@127.0.0.1:1/db\" oops\n",
        ),
        // serde quotes a value of the wrong type.
        (
            "type",
            "[admin]\nenabled = true\ntoken = 3573573573573573\n",
        ),
        // A secret in a query parameter.
        (
            "query",
            "[database]\nurl = \"postgres://user@127.0.0.1:1/db?password=s3cr3tpw\"\n",
        ),
    ];
    for (name, toml) in cases {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, toml).expect("write");
        let out = Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args(["--config", path.to_str().expect("utf8"), "stats"])
            .env_remove("OUTBOXD__DATABASE__URL")
            .env_remove("OUTBOXD__ADMIN__TOKEN")
            .output()
            .expect("run");
        assert!(!out.status.success(), "{name}: {}", text(&out));
        let all = text(&out);
        assert!(!all.contains(PASSWORD), "{name} printed the secret:\n{all}");
        assert!(
            !all.contains("3573573573573573"),
            "{name} printed the token:\n{all}"
        );
    }
}

/// A token of digits set in the environment stays a string (it used to
/// become a TOML integer and then a type error quoting it).
#[test]
fn a_numeric_token_from_the_environment_is_a_string() {
    let c = outboxd::config::Config::from_toml(
        "t.toml",
        "[admin]\nenabled = true\n",
        [(
            "OUTBOXD__ADMIN__TOKEN".to_string(),
            "35735735735735735735".to_string(),
        )],
    )
    .expect("a numeric token is accepted");
    assert_eq!(c.admin.token.as_deref(), Some("35735735735735735735"));
}
