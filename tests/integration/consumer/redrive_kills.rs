//! A consumer redrive survives SIGKILL at any point, of the CLI that
//! releases the dead letter and of the `outboxd run` that applies it: every
//! message of the parked key is applied exactly once, in order. Processes
//! for real (the example's binary, with `builtin:billing`), on both
//! databases, through the relay and the embedded transport, Kafka, NATS
//! JetStream or RabbitMQ.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use outboxd::event::NewEvent;

use crate::support::kafka::Way;
use crate::support::process::{kill_at_fault, outboxd_with_billing, terminate};
use crate::support::{TestDb, on_both};

/// `cmd` with the consumer of `via` (`billing` of `order.confirmed`, on
/// the embedded transport or Kafka) and, on Kafka, the cluster.
fn configure(via: &Way, cmd: &mut tokio::process::Command) {
    let consumers = format!(
        r#"[{{name = "{}", topics = ["{}"], handler = "builtin:billing", max_attempts = 2}}]"#,
        via.consumer, via.topic
    );
    cmd.env("OUTBOXD__CONSUMERS", consumers);
    via.configure_transport(cmd);
}

/// Invoices of `order` by amount, in the order they were written.
async fn amounts(t: &TestDb, order: &str) -> Vec<i64> {
    let sql = format!("SELECT amount_cents FROM invoices WHERE order_id = '{order}' ORDER BY id");
    match &t.db {
        outboxd::store::Db::Postgres(p) => sqlx::query_scalar(&sql).fetch_all(p).await,
        outboxd::store::Db::Sqlite(p) => sqlx::query_scalar(&sql).fetch_all(p).await,
    }
    .expect("invoices")
}

fn run(t: &TestDb, via: &Way, fault: Option<&str>) -> tokio::process::Child {
    let mut cmd = outboxd_with_billing(t);
    cmd.arg("run");
    configure(via, &mut cmd);
    match fault {
        // Errors only, so the unread pipe never fills before the fault.
        Some(f) => cmd
            .env("OUTBOXD_FAULT", f)
            .env("OUTBOXD_LOG", "error")
            .stderr(Stdio::piped()),
        None => cmd.stderr(Stdio::null()),
    };
    cmd.spawn().expect("spawn outboxd run")
}

async fn a_redrive_survives_sigkills_of_the_cli_and_of_the_consumer(t: TestDb) {
    redrive_with_kills(t, Way::embedded("order.confirmed", "billing")).await
}
on_both!(a_redrive_survives_sigkills_of_the_cli_and_of_the_consumer);

mod a_redrive_survives_sigkills_on_kafka {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let t = crate::support::TestDb::postgres().await;
        super::redrive_with_kills(t, super::Way::kafka("order.confirmed", "billing")).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        let t = crate::support::TestDb::sqlite().await;
        super::redrive_with_kills(t, super::Way::kafka("order.confirmed", "billing")).await
    }
}

/// The same over NATS JetStream and RabbitMQ: parking and redrive are the
/// consumer's own, whatever the broker.
macro_rules! over {
    ($name:ident, $way:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let t = crate::support::TestDb::postgres().await;
                super::redrive_with_kills(t, super::Way::$way("order.confirmed", "billing")).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let t = crate::support::TestDb::sqlite().await;
                super::redrive_with_kills(t, super::Way::$way("order.confirmed", "billing")).await
            }
        }
    };
}
over!(a_redrive_survives_sigkills_on_nats, nats);
over!(a_redrive_survives_sigkills_on_rabbitmq, rabbitmq);

async fn redrive_with_kills(t: TestDb, via: Way) {
    let consumer = via.consumer.as_str();
    // Two partitions, so the keys may land apart or together.
    via.create_topics(2).await;
    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing schema");
    // Amount 13 of order-x cannot be written until the test drops this trigger.
    if t.is_postgres() {
        t.exec_app(
            "CREATE FUNCTION poison_13() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.amount_cents = 13 AND NEW.order_id = 'order-x' THEN RAISE EXCEPTION 'amount 13 is refused'; END IF; RETURN NEW; END $$",
        )
        .await;
        t.exec_app("CREATE TRIGGER poison BEFORE INSERT ON invoices FOR EACH ROW EXECUTE FUNCTION poison_13()")
            .await;
    } else {
        t.exec_app(
            "CREATE TRIGGER poison BEFORE INSERT ON invoices WHEN NEW.amount_cents = 13 AND NEW.order_id = 'order-x'
             BEGIN SELECT RAISE(ABORT, 'amount 13 is refused'); END",
        )
        .await;
    }
    for amount in 10..20 {
        for order in ["order-x", "order-y"] {
            t.enqueue(NewEvent::new(
                order,
                via.topic.as_str(),
                json!({ "order_id": order, "customer_id": "c", "total_cents": amount }),
            ))
            .await;
        }
    }
    // The consumer runs with the redrive fault armed from the start: it
    // fires only once a redriven message is about to commit.
    let child = run(&t, &via, Some("redrive-before-commit:hang:3"));
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM invoices WHERE order_id = 'order-y'",
        10,
    )
    .await;
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM consumer_dead_letters WHERE resolved_at IS NULL",
        7,
    )
    .await;
    assert_eq!(
        amounts(&t, "order-x").await,
        [10, 11, 12],
        "13 died, 14 to 19 wait"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE state = 'parked'")
            .await,
        6
    );

    // The fix. The CLI's release is killed before its commit: nothing is
    // released, and the key stays parked.
    if t.is_postgres() {
        t.exec_app("DROP TRIGGER poison ON invoices").await;
    } else {
        t.exec_app("DROP TRIGGER poison").await;
    }
    let mut cli = outboxd_with_billing(&t);
    cli.args([
        "dead",
        "redrive",
        "--consumer",
        consumer,
        "--key",
        "order-x",
    ]);
    configure(&via, &mut cli);
    let cli = cli
        .env("OUTBOXD_FAULT", "redrive-release-before-commit")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the CLI");
    kill_at_fault(cli).await;
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE state = 'redrive'")
            .await,
        0,
        "a release killed before its commit released nothing"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(amounts(&t, "order-x").await, [10, 11, 12]);

    let mut cli = outboxd_with_billing(&t);
    cli.args([
        "dead",
        "redrive",
        "--consumer",
        consumer,
        "--key",
        "order-x",
    ]);
    configure(&via, &mut cli);
    let out = cli.output().await.expect("run the CLI");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("released 1 dead letter"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The consumer dies before the commit of the third redriven message...
    kill_at_fault(child).await;
    assert_eq!(amounts(&t, "order-x").await, [10, 11, 12, 13, 14]);
    // ...and its successor after the commit of the second it applies.
    let child = run(&t, &via, Some("redrive-after-commit:hang:2"));
    kill_at_fault(child).await;
    assert_eq!(amounts(&t, "order-x").await, [10, 11, 12, 13, 14, 15, 16]);
    let mut child = run(&t, &via, None);
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM invoices WHERE order_id = 'order-x'",
        10,
    )
    .await;
    t.wait_count(
        Duration::from_secs(90),
        "SELECT count(*) FROM consumer_dead_letters WHERE resolved_at IS NULL",
        0,
    )
    .await;
    terminate(&mut child).await;
    assert_eq!(
        amounts(&t, "order-x").await,
        (10..20).collect::<Vec<i64>>(),
        "each once, in order"
    );
    assert_eq!(
        t.count(&format!(
            "SELECT count(*) FROM inbox WHERE consumer = '{consumer}'"
        ))
        .await,
        20
    );
    assert_eq!(
        t.count("SELECT count(*) FROM consumer_dead_letters WHERE resolution = 'applied'")
            .await,
        7
    );
}
