//! Single-event rules: a pattern, its filter and the alert condition, judged per event.

use super::alerting::Alerting;
use super::eval::{holds, Env, RegexCache};
use super::{Key, Operator};
use crate::alert::Alert;
use crate::event::{Event, Millis};
use crate::plan::RulePlan;
use std::sync::Arc;

pub struct FilterOperator {
    alerting: Alerting,
    regexes: Arc<RegexCache>,
    /// Key fields of the pattern's entities: (name as shown, field on the event).
    key_fields: Vec<(String, &'static str)>,
}

impl FilterOperator {
    pub fn new(plan: Arc<RulePlan>, regexes: Arc<RegexCache>) -> Self {
        let src = &plan.sources[0];
        let key_fields: Vec<(String, &'static str)> = std::iter::once(&src.subject)
            .chain(src.object.as_ref())
            .flat_map(|(kind, var)| kind.key_fields().iter().map(move |f| (format!("{var}.{f}"), *f)))
            .collect();
        let names = key_fields.iter().map(|(n, _)| n.clone()).collect();
        FilterOperator { alerting: Alerting::new(plan, names), regexes, key_fields }
    }
}

impl Operator for FilterOperator {
    fn on_event(&mut self, _source: usize, event: &Arc<Event>, out: &mut Vec<Alert>) {
        let plan = self.alerting.plan().clone();
        if !super::binds_entities(&plan.sources[0], event) {
            return;
        }
        let events = [Some(event.as_ref())];
        let env = Env::events(&plan.sources, &events, &self.regexes);
        if plan.sources[0].filter.as_ref().is_some_and(|f| !holds(f, &env)) || !holds(&plan.alert.condition, &env) {
            return;
        }
        let key = Key(self.key_fields.iter().map(|(_, f)| event.get(f)).collect());
        self.alerting.matched(&key, event.ts, &env, || vec![event.to_json()], out);
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
}
