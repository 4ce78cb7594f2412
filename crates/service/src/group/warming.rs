//! A group member's warm start (`--warm-from-prometheus`): each keyed partition it claims
//! without a checkpoint is fed its series' history before it takes its first forwarded event,
//! as a single instance's rules are ([`crate::history::warm`]). The partitions one round of
//! claims brings are warmed together, by one read of the history on a thread of their own,
//! while the member's loop goes on polling; their input stays paused until they are back. Each
//! event of the history goes to the partitions of its key groups only.
//!
//! A partition restored from a checkpoint is not warmed: its state wins. One revoked while it
//! warms is dropped when the warm start ends: its next owner finds no checkpoint and warms it
//! again. What the history raises is held back, as on a single instance; the alerts it leaves
//! firing go out with the partition's first live ones. The fleet-wide rules' stage twos are not
//! fed history: they judge live windows only.

use super::claims::Pending;
use super::keyed::KeyedPartition;
use super::Looping;
use crate::history::warm::{warm_up, WarmStart, Warmable};
use rdkafka::consumer::Consumer;
use std::collections::BTreeMap;
use std::thread::JoinHandle;
use vigil_engine::alert::Alert;
use vigil_engine::engine::{Engine, EngineConfig};
use vigil_engine::event::{Event, Millis};
use vigil_lang::plan::RulePlan;

/// What a member's warm start needs besides the partitions.
#[derive(Clone)]
pub struct WarmGroup {
    pub warm: WarmStart,
    pub handle: tokio::runtime::Handle,
    /// The member's lateness: history is released up to its newest event less this, so that
    /// live events a little older than it are not late.
    pub lateness: Millis,
}

/// Keyed partitions taking history.
struct Warming {
    parts: Vec<KeyedPartition>,
    /// Routes each event to the partitions of its key groups.
    router: Engine,
    /// The group's keyed partitions.
    partitions: usize,
    lateness: Millis,
    targets: Vec<usize>,
    /// Each part's events of the page being taken.
    pages: Vec<Vec<Event>>,
    /// The part each alert the history raised is of, by alert id.
    raised_by: BTreeMap<String, usize>,
}

impl Warmable for Warming {
    fn take_history(&mut self, events: Vec<Event>, max_state_bytes: usize, out: &mut Vec<Alert>) {
        let newest = events.iter().map(|e| e.ts).max();
        for event in events {
            self.router.partitions_of(&event, self.partitions, &mut self.targets);
            let parts = &self.parts;
            let mut at: Vec<usize> = self
                .targets
                .iter()
                .filter_map(|&t| parts.iter().position(|p| p.fence.partition as usize == t))
                .collect();
            if let Some(last) = at.pop() {
                for i in at {
                    self.pages[i].push(event.clone());
                }
                self.pages[last].push(event);
            }
        }
        let budget = max_state_bytes / self.parts.len().max(1);
        let to = newest.map(|n| n.saturating_sub(self.lateness));
        for (i, (p, page)) in self.parts.iter_mut().zip(&mut self.pages).enumerate() {
            let from = out.len();
            p.take_history(std::mem::take(page), to, budget, out);
            for a in &out[from..] {
                self.raised_by.insert(a.id.clone(), i);
            }
        }
    }
}

/// A warm start under way.
pub(super) struct Job {
    thread: JoinHandle<Vec<KeyedPartition>>,
    /// The keyed partitions it warms.
    ids: Vec<i32>,
}

impl Job {
    /// Warms `parts` (claimed without a checkpoint, of the group's `partitions`) on a thread of
    /// their own.
    pub(super) fn spawn(
        parts: Vec<KeyedPartition>,
        plans: Vec<RulePlan>,
        engine: EngineConfig,
        partitions: u32,
        w: WarmGroup,
    ) -> Job {
        let ids: Vec<i32> = parts.iter().map(|p| p.fence.partition).collect();
        tracing::info!(partitions = ?ids, "warming the keyed partitions claimed without a checkpoint");
        let thread = std::thread::Builder::new()
            .name("vigil-warm".into())
            .spawn(move || {
                let n = parts.len();
                let mut warming = Warming {
                    parts,
                    router: Engine::new(plans, engine),
                    partitions: partitions as usize,
                    lateness: w.lateness,
                    targets: Vec::new(),
                    pages: vec![Vec::new(); n],
                    raised_by: BTreeMap::new(),
                };
                // Stopped: the partitions are dropped, with no checkpoint of half the history.
                warm_up(&mut warming, &w.warm, &w.handle).map_or_else(Vec::new, |firing| warming.hand_over(firing))
            })
            .expect("the warm start's thread starts");
        Job { thread, ids }
    }

    pub(super) fn done(&self) -> bool {
        self.thread.is_finished()
    }

    /// The warmed partitions (none when the service stopped the warm start).
    pub(super) fn join(self) -> Vec<KeyedPartition> {
        self.thread.join().unwrap_or_else(|_| {
            tracing::error!("the warm start's thread panicked: its partitions are claimed again");
            Vec::new()
        })
    }
}

impl Warming {
    /// The partitions, each with the alerts its history left `firing`, to go out with its
    /// first live ones.
    fn hand_over(self, firing: Vec<Alert>) -> Vec<KeyedPartition> {
        let mut parts = self.parts;
        for a in firing {
            if let Some(&i) = self.raised_by.get(&a.id) {
                parts[i].out.push(a);
            }
        }
        parts
    }
}

impl Looping {
    /// Hands the partitions of a finished warm start back to the loop (sought to their start
    /// and resumed), and starts one for the partitions claimed without a checkpoint since.
    pub(super) fn follow_warm(&mut self) {
        let Some(w) = self.m.warm.clone() else { return };
        if self.warm_job.as_ref().is_some_and(|(job, _)| !job.done()) {
            return;
        }
        let ctx = self.input.context().clone();
        let mut owned = ctx.owned.lock().expect("owned");
        if let Some((job, reloads)) = self.warm_job.take() {
            let ids = job.ids.clone();
            for mut p in job.join() {
                let id = p.fence.partition;
                if owned.warming.get(&id) != Some(&p.fence.epoch) {
                    tracing::info!(partition = id, "a keyed partition revoked while it warmed is let go");
                    continue;
                }
                owned.warming.remove(&id);
                if owned.reloads != reloads {
                    p.reload(owned.plans.clone());
                }
                let next = p.next_offset();
                owned.keyed.insert(id, p);
                self.start_or_wait(&ctx, &mut owned, &ctx.keyed_topic, id, Some(next));
            }
            // Partitions that did not come back (their thread failed) are claimed again.
            for id in ids {
                if owned.warming.remove(&id).is_some() {
                    owned.pending.push(Pending { topic: ctx.keyed_topic.clone(), partition: id, from: None });
                }
            }
            ctx.gauges(&owned);
        }
        if owned.to_warm.is_empty() {
            return;
        }
        let parts = std::mem::take(&mut owned.to_warm);
        let job = Job::spawn(parts, owned.plans.clone(), self.m.engine.clone(), self.m.keyed_partitions, w);
        self.warm_job = Some((job, owned.reloads));
    }
}
