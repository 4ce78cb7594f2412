//! The behaviour cases in `rules/tests/` (the same files `vigil test` runs) all pass, and there
//! are enough of them to cover every shipped rule.

#[test]
fn every_rule_test_case_passes() {
    let files = vigil::ruletest::test_files(&["rules/tests".into()]).expect("rules/tests is readable");
    let mut out = Vec::new();
    let report = vigil::ruletest::run(&files, &vigil::settings::EngineSettings::batch(), &mut out).expect("runs");
    let text = String::from_utf8_lossy(&out);
    assert_eq!(report.failed, 0, "{text}");
    assert!(report.passed >= 40, "only {} cases", report.passed);
}

#[test]
fn every_shipped_rule_has_a_test_file() {
    let mut tested = String::new();
    for entry in std::fs::read_dir("rules/tests").expect("rules/tests is readable") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            tested.push_str(&std::fs::read_to_string(path).expect("readable"));
        }
    }
    for dir in ["rules", "rules/metrics"] {
        for entry in std::fs::read_dir(dir).expect("rules folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "saql") {
                let file = path.file_name().expect("name").to_string_lossy().into_owned();
                assert!(tested.contains(&format!("/{file}\"")), "{file} has no test file in rules/tests");
            }
        }
    }
}

#[test]
fn a_wrong_expectation_fails_with_a_diff() {
    let dir = std::env::temp_dir().join(format!("vigil-ruletest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rules = std::fs::canonicalize("rules/evicted_then_failed.saql").expect("rule exists");
    let test = format!(
        r#"rules = [{rules:?}]
[[case]]
name = "wrong time"
events = '''
{{"stream":"task_event","ts":"2026-01-01T00:00:00Z","type":"EVICT","job_id":"j1","task_index":0,"machine_id":"m1"}}
{{"stream":"task_event","ts":"2026-01-01T00:04:00Z","type":"FAIL","job_id":"j1","task_index":0,"machine_id":"m2"}}
'''
[[case.expect]]
rule = "evicted_then_failed"
time = "2026-01-01T00:05:00Z"
"#
    );
    let path = dir.join("wrong.toml");
    std::fs::write(&path, test).expect("write");
    let mut out = Vec::new();
    let report = vigil::ruletest::run(&[path], &vigil::settings::EngineSettings::batch(), &mut out).expect("runs");
    std::fs::remove_dir_all(&dir).ok();
    let text = String::from_utf8_lossy(&out);
    assert_eq!((report.passed, report.failed), (0, 1), "{text}");
    assert!(text.contains("- expected  firing evicted_then_failed at 2026-01-01T00:05:00Z"), "{text}");
    assert!(text.contains("+ unexpected firing evicted_then_failed at 2026-01-01T00:04:00.000Z"), "{text}");
    assert!(text.trim_end().ends_with("0 passed, 1 failed"), "{text}");
}
