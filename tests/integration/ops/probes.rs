//! The probes and the scrape a platform uses: `/healthz` and `/readyz`
//! without a token on the admin listener and on the metrics listener, a
//! status word with no error text when the database is gone (the reason in
//! the log and in `/api/stats`), `/metrics` with the read-only token or on
//! the metrics listener, and every `/api` route refusing all but the admin
//! token. The routes are read from `host/src/admin/`, so a new one is
//! covered without editing this file.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use outboxd::config::Config;
use outboxd::daemon::Daemon;

use crate::support::admin::{TOKEN, admin_config, http};
use crate::support::pipeline::Pipeline;
use crate::support::{TestDb, on_both, pg_admin_url};

const METRICS_TOKEN: &str = "scrape-token-9876543210";

/// The admin API off, the metrics listener on (port 0).
fn metrics_only_config(url: &str) -> Config {
    let mut c = admin_config(url);
    c.admin.enabled = false;
    c.admin.token = None;
    c.metrics.listen = Some("127.0.0.1:0".into());
    c
}

async fn assert_probes_answer(addr: SocketAddr, which: &str) {
    assert_eq!(
        http(addr, "GET", "/healthz", None, None).await,
        (200, "ok\n".to_string()),
        "/healthz on the {which}"
    );
    assert_eq!(
        http(addr, "GET", "/readyz", None, None).await,
        (200, "ready\n".to_string()),
        "/readyz on the {which}"
    );
}

/// With the admin API on, off (the metrics listener alone), and both: the
/// probes answer without a token wherever they are served; the metrics
/// listener serves `/metrics` without a token and nothing of the admin API.
async fn probes_answer_without_a_token_with_the_admin_api_on_and_off(t: TestDb) {
    let admin_only = Pipeline::start(Daemon::default(), &admin_config(&t.url), &t.db).await;
    assert_eq!(admin_only.handles.metrics_addr, None, "no [metrics] listen");
    assert_probes_answer(
        admin_only.handles.admin_addr.expect("admin on"),
        "admin API",
    )
    .await;
    admin_only.stop().await;

    let metrics_only =
        Pipeline::start(Daemon::default(), &metrics_only_config(&t.url), &t.db).await;
    assert_eq!(
        metrics_only.handles.admin_addr, None,
        "the admin API is off"
    );
    let addr = metrics_only.handles.metrics_addr.expect("[metrics] listen");
    assert_probes_answer(addr, "metrics listener").await;
    let (status, metrics) = http(addr, "GET", "/metrics", None, None).await;
    assert_eq!(
        status, 200,
        "/metrics needs no token on the metrics listener"
    );
    assert!(metrics.contains("outboxd_outbox_pending 0"), "{metrics}");
    for path in ["/", "/api/stats", "/api/dead"] {
        assert_eq!(
            http(addr, "GET", path, Some(TOKEN), None).await.0,
            404,
            "the metrics listener serves no {path}"
        );
    }
    metrics_only.stop().await;

    let mut config = admin_config(&t.url);
    config.metrics.listen = Some("127.0.0.1:0".into());
    let both = Pipeline::start(Daemon::default(), &config, &t.db).await;
    let (admin, metrics) = (
        both.handles.admin_addr.expect("admin on"),
        both.handles.metrics_addr.expect("metrics on"),
    );
    assert_ne!(admin, metrics);
    assert_probes_answer(admin, "admin API").await;
    assert_probes_answer(metrics, "metrics listener").await;
    assert_eq!(http(metrics, "GET", "/metrics", None, None).await.0, 200);
    assert_eq!(
        http(admin, "GET", "/metrics", None, None).await.0,
        401,
        "the admin listener's /metrics still needs a token"
    );
    both.stop().await;
}
on_both!(probes_answer_without_a_token_with_the_admin_api_on_and_off);

/// Log lines, captured for the test's own thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// The database goes away under a running daemon (its database dropped,
/// every connection ended): `/readyz` answers 503 `not ready` on both
/// listeners and says nothing more, while the reason, which names the
/// database, is in the log and in `/api/stats`'s `readiness` behind the
/// admin token. A current-thread runtime keeps every task on this thread,
/// where the log is captured.
#[tokio::test]
async fn readyz_shows_no_error_text_when_the_database_is_down() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let t = TestDb::postgres().await;
    let database = t
        .url
        .rsplit('/')
        .next()
        .expect("a database name")
        .to_string();
    let mut config = admin_config(&t.url);
    config.metrics.listen = Some("127.0.0.1:0".into());
    let Pipeline {
        stop_tx,
        set,
        handles,
    } = Pipeline::start(Daemon::default(), &config, &t.db).await;
    let admin = handles.admin_addr.expect("admin");
    let metrics = handles.metrics_addr.expect("metrics");
    assert_probes_answer(admin, "admin API").await;
    let (status, stats) = http(admin, "GET", "/api/stats", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats json");
    assert_eq!(
        stats["readiness"],
        serde_json::json!({"ready": true, "checks": {"database": {"ok": true}}}),
        "{stats}"
    );

    let server = sqlx::PgPool::connect(&pg_admin_url())
        .await
        .expect("connect to the test server");
    sqlx::query(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .execute(&server)
        .await
        .expect("drop the test database under the daemon");
    server.close().await;

    for (addr, which) in [(admin, "admin API"), (metrics, "metrics listener")] {
        assert_eq!(
            http(addr, "GET", "/readyz", None, None).await,
            (503, "not ready\n".to_string()),
            "/readyz on the {which} answers the status word alone"
        );
        assert_eq!(
            http(addr, "GET", "/healthz", None, None).await,
            (200, "ok\n".to_string()),
            "the process is alive"
        );
    }
    let (status, stats) = http(admin, "GET", "/api/stats", Some(TOKEN), None).await;
    assert_eq!(status, 500, "{stats}");
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats json");
    let readiness = &stats["readiness"];
    assert_eq!(readiness["ready"], false, "{stats}");
    assert_eq!(readiness["checks"]["database"]["ok"], false, "{stats}");
    let reason = readiness["checks"]["database"]["reason"]
        .as_str()
        .expect("the database check's reason");
    assert!(!reason.is_empty(), "{stats}");

    let logged = log.text();
    let warning = logged
        .lines()
        .find(|l| l.contains("WARN") && l.contains("not ready") && l.contains("check=\"database\""))
        .unwrap_or_else(|| panic!("no readiness warning in the log:\n{logged}"));
    assert!(warning.contains("reason="), "{warning}");

    stop_tx.send(true).expect("stop");
    let _ = outboxd::daemon::join_all_workers(set).await;
}

/// An `/api` route as `host/src/admin/` declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ApiRoute {
    method: &'static str,
    path: String,
}

/// Every `.route("/api/…", get(…).post(…))` in `host/src/admin/*.rs`, each
/// method apart.
fn api_routes() -> Vec<ApiRoute> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/admin");
    let mut routes = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("host/src/admin")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for file in files {
        let source = std::fs::read_to_string(&file).expect("read a source file");
        let mut rest = source.as_str();
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            let args = rest.trim_start();
            let Some(literal) = args.strip_prefix('"') else {
                continue;
            };
            let path = &literal[..literal.find('"').expect("a closed path literal")];
            // The method router runs to the parenthesis that closes `.route(`.
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("a closed .route(");
            let methods = &rest[..end];
            if !path.starts_with("/api") {
                continue;
            }
            for method in ["get", "post", "put", "patch", "delete"] {
                let called = methods.match_indices(&format!("{method}(")).any(|(i, _)| {
                    let before = i.checked_sub(1).map(|j| methods.as_bytes()[j]);
                    !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                });
                if called {
                    routes.push(ApiRoute {
                        method: match method {
                            "get" => "GET",
                            "post" => "POST",
                            "put" => "PUT",
                            "patch" => "PATCH",
                            _ => "DELETE",
                        },
                        path: path.to_string(),
                    });
                }
            }
        }
    }
    routes
}

/// `/api/dead/{seq}` with each parameter filled in.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| if seg.starts_with('{') { "1" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// `/metrics` takes the read-only token or the admin token, and refuses a
/// wrong one or none; every `/api` route refuses no token, a wrong one and
/// the metrics token, and takes the admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_take_the_read_only_token_and_every_api_route_refuses_it() {
    let routes = api_routes();
    for known in [
        ("GET", "/api/stats"),
        ("POST", "/api/dead/{seq}/redrive"),
        ("POST", "/api/plugins/{name}/activate/{version}"),
        ("GET", "/api/consumers"),
        ("POST", "/api/consumers/{name}/dead/{id}/discard"),
    ] {
        assert!(
            routes.contains(&ApiRoute {
                method: known.0,
                path: known.1.into()
            }),
            "the route reader missed {known:?}: {routes:#?}"
        );
    }

    let t = TestDb::sqlite().await;
    let mut config = admin_config(&t.url);
    config.admin.metrics_token = Some(METRICS_TOKEN.into());
    let running = Pipeline::start(Daemon::default(), &config, &t.db).await;
    let addr = running.handles.admin_addr.expect("admin on");

    for (token, want) in [
        (Some(METRICS_TOKEN), 200),
        (Some(TOKEN), 200),
        (Some("wrong-token-wrong-token"), 401),
        (None, 401),
    ] {
        let (status, body) = http(addr, "GET", "/metrics", token, None).await;
        assert_eq!(status, want, "/metrics with {token:?}: {body}");
        if want == 200 {
            assert!(body.contains("outboxd_outbox_pending"), "{body}");
        }
    }
    assert_probes_answer(addr, "admin API").await;

    for route in &routes {
        let path = concrete(&route.path);
        let body = (route.method != "GET").then_some("{}");
        for (token, want) in [
            (None, 401),
            (Some("wrong-token-wrong-token"), 401),
            (Some(METRICS_TOKEN), 403),
        ] {
            assert_eq!(
                http(addr, route.method, &path, token, body).await.0,
                want,
                "{} {path} with {token:?}",
                route.method
            );
        }
        let status = http(addr, route.method, &path, Some(TOKEN), body).await.0;
        assert!(
            status != 401 && status != 403 && status != 404 && status != 405
                || status == 404 && route.path.contains('{'),
            "{} {path} with the admin token: {status}",
            route.method
        );
    }
    running.stop().await;
}

fn refusal(toml: &str, env: &[(&str, &str)]) -> (String, String) {
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    match Config::from_toml("t.toml", toml, env) {
        Err(outboxd::config::ConfigError::Key { key, message }) => (key, message),
        Err(other) => panic!("not a key error: {other}"),
        Ok(_) => panic!("accepted:\n{toml}"),
    }
}

/// The listeners' settings are checked at start: each refusal names the
/// key and the fix, and none quotes a token.
#[test]
fn listener_and_token_settings_are_refused_with_the_key_and_the_fix() {
    let admin = format!("[admin]\nenabled = true\ntoken = \"{TOKEN}\"\n");
    let env_token = [(
        "OUTBOXD__ADMIN__METRICS_TOKEN".to_string(),
        METRICS_TOKEN.to_string(),
    )];
    let config = Config::from_toml("t.toml", &admin, env_token)
        .expect("a metrics token from the environment");
    assert_eq!(config.admin.metrics_token.as_deref(), Some(METRICS_TOKEN));

    let (key, message) = refusal(&admin, &[("OUTBOXD__ADMIN__METRICS_TOKEN", TOKEN)]);
    assert_eq!(key, "admin.metrics_token");
    assert!(
        message.contains("same as admin.token") && message.contains("of its own"),
        "{message}"
    );
    assert!(!message.contains(TOKEN), "{message}");

    let (key, message) = refusal(&admin, &[("OUTBOXD__ADMIN__METRICS_TOKEN", "")]);
    assert_eq!(key, "admin.metrics_token");
    assert!(
        message.contains("empty") && message.contains("OUTBOXD__ADMIN__METRICS_TOKEN"),
        "{message}"
    );

    let (key, message) = refusal(&admin, &[("OUTBOXD__ADMIN__METRICS_TOKEN", "short")]);
    assert_eq!(key, "admin.metrics_token");
    assert!(message.contains("16 characters"), "{message}");

    let (key, message) = refusal(
        &format!("[admin]\nmetrics_token = \"{METRICS_TOKEN}\"\n"),
        &[],
    );
    assert_eq!(key, "admin.metrics_token");
    assert!(
        message.contains("admin.enabled = true") && message.contains("[metrics] listen"),
        "{message}"
    );

    for (admin_listen, metrics_listen) in [
        ("127.0.0.1:9464", "127.0.0.1:9464"),
        ("0.0.0.0:9470", "127.0.0.1:9470"),
    ] {
        let (key, message) = refusal(
            &format!(
                "{admin}listen = \"{admin_listen}\"\n[metrics]\nlisten = \"{metrics_listen}\"\n"
            ),
            &[],
        );
        assert_eq!(key, "metrics.listen");
        assert!(
            message.contains("admin.listen") && message.contains("127.0.0.1:9465"),
            "{message}"
        );
    }
    Config::from_toml(
        "t.toml",
        &format!("{admin}listen = \"127.0.0.1:0\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n"),
        std::iter::empty(),
    )
    .expect("port 0 twice is two ports");
    Config::from_toml(
        "t.toml",
        "[metrics]\nlisten = \"127.0.0.1:9464\"\n",
        std::iter::empty(),
    )
    .expect("the admin API's default address is free while the admin API is off");

    let (key, message) = refusal("[metrics]\nlisten = \"localhost\"\n", &[]);
    assert_eq!(key, "metrics.listen");
    assert!(message.contains("127.0.0.1:9465"), "{message}");
}
