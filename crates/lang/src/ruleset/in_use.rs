//! What a change to a rule set does to the streams its running rules read: a change that
//! removes a stream, or changes a field's type under a rule it leaves as it was, is refused
//! (E0405). A rule changed in the same change was rewritten for the new declaration; one left
//! alone would be read against fields it was not written for.

use super::{RuleSet, RuleSetError};
use crate::diagnostic::codes;
use crate::schema::Stream;
use std::collections::BTreeMap;

/// A running rule: its name, its text as written, and the streams it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningRule {
    pub name: String,
    pub text: String,
    pub streams: Vec<Stream>,
}

impl RuleSet {
    /// Every rule of the set, with the streams it reads: what [`RuleSet::keeps_streams_of`]
    /// compares a later set with.
    pub fn running(&self) -> Vec<RunningRule> {
        let texts = self.rule_texts();
        self.plans()
            .into_iter()
            .map(|p| {
                let mut streams: Vec<Stream> = p.sources.iter().map(|s| s.stream).collect();
                streams.dedup();
                RunningRule { text: texts.get(&p.name).cloned().unwrap_or_default(), name: p.name, streams }
            })
            .collect()
    }

    /// Refuses this set in place of one whose rules were `before`, when it removes a stream, or
    /// changes the type of one of its fields (or drops it), that a rule it keeps unchanged reads.
    /// Judged before the set is checked: such a rule no longer checks, and this says why.
    pub fn keeps_streams_of(&self, before: &[RunningRule]) -> Result<(), RuleSetError> {
        let after = self.rule_texts();
        // By stream name: what the change does to it, and the unchanged rules that read it.
        let mut problems: BTreeMap<&str, (String, Vec<&str>)> = BTreeMap::new();
        for rule in before.iter().filter(|r| after.get(&r.name) == Some(&r.text)) {
            for &stream in &rule.streams {
                let Some(what) = self.change_to(stream) else { continue };
                problems.entry(stream.name()).or_insert((what, Vec::new())).1.push(&rule.name);
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = problems
            .into_iter()
            .map(|(_, (what, rules))| {
                format!(
                    "error[{}]: this change {what}, which {} {} {} as {}\n  = help: change {} in the same change, or first remove {}\n",
                    codes::STREAM_IN_USE,
                    if rules.len() == 1 { "rule" } else { "rules" },
                    rules.join(", "),
                    if rules.len() == 1 { "reads" } else { "read" },
                    if rules.len() == 1 { "it stands" } else { "they stand" },
                    if rules.len() == 1 { "it" } else { "them" },
                    if rules.len() == 1 { "it" } else { "them" },
                )
            })
            .collect();
        Err(RuleSetError::StreamsInUse(lines.concat()))
    }

    /// Every rule's text as written, checked or not, by name.
    fn rule_texts(&self) -> BTreeMap<String, String> {
        self.files
            .iter()
            .flat_map(|c| {
                c.rule_spans
                    .iter()
                    .map(|(name, s)| (name.clone(), c.text.get(s.start..s.end).unwrap_or_default().to_string()))
            })
            .collect()
    }

    /// What the set does to `stream` of an earlier set, when that breaks its readers: gone, or
    /// a field of it gone or of another type.
    fn change_to(&self, stream: Stream) -> Option<String> {
        let Some(now) = self.catalog().stream(stream.name()) else {
            return Some(format!("removes stream `{}`", stream.name()));
        };
        if now == stream {
            return None;
        }
        stream.fields().iter().find_map(|(name, ty)| match now.field(name) {
            None => Some(format!("removes field `{name}` of stream `{}`", stream.name())),
            Some(t) if t != *ty => {
                Some(format!("makes field `{name}` of stream `{}` a {t} (it was a {ty})", stream.name()))
            }
            Some(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "// pods\nentity pod (namespace, pod)\n\
        stream k8s_event { fields { namespace: string, pod: string, reason: string, count?: number }\n\
        entity pod (namespace, pod) operation reason op pod evict = \"Evicted\" }\n";
    const RULE: &str = "// evictions\nrule evictions { pod p evict as e #time(1 h) state ss { n := sum(e.count) } group by p alert ss.n > 3 }\n";

    fn set(streams: &str, rules: &str) -> RuleSet {
        RuleSet::from_sources(&[("streams.saql".into(), streams.into()), ("rules.saql".into(), rules.into())])
    }

    #[test]
    fn a_change_that_takes_a_stream_or_a_field_s_type_from_an_unchanged_rule_is_refused() {
        let before = set(STREAM, RULE);
        assert!(before.is_ok(), "{}", before.render(false));
        let running = before.running();
        assert_eq!(running[0].streams, vec![before.catalog().stream("k8s_event").expect("declared")]);
        // Adding a field changes the declaration but takes nothing from the rule.
        set(&STREAM.replace("count?: number", "count?: number, node?: string"), RULE)
            .keeps_streams_of(&running)
            .expect("a field added is no change to the rule");
        let removed = set("// nothing\n", RULE).keeps_streams_of(&running).expect_err("refused");
        assert_eq!(
            removed.to_string(),
            "the change is refused:\nerror[E0405]: this change removes stream `k8s_event`, which rule evictions reads \
             as it stands\n  = help: change it in the same change, or first remove it\n"
        );
        let retyped = set(&STREAM.replace("count?: number", "count?: string"), RULE);
        let err = retyped.keeps_streams_of(&running).expect_err("refused").to_string();
        assert!(err.contains("makes field `count` of stream `k8s_event` a string (it was a number)"), "{err}");
        // The rule changed in the same change was written for the new declaration.
        let rewritten = RULE.replace("sum(e.count)", "count()");
        set(&STREAM.replace("count?: number", "count?: string"), &rewritten).keeps_streams_of(&running).expect("taken");
        set("// nothing\n", "// no rules\n").keeps_streams_of(&running).expect("the rule goes with its stream");
    }
}
