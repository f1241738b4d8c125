//! The platform's other services as the scheduler sees them. Today: the plugin catalogue, from a
//! static file standing in for Katalogus.

pub mod catalogue;
