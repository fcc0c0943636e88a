//! Hostile: allocates `{"alloc_mib": N}` MiB, touching every page, then
//! forwards the event.

use outboxd_guest::{Event, Message, Result, Transformer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    alloc_mib: usize,
}

struct MemoryBomb;

impl Transformer for MemoryBomb {
    fn transform(event: Event) -> Result<Vec<Message>> {
        let input: Input = event.json()?;
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        for _ in 0..input.alloc_mib {
            hoard.push(vec![0xA5; 1 << 20]);
        }
        let total: usize = std::hint::black_box(&hoard).iter().map(Vec::len).sum();
        Ok(vec![
            event
                .forward()
                .with_header("allocated-bytes", total.to_string()),
        ])
    }
}

outboxd_guest::export_transformer!(MemoryBomb);
