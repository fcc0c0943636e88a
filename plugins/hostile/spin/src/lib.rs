//! Hostile: burns CPU. `{"spin_ms": 5}` spins for 5 ms and then forwards
//! the event; `{"spin_ms": null}` or a missing field spins forever.

use std::time::{Duration, Instant};

use outboxd_guest::{Event, Message, Result, Transformer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    spin_ms: Option<u64>,
}

struct Spin;

impl Transformer for Spin {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let input: Input = event.json()?;
        let start = Instant::now();
        let mut counter = 0u64;
        loop {
            counter = std::hint::black_box(counter.wrapping_add(1));
            if let Some(ms) = input.spin_ms {
                if start.elapsed() >= Duration::from_millis(ms) {
                    break;
                }
            }
        }
        Ok(vec![event.forward()])
    }
}

outboxd_guest::export_transformer!(Spin);
