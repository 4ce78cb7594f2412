//! Every rule shipped in `rules/` checks clean, and the scenario rules of saql.md are all there.

use std::path::Path;

fn compile_rules() -> Vec<vigil::Compiled> {
    vigil::compile_all(&vigil::ruleset::read_files_under(Path::new("rules")).expect("rules folder is readable"))
}

#[test]
fn every_rule_file_checks_clean() {
    let compiled = compile_rules();
    assert!(compiled.len() >= 14, "rules/ should hold the scenario rules, found {}", compiled.len());
    for c in &compiled {
        assert!(c.is_ok(), "{} has problems:\n{}", c.name, c.source().render(&c.diagnostics, false));
        assert!(!c.plans.is_empty() || !c.streams.is_empty(), "{} declares no rule and no stream", c.name);
        assert!(c.text.trim_start().starts_with("//"), "{} needs a header comment saying what it detects", c.name);
    }
}

#[test]
fn every_model_kind_is_covered() {
    use vigil::plan::Model;
    let plans: Vec<_> = compile_rules().into_iter().flat_map(|c| c.plans).collect();
    for model in [Model::Sequence, Model::TimeSeries, Model::Invariant, Model::Outlier] {
        assert!(plans.iter().any(|p| p.kind() == model), "no rule of kind {model}");
    }
    let names: Vec<&str> = plans.iter().map(|p| p.name.as_str()).collect();
    for scenario in [
        "evicted_then_failed",
        "job_failure_burst",
        "task_never_scheduled",
        "machine_removed_with_tasks",
        "cpu_over_request",
        "machine_cpu_spike",
        "metric_deviation",
        "metric_stuck",
        "host_silent",
        "new_user_on_machine",
        "machine_memory_range",
        "straggler_task",
        "machine_load_outlier",
    ] {
        assert!(names.contains(&scenario), "scenario rule {scenario} is missing");
    }
}

#[test]
fn explain_prints_the_plan_tree() {
    let compiled = compile_rules();
    let spike = compiled.iter().flat_map(|c| &c.plans).find(|p| p.name == "machine_cpu_spike").expect("rule exists");
    let text = spike.to_string();
    let expected = "\
rule machine_cpu_spike (time-series)
  description: Machine CPU over 5 minutes is 1.5x its recent mean and above 0.8
  source #0 e: task_usage
    subject task t, object machine m
  window tumbling 5 min
  state ss[4] group by m (machine_id)
    cpu := sum(e.cpu) : number
  alert when ss[0].cpu > 1.5 * avg(ss[1..3].cpu) and ss[0].cpu > 0.8
    severity warning, for 0 s, keep firing for 0 s
  annotations
    summary = \"machine {m.machine_id}: CPU {ss[0].cpu}, recent mean {avg(ss[1..3].cpu)}\"
  return
    m.machine_id = m.machine_id : string
    cpu = ss[0].cpu : number
    baseline = avg(ss[1..3].cpu) : number
";
    assert_eq!(text, expected);
}
