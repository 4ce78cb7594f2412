//! The formats Vigil reads, turned into the engine's events: recorded files, and what collectors
//! send over HTTP and Kafka. Nothing here does I/O beyond reading the files it is given; the
//! engine knows none of these formats, only [`vigil_engine::event::Event`].
//!
//! - [`Format`]: the one list of formats, for files, topics and HTTP receivers, and which of
//!   them each format can come by; [`HostMapping`]: how each names a sample's host.
//! - [`input`]: recorded files (JSON lines, NAB, Google 2011, Alibaba 2017, Azure, PlanetLab,
//!   collectors' dumps) to the records `vigil_engine::replay` reads.
//! - [`otlp`], [`remote_write`], [`influx`]: what collectors send, as `metric` events, with
//!   [`metric_kind`] telling counters from gauges.

mod format;
mod hosts;
pub mod influx;
pub mod input;
pub mod metric_kind;
pub mod otlp;
pub mod remote_write;

pub use format::{Carrier, Format};
pub use hosts::HostMapping;
