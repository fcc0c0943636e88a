//! Producers: business changes with their events, committed continuously,
//! through the two doors a service uses: the Rust `confirm_order` path and
//! the SQL contract (`outbox_enqueue` in the service's own transaction).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outboxd::store::Db;
use outboxd_demo::orders::{self, ConfirmOrder, OrderService};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::rng::Rng;

/// What the producers did; commit errors are counted, never retried (the
/// checks read what the database holds, not what was attempted).
#[derive(Default)]
pub struct Produced {
    pub account_events: AtomicU64,
    pub orders: AtomicU64,
    pub errors: AtomicU64,
}

pub const BUSINESS_SCHEMA: &str = "
CREATE TABLE account_moves (
  aggregate_id text   NOT NULL,
  seq          bigint NOT NULL,
  PRIMARY KEY (aggregate_id, seq)
);
CREATE TABLE ledger (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  message_id   text   NOT NULL,
  aggregate_id text   NOT NULL,
  seq          bigint NOT NULL,
  shape        text   NOT NULL,
  writer       text   NOT NULL
);
CREATE INDEX ledger_message ON ledger (message_id);
";

/// `sql_tasks` tasks each own every `sql_tasks`-th aggregate, so one
/// aggregate's events are committed by one task, one after another: the
/// order they commit in is their `seq` order. One more task confirms orders.
pub fn spawn(
    set: &mut JoinSet<()>,
    pool: PgPool,
    rate_per_s: u32,
    aggregates: u32,
    seed: u64,
    stop: watch::Receiver<bool>,
) -> Arc<Produced> {
    let produced = Arc::new(Produced::default());
    let sql_tasks = 4u32;
    let tasks = sql_tasks + 1;
    let interval = Duration::from_secs_f64(f64::from(tasks) / f64::from(rate_per_s.max(1)));
    for task in 0..sql_tasks {
        let (pool, produced, stop) = (pool.clone(), produced.clone(), stop.clone());
        let mut rng = Rng::new(seed ^ u64::from(task + 1));
        set.spawn(async move {
            let mut next: HashMap<u32, i64> = HashMap::new();
            let mut tick = tokio::time::interval(interval);
            while !*stop.borrow() {
                tick.tick().await;
                let slot = rng.below(u64::from(aggregates / sql_tasks)) as u32;
                let agg = slot * sql_tasks + task;
                let seq = *next.entry(agg).or_insert(1);
                match account_event(&pool, agg, seq).await {
                    Ok(()) => {
                        next.insert(agg, seq + 1);
                        produced.account_events.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        // The outcome is unknown to the caller; the seq is
                        // skipped either way, so order stays checkable.
                        next.insert(agg, seq + 1);
                        produced.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("chaos: producer: {e}");
                    }
                }
            }
        });
    }
    let (produced2, db) = (produced.clone(), Db::Postgres(pool));
    set.spawn(async move {
        let service = OrderService::new(db.clone());
        let mut tick = tokio::time::interval(interval);
        let mut n = 0u64;
        while !*stop.borrow() {
            tick.tick().await;
            n += 1;
            let id = format!("ord-{n}");
            let res = async {
                orders::create_order(&db, &id, &format!("cust-{}", n % 997), 100 + n as i64)
                    .await
                    .map_err(|e| e.to_string())?;
                let cmd = ConfirmOrder {
                    order_id: id.clone(),
                    operation_key: None,
                };
                service.confirm_order(&cmd).await.map_err(|e| e.to_string())
            }
            .await;
            match res {
                Ok(_) => produced2.orders.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    eprintln!("chaos: confirm_order {id}: {e}");
                    produced2.errors.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    });
    produced
}

/// The SQL contract: the business row and the event in one transaction.
async fn account_event(pool: &PgPool, agg: u32, seq: i64) -> Result<(), sqlx::Error> {
    let aggregate = format!("acct-{agg}");
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO account_moves (aggregate_id, seq) VALUES ($1, $2)")
        .bind(&aggregate)
        .bind(seq)
        .execute(&mut *tx)
        .await?;
    let payload = serde_json::json!({
        "account": aggregate,
        "seq": seq,
        "email": format!("owner{agg}@example.com"),
    });
    sqlx::query("SELECT outbox_enqueue($1, 'account.moved', $2::jsonb, '{}'::jsonb)")
        .bind(&aggregate)
        .bind(payload)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}
