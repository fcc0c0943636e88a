//! A small HTTP server on 127.0.0.1 for the outbound-HTTP tests: records
//! every request that reaches it, and whether its audit intent was already
//! committed when it arrived (read from the provider's side, through the
//! test's own database handle).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use outboxd::store::Db;

/// What reached the server.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Every `Idempotency-Key` header value, in order.
    pub keys: Vec<String>,
    /// Every `x-attacker` header value (the plugin's other headers pass).
    pub attacker: Vec<String>,
    pub body_len: usize,
    /// `outbound_calls` rows with this key and no outcome yet, counted when
    /// the request arrived.
    pub open_intents: i64,
}

#[derive(Clone)]
struct Shared {
    db: Db,
    seen: Arc<Mutex<Vec<Seen>>>,
}

pub struct Server {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// `/big` answers 64 KiB, `/slow` after 3 s; anything else `200 ok`.
pub const BIG_BODY: usize = 64 * 1024;

impl Server {
    pub async fn start(db: Db) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            db,
            seen: seen.clone(),
        };
        let app = axum::Router::new().fallback(answer).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, seen }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port())
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

async fn answer(State(s): State<Shared>, req: Request) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let values = |name: &str| -> Vec<String> {
        parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    };
    let keys = values("idempotency-key");
    let attacker = values("x-attacker");
    let method = parts.method.to_string();
    let path = parts.uri.path().to_string();
    let body = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default();
    let open_intents = match keys.first() {
        Some(k) => open_intents(&s.db, k).await,
        None => 0,
    };
    s.seen.lock().expect("lock").push(Seen {
        method,
        path: path.clone(),
        keys,
        attacker,
        body_len: body.len(),
        open_intents,
    });
    if path == "/slow" {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    }
    let body = if path == "/big" {
        vec![b'x'; BIG_BODY]
    } else {
        b"ok".to_vec()
    };
    axum::response::Response::new(axum::body::Body::from(body))
}

async fn open_intents(db: &Db, key: &str) -> i64 {
    let sql = "SELECT count(*) FROM outbound_calls WHERE idempotency_key = $1 AND status IS NULL";
    match db {
        Db::Postgres(p) => sqlx::query_scalar(sql).bind(key).fetch_one(p).await,
        Db::Sqlite(p) => sqlx::query_scalar(sql).bind(key).fetch_one(p).await,
    }
    .expect("count intents")
}
