//! Webhook routes: the relay sends each event as a signed HTTP POST to a
//! real receiver (`support::webhook_receiver`) that verifies signatures
//! with the specification's algorithm and applies each `webhook-id` once.

mod routes;
