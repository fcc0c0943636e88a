//! Configuration and the database's setup: config errors that name the key
//! and the fix, bad input and unusable services, Postgres over TLS, a full
//! disk, and outboxd's own schema.

mod bad_input;
mod full_postgres_disk;
mod host_schema;
mod loading;
mod postgres_tls;
