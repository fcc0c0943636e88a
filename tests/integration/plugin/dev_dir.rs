//! Development mode's watched directory (`plugin_runtime.watch_dir`): a
//! `NAME.wasm` that appears or changes there is deployed through the
//! registry with the same checks as `outboxd plugin deploy`, and a file the
//! checks refuse leaves the active version running.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use outboxd::plugin::lifecycle::dev_dir;
use outboxd::plugin::lifecycle::registry::Registry;
use outboxd::plugin::lifecycle::rollout::Refreshed;
use outboxd::relay::StepOutcome;
use outboxd::store::registry::PluginRecord;
use serde_json::json;

use crate::support::plugins::{
    engine, hand_built_component, json_of, registry_spec, wasm, with_custom_section,
};
use crate::support::swap::{active_label, put_placed, relay, rollout, routes};
use crate::support::{ScriptedPublisher, TestDb, eventually, on_both};

/// Writes `bytes` to `path` with modification time `second` (since the
/// epoch): the scan tells a changed file by its time, and two writes within
/// the file system's time resolution would otherwise look unchanged.
fn write(path: &Path, bytes: &[u8], second: u64) {
    std::fs::write(path, bytes).expect("write the plugin file");
    std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open the plugin file")
        .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(second))
        .expect("set its modification time");
}

/// (version, state) of every stored version of `t`.
fn versions(records: &[PluginRecord]) -> Vec<(i64, &str)> {
    records
        .iter()
        .filter(|r| r.name == "t")
        .map(|r| (r.version, r.state.as_str()))
        .collect()
}

async fn a_dev_dir_file_is_deployed_and_a_broken_one_changes_nothing(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let dir = tempfile::tempdir().expect("watch dir");
    let file = dir.path().join("t.wasm");
    let specs = vec![registry_spec("t")];
    let mut seen = BTreeMap::new();
    let host = rollout(&t.db, specs.clone(), routes());

    // A new file is stored as version 1, by the watcher, and activated.
    write(&file, &wasm("cloudevents"), 1);
    dev_dir::scan(engine(), &reg, &specs, dir.path(), &mut seen).await;
    let records = reg.list().await.expect("list");
    assert_eq!(versions(&records), [(1, "active")]);
    assert_eq!(records[0].deployed_by, "watch_dir");
    assert_eq!(
        host.refresh().await.expect("refresh"),
        Refreshed::Swapped(vec!["t@1".into()])
    );

    // Files the registry's checks refuse: garbage, and a component that
    // imports what outboxd does not provide. Neither is stored, and the
    // host keeps running version 1.
    let refused = [
        ("not wasm", b"definitely not wasm".to_vec()),
        (
            "hostile import",
            hand_built_component("evil:net/raw@0.1.0", "transform"),
        ),
    ];
    for (second, (what, bytes)) in (2..).zip(refused) {
        write(&file, &bytes, second);
        dev_dir::scan(engine(), &reg, &specs, dir.path(), &mut seen).await;
        assert_eq!(
            versions(&reg.list().await.expect("list")),
            [(1, "active")],
            "{what} was stored or changed the active version"
        );
        assert_eq!(
            host.refresh().await.expect("refresh"),
            Refreshed::Unchanged,
            "{what}"
        );
    }
    let broker = ScriptedPublisher::new();
    let relay = relay(&t, broker.clone(), &host, routes());
    put_placed(&t.db, "o1", json!({"n": 1})).await;
    assert!(
        matches!(relay.step().await.expect("step"), StepOutcome::Published(r) if r.published == 1)
    );
    assert!(
        json_of(&broker.sent()[0].payload)
            .get("specversion")
            .is_some(),
        "version 1 (cloudevents) transformed the event"
    );

    // A valid change is deployed: the scans above did read the changed
    // file, so what they left alone was refused, not missed.
    write(&file, &wasm("redact-pii"), 4);
    dev_dir::scan(engine(), &reg, &specs, dir.path(), &mut seen).await;
    let records = reg.list().await.expect("list");
    let states = versions(&records);
    assert_eq!(states.len(), 2, "{states:?}");
    assert_eq!(states[1], (2, "active"));
    assert_ne!(states[0].1, "active");
    host.refresh().await.expect("refresh");
    assert_eq!(active_label(&host), "t@2");

    // The watcher loop the daemon spawns does the same on its own. It
    // watches a second directory whose first file, plugin `u`, shows when
    // its first scan has run, so `t.wasm` can only be found by a later one.
    let watched = tempfile::tempdir().expect("second watch dir");
    write(&watched.path().join("u.wasm"), &wasm("cloudevents"), 1);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(dev_dir::run(
        engine().clone(),
        reg.clone(),
        specs.clone(),
        watched.path().to_path_buf(),
        Duration::from_millis(20),
        shutdown,
    ));
    wait_for_active(&reg, "u", 1).await;
    write(
        &watched.path().join("t.wasm"),
        &with_custom_section(wasm("cloudevents"), "dev-dir"),
        5,
    );
    wait_for_active(&reg, "t", 3).await;
    stop.send(true).expect("stop the watcher");
    tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .expect("the watcher stops on shutdown")
        .expect("join the watcher");
    assert_eq!(reg.list().await.expect("list").len(), 4);
}

/// Waits, up to a minute (compiling a component under load is slow), until
/// the registry offers `name@version` as active.
async fn wait_for_active(reg: &Registry, name: &str, version: i64) {
    let what = format!("the watcher did not activate {name}@{version}");
    eventually(Duration::from_secs(60), what, async || {
        if reg.desired().await.expect("desired").active(name) == Some(version) {
            Ok(())
        } else {
            Err(format!("{:?}", reg.list().await.expect("list")))
        }
    })
    .await
}
on_both!(a_dev_dir_file_is_deployed_and_a_broken_one_changes_nothing);

/// A restart scans with nothing seen: a file whose bytes are already stored
/// is `Unchanged`, and its active version stays active.
async fn a_file_already_stored_is_left_unchanged_on_restart(t: TestDb) {
    let reg = Registry::new(t.db.clone());
    let dir = tempfile::tempdir().expect("watch dir");
    write(&dir.path().join("t.wasm"), &wasm("cloudevents"), 1);
    let specs = vec![registry_spec("t")];
    dev_dir::scan(engine(), &reg, &specs, dir.path(), &mut BTreeMap::new()).await;
    dev_dir::scan(engine(), &reg, &specs, dir.path(), &mut BTreeMap::new()).await;
    assert_eq!(versions(&reg.list().await.expect("list")), [(1, "active")]);
}
on_both!(a_file_already_stored_is_left_unchanged_on_restart);
