//! Fix-forward on the consumer: `Handler::pin_version` runs one message on
//! a named registry version of the consumer's plugin (a candidate included)
//! while `pin` keeps giving the live one, refuses what cannot run with the
//! fix, and a dry run reports the outcome and the plugin's statements from a
//! transaction that is rolled back.
//!
//! The consumer plugin `c` has two versions from the example components:
//! `billing` (v1, an invoice stamped with the current time) and
//! `invoicing` (v2, an invoice with `issued_at = 0` and an `invoice.issued`
//! event), so every effect shows which version wrote it.

use std::sync::Arc;

use outboxd::consumer::ConsumerHandler;
use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::consumer::PluginHandler;
use outboxd::consumer::Processed;
use outboxd::message::Delivery;
use outboxd::plugin::ConsumerPlugin;
use outboxd::plugin::host::transaction::StatementKind;
use outboxd::plugin::lifecycle::registry::Registry;
use outboxd::store::InboxTx;
use outboxd_demo::billing;
use serde_json::json;

use crate::support::db::pairs;
use crate::support::plugins::{engine, plugin_path, registry_spec, wasm, with_custom_section};
use crate::support::process::outboxd;
use crate::support::swap::{consumer_host, deploy};
use crate::support::{TestDb, eventually, on_both, plugin_policy};

fn delivery(order: &str) -> Delivery {
    Delivery {
        attempt: 0,
        topic: "orders".into(),
        partition: 0,
        offset: 0,
        key: Some(order.as_bytes().to_vec()),
        payload: json!({"order_id": order, "customer_id": "c1", "total_cents": 700})
            .to_string()
            .into_bytes(),
        headers: vec![(
            outboxd::message::headers::MESSAGE_ID.into(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
    }
}

/// Handles `d` for consumer `billing` on `pinned`, as the redrive applier
/// does: inbox mark naming the version, the handler, commit.
async fn apply_pinned<H: Handler>(
    t: &TestDb,
    handler: &H,
    pinned: &outboxd::consumer::Pinned,
    d: &Delivery,
) {
    let mut tx = InboxTx::begin(&t.db).await.expect("begin");
    handler.begin(&mut tx).await.expect("begin hook");
    let id = d.message_id().expect("message id");
    assert!(
        tx.mark("billing", id, pinned.label.as_deref())
            .await
            .expect("mark")
    );
    handler
        .handle_pinned(pinned, &mut tx, d)
        .await
        .expect("handled");
    handler.before_commit(&mut tx).await.expect("before commit");
    tx.commit().await.expect("commit");
}

/// Each invoice's order and the component that wrote it: `invoicing`
/// writes `issued_at = 0`, `billing` the time.
async fn invoices(t: &TestDb) -> Vec<(String, Option<String>)> {
    pairs(
        &t.db,
        "SELECT order_id, CASE WHEN issued_at = 0 THEN 'invoicing' ELSE 'billing' END FROM invoices ORDER BY order_id",
    )
    .await
}

async fn pin_version_runs_a_candidate_for_one_message_while_pin_keeps_the_live_version(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    let v2 = deploy(&reg, "c", wasm("invoicing")).await;
    reg.activate("c", v1, "test").await.expect("activate v1");
    let (host, handler) = consumer_host(&t).await;

    let pinned = handler
        .pin_version(&format!("c@{v2}"))
        .await
        .expect("pin the candidate");
    assert_eq!(pinned.label, Some(format!("c@{v2}")));
    let live = handler.pin();
    assert_eq!(live.label, Some(format!("c@{v1}")), "pin() still gives v1");
    assert_eq!(
        host.consumer("c").expect("slot").label(),
        Some(format!("c@{v1}"))
    );

    let redriven = delivery("o-redriven");
    apply_pinned(&t, &handler, &pinned, &redriven).await;
    // Live traffic, handled the ordinary way, stays on v1.
    let ordinary = delivery("o-live");
    outboxd::consumer::process(&t.db, "billing", &ordinary, &handler)
        .await
        .expect("live message");

    assert_eq!(
        invoices(&t).await,
        vec![
            ("o-live".to_string(), Some("billing".to_string())),
            ("o-redriven".to_string(), Some("invoicing".to_string())),
        ]
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE event_type = 'invoice.issued'")
            .await,
        1,
        "v2's event, in the same transaction as its invoice"
    );
    let handled_by = pairs(
        &t.db,
        "SELECT CAST(message_id AS TEXT), handled_by FROM inbox ORDER BY handled_by",
    )
    .await;
    let id = |d: &Delivery| d.message_id().expect("id").to_string();
    assert_eq!(
        handled_by,
        vec![
            (id(&ordinary), Some(format!("c@{v1}"))),
            (id(&redriven), Some(format!("c@{v2}"))),
        ]
    );
    assert_eq!(reg.get("c", v2).await.expect("v2").state, "candidate");
    // The version stays loaded for the next redriven message: the same plugin.
    let again = handler
        .pin_version(&format!("c@{v2}"))
        .await
        .expect("pin again");
    let plugin = |p: &outboxd::consumer::Pinned| {
        p.versions
            .as_ref()
            .and_then(|v| v.active.clone())
            .expect("a version")
    };
    assert!(Arc::ptr_eq(&plugin(&pinned), &plugin(&again)));

    // Through the configured handler, as the daemon holds it.
    let configured = ConsumerHandler::Plugin(handler.clone());
    let via = configured
        .pin_version(&format!("c@{v2}"))
        .await
        .expect("forwarded");
    assert_eq!(via.label, Some(format!("c@{v2}")));
}
on_both!(pin_version_runs_a_candidate_for_one_message_while_pin_keeps_the_live_version);

fn permanent(r: Result<outboxd::consumer::Pinned, HandlerError>) -> String {
    match r {
        Err(HandlerError::Permanent(why)) => why,
        Err(other) => panic!("not permanent: {other}"),
        Ok(p) => panic!("pinned {:?}", p.label),
    }
}

async fn pin_version_refuses_what_cannot_run_naming_the_plugin_the_version_and_the_fix(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    let retired = deploy(&reg, "c", with_custom_section(wasm("billing"), "rebuild-2")).await;
    reg.activate("c", v1, "test").await.expect("activate");
    reg.retire("c", retired).await.expect("retire");
    let (_host, handler) = consumer_host(&t).await;

    let why = permanent(handler.pin_version("c@9").await);
    assert!(
        why.contains("plugin `c` has no version 9") && why.contains("outboxd plugin list"),
        "{why}"
    );
    let why = permanent(handler.pin_version(&format!("c@{retired}")).await);
    assert!(
        why.contains(&format!("c@{retired}"))
            && why.contains("retired")
            && why.contains("outboxd plugin deploy"),
        "{why}"
    );
    let why = permanent(handler.pin_version("other@1").await);
    assert!(
        why.contains("runs plugin `c`, not `other`") && why.contains("outboxd plugin list"),
        "{why}"
    );
    let why = permanent(handler.pin_version("c").await);
    assert!(why.contains("NAME@VERSION"), "{why}");

    // A file plugin has only its own version.
    let file = Arc::new(
        ConsumerPlugin::load(engine(), &{
            let mut s = registry_spec("c");
            s.source = outboxd::config::PluginSource::File;
            s.path = plugin_path("billing");
            s.version = Some("1.0".into());
            s
        })
        .expect("load"),
    );
    let fixed = PluginHandler::new(file, plugin_policy());
    assert_eq!(
        fixed.pin_version("c@1.0").await.expect("its own").label,
        Some("c@1.0".into())
    );
    let why = permanent(fixed.pin_version(&format!("c@{v1}")).await);
    assert!(why.contains("loaded from a file"), "{why}");

    // A handler without versions refuses any.
    let why = permanent(NoVersions.pin_version("c@1").await);
    assert!(why.contains("not a plugin with versions"), "{why}");
}
on_both!(pin_version_refuses_what_cannot_run_naming_the_plugin_the_version_and_the_fix);

/// A handler with no versions, as a native one is.
struct NoVersions;

impl Handler for NoVersions {
    async fn handle(&self, _tx: &mut InboxTx, _d: &Delivery) -> Result<(), HandlerError> {
        Ok(())
    }
}

async fn a_consumer_dry_run_reports_the_outcome_and_statements_and_commits_nothing(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    let v2 = deploy(&reg, "c", wasm("invoicing")).await;
    reg.activate("c", v1, "test").await.expect("activate v1");
    let (_host, handler) = consumer_host(&t).await;
    let d = delivery("o-1");
    let pinned = handler
        .pin_version(&format!("c@{v2}"))
        .await
        .expect("pin v2");

    let run = handler.dry_run(&t.db, "billing", &pinned, &d).await;
    assert_eq!(run.handled_by, Some(format!("c@{v2}")));
    assert!(
        matches!(run.outcome, Ok(Processed::Handled)),
        "{:?}",
        run.outcome
    );
    let shown: Vec<(StatementKind, String, String)> = run
        .statements
        .iter()
        .map(|s| {
            (
                s.kind,
                s.text.split_whitespace().collect::<Vec<_>>().join(" "),
                s.outcome.clone(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            (
                StatementKind::Query,
                "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at) VALUES ($1, $2, $3, $4, 0) RETURNING id".to_string(),
                "ok: 1 row".to_string()
            ),
            (
                StatementKind::Emit,
                "invoice.issued".to_string(),
                "ok: event written to the outbox".to_string()
            ),
        ]
    );
    let recorded = format!("{:?}", run.statements);
    assert!(
        !recorded.contains("o-1") && !recorded.contains("700"),
        "no parameter value is recorded: {recorded}"
    );
    for (table, sql) in [
        ("invoices", "SELECT count(*) FROM invoices"),
        ("outbox", "SELECT count(*) FROM outbox"),
        ("inbox", "SELECT count(*) FROM inbox"),
    ] {
        assert_eq!(t.count(sql).await, 0, "the dry run left a row in {table}");
    }

    // The active version on a message it refuses: the outcome says so.
    let envelope = Delivery {
        payload: json!({"specversion": "9", "data": {}})
            .to_string()
            .into_bytes(),
        ..delivery("o-2")
    };
    let run = handler
        .dry_run(&t.db, "billing", &handler.pin(), &envelope)
        .await;
    assert_eq!(run.handled_by, Some(format!("c@{v1}")));
    assert!(
        matches!(&run.outcome, Err(HandlerError::Permanent(why)) if why.contains(&format!("plugin c@{v1}"))),
        "{:?}",
        run.outcome
    );

    // Through the configured handler, as the daemon holds it; a native
    // handler may act outside its transaction, so it is not dry-run.
    let configured = ConsumerHandler::Plugin(handler.clone());
    let run = configured.dry_run(&t.db, "billing", &pinned, &d).await;
    assert!(
        matches!(run.outcome, Ok(Processed::Handled)),
        "{:?}",
        run.outcome
    );
    assert_eq!(run.statements.len(), 2);
    let mut natives = outboxd::consumer::NativeHandlers::default();
    natives.register("plain", NoVersions);
    let native = ConsumerHandler::Native(
        natives
            .get("consumers[0].handler", "plain")
            .expect("registered"),
    );
    let run = native.dry_run(&t.db, "billing", &native.pin(), &d).await;
    assert!(
        matches!(&run.outcome, Err(HandlerError::Permanent(why)) if why.contains("builtin:plain") && why.contains("not dry-run")),
        "{:?}",
        run.outcome
    );
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 0);

    // Once handled for real, a dry run finds the inbox mark: a duplicate
    // runs nothing.
    outboxd::consumer::process(&t.db, "billing", &d, &handler)
        .await
        .expect("handled");
    let run = handler.dry_run(&t.db, "billing", &pinned, &d).await;
    assert!(
        matches!(run.outcome, Ok(Processed::Duplicate)),
        "{:?}",
        run.outcome
    );
    assert!(run.statements.is_empty());
    assert_eq!(t.count("SELECT count(*) FROM invoices").await, 1);
}
on_both!(a_consumer_dry_run_reports_the_outcome_and_statements_and_commits_nothing);

async fn a_consumer_dead_letter_dry_runs_on_a_candidate_and_on_the_active_version(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    let v2 = deploy(&reg, "c", wasm("invoicing")).await;
    reg.activate("c", v1, "test").await.expect("activate v1");
    // A dead letter as the consumer writes it: billing (v1) refused it.
    let d = delivery("o-9");
    outboxd::store::inbox::dead_letters::record(
        &t.db,
        "billing",
        &d,
        "refused",
        "plugin c@1",
        1,
        true,
    )
    .await
    .expect("record a dead letter");
    let letters = outboxd::ops::consumer_dead::list(&t.db, "billing", None, 10)
        .await
        .expect("list");
    let letter = outboxd::ops::consumer_dead::show(&t.db, "billing", letters[0].id)
        .await
        .expect("show");
    let mut consumer =
        outboxd::config::ConsumerSection::new("billing", vec!["orders".into()], "plugin:c");
    consumer.tables = crate::support::plugin_tables();
    let plugins = vec![registry_spec("c")];
    let before = t
        .count("SELECT count(*) FROM consumer_dead_letters WHERE resolved_at IS NULL")
        .await;

    let runs = outboxd::ops::fix_forward::consumer_dry_run(
        &t.db,
        engine().clone(),
        &consumer,
        &plugins,
        std::slice::from_ref(&letter),
        Some(&format!("c@{v2}")),
    )
    .await
    .expect("dry run on the candidate");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].id, letter.id);
    assert_eq!(runs[0].run.handled_by, Some(format!("c@{v2}")));
    assert!(
        matches!(runs[0].run.outcome, Ok(Processed::Handled)),
        "{:?}",
        runs[0].run.outcome
    );
    let kinds: Vec<StatementKind> = runs[0].run.statements.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, vec![StatementKind::Query, StatementKind::Emit]);

    let runs = outboxd::ops::fix_forward::consumer_dry_run(
        &t.db,
        engine().clone(),
        &consumer,
        &plugins,
        std::slice::from_ref(&letter),
        None,
    )
    .await
    .expect("dry run on the active version");
    assert_eq!(runs[0].run.handled_by, Some(format!("c@{v1}")));
    assert!(
        matches!(runs[0].run.outcome, Ok(Processed::Handled)),
        "{:?}",
        runs[0].run.outcome
    );
    assert_eq!(
        runs[0].run.statements.len(),
        1,
        "billing writes one invoice"
    );

    let e = outboxd::ops::fix_forward::consumer_dry_run(
        &t.db,
        engine().clone(),
        &consumer,
        &plugins,
        std::slice::from_ref(&letter),
        Some("c@77"),
    )
    .await
    .expect_err("no such version");
    assert!(e.to_string().contains("no version 77"), "{e}");

    for sql in [
        "SELECT count(*) FROM invoices",
        "SELECT count(*) FROM outbox",
        "SELECT count(*) FROM inbox",
    ] {
        assert_eq!(t.count(sql).await, 0, "{sql}: nothing committed");
    }
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE resolved_at IS NULL")
            .await,
        before,
        "the dead letter is untouched"
    );
}
on_both!(a_consumer_dead_letter_dry_runs_on_a_candidate_and_on_the_active_version);

async fn the_command_line_dry_runs_a_consumer_redrive_and_changes_nothing(t: TestDb) {
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    let v1 = deploy(&reg, "c", wasm("billing")).await;
    let v2 = deploy(&reg, "c", wasm("invoicing")).await;
    reg.activate("c", v1, "test").await.expect("activate v1");
    let mut consumer =
        outboxd::config::ConsumerSection::new("billing", vec!["orders".into()], "plugin:c");
    consumer.tables = outboxd::config::TableGrants {
        read: vec![],
        write: vec!["invoices".into()],
    };
    let role = t.provision_plugin_role(&mut consumer).await;
    let d = delivery("o-5");
    outboxd::store::inbox::dead_letters::record(
        &t.db,
        "billing",
        &d,
        "refused",
        "plugin c@1",
        1,
        true,
    )
    .await
    .expect("record a dead letter");
    let id = outboxd::ops::consumer_dead::list(&t.db, "billing", None, 10)
        .await
        .expect("list")[0]
        .id
        .to_string();
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("outboxd.toml");
    let role_line = role
        .map(|r| format!("db_role = \"{r}\"\n"))
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            r#"
[[plugins]]
name = "c"
source = "registry"

[[consumers]]
name = "billing"
topics = ["orders"]
handler = "plugin:c"
{role_line}
[consumers.tables]
write = ["invoices"]
"#
        ),
    )
    .expect("config");
    let out = outboxd(&t)
        .arg("--config")
        .arg(&config)
        .args([
            "dead",
            "redrive",
            "--consumer",
            "billing",
            "--id",
            &id,
            "--with",
            &format!("c@{v2}"),
            "--dry-run",
        ])
        .output()
        .await
        .expect("run outboxd");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("dead letter {id}  orders/0@0  through c@{v2}"))
            && text.contains("would apply it")
            && text.contains("query   INSERT INTO invoices")
            && text.contains("emit    invoice.issued  -> ok: event written to the outbox")
            && text.contains("nothing was applied or changed"),
        "{text}"
    );
    for sql in [
        "SELECT count(*) FROM invoices",
        "SELECT count(*) FROM outbox",
        "SELECT count(*) FROM inbox",
    ] {
        assert_eq!(t.count(sql).await, 0, "{sql}: nothing committed");
    }
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE state = 'dead' AND resolved_at IS NULL")
            .await,
        1,
        "the dead letter was not released"
    );
}
on_both!(the_command_line_dry_runs_a_consumer_redrive_and_changes_nothing);

/// A message dead on v1, released through v2 (a candidate) by an operator,
/// is applied by the running consumer on v2 (its key's parked successor
/// following on v1), while live traffic stays on v1: the redrive applier
/// calling `pin_version`.
async fn a_consumer_message_dead_on_v1_is_applied_by_a_v2_candidate_while_live_traffic_stays_on_v1(
    t: TestDb,
) {
    use outboxd::broker::Publisher;
    use outboxd::broker::embedded::{EmbeddedConsumer, EmbeddedConsumerConfig, EmbeddedPublisher};
    use outboxd::consumer::{Consumer, ConsumerConfig};
    use outboxd::message::OutgoingMessage;
    billing::create_schema(&t.db).await.expect("billing schema");
    let reg = Registry::new(t.db.clone());
    // invoicing (v1) cannot read a CloudEvents envelope; billing (v2) can.
    let v1 = deploy(&reg, "c", wasm("invoicing")).await;
    let v2 = deploy(&reg, "c", wasm("billing")).await;
    reg.activate("c", v1, "test").await.expect("activate v1");
    let (host, handler) = consumer_host(&t).await;
    let publisher = EmbeddedPublisher::new(t.db.clone(), 1);
    let send = |key: &str, payload: serde_json::Value| {
        let id = uuid::Uuid::new_v4();
        let msg = OutgoingMessage {
            topic: "orders".into(),
            key: key.as_bytes().to_vec(),
            payload: payload.to_string().into_bytes(),
            headers: vec![(
                outboxd::message::headers::MESSAGE_ID.into(),
                id.to_string().into_bytes(),
            )],
            message_id: id,
            created_at: chrono::Utc::now(),
        };
        let publisher = &publisher;
        async move {
            publisher.publish(msg).await.expect("publish");
            id
        }
    };
    let order = |o: &str| json!({"order_id": o, "customer_id": "c1", "total_cents": 5});
    let poison = send(
        "k",
        json!({"specversion": "1.0", "data": order("o-envelope")}),
    )
    .await;
    let parked = send("k", order("o-after")).await;
    let mut consumer = Consumer::new(
        t.db.clone(),
        EmbeddedConsumer::new(
            t.db.clone(),
            EmbeddedConsumerConfig {
                group: "billing".into(),
                topics: vec!["orders".into()],
                partitions: 1,
                lease: std::time::Duration::from_secs(30),
            },
        ),
        Arc::new(handler),
        ConsumerConfig {
            name: "billing".into(),
            max_attempts: 1,
            parking_check: std::time::Duration::ZERO,
            ..ConsumerConfig::default()
        },
    );
    for _ in 0..3 {
        consumer.step().await.expect("step");
    }
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE state = 'dead'")
            .await,
        1,
        "the envelope died on v1"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM invoices").await,
        0,
        "its successor is parked"
    );
    let dead = outboxd::ops::consumer_dead::list(&t.db, "billing", None, 10)
        .await
        .expect("list")
        .into_iter()
        .find(|r| r.state == "dead")
        .expect("a dead letter");
    outboxd::ops::consumer_dead::check_with(&t.db, Some("c"), &format!("c@{v2}"))
        .await
        .expect("c@2 is a version of the consumer's plugin");
    let n = outboxd::ops::consumer_dead::redrive(
        &t.db,
        "billing",
        &outboxd::ops::consumer_dead::Target::Id(dead.id),
        Some(&format!("c@{v2}")),
        &outboxd::fault::Faults::none(),
    )
    .await
    .expect("release through v2");
    assert_eq!(n, 1);
    let live = send("other", order("o-live")).await;
    eventually(
        std::time::Duration::from_secs(30),
        "not applied",
        async || {
            if t.count("SELECT count(*) FROM invoices").await >= 3 {
                return Ok(());
            }
            let applied = format!("{:?}", invoices(&t).await);
            consumer.step().await.expect("step");
            Err(applied)
        },
    )
    .await;
    let id = |u: uuid::Uuid| u.to_string();
    let by = pairs(
        &t.db,
        "SELECT CAST(message_id AS TEXT), handled_by FROM inbox",
    )
    .await
    .into_iter()
    .collect::<std::collections::BTreeMap<_, _>>();
    assert_eq!(
        by[&id(poison)],
        Some(format!("c@{v2}")),
        "the redriven message ran on v2"
    );
    assert_eq!(
        by[&id(parked)],
        Some(format!("c@{v1}")),
        "its parked successor on v1"
    );
    assert_eq!(by[&id(live)], Some(format!("c@{v1}")), "live traffic on v1");
    assert_eq!(
        invoices(&t).await,
        vec![
            ("o-after".to_string(), Some("invoicing".to_string())),
            ("o-envelope".to_string(), Some("billing".to_string())),
            ("o-live".to_string(), Some("invoicing".to_string())),
        ]
    );
    assert_eq!(
        host.consumer("c").expect("slot").label(),
        Some(format!("c@{v1}"))
    );
    assert_eq!(reg.get("c", v2).await.expect("v2").state, "candidate");
}
on_both!(a_consumer_message_dead_on_v1_is_applied_by_a_v2_candidate_while_live_traffic_stays_on_v1);
