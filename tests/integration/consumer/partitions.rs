//! On Postgres a consumer handles the partitions of a fetch side by side,
//! each in its own transaction, but never more of them at once than
//! `max_parallel_partitions`: `outboxd run` sets that from the consumer's
//! share of `database.max_connections`, so a consumer cannot starve the
//! relays and the embedded transport's writer of connections.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outboxd::broker::ConsumeError;
use outboxd::broker::MessageSource;
use outboxd::consumer::Consumer;
use outboxd::consumer::ConsumerConfig;
use outboxd::consumer::Handler;
use outboxd::consumer::HandlerError;
use outboxd::message::Delivery;
use outboxd::message::headers;
use outboxd::store::InboxTx;
use tokio::sync::Notify;

use crate::support::TestDb;

const PARTITIONS: i32 = 8;
const BOUND: usize = 2;

/// One fetch of one message per partition, then nothing; records commits.
struct OneFetch {
    batch: Option<Vec<Delivery>>,
    committed: Arc<Mutex<Vec<(i32, i64)>>>,
}

impl MessageSource for OneFetch {
    async fn fetch(&mut self, _max: usize) -> Result<Vec<Delivery>, ConsumeError> {
        Ok(self.batch.take().unwrap_or_default())
    }

    async fn commit(&mut self, d: &Delivery) -> Result<(), ConsumeError> {
        self.committed
            .lock()
            .expect("lock")
            .push((d.partition, d.offset));
        Ok(())
    }
}

/// Counts how many messages are being handled at once. Each call waits
/// until more than [`BOUND`] calls overlap (the violation) or, failing
/// that, a little while, so calls that may overlap do.
#[derive(Default)]
struct Overlap {
    now: AtomicUsize,
    most: AtomicUsize,
    changed: Notify,
}

impl Handler for Overlap {
    async fn handle(&self, _tx: &mut InboxTx, _d: &Delivery) -> Result<(), HandlerError> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.changed.notify_waiters();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        loop {
            let changed = self.changed.notified();
            if self.now.load(Ordering::SeqCst) > BOUND {
                break;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }
        self.now.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_handles_no_more_partitions_at_once_than_its_bound() {
    let t = TestDb::postgres().await;
    let batch = (0..PARTITIONS)
        .map(|p| Delivery {
            topic: "orders".into(),
            partition: p,
            offset: i64::from(p) + 100,
            key: Some(format!("k{p}").into_bytes()),
            payload: b"{}".to_vec(),
            headers: vec![(
                headers::MESSAGE_ID.to_string(),
                uuid::Uuid::new_v4().to_string().into_bytes(),
            )],
            attempt: 0,
        })
        .collect();
    let committed = Arc::new(Mutex::new(Vec::new()));
    let source = OneFetch {
        batch: Some(batch),
        committed: committed.clone(),
    };
    let handler = Arc::new(Overlap::default());
    let config = ConsumerConfig {
        name: "bounded".into(),
        max_parallel_partitions: BOUND,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(t.db.clone(), source, handler.clone(), config);

    let step = consumer.step().await.expect("step");
    let (done, failed) = (step.handled(), step.failed());
    assert_eq!((done, failed), (PARTITIONS as usize, false));
    let most = handler.most.load(Ordering::SeqCst);
    assert!(
        most <= BOUND,
        "{most} partitions were handled at once, more than the bound of {BOUND}"
    );
    assert_eq!(most, BOUND, "partitions still run side by side up to it");
    let expected: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, i64::from(p) + 100)).collect();
    assert_eq!(
        *committed.lock().expect("lock"),
        expected,
        "every partition committed, in partition order"
    );
}
