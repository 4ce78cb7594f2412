//! A keyed partition: the unit of work and of state in every mode. Its engine keeps the key
//! groups whose number modulo the partition count is its index ([`Shard`](crate::engine::Shard)).
//! Where fleet-wide rules are judged partition by partition, it also keeps the stage two of the
//! peer groups that fall to it ([`stage_two::partition_of`]).
//!
//! The exchange around it differs by mode, the partition does not:
//! - in one process ([`super::Runtime`]) partitions run on the runtime's threads (a lone one on
//!   the caller's); their windows' summaries go to the one stage two on the router's thread,
//!   and time comes as the router's marks;
//! - in a group (`--kafka-join-group`) each keyed partition of the group's topic is one, run
//!   by the member that owns it; summaries go through the topic to the partition of their peer
//!   group, and time comes from every upstream partition's progress.
//!
//! Its checkpoint is the engine's snapshot followed, when it judges, by its stage two's state.

use crate::alert::Alert;
use crate::engine::stage_two::{self, StageTwo, Summary, TookSummary};
use crate::engine::{Engine, EngineConfig, EngineError, Snapshot};
use crate::event::Millis;
use std::collections::BTreeMap;
use vigil_lang::plan::RulePlan;

pub struct Partition {
    engine: Engine,
    /// The stage two of the peer groups of this partition, when it judges them.
    stage_two: Option<StageTwo>,
}

impl Partition {
    /// Partition `config.shard.index` of `config.shard.count` over `plans`; with `judges`, it
    /// judges its peer groups of the fleet-wide rules.
    pub fn new(plans: Vec<RulePlan>, config: EngineConfig, judges: bool) -> Partition {
        let stage_two = judges.then(|| StageTwo::new(&plans, &config, config.shard.count.max(1) as u32));
        Partition { engine: Engine::new(plans, config), stage_two }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Whether it judges peer groups: it does, and the rules have fleet-wide rules in two stages.
    pub fn judges(&self) -> bool {
        self.stage_two.as_ref().is_some_and(|s| !s.is_empty())
    }

    /// The windows its engine closed since the last call, by the partition whose stage two
    /// judges each of their groups.
    pub fn summaries_by_partition(&mut self) -> Vec<(i32, Summary)> {
        let partitions = self.engine.config().shard.count.max(1) as u32;
        let mut out = Vec::new();
        for summary in self.engine.take_summaries() {
            let mut by_partition: BTreeMap<i32, Vec<_>> = BTreeMap::new();
            for g in summary.groups {
                by_partition.entry(stage_two::partition_of(&summary.op, &g.peers, partitions)).or_default().push(g);
            }
            for (partition, groups) in by_partition {
                out.push((partition, Summary { op: summary.op.clone(), end: summary.end, groups }));
            }
        }
        out
    }

    /// Takes a summary that partition `source` sent; a partition that does not judge has no
    /// use for it.
    pub fn take_summary(&mut self, source: i32, summary: Summary) -> TookSummary {
        match &mut self.stage_two {
            Some(s) => s.take(source, summary),
            None => TookSummary::Unknown,
        }
    }

    /// Takes partition `source`'s report of how far its engine has got.
    pub fn report(&mut self, source: i32, watermark: Millis) {
        if let Some(s) = &mut self.stage_two {
            s.report(source, watermark);
        }
    }

    /// Closes the windows every source partition has passed; alerts go to `out`.
    pub fn judge(&mut self, out: &mut Vec<Alert>) {
        if let Some(s) = &mut self.stage_two {
            s.advance(out);
        }
    }

    /// The engine's snapshot, then the stage two's state when it judges: the bytes, and where
    /// the stage two's begin.
    pub fn snapshot(&self) -> Result<(Vec<u8>, Option<usize>), postcard::Error> {
        let mut bytes = self.engine.snapshot()?.to_bytes()?;
        match self.stage_two.as_ref().filter(|s| !s.is_empty()) {
            Some(s) => {
                let at = bytes.len();
                bytes.extend(s.snapshot()?);
                Ok((bytes, Some(at)))
            }
            None => Ok((bytes, None)),
        }
    }

    /// Puts back what [`Partition::snapshot`] made (a stage two's state from `stage_two_at`);
    /// returns the rules whose state was restored.
    pub fn restore(&mut self, bytes: &[u8], stage_two_at: Option<usize>) -> Result<Vec<String>, EngineError> {
        let at = stage_two_at.unwrap_or(bytes.len()).min(bytes.len());
        let restored = self.engine.restore(Snapshot::from_bytes(&bytes[..at])?)?;
        if let (Some(s), Some(_)) = (&mut self.stage_two, stage_two_at) {
            s.restore(&bytes[at..])?;
        }
        Ok(restored)
    }

    /// Another rule set: what each rule keeps is kept ([`Engine::reload`]).
    pub fn reload(&mut self, plans: Vec<RulePlan>) -> Vec<String> {
        if let Some(s) = &mut self.stage_two {
            s.reload(&plans, self.engine.config());
        }
        self.engine.reload(plans)
    }

    pub fn state_bytes(&self) -> usize {
        self.engine.state_bytes() + self.stage_two.as_ref().map_or(0, StageTwo::state_bytes)
    }

    /// Keeps the partition's state under `max_bytes`; the self-alerts that say what was dropped
    /// go to `out`. A stage two that judges gets the part a single instance gives its own: of
    /// `K` partitions, `1 / (K + 1)`, so that the stage twos together keep as much as one
    /// partition ([`super::Runtime::enforce_budget`]). Returns the estimate after.
    pub fn enforce_budget(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
        let Some(s) = self.stage_two.as_mut().filter(|s| !s.is_empty()) else {
            return self.engine.enforce_budget(max_bytes, out);
        };
        let judging = max_bytes / (self.engine.config().shard.count.max(1) + 1);
        self.engine.enforce_budget(max_bytes - judging, out) + s.enforce_budget(judging, out)
    }

    /// Groups, partial matches and active alerts by rule ([`StageTwo::count_live_keys`]).
    pub fn live_keys(&self) -> BTreeMap<String, usize> {
        let mut keys = self.engine.live_keys();
        if let Some(s) = &self.stage_two {
            s.count_live_keys(&mut keys);
        }
        keys
    }

    /// Keys dropped so far by the state limits, by rule and reason.
    pub fn evicted(&self) -> BTreeMap<(String, &'static str), u64> {
        let mut evicted = self.engine.evicted();
        if let Some(s) = &self.stage_two {
            s.count_evicted(&mut evicted);
        }
        evicted
    }
}
