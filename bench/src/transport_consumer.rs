//! `outboxd-bench transport-consumer`: how fast a consumer drains a
//! backlog from each broker, in one run. A topic's backlog is published
//! first (through outboxd's own publisher, every acknowledgement awaited),
//! then one consumer group member with the inbox and a one-row effect per
//! message (batches of `--batch` in a transaction) reads it to the end.
//! The figure is the consumer's: broker fetch, inbox, effect, commit and
//! acknowledgement.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use super::pipeline::{Effect, PARTITIONS};
use outboxd::broker::Publisher;
use outboxd::consumer::{Consumer, ConsumerConfig};
use outboxd::message::OutgoingMessage;
use outboxd::store::{Db, migrate};

#[derive(Debug, Clone, clap::Args)]
pub struct TransportConsumerArgs {
    /// A Postgres database the benchmark may write its inbox and effects to.
    #[arg(long)]
    pub url: String,
    /// The transports, comma-separated: `embedded`, `kafka`, `nats`,
    /// `rabbitmq`, `redis`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "embedded,kafka,nats,rabbitmq"
    )]
    pub transports: Vec<String>,
    /// Messages per run.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Messages per inbox transaction (`batch_in_transaction`).
    #[arg(long, default_value_t = 50)]
    pub batch: usize,
    /// Runs per transport, interleaved; the best of each is reported.
    #[arg(long, default_value_t = 2)]
    pub repeat: usize,
    #[command(flatten)]
    pub broker: super::brokers::BrokerArgs,
}

#[derive(Debug, Clone, Serialize)]
pub struct TransportConsumerRow {
    pub transport: String,
    pub messages: usize,
    pub seconds: f64,
    pub messages_per_second: f64,
}

fn message(topic: &str, i: usize) -> OutgoingMessage {
    let id = uuid::Uuid::new_v4();
    OutgoingMessage {
        topic: topic.into(),
        key: format!("agg-{}", i % 500).into_bytes(),
        payload: format!(r#"{{"n":{i},"pad":"{}"}}"#, "x".repeat(200)).into_bytes(),
        headers: vec![(
            outboxd::message::headers::MESSAGE_ID.into(),
            id.to_string().into_bytes(),
        )],
        message_id: id,
        created_at: chrono::Utc::now(),
    }
}

async fn run_one(
    args: &TransportConsumerArgs,
    db: &Db,
    transport: &str,
) -> Result<f64, BenchError> {
    let Db::Postgres(pool) = db else {
        unreachable!("checked by the caller")
    };
    super::pipeline::reset(pool).await?;
    // Kafka topics cannot be emptied: one of its own per run.
    let topic = match transport {
        "kafka" => format!("outboxd.tc-{}", uuid::Uuid::new_v4().simple()),
        _ => "outboxd.tc".to_string(),
    };
    let publisher = Arc::new(
        args.broker
            .fresh_publisher(transport, db, &topic, PARTITIONS)
            .await?,
    );
    for chunk in (0..args.messages).collect::<Vec<_>>().chunks(500) {
        let mut sends = tokio::task::JoinSet::new();
        for &i in chunk {
            let p = publisher.clone();
            let m = message(&topic, i);
            sends.spawn(async move { p.publish(m).await });
        }
        while let Some(r) = sends.join_next().await {
            r.map_err(|e| BenchError::Refused(format!("{transport}: publish task: {e}")))?
                .map_err(|e| BenchError::Refused(format!("{transport}: publish: {e}")))?;
        }
    }
    let group = format!("tc-{}", uuid::Uuid::new_v4().simple());
    let prefetch = u16::try_from(args.batch.max(1) * 4).unwrap_or(u16::MAX);
    let source = args
        .broker
        .source(transport, db, &group, &topic, PARTITIONS, prefetch)
        .await?;
    let mut consumer = Consumer::new(
        db.clone(),
        source,
        Arc::new(Effect),
        ConsumerConfig {
            name: group.clone(),
            poll_interval: Duration::from_millis(5),
            batch_in_transaction: args.batch,
            ..ConsumerConfig::default()
        },
    );
    let stats = consumer.stats();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let task = tokio::spawn(async move {
        let r = consumer.run(stop_rx).await;
        let _ = outboxd::broker::MessageSource::release(consumer.source_mut()).await;
        r
    });
    let want = args.messages as u64;
    while stats.handled.load(Ordering::Relaxed) < want {
        if started.elapsed() > Duration::from_secs(600) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    let _ = task.await;
    let handled = stats.handled.load(Ordering::Relaxed);
    if handled != want {
        return Err(BenchError::Incorrect(format!(
            "{transport}: published {want} messages, the consumer handled {handled}"
        )));
    }
    Ok(seconds)
}

pub async fn transport_consumer(
    args: &TransportConsumerArgs,
) -> Result<Vec<TransportConsumerRow>, BenchError> {
    let db = Db::connect(&args.url, 8).await?;
    if !matches!(db, Db::Postgres(_)) {
        return Err(BenchError::Refused(
            "the transport consumer benchmark needs a postgres:// URL".into(),
        ));
    }
    migrate(&db).await?;
    let mut best: Vec<Option<f64>> = vec![None; args.transports.len()];
    for _ in 0..args.repeat.max(1) {
        for (i, t) in args.transports.iter().enumerate() {
            let s = run_one(args, &db, t).await?;
            best[i] = Some(best[i].map_or(s, |b: f64| b.min(s)));
        }
    }
    println!(
        "consumer draining a backlog of {} messages ({} partitions, {} per inbox transaction, one effect row each; best of {}):",
        args.messages,
        PARTITIONS,
        args.batch,
        args.repeat.max(1)
    );
    let rows: Vec<TransportConsumerRow> = args
        .transports
        .iter()
        .zip(best)
        .map(|(t, s)| {
            let seconds = s.unwrap_or(f64::NAN);
            TransportConsumerRow {
                transport: t.clone(),
                messages: args.messages,
                seconds,
                messages_per_second: args.messages as f64 / seconds,
            }
        })
        .collect();
    let kafka = rows
        .iter()
        .find(|r| r.transport == "kafka")
        .map(|r| r.messages_per_second);
    for r in &rows {
        println!(
            "  {:<9} {:>7} messages in {:>6.2} s = {:>8.0} messages/s{}",
            r.transport,
            r.messages,
            r.seconds,
            r.messages_per_second,
            kafka.map_or(String::new(), |k| format!(
                " ({:.2}x Kafka's)",
                r.messages_per_second / k
            ))
        );
    }
    Ok(rows)
}
