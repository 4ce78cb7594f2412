//! The collectors' formats of [`super::Format`]: line protocol, Telegraf's JSON, OTLP's JSON
//! and prometheus-kafka-adapter's JSON, each read a line at a time into one record per sample.

use super::{Format, InputOptions, LineReader, Record, Records};
use std::io::BufRead;
use vigil_engine::event::{DecodeError, Event, Millis};

/// The records of a file of a collector's `format`.
pub(super) fn records(reader: Box<dyn BufRead>, format: Format, options: &InputOptions) -> Records<Event> {
    match format {
        Format::TelegrafJson => {
            let host = options.hosts.influx.host_tag.clone();
            Box::new(sample_lines(reader, move |text, _| {
                crate::influx::telegraf_json(text, &host).into_iter().map(|r| r.map(|s| s.events)).collect()
            }))
        }
        Format::OtlpJson => {
            let host = options.hosts.otlp_attribute.clone();
            Box::new(sample_lines(reader, move |text, now| {
                match crate::otlp::decode(text.as_bytes(), crate::otlp::Encoding::Json) {
                    Err(e) => vec![Err(DecodeError { field: None, reason: e.to_string() })],
                    Ok(request) => {
                        let s = crate::otlp::samples(&request, &host, now);
                        let refused = s.refused.into_iter().map(|(_, _, e)| Err(e));
                        std::iter::once(Ok(s.events)).chain(refused).collect()
                    }
                }
            }))
        }
        Format::PrometheusKafkaAdapter => {
            let host = options.hosts.remote_write.clone();
            Box::new(sample_lines(reader, move |text, _| {
                vec![crate::remote_write::adapter_sample(text, &host).map(|s| s.events)]
            }))
        }
        _ => {
            // A newline inside a quoted string field ends the line here: files of Telegraf's
            // output have none.
            let mapping = options.hosts.influx.clone();
            Box::new(sample_lines(reader, move |text, now| match crate::influx::lines(text).next() {
                None => Vec::new(),
                Some((_, line)) => vec![crate::influx::samples(line, &mapping, now).map(|s| s.events)],
            }))
        }
    }
}

/// Lines of a collector's format, one record per sample (a line of several makes several):
/// `per_line` turns a line's text (and the time of samples without one) into its items'
/// samples, or why an item is refused.
fn sample_lines(
    reader: Box<dyn BufRead>,
    mut per_line: impl FnMut(&str, Millis) -> Vec<Result<Vec<Event>, DecodeError>>,
) -> impl Iterator<Item = Record> {
    let mut lines = LineReader::new(reader);
    let mut line_no = 0u64;
    let mut pending = std::collections::VecDeque::new();
    let now = vigil_engine::event::now_ms();
    std::iter::from_fn(move || loop {
        if let Some(record) = pending.pop_front() {
            return Some(record);
        }
        line_no += 1;
        let items = match lines.next_line()? {
            Err(e) => vec![Err(DecodeError { field: None, reason: format!("read error: {e}") })],
            Ok(bytes) => match std::str::from_utf8(bytes) {
                Err(e) => {
                    vec![Err(DecodeError { field: None, reason: format!("invalid UTF-8 at byte {}", e.valid_up_to()) })]
                }
                Ok(text) if text.trim().is_empty() => continue,
                Ok(text) => per_line(text, now),
            },
        };
        for item in items {
            match item {
                Ok(events) => pending.extend(events.into_iter().map(|e| Record { line: line_no, event: Ok(e) })),
                Err(e) => pending.push_back(Record { line: line_no, event: Err(e) }),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::read;
    use super::Format;

    #[test]
    fn collectors_json_lines_are_samples_with_the_line_of_each_refusal() {
        // The second metric names no host: taken under the fleet's.
        let telegraf = concat!(
            r#"{"metrics":[{"name":"mem","tags":{"host":"a"},"fields":{"used":1,"free":2},"timestamp":1700000000},"#,
            r#"{"name":"mem","tags":{},"fields":{"used":3},"timestamp":1700000000}]}"#,
            "\n\n",
            r#"{"name":"cpu","tags":{"host":"b"},"fields":{"value":4},"timestamp":1700000060}"#,
            "\n"
        );
        let records = read("t.json", telegraf, Format::TelegrafJson);
        let got: Vec<(u64, Option<String>)> =
            records.iter().map(|r| (r.line, r.event.as_ref().ok().map(|e| e.get("name").to_text()))).collect();
        let want = [(1, Some("mem_used")), (1, Some("mem_free")), (1, Some("mem_used")), (3, Some("cpu"))];
        assert_eq!(got, want.map(|(l, n)| (l, n.map(str::to_string))));
        let adapter = concat!(
            r#"{"timestamp":"2023-11-14T22:13:20Z","value":"1.5","name":"up","labels":{"__name__":"up","instance":"h:9100"}}"#,
            "\n",
            r#"{"value":"1","name":"up","labels":{"instance":"h"}}"#,
            "\n"
        );
        let records = read("p.json", adapter, Format::PrometheusKafkaAdapter);
        assert_eq!(records.len(), 2);
        let first = records[0].event.as_ref().expect("a sample");
        assert_eq!((first.get("host").to_text(), first.ts), ("h".to_string(), 1_700_000_000_000));
        assert_eq!(records[1].event.as_ref().expect_err("no time").field.as_deref(), Some("timestamp"));
    }
}
