//! Hostile consumer: the misbehaviours of `hostile/misbehave` inside the
//! inbox, after writing an invoice (so a failed message visibly leaves
//! nothing behind). One payload field each:
//!
//! - `{"fork": D}`: fork-bomb-style recursion, 2^D calls.
//! - `{"recurse": N}`: recursion `N` frames of 1 KiB deep.
//! - `{"alloc_mib": N}`: allocates and touches `N` MiB.
//! - `{"host_calls": N}`: calls the `config.get` import `N` times.
//! - `{"bad_utf8_sql": true}`: passes SQL text that is not UTF-8 to the
//!   host's `execute`.
//!
//! Without any of them it only writes the invoice.

use outboxd_guest_consumer::{Consumer, Delivery, Result, Transaction, config};
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    fork: Option<u32>,
    recurse: Option<u64>,
    alloc_mib: Option<usize>,
    host_calls: Option<u64>,
    bad_utf8_sql: bool,
}

fn fork(depth: u32) -> u64 {
    if depth == 0 {
        return std::hint::black_box(1);
    }
    std::hint::black_box(fork(depth - 1)) + std::hint::black_box(fork(depth - 1))
}

fn recurse(n: u64) -> u64 {
    let frame = std::hint::black_box([n as u8; 1024]);
    if n == 0 {
        return u64::from(frame[0]);
    }
    recurse(n - 1) + u64::from(std::hint::black_box(frame)[1023])
}

/// SQL whose bytes are not UTF-8, which the WIT `string` parameter forbids
/// and safe Rust cannot make; the host's lift of the argument must refuse it.
fn not_utf8_sql() -> String {
    let bytes = b"SELECT '\xFF\xFE'".to_vec();
    // SAFETY: deliberately unsound; only handed to the host, never read here.
    #[allow(
        unsafe_code,
        reason = "a hostile plugin: the invalid string is the test"
    )]
    unsafe {
        String::from_utf8_unchecked(bytes)
    }
}

struct Misbehave;

impl Consumer for Misbehave {
    fn handle(tx: &Transaction<'_>, message: Delivery) -> Result<()> {
        let input: Input = serde_json::from_slice(&message.payload).unwrap_or_default();
        tx.execute(
            "INSERT INTO invoices (order_id, customer_id, amount_cents, message_id, issued_at)
             VALUES ('misbehave', 'misbehave', 1, $1, 0)",
            &[message.id.as_str().into()],
        )?;
        if let Some(depth) = input.fork {
            std::hint::black_box(fork(depth));
        }
        if let Some(n) = input.recurse {
            std::hint::black_box(recurse(n));
        }
        if let Some(mib) = input.alloc_mib {
            let hoard: Vec<Vec<u8>> = (0..mib).map(|_| vec![0xA5; 1 << 20]).collect();
            std::hint::black_box(&hoard);
        }
        if let Some(n) = input.host_calls {
            for _ in 0..n {
                std::hint::black_box(config::get("anything"));
            }
        }
        if input.bad_utf8_sql {
            tx.execute(&not_utf8_sql(), &[])?;
        }
        Ok(())
    }
}

outboxd_guest_consumer::export_consumer!(Misbehave);
