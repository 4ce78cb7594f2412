//! `vigil why` on a NAB anomaly window that `rules/metrics` misses: the change it proposes is
//! checked here apart from its own replay, by `vigil replay` of the rule file edited with it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// NAB's AWS series whose second labelled window (2014-02-27 08:55 to 02-28 01:35) no rule of
/// `rules/metrics` alerts in.
fn nab() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/nab/realAWSCloudwatch/ec2_cpu_utilization_24ae8d.csv")
}

const FROM: &str = "2014-02-27T08:55:00Z";
const TO: &str = "2014-02-28T01:35:00Z";

fn vigil(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vigil")).args(args).output().expect("vigil runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// Firing `metric_deviation` alerts of `vigil replay --rules RULES` over the series within the
/// window.
fn fired_in_window(rules: &Path) -> usize {
    let (code, out, err) =
        vigil(&["replay", "--rules", rules.to_str().expect("utf-8"), nab().to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    out.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("an alert"))
        .filter(|a| a["status"] == "firing" && a["rule"] == "metric_deviation")
        .filter(|a| {
            let t = a["time"].as_str().expect("time");
            (FROM.trim_end_matches('Z')..=TO.trim_end_matches('Z')).contains(&&t[..19])
        })
        .count()
}

#[test]
fn a_missed_window_gets_the_change_that_a_replay_of_the_edited_rule_confirms() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/metrics");
    let dir = crate::support::temp_dir("why");
    let plot = dir.join("why.svg");
    let nab = nab();
    let args = [
        "why",
        "--rule",
        "metric_deviation",
        "--rules",
        rules.to_str().expect("utf-8"),
        "--from",
        FROM,
        "--to",
        TO,
        "--json",
        "--plot",
        plot.to_str().expect("utf-8"),
        nab.to_str().expect("utf-8"),
    ];
    let (code, out, err) = vigil(&args);
    assert_eq!(code, 1, "exit 1: the rule as written did not alert. {err}");
    let answer: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(answer["caught"], false);
    let group = &answer["groups"][0];
    assert_eq!(group["key"], "s.host=24ae8d s.name=ec2_cpu_utilization");
    assert!(group["verdict"].as_str().expect("verdict").contains("closest at"), "{}", group["verdict"]);
    let change = &answer["changes"][0];
    assert!(change["caught"].is_object(), "the smallest change catches it: {change}");
    let (text, to) = (change["text"].as_str().expect("text"), change["to"].as_f64().expect("to"));
    let (name, rest) = text.split_once(' ').expect("`name op literal`");
    let (op, from) = rest.split_once(' ').expect("`op literal`");
    assert!(change["cost"]["alerts"].as_u64() > answer["cost"]["alerts"].as_u64(), "a lower bar costs alerts");
    assert!(std::fs::read_to_string(&plot).expect("the plot").contains(&format!("changed to {}", trimmed(to))));

    // The rule file edited with the change, replayed: an alert in the window, none without it.
    assert_eq!(fired_in_window(&rules), 0, "the shipped folder misses the window");
    let source = std::fs::read_to_string(rules.join("metric_deviation.saql")).expect("the rule");
    let written = format!("{name} {op} {from}");
    assert_eq!(source.matches(&written).count(), 1, "`{written}` is written once in the rule");
    let edited = dir.join("rules");
    std::fs::create_dir_all(&edited).expect("mkdir");
    std::fs::write(edited.join("metric_deviation.saql"), source.replace(&written, &format!("{name} {op} {to}")))
        .expect("write");
    assert!(fired_in_window(&edited) >= 1, "`{name} {op} {to}` catches the window in a replay too");
    std::fs::remove_dir_all(&dir).ok();
}

/// A number as the plot labels it (four significant digits).
fn trimmed(n: f64) -> String {
    let text = format!("{n:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[test]
fn a_question_vigil_cannot_answer_says_why() {
    let nab = nab();
    let nab = nab.to_str().expect("utf-8");
    let (code, _, err) = vigil(&["why", "--rule", "no_such_rule", "--from", FROM, "--to", TO, nab]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no rule `no_such_rule` in rules/metrics: it has") && err.contains("metric_deviation"),
        "{err}"
    );
    let (code, _, err) = vigil(&["why", "--rule", "metric_deviation", "--from", TO, "--to", FROM, nab]);
    assert_eq!(code, 2);
    assert!(err.contains("--to (2014-02-27T08:55:00.000Z) is before --from"), "{err}");
    let (code, _, err) = vigil(&["why", "--rule", "metric_deviation", "--from", "last tuesday", "--to", TO, nab]);
    assert_eq!(code, 2);
    assert!(err.contains("--from: `last tuesday` is not a time"), "{err}");
}
