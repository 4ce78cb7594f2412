//! A range of a team's history as an input of `vigil replay`: a backtest of rules over what
//! Prometheus kept. The range is read a page of time at a time (every selector's series over
//! the page), the page's samples become `metric` events as remote-written samples do
//! ([`vigil_formats::remote_write::series_samples`], the same host mapping), in time order, and
//! the next page is read once they are taken.

use super::proto::LabelMatcher;
use super::{Prometheus, PrometheusError};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vigil_engine::event::{Decoded, Event, Millis};
use vigil_formats::input::{Input, Record};
use vigil_formats::metric_kind::Families;
use vigil_formats::remote_write::{series_samples, HostLabels};

/// What to read.
pub struct Backtest {
    pub read: Prometheus,
    /// Each selector as given, and its matchers.
    pub selectors: Vec<(String, Vec<LabelMatcher>)>,
    /// The range, ms, both ends included.
    pub start: Millis,
    pub end: Millis,
    /// The time read at once.
    pub page_ms: i64,
    pub hosts: HostLabels,
}

/// The error that ended the input early, when one did: the replay's summary alone would not
/// tell a range cut short from a quiet one.
pub type Failure = Arc<Mutex<Option<PrometheusError>>>;

struct Pages {
    b: Backtest,
    /// The first millisecond of the next page.
    next: Millis,
    events: std::vec::IntoIter<Event>,
    runtime: tokio::runtime::Runtime,
    sample: u64,
    /// Seconds of the range read, for the progress bar.
    read: Arc<AtomicU64>,
    failure: Failure,
    /// The metric families as the server describes them: each series' kind.
    families: Families,
}

impl Pages {
    /// Reads the next page into `events`; false at the end of the range or on a failure.
    fn page(&mut self) -> bool {
        while self.next <= self.b.end {
            let (from, to) = (self.next, self.b.end.min(self.next.saturating_add(self.b.page_ms - 1)));
            self.next = to.saturating_add(1);
            let mut seen = BTreeSet::new();
            let mut events = Vec::new();
            for (text, matchers) in &self.b.selectors {
                let series = match self.runtime.block_on(self.b.read.read(matchers, from, to)) {
                    Ok(series) => series,
                    Err(e) => {
                        let message = format!("reading `{text}` from {from} to {to} ms: {e}");
                        *self.failure.lock().expect("failure") = Some(PrometheusError { message, ..e });
                        self.next = Millis::MAX;
                        return false;
                    }
                };
                for s in series {
                    if !seen.insert(s.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect::<Vec<_>>()) {
                        continue;
                    }
                    // A series without a name cannot come from a selector's match; one that
                    // does is skipped as a remote-write receiver refuses it.
                    if let Ok(samples) = series_samples(&s, &self.b.hosts, Some(&self.families)) {
                        events.extend(samples.events);
                    }
                }
            }
            self.read.store(((to - self.b.start) / 1000) as u64, Ordering::Relaxed);
            if !events.is_empty() {
                events.sort_by_key(|e| e.ts);
                self.events = events.into_iter();
                return true;
            }
        }
        false
    }
}

impl Iterator for Pages {
    type Item = Record<Decoded>;

    fn next(&mut self) -> Option<Record<Decoded>> {
        loop {
            if let Some(e) = self.events.next() {
                self.sample += 1;
                return Some(Record { line: self.sample, event: Ok(Decoded::Event(Arc::new(e))) });
            }
            if !self.page() {
                return None;
            }
        }
    }
}

/// The backtest's input (its progress in seconds of the range) and where a failure that ends
/// it is left.
pub fn input(b: Backtest) -> Result<(Input<Decoded>, Failure), PrometheusError> {
    if b.end < b.start {
        return Err(super::fatal(format!("the range ends ({} ms) before it starts ({} ms)", b.end, b.start)));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| super::fatal(format!("cannot start the async runtime: {e}")))?;
    let failure = Failure::default();
    let read = Arc::new(AtomicU64::new(0));
    let name = b.read.endpoint("/api/v1/read");
    let size = ((b.end - b.start) / 1000).max(1) as u64;
    let families = Families::default();
    runtime.block_on(super::learn_metadata(&b.read, &families));
    let pages = Pages {
        next: b.start,
        b,
        events: Vec::new().into_iter(),
        runtime,
        sample: 0,
        read: read.clone(),
        failure: failure.clone(),
        families,
    };
    Ok((Input { name, records: Box::new(pages), progress: read, size }, failure))
}
