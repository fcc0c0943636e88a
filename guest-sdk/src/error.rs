//! The plugin's error: retryable or permanent, and `?`-friendly.

use crate::wit::transformer::outbox::plugin::types::PluginError;

/// Why a plugin refuses an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The relay tries again later, with backoff.
    Retryable(String),
    /// The event goes to the dead state with this reason.
    Permanent(String),
}

pub type Result<T, E = Error> = core::result::Result<T, E>;

impl Error {
    pub fn retryable(message: impl Into<String>) -> Self {
        Error::Retryable(message.into())
    }

    pub fn permanent(message: impl Into<String>) -> Self {
        Error::Permanent(message.into())
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Retryable(m) => write!(f, "retryable: {m}"),
            Error::Permanent(m) => write!(f, "permanent: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// Bad JSON never gets better by retrying.
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Permanent(format!("JSON: {e}"))
    }
}

impl From<core::str::Utf8Error> for Error {
    fn from(e: core::str::Utf8Error) -> Self {
        Error::Permanent(format!("not UTF-8: {e}"))
    }
}

impl From<Error> for PluginError {
    fn from(e: Error) -> Self {
        match e {
            Error::Retryable(m) => PluginError::Retryable(m),
            Error::Permanent(m) => PluginError::Permanent(m),
        }
    }
}
