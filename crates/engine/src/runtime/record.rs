//! The runtime's checkpoint record: one versioned struct, serialised once (postcard), with
//! the snapshot of every keyed partition and the time they share.
//!
//! ```text
//! "VGRT" | postcard(Record { version, partitions, two_stage, max_ts, watermark,
//!                            parts: [snapshot bytes], stage_two })
//! ```
//!
//! Partition `i` keeps the key groups whose number modulo `partitions` is `i`, whatever number
//! of threads runs them, so the record restores under any `--workers`. Two older layouts are
//! read as records ([`Record::read`]), and written for a rollback to that build
//! ([`Record::previous_layout`]): one engine's snapshot alone (one partition), and `VGW1`
//! followed by a postcard list of snapshots, one per worker (as many partitions, each worker
//! having kept the key groups a partition of that index keeps now, with fleet-wide rules whole).

use crate::engine::{EngineError, Snapshot};
use crate::event::Millis;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// Marks a record. A bare snapshot never starts with it: its first byte is its version.
const MAGIC: &[u8; 4] = b"VGRT";
/// The record's layout.
pub const RECORD_VERSION: u32 = 1;
/// Marks the list of workers' snapshots that is read as a record of as many partitions.
const WORKERS_MAGIC: &[u8; 4] = b"VGW1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    /// How many keyed partitions split the key groups.
    pub partitions: u32,
    /// Whether fleet-wide rules ran in two stages: their windows in the partitions, their
    /// judging in [`Record::stage_two`]. Otherwise each ran whole in one partition (and a
    /// restart runs them so, keeping their state).
    pub two_stage: bool,
    /// The newest event's time, as the router saw it.
    pub max_ts: Option<Millis>,
    pub watermark: Option<Millis>,
    /// Each partition's [`Snapshot`], by partition.
    pub parts: Vec<ByteBuf>,
    /// The stage two's state ([`crate::engine::stage_two::StageTwo::snapshot`]); empty when
    /// there is none.
    pub stage_two: ByteBuf,
}

impl Record {
    pub fn to_bytes(&self) -> Result<Vec<u8>, postcard::Error> {
        let room = self.parts.iter().map(|p| p.len() + 8).sum::<usize>() + 64;
        let mut bytes = Vec::with_capacity(room);
        bytes.extend_from_slice(MAGIC);
        postcard::to_extend(self, bytes)
    }

    /// The layout of the build before the record, for a rollback to it: one snapshot alone, or
    /// `VGW1` and the list of them (each with the time of every partition).
    pub fn previous_layout(mut parts: Vec<ByteBuf>) -> Result<Vec<u8>, postcard::Error> {
        if parts.len() == 1 {
            return Ok(parts.swap_remove(0).into_vec());
        }
        let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.len() + 8).sum::<usize>() + 16);
        bytes.extend_from_slice(WORKERS_MAGIC);
        postcard::to_extend(&parts, bytes)
    }

    /// A record from a checkpoint's bytes, in any of the layouts above.
    pub fn read(bytes: &[u8]) -> Result<Record, EngineError> {
        if let Some(rest) = bytes.strip_prefix(MAGIC) {
            let record: Record = postcard::from_bytes(rest)?;
            if record.version != RECORD_VERSION {
                return Err(EngineError::Version { found: record.version, expected: RECORD_VERSION });
            }
            if record.parts.len() != record.partitions as usize || record.partitions == 0 {
                return Err(EngineError::Record(format!(
                    "{} partitions with {} snapshots",
                    record.partitions,
                    record.parts.len()
                )));
            }
            return Ok(record);
        }
        let parts: Vec<ByteBuf> = match bytes.strip_prefix(WORKERS_MAGIC) {
            Some(rest) => postcard::from_bytes(rest)?,
            None => vec![ByteBuf::from(bytes)],
        };
        if parts.is_empty() {
            return Err(EngineError::Record("a list of no snapshots".into()));
        }
        // Every worker saw every event: the first one's time is theirs.
        let (max_ts, watermark) = Snapshot::from_bytes(&parts[0])?.time();
        let partitions = parts.len() as u32;
        let stage_two = ByteBuf::new();
        Ok(Record { version: RECORD_VERSION, partitions, two_stage: false, max_ts, watermark, parts, stage_two })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_record_is_an_error_that_says_why() {
        let record = Record {
            version: RECORD_VERSION,
            partitions: 2,
            two_stage: true,
            max_ts: Some(5),
            watermark: Some(4),
            parts: vec![ByteBuf::from(vec![1, 2]), ByteBuf::from(vec![3])],
            stage_two: ByteBuf::from(vec![9]),
        };
        let bytes = record.to_bytes().expect("serialise");
        assert_eq!(Record::read(&bytes).expect("reads back"), record);
        assert!(matches!(Record::read(&bytes[..bytes.len() - 1]), Err(EngineError::Encoding(_))));
        let short = Record { partitions: 3, ..record.clone() }.to_bytes().expect("serialise");
        let e = Record::read(&short).expect_err("three partitions, two snapshots");
        assert!(e.to_string().contains("3 partitions with 2 snapshots"), "{e}");
        let later = Record { version: RECORD_VERSION + 1, ..record }.to_bytes().expect("serialise");
        assert!(matches!(Record::read(&later), Err(EngineError::Version { .. })));
        let mut none = WORKERS_MAGIC.to_vec();
        none.push(0);
        assert!(Record::read(&none).expect_err("no snapshots").to_string().contains("no snapshots"));
    }
}
