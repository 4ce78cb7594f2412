//! One list of the formats Vigil reads, for files (`--format`), Kafka topics
//! (`--kafka-topic-format TOPIC=FORMAT`) and HTTP receivers alike, each with the places it can
//! arrive by.
//!
//! | format | file | Kafka message | HTTP |
//! |---|---|---|---|
//! | `jsonl` (`vigil` too) | yes | yes | `POST /api/v1/events` |
//! | `nab`, `google-*`, `alibaba-*`, `azure-cpu`, `planetlab` | yes | | |
//! | `influx` | yes | yes | `POST /api/v2/write`, `POST /write` |
//! | `telegraf-json` | yes | yes | |
//! | `otlp-json` | yes | yes | `POST /v1/metrics` (`application/json`) |
//! | `otlp-proto` | | yes | `POST /v1/metrics` (`application/x-protobuf`) |
//! | `prometheus-kafka-adapter` | yes | yes | |
//! | `remote-write` | | | `POST /api/v1/write` |
//!
//! A Kafka message or an HTTP body is one unit of its format (a batch of lines, one OTLP
//! request, one write request); a file is a sequence of them a line at a time, so the two binary
//! formats are read from messages and bodies only.

/// A format Vigil reads. Its name is the one `--format` and `--kafka-topic-format` take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Format {
    /// Decide from the file name and its first line (files only).
    Auto,
    /// Vigil's JSON lines, one event per line (`vigil` names it too).
    #[value(alias = "vigil")]
    Jsonl,
    Nab,
    GoogleTaskEvents,
    GoogleTaskUsage,
    GoogleMachineEvents,
    AlibabaBatchTask,
    AlibabaServerEvent,
    AzureCpu,
    Planetlab,
    /// InfluxDB line protocol.
    Influx,
    /// Telegraf's JSON output, a metric or a batch per line.
    TelegrafJson,
    /// OTLP metrics in OTLP's JSON, a request per line (or message).
    #[value(alias = "otlp_json")]
    OtlpJson,
    /// OTLP metrics in protobuf, a request per message (the Collector's `otlp_proto`).
    #[value(alias = "otlp_proto")]
    OtlpProto,
    /// prometheus-kafka-adapter's JSON, a sample per line (or message).
    PrometheusKafkaAdapter,
    /// Prometheus remote-write: protobuf, snappy-compressed, a request per body.
    RemoteWrite,
}

/// Where a format's data can come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// A file replayed (`vigil replay`, `vigil serve --replay`, `vigil eval`).
    File,
    /// A Kafka topic's messages.
    Message,
}

impl Carrier {
    fn what(self) -> &'static str {
        match self {
            Carrier::File => "a file format",
            Carrier::Message => "a format of Kafka messages",
        }
    }
}

impl Format {
    /// The name flags and `vigil.toml` take.
    pub fn name(self) -> &'static str {
        match self {
            Format::Auto => "auto",
            Format::Jsonl => "jsonl",
            Format::Nab => "nab",
            Format::GoogleTaskEvents => "google-task-events",
            Format::GoogleTaskUsage => "google-task-usage",
            Format::GoogleMachineEvents => "google-machine-events",
            Format::AlibabaBatchTask => "alibaba-batch-task",
            Format::AlibabaServerEvent => "alibaba-server-event",
            Format::AzureCpu => "azure-cpu",
            Format::Planetlab => "planetlab",
            Format::Influx => "influx",
            Format::TelegrafJson => "telegraf-json",
            Format::OtlpJson => "otlp-json",
            Format::OtlpProto => "otlp-proto",
            Format::PrometheusKafkaAdapter => "prometheus-kafka-adapter",
            Format::RemoteWrite => "remote-write",
        }
    }

    /// Whether data of this format can come by `carrier`.
    pub fn comes_by(self, carrier: Carrier) -> bool {
        let collector = matches!(
            self,
            Format::Jsonl | Format::Influx | Format::TelegrafJson | Format::OtlpJson | Format::PrometheusKafkaAdapter
        );
        match carrier {
            Carrier::File => !matches!(self, Format::OtlpProto | Format::RemoteWrite),
            Carrier::Message => collector || self == Format::OtlpProto,
        }
    }

    /// The formats that can come by `carrier`, by name, for a message that lists them.
    pub fn names_by(carrier: Carrier) -> String {
        let names: Vec<&str> = <Format as clap::ValueEnum>::value_variants()
            .iter()
            .filter(|f| f.comes_by(carrier))
            .map(|f| f.name())
            .collect();
        names.join(", ")
    }

    /// Why data of this format cannot come by `carrier`, naming those that can; `None` if it can.
    pub fn refusal(self, carrier: Carrier) -> Option<String> {
        (!self.comes_by(carrier))
            .then(|| format!("`{}` is not {}: {}", self.name(), carrier.what(), Format::names_by(carrier)))
    }

    /// Reads a format's name (or one of its aliases) for `carrier`; the error says which
    /// formats it could have been.
    pub fn parse_for(name: &str, carrier: Carrier) -> Result<Format, String> {
        match <Format as clap::ValueEnum>::from_str(name.trim(), false) {
            Ok(f) => f.refusal(carrier).map_or(Ok(f), Err),
            Err(_) => {
                Err(format!("`{}` is not {} Vigil reads: {}", name.trim(), carrier.what(), Format::names_by(carrier)))
            }
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn each_name_reads_back_as_its_format() {
        for f in Format::value_variants() {
            assert_eq!(Format::from_str(f.name(), false), Ok(*f), "{f:?}");
        }
    }

    #[test]
    fn topics_take_the_old_names_and_refuse_file_formats() {
        assert_eq!(Format::parse_for("vigil", Carrier::Message), Ok(Format::Jsonl));
        assert_eq!(Format::parse_for("otlp_proto", Carrier::Message), Ok(Format::OtlpProto));
        let err = Format::parse_for("nab", Carrier::Message).expect_err("a file format");
        assert!(err.contains("`nab` is not a format of Kafka messages") && err.contains("otlp-proto"), "{err}");
        let err = Format::parse_for("remote-write", Carrier::File).expect_err("bodies only");
        assert!(err.contains("is not a file format"), "{err}");
        assert_eq!(
            Format::OtlpProto
                .refusal(Carrier::File)
                .map(|e| e.starts_with("`otlp-proto` is not a file format: auto, jsonl")),
            Some(true)
        );
        assert_eq!(Format::Influx.refusal(Carrier::File), None);
        let err = Format::parse_for("csv", Carrier::Message).expect_err("unknown");
        assert!(err.contains("`csv` is not a format of Kafka messages Vigil reads: jsonl, influx"), "{err}");
    }
}
