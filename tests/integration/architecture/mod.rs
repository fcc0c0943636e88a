//! The architecture's invariants, checked on the source and the manifests:
//! crate boundaries, and only `store/` knowing the database it runs on.

mod backend_boundary;
mod clients;
mod crate_layout;
mod docs;
