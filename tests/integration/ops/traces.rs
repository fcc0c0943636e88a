//! OpenTelemetry traces: one event followed from the producer's
//! `traceparent` through a relay process, the embedded transport and a
//! consumer process to the inbox commit, as an OTLP/HTTP receiver started
//! here sees them; the trace context a transformer may not touch; and
//! export to an https receiver, with its certificate verified.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use outboxd::event::NewEvent;
use outboxd::relay::RelayConfig;
use outboxd::relay::StepOutcome;
use outboxd::route::Route;
use outboxd::store::Db;
use prost::Message as _;
use serde_json::json;

use crate::support::db::enqueue_on;
use crate::support::kafka::{bootstrap, create_topic, unique};
use crate::support::plugins::{chained_relay, plugin_path, spec};
use crate::support::process::{billing_plugin_consumer, outboxd, terminate};
use crate::support::tls::TestCa;
use crate::support::{ScriptedPublisher, TestDb, eventually, on_both};

/// One span as received, with the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attr(&self, key: &str) -> Option<String> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                AnyValue::StringValue(s) => s.clone(),
                AnyValue::IntValue(i) => i.to_string(),
                AnyValue::BoolValue(b) => b.to_string(),
                other => format!("{other:?}"),
            })
    }
}

/// An OTLP/HTTP receiver on loopback: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, as a collector takes it.
struct Receiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let app = Self::app(spans.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { endpoint, spans }
    }

    /// The receiver over TLS with `tls`'s certificate, at
    /// `https://localhost:PORT`; `seen` counts what reaches its port.
    async fn start_tls(tls: tokio_rustls::TlsAcceptor) -> (Receiver, Arc<Seen>) {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let port = tcp.local_addr().expect("addr").port();
        let seen = Arc::new(Seen::default());
        let listener = TlsListener {
            tcp,
            tls,
            seen: seen.clone(),
        };
        let app = Self::app(spans.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let endpoint = format!("https://localhost:{port}");
        (Receiver { endpoint, spans }, seen)
    }

    fn app(sink: Arc<Mutex<Vec<Received>>>) -> axum::Router {
        axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let sink = sink.clone();
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return (axum::http::StatusCode::BAD_REQUEST, Vec::new());
                    };
                    let mut spans = sink.lock().expect("spans");
                    for rs in request.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                                AnyValue::StringValue(s) => Some(s.clone()),
                                _ => None,
                            })
                            .unwrap_or_default();
                        for ss in rs.scope_spans {
                            for span in ss.spans {
                                spans.push(Received {
                                    service: service.clone(),
                                    span,
                                });
                            }
                        }
                    }
                    (axum::http::StatusCode::OK, Vec::new())
                }
            }),
        )
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().expect("spans").clone()
    }

    /// Waits until `want` holds of the spans received so far.
    async fn wait_for(&self, what: &str, want: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        eventually(Duration::from_secs(60), what, async || {
            let spans = self.spans();
            if want(&spans) {
                Ok(spans)
            } else {
                Err(format!(
                    "received: {:#?}",
                    spans
                        .iter()
                        .map(|r| (&r.service, &r.span.name))
                        .collect::<Vec<_>>()
                ))
            }
        })
        .await
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

fn named<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|r| r.span.name == name).collect()
}

/// The one span called `name`.
fn one<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let found = named(spans, name);
    assert_eq!(
        found.len(),
        1,
        "exactly one `{name}` span: {:#?}",
        spans.iter().map(|r| &r.span.name).collect::<Vec<_>>()
    );
    found[0]
}

fn assert_child(child: &Received, parent: &Received) {
    assert_eq!(
        hex::encode(&child.span.parent_span_id),
        hex::encode(&parent.span.span_id),
        "`{}` is a child of `{}`",
        child.span.name,
        parent.span.name
    );
}

/// A producer passes a `traceparent`; `outboxd enqueue`, a relay process
/// (with the `cloudevents` transformer) and a consumer process (the
/// `billing` plugin) each send their spans to the receiver. Every span of
/// the event is in the producer's trace and the parent links form the
/// chain enqueue → claim → plugin call, publish → fetch → inbox mark,
/// handle → plugin statement, commit. The relay's spans arrive while it
/// runs (the periodic export); the consumer's, sent only at shutdown, arrive
/// after SIGTERM. An event without a trace context makes no spans.
async fn one_events_spans_form_one_trace_across_a_relay_and_a_consumer_process(t: TestDb) {
    traced_across_processes(t, None).await;
}
on_both!(one_events_spans_form_one_trace_across_a_relay_and_a_consumer_process);

/// The same trace through Kafka (tansu): the context crosses the broker in
/// the message's headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_events_trace_crosses_kafka_in_the_message_headers() {
    let bootstrap = bootstrap();
    let topic = unique("traced-orders");
    create_topic(&bootstrap, &topic, 1).await;
    traced_across_processes(TestDb::sqlite().await, Some((bootstrap, topic))).await;
}

/// One traced and one untraced event, enqueued by `outboxd enqueue`,
/// relayed by one process and consumed by another, on the embedded
/// transport or on Kafka (`kafka`: the bootstrap servers and a topic).
async fn traced_across_processes(t: TestDb, kafka: Option<(String, String)>) {
    let receiver = Receiver::start().await;
    let topic = kafka
        .as_ref()
        .map_or("order.confirmed".to_string(), |(_, topic)| topic.clone());
    let transport: Vec<(&str, String)> = match &kafka {
        Some((bootstrap, _)) => vec![
            ("OUTBOXD__TRANSPORT__KIND", "kafka".into()),
            (
                "OUTBOXD__TRANSPORT__KAFKA__bootstrap.servers",
                bootstrap.clone(),
            ),
        ],
        None => Vec::new(),
    };
    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing");
    let dir = tempfile::tempdir().expect("tempdir");
    let relay_config = dir.path().join("relay.toml");
    std::fs::write(
        &relay_config,
        format!(
            r#"
[[plugins]]
name = "cloudevents"
path = "{}"
limits = {{ timeout_ms = 5000 }}

[[routes]]
event_type = "order.*"
topic = "{}"
transformers = ["cloudevents"]

[telemetry]
otlp_endpoint = "{}"
service_name = "relay"
"#,
            plugin_path("cloudevents").display(),
            topic,
            receiver.endpoint
        ),
    )
    .expect("relay config");

    // The consumer first, so the relay's message is fetched by it; it reads
    // the endpoint from the standard variables and exports only at exit.
    let (plugins, consumers) = billing_plugin_consumer(&t, "").await;
    // On Kafka the consumer group is named after the consumer: one of its
    // own, beside the other tests on the broker.
    let consumers = match &kafka {
        Some(_) => consumers
            .replace("\"order.confirmed\"", &format!("\"{topic}\""))
            .replace("name = \"billing\"", &format!("name = \"{topic}-billing\"")),
        None => consumers,
    };
    let mut consumer = outboxd(&t)
        .arg("run")
        .envs(transport.iter().map(|(k, v)| (k, v)))
        .env("OUTBOXD__RELAY__WORKERS", "0")
        .env("OUTBOXD__PLUGINS", &plugins)
        .env("OUTBOXD__CONSUMERS", &consumers)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env("OTEL_SERVICE_NAME", "billing-consumer")
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the consumer process");

    let producer = outboxd(&t)
        .args([
            "enqueue",
            "--aggregate",
            "order-7",
            "--type",
            "order.confirmed",
            "--payload",
            r#"{"order_id":"order-7","customer_id":"cust-secret-42","total_cents":4242}"#,
            "--header",
            &format!("traceparent=00-{TRACE_ID}-{PRODUCER_SPAN}-01"),
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env("OTEL_SERVICE_NAME", "shop")
        .output()
        .await
        .expect("outboxd enqueue");
    assert!(
        producer.status.success(),
        "{}",
        String::from_utf8_lossy(&producer.stderr)
    );
    // An event without a trace context: handled, never traced.
    let untraced = outboxd(&t)
        .args([
            "enqueue",
            "--aggregate",
            "order-8",
            "--type",
            "order.confirmed",
            "--payload",
            r#"{"order_id":"order-8","customer_id":"c","total_cents":1}"#,
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .output()
        .await
        .expect("outboxd enqueue");
    assert!(untraced.status.success());

    let mut relay = outboxd(&t)
        .args(["run", "--config"])
        .arg(&relay_config)
        .envs(transport.iter().map(|(k, v)| (k, v)))
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the relay process");
    t.wait_count(Duration::from_secs(90), "SELECT count(*) FROM invoices", 2)
        .await;

    // The relay exports periodically: its spans come while it runs.
    receiver
        .wait_for("the relay's publish span", |s| {
            s.iter().any(|r| r.span.name == "publish")
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !receiver
            .spans()
            .iter()
            .any(|r| r.service == "billing-consumer"),
        "the consumer exports only at shutdown here"
    );
    for child in [&mut relay, &mut consumer] {
        terminate(child).await;
    }
    let spans = receiver
        .wait_for("the consumer's commit span", |s| {
            s.iter().any(|r| r.span.name == "commit")
        })
        .await;

    for r in &spans {
        assert_eq!(
            hex::encode(&r.span.trace_id),
            TRACE_ID,
            "`{}` from {} is in the producer's trace (the untraced event made no span)",
            r.span.name,
            r.service
        );
        for kv in &r.span.attributes {
            let text = format!("{:?}", kv.value);
            assert!(
                !text.contains("cust-secret-42") && !text.contains("4242"),
                "`{}` carries a value of the event: {} = {text}",
                r.span.name,
                kv.key
            );
        }
    }
    let enqueue = one(&spans, "enqueue");
    let fetch = one(&spans, "fetch");
    // A publish the broker did not acknowledge in time is retried by a
    // later claim: every claim is the enqueue's, and the chain that reached
    // the consumer is the one the fetch names.
    let parent_of = |child: &Received, name: &str| -> &Received {
        spans
            .iter()
            .find(|r| r.span.name == name && r.span.span_id == child.span.parent_span_id)
            .unwrap_or_else(|| panic!("`{}` has no `{name}` parent", child.span.name))
    };
    let publish = parent_of(fetch, "publish");
    let claim = parent_of(publish, "claim");
    let transform = *named(&spans, "plugin.transform")
        .iter()
        .find(|r| r.span.parent_span_id == claim.span.span_id)
        .expect("the plugin call of the claim that was fetched");
    for other in named(&spans, "claim") {
        assert_child(other, enqueue);
    }
    let mark = one(&spans, "inbox.mark");
    let handle = one(&spans, "handle");
    let commit = one(&spans, "commit");
    let statements = named(&spans, "plugin.statement");
    assert!(!statements.is_empty(), "the billing plugin's statements");

    assert_eq!(hex::encode(&enqueue.span.parent_span_id), PRODUCER_SPAN);
    assert_child(claim, enqueue);
    assert_child(transform, claim);
    assert_child(publish, claim);
    assert_child(fetch, publish);
    assert_child(mark, fetch);
    assert_child(handle, fetch);
    for s in &statements {
        assert_child(s, handle);
    }
    assert_child(commit, fetch);

    assert_eq!(enqueue.service, "shop");
    for r in [claim, transform, publish] {
        assert_eq!(r.service, "relay", "`{}`", r.span.name);
    }
    for r in [fetch, mark, handle, commit] {
        assert_eq!(r.service, "billing-consumer", "`{}`", r.span.name);
    }
    assert_eq!(
        transform.attr("outboxd.plugin.name").as_deref(),
        Some("cloudevents")
    );
    assert!(transform.attr("outboxd.plugin.version").is_some());
    assert_eq!(
        handle.attr("outboxd.plugin.name").as_deref(),
        Some("billing")
    );
    assert_eq!(
        publish.attr("messaging.destination.name"),
        Some(topic.clone())
    );
    assert!(
        statements.iter().any(|s| {
            s.attr("db.operation.name").as_deref() == Some("insert")
                && s.attr("db.collection.name").as_deref() == Some("invoices")
        }),
        "the invoice insert, named by kind and table: {statements:#?}"
    );
    // The publish span lasts until the broker's acknowledgement, and the
    // consumer's work comes after the fetch that brought the message.
    assert!(publish.span.end_time_unix_nano >= publish.span.start_time_unix_nano);
    for r in [mark, handle, commit] {
        assert!(r.span.start_time_unix_nano >= fetch.span.start_time_unix_nano);
    }
    assert!(commit.span.start_time_unix_nano >= handle.span.end_time_unix_nano);
}

/// Writes an event with `headers` and returns nothing but the commit.
async fn put_with_headers(
    db: &Db,
    agg: &str,
    payload: serde_json::Value,
    headers: &[(&str, &str)],
) {
    let mut ev = NewEvent::new(agg, "order.placed", payload);
    for (k, v) in headers {
        ev = ev.with_header(*k, *v);
    }
    enqueue_on(db, ev).await;
}

/// The `traceparent` each published message carried, by aggregate.
async fn relayed_traceparents(t: &TestDb, route: Route) -> BTreeMap<String, Option<String>> {
    let broker = ScriptedPublisher::new();
    let routes = vec![route];
    let relay = chained_relay(
        t,
        broker.clone(),
        &[spec("hostile-misbehave")],
        routes,
        RelayConfig::default(),
    );
    assert!(matches!(
        relay.step().await.expect("step"),
        StepOutcome::Published(r) if r.published == 3
    ));
    broker
        .sent()
        .into_iter()
        .map(|m| {
            let agg = String::from_utf8(m.header("aggregate-id").expect("aggregate").to_vec())
                .expect("utf8");
            let tp = m
                .header("traceparent")
                .map(|v| String::from_utf8(v.to_vec()).expect("utf8"));
            (agg, tp)
        })
        .collect()
}

const EVENT_TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const FORGED_TRACE: &str = "00-11111111111111111111111111111111-2222222222222222-01";

async fn fill_trace_cases(t: &TestDb, prefix: &str) {
    let traced = [("traceparent", EVENT_TRACE)];
    put_with_headers(
        &t.db,
        &format!("{prefix}-drop"),
        json!({"trace": "drop"}),
        &traced,
    )
    .await;
    put_with_headers(
        &t.db,
        &format!("{prefix}-forge"),
        json!({"trace": FORGED_TRACE}),
        &traced,
    )
    .await;
    put_with_headers(
        &t.db,
        &format!("{prefix}-invent"),
        json!({"trace": FORGED_TRACE}),
        &[],
    )
    .await;
}

/// A transformer that drops the trace context, replaces it with another,
/// or invents one for an untraced event is overruled: the message carries
/// the event's own. A route with `plugins_may_set_trace` lets it.
async fn a_transformer_cannot_drop_or_forge_the_trace_unless_its_route_allows(t: TestDb) {
    fill_trace_cases(&t, "kept").await;
    let kept = relayed_traceparents(
        &t,
        Route::new("order.*", "orders").with_transformers(&["hostile-misbehave"]),
    )
    .await;
    assert_eq!(
        kept,
        BTreeMap::from([
            ("kept-drop".to_string(), Some(EVENT_TRACE.to_string())),
            ("kept-forge".to_string(), Some(EVENT_TRACE.to_string())),
            ("kept-invent".to_string(), None),
        ])
    );

    fill_trace_cases(&t, "set").await;
    let set = relayed_traceparents(
        &t,
        Route::new("order.*", "orders")
            .with_transformers(&["hostile-misbehave"])
            .letting_plugins_set_trace(),
    )
    .await;
    assert_eq!(
        set,
        BTreeMap::from([
            ("set-drop".to_string(), None),
            ("set-forge".to_string(), Some(FORGED_TRACE.to_string())),
            ("set-invent".to_string(), Some(FORGED_TRACE.to_string())),
        ])
    );
}
on_both!(a_transformer_cannot_drop_or_forge_the_trace_unless_its_route_allows);

/// What reached the TLS receiver's port: TLS handshakes begun, handshakes
/// that failed, and connections that began with anything but a TLS record
/// (a request in the clear).
#[derive(Debug, Default)]
struct Seen {
    hellos: std::sync::atomic::AtomicUsize,
    failed_handshakes: std::sync::atomic::AtomicUsize,
    in_the_clear: std::sync::atomic::AtomicUsize,
}

impl Seen {
    fn get(counter: &std::sync::atomic::AtomicUsize) -> usize {
        counter.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Accepts TCP connections, counts them in [`Seen`], and hands axum those
/// whose TLS handshake succeeded.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    seen: Arc<Seen>,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            // A TLS connection opens with a handshake record (type 22).
            let mut first = [0u8; 1];
            match tcp.peek(&mut first).await {
                Ok(1) if first[0] == 0x16 => self.seen.hellos.fetch_add(1, SeqCst),
                Ok(0) | Err(_) => continue,
                Ok(_) => {
                    self.seen.in_the_clear.fetch_add(1, SeqCst);
                    continue;
                }
            };
            match self.tls.accept(tcp).await {
                Ok(stream) => return (stream, addr),
                Err(_) => self.seen.failed_handshakes.fetch_add(1, SeqCst),
            };
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// `outboxd enqueue` of one traced event, sending its span to `endpoint`
/// with `ca_file` (when given); its exit status and log.
async fn enqueue_traced(
    t: &TestDb,
    endpoint: &str,
    ca_file: Option<&std::path::Path>,
) -> std::process::Output {
    let mut cmd = outboxd(t);
    cmd.args([
        "enqueue",
        "--aggregate",
        "order-9",
        "--type",
        "order.confirmed",
        "--payload",
        r#"{"order_id":"order-9"}"#,
        "--header",
        &format!("traceparent=00-{TRACE_ID}-{PRODUCER_SPAN}-01"),
    ])
    .env("OUTBOXD__TELEMETRY__OTLP_ENDPOINT", endpoint)
    .env("OTEL_SERVICE_NAME", "shop")
    .env_remove("OTEL_EXPORTER_OTLP_CERTIFICATE")
    .env_remove("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
    .env_remove("OUTBOXD_LOG");
    if let Some(path) = ca_file {
        cmd.env("OUTBOXD__TELEMETRY__CA_FILE", path);
    }
    cmd.output().await.expect("run outboxd enqueue")
}

/// Waits until `counter` reaches `n` (the receiver counts a failed
/// handshake when it reads the client's alert, which may come after the
/// client exits).
async fn wait_for_count(what: &str, counter: &std::sync::atomic::AtomicUsize, n: usize) {
    eventually(
        Duration::from_secs(30),
        format!("{what} reaching {n}"),
        async || {
            let got = Seen::get(counter);
            if got >= n { Ok(()) } else { Err(got) }
        },
    )
    .await
}

/// An https collector whose certificate a private CA signed: with
/// `telemetry.ca_file` naming that CA the span arrives over TLS; without it
/// (an unknown CA), or with the endpoint written as an address the
/// certificate does not name, the export fails, the log says why and what
/// to set, and nothing reaches the port in the clear. A `ca_file` that does
/// not exist stops the command at start, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_to_an_https_collector_only_over_verified_tls() {
    let t = TestDb::sqlite().await;
    // A certificate for localhost only: not for 127.0.0.1.
    let private_ca = TestCa::for_names("DNS:localhost");
    let ca = private_ca.ca_file();
    let (receiver, seen) = Receiver::start_tls(private_ca.acceptor()).await;

    let sent = enqueue_traced(&t, &receiver.endpoint, Some(&ca)).await;
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let spans = receiver
        .wait_for("the enqueue span over TLS", |s| {
            s.iter().any(|r| r.span.name == "enqueue")
        })
        .await;
    assert_eq!(hex::encode(&spans[0].span.trace_id), TRACE_ID);
    assert_eq!(spans[0].service, "shop");
    assert_eq!(Seen::get(&seen.failed_handshakes), 0);

    let unknown_ca = enqueue_traced(&t, &receiver.endpoint, None).await;
    let log = String::from_utf8_lossy(&unknown_ca.stderr);
    assert!(unknown_ca.status.success(), "the event is enqueued: {log}");
    assert!(
        log.contains("OTLP export failed") && log.contains("set telemetry.ca_file"),
        "the failed export is logged with the fix:\n{log}"
    );
    wait_for_count("failed handshakes", &seen.failed_handshakes, 1).await;

    let by_address = receiver.endpoint.replace("localhost", "127.0.0.1");
    let wrong_name = enqueue_traced(&t, &by_address, Some(&ca)).await;
    let log = String::from_utf8_lossy(&wrong_name.stderr);
    assert!(
        log.contains("OTLP export failed") && log.contains("does not name this host"),
        "a certificate for localhost does not pass for 127.0.0.1:\n{log}"
    );
    wait_for_count("failed handshakes", &seen.failed_handshakes, 2).await;

    assert_eq!(
        receiver.spans().len(),
        spans.len(),
        "no span arrived without verified TLS"
    );
    assert_eq!(
        Seen::get(&seen.in_the_clear),
        0,
        "nothing was sent in the clear"
    );
    assert!(
        Seen::get(&seen.hellos) >= 3,
        "each export began with a TLS handshake"
    );

    let missing = private_ca.dir.path().join("missing-ca.pem");
    let refused = enqueue_traced(&t, &receiver.endpoint, Some(&missing)).await;
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a missing ca_file stops the start"
    );
    assert!(
        log.contains("telemetry.ca_file") && log.contains("missing-ca.pem"),
        "{log}"
    );
}
