//! The human form of a `plugin test` report (the JSON form is the
//! report's own serialization).

use crate::plugin::harness::report::{ConsumerReport, Outcome, TransformerReport};

fn pretty(v: &serde_json::Value, indent: &str) -> String {
    serde_json::to_string_pretty(v)
        .unwrap_or_default()
        .replace('\n', &format!("\n{indent}"))
}

fn print_outcome(o: &Outcome) {
    match &o.message {
        Some(m) => println!("outcome: {} ({}): {m}", o.result, o.then),
        None => println!("outcome: {} ({})", o.result, o.then),
    }
}

pub(super) fn print_transformer(r: &TransformerReport) {
    for (i, m) in r.messages.iter().enumerate() {
        println!("message {i}:");
        println!(
            "  topic:   {}",
            m.topic.as_deref().unwrap_or("(the route's topic)")
        );
        println!("  key:     {}", m.key);
        for (k, v) in &m.headers {
            println!("  header:  {k}: {v}");
        }
        println!("  payload: {}", pretty(&m.payload, "           "));
    }
    print_outcome(&r.outcome);
}

pub(super) fn print_consumer(r: &ConsumerReport, given_database: bool) {
    let on = if given_database {
        "the --database-url database, in a transaction rolled back at the end"
    } else {
        "a scratch SQLite database, deleted at the end"
    };
    println!("consumer plugin on {on}");
    println!(
        "message {} (topic {}, key {}, attempt {})",
        r.message.id,
        r.message.topic,
        r.message.key.as_deref().unwrap_or("(none)"),
        r.message.attempt
    );
    for (i, s) in r.statements.iter().enumerate() {
        let kind = serde_json::to_value(s.kind).unwrap_or_default();
        println!(
            "statement {}: {} {}",
            i + 1,
            kind.as_str().unwrap_or("?"),
            s.text.trim()
        );
        let Some(v) = &s.values else { continue };
        if !v.params.is_empty() {
            println!("  params:  {}", serde_json::Value::from(v.params.clone()));
        }
        println!("  result:  {}", s.outcome);
        if let Some(rows) = &v.rows {
            println!(
                "  rows:    {}",
                serde_json::to_value(rows).unwrap_or_default()
            );
        }
        if let Some(e) = v.error.as_ref().filter(|e| **e != s.outcome) {
            println!("  error:   {e}");
        }
    }
    for e in &r.events {
        println!(
            "event {} (aggregate {}, type {}):",
            e.id, e.aggregate_id, e.event_type
        );
        for (k, v) in &e.headers {
            println!("  header:  {k}: {v}");
        }
        println!("  payload: {}", pretty(&e.payload, "           "));
    }
    if r.http.is_empty() {
        println!("http: no requests");
    }
    for (i, h) in r.http.iter().enumerate() {
        let via = if h.stubbed { " (stub)" } else { "" };
        println!("http {}: {} {}{via}", i + 1, h.method, h.url);
        for (k, v) in &h.headers {
            println!("  header:  {k}: {v}");
        }
        if let Some(b) = &h.body {
            println!("  body:    {}", pretty(b, "           "));
        }
        match (h.status, &h.error) {
            (Some(status), _) => println!("  answer:  {status} ({})", h.outcome),
            (None, Some(e)) => println!("  answer:  none, {}: {e}", h.outcome),
            (None, None) => println!("  answer:  none (the plugin did not wait for it)"),
        }
        for (k, v) in &h.response_headers {
            println!("  header:  {k}: {v}");
        }
        if let Some(b) = &h.response_body {
            println!("  body:    {}", pretty(b, "           "));
        }
    }
    print_outcome(&r.outcome);
}
