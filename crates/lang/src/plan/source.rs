//! What a pattern's events hold of the entities it binds.

use super::SourcePlan;
use crate::schema::Role;

impl SourcePlan {
    /// Where this source's events keep the key attributes of entity `var`, in the order of its
    /// kind's key: the object's place when `var` is the object, else the subject's.
    pub fn key_positions(&self, var: &str) -> Vec<usize> {
        match &self.object {
            Some((kind, v)) if v == var && self.subject.1 != var => self.stream.key_positions(*kind, Role::Object),
            _ => self.stream.key_positions(self.subject.0, Role::Subject),
        }
    }
}
