//! The engine's state as a checkpoint stores it.

use crate::event::{Event, Millis};
use vigil_lang::plan::StateId;

/// Everything the engine knows, for a checkpoint: the events waiting in the reorder buffer,
/// event time, and each operator's state under the identity of the state it keeps
/// ([`StateId`]), so that a changed rule starts empty and the others carry on, whatever else
/// changed in them or in how plans print.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub(super) buffered: Vec<(Event, u64)>,
    pub(super) arrivals: u64,
    pub(super) max_ts: Option<Millis>,
    pub(super) watermark: Option<Millis>,
    /// Each operator's state, written and read as one run of bytes (the same bytes in
    /// postcard as a sequence of `u8`, which serde would write one at a time).
    pub(super) operators: Vec<(StateId, serde_bytes::ByteBuf)>,
}

/// The snapshot format; a snapshot of another version is not restored. Version 2 keys
/// operators by the structure of their state, where version 1 keyed them by their rules' text.
pub const SNAPSHOT_VERSION: u32 = 2;

impl Snapshot {
    pub fn to_bytes(&self) -> Result<Vec<u8>, postcard::Error> {
        // Room for it all at once: the operators' states are most of it.
        let room = self.operators.iter().map(|(_, b)| b.len() + 64).sum::<usize>() + self.buffered.len() * 256 + 64;
        postcard::to_extend(self, Vec::with_capacity(room))
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, postcard::Error> {
        postcard::from_bytes(bytes)
    }

    /// The newest event's time and the watermark.
    pub fn time(&self) -> (Option<Millis>, Option<Millis>) {
        (self.max_ts, self.watermark)
    }

    /// Sets the newest event's time and the watermark: a partition's snapshot carries its
    /// router's where one engine's stood alone.
    pub fn set_time(&mut self, (max_ts, watermark): (Option<Millis>, Option<Millis>)) {
        self.max_ts = max_ts;
        self.watermark = watermark;
    }

    /// The state kept for `id`, if the snapshot has it.
    pub(super) fn state_of(&self, id: &StateId) -> Option<&[u8]> {
        self.operators.iter().find(|(s, _)| s == id).map(|(_, bytes)| bytes.as_slice())
    }
}

#[cfg(test)]
mod tests {
    /// Operators' states are now written as byte runs: a checkpoint of the builds that wrote
    /// them as sequences of `u8` has the same bytes, and reads back the same.
    #[test]
    fn a_byte_run_is_written_as_a_sequence_of_bytes_was() {
        let states: Vec<(u32, Vec<u8>)> = vec![(1, vec![]), (2, (0..=255).collect()), (3, vec![7; 1000])];
        let before = postcard::to_stdvec(&states).expect("serialise");
        let runs: Vec<(u32, serde_bytes::ByteBuf)> =
            states.iter().map(|(i, b)| (*i, serde_bytes::ByteBuf::from(b.clone()))).collect();
        assert_eq!(postcard::to_stdvec(&runs).expect("serialise"), before);
        let read: Vec<(u32, serde_bytes::ByteBuf)> = postcard::from_bytes(&before).expect("read");
        assert_eq!(read, runs);
    }
}
