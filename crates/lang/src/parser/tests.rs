use super::*;

#[test]
fn parses_a_sequence_rule() {
    let src = r#"
        rule r {
          task t evict machine m1 as e1
          task t fail machine m2 as e2 where e2.priority >= 9
          with e1 -> e2 within 10 min, m1 != m2
          alert true severity warning
          return t.job_id, m1.machine_id as from
        }"#;
    let (file, diags) = parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let r = &file.rules[0];
    assert_eq!(r.patterns.len(), 2);
    let w = r.with.as_ref().unwrap();
    assert_eq!(w.within.unwrap().millis, 600_000);
    assert_eq!(w.conditions[0].to_string(), "m1 != m2");
    assert_eq!(r.returns.as_ref().unwrap()[1].alias.as_ref().unwrap().name, "from");
}

#[test]
fn precedence_and_printing_round_trip() {
    let src = "rule r { metric m sample as e alert not a + b * c > 2 and d or -e.x < 1 }";
    let (file, diags) = parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let cond = file.rules[0].alert.as_ref().unwrap().condition.as_ref().unwrap();
    assert_eq!(cond.to_string(), "not a + b * c > 2 and d or -e.x < 1");
    match &cond.kind {
        ExprKind::Binary(BinOp::Or, l, _) => assert!(matches!(l.kind, ExprKind::Binary(BinOp::And, _, _))),
        other => panic!("expected `or` at the top, got {other:?}"),
    }
}

#[test]
fn durations_and_counts() {
    let src = "rule r { task t fail as e with e{5,} within 1.5 h group by t.job_id alert true }";
    let (file, diags) = parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let w = file.rules[0].with.as_ref().unwrap();
    assert_eq!(w.within.unwrap().millis, 5_400_000);
    assert_eq!(w.steps[0].kind, StepKind::Count { min: 5 });
}

#[test]
fn recovers_at_the_next_rule() {
    let src = "rule a { task t fail as e alert ( }\nrule b { task t fail as e alert true }\nrule c { alert severity }";
    let (file, diags) = parse(src);
    assert_eq!(file.rules.len(), 1);
    assert_eq!(file.rules[0].name.name, "b");
    assert_eq!(diags.len(), 2);
}

#[test]
fn durations_from_the_command_line() {
    assert_eq!(parse_duration("5s"), Ok(5_000));
    assert_eq!(parse_duration("5m"), Ok(300_000), "minutes, as PromQL writes them");
    assert_eq!(parse_duration("500ms"), Ok(500));
    assert!(parse_duration("5 mb").is_err());
    assert_eq!(parse_duration(" 1.5 h "), Ok(5_400_000));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("99999 w").is_err());
}

#[test]
fn templates_split_into_holes() {
    let src =
        r#"rule r { metric m sample as e alert true annotations { summary = "cpu {e.value} on {m.host} {{x}}" } }"#;
    let (file, diags) = parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let t = &file.rules[0].annotations[0].template;
    assert_eq!(t.parts.len(), 5);
    assert_eq!(t.parts[4], TemplatePart::Text(" {x}".to_string()));
}

#[test]
fn nesting_limit_counts_cardinality_bars() {
    let deep = format!("rule r {{ alert {}x{} > 0 }}", "|".repeat(100), "|".repeat(100));
    let (_, diags) = parse(&deep);
    assert_eq!(diags[0].code, codes::TOO_DEEP);
    let flat = format!("rule r {{ alert {} > 0 }}", vec!["|a|"; 100].join(" + "));
    let (_, diags) = parse(&flat);
    assert!(diags.iter().all(|d| d.code != codes::TOO_DEEP), "{diags:?}");
}
