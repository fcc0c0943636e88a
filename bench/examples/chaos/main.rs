//! The chaos soak (the faults deploys and outages bring, all at once): producers commit events continuously over
//! 10,000 aggregates while two relay processes and two consumer processes
//! are SIGKILLed and restarted, the broker is killed and restarted, Postgres
//! connections are terminated and a transformer and a consumer plugin are
//! hot-swapped. Then it drains and checks, from the database alone, that
//! nothing was lost, no effect happened twice and every aggregate's effects
//! ran in commit order. It prints one line of figures and exits non-zero
//! when a check fails.
//!
//! Every process runs in a network namespace of its own and reaches
//! Postgres and the broker through this driver's delay proxies, so the soak
//! also partitions links, drops packets, delays bytes and hangs connections
//! (see `net`).
//!
//! The broker is tansu (`--transport kafka`), a nats-server with JetStream
//! (`nats`) or a RabbitMQ node (`rabbitmq`), each a server of the soak's
//! own with durable storage in the `kafka` namespace, SIGKILLed and started
//! again on the same data (`broker_kills`); `embedded` has none. NATS and
//! RabbitMQ consumers are group members (`--consumers group`, their
//! default): one consumer group, `ledger`, on the one topic, so RabbitMQ's
//! rule of one group per topic holds.
//!
//! Run it through `tests/chaos.sh` (it makes the namespaces, starts a
//! Postgres and the broker with durable storage in them and builds
//! everything); `--help` lists the knobs.

mod checks;
mod churn;
mod cluster;
mod faults;
mod net;
mod producers;
mod proxy;
mod rng;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use outboxd::store::{Db, migrate};
use sqlx::Executor;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::task::JoinSet;

use churn::{Churn, ChurnEvery};
use cluster::{Broker, Consumers, Proc, RelaySource, Setup, Transport};
use faults::{Fault, Kills, broker_hung, net_schedule, schedule, supervise, unhang};
use net::{Net, Target};
use rng::Rng;

#[derive(Debug, Parser)]
struct Args {
    /// How long producers run and faults are injected.
    #[arg(long, default_value_t = 100)]
    seconds: u64,
    /// Give up waiting for the drain after this long.
    #[arg(long, default_value_t = 240)]
    drain_timeout: u64,
    /// Events per second, all producers together.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    #[arg(long, default_value_t = 10_000)]
    aggregates: u32,
    /// Replays a run's fault schedule and producer choices.
    #[arg(long)]
    seed: Option<u64>,
    /// A Postgres URL whose user may CREATE DATABASE, as this driver
    /// reaches it; the processes reach the same server through the proxy.
    #[arg(long)]
    database_url: String,
    #[arg(long, value_enum, default_value_t = Transport::Kafka)]
    transport: Transport,
    #[arg(long, value_enum, default_value_t = RelaySource::Poll)]
    relay_source: RelaySource,
    /// `static` is Kafka only (and its default); the other transports'
    /// default is `group`.
    #[arg(long, value_enum)]
    consumers: Option<Consumers>,
    /// The namespaces tests/netns.sh made: PREFIX-relay-1 and so on. This
    /// driver runs in PREFIX-drv.
    #[arg(long)]
    netns: String,
    /// The broker's own address (tansu, nats-server or RabbitMQ); the
    /// processes reach it through the proxy (which tansu advertises).
    #[arg(long, alias = "kafka-upstream")]
    broker_upstream: Option<SocketAddr>,
    /// The relays' `publish_timeout`: short partitions are shorter than it,
    /// long ones longer.
    #[arg(long, default_value_t = 4_000)]
    publish_timeout_ms: u64,
    #[arg(long, default_value = "target/debug/outboxd")]
    outboxd: PathBuf,
    /// The script that kills and restarts the broker (`kill`, `restart`):
    /// default tests/tansu.sh for Kafka, tests/broker-node.sh for NATS and
    /// RabbitMQ.
    #[arg(long, alias = "tansu-script")]
    broker_script: Option<PathBuf>,
    /// The broker's log (default: `log` in $TANSU_STATE_DIR or
    /// $BROKER_STATE_DIR, as the scripts keep it).
    #[arg(long)]
    broker_log: Option<PathBuf>,
    #[arg(long, default_value = "plugins/dist")]
    plugins: PathBuf,
    /// Broker kills (Kafka, NATS, RabbitMQ; default: one per 200 s, at
    /// least 3, so recovery is exercised more than once; 0 isolates the
    /// other faults when diagnosing).
    #[arg(long)]
    broker_kills: Option<u32>,
    /// No network faults (to isolate the other faults when diagnosing).
    #[arg(long)]
    no_net_faults: bool,
    /// Keeps the database and the logs for a post-mortem.
    #[arg(long)]
    keep: bool,
    /// Also write the figures as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Restarts a consumer process (SIGKILL, then a start with the same
    /// instance id) every MIN to MAX seconds, e.g. `1-4s`, and prints how
    /// much of the arriving work was handled meanwhile.
    /// The churn runs alone (the consumers' restarts are the only fault)
    /// unless `--with-faults` adds the whole fault schedule to it.
    #[arg(long)]
    churn: Option<ChurnEvery>,
    /// With `--churn`: the process kills, broker kills, backend
    /// terminations, plugin swaps and network faults run as well.
    #[arg(long, requires = "churn")]
    with_faults: bool,
    /// Kafka group consumers join as dynamic members: no
    /// `OUTBOXD_INSTANCE_ID`, so a restarted process is a new member.
    #[arg(long)]
    no_static_membership: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kafka = args.transport == Transport::Kafka;
    let has_broker = args.transport.has_broker();
    let consumers = args.consumers.unwrap_or(if kafka {
        Consumers::Static
    } else {
        Consumers::Group
    });
    if !kafka && consumers == Consumers::Static {
        anyhow::bail!(
            "--consumers static needs --transport kafka (the other transports' consumers share partitions as group members): use --consumers group"
        );
    }
    let broker_kills = if has_broker {
        args.broker_kills
            .unwrap_or_else(|| (args.seconds / 200).max(3) as u32)
    } else {
        0
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir()?;
    let dir_path = if args.keep {
        dir.keep()
    } else {
        dir.path().to_path_buf()
    };

    let (base, _) = args
        .database_url
        .rsplit_once('/')
        .context("--database-url must end in /DBNAME")?;
    let name = format!("outboxd_chaos_{}", std::process::id());
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.database_url)
        .await
        .context("connect to --database-url")?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
        .await?;
    admin
        .execute(format!("CREATE DATABASE {name}").as_str())
        .await?;
    let url = format!("{base}/{name}");
    let pg_upstream = pg_address(&args.database_url)?;
    let proc_url = format!("postgres://postgres@{}/{name}", Net::service(Target::Pg));
    let bootstrap = Net::service(Target::Broker).to_string();
    let broker_upstream =
        if has_broker {
            Some(args.broker_upstream.with_context(|| {
                format!("--transport {:?} needs --broker-upstream", args.transport)
            })?)
        } else {
            None
        };
    let net = Net::start(&args.netns, pg_upstream, broker_upstream, seed).await?;
    // The driver's own connections are named, so the faults spare them.
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(outboxd::store::host_pg_options(&format!(
            "{url}?application_name=chaos-driver"
        ))?)
        .await?;
    let db = Db::Postgres(pool.clone());
    migrate(&db).await?;
    outboxd_demo::orders::create_schema(&db).await?;
    outboxd::store::execute_in_app_schema(&db, producers::BUSINESS_SCHEMA).await?;
    create_topic(args.transport, &bootstrap, broker_upstream).await?;

    let publish_timeout = Duration::from_millis(args.publish_timeout_ms);
    let file_plugin = std::fs::canonicalize(args.plugins.join("redact-pii.wasm"))
        .context("the file plugin plugins/dist/redact-pii.wasm (bash plugins/build.sh)")?;
    let setup = Setup {
        url: &proc_url,
        transport: args.transport,
        broker: has_broker.then_some(bootstrap.as_str()),
        relay_source: args.relay_source,
        consumers,
        file_plugin: &file_plugin,
        publish_timeout,
    };
    let (relay_cfg, [consumer_cfg, consumer2_cfg]) = cluster::write_configs(&dir_path, &setup)?;
    cluster::plugin_roles(&args.outboxd, &consumer_cfg).await?;
    let wasm = |f: &str| args.plugins.join(f);
    for (cfg, file, plugin) in [
        (&relay_cfg, "redact-pii.wasm", "shape"),
        (&consumer_cfg, "ledger.wasm", "ledger"),
    ] {
        println!(
            "chaos: {}",
            cluster::deploy(&args.outboxd, cfg, &wasm(file), plugin).await?
        );
    }
    let mut procs: Vec<Proc> = [
        ("relay-1", &relay_cfg),
        ("relay-2", &relay_cfg),
        ("consumer-1", &consumer_cfg),
        ("consumer-2", &consumer2_cfg),
    ]
    .into_iter()
    .map(|(host, cfg)| Proc::new(host, net.namespace(host), &args.outboxd, cfg, &dir_path))
    .collect();
    let static_members = kafka && consumers == Consumers::Group && !args.no_static_membership;
    if static_members {
        for p in procs.iter_mut().filter(|p| p.name.starts_with("consumer")) {
            p.instance_id = Some(p.name.clone());
        }
    }
    for p in &mut procs {
        p.start()?;
    }
    let broker_log = args.broker_log.clone().unwrap_or_else(|| {
        let (var, default) = if kafka {
            ("TANSU_STATE_DIR", "/tmp/outboxd-tansu".to_string())
        } else {
            (
                "BROKER_STATE_DIR",
                format!("/tmp/outboxd-broker-{:?}", args.transport).to_lowercase(),
            )
        };
        std::env::var_os(var)
            .map_or_else(|| PathBuf::from(default), PathBuf::from)
            .join("log")
    });
    let mut broker = has_broker.then(|| Broker {
        script: args.broker_script.clone().unwrap_or_else(|| {
            PathBuf::from(if kafka {
                "tests/tansu.sh"
            } else {
                "tests/broker-node.sh"
            })
        }),
        read: std::fs::metadata(&broker_log).map_or(0, |m| m.len()),
        log: broker_log,
        tansu: kafka,
    });
    let mut config = format!(
        "transport={:?} relay_source={:?} consumers={:?}",
        args.transport, args.relay_source, consumers
    )
    .to_lowercase();
    if kafka && consumers == Consumers::Group {
        config.push_str(&format!(" static_membership={static_members}"));
    }
    if let Some(every) = args.churn {
        config.push_str(&format!(
            " churn={}-{}s faults={}",
            every.min.as_secs_f64(),
            every.max.as_secs_f64(),
            if args.with_faults { "all" } else { "none" }
        ));
    }
    println!(
        "chaos: seed {seed}, {} s at {} events/s over {} aggregates, {config}; logs in {}",
        args.seconds,
        args.rate,
        args.aggregates,
        dir_path.display()
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut producer_set = JoinSet::new();
    let produced = producers::spawn(
        &mut producer_set,
        pool.clone(),
        args.rate,
        args.aggregates,
        seed,
        stop_rx,
    );

    let run = Duration::from_secs(args.seconds);
    // The churn alone measures how a group keeps up while its members
    // restart; the other faults stop every member at once and would hide it.
    let churn_alone = args.churn.is_some() && !args.with_faults;
    let mut plan = if churn_alone {
        Vec::new()
    } else {
        schedule(&mut rng, run, broker_kills)
    };
    if !args.no_net_faults && !churn_alone {
        plan.extend(net_schedule(&mut rng, run, has_broker, publish_timeout));
        plan.sort_by_key(|(t, _)| *t);
    }
    let start = Instant::now();
    let churn_from = churn::db_now(&pool).await?;
    let mut churn = args.churn.map(|every| Churn::new(every, seed, vec![2, 3]));
    let mut kills = Kills::default();
    let mut last_fault = start;
    let mut max_backlog_ms = 0i64;
    let mut next_sample = start;
    plan.reverse(); // popped from the end, earliest first
    let mut broker_started = Instant::now();
    let mut backlog_ms = 0i64;
    // A broker restart runs beside the plan (a RabbitMQ node takes seconds
    // to boot), so it never holds up the next fault or heal.
    let mut restarting: Option<Restarting> = None;
    while let Some((when, fault)) = plan.pop() {
        while start.elapsed() < when {
            if Instant::now() >= next_sample {
                backlog_ms = checks::backlog_age_ms(&pool).await?;
                max_backlog_ms = max_backlog_ms.max(backlog_ms);
                next_sample += Duration::from_millis(500);
            }
            watch_procs(&mut procs, &mut kills, true).await?;
            if let Some(churn) = churn.as_mut() {
                churn.tick(&mut procs).await?;
            }
            if restarting.as_ref().is_some_and(|r| r.task.is_finished()) {
                Restarting::finish(&mut restarting, start).await?;
                broker_started = Instant::now();
            }
            if let Some(broker) = broker.as_mut().filter(|_| restarting.is_none()) {
                if broker.crashed() {
                    supervise(broker, &mut kills).await?;
                    broker_started = Instant::now();
                } else if broker_hung(broker, backlog_ms, broker_started.elapsed()) {
                    unhang(broker, &mut kills).await?;
                    broker_started = Instant::now();
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let now = start.elapsed();
        // Restarts are scheduled like faults, so a slow one never delays
        // the rest of the plan.
        let mut later = None;
        match fault {
            Fault::KillProc(i) => {
                procs[i].kill().await;
                if i < 2 {
                    kills.relay += 1
                } else {
                    kills.consumer += 1
                }
                later = Some((now + rng.millis(200, 1_500), Fault::StartProc(i)));
            }
            Fault::StartProc(i) => procs[i].start()?,
            Fault::Broker => {
                // The previous restart first: a kill meets a running broker.
                Restarting::finish(&mut restarting, start).await?;
                broker
                    .as_ref()
                    .context("a broker fault without a broker")?
                    .kill()
                    .await?;
                println!(
                    "chaos: [{:>5.1}s] broker SIGKILLed",
                    start.elapsed().as_secs_f64()
                );
                // Down on purpose: not a hang.
                broker_started = Instant::now();
                kills.broker += 1;
                later = Some((now + rng.millis(1_000, 4_000), Fault::BrokerBack));
            }
            Fault::BrokerBack => {
                let b = broker
                    .as_ref()
                    .context("a broker fault without a broker")?
                    .clone();
                restarting = Some(Restarting {
                    task: tokio::spawn(async move { b.restart().await }),
                    since: Instant::now(),
                });
                broker_started = Instant::now();
            }
            Fault::PgTerminate => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                      WHERE datname = current_database() AND pid <> pg_backend_pid()
                        AND application_name <> 'chaos-driver'
                        AND random() < 0.5",
                )
                .fetch_one(&pool)
                .await?;
                kills.pg_backends += n as u32;
            }
            Fault::SwapTransformer | Fault::SwapConsumer => {
                let (cfg, file, name) = match fault {
                    Fault::SwapTransformer => (&relay_cfg, "cloudevents.wasm", "shape"),
                    _ => (&consumer_cfg, "ledger-v2.wasm", "ledger"),
                };
                let out = cluster::deploy(&args.outboxd, cfg, &wasm(file), name).await?;
                println!("chaos: [{:>5.1}s] {out}", start.elapsed().as_secs_f64());
                kills.swaps += 1;
            }
            Fault::Net {
                proc,
                target,
                fault,
                kind,
                length,
            } => {
                let host = &procs[proc].name;
                net.inject(host, target, fault).await?;
                *kills.net.entry(kind.label()).or_default() += 1;
                println!(
                    "chaos: [{:>5.1}s] {} {host} <-> {}: {fault:?} for {:.1} s",
                    start.elapsed().as_secs_f64(),
                    kind.label(),
                    target.label(),
                    length.as_secs_f64()
                );
            }
            Fault::Heal {
                proc,
                target,
                fault,
            } => net.heal(&procs[proc].name, target, fault).await?,
        }
        if let Some(event) = later {
            let at = plan.partition_point(|(t, _)| *t > event.0);
            plan.insert(at, event);
        }
        last_fault = Instant::now();
    }
    while start.elapsed() < run {
        if let Some(churn) = churn.as_mut() {
            watch_procs(&mut procs, &mut kills, true).await?;
            churn.tick(&mut procs).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The broker is up again before the drain starts.
    Restarting::finish(&mut restarting, start).await?;
    let fault_phase = start.elapsed();
    let churn_to = churn::db_now(&pool).await?;
    for p in &procs {
        for target in [Target::Pg, Target::Broker]
            .into_iter()
            .filter(|t| has_broker || *t == Target::Pg)
        {
            for fault in [net::NetFault::Partition, net::NetFault::Stall] {
                net.heal(&p.name, target, fault).await?;
            }
        }
    }
    let _ = stop_tx.send(true);
    while producer_set.join_next().await.is_some() {}
    let producers_stopped = Instant::now();

    // Drain: wait until every committed event has its effect (or was given
    // up on with a reason), while the processes keep running.
    let drain_deadline = Instant::now() + Duration::from_secs(args.drain_timeout);
    let mut drained = false;
    while Instant::now() < drain_deadline {
        watch_procs(&mut procs, &mut kills, false).await?;
        backlog_ms = checks::backlog_age_ms(&pool).await?;
        if let Some(broker) = broker.as_mut() {
            if broker.crashed() {
                supervise(broker, &mut kills).await?;
                broker_started = Instant::now();
                last_fault = Instant::now();
            } else if broker_hung(broker, backlog_ms, broker_started.elapsed()) {
                unhang(broker, &mut kills).await?;
                broker_started = Instant::now();
                last_fault = Instant::now();
            }
        }
        max_backlog_ms = max_backlog_ms.max(backlog_ms);
        if checks::outstanding(&pool).await? == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let drain_ms = last_fault.elapsed().as_millis();
    let drain_after_stop_ms = producers_stopped.elapsed().as_millis();
    for p in &mut procs {
        p.kill().await;
    }
    let verdict = checks::verdict(&pool).await?;
    // Read before retention deletes the rows it counts.
    let churned = match &churn {
        Some(c) => {
            let (handled, arrivals) = churn::throughput(&pool, churn_from, churn_to).await?;
            Some((c.restarts, handled, arrivals))
        }
        None => None,
    };
    // Retention, as the daemon's hourly pass would run it a week later.
    let outbox_before = checks::outbox_size(&pool).await?;
    let retention = outboxd::ops::retention::cleanup(
        &db,
        &outboxd::config::RetentionConfig::default(),
        chrono::Utc::now() + chrono::Duration::days(8),
    )
    .await?;
    pool.execute("VACUUM outbox").await?;
    let outbox_after = checks::outbox_size(&pool).await?;
    let peak_rss: Vec<String> = procs
        .iter()
        .map(|p| format!("{}={}", p.name, p.peak_rss_kib / 1024))
        .collect();
    let produced_events = produced
        .account_events
        .load(std::sync::atomic::Ordering::Relaxed)
        + produced.orders.load(std::sync::atomic::Ordering::Relaxed);
    let line = format!(
        "chaos: {config} seconds={} events={} relay_kills={} consumer_kills={} broker_kills={} broker_crashes={} broker_hangs={} pg_kills={} swaps={} \
         net_faults={} self_exits={} \
         lost={} duplicate_effects={} order_violations={} atomicity_violations={} unpublished={} \
         dead={} consumer_dead_letters={} file_plugin_missing={} max_backlog_age_ms={} drain_ms={} drain_after_stop_ms={}{}",
        fault_phase.as_secs(),
        verdict.events,
        kills.relay,
        kills.consumer,
        kills.broker,
        kills.broker_crashes,
        kills.broker_hangs,
        kills.pg_backends,
        kills.swaps,
        kills.net_total(),
        kills.self_exits,
        verdict.lost,
        verdict.duplicate_effects,
        verdict.order_violations,
        verdict.atomicity_violations,
        verdict.unpublished,
        verdict.dead,
        verdict.consumer_dead_letters,
        verdict.file_plugin_missing,
        max_backlog_ms,
        drain_ms,
        drain_after_stop_ms,
        if drained { "" } else { " (drain timed out)" },
    );
    println!(
        "chaos: producers committed {produced_events} events ({} commit errors); effects by \
         version {:?}; payload shapes {:?}; transformed by {:?}",
        produced.errors.load(std::sync::atomic::Ordering::Relaxed),
        verdict.by_writer,
        verdict.by_shape,
        verdict.by_transformer
    );
    let net_line: Vec<String> = kills.net.iter().map(|(k, n)| format!("{k}={n}")).collect();
    println!("chaos: network faults: {}", net_line.join(" "));
    if let Some((restarts, handled, arrivals)) = churned {
        println!(
            "chaos: churn restarts={restarts} static_membership={static_members} \
             handled_during_churn={handled} arrivals_during_churn={arrivals} ratio={:.3}",
            handled as f64 / arrivals.max(1) as f64
        );
    }
    println!(
        "chaos: peak RSS MiB: {}; outbox before retention {} rows {} MiB, after {} rows {} MiB ({} deleted)",
        peak_rss.join(" "),
        outbox_before.0,
        outbox_before.1 / (1 << 20),
        outbox_after.0,
        outbox_after.1 / (1 << 20),
        retention.outbox_deleted
    );
    println!("{line}");
    if let Some(path) = &args.json {
        let rss: std::collections::BTreeMap<&str, u64> = procs
            .iter()
            .map(|p| (p.name.as_str(), p.peak_rss_kib))
            .collect();
        let doc = serde_json::json!({ "seed": seed, "config": config, "kills": kills, "verdict": verdict,
            "max_backlog_age_ms": max_backlog_ms, "drain_ms": drain_ms as u64,
            "drain_after_stop_ms": drain_after_stop_ms as u64, "drained": drained,
            "peak_rss_kib": rss, "outbox_before_retention": outbox_before,
            "outbox_after_retention": outbox_after });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)?;
    }
    // The churn alone swaps no plugin and kills no broker.
    let swapped = churn_alone || (verdict.by_writer.len() == 2 && verdict.by_shape.len() == 2);
    let brokers_killed = churn_alone || kills.broker >= broker_kills;
    let ok = drained && verdict.ok() && brokers_killed && swapped;
    // The database goes with tests/chaos.sh's throwaway cluster (kept
    // with --keep).
    pool.close().await;
    if !ok {
        anyhow::bail!(
            "the soak failed (seed {seed}): drained={drained}, both versions and shapes seen={swapped}; \
             rerun with --seed {seed} --keep for the logs"
        );
    }
    Ok(())
}

/// A broker restart under way (tests/tansu.sh or tests/broker-node.sh
/// `restart`, which returns once the port accepts).
struct Restarting {
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    since: Instant,
}

impl Restarting {
    /// Waits for the restart in `slot`, if any, and says how long it took;
    /// a restart that failed fails the soak.
    async fn finish(slot: &mut Option<Restarting>, start: Instant) -> anyhow::Result<()> {
        let Some(r) = slot.take() else {
            return Ok(());
        };
        r.task.await.context("the broker restart task")??;
        println!(
            "chaos: [{:>5.1}s] broker back (its restart took {:.1} s)",
            start.elapsed().as_secs_f64(),
            r.since.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// Creates the soak's topic before any process starts, as an operator
/// would: the Kafka topic, the NATS stream or the RabbitMQ exchange and
/// quorum queues, four partitions, one replica, with outboxd's own code,
/// through the proxy (Kafka: tansu advertises it) or straight to the
/// server (NATS, RabbitMQ). The processes' `[transport.topics] create =
/// true` then finds them: four processes racing to create one stream at
/// their first start would make some fail.
async fn create_topic(
    transport: Transport,
    bootstrap: &str,
    upstream: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let topics: std::collections::BTreeSet<String> = [cluster::TOPIC.to_string()].into();
    let server = upstream.map(|a| a.to_string()).unwrap_or_default();
    match transport {
        Transport::Embedded => {}
        Transport::Kafka => {
            let props = [("bootstrap.servers".to_string(), bootstrap.to_string())].into();
            outboxd::broker::kafka::ensure_topics(&props, &[cluster::TOPIC.to_string()], 4)
                .await
                .map_err(|e| anyhow::anyhow!("create {}: {e}", cluster::TOPIC))?;
        }
        Transport::Nats => {
            let section = outboxd_core::config::NatsSection {
                url: format!("nats://{server}"),
                ..Default::default()
            };
            let client = outboxd::broker::nats::start(&section, &topics, Some(1))
                .await
                .map_err(|e| anyhow::anyhow!("create the stream of {}: {e}", cluster::TOPIC))?;
            drop(client);
        }
        Transport::Rabbitmq => {
            let section = outboxd_core::config::RabbitSection {
                url: outboxd_core::config::RabbitUrl(cluster::rabbitmq_url(&server)),
                ..Default::default()
            };
            let conn = outboxd::broker::rabbitmq::start(&section, &topics, 4, Some(1))
                .await
                .map_err(|e| anyhow::anyhow!("create the queues of {}: {e}", cluster::TOPIC))?;
            let _ = conn.close(200, "topology created".into()).await;
        }
    }
    Ok(())
}

/// `host:port` of a `postgres://user@host:port/db` URL.
fn pg_address(url: &str) -> anyhow::Result<SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host_port.parse().with_context(|| {
        format!("--database-url {url}: the soak needs host:port as an IP address and a port")
    })
}

/// Samples each process's memory and restarts a process that exited by
/// itself with an error (exit code 1, no panic) while faults were being
/// injected, as a supervisor would: an `outboxd run` that cannot reach its
/// database or broker at start, or loses it then, exits with an error that
/// names it. Such exits are counted as `self_exits` and printed with the
/// process's last log lines; a panic, a signal or an exit after the faults
/// stopped fails the soak, which must not hide a crash behind its own kills.
async fn watch_procs(procs: &mut [Proc], kills: &mut Kills, faults_on: bool) -> anyhow::Result<()> {
    for p in procs.iter_mut() {
        p.sample_rss();
        let Some(status) = p.exited()? else { continue };
        let tail = p.tail(6);
        let excused = faults_on && status.code() == Some(1) && !tail.contains("panicked");
        if !excused {
            p.check_alive()?;
        }
        println!(
            "chaos: {} exited by itself ({status}) while faults ran; starting it again. Its last lines:\n{}",
            p.name,
            p.tail(3)
        );
        kills.self_exits += 1;
        p.start()?;
    }
    Ok(())
}
