//! `GET /api/consumers` against a running daemon: what a consumer has
//! processed, its dead letter and parked key, and (from the database) the
//! backlog past its cursors, on both databases.

use std::sync::Arc;
use std::time::Duration;

use outboxd::broker::embedded::EmbeddedPublisher;
use outboxd::config::Config;
use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::daemon::Daemon;
use outboxd::event::NewEvent;
use outboxd::message::Delivery;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::route::Router;
use outboxd::store::InboxTx;
use outboxd::store::transport::backlog::embedded_backlog;
use serde_json::{Value, json};

use crate::support::admin::{TOKEN, admin_config, http};
use crate::support::kafka::props;
use crate::support::pipeline::Pipeline;
use crate::support::{TestDb, eventually, on_both};

/// Handles every message but those of key `bad`, which fail for good.
struct RefusesBad;

impl Handler for RefusesBad {
    async fn handle(&self, _tx: &mut InboxTx, d: &Delivery) -> Result<(), HandlerError> {
        match d.key.as_deref() {
            Some(b"bad") => Err(HandlerError::Permanent("key `bad` is refused".into())),
            _ => Ok(()),
        }
    }
}

async fn billing(addr: std::net::SocketAddr) -> Value {
    let (status, body) = http(addr, "GET", "/api/consumers", Some(TOKEN), None).await;
    assert_eq!(status, 200, "{body}");
    let rows: Vec<Value> = serde_json::from_str(&body).expect("json");
    rows.into_iter()
        .find(|r| r["name"] == "billing")
        .unwrap_or_else(|| panic!("no billing in {body}"))
}

/// Enqueues `a`, `bad` twice and `b`, runs `config`'s pipeline with the
/// consumer `billing` (`builtin:refuses-bad`) of `orders`, and returns
/// billing's row once (within `within`) it has processed two, parked the
/// bad key's second message and has nothing left behind its cursors.
async fn run_until_settled(t: &TestDb, mut config: Config, within: Duration) -> (Value, Pipeline) {
    for (key, n) in [("a", 1), ("bad", 1), ("bad", 2), ("b", 1)] {
        t.enqueue(NewEvent::new(key, "order.confirmed", json!({ "n": n })))
            .await;
    }
    config.routes = vec![Route::new("order.*", "orders")];
    config.consumers = vec![outboxd::config::ConsumerSection::new(
        "billing",
        vec!["orders".into()],
        "builtin:refuses-bad",
    )];
    let daemon = Daemon::builder().handler("refuses-bad", RefusesBad).build();
    let running = Pipeline::start(daemon, &config, &t.db).await;
    let addr = running.addr();
    let row = eventually(within, "billing's row settled", async || {
        let row = billing(addr).await;
        // The cursor moves just after the commit the counters report.
        if row["processed_total"] == 2 && row["parked_messages"] == 1 && row["lag"] == 0 {
            Ok(row)
        } else {
            Err(row)
        }
    })
    .await;
    (row, running)
}

async fn the_consumers_api_reports_counters_dead_letters_parking_and_backlog(t: TestDb) {
    let config = admin_config(&t.url);
    let partitions = config.transport.partitions;
    let (row, running) = run_until_settled(&t, config, Duration::from_secs(30)).await;
    assert_eq!(row["in_this_process"], true);
    assert_eq!(row["dead_letters"], 1, "{row}");
    assert_eq!(row["parked_keys"], 1, "{row}");
    assert_eq!(row["duplicates_total"], 0, "{row}");
    assert!(row["oldest_unhandled_at"].is_string(), "{row}");
    assert!(
        row["oldest_unhandled_age_seconds"].as_f64().expect("age") < 60.0,
        "{row}"
    );
    running.stop().await;

    // Published while no consumer runs: the backlog past billing's cursors.
    for key in ["c", "d", "e"] {
        t.enqueue(NewEvent::new(key, "order.confirmed", json!({})))
            .await;
    }
    let relay = Relay::new(
        t.store(),
        Arc::new(EmbeddedPublisher::new(t.db.clone(), partitions)),
        Router::new(vec![Route::new("order.*", "orders")]),
        RelayConfig::default(),
        Arc::new(outboxd::clock::SystemClock),
    );
    while relay.step().await.expect("relay step") != StepOutcome::Idle {}
    let backlog = embedded_backlog(&t.db).await.expect("backlog");
    assert_eq!(backlog.len(), 1, "{backlog:?}");
    assert_eq!(
        (backlog[0].group.as_str(), backlog[0].messages),
        ("billing", 3)
    );
    let oldest = backlog[0].oldest_published_at.expect("an oldest message");
    assert!(
        (chrono::Utc::now() - oldest).num_seconds() < 60,
        "oldest {oldest}"
    );
}
on_both!(the_consumers_api_reports_counters_dead_letters_parking_and_backlog);

/// On Kafka the lag is read from the broker: the group's commits against
/// the partitions' ends, 0 once every message (the dead letter and the
/// parked one included) is behind the group's commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_the_consumers_api_reads_the_groups_lag_from_the_broker() {
    let t = TestDb::sqlite().await;
    let mock = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    mock.create_topic("orders", 2, 1).expect("topic");
    let mut config = admin_config(&t.url);
    config.transport.kind = outboxd::config::TransportKind::Kafka;
    config.transport.kafka = props(&mock.bootstrap_servers());
    let (row, running) = run_until_settled(&t, config, Duration::from_secs(60)).await;
    assert_eq!(row["lag_error"], Value::Null, "{row}");
    assert_eq!(row["dead_letters"], 1, "{row}");
    running.stop().await;
}
