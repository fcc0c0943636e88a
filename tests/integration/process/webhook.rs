//! A webhook route's relay SIGKILLed after the receiver's 2xx and before
//! it marks the rows: the restarted relay sends those requests once more,
//! with the same `webhook-id`, and nothing else twice.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::support::process::{kill_at_fault, outboxd, terminate};
use crate::support::webhook_receiver::{Receiver, SECRET};
use crate::support::{TestDb, db, on_both};

async fn webhook_relay_killed_between_the_2xx_and_the_mark_sends_only_that_batch_again(t: TestDb) {
    let receiver = Receiver::start().await;
    for n in 0..30 {
        let key = format!("k{}", n % 3);
        db::put(&t.db, &key, "order.confirmed", json!({"key": key, "n": n})).await;
    }
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("outboxd.toml");
    std::fs::write(
        &config,
        format!(
            "[[routes]]\nevent_type = \"order.*\"\nname = \"billing-hook\"\n\
             webhook = {{ url = \"{}\", secret_env = \"HOOK_SECRET\" }}\n",
            receiver.url()
        ),
    )
    .expect("write the config");
    let run = || {
        let mut cmd = outboxd(&t);
        cmd.arg("--config")
            .arg(&config)
            .arg("run")
            .env("HOOK_SECRET", SECRET)
            .env("OUTBOXD__RELAY__BATCH_SIZE", "3");
        cmd
    };
    let child = run()
        .env("OUTBOXD_FAULT", "after-publish-before-mark:hang:2")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outboxd run");
    kill_at_fault(child).await;
    let before = receiver.got();
    assert_eq!(
        t.count("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .await,
        3,
        "one batch marked, the second sent and not marked"
    );
    assert_eq!(before.len(), 6, "two batches of three reached the receiver");

    let mut child = run().stderr(Stdio::null()).spawn().expect("restart");
    t.wait_count(
        Duration::from_secs(60),
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        0,
    )
    .await;
    terminate(&mut child).await;

    let got = receiver.got();
    assert!(got.iter().all(|g| g.verified), "every signature verifies");
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for g in &got {
        *per_id.entry(g.id.as_str()).or_default() += 1;
    }
    let twice: Vec<&str> = per_id
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    let unmarked: Vec<&str> = before[3..].iter().map(|g| g.id.as_str()).collect();
    let mut sorted_twice = twice.clone();
    sorted_twice.sort();
    let mut sorted_unmarked = unmarked.clone();
    sorted_unmarked.sort();
    assert_eq!(
        sorted_twice, sorted_unmarked,
        "only the unmarked batch came twice, with the same webhook-id"
    );
    assert!(per_id.values().all(|n| *n <= 2), "{per_id:?}");
    assert_eq!(per_id.len(), 30, "every event reached the receiver");
    let applied = receiver.applied();
    assert_eq!(applied.len(), 30, "each effect applied once");
    for key in ["k0", "k1", "k2"] {
        let order: Vec<u64> = applied
            .iter()
            .filter(|(k, _)| k.as_deref() == Some(key))
            .map(|(_, p)| p["n"].as_u64().expect("n"))
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "key {key} applied in order");
    }
}
on_both!(webhook_relay_killed_between_the_2xx_and_the_mark_sends_only_that_batch_again);
