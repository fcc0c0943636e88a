//! A plugin version's life: stored in the registry, checked at deploy,
//! rolled out to every host, swapped whole in the tables the data path reads.
//!
//! - [`registry`]: plugin versions stored in the database (deploy, activate,
//!   rollback, retire, shadow), shared by every host on that database;
//!   [`deploy_check`]: what a version must pass before it is stored.
//! - [`chains`]: the chain each route runs (and its shadow), the table a
//!   rollout swaps whole; [`slot`]: the same for one consumer plugin.
//! - [`rollout`]: keeps the chains and the slots on the registry's versions;
//!   [`versions`]: the registry versions a host has loaded, live or pinned
//!   for a redrive (fix-forward).
//! - [`shadow`]: compares a candidate's outputs with the active version's.
//! - [`dev_dir`]: a directory whose files are deployed and activated (dev).

pub mod chains;
pub(crate) mod deploy_check;
pub mod dev_dir;
pub mod registry;
pub mod rollout;
pub mod shadow;
pub mod slot;
pub mod versions;
