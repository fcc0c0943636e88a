//! Fix-forward on the relay: a dead event redriven `--with NAME@VERSION`
//! runs through that registry version (a candidate) while live traffic
//! stays on the active one; a version that cannot run there is refused at
//! redrive time, or, when it stops being runnable before the relay claims
//! the event, kills the event again with the reason; a dry run shows what
//! the version would publish and changes nothing. Through the library, the
//! admin API of a running pipeline and the command line.
//!
//! The plugin `t` has two versions built from `plugins/amount-cents`: v1
//! fails an amount written as text (`"12.50"`) permanently, v2 reads it.
//! Each stamps the header `amount-cents-by` with its build.

use std::collections::BTreeMap;
use std::time::Duration;

use outboxd::config::Config;
use outboxd::config::PluginSource;
use outboxd::config::PluginSpec;
use outboxd::daemon::Daemon;
use outboxd::message::OutgoingMessage;
use outboxd::ops::dead::DeadFilter;
use outboxd::ops::fix_forward::{self, DryRunOutcome, FixForwardError, Pipeline};
use outboxd::plugin::lifecycle::registry::{Deployed, Registry};
use outboxd::relay::Relay;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::store::AnyStore;
use serde_json::{Value, json};

use crate::support::admin::{TOKEN, admin_config, http};
use crate::support::db::pairs;
use crate::support::plugins::{engine, json_of, registry_spec, wasm, with_custom_section};
use crate::support::process::outboxd;
use crate::support::swap::{
    active_label, deploy, deploy_t, put_placed, relay, rollout, routes, transformed_by,
};
use crate::support::{self, ScriptedPublisher, TestDb, eventually, on_both};

const POISON: &str = "12.50";

/// `t@v1` active and `t@v2` a candidate, as deployed.
struct Versions {
    v1: i64,
    v2: i64,
}

async fn deploy_both(reg: &Registry) -> Versions {
    let v1 = deploy_t(reg, "amount-cents").await;
    let v2 = deploy_t(reg, "amount-cents-v2").await;
    reg.activate("t", v1, "test").await.expect("activate v1");
    Versions { v1, v2 }
}

fn specs() -> Vec<PluginSpec> {
    vec![registry_spec("t")]
}

/// Steps until nothing is due.
async fn drain(relay: &Relay<AnyStore, std::sync::Arc<ScriptedPublisher>>) {
    eventually(
        Duration::from_secs(60),
        "the relay never went idle",
        async || relay.step().await.expect("step") == StepOutcome::Idle,
    )
    .await;
}

fn header<'a>(m: &'a OutgoingMessage, name: &str) -> &'a str {
    std::str::from_utf8(m.header(name).unwrap_or_else(|| panic!("no {name} header")))
        .expect("utf-8 header")
}

/// The dead events' seqs, oldest first.
async fn dead_seqs(t: &TestDb) -> Vec<i64> {
    pairs(
        &t.db,
        "SELECT CAST(seq AS TEXT), CAST(NULL AS TEXT) FROM outbox WHERE dead_at IS NOT NULL ORDER BY seq",
    )
    .await
    .into_iter()
    .map(|(s, _)| s.parse().expect("seq"))
    .collect()
}

/// Every outbox row as `seq -> state|attempts|redrive_with|transformed_by`.
async fn outbox_rows(t: &TestDb) -> Vec<(String, Option<String>)> {
    pairs(
        &t.db,
        "SELECT CAST(seq AS TEXT),
                CASE WHEN published_at IS NOT NULL THEN 'done' WHEN dead_at IS NOT NULL THEN 'dead' ELSE 'pending' END
                || '|' || CAST(attempts AS TEXT) || '|' || coalesce(redrive_with, '-')
                || '|' || coalesce(transformed_by, '-') || '|' || coalesce(dead_reason, '-')
           FROM outbox ORDER BY seq",
    )
    .await
}

/// The error of a redrive that must be refused.
async fn refused(
    db: &outboxd::store::Db,
    pipeline: Pipeline<'_>,
    filter: &DeadFilter,
    label: &str,
) -> FixForwardError {
    fix_forward::redrive_with(db, pipeline, filter, label, chrono::Utc::now())
        .await
        .expect_err(label)
}

fn one(seq: i64) -> DeadFilter {
    DeadFilter {
        seq: Some(seq),
        ..DeadFilter::default()
    }
}

async fn a_poison_event_dead_on_v1_is_published_by_a_v2_candidate_while_live_traffic_stays_on_v1(
    t: TestDb,
) {
    let reg = Registry::new(t.db.clone());
    let Versions { v1, v2 } = deploy_both(&reg).await;
    let host = rollout(&t.db, specs(), routes());
    host.refresh().await.expect("refresh");
    let broker = ScriptedPublisher::new();
    let relay = relay(&t, broker.clone(), &host, routes());

    let poison = put_placed(&t.db, "a", json!({"order_id": "o-1", "amount": POISON})).await;
    let held = put_placed(&t.db, "a", json!({"order_id": "o-2", "amount": 3})).await;
    let other = put_placed(&t.db, "b", json!({"order_id": "o-3", "amount": 5})).await;
    drain(&relay).await;
    let dead = dead_seqs(&t).await;
    assert_eq!(dead.len(), 1, "the poison event died on v1");
    let ids: Vec<uuid::Uuid> = broker.sent().iter().map(|m| m.message_id).collect();
    assert_eq!(
        ids,
        vec![other],
        "the other aggregate flowed; the poison's successor is held back"
    );

    let pipeline = Pipeline {
        routes: &routes(),
        plugins: &specs(),
    };
    let n = fix_forward::redrive_with(
        &t.db,
        pipeline,
        &one(dead[0]),
        &format!("t@{v2}"),
        chrono::Utc::now(),
    )
    .await
    .expect("redrive through the candidate");
    assert_eq!(n, 1);
    // Live traffic keeps arriving after the redrive.
    let live = put_placed(&t.db, "c", json!({"order_id": "o-4", "amount": 7})).await;
    drain(&relay).await;

    let sent = broker.sent();
    let at: BTreeMap<uuid::Uuid, usize> = sent
        .iter()
        .enumerate()
        .map(|(i, m)| (m.message_id, i))
        .collect();
    assert_eq!(sent.len(), 4, "every event published once: {at:?}");
    let fixed = &sent[at[&poison]];
    assert_eq!(header(fixed, "amount-cents-by"), "amount-cents-v2");
    assert_eq!(json_of(&fixed.payload)["amount_cents"], json!(1250));
    for id in [held, other, live] {
        assert_eq!(
            header(&sent[at[&id]], "amount-cents-by"),
            "amount-cents-v1",
            "live traffic ran on v1"
        );
    }
    assert!(
        at[&poison] < at[&held],
        "the aggregate's order holds: the redriven event went first"
    );
    let by = transformed_by(&t.db).await;
    assert_eq!(by[&poison.to_string()], Some(format!("t@{v2}")));
    for id in [held, other, live] {
        assert_eq!(by[&id.to_string()], Some(format!("t@{v1}")));
    }
    assert_eq!(
        active_label(&host),
        format!("t@{v1}"),
        "v2 was never activated"
    );
    assert_eq!(
        reg.get("t", v2).await.expect("v2").state,
        "candidate",
        "the registry still has v2 as a candidate"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        0
    );
}
on_both!(a_poison_event_dead_on_v1_is_published_by_a_v2_candidate_while_live_traffic_stays_on_v1);

async fn a_redrive_through_a_version_that_cannot_run_there_is_refused_and_changes_nothing(
    t: TestDb,
) {
    let reg = Registry::new(t.db.clone());
    let Versions { v2, .. } = deploy_both(&reg).await;
    let rebuilt = with_custom_section(wasm("amount-cents-v2"), "rebuild-3");
    let retired = match reg
        .deploy(engine(), &registry_spec("t"), &rebuilt, &[], "test")
        .await
        .expect("deploy a rebuild")
    {
        Deployed::Created(r) => r.version,
        Deployed::Unchanged(r) => panic!("{} was already stored", r.label()),
    };
    reg.retire("t", retired).await.expect("retire");
    let consumer = deploy(&reg, "c", wasm("billing")).await;
    let routes = vec![
        Route::new("order.*", "orders").with_transformers(&["t"]),
        Route::new("misc.*", "misc"),
    ];
    let host = rollout(&t.db, specs(), routes.clone());
    host.refresh().await.expect("refresh");
    // The order dies on v1 (its amount is text); the misc event, which no
    // plugin runs on, dies on a broker that refuses everything.
    put_placed(&t.db, "a", json!({"order_id": "o-1", "amount": POISON})).await;
    let misc = outboxd::event::NewEvent::new("m", "misc.thing", json!({"n": 1}));
    t.enqueue(misc).await;
    let broker = ScriptedPublisher::failing();
    broker
        .permanent
        .store(true, std::sync::atomic::Ordering::SeqCst);
    drain(&relay(&t, broker, &host, routes.clone())).await;
    let dead = dead_seqs(&t).await;
    assert_eq!(dead.len(), 2);
    let before = outbox_rows(&t).await;

    let specs = specs();
    let pipeline = Pipeline {
        routes: &routes,
        plugins: &specs,
    };
    let e = refused(&t.db, pipeline, &one(dead[0]), "t").await;
    assert!(matches!(e, FixForwardError::BadLabel(_)), "{e}");
    assert!(
        e.to_string().contains("NAME@VERSION") && e.to_string().contains("outboxd plugin list"),
        "{e}"
    );

    let e = refused(&t.db, pipeline, &one(dead[0]), "t@99").await;
    assert!(
        matches!(e, FixForwardError::NoSuchVersion { version: 99, .. }),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("plugin `t` has no version 99")
            && text.contains("outboxd plugin list")
            && text.contains("outboxd plugin deploy"),
        "{text}"
    );

    let e = refused(&t.db, pipeline, &one(dead[0]), &format!("c@{consumer}")).await;
    assert!(
        e.to_string().contains("is a consumer plugin"),
        "a consumer version is no transformer: {e}"
    );

    let e = refused(&t.db, pipeline, &one(dead[0]), &format!("t@{retired}")).await;
    assert!(
        e.to_string().contains("retired") && e.to_string().contains("outboxd plugin deploy"),
        "{e}"
    );

    // Every dead event at once includes the misc one, whose route runs no
    // plugin: refused, naming that event, its route and how to narrow it.
    let e = refused(&t.db, pipeline, &DeadFilter::default(), &format!("t@{v2}")).await;
    match &e {
        FixForwardError::NotInChain {
            seq, event_type, ..
        } => assert_eq!((*seq, event_type.as_str()), (dead[1], "misc.thing")),
        other => panic!("not NotInChain: {other}"),
    }
    assert!(
        e.to_string().contains("routes[1]") && e.to_string().contains("--type"),
        "{e}"
    );

    // A name the config loads from a file has no registry versions running.
    let mut file = PluginSpec::new("t", "plugins/dist/amount-cents.wasm");
    file.source = PluginSource::File;
    let file_specs = vec![file];
    let e = refused(
        &t.db,
        Pipeline {
            routes: &routes,
            plugins: &file_specs,
        },
        &one(dead[0]),
        &format!("t@{v2}"),
    )
    .await;
    assert!(
        e.to_string().contains("plugins[0].source = \"file\""),
        "{e}"
    );

    assert_eq!(
        outbox_rows(&t).await,
        before,
        "a refused redrive changes nothing"
    );
    // Narrowed to the order, the same version is accepted.
    let n = fix_forward::redrive_with(
        &t.db,
        pipeline,
        &DeadFilter {
            event_type: Some("order.*".into()),
            ..DeadFilter::default()
        },
        &format!("t@{v2}"),
        chrono::Utc::now(),
    )
    .await
    .expect("narrowed");
    assert_eq!(n, 1);
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE redrive_with IS NOT NULL")
            .await,
        1
    );
}
on_both!(a_redrive_through_a_version_that_cannot_run_there_is_refused_and_changes_nothing);

async fn a_redriven_event_whose_version_was_retired_meanwhile_dies_again_with_the_reason(
    t: TestDb,
) {
    let reg = Registry::new(t.db.clone());
    let Versions { v2, .. } = deploy_both(&reg).await;
    let host = rollout(&t.db, specs(), routes());
    host.refresh().await.expect("refresh");
    let broker = ScriptedPublisher::new();
    put_placed(&t.db, "a", json!({"order_id": "o-1", "amount": POISON})).await;
    let held = put_placed(&t.db, "a", json!({"order_id": "o-2", "amount": 3})).await;
    drain(&relay(&t, broker.clone(), &host, routes())).await;
    let dead = dead_seqs(&t).await;
    let pipeline = Pipeline {
        routes: &routes(),
        plugins: &specs(),
    };
    fix_forward::redrive_with(
        &t.db,
        pipeline,
        &one(dead[0]),
        &format!("t@{v2}"),
        chrono::Utc::now(),
    )
    .await
    .expect("redrive");
    // Retired before any relay loaded it: a relay that starts now must not
    // run it, nor fall back to the live chain.
    reg.retire("t", v2).await.expect("retire");
    let fresh = rollout(&t.db, specs(), routes());
    fresh.refresh().await.expect("refresh");
    drain(&relay(&t, broker.clone(), &fresh, routes())).await;
    assert_eq!(dead_seqs(&t).await, dead, "dead again");
    let rows = outbox_rows(&t).await;
    let reason = rows[0].1.clone().expect("row");
    assert!(
        reason.contains(&format!("redriven with t@{v2}")) && reason.contains("retired"),
        "{reason}"
    );
    assert!(broker.sent().is_empty(), "nothing was published: {rows:?}");
    assert!(
        rows[1]
            .1
            .as_deref()
            .is_some_and(|r| r.starts_with("pending")),
        "event {held} is still held back: {rows:?}"
    );
}
on_both!(a_redriven_event_whose_version_was_retired_meanwhile_dies_again_with_the_reason);

async fn a_dry_run_shows_what_the_version_would_publish_and_commits_nothing(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let Versions { v1, v2 } = deploy_both(&reg).await;
    let host = rollout(&t.db, specs(), routes());
    host.refresh().await.expect("refresh");
    let broker = ScriptedPublisher::new();
    let relay = relay(&t, broker.clone(), &host, routes());
    let poison = put_placed(&t.db, "a", json!({"order_id": "o-1", "amount": POISON})).await;
    put_placed(&t.db, "a", json!({"order_id": "o-2", "amount": 3})).await;
    drain(&relay).await;
    let dead = dead_seqs(&t).await;
    let before = outbox_rows(&t).await;
    let activations = t.count("SELECT count(*) FROM plugin_activations").await;

    let pipeline = Pipeline {
        routes: &routes(),
        plugins: &specs(),
    };
    let label = format!("t@{v2}");
    let runs = fix_forward::dry_run(
        &t.db,
        engine().clone(),
        pipeline,
        &DeadFilter::default(),
        Some(&label),
        50,
    )
    .await
    .expect("dry run through v2");
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!((run.seq, run.chain.as_str()), (dead[0], label.as_str()));
    let DryRunOutcome::Publish(messages) = &run.outcome else {
        panic!("v2 publishes it: {:?}", run.outcome);
    };
    let [m] = messages.as_slice() else {
        panic!("one message: {messages:?}");
    };
    assert_eq!(m.topic, "orders");
    assert_eq!(m.key, b"a");
    assert_eq!(m.message_id, poison, "the id it will be published with");
    assert_eq!(header(m, "message-id"), poison.to_string());
    assert_eq!(header(m, "amount-cents-by"), "amount-cents-v2");
    let payload: Value = json_of(&m.payload);
    assert_eq!(
        payload,
        json!({"order_id": "o-1", "amount": POISON, "amount_cents": 1250})
    );

    // On the active versions it would die again, with v1's reason.
    let runs = fix_forward::dry_run(&t.db, engine().clone(), pipeline, &one(dead[0]), None, 50)
        .await
        .expect("dry run on the active version");
    assert_eq!(runs[0].chain, format!("t@{v1}"));
    match &runs[0].outcome {
        DryRunOutcome::Failed { error, permanent } => {
            assert!(*permanent);
            assert!(error.contains("`amount` must be a number"), "{error}");
        }
        other => panic!("v1 fails it: {other:?}"),
    }

    // A version that cannot run is refused before anything runs.
    let e = fix_forward::dry_run(
        &t.db,
        engine().clone(),
        pipeline,
        &one(dead[0]),
        Some("t@42"),
        50,
    )
    .await
    .expect_err("no such version");
    assert!(e.to_string().contains("no version 42"), "{e}");

    assert_eq!(outbox_rows(&t).await, before, "the outbox is as it was");
    assert_eq!(
        t.count("SELECT count(*) FROM plugin_activations").await,
        activations,
        "no version was activated"
    );
    assert_eq!(reg.get("t", v2).await.expect("v2").state, "candidate");
    assert!(broker.sent().is_empty(), "nothing was published");
    assert_eq!(
        relay.step().await.expect("step"),
        StepOutcome::Idle,
        "nothing became due"
    );
}
on_both!(a_dry_run_shows_what_the_version_would_publish_and_commits_nothing);

// ---- through a running pipeline and the command line -------------------------

/// A pipeline's config whose route runs the registry plugin `t`.
fn pipeline_config(url: &str) -> Config {
    let mut c = admin_config(url);
    c.routes = routes();
    c.plugins = specs();
    c.plugin_runtime.registry_poll = Some(Duration::from_millis(100));
    c
}

async fn the_admin_api_redrives_through_a_version_and_the_running_relay_publishes_with_it(
    t: TestDb,
) {
    let reg = Registry::new(t.db.clone());
    let Versions { v1, v2 } = deploy_both(&reg).await;
    let running =
        support::pipeline::Pipeline::start(Daemon::default(), &pipeline_config(&t.url), &t.db)
            .await;
    let addr = running.addr();
    let poison = put_placed(&t.db, "a", json!({"order_id": "o-1", "amount": POISON})).await;
    t.wait_count(
        Duration::from_secs(60),
        "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL",
        1,
    )
    .await;
    let seq = dead_seqs(&t).await[0];

    let (status, body) = http(
        addr,
        "POST",
        &format!("/api/dead/{seq}/redrive"),
        Some(TOKEN),
        Some(r#"{"with": "t@99"}"#),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("no version 99") && body.contains("outboxd plugin list"),
        "{body}"
    );
    let (status, body) = http(
        addr,
        "POST",
        "/api/dead/redrive?all=true",
        Some(TOKEN),
        Some(r#"{"with": "t"}"#),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("NAME@VERSION"), "{body}");
    assert_eq!(
        dead_seqs(&t).await,
        vec![seq],
        "a refused redrive changes nothing"
    );

    let (status, body) = http(
        addr,
        "POST",
        &format!("/api/dead/{seq}/redrive"),
        Some(TOKEN),
        Some(&format!(r#"{{"with": "t@{v2}"}}"#)),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, r#"{"redriven":1}"#));
    let live = put_placed(&t.db, "b", json!({"order_id": "o-2", "amount": 4})).await;
    t.wait_count(
        Duration::from_secs(60),
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
        2,
    )
    .await;
    let by = transformed_by(&t.db).await;
    assert_eq!(by[&poison.to_string()], Some(format!("t@{v2}")));
    assert_eq!(by[&live.to_string()], Some(format!("t@{v1}")));
    // The embedded transport holds what was published: v2's output.
    let text = if t.is_postgres() {
        "convert_from(payload, 'UTF8')"
    } else {
        "CAST(payload AS TEXT)"
    };
    let published = pairs(
        &t.db,
        &format!(
            "SELECT {text}, CAST(NULL AS TEXT) FROM transport_messages WHERE CAST(message_id AS TEXT) = '{poison}'"
        ),
    )
    .await;
    assert_eq!(published.len(), 1, "{published:?}");
    let payload: Value = serde_json::from_str(&published[0].0).expect("json");
    assert_eq!(payload["amount_cents"], json!(1250));

    // A filter redrive takes "with" too; nothing is dead now.
    let (status, body) = http(
        addr,
        "POST",
        "/api/dead/redrive?all=true",
        Some(TOKEN),
        Some(&format!(r#"{{"with": "t@{v2}"}}"#)),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, r#"{"redriven":0}"#));
    running.stop().await;
}
on_both!(the_admin_api_redrives_through_a_version_and_the_running_relay_publishes_with_it);

async fn the_command_line_dry_runs_and_redrives_through_a_version(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let Versions { v1, v2 } = deploy_both(&reg).await;
    let host = rollout(&t.db, specs(), routes());
    host.refresh().await.expect("refresh");
    put_placed(&t.db, "a", json!({"order_id": "o-1", "amount": POISON})).await;
    drain(&relay(&t, ScriptedPublisher::new(), &host, routes())).await;
    let seq = dead_seqs(&t).await[0].to_string();
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("outboxd.toml");
    std::fs::write(
        &config,
        r#"
[[routes]]
event_type = "order.*"
topic = "orders"
transformers = ["t"]

[[plugins]]
name = "t"
source = "registry"
"#,
    )
    .expect("config");
    let config = config.to_str().expect("path");
    let run = |args: Vec<String>| {
        let mut cmd = outboxd(&t);
        cmd.arg("--config").arg(config).args(args);
        async move {
            let out = cmd.output().await.expect("run outboxd");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let args = |more: &[&str]| -> Vec<String> {
        ["dead", "redrive", "--seq", &seq]
            .iter()
            .chain(more)
            .map(|s| s.to_string())
            .collect()
    };
    let before = outbox_rows(&t).await;

    let (ok, out, err) = run(args(&["--with", &format!("t@{v2}"), "--dry-run"])).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!(
            "seq {seq}  order.placed  aggregate a  through t@{v2}"
        )) && out.contains("would publish 1 message(s)")
            && out.contains("topic orders  key a")
            && out.contains("header amount-cents-by: amount-cents-v2")
            && out.contains(r#""amount_cents":1250"#)
            && out.contains("nothing was published or changed"),
        "{out}"
    );
    let (ok, out, err) = run(args(&["--dry-run"])).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("through t@{v1}"))
            && out.contains("would fail (permanent: dead again)")
            && out.contains("`amount` must be a number"),
        "{out}"
    );
    assert_eq!(outbox_rows(&t).await, before, "a dry run changes nothing");

    let (ok, out, err) = run(args(&["--with", "t@9"])).await;
    assert!(!ok, "{out}");
    assert!(
        err.contains("plugin `t` has no version 9") && err.contains("outboxd plugin list"),
        "{err}"
    );
    assert_eq!(
        outbox_rows(&t).await,
        before,
        "a refused redrive changes nothing"
    );

    let (ok, out, err) = run(args(&["--with", &format!("t@{v2}")])).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("redrove 1 dead event(s) through t@{v2}")),
        "{out}"
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM outbox WHERE redrive_with = 't@{v2}' AND dead_at IS NULL"
        ))
        .await,
        1
    );
}
on_both!(the_command_line_dry_runs_and_redrives_through_a_version);
