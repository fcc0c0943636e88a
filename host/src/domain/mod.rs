//! The example domain used by the demo and the tests: an order service
//! (`confirm_order`, the producer) and the billing side's invoices (the
//! consumer).

pub mod billing;
pub mod orders;
