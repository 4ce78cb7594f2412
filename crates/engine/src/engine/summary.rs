//! What a fleet-wide rule's stage one sends its stage two ([`super::stage_two`]): the groups of
//! a closed window and their results.

use super::keys::Key;
use crate::event::{Millis, Value};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The groups of one split operator whose window ending at `end` had events, from one stage
/// one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The operator's state identity ([`vigil_lang::plan::StateId`]).
    pub op: String,
    pub end: Millis,
    pub groups: Vec<Summarised>,
}

/// One group's closed window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summarised {
    /// Its peer group (the cluster step's `per` values), when a group's key tells it; empty
    /// otherwise.
    pub peers: Key,
    pub key: Key,
    pub results: Arc<[Value]>,
}
