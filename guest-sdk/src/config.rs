//! The plugin's settings, from the `config` table of its `[[plugins]]`
//! entry in the host's config file.

use crate::wit::transformer::outbox::plugin::config as wit;

/// One setting, or `None` when it is not set.
pub fn get(key: &str) -> Option<String> {
    wit::get(key)
}

/// Every setting, as key and value.
pub fn all() -> Vec<(String, String)> {
    wit::get_all()
}

/// A comma-separated list setting (`"a, b,c"` → `["a", "b", "c"]`); empty
/// when unset.
pub fn list(key: &str) -> Vec<String> {
    get(key)
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}
