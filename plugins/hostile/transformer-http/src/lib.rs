//! Hostile: a transformer that imports wasi:http (a world of its own, the
//! transformer world plus the outgoing handler), to check that the relay
//! refuses to load it: transformers never get network.

wit_bindgen::generate!({
    inline: "
        package hostile:transformer-http;
        world transformer-http {
            include outbox:plugin/transformer@0.1.0;
            import wasi:http/outgoing-handler@0.2.12;
        }
    ",
    path: "../../../wit",
    world: "hostile:transformer-http/transformer-http",
    generate_all,
});

use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, OutgoingRequest};

struct Hostile;

impl Guest for Hostile {
    fn transform(event: Event) -> Result<Vec<OutgoingMessage>, PluginError> {
        // Calls out on every event: the import must make it unloadable.
        let _ = outgoing_handler::handle(OutgoingRequest::new(Fields::new()), None);
        Err(PluginError::Permanent(format!("{} reached the network", event.id)))
    }
}

export!(Hostile);
