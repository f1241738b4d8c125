//! PATCH bodies (`/tasks/{id}`, `/schedules/{id}`), read as mula reads them: a JSON object whose
//! fields are taken one at a time in the body's order, so the first bad one is the one a 422
//! names; keys a resource does not change are ignored (a client may send a whole resource back),
//! or named by the resource when nothing was left to change.

use serde_json::{Map, Value};

use super::error::ApiError;
use super::extract::json_body;

/// A change of a resource, built from a PATCH body's fields.
pub(crate) trait PatchBody: Default {
    /// Takes `value` for `key`; `Ok(false)` when this resource has no such field to change.
    fn take(&mut self, key: &str, value: &Value) -> Result<bool, ApiError>;

    /// The change once every field is taken, given the keys it did not take, in the body's
    /// order: the place to refuse a change of nothing.
    fn finish(self, _not_taken: Vec<String>) -> Result<Self, ApiError> {
        Ok(self)
    }
}

/// Reads a PATCH body into the change it asks for.
pub(crate) fn read<P: PatchBody>(body: &[u8]) -> Result<P, ApiError> {
    let fields: Map<String, Value> = json_body(body)?;
    let mut patch = P::default();
    let mut not_taken = Vec::new();
    for (key, value) in &fields {
        if !patch.take(key, value)? {
            not_taken.push(key.clone());
        }
    }
    patch.finish(not_taken)
}

/// The 422 of a field `key` of the body whose value is not of its type (mula's `kind`: `bool_type`,
/// `int_type`, …).
pub(crate) fn wrong_type(kind: &str, key: &str, msg: String) -> ApiError {
    ApiError::validation(kind, &["body", key], msg)
}
