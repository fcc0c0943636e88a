//! The example domain used by the demo and the tests: seed 000's order
//! service (`confirm_order`) and the billing side's invoices.

pub mod billing;
pub mod orders;
