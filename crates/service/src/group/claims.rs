//! How partitions change hands. Kafka's rebalance callbacks only note what changed and do no
//! store I/O: an assigned partition is paused and waits in [`Owned::pending`] for its claim; a
//! revoked keyed partition moves to [`Owned::leaving`] with its state. The member's loop then
//! claims what was assigned, one attempt at a time through the
//! [`StoreGate`](super::gate::StoreGate), and hands what left to the writer ([`super::out`]),
//! so that a store outage during a rebalance delays the partitions that changed hands only, and
//! the consumers keep polling:
//!
//! - a pending partition is claimed (its epoch raised; a keyed partition's checkpoint read and
//!   restored), then sought to where its new owner takes over and resumed;
//! - a leaving keyed partition's alerts and checkpoint go to the writer, so that the next owner
//!   derives little again; if that cannot be done in [`LEAVING_FOR`], it is dropped and the next
//!   owner derives everything since the last checkpoint.
//!
//! Kafka may also hand a member a partition from a rebalance it has already missed: a member
//! stopped (`SIGSTOP`) while a rebalance was under way is served the stale assignment when it
//! goes on, claims the partition (raising its epoch over the true owner's), and learns a moment
//! later that it was lost. The true owner is then fenced while Kafka still gives it the
//! partition: its keyed partition's writes fail, its input partition's progress reports are
//! ignored (time waits for them in every keyed partition). So the loop checks, every survey,
//! that what Kafka assigns it is what it holds in the store; a partition found fenced twice in
//! a row (past the time a stale member needs to learn that it is out) is claimed again.

use super::keyed::KeyedPartition;
use super::out::Handed;
use super::{Looping, Owned, Shared};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use vigil_engine::engine::{EngineConfig, Shard};

/// How long a revoked keyed partition may wait to hand its checkpoint to the writer (the
/// summaries sent are not delivered, or the writer's queue stays full) before it is dropped.
const LEAVING_FOR: Duration = Duration::from_secs(30);
/// How long a claimed partition's seek is tried again (librdkafka refuses to seek a partition
/// whose fetcher has not started yet) before it is resumed where the consumer stands: the
/// group's committed offset, which is never past the partition's checkpoint.
const SEEK_FOR: Duration = Duration::from_secs(10);

/// A partition Kafka assigned, paused until the loop claims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pending {
    pub topic: String,
    pub partition: i32,
    /// For an input partition: the group's committed offset, where to read it from.
    pub from: Option<i64>,
}

/// A claimed partition, still paused, whose seek to where its new owner takes over failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Starting {
    pub topic: String,
    pub partition: i32,
    pub offset: Option<i64>,
    pub since: Instant,
}

/// A revoked keyed partition whose checkpoint is still to be handed to the writer.
pub(super) struct Leaving {
    pub partition: KeyedPartition,
    pub since: Instant,
}

/// Partitions Kafka assigns to this member that the store says another member holds, as found
/// by the last survey: claimed again when found so twice in a row.
#[derive(Debug, Default)]
pub(super) struct Suspects {
    keyed: BTreeSet<i32>,
    input: BTreeSet<(String, i32)>,
}

impl Shared {
    /// The name under which an input partition's epoch is kept in the store.
    pub(super) fn input_name(&self, topic: &str) -> String {
        format!("{} {}", self.group, topic)
    }

    /// Notes partitions Kafka assigned (called in the rebalance callback): each waits for its
    /// claim, paused. `committed` has the group's committed offsets.
    pub(super) fn note_assigned(&self, list: &TopicPartitionList, committed: &TopicPartitionList) {
        let mut owned = self.owned.lock().expect("owned");
        for e in list.elements() {
            self.telemetry.group.rebalances.with_label_values(&["assigned"]).inc();
            let from = committed.find_partition(e.topic(), e.partition()).and_then(|c| c.offset().to_raw());
            let pending =
                Pending { topic: e.topic().to_string(), partition: e.partition(), from: from.filter(|o| *o >= 0) };
            if !owned.pending.contains(&pending) {
                owned.pending.push(pending);
            }
        }
    }

    /// Takes a keyed partition over: its epoch raised, its state restored from the store, and
    /// whether there was a checkpoint. One attempt; none while the store fails.
    fn claim_keyed(&self, partition: i32, plans: &[vigil_lang::plan::RulePlan]) -> Option<(KeyedPartition, bool)> {
        let started = Instant::now();
        let op = self.store.claim_partition(&self.group, partition);
        let (fence, checkpoint) =
            self.gate.attempt(&self.runtime, &self.telemetry, &self.store, "claim_partition", op)?;
        let shard = Shard { index: partition as usize, count: self.keyed_partitions as usize };
        let config = EngineConfig { shard, ..self.engine.clone() };
        let mut p = KeyedPartition::new(plans.to_vec(), &config, fence, checkpoint.as_ref());
        p.set_catalog(&self.catalog.lock().expect("catalog"));
        let bytes = checkpoint.as_ref().map_or(0, |c| c.snapshot.len() + c.state.len());
        self.telemetry.group.restore_seconds.observe(started.elapsed().as_secs_f64());
        self.telemetry.group.restore_bytes.inc_by(bytes as u64);
        tracing::info!(
            partition,
            epoch = p.fence.epoch,
            restored_bytes = bytes,
            next_offset = p.next_offset(),
            ms = started.elapsed().as_millis() as u64,
            "keyed partition taken over"
        );
        Some((p, checkpoint.is_some()))
    }

    /// Raises an input partition's epoch in the store: one attempt; none while it fails.
    fn claim_input(&self, topic: &str, partition: i32) -> Option<i64> {
        let name = self.input_name(topic);
        let op = self.store.claim_partition(&name, partition);
        let (fence, _) = self.gate.attempt(&self.runtime, &self.telemetry, &self.store, "claim_partition", op)?;
        Some(fence.epoch)
    }
}

/// Seeks an assigned, paused partition to `offset` (its beginning when 0 or unknown) and
/// resumes it; false, leaving it paused, when the seek fails.
fn start_at(consumer: &BaseConsumer<super::Ctx>, topic: &str, partition: i32, offset: Option<i64>) -> bool {
    let to = match offset {
        Some(o) if o > 0 => Offset::Offset(o),
        _ => Offset::Beginning,
    };
    if let Err(e) = consumer.seek(topic, partition, to, Duration::from_secs(10)) {
        tracing::debug!(%topic, partition, error = %e, "cannot seek the partition taken over yet");
        return false;
    }
    resume(consumer, topic, partition, true);
    true
}

/// Pauses (or resumes) one partition: local to the consumer.
fn resume(consumer: &BaseConsumer<super::Ctx>, topic: &str, partition: i32, go: bool) {
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, partition);
    let done = if go { consumer.resume(&list) } else { consumer.pause(&list) };
    if let Err(e) = done {
        tracing::warn!(%topic, partition, go, error = %e, "cannot pause or resume the partition");
    }
}

impl Looping {
    /// Claims the partitions that wait for it, in the order Kafka assigned them; those the
    /// store cannot claim now wait for a later round.
    pub(super) fn claim_pending(&mut self) {
        let ctx = self.input.context().clone();
        let mut owned = ctx.owned.lock().expect("owned");
        if !owned.starting.is_empty() {
            let starting = std::mem::take(&mut owned.starting);
            owned.starting = starting.into_iter().filter(|s| !self.start(&ctx, s)).collect();
        }
        if owned.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut owned.pending);
        for p in pending {
            if ctx.gate.closed() || !self.claim(&ctx, &mut owned, &p) {
                owned.pending.push(p);
            }
        }
        ctx.gauges(&owned);
    }

    /// Claims one pending partition; false when the store could not be written.
    fn claim(&self, ctx: &Shared, owned: &mut Owned, p: &Pending) -> bool {
        if p.topic == ctx.keyed_topic {
            let Some((k, restored)) = ctx.claim_keyed(p.partition, &owned.plans) else { return false };
            if !restored && self.m.warm.is_some() {
                // Paused until its warm start hands it back ([`super::warming`]).
                owned.warming.insert(p.partition, k.fence.epoch);
                owned.to_warm.push(k);
                return true;
            }
            let next = k.next_offset();
            owned.keyed.insert(p.partition, k);
            self.start_or_wait(ctx, owned, &p.topic, p.partition, Some(next));
            return true;
        }
        let Some(epoch) = ctx.claim_input(&p.topic, p.partition) else { return false };
        owned.forwarder.assigned(&p.topic, p.partition, p.from, epoch);
        self.start_or_wait(ctx, owned, &p.topic, p.partition, p.from);
        tracing::info!(topic = %p.topic, partition = p.partition, from = p.from, epoch, "forwarding input partition");
        true
    }

    /// Starts a claimed partition where its new owner takes it over, or leaves it paused in
    /// [`Owned::starting`] to be tried again.
    pub(super) fn start_or_wait(
        &self,
        ctx: &Shared,
        owned: &mut Owned,
        topic: &str,
        partition: i32,
        offset: Option<i64>,
    ) {
        let s = Starting { topic: topic.to_string(), partition, offset, since: Instant::now() };
        if !self.start(ctx, &s) {
            owned.starting.push(s);
        }
    }

    /// Tries a starting partition's seek again; true once it runs (sought, or resumed where the
    /// consumer stands after [`SEEK_FOR`]).
    fn start(&self, ctx: &Shared, s: &Starting) -> bool {
        let consumer = if s.topic == ctx.keyed_topic { &self.keyed } else { &self.input };
        if start_at(consumer, &s.topic, s.partition, s.offset) {
            return true;
        }
        if s.since.elapsed() < SEEK_FOR {
            return false;
        }
        tracing::warn!(
            topic = %s.topic,
            partition = s.partition,
            "cannot seek the partition taken over; it is read from the group's committed offset"
        );
        resume(consumer, &s.topic, s.partition, true);
        true
    }

    /// Hands the alerts and the checkpoint of each revoked keyed partition to the writer; drops
    /// it once done, or once it has waited [`LEAVING_FOR`] (the writer's queue stays full, or
    /// the summaries sent are not delivered).
    pub(super) fn settle_leaving(&mut self) {
        let ctx = self.input.context().clone();
        let leaving = std::mem::take(&mut ctx.owned.lock().expect("owned").leaving);
        if leaving.is_empty() {
            return;
        }
        // The summaries a checkpoint's stage one has sent must be delivered before it is stored.
        let delivered = ctx.owned.lock().expect("owned").forwarder.delivered();
        let mut kept = Vec::new();
        for mut l in leaving {
            let partition = l.partition.fence.partition;
            let handed = match delivered {
                true => self.hand_checkpoint(&mut l.partition),
                false => {
                    self.hand_alerts(&mut l.partition);
                    Handed::Later
                }
            };
            match handed {
                Handed::Yes => tracing::info!(partition, "revoked keyed partition: its checkpoint goes to the store"),
                Handed::Later if l.since.elapsed() >= LEAVING_FOR => tracing::warn!(
                    partition,
                    "keyed partition handed over without a checkpoint: its next owner derives again what came after \
                     the last one"
                ),
                Handed::Later => kept.push(l),
            }
        }
        let mut owned = ctx.owned.lock().expect("owned");
        owned.leaving.extend(kept);
        ctx.gauges(&owned);
    }

    /// Checks that the partitions Kafka assigns this member are the ones it holds in the store,
    /// and claims again those found otherwise in two surveys in a row (see the module's notes).
    pub(super) fn reconcile(&mut self, suspects: &mut Suspects) {
        let ctx = self.input.context().clone();
        let keyed_fenced = self.keyed_not_held(&ctx);
        let input_fenced = self.inputs_fenced(&ctx);
        let mut owned = ctx.owned.lock().expect("owned");
        for partition in &keyed_fenced {
            if suspects.keyed.contains(partition) {
                tracing::warn!(
                    partition,
                    "Kafka assigns this keyed partition here, and no instance runs it; claiming it again"
                );
                ctx.telemetry.group.rebalances.with_label_values(&["reclaimed"]).inc();
                resume(&self.keyed, &ctx.keyed_topic, *partition, false);
                let pending = Pending { topic: ctx.keyed_topic.clone(), partition: *partition, from: None };
                owned.pending.push(pending);
            }
        }
        for (topic, partition) in &input_fenced {
            if !suspects.input.contains(&(topic.clone(), *partition)) {
                continue;
            }
            let Some(epoch) = ctx.claim_input(topic, *partition) else { continue };
            tracing::warn!(
                %topic,
                partition,
                epoch,
                "another instance claimed this input partition while Kafka assigns it here (a stale assignment); \
                 claimed again"
            );
            ctx.telemetry.group.rebalances.with_label_values(&["reclaimed"]).inc();
            owned.forwarder.set_epoch(topic, *partition, epoch);
        }
        ctx.gauges(&owned);
        suspects.keyed = keyed_fenced;
        suspects.input = input_fenced;
    }

    /// Keyed partitions Kafka assigns here that are neither run, pending, warming nor leaving
    /// here: dropped when another instance's claim fenced them.
    fn keyed_not_held(&self, ctx: &Shared) -> BTreeSet<i32> {
        if self.keyed.assignment_lost() {
            return BTreeSet::new();
        }
        let Ok(assignment) = self.keyed.assignment() else { return BTreeSet::new() };
        let owned = ctx.owned.lock().expect("owned");
        let held = |p: i32| {
            owned.keyed.contains_key(&p)
                || owned.pending.iter().any(|q| q.topic == ctx.keyed_topic && q.partition == p)
                || owned.leaving.iter().any(|l| l.partition.fence.partition == p)
                || owned.warming.contains_key(&p)
        };
        assignment.elements().iter().map(|e| e.partition()).filter(|p| !held(*p)).collect()
    }

    /// Input partitions forwarded here whose epoch in the store is above this owner's.
    fn inputs_fenced(&self, ctx: &Shared) -> BTreeSet<(String, i32)> {
        if self.input.assignment_lost() {
            return BTreeSet::new();
        }
        let mine = ctx.owned.lock().expect("owned").forwarder.epochs();
        if mine.is_empty() {
            return BTreeSet::new();
        }
        let mut names: Vec<String> = mine.iter().map(|(t, _, _)| ctx.input_name(t)).collect();
        names.dedup();
        let op = ctx.store.partition_epochs(&names);
        let Some(stored) = ctx.gate.attempt(&ctx.runtime, &ctx.telemetry, &ctx.store, "partition_epochs", op) else {
            return BTreeSet::new();
        };
        mine.into_iter()
            .filter(|(topic, partition, epoch)| {
                let name = ctx.input_name(topic);
                stored.iter().any(|(n, p, e)| *n == name && p == partition && e > epoch)
            })
            .map(|(topic, partition, _)| (topic, partition))
            .collect()
    }
}
