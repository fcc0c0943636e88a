//! The WAL relay (`relay.source = "wal"`): every test here holds a logical
//! replication slot of its own, so nextest runs at most three at once (the
//! `wal` group of .config/nextest.toml, which matches `wal::`).

mod processes;
mod relay;
mod setup;
mod status;
