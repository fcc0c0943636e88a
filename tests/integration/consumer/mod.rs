//! Consumers and the inbox: plugins in the inbox transaction, dead letters,
//! per-key parking, partitions, and consumer plugins swapped through the
//! registry.

mod broker_bad_input;
mod dead_letters;
mod dead_ops;
mod parking;
mod partitions;
mod plugin_http_langs;
mod plugin_langs;
mod plugin_policy;
mod plugins;
mod redrive_kills;
mod swap_checks;
mod swap_in_flight;
mod swap_load;
