//! How much a replay read: the first and last sample time of each metric series and of each
//! host, what alerts per series per day and pages per host per week are counted against
//! (`vigil eval --budget`, `vigil why --cost`).

use super::Input;
use crate::event::{field_position, Decoded, Event, Millis};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use vigil_lang::schema::Stream;

const DAY_MS: f64 = 86_400_000.0;

/// The first and last sample time of each metric series (host, name, labels) and each host.
#[derive(Debug, Default)]
pub struct Spans {
    series: HashMap<(String, String, String), (Millis, Millis)>,
    hosts: HashMap<String, (Millis, Millis)>,
}

impl Spans {
    /// Widens the spans of a metric sample's series and host to its time; other events are not
    /// samples.
    pub fn note(&mut self, e: &Event) {
        if e.stream != Stream::Metric {
            return;
        }
        let text = |field: &str| e.value(field_position(e.stream, field)).to_text();
        let widen = |span: &mut (Millis, Millis)| {
            span.0 = span.0.min(e.ts);
            span.1 = span.1.max(e.ts);
        };
        widen(self.series.entry((text("host"), text("name"), text("labels"))).or_insert((e.ts, e.ts)));
        widen(self.hosts.entry(text("host")).or_insert((e.ts, e.ts)));
    }

    pub fn series(&self) -> usize {
        self.series.len()
    }

    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// Days of samples, summed over series.
    pub fn series_days(&self) -> f64 {
        days(self.series.values())
    }

    /// Days of samples, summed over hosts (a host's span is its series' together).
    pub fn host_days(&self) -> f64 {
        days(self.hosts.values())
    }
}

fn days<'a>(spans: impl Iterator<Item = &'a (Millis, Millis)>) -> f64 {
    spans.map(|(first, last)| (last - first) as f64 / DAY_MS).sum()
}

impl Input<Decoded> {
    /// This input, each of its samples noted in `spans` as it is read.
    pub fn noting(mut self, spans: &Rc<RefCell<Spans>>) -> Self {
        let spans = spans.clone();
        let records = std::mem::replace(&mut self.records, Box::new(std::iter::empty()));
        self.records = Box::new(records.inspect(move |r| {
            if let Ok(Decoded::Event(e)) = &r.event {
                spans.borrow_mut().note(e);
            }
        }));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::decode;

    #[test]
    fn a_host_spans_its_series_together_and_other_streams_are_not_samples() {
        let mut spans = Spans::default();
        let metric = |ts: i64, name: &str| {
            decode(&format!(r#"{{"stream":"metric","ts":{ts},"host":"h","name":"{name}","value":1}}"#), None)
                .expect("a sample")
        };
        spans.note(&metric(0, "cpu"));
        spans.note(&metric(86_400_000, "cpu"));
        spans.note(&metric(43_200_000, "mem"));
        spans.note(&metric(129_600_000, "mem"));
        spans.note(
            &decode(r#"{"stream":"machine_event","ts":900000000,"machine_id":"h","type":"ADD"}"#, None)
                .expect("an event"),
        );
        assert_eq!((spans.series(), spans.hosts()), (2, 1));
        assert_eq!(spans.series_days(), 2.0);
        assert_eq!(spans.host_days(), 1.5);
    }
}
