//! A consumer's dead letters as an operator acts on them: the admin API
//! (`/api/consumers/NAME/dead…`) against a running pipeline, and the
//! command line (`outboxd dead … --consumer NAME`), on both databases.

use std::sync::atomic::Ordering;
use std::time::Duration;

use outboxd::config::ConsumerSection;
use outboxd::daemon::Daemon;
use outboxd::event::NewEvent;
use outboxd::message::Delivery;
use outboxd::message::headers;
use outboxd::store::inbox::dead_letters as consumer_dead;
use outboxd::store::inbox::dead_letters::NewRow;
use serde_json::{Value, json};

use crate::support::admin::{TOKEN, admin_config, http};
use crate::support::ledger::{Ledger, create_applied};
use crate::support::pipeline::Pipeline;
use crate::support::process::outboxd;
use crate::support::{TestDb, on_both};

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

async fn the_admin_api_lists_shows_redrives_and_discards_a_consumers_dead_letters(t: TestDb) {
    create_applied(&t).await;
    for (agg, seq, poison) in [
        ("a", 1, false),
        ("a", 2, true),
        ("b", 1, false),
        ("a", 3, false),
        ("c", 1, true),
        ("c", 2, false),
    ] {
        t.enqueue(NewEvent::new(
            agg,
            "ledger.entry",
            json!({ "seq": seq, "poison": poison }),
        ))
        .await;
    }
    let ledger = Ledger::default();
    let mut config = admin_config(&t.url);
    let mut consumer =
        ConsumerSection::new("ledger", vec!["ledger.entry".into()], "builtin:ledger");
    consumer.max_attempts = 1;
    config.consumers = vec![consumer];
    let daemon = Daemon::builder().handler("ledger", ledger.clone()).build();
    let Pipeline {
        stop_tx,
        mut set,
        handles,
    } = Pipeline::start(daemon, &config, &t.db).await;
    let addr = handles.admin_addr.expect("admin enabled");
    t.wait_count(
        Duration::from_secs(60),
        "SELECT count(*) FROM consumer_dead_letters WHERE resolved_at IS NULL",
        4,
    )
    .await;
    t.wait_count(Duration::from_secs(60), "SELECT count(*) FROM applied", 2)
        .await;

    let get = |path: String| async move { http(addr, "GET", &path, Some(TOKEN), None).await };
    let post = |path: String, body: Value| async move {
        http(addr, "POST", &path, Some(TOKEN), Some(&body.to_string())).await
    };

    assert_eq!(
        http(addr, "GET", "/api/consumers/ledger/dead", None, None)
            .await
            .0,
        401
    );
    assert_eq!(
        http(
            addr,
            "POST",
            "/api/consumers/ledger/dead/redrive",
            None,
            Some("{\"all\":true}")
        )
        .await
        .0,
        401
    );
    let (status, body) = get("/api/consumers/ledger/dead".into()).await;
    assert_eq!(status, 200, "{body}");
    let rows = json_of(&body);
    let rows = rows.as_array().expect("array");
    // Keys a and c may be in different partitions: the rows in key order.
    let mut rows = rows.clone();
    rows.sort_by_key(|r| (r["key"].as_str().map(str::to_string), r["id"].as_i64()));
    let described: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["key"].as_str().expect("key").to_string(),
                r["state"].as_str().expect("state").to_string(),
            )
        })
        .collect();
    assert_eq!(
        described,
        [
            ("a".to_string(), "dead".to_string()),
            ("a".into(), "parked".into()),
            ("c".into(), "dead".into()),
            ("c".into(), "parked".into())
        ]
    );
    let id = |i: usize| rows[i]["id"].as_i64().expect("id");
    let (a_dead, a_parked, c_dead) = (id(0), id(1), id(2));
    assert_eq!(rows[0]["handler"], "builtin:ledger");
    assert_eq!(rows[0]["attempts"], 1);
    assert!(rows[0]["error"].as_str().expect("error").contains("poison"));

    let (_, body) = get("/api/consumers/ledger/dead?key=c".into()).await;
    assert_eq!(json_of(&body).as_array().expect("array").len(), 2);
    let (status, body) = get(format!("/api/consumers/ledger/dead/{a_dead}")).await;
    assert_eq!(status, 200);
    let shown = json_of(&body);
    let payload: Value = serde_json::from_str(shown["payload"].as_str().expect("text payload"))
        .expect("JSON payload");
    assert_eq!(payload, json!({ "seq": 2, "poison": true }));
    assert!(
        shown["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .any(|h| h[0] == headers::MESSAGE_ID),
        "{shown}"
    );
    assert_eq!(get("/api/consumers/ledger/dead/999999".into()).await.0, 404);
    let (status, body) = get("/api/consumers/nope/dead".into()).await;
    assert_eq!(status, 404);
    assert!(body.contains("ledger"), "names the consumers: {body}");

    // Refusals: no selector, a parked row, a version for a built-in handler.
    assert_eq!(
        post("/api/consumers/ledger/dead/redrive".into(), json!({}))
            .await
            .0,
        400
    );
    let (status, body) = post(
        "/api/consumers/ledger/dead/redrive".into(),
        json!({ "id": a_parked }),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains(&format!("behind dead letter {a_dead}")),
        "{body}"
    );
    let (status, body) = post(
        "/api/consumers/ledger/dead/redrive".into(),
        json!({ "id": a_dead, "with": "ledger@2" }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("built in"), "{body}");

    // The fix, then a redrive of a's dead letter: a2 and a3 run, in order.
    ledger.fixed.store(true, Ordering::SeqCst);
    let (status, body) = post(
        "/api/consumers/ledger/dead/redrive".into(),
        json!({ "id": a_dead }),
    )
    .await;
    assert_eq!((status, json_of(&body)), (200, json!({ "redriven": 1 })));
    t.wait_count(
        Duration::from_secs(60),
        "SELECT count(*) FROM applied WHERE k = 'a'",
        3,
    )
    .await;
    assert_eq!(
        t.count("SELECT count(*) FROM applied a JOIN applied b ON a.k = b.k AND a.id < b.id AND a.seq > b.seq")
            .await,
        0,
        "in order"
    );

    // A discard of c's dead letter: c2 runs, c1 never does.
    let (status, _) = http(
        addr,
        "POST",
        &format!("/api/consumers/ledger/dead/{c_dead}/discard"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 400, "a reason is required");
    let (status, body) = post(
        format!("/api/consumers/ledger/dead/{c_dead}/discard"),
        json!({ "reason": "customer c left" }),
    )
    .await;
    assert_eq!(
        (status, json_of(&body)),
        (200, json!({ "discarded": c_dead, "released": 1 }))
    );
    t.wait_count(
        Duration::from_secs(60),
        "SELECT count(*) FROM applied WHERE k = 'c'",
        1,
    )
    .await;
    let (status, _) = post(
        format!("/api/consumers/ledger/dead/{c_dead}/discard"),
        json!({ "reason": "again" }),
    )
    .await;
    assert_eq!(status, 409, "already resolved");
    t.wait_count(
        Duration::from_secs(60),
        "SELECT count(*) FROM consumer_dead_letters WHERE resolved_at IS NULL",
        0,
    )
    .await;
    assert_eq!(t.count("SELECT count(*) FROM applied").await, 5);
    assert_eq!(
        t.count("SELECT count(*) FROM applied WHERE k = 'c' AND seq = 1")
            .await,
        0
    );

    let (_, metrics) = get("/metrics".into()).await;
    for line in [
        "outboxd_consumer_parked_total{consumer=\"ledger\"} 2",
        "outboxd_consumer_redriven_total{consumer=\"ledger\"} 3",
    ] {
        assert!(metrics.contains(line), "missing `{line}` in /metrics");
    }
    stop_tx.send(true).expect("stop");
    while let Some(r) = set.join_next().await {
        r.expect("task").expect("clean stop");
    }
}
on_both!(the_admin_api_lists_shows_redrives_and_discards_a_consumers_dead_letters);

fn delivery(key: &str, offset: i64, payload: Value) -> Delivery {
    Delivery {
        topic: "ledger.entry".into(),
        partition: 0,
        offset,
        key: Some(key.as_bytes().to_vec()),
        payload: payload.to_string().into_bytes(),
        headers: vec![(
            headers::MESSAGE_ID.to_string(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
        attempt: 0,
    }
}

/// Runs `outboxd ARGS` to completion: (success, stdout, stderr).
async fn cli(t: &TestDb, args: &[&str]) -> (bool, String, String) {
    let out = outboxd(t).args(args).output().await.expect("run outboxd");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn the_cli_lists_shows_redrives_and_discards_a_consumers_dead_letters(t: TestDb) {
    let rows = [
        ("a", 1, consumer_dead::DEAD),
        ("a", 2, consumer_dead::PARKED),
        ("b", 3, consumer_dead::DEAD),
    ];
    for (key, offset, state) in rows {
        let d = delivery(key, offset, json!({ "seq": offset }));
        let written = consumer_dead::insert(
            &t.db,
            NewRow {
                consumer: "ledger",
                delivery: &d,
                state,
                holds_key: true,
                error: "permanent: no such account",
                handler: "plugin ledger@1",
                attempts: 3,
            },
        )
        .await
        .expect("insert");
        assert!(written);
    }
    let listed = consumer_dead::list(&t.db, "ledger", None, false, 10)
        .await
        .expect("list");
    let (a_dead, a_parked, b_dead) = (listed[0].id, listed[1].id, listed[2].id);

    let (ok, out, err) = cli(&t, &["dead", "list", "--consumer", "ledger"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        out.contains("dead") && out.contains("parked") && out.contains("no such account"),
        "{out}"
    );
    let (ok, out, _) = cli(
        &t,
        &[
            "dead",
            "list",
            "--consumer",
            "ledger",
            "--key",
            "a",
            "--json",
        ],
    )
    .await;
    assert!(ok);
    let json = json_of(&out);
    assert_eq!(json.as_array().expect("array").len(), 2);
    assert_eq!(json[1]["state"], "parked");
    let (ok, out, _) = cli(
        &t,
        &["dead", "show", "--consumer", "ledger", &a_dead.to_string()],
    )
    .await;
    assert!(ok);
    let shown = json_of(&out);
    assert_eq!(shown["payload"], json!({ "seq": 1 }).to_string());
    assert_eq!(shown["handler"], "plugin ledger@1");
    assert_eq!(shown["attempts"], 3);

    // Refusals name the thing and the fix.
    let (ok, _, err) = cli(&t, &["dead", "list", "--consumer", "nope"]).await;
    assert!(!ok && err.contains("no consumer named `nope`"), "{err}");
    let (ok, _, err) = cli(&t, &["dead", "redrive", "--consumer", "ledger"]).await;
    assert!(!ok && err.contains("--id N, --key K, or --all"), "{err}");
    let (ok, _, err) = cli(
        &t,
        &[
            "dead",
            "redrive",
            "--consumer",
            "ledger",
            "--id",
            &a_parked.to_string(),
        ],
    )
    .await;
    assert!(
        !ok && err.contains(&format!("parked behind dead letter {a_dead}")),
        "{err}"
    );
    let (ok, _, err) = cli(&t, &["dead", "show", "--consumer", "ledger", "999999"]).await;
    assert!(!ok && err.contains("no dead letter 999999"), "{err}");
    let (ok, _, err) = cli(
        &t,
        &[
            "dead",
            "discard",
            "--consumer",
            "ledger",
            &a_dead.to_string(),
            "--reason",
            " ",
        ],
    )
    .await;
    assert!(!ok && err.contains("--reason"), "{err}");

    let (ok, out, err) = cli(
        &t,
        &[
            "dead",
            "discard",
            "--consumer",
            "ledger",
            &a_dead.to_string(),
            "--reason",
            "account closed",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains("1 parked message(s) behind it now run"),
        "{out}"
    );
    let (ok, out, err) = cli(&t, &["dead", "redrive", "--consumer", "ledger", "--all"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("released 1 dead letter"), "{out}");
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM consumer_dead_letters WHERE id = {b_dead} AND state = 'redrive'"
        ))
        .await,
        1
    );
    // The outbox's own dead events are untouched by --consumer.
    let (ok, out, _) = cli(&t, &["dead", "list"]).await;
    assert!(ok && out.contains("no dead events"), "{out}");
}
on_both!(the_cli_lists_shows_redrives_and_discards_a_consumers_dead_letters);
