//! Every integration test, in one binary (see host/Cargo.toml).

mod kafka;
