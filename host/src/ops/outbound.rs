//! What messages did outside the database: the `outbound_calls` audit of
//! consumer plugins' HTTP requests, grouped by idempotency key, and the
//! keys reconciliation must check with the provider (`outboxd outbound
//! list --unresolved`).
//!
//! The host commits each request's intent before sending it and writes the
//! outcome with the message's inbox transaction. So a key is *unresolved*
//! when
//! - one of its calls has no outcome: the request left, and no committed
//!   transaction recorded what came back (a crash between the provider's
//!   answer and the inbox commit), or
//! - the same request (method and URL) was sent more than once: the message
//!   was delivered again, and only the provider's deduplication by the key
//!   kept the effect single.
//!
//! Either way the provider, asked by the key, says what really happened.

use crate::store::inbox::outbound::OutboundCall;
use crate::store::{Db, inbox::outbound};
use serde::Serialize;

/// The calls made under one idempotency key, oldest first.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyCalls {
    pub idempotency_key: String,
    pub unresolved: bool,
    /// Why the key is unresolved, for a person; empty when it is not.
    pub reasons: Vec<String>,
    pub calls: Vec<OutboundCall>,
}

/// Which keys to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub key: Option<String>,
    pub message_id: Option<String>,
    pub unresolved: bool,
    /// At most this many keys (the oldest first).
    pub limit: i64,
}

/// The keys `filter` selects, each with all of its calls, judged.
pub async fn list(db: &Db, filter: &Filter) -> Result<Vec<KeyCalls>, sqlx::Error> {
    let rows = outbound::calls_by_key(
        db,
        filter.key.as_deref(),
        filter.message_id.as_deref(),
        filter.unresolved,
        filter.limit,
    )
    .await?;
    Ok(group(rows))
}

/// Consecutive rows of one key → one [`KeyCalls`], judged.
fn group(rows: Vec<(String, OutboundCall)>) -> Vec<KeyCalls> {
    let mut out: Vec<KeyCalls> = Vec::new();
    for (key, call) in rows {
        match out.last_mut() {
            Some(last) if last.idempotency_key == key => last.calls.push(call),
            _ => out.push(KeyCalls {
                idempotency_key: key,
                unresolved: false,
                reasons: Vec::new(),
                calls: vec![call],
            }),
        }
    }
    for k in &mut out {
        k.reasons = reasons(&k.calls);
        k.unresolved = !k.reasons.is_empty();
    }
    // The oldest key first, as the query's LIMIT chose them.
    out.sort_by_key(|k| k.calls.first().map(|c| c.started_at));
    out
}

/// The same rules as the query's HAVING, in words.
fn reasons(calls: &[OutboundCall]) -> Vec<String> {
    let mut reasons = Vec::new();
    let open = calls.iter().filter(|c| c.without_outcome()).count();
    if open > 0 {
        reasons.push(format!(
            "{open} call(s) without an outcome: sent, and no committed transaction recorded the answer"
        ));
    }
    let mut targets: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c.method.as_str(), c.url.as_str()))
        .collect();
    targets.sort_unstable();
    for chunk in targets.chunk_by(|a, b| a == b) {
        if chunk.len() > 1 {
            let (method, url) = chunk[0];
            reasons.push(format!(
                "{method} {url} sent {} times: the message was delivered again",
                chunk.len()
            ));
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_micros(at: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::UNIX_EPOCH + chrono::Duration::microseconds(at)
    }

    fn call(method: &str, url: &str, status: Option<i64>, at: i64) -> OutboundCall {
        OutboundCall {
            id: format!("c{at}"),
            message_id: "m".into(),
            consumer: "charge".into(),
            plugin: "charge@1".into(),
            method: method.into(),
            url: url.into(),
            started_at: from_micros(at),
            status,
            error: None,
            duration_ms: status.map(|_| 3),
            completed_at: status.map(|_| from_micros(at + 3000)),
        }
    }

    #[test]
    fn a_key_is_unresolved_with_a_call_without_outcome_or_a_repeated_request() {
        let one = "http://p:80/charges";
        let keys = group(vec![
            ("k-ok".into(), call("POST", one, Some(201), 1)),
            ("k-two-targets".into(), call("GET", one, Some(200), 2)),
            ("k-two-targets".into(), call("POST", one, Some(201), 3)),
            ("k-crash".into(), call("POST", one, None, 4)),
            ("k-crash".into(), call("POST", one, Some(201), 5)),
        ]);
        let verdicts: Vec<(&str, bool, usize)> = keys
            .iter()
            .map(|k| (k.idempotency_key.as_str(), k.unresolved, k.reasons.len()))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("k-ok", false, 0),
                ("k-two-targets", false, 0),
                ("k-crash", true, 2)
            ]
        );
        assert!(keys[2].reasons[1].contains("POST http://p:80/charges sent 2 times"));
    }
}
