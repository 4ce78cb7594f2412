//! Single-event rules: a pattern, its filter and the alert condition, judged per event.

use super::alerting::Alerting;
use super::eval::{holds, Env, RegexCache};
use super::keys::Key;
use super::operator::Operator;
use crate::alert::{Alert, Evidence};
use crate::event::{Event, Millis};
use std::sync::Arc;
use vigil_lang::plan::RulePlan;

pub struct FilterOperator {
    alerting: Alerting,
    regexes: Arc<RegexCache>,
    /// Positions of the key fields of the pattern's entities.
    key_positions: Vec<usize>,
}

impl FilterOperator {
    pub fn new(plan: Arc<RulePlan>, regexes: Arc<RegexCache>) -> Self {
        let (names, key_positions) = super::operator::entity_key_positions(&plan.sources[0]).into_iter().unzip();
        FilterOperator { alerting: Alerting::new(plan, names), regexes, key_positions }
    }
}

impl Operator for FilterOperator {
    fn key_fields(&self, _source: usize) -> Option<Vec<usize>> {
        (!self.key_positions.is_empty()).then(|| self.key_positions.clone())
    }

    fn on_event(&mut self, _source: usize, event: &Arc<Event>, out: &mut Vec<Alert>) {
        let plan = self.alerting.plan().clone();
        if !super::operator::binds_entities(&self.key_positions, event) {
            return;
        }
        let events = [Some(event.as_ref())];
        let env = Env::events(&plan.sources, &events, &self.regexes);
        // The engine has checked the pattern's filter.
        if !holds(&plan.alert.condition, &env) {
            return;
        }
        let key = Key(self.key_positions.iter().map(|&i| event.value(i)).collect());
        self.alerting.matched(&key, event.ts, &env, || vec![Evidence::Event(event.clone())], out);
    }

    fn on_watermark(&mut self, watermark: Millis, out: &mut Vec<Alert>) {
        self.alerting.expire(watermark, out);
    }

    fn next_deadline(&self) -> Option<Millis> {
        self.alerting.next_expiry()
    }

    fn live_keys(&self) -> Vec<(String, usize)> {
        vec![(self.alerting.plan().name.clone(), self.alerting.active())]
    }

    fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_stdvec(&self.alerting.snapshot())
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), postcard::Error> {
        self.alerting.restore(postcard::from_bytes(state)?);
        Ok(())
    }
}
