//! The `vigil` binary as a user runs it: exit codes, rendered output, JSON.

use std::process::Command;

fn vigil(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vigil")).args(args).env("NO_COLOR", "1").output().expect("vigil runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_passes_on_the_shipped_rules() {
    let (code, stdout, _) = vigil(&["check", "rules"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.starts_with("ok: "), "{stdout}");
}

#[test]
fn check_reports_three_mistakes_with_line_column_and_caret() {
    let (code, stdout, _) = vigil(&["check", "tests/diagnostics/11_three_mistakes.saql"]);
    assert_eq!(code, 1);
    for location in ["11_three_mistakes.saql:3:37", "11_three_mistakes.saql:5:12", "11_three_mistakes.saql:5:27"] {
        assert!(stdout.contains(location), "missing {location} in:\n{stdout}");
    }
    let caret_lines =
        stdout.lines().filter(|l| l.contains('│') && l.trim_end().ends_with('^') || l.contains("^ ")).count();
    assert_eq!(caret_lines, 3, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("error[")).count(), 3, "{stdout}");
    assert!(stdout.ends_with("3 problems in 1 of 1 file\n"), "{stdout}");
}

#[test]
fn check_json_lists_file_line_column_code_message() {
    let (code, stdout, _) = vigil(&["check", "--format", "json", "tests/diagnostics/01_unknown_field.saql"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    assert_eq!(v[0]["file"], "tests/diagnostics/01_unknown_field.saql");
    assert_eq!(v[0]["line"], 2);
    assert_eq!(v[0]["column"], 42);
    assert_eq!(v[0]["code"], "E0103");
    assert_eq!(v[0]["message"], "unknown field `cpu_reqest` on event `e` (task_event)");
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(vigil(&["check", "no/such/path.saql"]).0, 2);
    assert_eq!(vigil(&["check", "--format", "yaml"]).0, 2);
    assert_eq!(vigil(&["frobnicate"]).0, 2);
    assert_eq!(vigil(&["explain", "rules"]).0, 2);
}

#[test]
fn explain_prints_each_rule_plan() {
    let (code, stdout, _) = vigil(&["explain", "rules/job_failure_burst.saql"]);
    assert_eq!(code, 0);
    assert!(stdout.starts_with("rule job_failure_burst (rule-based, event sequence)\n"), "{stdout}");
    assert!(stdout.contains("    then e at least 5 times\n    within 15 min\n    partition by t.job_id\n"), "{stdout}");
}

#[test]
fn a_rule_name_in_two_files_is_reported() {
    let dir = std::env::temp_dir().join(format!("vigil-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rule = "rule same { task t fail as e }\n";
    std::fs::write(dir.join("a.saql"), rule).expect("write");
    std::fs::write(dir.join("b.saql"), rule).expect("write");
    let (code, stdout, _) = vigil(&["check", dir.to_str().expect("utf-8")]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 1);
    assert!(stdout.contains("rule `same` is also defined in"), "{stdout}");
}

fn temp_file(name: &str, content: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vigil-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write");
    path
}

const EVENTS_WITH_BAD_LINES: &str = r#"{"stream":"task_event","ts":"2026-01-01T00:00:00Z","type":"EVICT","job_id":"j1","task_index":0,"machine_id":"m1"}
{"stream":"task_event","ts":"2026-01-01T00:01:00Z","type":"EVICT","job_id":"j1"
{"stream":"task_event","ts":"yesterday","type":"FAIL","job_id":"j1","task_index":0,"machine_id":"m2"}
{"stream":"task_event","ts":"2026-01-01T00:04:00Z","type":"FAIL","job_id":"j1","task_index":0,"machine_id":"m2"}
"#;

#[test]
fn replay_reports_malformed_lines_and_goes_on() {
    let input = temp_file("events.jsonl", EVENTS_WITH_BAD_LINES);
    let name = input.to_str().expect("utf-8");
    let (code, stdout, stderr) = vigil(&["replay", "--rules", "rules/evicted_then_failed.saql", name]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(&format!("malformed: {name}:2: invalid JSON")), "{stderr}");
    assert!(
        stderr.contains(&format!("malformed: {name}:3: field `ts`: `yesterday` is not an RFC 3339 time")),
        "{stderr}"
    );
    assert!(stderr.contains("replayed 2 events (2 malformed, 0 late): 1 alerts fired, 1 resolved"), "{stderr}");
    let alerts: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("alert JSON")).collect();
    assert_eq!(alerts.len(), 2);
    assert_eq!(alerts[0]["rule"], "evicted_then_failed");
    assert_eq!(alerts[0]["status"], "firing");
    assert_eq!(alerts[0]["evidence"].as_array().map(Vec::len), Some(2), "the evicting and failing events");
}

#[test]
fn replay_strict_stops_at_the_first_malformed_line() {
    let input = temp_file("strict.jsonl", EVENTS_WITH_BAD_LINES);
    let name = input.to_str().expect("utf-8");
    let (code, stdout, stderr) = vigil(&["replay", "--strict", "--rules", "rules/evicted_then_failed.saql", name]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains(&format!("stopped at the first malformed line (--strict): {name}:2")), "{stderr}");
}

#[test]
fn replay_is_deterministic() {
    let input = temp_file("twice.jsonl", EVENTS_WITH_BAD_LINES);
    let name = input.to_str().expect("utf-8");
    let first = vigil(&["replay", "--rules", "rules", name]).1;
    let second = vigil(&["replay", "--rules", "rules", name]).1;
    assert!(!first.is_empty());
    assert_eq!(first, second);
}

#[test]
fn replay_with_workers_gives_the_alerts_and_summary_of_one() {
    let sorted = |out: String| {
        let mut lines: Vec<String> = out.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    let (code, one, one_summary) = vigil(&["replay", "--rules", "rules", "samples/datacenter.jsonl"]);
    assert_eq!(code, 0, "{one_summary}");
    let one = sorted(one);
    assert!(one.len() > 10, "the sample raises alerts: {one_summary}");
    for workers in ["2", "3", "8"] {
        let (code, split, summary) =
            vigil(&["replay", "--rules", "rules", "samples/datacenter.jsonl", "--workers", workers]);
        assert_eq!(code, 0, "{summary}");
        assert_eq!(sorted(split), one, "--workers {workers}");
        assert_eq!(summary, one_summary, "--workers {workers}");
    }
    let (code, _, err) = vigil(&["replay", "--rules", "rules", "samples/datacenter.jsonl", "--workers", "0"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn bench_writes_the_events_it_would_run_and_runs_them_back_the_same() {
    let path = temp_file("bench-events.jsonl", "");
    let name = path.to_str().expect("utf-8");
    let workload = ["--workload", "sequence", "--events", "20000", "--keys", "50", "--json"];
    let (code, stdout, stderr) = vigil(&[&["bench", "--write-events", name][..], &workload].concat());
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.is_empty(), "writing the events runs nothing: {stdout}");
    let text = std::fs::read_to_string(&path).expect("the events were written");
    assert_eq!(text.lines().count(), 20000);
    let first: serde_json::Value = serde_json::from_str(text.lines().next().expect("a line")).expect("JSON");
    assert_eq!(first["stream"], "task_usage");
    assert_eq!(first["machine_id"], "m0");

    let report = |args: &[&str]| -> serde_json::Value {
        let (code, stdout, stderr) = vigil(&[&["bench"][..], args, &workload].concat());
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str(&stdout).expect("a JSON report")
    };
    let generated = report(&[]);
    let read_back = report(&["--input", name]);
    assert!(generated["alerts"].as_u64().is_some_and(|n| n > 0), "{generated}");
    assert_eq!(generated["alerts"], read_back["alerts"]);
    assert_eq!(read_back["events"], 20000);
    assert_eq!(read_back["malformed"], 0);
}

#[test]
fn vigil_test_runs_the_rule_tests() {
    let (code, stdout, _) = vigil(&["test", "rules/tests/host_silent.toml"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.trim_end().ends_with("7 passed, 0 failed"), "{stdout}");
}

#[test]
fn kafka_options_reach_librdkafka_and_vigils_own_are_refused() {
    let db = temp_file("kafka-options.db", "");
    let url = format!("sqlite://{}", db.display());
    let serve = |option: &str| {
        vigil(&[
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--database-url",
            &url,
            "--kafka-brokers",
            "127.0.0.1:1",
            "--kafka-option",
            option,
        ])
    };
    // librdkafka itself names a property it does not know: the option got to it.
    let (code, _, stderr) = serve("no.such.property=1");
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("cannot create the Kafka consumer"), "{stderr}");
    assert!(stderr.contains("no.such.property"), "{stderr}");
    let (code, _, stderr) = serve("group.id=other");
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`group.id` is set by Vigil; use --kafka-group"), "{stderr}");
}

#[test]
fn produce_takes_kafka_options_too() {
    let (code, _, stderr) = vigil(&[
        "produce",
        "--brokers",
        "127.0.0.1:1",
        "--kafka-option",
        "no.such.property=1",
        "samples/datacenter.jsonl",
    ]);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("no.such.property"), "{stderr}");
}

#[test]
fn explain_physical_prints_what_the_engine_builds_from_a_rule_set() {
    let (code, stdout, stderr) = vigil(&["explain", "--physical", "rules"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("operators\n"), "{stdout}");
    assert!(stdout.contains("sequence: evicted_then_failed"), "{stdout}");
    assert!(stdout.contains("shared filters (each evaluated once per event)"), "{stdout}");
    assert!(stdout.contains("    type FAIL -> #1 (evicted_then_failed); #3 (job_failure_burst)"), "{stdout}");
    assert!(stdout.contains("#17 (metric_saturation) after f4"), "{stdout}");
    assert!(stdout.contains("\"counter\" -> #14 (counter_rate_deviation)"), "{stdout}");
    assert!(stdout.contains("gate\n"), "{stdout}");
    // Rules that compute the same windowed state share one operator.
    let dir = std::env::temp_dir().join(format!("vigil-physical-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let shared = "rule a { task t use machine m as e #time(1 min) state ss { c := avg(e.cpu) } group by m alert ss.c > 0.5 }
                  rule b { task t use machine m as e #time(1 min) state ss { c := avg(e.cpu) } group by m alert ss.c > 0.9 }
                  rule c { task t use machine m as e where e.cpu > 0.99 }";
    std::fs::write(dir.join("shared.saql"), shared).expect("write");
    let (code, stdout, _) = vigil(&["explain", "--physical", dir.to_str().expect("utf-8")]);
    assert_eq!(code, 0);
    assert!(stdout.contains("window (shared state): a, b"), "{stdout}");
    assert!(stdout.contains("task_usage: every event is built"), "{stdout}");
    std::fs::write(dir.join("shared.saql"), "rule c { task t use machine m as e where e.cpu > 0.99 }").expect("write");
    let (_, stdout, _) = vigil(&["explain", "--physical", dir.to_str().expect("utf-8")]);
    assert!(stdout.contains("task_usage: judged from its numbers (1 filter)"), "{stdout}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn eval_budget_gathers_series_onto_hosts_and_counts_their_roll_ups_as_pages() {
    let rules = temp_file(
        "hot.saql",
        r#"rule hot {
  metric s sample as e #time(10 min)
  state ss { v := avg(e.value) } group by s
  alert ss.v > 75 severity warning
  rollup by s.host severity critical
}
"#,
    );
    // Five machines of one series each, two days of ten-minute samples; one machine hot for
    // ten minutes every five hours, then all five at once in the last hour.
    const MIN: i64 = 60_000;
    let mut lines = String::new();
    for t in (0..48 * 60 * MIN).step_by(10 * MIN as usize) {
        for m in 0..5 {
            let hot = (47 * 60 * MIN..47 * 60 * MIN + 10 * MIN).contains(&t) || (m == 0 && t % (5 * 60 * MIN) == 0);
            let value = if hot { 90 } else { 10 };
            lines.push_str(&format!(r#"{{"stream":"metric","ts":{t},"host":"vm{m}","name":"cpu","value":{value}}}"#));
            lines.push('\n');
        }
    }
    let input = temp_file("fleet.jsonl", &lines);
    let args = |hosts: Option<&str>| {
        let mut a = vec!["eval", "--budget", "--rules", rules.to_str().unwrap(), input.to_str().unwrap()];
        if let Some(h) = hosts {
            a.extend(["--hosts", h]);
        }
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |hosts: Option<&str>| {
        let a = args(hosts);
        let (code, out, err) = vigil(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "{err}");
        out
    };
    let apart = run(None);
    assert!(apart.contains("5 series on 5 hosts"), "{apart}");
    assert!(apart.contains("Pages (critical): 0,"), "a machine of one series never rolls up: {apart}");
    let together = run(Some("1"));
    assert!(together.contains("5 series on 1 hosts"), "{together}");
    assert!(together.contains("Pages (critical): 1,"), "the last hour is one page: {together}");
    let (code, _, err) = vigil(&["eval", "--hosts", "2", input.to_str().unwrap()]);
    assert_eq!(code, 2, "--hosts needs --budget: {err}");
}

#[test]
fn eval_outages_finds_cut_silences_and_none_in_a_steady_feed() {
    // Ten days of five-minute samples: every cut outage is found, fifteen minutes after the
    // last sample before it, and the feed raises no silence of its own.
    let dir = std::env::temp_dir().join(format!("vigil-outages-{}", std::process::id()));
    let family = dir.join("steady");
    std::fs::create_dir_all(&family).unwrap();
    let mut csv = String::from("timestamp,value\n");
    for i in 0..(10 * 288) {
        let (day, minute) = (i / 288, (i % 288) * 5);
        csv.push_str(&format!("2026-01-{:02} {:02}:{:02}:00,{}\n", day + 1, minute / 60, minute % 60, i % 7));
    }
    std::fs::write(family.join("feed.csv"), csv).unwrap();
    let (code, out, err) = vigil(&["eval", "--outages", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().find(|l| l.starts_with("| steady |")).unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
    assert_eq!(&cells[3..8], ["3", "3", "15 min", "0", "0"], "{out}");
    assert_eq!(cells[8], "0", "no silence outside the cuts: {out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `vigil replay` names the host mappings as `vigil serve` does (`--influx-host-tag`), and takes
/// its former names (`--host-tag`) too.
#[test]
fn replay_maps_hosts_under_serves_flag_names_and_the_former_ones() {
    let rule = temp_file(
        "hot.saql",
        "rule hot {\n  host h report metric s as e where e.name == \"temp\" #time(1 min)\n  \
         state ss { t := max(e.value) } group by h\n  alert ss.t > 50\n  return h.host\n}\n",
    );
    let lines = "temp,node=rack7 value=80 1767225600000000000\ntemp,node=rack7 value=81 1767225720000000000\n";
    let input = temp_file("temps.lp", lines);
    let (rule, input) = (rule.to_str().expect("utf-8"), input.to_str().expect("utf-8"));
    let host_of = |flag: Option<&str>| {
        let mut args = vec!["replay", "--format", "influx", "--rules", rule, input];
        if let Some(flag) = flag {
            args.extend([flag, "node"]);
        }
        let (code, stdout, stderr) = vigil(&args);
        assert_eq!(code, 0, "{flag:?}: {stderr}");
        let alert: serde_json::Value = serde_json::from_str(stdout.lines().next().expect("an alert")).expect("JSON");
        alert["key"]["h.host"].as_str().expect("a host").to_string()
    };
    assert_eq!(host_of(Some("--influx-host-tag")), "rack7");
    assert_eq!(host_of(Some("--host-tag")), "rack7");
    assert_eq!(host_of(None), "fleet", "no `host` tag: the fleet's host");
}
