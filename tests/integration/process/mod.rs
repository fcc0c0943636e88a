//! Real `outboxd` processes, started, stopped and SIGKILLed, and the crash
//! points in between: nothing committed is lost, nothing is applied twice.

mod brokers;
mod consumers;
mod crash_matrix;
mod crashes;
mod outbound_crash;
mod plugin_swap;
mod start_retry;
mod webhook;
