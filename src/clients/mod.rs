//! The platform's other services as the scheduler sees them: typed HTTP clients that speak the
//! same calls and JSON as mula's, and the plugin catalogue the planner asks.
//!
//! | file | owns |
//! |---|---|
//! | [`http`] | what every client shares: the `reqwest` client (timeout, `User-Agent`), URLs with percent-encoded segments and repeated query keys, retries of transport failures only, and the one [`ClientError`] |
//! | [`katalogus`] | organisations, an organisation's plugins (mapped onto [`crate::domain::plugin::Plugin`]), the organisations sharing a boefje's settings, health |
//! | [`octopoes`] | an organisation's objects a page at a time (a bad object is set aside, not fatal), health per organisation |
//! | [`bytes`] | the last run of a boefje on an object; logs in lazily and again after a 401 |
//! | [`catalogue`] | the [`catalogue::Catalogue`] the planner asks: Katalogus cached per organisation with a TTL and a background refresh, or a static file standing in for it |
//!
//! The clients only call and parse: what to do with a service that is down or a 404 is the
//! caller's decision (a 404 is its own variant, [`ClientError::NotFound`]). Only plain `http://`
//! is built in; settings are in [`crate::config::ClientSettings`].

pub mod bytes;
pub mod catalogue;
pub mod http;
pub mod katalogus;
pub mod octopoes;

pub use http::ClientError;
