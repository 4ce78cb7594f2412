//! The way out of a member's keyed partitions: the service's writer, as for a single instance.
//! A partition hands its alerts, then its checkpoint, under its claim's fence; the writer
//! stores them in that order (through its spool while the store fails) and tells the loop what
//! became of each checkpoint. The loop never waits on the store for them: when the writer's
//! queue is full, a partition keeps its alerts and its checkpoint waits for a later round.
//!
//! Nothing is lost if the member dies before the writer has stored them: the partition's last
//! stored checkpoint is from before them, and its next owner derives them again from the keyed
//! topic.

use super::keyed::KeyedPartition;
use super::{count, Ctx, Looping, COMMIT_EVERY};
use crate::engine_loop::{Output, PartitionSave};
use crate::store::Fence;
use crate::writer::Settled;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a checkpoint waits for the summaries sent before it, when they were not all
/// delivered: as long as the forwarder's commits, which wait for them too.
const UNDELIVERED_WAIT: Duration = COMMIT_EVERY;
/// How long a round of the loop checkpoints keyed partitions, at least one: each turn begins
/// with a wait for the summaries sent to be delivered, so small partitions go together.
const CHECKPOINT_TURN: Duration = Duration::from_millis(50);

/// The keyed partitions whose input is paused in Kafka because they hold too many alerts the
/// writer had no room for (`--kafka-max-held-alerts`): the store is down and the spool full.
/// A single instance's engine waits on the writer then, and its sources with it; a member keeps
/// polling (its claims, its other partitions, the group's heartbeats) and pauses the
/// partitions that fill up instead, until they have handed every alert on. Kafka keeps what
/// they have not read. The bound is soft: a paused partition still takes the records it had
/// read, and time moving on may close its windows.
#[derive(Default)]
pub(super) struct HeldBack {
    /// By partition, the claim it was paused under. A partition no longer owned under it (let
    /// go, or claimed again: the claim pauses and resumes it) is forgotten here.
    paused: BTreeMap<i32, Fence>,
}

/// What [`HeldBack::follow`] found to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Turns {
    pub pause: Vec<i32>,
    pub resume: Vec<i32>,
}

impl HeldBack {
    /// Pauses the partitions that hold `most` alerts or more, and resumes the paused ones
    /// that hold none now. Those `starting` are left alone: their claim holds them paused until
    /// they are sought, and then resumes them.
    pub(super) fn follow(&mut self, keyed: &BTreeMap<i32, KeyedPartition>, starting: &[i32], most: usize) -> Turns {
        let mut turns = Turns::default();
        self.paused.retain(|n, fence| match keyed.get(n) {
            Some(p) if p.fence == *fence => {
                let empty = p.out.is_empty();
                if empty {
                    turns.resume.push(*n);
                }
                !empty
            }
            _ => false,
        });
        for (n, p) in keyed {
            if p.out.len() >= most && !self.paused.contains_key(n) && !starting.contains(n) {
                self.paused.insert(*n, p.fence.clone());
                turns.pause.push(*n);
            }
        }
        turns
    }

    /// Keeps `partitions` paused, to be resumed again next time: their resume failed.
    fn resume_failed(&mut self, partitions: &[i32], keyed: &BTreeMap<i32, KeyedPartition>) {
        for n in partitions {
            if let Some(p) = keyed.get(n) {
                self.paused.insert(*n, p.fence.clone());
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.paused.len()
    }
}

/// Pauses and resumes the keyed topic's partitions in `consumer` as `held` finds.
pub(super) fn hold_back(
    held: &mut HeldBack,
    consumer: &BaseConsumer<Ctx>,
    keyed: &BTreeMap<i32, KeyedPartition>,
    starting: &[i32],
    most: usize,
    telemetry: &crate::telemetry::Telemetry,
) {
    let turns = held.follow(keyed, starting, most);
    let topic = &consumer.context().keyed_topic;
    for (partitions, pause) in [(&turns.pause, true), (&turns.resume, false)] {
        if partitions.is_empty() {
            continue;
        }
        let mut list = TopicPartitionList::new();
        for p in partitions {
            list.add_partition(topic, *p);
        }
        let done = if pause { consumer.pause(&list) } else { consumer.resume(&list) };
        match done {
            Err(e) if pause => tracing::error!(?partitions, error = %e, "cannot pause keyed partitions"),
            Err(e) => {
                tracing::error!(?partitions, error = %e, "cannot resume keyed partitions; trying again");
                held.resume_failed(partitions, keyed);
            }
            Ok(()) if pause => tracing::warn!(
                ?partitions,
                most,
                "keyed partitions paused: each holds the most alerts the writer has no room for (the store is down and the spool full)"
            ),
            Ok(()) => tracing::info!(?partitions, "keyed partitions resumed: the writer took their alerts"),
        }
    }
    telemetry.group.held_back_partitions.set(held.len() as i64);
}

/// Whether a keyed partition's checkpoint went to the writer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Handed {
    Yes,
    /// Not now: its alerts are not handed yet, the writer's queue is full, or the snapshot
    /// failed. It is tried again.
    Later,
}

impl Looping {
    /// Checkpoints the keyed partitions changed since their last checkpoint, in turns of
    /// [`CHECKPOINT_TURN`] a round, so that the loop stops for one large partition's snapshot at
    /// a time rather than for all it owns (at full history, 250,000 series are 3.2 GB: 7 s of
    /// snapshots). A pass begins when [`crate::pacing::CheckpointPacing`] says one is due.
    pub(super) fn checkpoint_in_turn(&mut self) {
        let now = Instant::now();
        if self.to_checkpoint.is_empty() {
            let stored = self.m.health.checkpoint_stored();
            if !self.pacing.due(now, stored) {
                return;
            }
            self.pacing.begin(now, stored);
            let owned = self.keyed.context().owned.lock().expect("owned");
            self.to_checkpoint = owned.keyed.iter().filter(|(_, p)| p.dirty).map(|(n, _)| *n).collect();
        }
        if self.undelivered_until.is_some_and(|until| now < until) {
            return;
        }
        let ctx = self.keyed.context();
        let mut owned = ctx.owned.lock().expect("owned");
        // A partition let go meanwhile, or checkpointed on its way out, is done.
        while self.to_checkpoint.front().is_some_and(|n| !owned.keyed.get(n).is_some_and(|p| p.dirty)) {
            self.to_checkpoint.pop_front();
        }
        let Some(partition) = self.to_checkpoint.front().copied() else { return };
        // The summaries sent so far are delivered first: they are not sent again once the
        // checkpoint after them is stored. Until they are, the partitions keep their turn.
        if !owned.forwarder.delivered() {
            tracing::debug!(partition, "the checkpoint waits until the summaries sent are delivered");
            self.undelivered_until = Some(now + UNDELIVERED_WAIT);
            return;
        }
        // After one look at the deliveries, partitions are checkpointed until their snapshots
        // take [`CHECKPOINT_TURN`]: small ones all at once, a large one alone.
        let started = Instant::now();
        while let Some(partition) = self.to_checkpoint.pop_front() {
            if let Some(p) = owned.keyed.get_mut(&partition).filter(|p| p.dirty) {
                // One that cannot go now stays changed, for the next pass.
                if self.hand_checkpoint(p) == Handed::Yes {
                    p.dirty = false;
                }
            }
            if started.elapsed() >= CHECKPOINT_TURN {
                break;
            }
        }
        self.pacing.snapshot_took(started.elapsed());
    }

    /// Hands a partition's alerts to the writer, unless its queue is full (they stay for the
    /// next round).
    pub(super) fn hand_alerts(&self, p: &mut KeyedPartition) {
        if p.out.is_empty() {
            return;
        }
        if let Ok(room) = self.m.out.try_reserve() {
            room.send(fenced_alerts(p));
        }
    }

    /// Hands a partition's checkpoint to the writer, behind its alerts. Taking the checkpoint
    /// takes the records read for the partition first, which may raise alerts: those go to the
    /// writer just before it. So the snapshot is taken only once the queue has room for both.
    pub(super) fn hand_checkpoint(&self, p: &mut KeyedPartition) -> Handed {
        self.hand_alerts(p);
        if !p.out.is_empty() {
            return Handed::Later;
        }
        let Ok(mut room) = self.m.out.try_reserve_many(2) else { return Handed::Later };
        let checkpoint = p.checkpoint();
        count(&self.m.telemetry, p.tally());
        let checkpoint = match checkpoint {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(partition = p.fence.partition, error = %e, "cannot snapshot the partition");
                return Handed::Later;
            }
        };
        if !p.out.is_empty() {
            room.next().expect("two places reserved").send(fenced_alerts(p));
        }
        let save = PartitionSave { fence: p.fence.clone(), checkpoint, next_offset: p.next_offset() };
        room.next().expect("two places reserved").send(Output::PartitionCheckpoint(save));
        Handed::Yes
    }

    /// Takes what the writer tells of the checkpoints and alerts handed to it: a stored
    /// checkpoint's offset is committed (the keyed topic's lag is read from it); a partition
    /// another instance claimed is let go, whether it runs here or is leaving.
    pub(super) fn settle(&mut self) {
        let ctx = self.keyed.context().clone();
        let mut fenced = Vec::new();
        let mut owned = ctx.owned.lock().expect("owned");
        while let Ok(settled) = self.m.settled.try_recv() {
            match settled {
                Settled::Saved { fence, next_offset } => {
                    if owned.keyed.get(&fence.partition).is_some_and(|p| p.fence == fence) {
                        commit_keyed(&self.keyed, &ctx.keyed_topic, fence.partition, next_offset);
                    } else {
                        tracing::info!(partition = fence.partition, "keyed partition handed over with its checkpoint");
                    }
                }
                Settled::Fenced(fence) => {
                    if owned.keyed.get(&fence.partition).is_some_and(|p| p.fence == fence) {
                        fenced.push(fence.partition);
                    }
                    owned.leaving.retain(|l| l.partition.fence != fence);
                }
            }
        }
        ctx.drop_fenced(&mut owned, &fenced);
    }
}

/// A partition's alerts as the writer takes them, detected now.
fn fenced_alerts(p: &mut KeyedPartition) -> Output {
    let now = vigil_engine::event::now_ms();
    let mut alerts = std::mem::take(&mut p.out);
    for a in &mut alerts {
        a.detected_at = now;
    }
    Output::FencedAlerts(p.fence.clone(), alerts)
}

/// Commits a keyed partition's offset: where its stored checkpoint resumes.
fn commit_keyed(consumer: &BaseConsumer<Ctx>, topic: &str, partition: i32, offset: i64) {
    let mut list = TopicPartitionList::new();
    let _ = list.add_partition_offset(topic, partition, Offset::Offset(offset));
    if let Err(e) = consumer.commit(&list, CommitMode::Async) {
        tracing::warn!(partition, error = %e, "cannot commit the keyed partition's offset");
    }
}
