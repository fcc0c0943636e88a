//! Config: errors name the key and the fix; the environment overrides the file.

use std::time::Duration;

use outboxd::config::{Config, ConfigError, TransportKind};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn key_error(r: Result<Config, ConfigError>) -> (String, String) {
    match r {
        Err(ConfigError::Key { key, message }) => (key, message),
        other => panic!("expected a key error, got {other:?}"),
    }
}

#[test]
fn unknown_field_is_named() {
    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        "[relay]\nbatchsize = 5\n",
        env(&[]),
    ));
    assert_eq!(key, "relay.batchsize");
    assert!(
        msg.contains("batchsize") && msg.contains("batch_size"),
        "{msg}"
    );
}

#[test]
fn bad_url_is_named() {
    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        "[database]\nurl = \"mysql://x\"\n",
        env(&[]),
    ));
    assert_eq!(key, "database.url");
    assert!(
        msg.contains("postgres://") && msg.contains("sqlite://"),
        "{msg}"
    );
}

#[test]
fn impossible_values_are_named() {
    let (key, _) = key_error(Config::from_toml(
        "t.toml",
        "[relay]\nbatch_size = 0\n",
        env(&[]),
    ));
    assert_eq!(key, "relay.batch_size");
    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        "[relay]\nlease_ms = 100\npublish_timeout_ms = 200\n",
        env(&[]),
    ));
    assert_eq!(key, "relay.lease");
    assert!(msg.contains("publish_timeout"), "{msg}");
    let (key, _) = key_error(Config::from_toml(
        "t.toml",
        "[relay]\nworkers = \"two\"\n",
        env(&[]),
    ));
    assert_eq!(key, "relay.workers");
    // 0 workers is a consumer-only process; without consumers it is refused.
    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        "[relay]\nworkers = 0\n",
        env(&[]),
    ));
    assert_eq!(key, "relay.workers");
    assert!(msg.contains("no [[consumers]]"), "{msg}");
    let consumer_only = "[relay]\nworkers = 0\n[[consumers]]\nname = \"billing\"\ntopics = [\"orders\"]\nhandler = \"builtin:billing\"\n";
    let c = Config::from_toml("t.toml", consumer_only, env(&[])).expect("consumer-only config");
    assert_eq!(c.relay.workers, 0);
}

#[test]
fn syntax_errors_name_the_file() {
    match Config::from_toml("broken.toml", "[relay\n", env(&[])) {
        Err(ConfigError::Syntax { path, .. }) => assert_eq!(path, "broken.toml"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn environment_overrides_the_file() {
    let c = Config::from_toml(
        "t.toml",
        "[relay]\nbatch_size = 10\n",
        env(&[
            ("OUTBOXD__RELAY__BATCH_SIZE", "50"),
            ("OUTBOXD__DATABASE__URL", "postgres://u@h/db"),
            ("OUTBOXD__TRANSPORT__KIND", "kafka"),
            (
                "OUTBOXD__TRANSPORT__KAFKA__bootstrap.servers",
                "127.0.0.1:9092",
            ),
            ("UNRELATED", "x"),
        ]),
    )
    .expect("config");
    assert_eq!(c.relay.batch_size, 50);
    assert_eq!(c.database.url, "postgres://u@h/db");
    assert_eq!(c.transport.kind, TransportKind::Kafka);
    assert_eq!(
        c.transport
            .kafka
            .get("bootstrap.servers")
            .map(String::as_str),
        Some("127.0.0.1:9092")
    );
}

/// librdkafka reads every property as text: a number or a boolean, from the
/// file or the environment, is taken as its text; a table is refused with
/// the property's name.
#[test]
fn kafka_properties_take_numbers_and_booleans_as_text() {
    let c = Config::from_toml(
        "t.toml",
        "[transport.kafka]\n\"enable.idempotence\" = true\n",
        env(&[("OUTBOXD__TRANSPORT__KAFKA__session.timeout.ms", "6000")]),
    )
    .expect("config");
    let get = |k: &str| c.transport.kafka.get(k).map(String::as_str);
    assert_eq!(get("session.timeout.ms"), Some("6000"));
    assert_eq!(get("enable.idempotence"), Some("true"));
    let err = Config::from_toml(
        "t.toml",
        "[transport.kafka]\n\"sasl.mechanism\" = [\"PLAIN\"]\n",
        env(&[]),
    )
    .expect_err("a list is not a property value")
    .to_string();
    assert!(
        err.contains("sasl.mechanism") && err.contains("give it as text"),
        "{err}"
    );
}

#[test]
fn secrets_are_masked() {
    let c = Config::from_toml(
        "t.toml",
        "[transport]\nkind = \"kafka\"\n[transport.kafka]\n\"bootstrap.servers\" = \"b:9092\"\n\"sasl.password\" = \"hunter2\"\n",
        env(&[]),
    )
    .expect("config");
    let shown = format!("{:?}", c.redacted_kafka());
    assert!(
        !shown.contains("hunter2") && shown.contains("***"),
        "{shown}"
    );
    assert_eq!(
        outboxd::db_url::redact_url("postgres://u:pw@h/db"),
        "postgres://u:***@h/db"
    );
}

#[test]
fn consumer_plugin_handler_keys_are_named() {
    let base = "[[plugins]]\nname = \"billing\"\npath = \"billing.wasm\"\n";
    let ok = Config::from_toml(
        "t.toml",
        &format!(
            "{base}[[consumers]]\nname = \"b\"\ntopics = [\"t\"]\nhandler = \"plugin:billing\"\ndb_role = \"billing_plugin\"\nmax_rows = 50\n"
        ),
        env(&[]),
    )
    .expect("a plugin handler");
    let c = &ok.consumers[0];
    assert_eq!(c.plugin_name(), Some("billing"));
    assert_eq!(c.txn_policy().max_rows, 50);
    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        &format!(
            "{base}[[consumers]]\nname = \"b\"\ntopics = [\"t\"]\nhandler = \"plugin:nope\"\n"
        ),
        env(&[]),
    ));
    assert_eq!(key, "consumers[0].handler");
    assert!(msg.contains("nope"), "{msg}");
    let (key, _) = key_error(Config::from_toml(
        "t.toml",
        &format!(
            "{base}[[consumers]]\nname = \"b\"\ntopics = [\"t\"]\nhandler = \"plugin:billing\"\ndb_role = \"x; DROP\"\n"
        ),
        env(&[]),
    ));
    assert_eq!(key, "consumers[0].db_role");
    let (key, _) = key_error(Config::from_toml(
        "t.toml",
        &format!(
            "{base}[[consumers]]\nname = \"b\"\ntopics = [\"t\"]\nhandler = \"plugin:billing\"\nmax_statement = 3\n"
        ),
        env(&[]),
    ));
    assert!(key.starts_with("consumers"), "{key}");
    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        &format!(
            "{base}[[routes]]\nevent_type = \"order.*\"\ntopic = \"orders\"\ntransformers = [\"billing\"]\n[[consumers]]\nname = \"b\"\ntopics = [\"t\"]\nhandler = \"plugin:billing\"\n"
        ),
        env(&[]),
    ));
    assert_eq!(key, "consumers[0].handler");
    assert!(msg.contains("also a route's transformer"), "{msg}");
}

#[test]
fn empty_allowed_topic_is_named() {
    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        "[[routes]]\nevent_type = \"order.*\"\ntopic = \"orders\"\nallowed_topics = [\"orders.large\", \" \"]\n",
        env(&[]),
    ));
    assert_eq!(key, "routes[0].allowed_topics[1]");
    assert!(msg.contains("must not be empty"), "{msg}");
}

#[test]
fn kafka_partitions_are_checked() {
    let consumer = |parts: &str| {
        format!(
            "[[consumers]]\nname = \"c\"\ntopics = [\"t\"]\nhandler = \"builtin:billing\"\nkafka_partitions = {parts}\n"
        )
    };
    let kafka =
        "[transport]\nkind = \"kafka\"\n[transport.kafka]\n\"bootstrap.servers\" = \"b:9092\"\n";
    let c = Config::from_toml(
        "t.toml",
        &format!("{kafka}{}", consumer("[0, 2]")),
        env(&[]),
    )
    .expect("assigned partitions on kafka");
    assert_eq!(c.consumers[0].kafka_partitions, Some(vec![0, 2]));

    let (key, msg) = key_error(Config::from_toml("t.toml", &consumer("[0]"), env(&[])));
    assert_eq!(key, "consumers[0].kafka_partitions");
    assert!(msg.contains("kafka"), "{msg}");
    for bad in ["[]", "[1, 1]", "[-1]"] {
        let (key, msg) = key_error(Config::from_toml(
            "t.toml",
            &format!("{kafka}{}", consumer(bad)),
            env(&[]),
        ));
        assert_eq!(key, "consumers[0].kafka_partitions", "{bad}");
        assert!(msg.contains("distinct partition numbers"), "{bad}: {msg}");
    }
}

/// `consumers[].kafka_stall_timeout`: 30 s unless set, a duration, and
/// `"0s"` turns the group member's watch off.
#[test]
fn kafka_stall_timeout_is_a_duration_with_a_default() {
    let kafka =
        "[transport]\nkind = \"kafka\"\n[transport.kafka]\n\"bootstrap.servers\" = \"b:9092\"\n";
    let consumer = |extra: &str| {
        format!(
            "{kafka}[[consumers]]\nname = \"c\"\ntopics = [\"t\"]\nhandler = \"builtin:billing\"\n{extra}"
        )
    };
    let stall = |extra: &str| {
        Config::from_toml("t.toml", &consumer(extra), env(&[]))
            .expect(extra)
            .consumers[0]
            .kafka_stall_timeout
    };
    assert_eq!(stall(""), Duration::from_secs(30));
    assert_eq!(
        stall("kafka_stall_timeout = \"2m\"\n"),
        Duration::from_secs(120)
    );
    assert_eq!(stall("kafka_stall_timeout = \"0s\"\n"), Duration::ZERO);
    let err = Config::from_toml(
        "t.toml",
        &consumer("kafka_stall_timeout = \"soon\"\n"),
        env(&[]),
    )
    .expect_err("not a duration")
    .to_string();
    assert!(
        err.contains("kafka_stall_timeout") && err.contains("`soon` is not a duration"),
        "{err}"
    );
}

/// A SQLite relay renews its lease every third of it while a batch is in
/// flight; a lease too short to renew is refused, and only on SQLite.
#[test]
fn a_sqlite_relay_lease_too_short_to_renew_is_named() {
    let short = "[relay]\nlease_ms = 900\npublish_timeout_ms = 500\n";
    let (key, msg) = key_error(Config::from_toml("t.toml", short, env(&[])));
    assert_eq!(key, "relay.lease");
    assert!(
        msg.contains("at least 1000") && msg.contains("renew"),
        "{msg}"
    );
    let on_postgres = format!("[database]\nurl = \"postgres://app@db/orders\"\n{short}");
    Config::from_toml("t.toml", &on_postgres, env(&[])).expect("Postgres has no relay lease");
    Config::from_toml(
        "t.toml",
        "[relay]\nlease_ms = 1000\npublish_timeout_ms = 500\n",
        env(&[]),
    )
    .expect("a second is enough");
}

/// `database.max_connections` must cover what the process holds at once:
/// the relay workers' claims (two each when pipelined), the embedded
/// transport's writer, Postgres LISTEN connections, a connection per
/// consumer, and a spare.
#[test]
fn a_pool_smaller_than_what_the_process_holds_is_named() {
    let pg = "[database]\nurl = \"postgres://app@db/orders\"\n";
    let consumer =
        "[[consumers]]\nname = \"billing\"\ntopics = [\"orders\"]\nhandler = \"builtin:billing\"\n";
    let tight =
        format!("{pg}max_connections = 8\n[relay]\nworkers = 2\npipeline = true\n{consumer}");
    let (key, msg) = key_error(Config::from_toml("t.toml", &tight, env(&[])));
    assert_eq!(key, "database.max_connections");
    // 4 claims + 1 writer + 2 LISTEN (relay, consumer) + 1 consumer + 1 spare.
    for part in [
        "at least 9",
        "relay.workers = 2",
        "relay.pipeline",
        "consumers[0] at least 1",
        "LISTEN",
    ] {
        assert!(msg.contains(part), "`{part}` missing: {msg}");
    }
    let enough = tight.replace("max_connections = 8", "max_connections = 9");
    let c = Config::from_toml("t.toml", &enough, env(&[])).expect("9 connections are enough");
    assert_eq!(c.consumer_parallel_partitions(), 1);
    let roomy = tight.replace("max_connections = 8", "max_connections = 20");
    let c = Config::from_toml("t.toml", &roomy, env(&[])).expect("20 connections");
    assert_eq!(
        c.consumer_parallel_partitions(),
        12,
        "the consumer gets what is left"
    );
    // SQLite has no LISTEN connections.
    let sqlite = format!(
        "[database]\nmax_connections = 6\n[relay]\nworkers = 2\npipeline = true\n{consumer}"
    );
    let (key, msg) = key_error(Config::from_toml("t.toml", &sqlite, env(&[])));
    assert_eq!(key, "database.max_connections");
    assert!(msg.contains("at least 7"), "{msg}");
}

/// The example config at the root holds every section, and the code
/// accepts it as it is.
#[test]
fn the_example_config_parses_and_validates() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../outboxd.example.toml");
    let text = std::fs::read_to_string(&path).expect("outboxd.example.toml at the repo root");
    let config = Config::from_toml("outboxd.example.toml", &text, env(&[]))
        .unwrap_or_else(|e| panic!("outboxd.example.toml: {e}"));
    let table: toml::Table = text.parse().expect("TOML");
    for section in [
        "database",
        "transport",
        "relay",
        "routes",
        "plugins",
        "plugin_runtime",
        "consumers",
        "log",
        "retention",
        "reconcile",
        "admin",
        "telemetry",
    ] {
        assert!(
            table.contains_key(section),
            "outboxd.example.toml has no [{section}] section"
        );
    }
    assert_eq!(config.consumers.len(), 1);
    assert_eq!(config.plugins.len(), 2);
}

/// Every TOML block that README.md shows is a config the code accepts.
#[test]
fn every_toml_block_in_the_readme_parses_and_validates() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let mut blocks = 0;
    let mut rest = readme.as_str();
    while let Some(start) = rest.find("```toml\n") {
        let body = &rest[start + "```toml\n".len()..];
        let end = body.find("\n```").expect("a closed ```toml block");
        let block = &body[..end];
        let line = readme[..readme.len() - rest.len() + start].lines().count() + 1;
        if let Err(e) = Config::from_toml("README.md", block, env(&[])) {
            panic!("README.md, the TOML block at line {line}: {e}\n{block}");
        }
        blocks += 1;
        rest = &body[end..];
    }
    assert!(
        blocks >= 3,
        "README.md shows {blocks} TOML blocks; expected the config examples"
    );
}

/// Every TOML block in docs/ and SECURITY.md is a config the code accepts
/// (unknown keys are refused), so the reference pages cannot drift from the
/// parser.
#[test]
fn every_toml_block_in_the_docs_parses_and_validates() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.push(root.join("SECURITY.md"));
    pages.sort();
    let mut blocks = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a docs page");
        let name = page.file_name().expect("a name").to_string_lossy();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```toml\n") {
            let body = &rest[start + "```toml\n".len()..];
            let end = body.find("\n```").expect("a closed ```toml block");
            let block = &body[..end];
            let line = text[..text.len() - rest.len() + start].lines().count() + 1;
            // The one secret variable the pages' examples name.
            let secrets = env(&[(
                "ORDERS_WEBHOOK_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            )]);
            if let Err(e) = Config::from_toml(&name, block, secrets) {
                panic!("{name}, the TOML block at line {line}: {e}\n{block}");
            }
            blocks += 1;
            rest = &body[end..];
        }
    }
    assert!(
        blocks >= 2,
        "docs/ shows {blocks} TOML blocks; expected at least the TLS examples"
    );
}

/// Durations are humantime strings; the older `*_ms` keys (milliseconds)
/// are read for one release, each with a warning that names the key to
/// write instead, from the file and from the environment alike.
#[test]
fn durations_are_strings_and_old_millisecond_keys_warn() {
    let c = Config::from_toml(
        "t.toml",
        "[relay]\npoll_interval = \"250ms\"\npublish_timeout = \"5s\"\nlease = \"1m\"\n\
         [transport]\nconsumer_lease = \"20s\"\n\
         [plugin_runtime]\nregistry_poll = \"2s\"\n",
        env(&[]),
    )
    .expect("durations");
    assert_eq!(c.relay.poll_interval, Duration::from_millis(250));
    assert_eq!(c.relay.publish_timeout, Duration::from_secs(5));
    assert_eq!(c.relay.lease, Duration::from_secs(60));
    assert_eq!(c.transport.consumer_lease, Duration::from_secs(20));
    assert_eq!(c.plugin_runtime.registry_poll, Some(Duration::from_secs(2)));
    assert!(c.deprecations.is_empty(), "{:?}", c.deprecations);

    let old = Config::from_toml(
        "t.toml",
        "[relay]\npoll_interval_ms = 250\n",
        env(&[("OUTBOXD__RELAY__PUBLISH_TIMEOUT_MS", "4000")]),
    )
    .expect("the old keys");
    assert_eq!(old.relay.poll_interval, Duration::from_millis(250));
    assert_eq!(old.relay.publish_timeout, Duration::from_secs(4));
    assert_eq!(old.deprecations.len(), 2, "{:?}", old.deprecations);
    for (old_key, new) in [
        ("relay.poll_interval_ms", "relay.poll_interval = \"250ms\""),
        ("relay.publish_timeout_ms", "relay.publish_timeout = \"4s\""),
    ] {
        assert!(
            old.deprecations
                .iter()
                .any(|w| w.contains(old_key) && w.contains(new)),
            "no warning naming `{new}` in {:?}",
            old.deprecations
        );
    }

    let (key, msg) = key_error(Config::from_toml(
        "t.toml",
        "[relay]\npoll_interval = \"soon\"\n",
        env(&[]),
    ));
    assert_eq!(key, "relay.poll_interval");
    assert!(msg.contains("`soon` is not a duration"), "{msg}");
}

/// The example config writes every duration the new way.
#[test]
fn the_example_config_uses_no_deprecated_key() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../outboxd.example.toml");
    let text = std::fs::read_to_string(&path).expect("outboxd.example.toml at the repo root");
    let config = Config::from_toml("outboxd.example.toml", &text, env(&[])).expect("parses");
    assert!(config.deprecations.is_empty(), "{:?}", config.deprecations);
}
