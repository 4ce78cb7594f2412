//! Monitoring Vigil the way Prometheus users monitor a service: the alerting rules and the
//! Grafana dashboard in `monitoring/`.

use std::collections::BTreeSet;
use std::process::Command;

/// The `vigil_...` names in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("vigil_") {
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

#[test]
fn the_rules_and_the_dashboard_read_only_metrics_vigil_exports() {
    let exported = metric_names(&std::fs::read_to_string("crates/service/src/telemetry.rs").expect("telemetry"));
    let rules = std::fs::read_to_string("monitoring/vigil-alerts.yml").expect("rules");
    // Its comments name Vigil's own self-alert, which is no metric.
    let rules: String = rules.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    let dashboard = std::fs::read_to_string("monitoring/vigil-dashboard.json").expect("dashboard");
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| p.len() >= 10), "panels");
    let read: BTreeSet<String> = metric_names(&rules).into_iter().chain(metric_names(&dashboard)).collect();
    assert!(read.len() >= 10, "{read:?}");
    for name in read {
        let base =
            ["_bucket", "_sum", "_count"].iter().fold(name.clone(), |n, s| n.strip_suffix(s).unwrap_or(&n).to_string());
        assert!(exported.contains(&base), "{name} is not a metric Vigil exports");
    }
}

#[test]
#[ignore = "needs promtool: run scripts/test.sh"]
fn promtool_checks_the_rules_and_passes_their_tests() {
    let promtool = std::env::var("VIGIL_TEST_PROMTOOL").unwrap_or_else(|_| "promtool".to_string());
    for args in [["check", "rules", "vigil-alerts.yml"], ["test", "rules", "vigil-alerts.test.yml"]] {
        let out = Command::new(&promtool).args(args).current_dir("monitoring").output().unwrap_or_else(|e| {
            panic!("{promtool} does not start ({e}): scripts/test.sh installs Debian's prometheus")
        });
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "promtool {args:?}:\n{text}");
        assert!(text.contains("SUCCESS"), "{text}");
    }
}
