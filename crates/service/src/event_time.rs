//! Event time by source. The engine's time follows the newest event, less the lateness; with
//! several sources, one that is ahead would make every other's events late. A remote-write
//! sender that resends its backlog after Vigil was down does exactly that: its shards resend in
//! parallel, each in time order, some faster than others. So the service keeps the newest time
//! of each source, and the engine's time moves no further than the slowest live one allows
//! ([`Engine::set_slowest`](vigil_engine::engine::Engine::set_slowest)), as Flink's watermarks follow
//! the slowest split.
//!
//! A source is a Kafka partition; a series (host, name and labels) of metric samples pushed over
//! HTTP, since a push carries nothing that tells one sender or shard from another; and the other
//! events pushed over HTTP, together. A file (`--replay`) is not one: it is read as fast as the
//! engine takes it and then ends, and would only hold the live sources back. A source that has
//! sent nothing for `--source-idle-after` (wall clock) stops holding time back, as a split that
//! Flink marks idle: a series that ended, or a sender that stopped. A request's series not yet
//! heard cannot hold time back, so while one is half taken the engine thread lets the sources
//! hold time further back but not move it on ([`crate::engine_loop`]). After a restart from a
//! checkpoint, time stays where it was for that long from the start, so that every sender
//! resending its backlog (Prometheus retries within 5 s) is heard from before any of them moves
//! time.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};
use vigil_engine::engine::keys::FieldsKey;
use vigil_engine::event::{Event, Millis};
use vigil_lang::schema::Stream;

/// Most sources tracked: past this, new ones are not (they cannot hold time back), which bounds
/// the memory a flood of new series can take. 100,000 node_exporter-sized hosts' worth is far
/// beyond one instance's intake.
const MOST_SOURCES: usize = 1_000_000;

/// How many times a scan of every source's clock took, the next scan waits: the scans then take
/// at most a fiftieth of the engine's thread. With a few thousand sources that is every tick;
/// with a million series (a scan of several milliseconds, twenty ticks a second), scanning on
/// every tick was most of the thread's time.
const SCAN_SPACING: u32 = 50;

/// Where an input came from, as far as event time is concerned.
pub enum Origin<'a> {
    /// A Kafka partition.
    Partition(&'a str, i32),
    /// HTTP ingest.
    Pushed,
}

/// How far the sources let the engine's time move.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Slowest {
    /// Restarted: time stays where it is while the senders are heard from.
    Held,
    /// To where the newest event at this time would move it: every live source has got here.
    At(Millis),
    /// As the newest event moves it: no source holds it back.
    Free,
}

/// The newest event time of each live source.
pub struct SourceClocks {
    idle_after: Duration,
    /// By source: the newest event time, and when it was last heard from.
    clocks: HashMap<u64, (Millis, Instant), foldhash::fast::FixedState>,
    /// The metric stream's series fields: host, name, labels.
    series: [usize; 3],
    /// After a restart: time holds until then.
    hold: Option<Instant>,
    /// What the last scan of every clock found (`None`: no live source), and when the next may
    /// run.
    scanned: Option<Millis>,
    next_scan: Option<Instant>,
    /// The oldest newest time among the sources added since the last
    /// [`SourceClocks::slowest`]; `None` when none was.
    added_since: Option<Millis>,
    /// The oldest time a known source had before the events heard since the engine last took a
    /// batch moved it: where it holds time until they are taken.
    moved_since: Option<Millis>,
}

impl SourceClocks {
    /// `restored`: the engine's state came from a checkpoint, and time holds for `idle_after`
    /// from `now`, the start.
    pub fn new(idle_after: Duration, restored: bool, now: Instant) -> SourceClocks {
        let field = |name| Stream::Metric.field_index(name).expect("a field of the metric stream");
        SourceClocks {
            idle_after,
            clocks: HashMap::default(),
            series: [field("host"), field("name"), field("labels")],
            hold: restored.then(|| now + idle_after),
            scanned: None,
            next_scan: None,
            added_since: None,
            moved_since: None,
        }
    }

    /// Whether time follows the sources at all (`--source-idle-after 0` turns it off).
    pub fn enabled(&self) -> bool {
        !self.idle_after.is_zero()
    }

    /// An event of `from` came, at `now`.
    pub fn heard(&mut self, from: Origin<'_>, event: &Event, now: Instant) {
        if !self.enabled() {
            return;
        }
        let hasher = self.clocks.hasher();
        let source = match from {
            Origin::Partition(topic, partition) => hasher.hash_one((0u8, topic, partition)),
            Origin::Pushed if event.stream == Stream::Metric => {
                hasher.hash_one((1u8, FieldsKey { event, positions: &self.series }))
            }
            Origin::Pushed => hasher.hash_one(2u8),
        };
        let full = self.clocks.len() >= MOST_SOURCES;
        match self.clocks.get_mut(&source) {
            Some((newest, heard)) => {
                if event.ts > *newest {
                    self.moved_since = Some(self.moved_since.map_or(*newest, |t| t.min(*newest)));
                }
                *newest = (*newest).max(event.ts);
                *heard = now;
            }
            None if !full => {
                self.clocks.insert(source, (event.ts, now));
                self.added_since = Some(self.added_since.map_or(event.ts, |t| t.min(event.ts)));
            }
            None => {}
        }
    }

    /// The engine took the events heard so far: their sources' clocks stand.
    pub fn taken(&mut self) {
        self.moved_since = None;
    }

    /// Whether a source came that [`SourceClocks::slowest`] has not seen yet.
    pub fn added(&self) -> bool {
        self.added_since.is_some()
    }

    /// How many sources hold time back.
    pub fn live(&self) -> usize {
        self.clocks.len()
    }

    /// How far the sources let time move; sources idle for `idle_after` are forgotten first.
    ///
    /// Between scans of every clock (spaced by [`SCAN_SPACING`]), the last scan's minimum stands,
    /// lowered by the sources added since: a source's newest time only moves forward, so it is
    /// never later than the true minimum, and holds time back a little longer at most. A scan is
    /// lowered by them too, and by the clocks events not yet taken moved: the events of a batch
    /// are all heard before the engine takes any, so a source with several in it already has
    /// the newest as its clock, and the others' would be late behind it. Until the batch is
    /// taken ([`SourceClocks::taken`]), each holds time where it was before (a new source, or
    /// one back from idle, at its oldest event).
    pub fn slowest(&mut self, now: Instant) -> Slowest {
        // Time is held only before the first scan, which reads the sources added meanwhile.
        let added = self.added_since.take();
        if !self.enabled() {
            return Slowest::Free;
        }
        match self.hold {
            Some(until) if now < until => return Slowest::Held,
            Some(_) => self.hold = None,
            None => {}
        }
        if self.next_scan.is_some_and(|next| now < next) {
            self.scanned = [self.scanned, added].into_iter().flatten().min();
        } else {
            let started = Instant::now();
            let idle_after = self.idle_after;
            self.clocks.retain(|_, (_, heard)| now.duration_since(*heard) < idle_after);
            let least = self.clocks.values().map(|(newest, _)| *newest).min();
            self.scanned = [least, added, self.moved_since].into_iter().flatten().min();
            self.next_scan = Some(now + started.elapsed() * SCAN_SPACING);
        }
        self.scanned.map_or(Slowest::Free, Slowest::At)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_engine::event::Value;

    fn sample(host: &str, ts: Millis) -> Event {
        let mut e = Event::new(Stream::Metric, ts);
        e.fields[Stream::Metric.field_index("host").unwrap()] = Value::Str(host.into());
        e.fields[Stream::Metric.field_index("name").unwrap()] = Value::Str("cpu".into());
        e
    }

    #[test]
    fn time_follows_the_slowest_live_source_and_an_idle_one_lets_go() {
        let t0 = Instant::now() - Duration::from_secs(100);
        let mut clocks = SourceClocks::new(Duration::from_secs(10), true, t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(clocks.slowest(at(0)), Slowest::Held, "restarted, no input yet");
        clocks.heard(Origin::Pushed, &sample("fast", 5_000), at(0));
        assert_eq!(clocks.slowest(at(1)), Slowest::Held, "restarted: the senders are heard from first");
        clocks.heard(Origin::Pushed, &sample("slow", 1_000), at(5));
        clocks.heard(Origin::Pushed, &sample("fast", 9_000), at(5));
        assert!(clocks.added());
        assert_eq!(clocks.slowest(at(10)), Slowest::At(1_000), "the slow series holds time");
        assert!(!clocks.added());
        clocks.heard(Origin::Pushed, &sample("slow", 3_000), at(11));
        clocks.taken();
        assert_eq!(clocks.slowest(at(11)), Slowest::At(3_000));
        clocks.heard(Origin::Pushed, &sample("fast", 12_000), at(14));
        clocks.heard(Origin::Pushed, &sample("fast", 11_000), at(15));
        clocks.taken();
        assert_eq!(clocks.slowest(at(22)), Slowest::At(12_000), "the slow one is idle: let go");
        assert_eq!(clocks.live(), 1);
        assert_eq!(clocks.slowest(at(30)), Slowest::Free, "every source is idle");
        clocks.heard(Origin::Pushed, &sample("slow", 4_000), at(40));
        assert_eq!(clocks.slowest(at(40)), Slowest::At(4_000), "held after a restart only");
    }

    #[test]
    fn partitions_and_other_pushes_are_a_source_each() {
        let t0 = Instant::now() - Duration::from_secs(100);
        let mut clocks = SourceClocks::new(Duration::from_secs(10), false, t0);
        let later = t0 + Duration::from_secs(9);
        let mut event = Event::new(Stream::TaskEvent, 7_000);
        clocks.heard(Origin::Pushed, &event, t0);
        event.ts = 2_000;
        clocks.heard(Origin::Partition("t", 0), &event, later);
        clocks.heard(Origin::Partition("t", 1), &Event::new(Stream::TaskEvent, 4_000), later);
        event.ts = 1_000;
        clocks.heard(Origin::Pushed, &event, later);
        assert_eq!(clocks.live(), 3);
        assert_eq!(
            clocks.slowest(t0 + Duration::from_secs(10)),
            Slowest::At(2_000),
            "a source's newest time never goes back"
        );
    }

    #[test]
    fn between_scans_the_last_minimum_stands_lowered_by_new_sources() {
        let t0 = Instant::now() - Duration::from_secs(100);
        let mut clocks = SourceClocks::new(Duration::from_secs(10), false, t0);
        clocks.heard(Origin::Pushed, &sample("a", 5_000), t0);
        clocks.heard(Origin::Pushed, &sample("b", 6_000), t0);
        assert_eq!(clocks.slowest(t0), Slowest::At(5_000));
        // As if the scan had taken long: the next one is a while off.
        clocks.next_scan = Some(t0 + Duration::from_secs(5));
        clocks.heard(Origin::Pushed, &sample("a", 8_000), t0 + Duration::from_secs(1));
        assert_eq!(clocks.slowest(t0 + Duration::from_secs(1)), Slowest::At(5_000), "not scanned: a's move waits");
        clocks.heard(Origin::Pushed, &sample("c", 2_000), t0 + Duration::from_secs(2));
        assert_eq!(clocks.slowest(t0 + Duration::from_secs(2)), Slowest::At(2_000), "a new source counts at once");
        clocks.heard(Origin::Pushed, &sample("c", 9_000), t0 + Duration::from_secs(3));
        assert_eq!(clocks.slowest(t0 + Duration::from_secs(3)), Slowest::At(2_000));
        clocks.taken();
        assert_eq!(clocks.slowest(t0 + Duration::from_secs(5)), Slowest::At(6_000), "scanned again: b is slowest");
    }

    #[test]
    fn a_batch_not_yet_taken_holds_time_where_its_sources_were() {
        // Two series quiet past `idle_after`, then one request with a minute of each: heard
        // whole before the engine takes it, a's newest must not make b's first samples late.
        let t0 = Instant::now() - Duration::from_secs(100);
        let mut clocks = SourceClocks::new(Duration::from_secs(10), false, t0);
        clocks.heard(Origin::Pushed, &sample("a", 50_000), t0);
        clocks.heard(Origin::Pushed, &sample("b", 50_000), t0);
        assert_eq!(clocks.slowest(t0), Slowest::At(50_000));
        let back = t0 + Duration::from_secs(11);
        assert_eq!(clocks.slowest(back), Slowest::Free, "both idle");
        for host in ["a", "b"] {
            for ts in (60_000..=110_000).step_by(10_000) {
                clocks.heard(Origin::Pushed, &sample(host, ts), back);
            }
        }
        assert_eq!(clocks.slowest(back), Slowest::At(60_000), "back from idle: at their oldest");
        clocks.taken();
        // Two live series with a minute each and a new one: a scan finds their newest, but
        // until the batch is taken they hold time where they were.
        let later = back + Duration::from_secs(1);
        clocks.next_scan = None;
        for host in ["a", "b"] {
            for ts in (120_000..=170_000).step_by(10_000) {
                clocks.heard(Origin::Pushed, &sample(host, ts), later);
            }
        }
        clocks.heard(Origin::Pushed, &sample("c", 170_000), later);
        assert_eq!(clocks.slowest(later), Slowest::At(110_000));
        clocks.taken();
        clocks.next_scan = None;
        assert_eq!(clocks.slowest(later), Slowest::At(170_000), "taken: their clocks stand");
    }

    #[test]
    fn zero_turns_it_off() {
        let mut clocks = SourceClocks::new(Duration::ZERO, true, Instant::now());
        clocks.heard(Origin::Pushed, &sample("a", 1_000), Instant::now());
        assert!(!clocks.enabled());
        assert_eq!(clocks.slowest(Instant::now()), Slowest::Free);
    }
}
