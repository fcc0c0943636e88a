//! [`PluginError`]: every way a plugin call can fail, typed by what the
//! caller does about it, and [`classify`], which types a wasmtime error.

use crate::config::Limits;

/// A failed plugin call. Anything but `Guest` discards the Store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The guest trapped (a panic, `unreachable`, an out-of-bounds access).
    #[error("trapped: {0}")]
    Trap(String),
    /// The call ran past its epoch deadline.
    #[error("timed out after {0} ms (limits.timeout)")]
    Timeout(u64),
    /// The guest asked for more memory than its cap.
    #[error("out of memory: the cap is {cap_bytes} bytes (limits.memory_mib)")]
    OutOfMemory { cap_bytes: u64 },
    /// The outputs of one call add up to more bytes than allowed.
    #[error("output of {bytes} bytes exceeds the cap of {cap} (limits.max_output_bytes)")]
    OutputTooLarge { bytes: usize, cap: usize },
    /// The call returned more messages than allowed.
    #[error("{count} messages exceed the fan-out cap of {cap} (limits.max_outputs)")]
    TooManyOutputs { count: usize, cap: usize },
    /// An output names a topic its route does not allow (see the chain's
    /// `TopicPolicy`).
    #[error(
        "output topic `{topic}` is not allowed: {route_key} publishes to `{route_topic}`; \
         add `{topic}` to {route_key}.allowed_topics if this plugin may send there"
    )]
    TopicNotAllowed {
        topic: String,
        route_key: String,
        route_topic: String,
    },
    /// The guest refused the event.
    #[error("{}: {message}", if *.retryable { "retryable" } else { "permanent" })]
    Guest { retryable: bool, message: String },
    /// A consumer's transaction call failed (a refused statement, a spent
    /// budget, a database error); the message's effects are rolled back.
    #[error("transaction: {0}")]
    Transaction(String),
    /// The file is not a usable transformer component.
    #[error("invalid plugin: {0}")]
    Invalid(String),
    /// Instantiation failed (a missing import, a start function that trapped).
    #[error("cannot instantiate: {0}")]
    Instantiate(String),
}

impl PluginError {
    /// A guest's `permanent` error or a forbidden topic: retrying cannot
    /// help. Traps and limits are retried (a host under pressure can time a
    /// plugin out), and the relay's `max_attempts` bounds them.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            PluginError::Guest {
                retryable: false,
                ..
            } | PluginError::TopicNotAllowed { .. }
        )
    }

    /// A short name for metrics and logs.
    pub fn kind(&self) -> ErrorKind {
        match self {
            PluginError::Trap(_) => ErrorKind::Trap,
            PluginError::Timeout(_) => ErrorKind::Timeout,
            PluginError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            PluginError::OutputTooLarge { .. } => ErrorKind::OutputTooLarge,
            PluginError::TooManyOutputs { .. } => ErrorKind::TooManyOutputs,
            PluginError::TopicNotAllowed { .. } => ErrorKind::TopicNotAllowed,
            PluginError::Guest {
                retryable: true, ..
            } => ErrorKind::GuestRetryable,
            PluginError::Guest {
                retryable: false, ..
            } => ErrorKind::GuestPermanent,
            PluginError::Transaction(_) => ErrorKind::Transaction,
            PluginError::Invalid(_) | PluginError::Instantiate(_) => ErrorKind::Instantiate,
        }
    }
}

/// [`PluginError`] without its data, for counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Trap,
    Timeout,
    OutOfMemory,
    OutputTooLarge,
    TooManyOutputs,
    TopicNotAllowed,
    GuestRetryable,
    GuestPermanent,
    Instantiate,
    Transaction,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::Trap,
        ErrorKind::Timeout,
        ErrorKind::OutOfMemory,
        ErrorKind::OutputTooLarge,
        ErrorKind::TooManyOutputs,
        ErrorKind::TopicNotAllowed,
        ErrorKind::GuestRetryable,
        ErrorKind::GuestPermanent,
        ErrorKind::Instantiate,
        ErrorKind::Transaction,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Trap => "trap",
            ErrorKind::Timeout => "timeout",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::OutputTooLarge => "output_too_large",
            ErrorKind::TooManyOutputs => "too_many_outputs",
            ErrorKind::TopicNotAllowed => "topic_not_allowed",
            ErrorKind::GuestRetryable => "guest_retryable",
            ErrorKind::GuestPermanent => "guest_permanent",
            ErrorKind::Instantiate => "instantiate",
            ErrorKind::Transaction => "transaction",
        }
    }
}

/// Turns a wasmtime error from a call or an instantiation into a
/// [`PluginError`]; `memory_hit` says whether the Store's memory cap
/// refused a growth, which is what the trap that follows is about.
pub(crate) fn classify(e: wasmtime::Error, memory_hit: bool, limits: &Limits) -> PluginError {
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return PluginError::Timeout(limits.timeout.as_millis() as u64);
    }
    if memory_hit {
        return PluginError::OutOfMemory {
            cap_bytes: limits.memory_bytes(),
        };
    }
    // The cause alone: the wasm backtrace around it can fill a dead
    // reason's 500 characters by itself (a stack overflow has thousands of
    // frames) and cut the cause off.
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => PluginError::Trap(trap.to_string()),
        None => PluginError::Trap(format!("{e:#}")),
    }
}
