//! The `outbox:plugin/config` import, which both worlds have: the plugin's
//! `[plugins.config]` table, read-only. Shaped after wasmtime's
//! `wasi-config`: the state, a borrowed view implementing the generated
//! `Host`, and an `add_to_linker` taking the way from a Store's data to
//! the view.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::plugin::bindings::transformer::outbox::plugin::config as wit;
use crate::plugin::error::PluginError;

/// A plugin's settings. Every Store of one plugin version shares them.
#[derive(Debug, Clone, Default)]
pub struct ConfigVars(Arc<BTreeMap<String, String>>);

impl ConfigVars {
    pub fn new(vars: Arc<BTreeMap<String, String>>) -> Self {
        Self(vars)
    }
}

/// What a `config` call sees of the Store: the settings, borrowed.
pub struct ConfigView<'a> {
    vars: &'a ConfigVars,
}

impl<'a> ConfigView<'a> {
    pub fn new(vars: &'a ConfigVars) -> Self {
        Self { vars }
    }
}

impl wit::Host for ConfigView<'_> {
    fn get(&mut self, key: String) -> Option<String> {
        self.vars.0.get(&key).cloned()
    }

    fn get_all(&mut self) -> Vec<(String, String)> {
        self.vars
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Links `outbox:plugin/config`; `view` finds the settings in a Store's data.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> ConfigView<'_>,
) -> Result<(), PluginError> {
    wit::add_to_linker::<T, HasConfig>(linker, view)
        .map_err(|e| PluginError::Invalid(format!("cannot link outbox:plugin/config: {e}")))
}

struct HasConfig;

impl HasData for HasConfig {
    type Data<'a> = ConfigView<'a>;
}
