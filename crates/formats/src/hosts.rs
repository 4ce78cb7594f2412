//! How a collector's sample is placed under a host: one setting per format family, the same for
//! files (`vigil replay`, `vigil serve --replay`), Kafka topics and HTTP receivers.

use crate::{influx, remote_write};

#[derive(Debug, Clone, PartialEq)]
pub struct HostMapping {
    /// Line protocol's and Telegraf JSON's tag that names the host (`--influx-host-tag`), and
    /// line protocol's timestamp precision where the sender does not say it.
    pub influx: influx::Mapping,
    /// The OTLP resource (or point) attribute that names the host (`--otlp-host-attribute`).
    pub otlp_attribute: String,
    /// The labels of remote-write and prometheus-kafka-adapter series that name the host
    /// (`--remote-write-host-label`, its fallback).
    pub remote_write: remote_write::HostLabels,
}

impl Default for HostMapping {
    fn default() -> Self {
        HostMapping {
            influx: influx::Mapping::default(),
            otlp_attribute: "host.name".into(),
            remote_write: remote_write::HostLabels::default(),
        }
    }
}
