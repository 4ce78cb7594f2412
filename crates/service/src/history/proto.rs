//! Prometheus' remote-read messages (`prometheus.ReadRequest` and its answers), declared as
//! `prompb/remote.proto` and `prompb/types.proto` number their fields. The series of a
//! `SAMPLES` answer are remote-write's ([`TimeSeries`]), so that they become events the same
//! way.

pub use vigil_formats::remote_write::{Label, Sample, TimeSeries};

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadRequest {
    #[prost(message, repeated, tag = "1")]
    pub queries: Vec<Query>,
    /// The answers the client takes, in its order of preference ([`SAMPLES`],
    /// [`STREAMED_XOR_CHUNKS`]).
    #[prost(int32, repeated, tag = "2")]
    pub accepted_response_types: Vec<i32>,
}

/// The whole answer in one message of every series' samples, built in the server's memory.
pub const SAMPLES: i32 = 0;
/// Frames of series' chunks, as the server reads them from its blocks.
pub const STREAMED_XOR_CHUNKS: i32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Query {
    /// The first and last millisecond of the range, both included.
    #[prost(int64, tag = "1")]
    pub start_timestamp_ms: i64,
    #[prost(int64, tag = "2")]
    pub end_timestamp_ms: i64,
    #[prost(message, repeated, tag = "3")]
    pub matchers: Vec<LabelMatcher>,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct LabelMatcher {
    /// [`EQ`], [`NEQ`], [`RE`] or [`NRE`].
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub value: String,
}

pub const EQ: i32 = 0;
pub const NEQ: i32 = 1;
pub const RE: i32 = 2;
pub const NRE: i32 = 3;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadResponse {
    /// One per query, in the request's order.
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<QueryResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryResult {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// One frame of a streamed answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ChunkedReadResponse {
    #[prost(message, repeated, tag = "1")]
    pub chunked_series: Vec<ChunkedSeries>,
    /// The query (by its place in the request) the series answer.
    #[prost(int64, tag = "2")]
    pub query_index: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChunkedSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// In time order, not overlapping.
    #[prost(message, repeated, tag = "2")]
    pub chunks: Vec<Chunk>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Chunk {
    #[prost(int64, tag = "1")]
    pub min_time_ms: i64,
    #[prost(int64, tag = "2")]
    pub max_time_ms: i64,
    /// [`XOR`] for float samples; histograms' encodings are not read.
    #[prost(int32, tag = "3")]
    pub r#type: i32,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
}

/// Gorilla's encoding of float samples ([`super::xor`]).
pub const XOR: i32 = 1;
