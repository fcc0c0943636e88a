//! What an operator uses: the admin API, probes and metrics, maintenance
//! (retention, dead letters, reconciliation), traces, and secrets kept out
//! of what is shown.

mod admin;
mod admin_consumers;
mod admin_metrics;
mod maintenance;
mod probes;
mod secrets;
mod traces;
