//! The admin API as a client sees it: a minimal HTTP/1.1 client, the token,
//! and a config that enables the API on a free port.

use outboxd::config::Config;
use outboxd::store::Db;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::db::put;

pub const TOKEN: &str = "test-token-0123456789";

/// A minimal HTTP/1.1 client: enough for these tests without another crate.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the admin API");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let body = body.unwrap_or("");
    let ctype = if body.is_empty() {
        String::new()
    } else {
        "Content-Type: application/json\r\n".to_string()
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}{ctype}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    // Chunked bodies carry size lines; tests only look for substrings or parse
    // JSON, so strip a leading size line if present.
    let body = match body.split_once("\r\n") {
        Some((size, rest))
            if usize::from_str_radix(size.trim(), 16).is_ok() && !size.is_empty() =>
        {
            rest.rsplit_once("\r\n0\r\n")
                .map(|(b, _)| b.to_string())
                .unwrap_or(rest.to_string())
        }
        _ => body,
    };
    (status, body)
}

pub fn admin_config(url: &str) -> Config {
    let mut c = Config::from_toml("(test)", "", std::iter::empty()).expect("defaults");
    c.database.url = url.to_string();
    c.admin.enabled = true;
    c.admin.listen = "127.0.0.1:0".into();
    c.admin.token = Some(TOKEN.into());
    c.admin.sample_seconds = 1;
    c.relay.poll_interval = std::time::Duration::from_millis(20);
    c
}

/// Commits one `order.confirmed` event of `agg`.
pub async fn put_confirmed(db: &Db, agg: &str) {
    put(db, agg, "order.confirmed", json!({"n": 1})).await;
}
