//! Where an event came from, as checkpoints record it.

/// The source name the ingest log's position is checkpointed under (Kafka topic names cannot
/// hold a `:`, so the two never mix).
pub const HTTP_SOURCE: &str = "http:ingest";

/// How a replayed file's source name starts (`file:<path>`).
pub const FILE_PREFIX: &str = "file:";

/// Where an event came from: a Kafka topic, partition and offset; a replayed file
/// (`file:<path>`, partition 0, line number); or the ingest log ([`HTTP_SOURCE`], offset). A
/// checkpoint records the next of each.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl Position {
    /// Whether it is a line of a replayed file.
    pub fn is_file(&self) -> bool {
        self.topic.starts_with(FILE_PREFIX)
    }
}

/// The next offset a checkpoint's positions give for `source` (partition 0), if any.
pub fn resume_offset(positions: &[Position], source: &str) -> Option<i64> {
    positions.iter().find(|p| p.topic == source && p.partition == 0).map(|p| p.offset)
}
