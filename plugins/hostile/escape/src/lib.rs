//! Hostile: tries to read a file, connect a socket and read the environment
//! as `{"file": PATH, "connect": "HOST:PORT", "env": NAME}` asks, and reports
//! what happened as the JSON payload of its one message. With none of them
//! set it forwards the event: the obeyed case.

use std::io::Read;

use outboxd_guest::{Event, Message, Result, Transformer};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    file: Option<String>,
    connect: Option<String>,
    env: Option<String>,
}

#[derive(Serialize, Default)]
struct Report {
    file: Option<String>,
    connect: Option<String>,
    env: Option<String>,
}

fn outcome<T>(r: std::io::Result<T>, ok: impl FnOnce(T) -> String) -> String {
    match r {
        Ok(v) => format!("allowed: {}", ok(v)),
        Err(e) => format!("denied: {e}"),
    }
}

struct Escape;

impl Transformer for Escape {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let input: Input = event.json()?;
        if input.file.is_none() && input.connect.is_none() && input.env.is_none() {
            return Ok(vec![event.forward()]);
        }
        let mut report = Report::default();
        if let Some(path) = &input.file {
            report.file = Some(outcome(
                std::fs::File::open(path).and_then(|mut f| {
                    let mut s = String::new();
                    f.read_to_string(&mut s).map(|_| s)
                }),
                |s| s.chars().take(64).collect(),
            ));
        }
        if let Some(addr) = &input.connect {
            report.connect = Some(outcome(std::net::TcpStream::connect(addr.as_str()), |_| {
                "connected".into()
            }));
        }
        if let Some(name) = &input.env {
            report.env = Some(match std::env::var(name) {
                Ok(v) => format!("allowed: {v}"),
                Err(e) => format!("denied: {e}"),
            });
        }
        Ok(vec![event.forward().with_json(&report)?])
    }
}

outboxd_guest::export_transformer!(Escape);
