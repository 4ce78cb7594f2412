//! One partition of a group's keyed topic, as the instance that owns it runs it: the runtime's
//! [`Partition`] (an engine that keeps the partition's key groups, and the stage two of its
//! peer groups), fed the events forwarded to it, with time moved on by the progress of every
//! upstream partition. What is here is the Kafka exchange's side of it.
//!
//! Events reach a keyed partition from every input partition, interleaved as the forwarders
//! happen to send them, and again after a forwarder's partition moves to another instance (which
//! sends again what came after the last committed offset). So:
//! - an event is taken once: by upstream partition, only offsets past the last one taken;
//! - time is the least of the upstream partitions' progress (each upstream's newest event time,
//!   as its forwarder reports it), so no event is late because another partition ran ahead.
//!   An upstream partition its forwarder reports idle (read to its end, and quiet) does not
//!   hold time back once the broker confirms that it still ends where the forwarder had read
//!   it to ([`super::ends`]); when every one is idle, time moves to the newest of them.
//!
//! A keyed partition is also a stage one and a stage two of the fleet-wide rules
//! ([`vigil_engine::engine::stage_two`]): its engine summarises their windows, which go through
//! the topic to the stage two of their peer group in another keyed partition (or this one), and
//! it reports how far its engine has got to every partition, after the summaries.

use crate::store::{Fence, PartitionCheckpoint};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;
use vigil_engine::alert::Alert;
use vigil_engine::engine::stage_two::{Summary, TookSummary};
use vigil_engine::engine::{EngineConfig, EngineError};
use vigil_engine::event::{Event, LineDecoder, Millis};
use vigil_engine::runtime::Partition;
use vigil_lang::plan::RulePlan;
use vigil_lang::schema::Stream;

/// An upstream partition: an input topic's partition, as `topic/partition`.
pub type UpstreamId = String;

pub fn upstream_id(topic: &str, partition: i32) -> UpstreamId {
    format!("{topic}/{partition}")
}

/// How far one upstream partition has got, as its forwarders reported it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Upstream {
    /// The newest event time forwarded from it.
    pub ts: Option<Millis>,
    /// The last offset of it whose event this partition took.
    pub taken: Option<i64>,
    /// The newest owner's epoch heard from: reports of older owners are ignored.
    #[serde(default)]
    pub epoch: i64,
    /// Where it had been read to when it was reported idle (read to its end and quiet),
    /// without a word against since. Not kept in checkpoints: a restored partition waits for
    /// the next report.
    #[serde(skip)]
    pub idle_at: Option<i64>,
}

/// The input partitions' end offsets as the broker gave them ([`super::ends`]).
#[derive(Debug, Default)]
pub struct EndOffsets {
    /// When the request was sent: the answer says nothing of what was written after.
    pub asked: Option<Instant>,
    pub offsets: HashMap<UpstreamId, i64>,
}

/// Time held back by upstream partitions reported idle, until the broker says whether they
/// still end where they were read to: the end offsets must have been asked after `since`.
#[derive(Debug)]
struct Claim {
    /// How far time moves when they do.
    to: Millis,
    /// The idle partitions passed, and where each had been read to.
    idle: Vec<(UpstreamId, i64)>,
    since: Instant,
}

/// A forwarder's report on one upstream partition: what a progress record carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub upstream: UpstreamId,
    pub ts: Option<Millis>,
    pub idle: bool,
    /// The next offset of the upstream partition to read: with `idle`, where its end was.
    /// (Reports of builds without it are never taken as idle.)
    #[serde(default)]
    pub next: Option<i64>,
    /// The reporting owner's epoch of the upstream partition (raised by each owner's claim in
    /// the store).
    #[serde(default)]
    pub epoch: i64,
}

/// What a keyed partition keeps beside its engine's snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Kept {
    /// The next offset of the keyed partition to take.
    next_offset: i64,
    upstream: BTreeMap<UpstreamId, Upstream>,
    /// Where the stage two's state starts in the checkpoint's snapshot, after the engine's
    /// (none in checkpoints of builds without it).
    #[serde(default)]
    stage_two_at: Option<usize>,
}

/// A summary of a stage one's window, as the keyed topic carries it (postcard).
#[derive(Debug, Serialize, Deserialize)]
pub struct SummaryRecord {
    /// The keyed partition that sent it.
    pub source: i32,
    pub summary: Summary,
}

/// How far a keyed partition's stage one has got, as the keyed topic carries it (postcard):
/// it follows the summaries of every window before.
#[derive(Debug, Serialize, Deserialize)]
pub struct StageReport {
    pub source: i32,
    pub watermark: Millis,
}

/// What became of a forwarded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Took {
    Taken,
    /// Taken before: an offset at or before the last one taken of its upstream partition.
    Duplicate,
    /// Older than the partition's time: counted per rule ([`KeyedPartition::late_since`]).
    Late,
}

/// A record of the keyed topic that has been read and not yet taken: the thread that runs the
/// partition takes it ([`KeyedPartition::work`]), so that `--workers` threads share the
/// decoding and the engines' work.
enum Queued {
    /// A forwarder's progress reports, as JSON.
    Progress(Vec<u8>),
    /// A stage one's summary ([`SummaryRecord`]).
    Summary(Vec<u8>),
    /// A stage one's report ([`StageReport`]).
    Stage(Vec<u8>),
    /// A forwarded record: its upstream partition and offset there, its topic's stream and its
    /// payload, one event or (with `lines`) several as JSON lines.
    Event { upstream: UpstreamId, offset: i64, stream: Option<Stream>, line: Vec<u8>, lines: bool },
}

/// What became of the records a partition took since it was last asked: for the counters.
#[derive(Debug, Default, PartialEq)]
pub struct Tally {
    pub taken: u64,
    pub duplicates: u64,
    /// Summaries taken by stage two.
    pub summaries: u64,
    /// Forwarded events or progress records that cannot be read.
    pub unreadable: u64,
    /// Late events per rule.
    pub late: Vec<(String, u64)>,
}

/// Why a keyed partition's checkpoint cannot be written or read: its engines' state, or the
/// partition's own record of where it stands. Neither is retried: the same state fails again.
#[derive(Debug, thiserror::Error)]
pub enum PartitionStateError {
    #[error("the partition's positions: {0}")]
    Kept(#[from] serde_json::Error),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub struct KeyedPartition {
    pub fence: Fence,
    /// The partition's engine and the stage two of its peer groups.
    partition: Partition,
    /// Summaries for stage two to send, by keyed partition: the member sends them.
    outgoing: Vec<(i32, Vec<u8>)>,
    /// The engine's watermark as last reported to the stage twos.
    reported: Option<Millis>,
    kept: Kept,
    /// The engine's late counts per rule, as last reported.
    late_seen: BTreeMap<String, u64>,
    queued: Vec<Queued>,
    decoder: LineDecoder,
    tally: Tally,
    /// Time waiting for the broker's end offsets to pass idle upstream partitions.
    claim: Option<Claim>,
    /// Whether anything was taken since the last checkpoint.
    pub dirty: bool,
    pub out: Vec<Alert>,
}

/// The lateness given to a keyed partition's engine: its events are released by
/// [`KeyedPartition::advance`] only, never by the lateness.
const HELD: Millis = Millis::MAX / 4;

impl KeyedPartition {
    /// Reads forwarded events of the streams `catalog` declares.
    pub fn set_catalog(&mut self, catalog: &vigil_lang::schema::Catalog) {
        self.decoder.set_catalog(catalog);
    }

    /// A partition's engine over `plans`, restored from `checkpoint` when there is one (a
    /// checkpoint that cannot be used is logged and the partition starts empty).
    pub fn new(
        plans: Vec<RulePlan>,
        config: &EngineConfig,
        fence: Fence,
        checkpoint: Option<&PartitionCheckpoint>,
    ) -> Self {
        let config = EngineConfig { lateness_ms: HELD, clock: None, ..config.clone() };
        let mut p = KeyedPartition {
            fence,
            partition: Partition::new(plans, config, true),
            outgoing: Vec::new(),
            reported: None,
            kept: Kept::default(),
            late_seen: BTreeMap::new(),
            queued: Vec::new(),
            decoder: LineDecoder::default(),
            tally: Tally::default(),
            claim: None,
            dirty: false,
            out: Vec::new(),
        };
        if let Some(c) = checkpoint {
            if let Err(e) = p.restore(c) {
                tracing::warn!(partition = p.fence.partition, error = %e, "the partition's checkpoint cannot be used; it starts empty");
                p.kept = Kept::default();
            }
        }
        p
    }

    fn restore(&mut self, c: &PartitionCheckpoint) -> Result<(), PartitionStateError> {
        self.kept = serde_json::from_str(&c.state)?;
        self.partition.restore(&c.snapshot, self.kept.stage_two_at)?;
        Ok(())
    }

    /// The partition's checkpoint, with every record read so far taken: the next offset it
    /// keeps is past them.
    pub fn checkpoint(&mut self) -> Result<PartitionCheckpoint, PartitionStateError> {
        self.take_queued();
        let (snapshot, stage_two_at) = self.partition.snapshot().map_err(EngineError::from)?;
        self.kept.stage_two_at = stage_two_at;
        let state = serde_json::to_string(&self.kept)?;
        Ok(PartitionCheckpoint { snapshot, state })
    }

    /// Feeds history, in time order, to the partition's engine ([`crate::history::warm`]) and
    /// moves its time to `to`: what it raises goes to `out`. The fleet-wide rules' summaries of
    /// it are dropped: history does not reach the stage twos, which judge live windows.
    pub fn take_history(&mut self, events: Vec<Event>, to: Option<Millis>, max_bytes: usize, out: &mut Vec<Alert>) {
        let engine = self.partition.engine_mut();
        for event in events {
            engine.push(event, out);
        }
        if let Some(to) = to.filter(|t| engine.watermark().is_none_or(|w| *t > w)) {
            engine.release_to(to, out);
        }
        drop(engine.take_summaries());
        engine.enforce_budget(max_bytes, out);
        self.dirty = true;
    }

    /// The next offset of the keyed partition to read.
    pub fn next_offset(&self) -> i64 {
        self.kept.next_offset
    }

    /// Whether the record at `offset` is new to this partition (an instance that restored a
    /// checkpoint may be handed records from before it again); it counts as read.
    pub fn fresh(&mut self, offset: i64) -> bool {
        if offset < self.kept.next_offset {
            return false;
        }
        self.kept.next_offset = offset + 1;
        self.dirty = true;
        true
    }

    /// Queues a forwarder's progress record, to be taken by [`KeyedPartition::work`].
    pub fn queue_progress(&mut self, json: &[u8]) {
        self.queued.push(Queued::Progress(json.to_vec()));
    }

    /// Queues a record forwarded from `upstream` (where it was at `offset`), to be taken by
    /// [`KeyedPartition::work`]: one event, or with `lines` several as JSON lines.
    pub fn queue_event(&mut self, upstream: &str, offset: i64, stream: Option<Stream>, line: &[u8], lines: bool) {
        let line = line.to_vec();
        self.queued.push(Queued::Event { upstream: upstream.to_string(), offset, stream, line, lines });
    }

    /// How many records are queued.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Queues a stage one's summary ([`SummaryRecord`]), to be taken by
    /// [`KeyedPartition::work`].
    pub fn queue_summary(&mut self, bytes: &[u8]) {
        self.queued.push(Queued::Summary(bytes.to_vec()));
    }

    /// Queues a stage one's report ([`StageReport`]), to be taken by [`KeyedPartition::work`].
    pub fn queue_stage_report(&mut self, bytes: &[u8]) {
        self.queued.push(Queued::Stage(bytes.to_vec()));
    }

    /// Takes the queued records, then moves time as far as `inputs` let it (past idle ones as
    /// far as `ends` confirm), then stage two as far as every stage one has reported: alerts go
    /// to `out`, summaries to the outgoing ones.
    pub fn work(&mut self, inputs: &[UpstreamId], ends: &EndOffsets) {
        self.take_queued();
        self.advance(inputs, ends);
        self.summarise();
        self.partition.judge(&mut self.out);
    }

    /// The engine's summaries as records, by the keyed partition of their operator and peer
    /// group.
    fn summarise(&mut self) {
        for (partition, summary) in self.partition.summaries_by_partition() {
            let record = SummaryRecord { source: self.fence.partition, summary };
            match postcard::to_stdvec(&record) {
                Ok(bytes) => self.outgoing.push((partition, bytes)),
                Err(e) => tracing::error!(error = %e, "a summary cannot be encoded"),
            }
        }
    }

    /// The summaries to send, by keyed partition, in their order.
    pub fn take_outgoing(&mut self) -> Vec<(i32, Vec<u8>)> {
        std::mem::take(&mut self.outgoing)
    }

    /// A report for every stage two of how far this partition's stage one has got, when it
    /// got further since the last one (none when the rules have no stage two).
    pub fn stage_report(&mut self) -> Option<Vec<u8>> {
        let watermark = self.partition.engine().watermark().filter(|_| self.partition.judges())?;
        if self.reported.is_some_and(|r| r >= watermark) {
            return None;
        }
        self.reported = Some(watermark);
        postcard::to_stdvec(&StageReport { source: self.fence.partition, watermark }).ok()
    }

    fn take_queued(&mut self) {
        let queued = std::mem::take(&mut self.queued);
        for q in queued {
            match q {
                Queued::Progress(json) => match serde_json::from_slice::<Vec<Progress>>(&json) {
                    Ok(reports) => self.progress(reports),
                    Err(e) => {
                        self.tally.unreadable += 1;
                        tracing::warn!(error = %e, "a progress record that cannot be read");
                    }
                },
                Queued::Summary(bytes) => match postcard::from_bytes::<SummaryRecord>(&bytes) {
                    Ok(r) => match self.partition.take_summary(r.source, r.summary) {
                        TookSummary::Taken => self.tally.summaries += 1,
                        TookSummary::Duplicate => self.tally.duplicates += 1,
                        TookSummary::Unknown => tracing::debug!(source = r.source, "a summary of a rule not run here"),
                    },
                    Err(e) => {
                        self.tally.unreadable += 1;
                        tracing::warn!(error = %e, "a summary that cannot be read");
                    }
                },
                Queued::Stage(bytes) => match postcard::from_bytes::<StageReport>(&bytes) {
                    Ok(r) => self.partition.report(r.source, r.watermark),
                    Err(e) => {
                        self.tally.unreadable += 1;
                        tracing::warn!(error = %e, "a stage report that cannot be read");
                    }
                },
                Queued::Event { upstream, offset, stream, line, lines } => {
                    let events = self.decode_record(&line, stream, lines);
                    if events.is_empty() {
                        continue;
                    }
                    for took in self.take(upstream, offset, events) {
                        match took {
                            Took::Taken => self.tally.taken += 1,
                            Took::Duplicate => self.tally.duplicates += 1,
                            Took::Late => {
                                self.tally.taken += 1;
                                let late = self.late_since();
                                self.tally.late.extend(late);
                            }
                        }
                    }
                }
            }
        }
    }

    /// What became of the records taken since the last call.
    pub fn tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    /// The events of a forwarded record: one, or with `lines` one per line; those that cannot
    /// be read are counted and logged.
    fn decode_record(&mut self, payload: &[u8], stream: Option<Stream>, lines: bool) -> Vec<Event> {
        let pieces: Vec<&[u8]> = match lines {
            true => payload.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect(),
            false => vec![payload],
        };
        let mut events = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match self.decoder.decode_bytes(piece, stream) {
                Ok(event) => events.push(event),
                Err(e) => {
                    self.tally.unreadable += 1;
                    tracing::warn!(error = %e, "a forwarded event that cannot be read");
                }
            }
        }
        events
    }

    /// Takes the events of a forwarded record, unless this partition took it (or a later one
    /// of its upstream partition) already; what became of each.
    fn take(&mut self, upstream: UpstreamId, offset: i64, events: Vec<Event>) -> Vec<Took> {
        let u = self.kept.upstream.entry(upstream).or_default();
        if u.taken.is_some_and(|t| offset <= t) {
            return vec![Took::Duplicate; events.len()];
        }
        u.taken = Some(offset);
        u.idle_at = None;
        let newest = events.iter().map(|e| e.ts).max();
        u.ts = u.ts.max(newest);
        let mut took = Vec::with_capacity(events.len());
        for event in events {
            let ts = event.ts;
            if self.partition.engine_mut().push(event, &mut self.out) {
                took.push(Took::Taken);
                continue;
            }
            tracing::debug!(
                partition = self.fence.partition,
                offset,
                ts,
                watermark = ?self.partition.engine().watermark(),
                upstream = ?self.kept.upstream,
                "a forwarded event is late"
            );
            took.push(Took::Late);
        }
        took
    }

    /// The late events of each rule since the last call.
    fn late_since(&mut self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (rule, n) in &self.partition.engine().stats().late_by_rule {
            let before = self.late_seen.insert(rule.clone(), *n).unwrap_or(0);
            if *n > before {
                out.push((rule.clone(), n - before));
            }
        }
        out
    }

    /// Takes a forwarder's progress report. Event times only move forward. Whether the
    /// upstream partition is idle is as the latest report of its newest owner says: a
    /// forwarder that took the partition over may have read it again from an older offset, and
    /// still be right that it has read it to its end. A report from an instance that lost the
    /// partition and has not noticed yet (paused past its session timeout) carries an older
    /// epoch and is ignored.
    fn progress(&mut self, reports: Vec<Progress>) {
        for r in reports {
            let u = self.kept.upstream.entry(r.upstream).or_default();
            if r.epoch < u.epoch {
                continue;
            }
            u.epoch = r.epoch;
            u.ts = u.ts.max(r.ts);
            u.idle_at = r.next.filter(|_| r.idle);
        }
    }

    /// How far time may move with every upstream partition in `inputs` holding it back: the
    /// least progress (less a millisecond, which may get more events); none while one has
    /// reported no event.
    fn held_target(&self, inputs: &[UpstreamId]) -> Option<Millis> {
        let mut least = None::<Millis>;
        for id in inputs {
            let ts = self.kept.upstream.get(id)?.ts?;
            least = Some(least.map_or(ts, |l| l.min(ts)));
        }
        least.map(|l| l.saturating_sub(1))
    }

    /// How far time could move if the upstream partitions reported idle did not hold it back:
    /// the least progress of the others (less a millisecond), or when all are idle the newest;
    /// with the idle ones and where each was read to. None while one has reported nothing, or
    /// one not idle has reported no event.
    fn idle_target(&self, inputs: &[UpstreamId]) -> Option<(Millis, Vec<(UpstreamId, i64)>)> {
        let (mut active, mut newest, mut idle) = (None::<Millis>, None::<Millis>, Vec::new());
        for id in inputs {
            let u = self.kept.upstream.get(id)?;
            newest = newest.max(u.ts);
            match u.idle_at {
                Some(at) => idle.push((id.clone(), at)),
                None => {
                    let ts = u.ts?;
                    active = Some(active.map_or(ts, |a| a.min(ts)));
                }
            }
        }
        let to = match active {
            Some(a) => a.saturating_sub(1),
            None => newest?,
        };
        Some((to, idle))
    }

    /// Moves time as far as `inputs` let it: alerts go to `out`. Past upstream partitions
    /// reported idle only in two steps: a claim of how far, then end offsets asked after it
    /// that show each still ends where it was read to (else the claim is dropped, and made
    /// again from what has been reported since).
    fn advance(&mut self, inputs: &[UpstreamId], ends: &EndOffsets) {
        let mut target = self.held_target(inputs);
        if let Some(claim) = &self.claim {
            if ends.asked.is_some_and(|asked| asked >= claim.since) {
                let still = |(id, at): &(UpstreamId, i64)| {
                    let idle = self.kept.upstream.get(id).is_some_and(|u| u.idle_at == Some(*at));
                    idle && ends.offsets.get(id).is_some_and(|end| end <= at)
                };
                if claim.idle.iter().all(still) {
                    target = target.max(Some(claim.to));
                }
                self.claim = None;
            }
        }
        let now = self.watermark().max(target);
        if self.claim.is_none() {
            if let Some((to, idle)) = self.idle_target(inputs).filter(|(to, _)| now.is_none_or(|w| *to > w)) {
                self.claim = Some(Claim { to, idle, since: Instant::now() });
            }
        }
        if let Some(target) = target {
            if self.watermark().is_none_or(|w| target > w) {
                self.partition.engine_mut().release_to(target, &mut self.out);
                self.dirty = true;
            }
        }
    }

    /// Whether the partition waits for end offsets asked from now on.
    pub fn wants_ends(&self) -> bool {
        self.claim.is_some()
    }

    pub fn watermark(&self) -> Option<Millis> {
        self.partition.engine().watermark()
    }

    pub fn reload(&mut self, plans: Vec<RulePlan>) -> Vec<String> {
        self.dirty = true;
        self.partition.reload(plans)
    }

    pub fn state_bytes(&self) -> usize {
        self.partition.state_bytes()
    }

    /// Keeps the partition's state under `max_bytes` ([`Partition::enforce_budget`]); the
    /// self-alerts that say what was dropped go with the partition's alerts. Returns the
    /// estimate after.
    pub fn enforce_budget(&mut self, max_bytes: usize) -> usize {
        self.partition.enforce_budget(max_bytes, &mut self.out)
    }

    /// Groups, partial matches and active alerts by rule.
    pub fn live_keys(&self) -> BTreeMap<String, usize> {
        self.partition.live_keys()
    }

    /// Keys dropped so far by the state limits, by rule and reason.
    pub fn evicted(&self) -> BTreeMap<(String, &'static str), u64> {
        self.partition.evicted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition() -> KeyedPartition {
        let fence = Fence { group: "g".into(), partition: 0, epoch: 1 };
        KeyedPartition::new(Vec::new(), &EngineConfig::default(), fence, None)
    }

    /// A report on `upstream`; idle when read to `idle_at`.
    fn report(upstream: &str, ts: Option<Millis>, idle_at: Option<i64>) -> Progress {
        Progress { upstream: upstream.into(), ts, idle: idle_at.is_some(), next: idle_at, epoch: 1 }
    }

    /// End offsets asked now.
    fn ends(offsets: &[(&str, i64)]) -> EndOffsets {
        let offsets = offsets.iter().map(|(id, o)| (id.to_string(), *o)).collect();
        EndOffsets { asked: Some(Instant::now()), offsets }
    }

    #[test]
    fn time_is_the_least_progress_of_the_upstream_partitions_not_idle() {
        let mut p = partition();
        let inputs = vec!["t/0".to_string(), "t/1".to_string()];
        let none = EndOffsets::default();
        p.progress(vec![report("t/0", Some(100), None)]);
        p.advance(&inputs, &none);
        assert_eq!(p.watermark(), None, "t/1 has reported nothing");
        p.progress(vec![report("t/1", Some(50), None)]);
        p.advance(&inputs, &none);
        assert_eq!(p.watermark(), Some(49));
        p.progress(vec![report("t/1", Some(40), None)]);
        p.advance(&inputs, &none);
        assert_eq!(p.watermark(), Some(49), "time does not go back");
        assert!(!p.wants_ends());

        let asked_before = ends(&[("t/1", 7)]);
        p.progress(vec![report("t/1", Some(45), Some(7))]);
        p.advance(&inputs, &asked_before);
        assert_eq!(p.watermark(), Some(49), "idle, not yet confirmed by the broker");
        assert!(p.wants_ends());
        p.advance(&inputs, &asked_before);
        assert_eq!(p.watermark(), Some(49), "end offsets asked before the claim confirm nothing");
        p.advance(&inputs, &ends(&[("t/1", 9)]));
        assert_eq!(p.watermark(), Some(49), "written to since it was read to its end: not idle");
        assert!(p.wants_ends(), "a new claim waits for the next answer");
        p.advance(&inputs, &ends(&[("t/1", 7)]));
        assert_eq!(p.watermark(), Some(99), "an idle partition does not hold time back");

        p.progress(vec![report("t/0", Some(100), Some(3))]);
        p.advance(&inputs, &none);
        p.advance(&inputs, &ends(&[("t/0", 3)]));
        assert_eq!(p.watermark(), Some(99), "an end offset missing confirms nothing");
        p.advance(&inputs, &ends(&[("t/0", 3), ("t/1", 7)]));
        assert_eq!(p.watermark(), Some(100), "all idle: the newest");

        p.progress(vec![Progress { upstream: "t/0".into(), ts: Some(100), idle: false, next: None, epoch: 2 }]);
        p.progress(vec![report("t/0", Some(100), Some(3))]);
        assert!(p.kept.upstream["t/0"].idle_at.is_none(), "a former owner's report is ignored");
    }

    #[test]
    fn an_idle_partition_that_takes_an_event_holds_time_again() {
        let mut p = partition();
        let inputs = vec!["t/0".to_string(), "t/1".to_string()];
        p.progress(vec![report("t/0", Some(100), None), report("t/1", Some(50), Some(4))]);
        p.advance(&inputs, &EndOffsets::default());
        let event = vigil_engine::event::decode(r#"{"stream":"metric","ts":60,"host":"h","name":"m","value":1}"#, None)
            .expect("event");
        assert_eq!(p.take("t/1".into(), 4, vec![event]), [Took::Taken]);
        p.advance(&inputs, &ends(&[("t/1", 4)]));
        assert_eq!(p.watermark(), Some(59), "the claim is dropped: t/1 is no longer idle at 4");
    }

    #[test]
    fn an_event_is_taken_once_by_upstream_offset() {
        let mut p = partition();
        let event = |ts| {
            vigil_engine::event::decode(
                &format!(r#"{{"stream":"metric","ts":{ts},"host":"h","name":"m","value":1}}"#),
                None,
            )
            .expect("event")
        };
        assert!(p.fresh(7));
        assert!(!p.fresh(7), "a record read again");
        assert_eq!(p.take("t/0".into(), 3, vec![event(10)]), [Took::Taken]);
        assert_eq!(p.take("t/0".into(), 3, vec![event(20)]), [Took::Duplicate]);
        assert_eq!(p.take("t/0".into(), 2, vec![event(30)]), [Took::Duplicate]);
        assert_eq!(p.kept.upstream["t/0"].ts, Some(10), "offsets 3 and 2 again are not taken");
        assert_eq!(p.take("t/0".into(), 4, vec![event(40), event(35)]), [Took::Taken, Took::Taken]);
        assert_eq!(p.kept.upstream["t/0"], Upstream { ts: Some(40), taken: Some(4), idle_at: None, epoch: 0 });
        let restored = KeyedPartition::new(
            Vec::new(),
            &EngineConfig::default(),
            p.fence.clone(),
            Some(&p.checkpoint().expect("checkpoint")),
        );
        assert_eq!(restored.kept, p.kept);
        assert_eq!(restored.next_offset(), 8);
    }
}
