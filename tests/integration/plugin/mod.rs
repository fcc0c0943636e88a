//! The Wasm plugin host: transformers and consumers, their sandbox limits
//! and hostile plugins, outbound HTTP, the registry (hot swap, fix-forward,
//! the watched directory) and `outboxd plugin test`.

mod chains;
mod charge;
mod dev_dir;
mod fix_forward;
mod fix_forward_consumer;
mod guest_http;
mod hostile;
mod hostile_consumers;
mod hostile_sql_corpus;
mod hot_swap;
mod hot_swap_refusals;
mod hot_swap_spread;
mod limits;
mod outbound_http;
mod outbound_refusals;
mod sql_walls;
mod test_cmd;
mod test_expect;
mod test_http;
mod transformers;
mod version_metrics;
mod worlds;
