//! Hostile: `{"panic": true}` panics (a trap in Wasm); otherwise the event
//! is forwarded. Emits a line on stderr first, to exercise log capture.

use outboxd_guest::{Event, Message, Result, Transformer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    #[serde(default)]
    panic: bool,
}

struct Panic;

impl Transformer for Panic {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let input: Input = event.json()?;
        eprintln!("hostile-panic: event {} panic={}", event.id, input.panic);
        if input.panic {
            panic!("hostile-panic was told to panic on event {}", event.id);
        }
        Ok(vec![event.forward()])
    }
}

outboxd_guest::export_transformer!(Panic);
