//! The demo: the whole pipeline on a fresh SQLite file, with nothing
//! else installed. An order service confirms orders through
//! `confirm_order`, the relay publishes over the embedded transport, and
//! billing records invoices through the inbox. Some events are published
//! twice on purpose (what a relay crash between publish and mark does), to
//! show the inbox dropping the duplicates.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::Row;
use tokio::sync::watch;

use crate::billing;
use crate::latency::{LatencySamples, percentile};
use crate::orders::{self, ConfirmOrder, ConfirmOutcome, OrderError, OrderService};
use outboxd::broker::Publisher;
use outboxd::clock::SystemClock;
use outboxd::config::{Config, ConsumerSection, SqliteSynchronous};
use outboxd::daemon::join_all_workers;
use outboxd::relay::Relay;
use outboxd::relay::RelayConfig;
use outboxd::route::Router;
use outboxd::store::outbox::sqlite_claim::{SqliteStore, from_micros};
use outboxd::store::{Db, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// How many orders to confirm.
    #[arg(long, default_value_t = 2000)]
    pub orders: usize,
    /// The SQLite file to create (replaced if it exists).
    #[arg(long, default_value = "outboxd-demo.db")]
    pub db: PathBuf,
    /// Relay workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Give up if the pipeline has not drained after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
    /// Publish to this Kafka (bootstrap servers) instead of the embedded
    /// transport; the demo creates its own topic there.
    #[arg(long, value_name = "BOOTSTRAP", conflicts_with_all = ["nats", "rabbitmq", "redis"])]
    pub kafka: Option<String>,
    /// Publish to and consume from this NATS JetStream server instead
    /// (nats://host:4222); the demo creates its own stream there.
    #[arg(long, value_name = "URL", conflicts_with_all = ["rabbitmq", "redis"])]
    pub nats: Option<String>,
    /// Publish to and consume from this RabbitMQ instead
    /// (amqp://user:password@host:5672/%2f); the demo declares its own
    /// exchange and quorum queues there.
    #[arg(long, value_name = "URL", conflicts_with = "redis")]
    pub rabbitmq: Option<String>,
    /// Publish to and consume from this Redis instead
    /// (redis://host:6379, rediss:// for TLS); the demo creates its own
    /// partition streams there.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// The transformer component the relay runs on every event (a
    /// CloudEvents envelope by default, embedded in this binary).
    #[arg(long, value_name = "WASM")]
    pub transformer: Option<PathBuf>,
    /// Run without plugins: events published as they are, and the built-in
    /// billing handler instead of the billing consumer plugin.
    #[arg(long, conflicts_with = "transformer")]
    pub no_plugin: bool,
    /// Orders confirmed per second: a steady load, so the latency reported
    /// is the pipeline's and not a queue the demo built itself.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: u32,
    /// Confirm the orders as fast as possible instead (4 concurrent
    /// clients), and report the latency under that backlog.
    #[arg(long, conflicts_with = "rate")]
    pub burst: bool,
    /// Fsync every commit (SQLite `synchronous = FULL`, the product's
    /// default) instead of the demo's NORMAL, which survives a crash of the
    /// process but may lose the last commits on a power loss. On a disk
    /// whose fsync takes milliseconds this caps the commit rate.
    #[arg(long)]
    pub durable: bool,
    /// Show the logs on the terminal instead of writing them to the log
    /// file next to the database.
    #[arg(long, short)]
    pub verbose: bool,
}

impl DemoArgs {
    /// Where the logs go unless `--verbose`: next to the database file.
    pub fn log_file(&self) -> PathBuf {
        self.db.with_extension("log")
    }
}

/// Where the demo's logs went, and how many warnings they hold.
#[derive(Debug, Default)]
pub struct DemoLog {
    /// `None`: on the terminal (`--verbose`).
    pub file: Option<PathBuf>,
    pub warnings: Arc<std::sync::atomic::AtomicUsize>,
}

/// The demo's plugins, compiled from `plugins/` when this crate was built
/// (`build.rs`): the demo needs no source tree at run time.
const EMBEDDED: [(&str, &[u8]); 2] = [
    (
        "cloudevents",
        include_bytes!(concat!(env!("OUT_DIR"), "/cloudevents.wasm")),
    ),
    (
        "billing",
        include_bytes!(concat!(env!("OUT_DIR"), "/billing.wasm")),
    ),
];

/// Writes the embedded plugin `name` next to the demo's database, where the
/// plugin host loads it from like any `[[plugins]] path`.
fn embedded_plugin(args: &DemoArgs, name: &str) -> anyhow::Result<PathBuf> {
    let bytes = EMBEDDED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
        .with_context(|| format!("no embedded plugin is named {name}"))?;
    let dir = args.db.with_extension("plugins");
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating {} for the demo's plugins", dir.display()))?;
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

pub async fn run(args: DemoArgs, log: DemoLog) -> anyhow::Result<ExitCode> {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = args.db.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
    let url = format!("sqlite://{}", args.db.display());
    let transport = if let Some(b) = &args.kafka {
        format!("Kafka at {b}")
    } else if let Some(u) = &args.nats {
        format!("NATS JetStream at {u}")
    } else if let Some(u) = &args.rabbitmq {
        format!("RabbitMQ at {}", outboxd::config::rabbitmq::redact(u))
    } else if let Some(u) = &args.redis {
        format!("Redis Streams at {}", outboxd::config::RedisUrl(u.clone()))
    } else {
        "embedded transport, no services".to_string()
    };
    println!(
        "outboxd demo: {} orders on {} ({transport})",
        args.orders,
        args.db.display()
    );
    let synchronous = if args.durable {
        SqliteSynchronous::Full
    } else {
        SqliteSynchronous::Normal
    };
    println!(
        "  SQLite synchronous = {} ({})",
        if args.durable { "FULL" } else { "NORMAL" },
        if args.durable {
            "an fsync per commit"
        } else {
            "a crash of the process loses nothing; --durable fsyncs every commit"
        }
    );
    let db = Db::connect_with(&url, 8, synchronous)
        .await
        .context("creating the demo database")?;
    migrate(&db).await?;
    orders::create_schema(&db).await?;
    billing::create_schema(&db).await?;

    let Db::Sqlite(pool) = &db else {
        unreachable!("the demo always uses SQLite")
    };
    let mut tx = pool.begin().await?;
    for i in 0..args.orders {
        sqlx::query("INSERT INTO orders (id, customer_id, total_cents) VALUES ($1, $2, $3)")
            .bind(format!("order-{i:06}"))
            .bind(format!("customer-{}", i % 97))
            .bind(1000 + (i as i64 * 37) % 90_000)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;

    let mut config = Config::from_toml("(demo)", "", std::iter::empty())?;
    config.database.url = url.clone();
    config.database.sqlite_synchronous = synchronous;
    config.relay.workers = args.workers.max(1);
    config.relay.poll_interval = std::time::Duration::from_millis(20);
    let mut topic = orders::ORDER_CONFIRMED.to_string();
    let mut consumer = "billing".to_string();
    if let Some(bootstrap) = &args.kafka {
        // A topic and group of its own, so earlier demo runs on the same
        // broker cannot leak into this one's summary.
        let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
        topic = format!("outboxd-demo-{run}");
        consumer = format!("billing-{run}");
        config.transport.kind = outboxd::config::TransportKind::Kafka;
        config
            .transport
            .kafka
            .insert("bootstrap.servers".into(), bootstrap.clone());
        config.routes = vec![outboxd::route::Route::new(
            orders::ORDER_CONFIRMED,
            topic.clone(),
        )];
        outboxd::broker::kafka::ensure_topics(
            &config.transport.kafka,
            std::slice::from_ref(&topic),
            4,
        )
        .await
        .map_err(|e| anyhow::anyhow!("--kafka {bootstrap}: {e}"))?;
    }
    if args.nats.is_some() || args.rabbitmq.is_some() || args.redis.is_some() {
        // A topic and group of their own, as on Kafka; outboxd creates the
        // stream (NATS), the exchange and queues (RabbitMQ) or the partition
        // streams (Redis) at start.
        let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
        topic = format!("outboxd-demo-{run}");
        consumer = format!("billing-{run}");
        if let Some(url) = &args.nats {
            config.transport.kind = outboxd::config::TransportKind::Nats;
            config.transport.nats.url = url.clone();
        }
        if let Some(url) = &args.rabbitmq {
            config.transport.kind = outboxd::config::TransportKind::Rabbitmq;
            config.transport.rabbitmq.url = outboxd::config::RabbitUrl(url.clone());
        }
        if let Some(url) = &args.redis {
            config.transport.kind = outboxd::config::TransportKind::Redis;
            config.transport.redis.url = outboxd::config::RedisUrl(url.clone());
        }
        config.transport.partitions = 4;
        config.transport.topics.create = true;
        config.routes = vec![outboxd::route::Route::new(
            orders::ORDER_CONFIRMED,
            topic.clone(),
        )];
    }
    if !args.no_plugin {
        let wasm = match &args.transformer {
            Some(p) => p.clone(),
            None => embedded_plugin(&args, "cloudevents")?,
        };
        println!(
            "  the relay runs the transformer plugin {} on every event",
            wasm.display()
        );
        config.plugins = vec![outboxd::config::PluginSpec::new("cloudevents", wasm)];
        let route_topic = topic.clone();
        config.routes = vec![outboxd::route::Route::new(
            orders::ORDER_CONFIRMED,
            route_topic,
        )];
        if let Some(r) = config.routes.first_mut() {
            r.transformers = vec!["cloudevents".into()];
        }
    }
    let handler = if args.no_plugin {
        "builtin:billing".to_string()
    } else {
        let billing = embedded_plugin(&args, "billing")?;
        println!("  billing is the consumer plugin {}", billing.display());
        config
            .plugins
            .push(outboxd::config::PluginSpec::new("billing", billing));
        "plugin:billing".to_string()
    };
    // Billing handles up to 32 messages in one inbox transaction: one
    // commit for all of them, and a failure reruns them one at a time.
    let mut billing = ConsumerSection::new(consumer, vec![topic], handler);
    billing.batch_in_transaction = 32;
    // All the billing plugin's SQL may touch (SQLite's authorizer holds
    // it to this).
    billing.tables.write = vec!["invoices".into()];
    config.consumers = vec![billing];
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every handled message's commit latency, for the summary's percentiles.
    let latencies = Arc::new(LatencySamples::default());
    let daemon = crate::daemon().on_handled(latencies.hook()).build();
    let (set, handles) = daemon
        .spawn_pipeline(&config, &db, outboxd::fault::Faults::none(), stop_rx)
        .await?;
    let stats = handles.consumer_stats[0].1.clone();

    // The order service: confirm every order, and retry 10% of them as an
    // impatient client would; retries must not create events.
    let service = OrderService::new(db.clone());
    let started = Instant::now();
    let (written, retries) = if args.burst {
        confirm_burst(&service, args.orders).await?
    } else {
        confirm_steadily(&service, args.orders, args.rate).await?
    };
    println!(
        "  wrote {written} order.confirmed events in {:.2?} ({}); {retries} client retries wrote none",
        started.elapsed(),
        if args.burst {
            "--burst: as fast as possible".to_string()
        } else {
            format!("{} orders/s", args.rate)
        }
    );

    // Wait until the relay has published everything, then republish a slice
    // of it: exactly what a relay killed between publish and mark does.
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    loop {
        let pending: i64 = sqlx::query("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(pool)
            .await?
            .get(0);
        progress(written, (written as i64 - pending).max(0) as usize, &stats);
        if pending == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let redelivered = republish_some(&db, &config, (written / 20).max(1)).await?;
    // JetStream's duplicate window drops a republish with a message id it
    // has seen, so on NATS the copies never reach the inbox.
    let expected_dups = if args.nats.is_some() {
        println!(
            "\n  simulated a relay crash: {redelivered} events published a second time (JetStream's duplicate window drops them)"
        );
        0
    } else {
        println!("\n  simulated a relay crash: {redelivered} events published a second time");
        redelivered as u64
    };
    loop {
        let handled = stats.handled.load(Ordering::Relaxed);
        let dups = stats.duplicates.load(Ordering::Relaxed);
        progress(written, written, &stats);
        if (handled as usize >= written && dups >= expected_dups) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!();
    let _ = stop_tx.send(true);
    join_all_workers(set).await?;

    let ok = summary(pool, written, retries, redelivered, &stats, &latencies).await?;
    match &log.file {
        Some(file) => println!(
            "  log: {} ({} warnings; --verbose shows the logs here)",
            file.display(),
            log.warnings.load(Ordering::Relaxed)
        ),
        None => println!("  log: on this terminal (--verbose)"),
    }
    db.close().await;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One confirmation, and a client retry for every tenth order.
async fn confirm_one(service: &OrderService, i: usize) -> Result<(usize, usize), OrderError> {
    let cmd = ConfirmOrder {
        order_id: format!("order-{i:06}"),
        operation_key: None,
    };
    let confirmed = matches!(
        service.confirm_order(&cmd).await?,
        ConfirmOutcome::Confirmed(_)
    );
    let retried =
        i.is_multiple_of(10) && service.confirm_order(&cmd).await? == ConfirmOutcome::Unchanged;
    Ok((usize::from(confirmed), usize::from(retried)))
}

/// Confirms order `i` at `i / rate` seconds from now, each in its own task
/// (a bounded number at once), as independent clients would.
async fn confirm_steadily(
    service: &OrderService,
    orders: usize,
    rate: u32,
) -> anyhow::Result<(usize, usize)> {
    let limit = Arc::new(tokio::sync::Semaphore::new(8));
    let start = tokio::time::Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..orders {
        let due = start + Duration::from_secs_f64(i as f64 / f64::from(rate));
        tokio::time::sleep_until(due).await;
        let permit = limit.clone().acquire_owned().await?;
        let service = service.clone();
        clients.spawn(async move {
            let r = confirm_one(&service, i).await;
            drop(permit);
            r
        });
    }
    sum_confirmations(clients).await
}

/// Four clients confirming as fast as they can.
async fn confirm_burst(service: &OrderService, orders: usize) -> anyhow::Result<(usize, usize)> {
    let lanes = 4;
    let mut writers = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let service = service.clone();
        writers.spawn(async move {
            let (mut written, mut retries) = (0, 0);
            for i in (lane..orders).step_by(lanes) {
                let (c, u) = confirm_one(&service, i).await?;
                written += c;
                retries += u;
            }
            Ok::<_, OrderError>((written, retries))
        });
    }
    sum_confirmations(writers).await
}

/// Events written and client retries, added up over every client task.
async fn sum_confirmations(
    mut clients: tokio::task::JoinSet<Result<(usize, usize), OrderError>>,
) -> anyhow::Result<(usize, usize)> {
    let (mut written, mut retries) = (0, 0);
    while let Some(r) = clients.join_next().await {
        let (c, u) = r??;
        written += c;
        retries += u;
    }
    Ok((written, retries))
}

fn progress(written: usize, published: usize, stats: &outboxd::consumer::ConsumerStats) {
    use std::io::Write;
    print!(
        "\r  written {written:>7} | published {published:>7} | consumed {:>7} | duplicates dropped {:>5}",
        stats.handled.load(Ordering::Relaxed),
        stats.duplicates.load(Ordering::Relaxed)
    );
    let _ = std::io::stdout().flush();
}

async fn republish_some(db: &Db, config: &Config, count: usize) -> anyhow::Result<usize> {
    let Db::Sqlite(pool) = db else { return Ok(0) };
    let store = SqliteStore::new(pool.clone(), Duration::from_secs(30));
    let router = Router::new(config.routes.clone());
    // This relay only builds the messages, exactly as the real one does.
    let relay = Relay::new(
        store,
        outboxd::broker::NullPublisher,
        router,
        RelayConfig::default(),
        Arc::new(SystemClock),
    );
    let rows = sqlx::query("SELECT seq, id, aggregate_id, event_type, payload, created_at FROM outbox ORDER BY seq LIMIT $1")
        .bind(count as i64)
        .fetch_all(pool)
        .await?;
    let mut messages = Vec::with_capacity(rows.len());
    for r in &rows {
        let ev = outboxd::event::OutboxEvent {
            seq: r.get(0),
            id: outboxd::event::EventId(uuid::Uuid::parse_str(r.get::<&str, _>(1))?),
            aggregate_id: r.get(2),
            event_type: r.get(3),
            payload: r.get(4),
            headers: Default::default(),
            created_at: from_micros(r.get(5)),
            attempts: 0,
            redrive_with: None,
        };
        messages.push(relay.message_for(&ev));
    }
    let p = outboxd::broker::AnyPublisher::connect(config, db, Duration::from_secs(10)).await?;
    for m in messages {
        p.publish(m).await?;
    }
    Ok(rows.len())
}

async fn summary(
    pool: &sqlx::SqlitePool,
    written: usize,
    retries: usize,
    redelivered: usize,
    stats: &outboxd::consumer::ConsumerStats,
    latencies: &LatencySamples,
) -> anyhow::Result<bool> {
    let row = sqlx::query(
        "SELECT
           (SELECT count(*) FROM orders WHERE status = 'confirmed'),
           (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL),
           (SELECT count(*) FROM invoices),
           (SELECT count(*) FROM orders o WHERE o.status = 'confirmed'
               AND NOT EXISTS (SELECT 1 FROM invoices i WHERE i.order_id = o.id)),
           (SELECT count(*) FROM (SELECT order_id FROM invoices GROUP BY order_id HAVING count(*) > 1))",
    )
    .fetch_one(pool)
    .await?;
    let (confirmed, published, invoices, missing, doubled): (i64, i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let lat = latencies.sorted_ms();
    let ok = missing == 0 && doubled == 0 && invoices == confirmed && confirmed as usize == written;
    println!("\noutboxd demo summary");
    println!("  orders confirmed = events written   {written}");
    println!("  client retries (wrote no event)     {retries}");
    println!("  events published by the relay      {published}");
    println!("  extra deliveries (simulated crash)  {redelivered}");
    println!(
        "  messages consumed by billing        {}",
        stats.handled.load(Ordering::Relaxed)
    );
    println!(
        "  duplicates dropped by the inbox     {}",
        stats.duplicates.load(Ordering::Relaxed)
    );
    println!(
        "  end-to-end latency (commit→invoice) p50 {:.1} ms, p99 {:.1} ms",
        percentile(&lat, 0.50),
        percentile(&lat, 0.99)
    );
    println!(
        "  invoices: {invoices} for {confirmed} confirmed orders; lost {missing}, duplicated {doubled}"
    );
    if ok {
        println!(
            "  RESULT: OK, every confirmed order has exactly one invoice (0 lost, 0 duplicate)"
        );
    } else {
        println!("  RESULT: FAILED, confirmed orders and invoices do not match one to one");
    }
    Ok(ok)
}
