//! `--kafka-join-group`: instances that share a Kafka consumer group share the work, as Kafka
//! Streams' instances do. Kafka's group protocol (cooperative-sticky) decides who owns what;
//! the store's epochs keep an instance that lost a partition from writing for it.
//!
//! ```text
//! input topics (any partitioning) --forwarder--> <group>-keyed (partition = key group mod P)
//!                                                   --keyed partitions' engines--> store
//! ```
//!
//! Each instance subscribes to the input topics and to the group's keyed topic. For an input
//! partition it owns, it forwards each event to the keyed partitions of its rules' key groups
//! ([`forward`]). For a keyed partition it owns, it runs an engine that keeps that partition's
//! key groups ([`keyed`]): restored from the partition's checkpoint when the member's loop
//! claims it, checkpointed when revoked and every `--checkpoint-interval` or further apart
//! ([`crate::pacing`]), its alerts stored only while the instance holds the partition's epoch.
//! Partitions change hands through the loop, never in Kafka's callbacks ([`claims`]).

mod claims;
mod ends;
mod forward;
mod gate;
pub mod keyed;
mod out;
mod read;
mod state;
#[cfg(test)]
mod tests;
mod warming;
mod watermarks;

use super::engine_loop::{EngineHealth, Input, Output};
use super::pacing::CheckpointPacing;
use super::sources::Intake;
use super::store::{DeadLetter, Store};
use super::telemetry::Telemetry;
use ends::Ends;
use forward::Forwarder;
pub use forward::PROGRESS;
use gate::StoreGate;
use keyed::{EndOffsets, KeyedPartition, UpstreamId};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use vigil_engine::engine::{Engine, EngineConfig};
use vigil_lang::plan::RulePlan;
pub use warming::WarmGroup;
use watermarks::{PartitionId, Watermarks};

/// How often the forwarder reports progress.
const REPORT_EVERY: Duration = Duration::from_millis(100);
/// How often the forwarder commits what it has delivered: it waits for the broker to take
/// every record in flight first.
pub(super) const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// How often the input topics' partitions, the lag and the gauges are read again.
const SURVEY_EVERY: Duration = Duration::from_secs(5);
/// A progress report this much later than the last one means the instance stood still
/// (paused, starved): see [`forward::Forwarder::thawed`].
const STOOD_STILL: Duration = Duration::from_secs(1);

/// The keyed topic of a group: events by key group, between the instances.
pub fn keyed_topic(group: &str) -> String {
    format!("{group}-keyed")
}

/// What a group member needs.
pub struct Member {
    pub group: String,
    pub brokers: String,
    pub kafka_options: BTreeMap<String, String>,
    /// Static membership (`--kafka-instance-id`): Kafka's `group.instance.id` of both consumers.
    pub instance_id: Option<String>,
    /// The streams' topics: those of the streams a rule change declares are read too.
    pub topics: crate::sources::kafka::StreamTopics,
    /// Topics whose messages are a collector's format, not Vigil's JSON lines.
    pub formats: BTreeMap<String, vigil_formats::Format>,
    pub collectors: vigil_formats::HostMapping,
    pub keyed_partitions: u32,
    /// Alerts held for one keyed partition past which its input pauses ([`out::HeldBack`]).
    pub max_held_alerts: usize,
    /// Threads that run the owned keyed partitions (`--workers`).
    pub workers: usize,
    pub checkpoint_every: Duration,
    /// The state budget (`--max-state-mb`), shared by the keyed partitions owned here.
    pub max_state_bytes: usize,
    pub plans: Vec<RulePlan>,
    pub engine: EngineConfig,
    pub store: Store,
    pub runtime: tokio::runtime::Handle,
    pub telemetry: Arc<Telemetry>,
    /// The writer: the keyed partitions' alerts and checkpoints go there ([`out`]).
    pub out: mpsc::Sender<Output>,
    /// What the writer tells of them.
    pub settled: std::sync::mpsc::Receiver<crate::writer::Settled>,
    pub dead: mpsc::Sender<DeadLetter>,
    pub intake: Intake,
    pub health: Arc<EngineHealth>,
    /// The writer's view of the store ([`gate::StoreGate`]).
    pub store_health: Arc<crate::writer::Health>,
    /// The keyed partitions owned here, for the Alertmanager notifier.
    pub owned_partitions: crate::alertmanager::OwnedPartitions,
    /// The warm start of the keyed partitions claimed without a checkpoint ([`warming`]).
    pub warm: Option<WarmGroup>,
}

/// What the rebalance callbacks and the member's loop share: the partitions it owns, and
/// those changing hands ([`claims`]).
struct Owned {
    keyed: BTreeMap<i32, KeyedPartition>,
    forwarder: Forwarder,
    plans: Vec<RulePlan>,
    /// Assigned by Kafka, paused until the loop claims them in the store.
    pending: Vec<claims::Pending>,
    /// Claimed, still paused until they can be sought to where this member takes them over.
    starting: Vec<claims::Starting>,
    /// Revoked keyed partitions whose checkpoint the loop is still to hand to the writer.
    leaving: Vec<claims::Leaving>,
    /// Keyed partitions claimed without a checkpoint, still paused: waiting for a warm start.
    to_warm: Vec<KeyedPartition>,
    /// The epoch of each keyed partition's claim that waits for or is in a warm start: a
    /// partition comes back from it only if it is still the one claimed.
    warming: BTreeMap<i32, i64>,
    /// Counts rule reloads: partitions out warming meanwhile take the rules on their return.
    reloads: u64,
    /// Dead letters the dead-letter writer's queue had no room for.
    dead: read::HeldDead,
}

impl Owned {
    /// The next offset to take of an owned partition (of the keyed topic when `keyed`), when
    /// known.
    fn next(&self, keyed: bool, topic: &str, partition: i32) -> Option<i64> {
        match keyed {
            true => self.keyed.get(&partition).map(KeyedPartition::next_offset),
            false => self.forwarder.next(topic, partition),
        }
    }
}

/// The consumers' context: rebalances hand partitions over through the store.
#[derive(Clone)]
struct Ctx(Arc<Shared>);

impl std::ops::Deref for Ctx {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What both consumers' callbacks and the loop share.
struct Shared {
    owned: Mutex<Owned>,
    watermarks: Mutex<BTreeMap<PartitionId, Watermarks>>,
    /// The input partitions' end offsets, asked of the broker before time passes idle ones.
    ends: Arc<Ends>,
    keyed_topic: String,
    group: String,
    engine: EngineConfig,
    keyed_partitions: u32,
    store: Store,
    /// Whether the store may be tried (claims, epochs) while it fails.
    gate: StoreGate,
    /// The keyed partitions owned here, as [`Shared::gauges`] last saw them.
    owned_partitions: crate::alertmanager::OwnedPartitions,
    runtime: tokio::runtime::Handle,
    telemetry: Arc<Telemetry>,
    /// The streams of the group's rules, which forwarded events are of.
    catalog: Mutex<vigil_lang::schema::Catalog>,
}

impl ClientContext for Ctx {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let up: std::collections::HashSet<i32> =
            statistics.brokers.values().filter(|b| b.state == "UP").map(|b| b.nodeid).collect();
        let mut watermarks = self.watermarks.lock().expect("watermarks");
        for (topic, t) in statistics.topics {
            for (partition, s) in t.partitions {
                if let Some(w) = watermarks.get_mut(&(topic.clone(), partition)) {
                    w.observe(&s, &up);
                }
            }
        }
    }
}

impl ConsumerContext for Ctx {
    /// Lets revoked partitions go without store I/O: a keyed partition leaves with its state
    /// for the loop to checkpoint ([`claims`]), unless it was lost (another instance may run it
    /// already); an input partition's forwarded offsets are committed first unless it was lost.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else { return };
        let lost = consumer.assignment_lost();
        let kind = if lost { "lost" } else { "revoked" };
        let mut owned = self.owned.lock().expect("owned");
        for e in list.elements() {
            self.telemetry.group.rebalances.with_label_values(&[kind]).inc();
            owned.pending.retain(|p| p.topic != e.topic() || p.partition != e.partition());
            owned.starting.retain(|s| s.topic != e.topic() || s.partition != e.partition());
            if e.topic() == self.keyed_topic {
                owned.warming.remove(&e.partition());
                owned.to_warm.retain(|p| p.fence.partition != e.partition());
                let Some(p) = owned.keyed.remove(&e.partition()) else { continue };
                if !lost {
                    owned.leaving.push(claims::Leaving { partition: p, since: Instant::now() });
                }
                tracing::info!(partition = e.partition(), lost, "keyed partition revoked");
            } else {
                owned.forwarder.released(consumer, e.topic(), e.partition(), lost);
                tracing::info!(topic = e.topic(), partition = e.partition(), lost, "input partition handed over");
            }
        }
        self.gauges(&owned);
    }

    /// As the default (cooperative: incremental), with each assigned partition paused until the
    /// loop has claimed it in the store and sought it to where this member takes it over: an
    /// input partition to the group's committed offset, a keyed partition to its checkpoint's
    /// next offset ([`claims`]).
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, list: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let committed = match consumer.committed_offsets(list.clone(), Duration::from_secs(10)) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the committed offsets; reading from the start");
                        TopicPartitionList::new()
                    }
                };
                self.note_assigned(list, &committed);
                if let Err(e) = consumer.incremental_assign(list) {
                    tracing::error!(error = %e, "cannot take the assigned partitions");
                }
                if let Err(e) = consumer.pause(list) {
                    tracing::error!(error = %e, "cannot pause the assigned partitions until they are claimed");
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.pre_rebalance(consumer, &Rebalance::Revoke(list));
                if let Err(e) = consumer.incremental_unassign(list) {
                    tracing::error!(error = %e, "cannot release the revoked partitions");
                }
            }
            other => tracing::warn!(error = ?other, "rebalance failed"),
        }
        self.owned_partitions_changed(list, err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS);
    }
}

impl Shared {
    /// Drops the keyed partitions another instance claimed: that instance writes for them now.
    fn drop_fenced(&self, owned: &mut Owned, fenced: &[i32]) {
        for partition in fenced {
            owned.keyed.remove(partition);
            tracing::warn!(partition, "another instance owns the keyed partition now; this one lets it go");
        }
        if !fenced.is_empty() {
            self.gauges(owned);
        }
    }

    fn gauges(&self, owned: &Owned) {
        let group = &self.telemetry.group;
        let g = &group.owned_partitions;
        g.with_label_values(&[&self.keyed_topic]).set(owned.keyed.len() as i64);
        g.with_label_values(&["input"]).set(owned.forwarder.owns() as i64);
        group.pending_partitions.set(owned.pending.len() as i64);
        group.leaving_partitions.set(owned.leaving.len() as i64);
        group.warming_partitions.set(owned.warming.len() as i64);
        if let Ok(mut parts) = self.owned_partitions.write() {
            *parts = owned.keyed.keys().copied().collect();
        }
    }
}

impl Member {
    /// Runs the member on its own thread until `stop`; `control` brings rule reloads.
    pub fn spawn(
        mut self,
        control: mpsc::Receiver<Input>,
        stop: watch::Receiver<bool>,
    ) -> Result<std::thread::JoinHandle<()>, rdkafka::error::KafkaError> {
        // Fleet-wide rules run in two stages over the keyed partitions: the router sends their
        // events by group key, like any other rule's.
        self.engine.two_stage = true;
        let keyed_topic = keyed_topic(&self.group);
        let producer =
            super::kafka::forwarding_producer(&self.brokers, &self.kafka_options, forward::Deliveries::default())?;
        let router = Engine::new(self.plans.clone(), self.engine.clone());
        let forwarder = Forwarder::new(router, producer, keyed_topic.clone(), self.keyed_partitions);
        let ends = Arc::new(Ends::default());
        Ends::spawn(&ends, super::kafka::offsets_client(&self.brokers, &self.kafka_options)?)
            .expect("the end offsets' thread starts");
        let ctx = Ctx(Arc::new(Shared {
            owned: Mutex::new(Owned {
                keyed: BTreeMap::new(),
                forwarder,
                plans: self.plans.clone(),
                pending: Vec::new(),
                starting: Vec::new(),
                leaving: Vec::new(),
                to_warm: Vec::new(),
                warming: BTreeMap::new(),
                reloads: 0,
                dead: read::HeldDead::default(),
            }),
            watermarks: Mutex::new(BTreeMap::new()),
            ends: ends.clone(),
            keyed_topic: keyed_topic.clone(),
            group: self.group.clone(),
            engine: self.engine.clone(),
            keyed_partitions: self.keyed_partitions,
            store: self.store.clone(),
            gate: StoreGate::new(self.store_health.clone()),
            owned_partitions: self.owned_partitions.clone(),
            runtime: self.runtime.clone(),
            telemetry: self.telemetry.clone(),
            catalog: Mutex::new(self.intake.catalog.get()),
        }));
        // Two consumers, in two groups: the input topics' partitions, and the keyed topic's,
        // are each spread over the instances. In one group the assignor balances the total
        // count only, and one instance could end with every keyed partition.
        let id = self.instance_id.as_deref();
        let input = super::kafka::group_consumer(&self.brokers, &self.group, id, &self.kafka_options, ctx.clone())?;
        let keyed = super::kafka::group_consumer(&self.brokers, &keyed_topic, id, &self.kafka_options, ctx)?;
        Ok(std::thread::Builder::new()
            .name("vigil-group".into())
            .spawn(move || Looping::new(self, input, keyed).run(control, stop))
            .expect("the group thread starts"))
    }
}

/// The member's loop and what it keeps between rounds.
struct Looping {
    m: Member,
    /// In the group named by `--kafka-group`, over the input topics.
    input: BaseConsumer<Ctx>,
    /// In the group named as the keyed topic, over it.
    keyed: BaseConsumer<Ctx>,
    /// The input topics and the stream of each, followed as rule changes declare streams.
    topics: crate::sources::kafka::TopicMap,
    /// Every partition of the input topics: the keyed partitions wait for all of them.
    inputs: Vec<UpstreamId>,
    decoder: vigil_engine::event::LineDecoder,
    last_report: Instant,
    last_commit: Instant,
    pacing: CheckpointPacing,
    /// The keyed partitions still to checkpoint in this pass, in turn.
    to_checkpoint: VecDeque<i32>,
    /// When the summaries sent were last found undelivered: the pass goes on a little later.
    undelivered_until: Option<Instant>,
    last_survey: Option<Instant>,
    /// Whether the consumers are subscribed: not while the instance is held
    /// ([`EngineHealth::held`]: its rules differ from the group's).
    subscribed: bool,
    /// Partitions found assigned here but held by another instance in the last survey.
    suspects: claims::Suspects,
    state: state::StateGauges,
    /// The consumers' errors, taken at once and logged now and then.
    receive_errors: crate::kafka::ReceiveErrors,
    /// The warm start under way, and the rules' reload count when it began.
    warm_job: Option<(warming::Job, u64)>,
    held_back: out::HeldBack,
}

impl Looping {
    fn new(mut m: Member, input: BaseConsumer<Ctx>, keyed: BaseConsumer<Ctx>) -> Self {
        let decoder = m.intake.catalog.decoder();
        let topics = crate::sources::kafka::TopicMap::new(std::mem::take(&mut m.topics), &m.intake.catalog);
        let pacing = CheckpointPacing::new(m.checkpoint_every, Instant::now(), m.health.checkpoint_stored());
        Looping {
            m,
            input,
            keyed,
            topics,
            inputs: Vec::new(),
            decoder,
            last_report: Instant::now(),
            last_commit: Instant::now(),
            pacing,
            to_checkpoint: VecDeque::new(),
            undelivered_until: None,
            last_survey: None,
            subscribed: false,
            suspects: claims::Suspects::default(),
            state: state::StateGauges::default(),
            receive_errors: crate::kafka::ReceiveErrors::default(),
            warm_job: None,
            held_back: out::HeldBack::default(),
        }
    }

    /// Joins the consumer groups, or leaves them while the instance is held: the others take
    /// its partitions (the loop checkpoints them on the way out).
    fn follow_hold(&mut self) {
        let held = self.m.health.held();
        if held.is_some() && self.subscribed {
            self.input.unsubscribe();
            self.keyed.unsubscribe();
            self.subscribed = false;
            tracing::warn!(group = %self.m.group, "left the consumer groups while this instance's rules differ from the group's");
        } else if held.is_none() && !self.subscribed {
            let topics: Vec<&str> = self.topics.names.iter().map(String::as_str).collect();
            let keyed_topic = self.keyed.context().keyed_topic.clone();
            let joined = self.input.subscribe(&topics).and_then(|()| self.keyed.subscribe(&[&keyed_topic]));
            match joined {
                Ok(()) => {
                    self.subscribed = true;
                    tracing::info!(group = %self.m.group, topics = ?topics, keyed = %keyed_topic, "joined the consumer groups");
                }
                Err(e) => tracing::error!(error = %e, "cannot subscribe; trying again"),
            }
        }
    }

    /// Follows a change of the rules' streams (a rule change that declares or removes one, on
    /// this member or another): events are read as the new catalogue has them, and the topics
    /// of declared streams are subscribed to, within a round.
    fn follow_catalog(&mut self) {
        if !self.topics.refresh(&self.m.intake.catalog) {
            return;
        }
        let catalog = self.m.intake.catalog.get();
        self.decoder = vigil_engine::event::LineDecoder::new(catalog.clone());
        let ctx = self.input.context().clone();
        ctx.owned.lock().expect("owned").keyed.values_mut().for_each(|p| p.set_catalog(&catalog));
        *ctx.catalog.lock().expect("catalog") = catalog;
        self.last_survey = None;
        if !self.subscribed {
            return;
        }
        let topics: Vec<&str> = self.topics.names.iter().map(String::as_str).collect();
        match self.input.subscribe(&topics) {
            Ok(()) => tracing::info!(topics = ?topics, "the streams changed: reading their topics"),
            Err(e) => {
                tracing::error!(error = %e, "cannot subscribe to the streams' topics; joining again");
                self.input.unsubscribe();
                self.subscribed = false;
            }
        }
    }

    fn run(mut self, mut control: mpsc::Receiver<Input>, stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            while let Ok(input) = control.try_recv() {
                self.control(input);
            }
            self.follow_catalog();
            self.follow_hold();
            if self.last_survey.is_none_or(|t| t.elapsed() >= SURVEY_EVERY) {
                self.last_survey = Some(Instant::now());
                self.survey();
                let mut suspects = std::mem::take(&mut self.suspects);
                self.reconcile(&mut suspects);
                self.suspects = suspects;
            }
            self.claim_pending();
            self.follow_warm();
            self.round();
            self.settle();
            self.settle_leaving();
            if self.last_report.elapsed() >= REPORT_EVERY {
                let since = self.last_report.elapsed();
                self.last_report = Instant::now();
                if since >= STOOD_STILL {
                    tracing::info!(
                        ms = since.as_millis() as u64,
                        "this instance stood still: its input partitions are not reported idle until it knows it \
                         still owns them"
                    );
                    self.input.context().owned.lock().expect("owned").forwarder.thawed();
                }
                self.report();
            }
            self.checkpoint_in_turn();
            self.m.health.progressed(1);
        }
        self.report();
        self.leave_groups();
    }

    /// Leaves both consumer groups: the revoke callbacks commit what was forwarded and hand the
    /// keyed partitions to the loop, which hands each one's checkpoint to the writer before the
    /// consumers close. Messages read meanwhile are not taken: the next owners read them again.
    fn leave_groups(mut self) {
        tracing::info!("leaving the consumer groups");
        if let Some((job, _)) = self.warm_job.take() {
            drop(job.join());
        }
        self.input.unsubscribe();
        self.keyed.unsubscribe();
        let ctx = self.input.context().clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        let held = || {
            let owned = ctx.owned.lock().expect("owned");
            !owned.keyed.is_empty() || owned.forwarder.owns() > 0
        };
        while held() && Instant::now() < deadline {
            let _ = self.input.poll(Duration::from_millis(50));
            let _ = self.keyed.poll(Duration::from_millis(50));
        }
        let mut looping = self;
        looping.settle_leaving();
        let left = ctx.owned.lock().expect("owned").leaving.len();
        if left > 0 {
            tracing::warn!(
                partitions = left,
                "keyed partitions left without a checkpoint: their next owners derive again what came after the last one"
            );
        }
        let Looping { input, keyed, .. } = looping;
        drop(input);
        drop(keyed);
    }

    /// Reads what has come (of each consumer up to 512 messages), then moves time on in every
    /// keyed partition and hands their alerts to the writer. A consumer is not waited on while the other has
    /// messages: when neither had any, each is waited on for up to 10 ms.
    fn round(&mut self) {
        let mut read = 0;
        for wait in [Duration::ZERO, Duration::from_millis(10)] {
            for keyed in [false, true] {
                read += self.read(keyed, wait);
            }
            if read > 0 {
                break;
            }
        }
        let ctx = self.input.context();
        let mut owned = ctx.owned.lock().expect("owned");
        work(&mut owned.keyed, &self.inputs, &ctx.ends.latest(), self.m.workers);
        if self.state.due() {
            self.state.update(&mut owned.keyed, self.m.max_state_bytes, &self.m.telemetry, &self.m.health);
        }
        if owned.keyed.values().any(KeyedPartition::wants_ends) {
            ctx.ends.want();
        }
        owned.dead.hand(&self.m);
        let Owned { keyed, forwarder, .. } = &mut *owned;
        for p in keyed.values_mut() {
            for (to, summary) in p.take_outgoing() {
                forwarder.send_stage(Some(to), forward::SUMMARY, &summary);
                self.m.telemetry.group.summaries.inc();
            }
            count(&self.m.telemetry, p.tally());
            self.hand_alerts(p);
        }
        let starting: Vec<i32> =
            owned.starting.iter().filter(|s| s.topic == ctx.keyed_topic).map(|s| s.partition).collect();
        let most = self.m.max_held_alerts;
        out::hold_back(&mut self.held_back, &self.keyed, &owned.keyed, &starting, most, &self.m.telemetry);
        let held: usize = owned.keyed.values().map(|p| p.out.len()).sum();
        self.m.telemetry.group.held_alerts.set(held as i64);
        let watermark = owned.keyed.values().filter_map(KeyedPartition::watermark).min();
        if let Some(w) = watermark {
            self.m.health.set_watermark(w);
            self.m.telemetry.watermark_lag_ms.set(vigil_engine::event::now_ms().saturating_sub(w));
        }
    }

    /// Reads up to 512 messages of the input consumer, or of the keyed one when `keyed`, waiting
    /// up to `wait` for the first; how many.
    fn read(&mut self, keyed: bool, wait: Duration) -> usize {
        let Looping { m, topics, decoder, input, keyed: keyed_consumer, receive_errors, .. } = self;
        let by_topic = &topics.by_topic;
        let consumer = if keyed { keyed_consumer } else { input };
        for n in 0..512 {
            let Some(polled) = consumer.poll(if n == 0 { wait } else { Duration::ZERO }) else { return n };
            match polled {
                Ok(message) => read::take(m, by_topic, decoder, consumer.context(), &message),
                Err(e) => receive_errors.note(&e),
            }
        }
        512
    }

    /// Reports the input partitions' progress to the keyed partitions, and now and then
    /// commits what has been forwarded.
    fn report(&mut self) {
        let consumer = &self.input;
        let mut owned = consumer.context().owned.lock().expect("owned");
        let ctx = consumer.context();
        owned.forwarder.report(|topic, partition, next| caught_up(ctx, topic, partition, next));
        let Owned { keyed, forwarder, .. } = &mut *owned;
        for p in keyed.values_mut() {
            if let Some(report) = p.stage_report() {
                forwarder.send_stage(None, forward::STAGE, &report);
            }
        }
        if self.last_commit.elapsed() >= COMMIT_EVERY {
            self.last_commit = Instant::now();
            owned.forwarder.commit(consumer, None, CommitMode::Async);
        }
    }

    fn control(&mut self, input: Input) {
        match input {
            Input::Reload(plans, reply) => {
                let mut owned = self.input.context().owned.lock().expect("owned");
                // Every keyed partition takes the new rules; what each keeps is the same.
                let mut kept = None;
                for p in owned.keyed.values_mut() {
                    let k = p.reload(plans.clone());
                    kept.get_or_insert(k);
                }
                owned.forwarder.router = Engine::new(plans.clone(), self.m.engine.clone());
                for p in &mut owned.to_warm {
                    p.reload(plans.clone());
                }
                owned.reloads += 1;
                let kept = kept.unwrap_or_else(|| plans.iter().map(|p| p.name.clone()).collect());
                owned.plans = plans;
                let _ = reply.send(kept);
            }
            Input::Ack(reply) => {
                let _ = reply.send(0);
            }
            Input::Tick | Input::Event(..) | Input::Events(..) | Input::Ingested(..) | Input::Stop => {}
        }
    }

    /// The input topics' partitions, the consumer's lag and the state gauges.
    fn survey(&mut self) {
        let mut partitions = Vec::new();
        for topic in self.topics.by_topic.keys() {
            match self.input.fetch_metadata(Some(topic), Duration::from_secs(5)) {
                Ok(m) => {
                    for t in m.topics().iter().filter(|t| t.error().is_none()) {
                        partitions.extend(t.partitions().iter().map(|p| (topic.clone(), p.id())));
                    }
                }
                Err(e) => {
                    tracing::warn!(%topic, error = %e, "cannot read the topic's partitions; keeping the last known");
                    return;
                }
            }
        }
        let inputs: Vec<UpstreamId> = partitions.iter().map(|(t, p)| keyed::upstream_id(t, *p)).collect();
        if inputs != self.inputs {
            tracing::info!(partitions = inputs.len(), "input partitions");
            self.input.context().ends.set_inputs(partitions);
            self.inputs = inputs;
        }
        self.m.telemetry.kafka_lag.reset();
        let ctx = self.input.context();
        let owned = ctx.owned.lock().expect("owned");
        for ((topic, partition), w) in ctx.watermarks.lock().expect("watermarks").iter() {
            let next = owned.next(*topic == ctx.keyed_topic, topic, *partition);
            if let Some(high) = w.high {
                let lag = (high - next.or(w.low).unwrap_or(0)).max(0);
                self.m.telemetry.kafka_lag.with_label_values(&[topic, &partition.to_string()]).set(lag);
            }
        }
        let bytes: usize = owned.keyed.values().map(KeyedPartition::state_bytes).sum();
        self.m.telemetry.state_bytes.set(bytes as i64);
        self.m.health.state_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}

/// Lets each keyed partition take what has been read for it and move time on, on up to
/// `workers` threads: each thread runs whole partitions, the busiest first to the least loaded
/// thread. A partition's engine keeps its own key groups, so the threads share nothing.
fn work(keyed: &mut BTreeMap<i32, KeyedPartition>, inputs: &[UpstreamId], ends: &EndOffsets, workers: usize) {
    let busy = keyed.values().filter(|p| p.queued() > 0).count();
    let workers = workers.min(busy);
    if workers <= 1 {
        keyed.values_mut().for_each(|p| p.work(inputs, ends));
        return;
    }
    let mut partitions: Vec<&mut KeyedPartition> = keyed.values_mut().collect();
    partitions.sort_by_key(|p| std::cmp::Reverse(p.queued()));
    let mut shares: Vec<(usize, Vec<&mut KeyedPartition>)> = (0..workers).map(|_| (0, Vec::new())).collect();
    for p in partitions {
        let least = shares.iter_mut().min_by_key(|(load, _)| *load).expect("at least two threads");
        least.0 += p.queued() + 1;
        least.1.push(p);
    }
    std::thread::scope(|scope| {
        for (_, share) in shares {
            scope.spawn(move || share.into_iter().for_each(|p| p.work(inputs, ends)));
        }
    });
}

/// Counts what a keyed partition took.
fn count(telemetry: &Telemetry, tally: keyed::Tally) {
    let group = &telemetry.group;
    group.taken.inc_by(tally.taken);
    group.duplicates.inc_by(tally.duplicates);
    group.summaries_taken.inc_by(tally.summaries);
    group.skipped.with_label_values(&["unreadable"]).inc_by(tally.unreadable);
    for (rule, n) in tally.late {
        telemetry.late.with_label_values(&[&rule]).inc_by(n);
    }
}

/// Where an input partition ends, when it has been read to its end: `next` (the next offset to
/// read, when known) against the high watermark of the broker's fetch responses.
fn caught_up(ctx: &Shared, topic: &str, partition: i32, next: Option<i64>) -> Option<i64> {
    match (ctx.watermarks(topic, partition), next) {
        ((_, Some(high)), Some(next)) => (next >= high).then_some(next),
        ((Some(low), Some(high)), None) => (low == high).then_some(high),
        _ => None,
    }
}
