//! Hostile: `{"bytes": N, "count": M}` returns M messages of N bytes each.

use outboxd_guest::{Event, Message, Result, Transformer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    bytes: usize,
    #[serde(default = "one")]
    count: usize,
}

fn one() -> usize {
    1
}

struct HugeOutput;

impl Transformer for HugeOutput {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let input: Input = event.json()?;
        Ok((0..input.count)
            .map(|_| event.forward().with_payload(vec![b'x'; input.bytes]))
            .collect())
    }
}

outboxd_guest::export_transformer!(HugeOutput);
