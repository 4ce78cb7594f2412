//! rules/node/ beside the node-mixin's alerts in PromQL (tests/data/node-mixin/alerts.yml), over
//! the same samples: for each alert a scenario of node_exporter series that should raise it,
//! replayed through `vigil replay --rules rules/node` and evaluated by a real Prometheus
//! (`promtool test rules`, Prometheus' own rule evaluation, which scripts/test.sh installs;
//! VIGIL_TEST_PROMTOOL names another). Every rule of the folder must fire, and Prometheus must
//! agree on which alerts fire and when: firing `tolerance` after Vigil first fires, and not yet
//! `tolerance` plus one evaluation before.

use crate::support::*;
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;

/// Prometheus' evaluation interval here, and the windows' slide in rules/node/.
const EVAL_SECONDS: i64 = 15;

/// One series of a scenario: its name, labels beyond `instance` and `job`, and a value (or
/// none) at each step.
struct Series {
    name: &'static str,
    labels: Vec<(&'static str, &'static str)>,
    values: Vec<Option<f64>>,
}

/// Samples of one host that should raise one alert.
struct Scenario {
    /// The host, and the scenario's name.
    host: &'static str,
    alertname: &'static str,
    severity: &'static str,
    /// Seconds between samples.
    step: i64,
    series: Vec<Series>,
    /// The alert's labels in PromQL beyond `instance`, `job`, `alertname` and `severity`.
    labels: Vec<(&'static str, &'static str)>,
    /// How far apart the two may fire, in seconds: an evaluation, or the slide of a rule's
    /// longer windows.
    tolerance: i64,
}

fn series(name: &'static str, labels: &[(&'static str, &'static str)], steps: usize, f: impl Fn(f64) -> f64) -> Series {
    Series { name, labels: labels.to_vec(), values: (0..steps).map(|i| Some(f(i as f64))).collect() }
}

const FS: [(&str, &str); 3] = [("device", "/dev/sda1"), ("fstype", "ext4"), ("mountpoint", "/")];

/// A filesystem whose free share (of 1e9) follows `free_percent` at each step.
fn filesystem(free: &'static str, total: &'static str, steps: usize, free_percent: impl Fn(f64) -> f64) -> Vec<Series> {
    vec![
        series(free, &FS, steps, |i| free_percent(i) * 1e7),
        series(total, &FS, steps, |_| 1e9),
        series("node_filesystem_readonly", &FS, steps, |_| 0.0),
    ]
}

fn scenario(host: &'static str, alertname: &'static str, severity: &'static str, series: Vec<Series>) -> Scenario {
    Scenario { host, alertname, severity, step: EVAL_SECONDS, series, labels: Vec::new(), tolerance: EVAL_SECONDS }
}

fn scenarios() -> Vec<Scenario> {
    let fs_labels = FS.to_vec();
    let by_minute = |mut s: Scenario| {
        // Six-hour windows end every 5 minutes.
        s.step = 60;
        s.tolerance = 300;
        s.labels = FS.to_vec();
        s
    };
    let with = |mut s: Scenario, labels: &[(&'static str, &'static str)]| {
        s.labels = labels.to_vec();
        s
    };
    let (space, size, files, inodes) = (
        "node_filesystem_avail_bytes",
        "node_filesystem_size_bytes",
        "node_filesystem_files_free",
        "node_filesystem_files",
    );
    // A counter's rate changes at step `HEALTHY`: before it, the host is healthy and every range
    // is full, so neither side's reading of a range that is not (PromQL extrapolates to the
    // range's edges, Vigil reads the slope the samples show) decides when an alert fires.
    const HEALTHY: f64 = 40.0;
    let counter_at = |before: f64, after: f64| {
        move |i: f64| {
            let seconds = |steps: f64| steps * EVAL_SECONDS as f64;
            1e6 + before * seconds(i.min(HEALTHY)) + after * seconds((i - HEALTHY).max(0.0))
        }
    };
    let cpu = |steps: usize, busy_per_cpu: f64| {
        let mut out = Vec::new();
        for c in ["0", "1"] {
            let labels = |mode| vec![("cpu", c), ("mode", mode)];
            let per_mode =
                [("user", 0.25, busy_per_cpu - 0.05), ("system", 0.05, 0.05), ("idle", 0.7, 1.0 - busy_per_cpu)];
            for (mode, before, after) in per_mode {
                let values = (0..steps).map(|i| Some(counter_at(before, after)(i as f64))).collect();
                out.push(Series { name: "node_cpu_seconds_total", labels: labels(mode), values });
            }
        }
        out
    };
    let counter = |per_s: f64| counter_at(per_s / 100.0, per_s);
    vec![
        // Filling up at the rate of the last six hours: gone within 20 h (warning), 3 h (both).
        by_minute(scenario(
            "fs-filling",
            "NodeFilesystemSpaceFillingUp",
            "warning",
            filesystem(space, size, 480, |m| 38.0 - 38.0 * m / 1200.0),
        )),
        by_minute(scenario(
            "fs-filling-fast",
            "NodeFilesystemSpaceFillingUp",
            "critical",
            filesystem(space, size, 120, |m| 19.0 - 19.0 * m / 180.0),
        )),
        with(
            scenario(
                "fs-almost-full",
                "NodeFilesystemAlmostOutOfSpace",
                "warning",
                filesystem(space, size, 180, |_| 4.0),
            ),
            &fs_labels,
        ),
        with(
            scenario("fs-full", "NodeFilesystemAlmostOutOfSpace", "critical", filesystem(space, size, 180, |_| 2.0)),
            &fs_labels,
        ),
        by_minute(scenario(
            "inodes-filling",
            "NodeFilesystemFilesFillingUp",
            "warning",
            filesystem(files, inodes, 480, |m| 38.0 - 38.0 * m / 1200.0),
        )),
        by_minute(scenario(
            "inodes-filling-fast",
            "NodeFilesystemFilesFillingUp",
            "critical",
            filesystem(files, inodes, 120, |m| 19.0 - 19.0 * m / 180.0),
        )),
        with(
            scenario(
                "inodes-almost-gone",
                "NodeFilesystemAlmostOutOfFiles",
                "warning",
                filesystem(files, inodes, 300, |_| 4.0),
            ),
            &fs_labels,
        ),
        with(
            scenario(
                "inodes-gone",
                "NodeFilesystemAlmostOutOfFiles",
                "critical",
                filesystem(files, inodes, 300, |_| 2.0),
            ),
            &fs_labels,
        ),
        with(
            scenario(
                "rx-errors",
                "NodeNetworkReceiveErrs",
                "warning",
                vec![
                    series("node_network_receive_errs_total", &[("device", "eth0")], 320, counter(20.0)),
                    series(
                        "node_network_receive_packets_total",
                        &[("device", "eth0")],
                        320,
                        counter_at(1000.0, 1000.0),
                    ),
                ],
            ),
            &[("device", "eth0")],
        ),
        with(
            scenario(
                "tx-errors",
                "NodeNetworkTransmitErrs",
                "warning",
                vec![
                    series("node_network_transmit_errs_total", &[("device", "eth0")], 320, counter(20.0)),
                    series(
                        "node_network_transmit_packets_total",
                        &[("device", "eth0")],
                        320,
                        counter_at(1000.0, 1000.0),
                    ),
                ],
            ),
            &[("device", "eth0")],
        ),
        scenario(
            "conntrack",
            "NodeHighNumberConntrackEntriesUsed",
            "warning",
            vec![
                series("node_nf_conntrack_entries", &[], 20, |_| 800.0),
                series("node_nf_conntrack_entries_limit", &[], 20, |_| 1000.0),
            ],
        ),
        scenario(
            "textfile",
            "NodeTextFileCollectorScrapeError",
            "warning",
            vec![series("node_textfile_scrape_error", &[], 20, |_| 1.0)],
        ),
        scenario(
            "clock-skew",
            "NodeClockSkewDetected",
            "warning",
            vec![series("node_timex_offset_seconds", &[], 80, |i| 0.06 + 1e-5 * i)],
        ),
        scenario(
            "clock-unsynced",
            "NodeClockNotSynchronising",
            "warning",
            vec![
                series("node_timex_sync_status", &[], 80, |_| 0.0),
                series("node_timex_maxerror_seconds", &[], 80, |_| 16.5),
            ],
        ),
        with(
            scenario(
                "raid-degraded",
                "NodeRAIDDegraded",
                "critical",
                vec![
                    series("node_md_disks_required", &[("device", "md0")], 80, |_| 2.0),
                    series("node_md_disks", &[("device", "md0"), ("state", "active")], 80, |_| 1.0),
                ],
            ),
            &[("device", "md0")],
        ),
        with(
            scenario(
                "raid-disk-failed",
                "NodeRAIDDiskFailure",
                "warning",
                vec![series("node_md_disks", &[("device", "md0"), ("state", "failed")], 20, |_| 1.0)],
            ),
            &[("device", "md0"), ("state", "failed")],
        ),
        scenario(
            "fds",
            "NodeFileDescriptorLimit",
            "warning",
            vec![series("node_filefd_allocated", &[], 80, |_| 75.0), series("node_filefd_maximum", &[], 80, |_| 100.0)],
        ),
        scenario(
            "fds-exhausted",
            "NodeFileDescriptorLimit",
            "critical",
            vec![series("node_filefd_allocated", &[], 80, |_| 95.0), series("node_filefd_maximum", &[], 80, |_| 100.0)],
        ),
        scenario("cpu-busy", "NodeCPUHighUsage", "info", cpu(120, 0.95)),
        scenario("load", "NodeSystemSaturation", "warning", {
            let mut s = cpu(80, 0.5);
            s.push(series("node_load1", &[], 80, |_| 5.0));
            s
        }),
        scenario(
            "major-faults",
            "NodeMemoryMajorPagesFaults",
            "warning",
            vec![series("node_vmstat_pgmajfault", &[], 140, counter(600.0))],
        ),
        scenario(
            "memory",
            "NodeMemoryHighUtilization",
            "warning",
            vec![
                series("node_memory_MemAvailable_bytes", &[], 80, |_| 5e8),
                series("node_memory_MemTotal_bytes", &[], 80, |_| 1e10),
            ],
        ),
        with(
            scenario(
                "disk-queue",
                "NodeDiskIOSaturation",
                "warning",
                vec![series("node_disk_io_time_weighted_seconds_total", &[("device", "sda")], 200, counter(12.0))],
            ),
            &[("device", "sda")],
        ),
        with(
            scenario(
                "unit-failed",
                "NodeSystemdServiceFailed",
                "warning",
                vec![series("node_systemd_unit_state", &[("name", "app.service"), ("state", "failed")], 40, |_| 1.0)],
            ),
            &[("name", "app.service"), ("state", "failed")],
        ),
        with(
            scenario(
                "crashloop",
                "NodeSystemdServiceCrashlooping",
                "warning",
                vec![series("node_systemd_service_restart_total", &[("name", "app.service")], 160, |i| {
                    if i < HEALTHY {
                        0.0
                    } else {
                        ((i - HEALTHY) / 4.0).floor()
                    }
                })],
            ),
            &[("name", "app.service")],
        ),
        with(
            scenario(
                "bond",
                "NodeBondingDegraded",
                "warning",
                vec![
                    series("node_bonding_slaves", &[("master", "bond0")], 40, |_| 2.0),
                    series("node_bonding_active", &[("master", "bond0")], 40, |_| 1.0),
                ],
            ),
            &[("master", "bond0")],
        ),
        scenario("down", "HostDown", "critical", vec![series("up", &[], 20, |_| 0.0)]),
    ]
}

/// The scenarios' samples as Vigil's JSON lines, in time order (the host from `instance`, the
/// other labels kept, as remote-write maps them).
fn json_lines(scenarios: &[Scenario]) -> Vec<String> {
    let mut lines: Vec<(i64, String)> = Vec::new();
    for s in scenarios {
        for series in &s.series {
            let mut labels: BTreeMap<&str, &str> = series.labels.iter().copied().collect();
            labels.insert("job", "node");
            for (i, v) in series.values.iter().enumerate() {
                let Some(v) = v else { continue };
                let ms = i as i64 * s.step * 1000;
                let e = json!({"stream": "metric", "ts": ms, "host": s.host, "name": series.name, "value": v, "labels": labels});
                lines.push((ms, e.to_string()));
            }
        }
    }
    lines.sort_by_key(|(ms, _)| *ms);
    lines.into_iter().map(|(_, l)| l).collect()
}

/// Vigil's alerts of `alertname` on `host`, each as (severity, first firing, resolved), in
/// seconds.
fn vigil_alerts(alerts: &[Json], host: &str, alertname: &str) -> Vec<(String, i64, Option<i64>)> {
    let seconds = |a: &Json| vigil::event::parse_time(a["time"].as_str().unwrap_or_default()).map(|ms| ms / 1000);
    let mut by_id: BTreeMap<String, (String, i64, Option<i64>)> = BTreeMap::new();
    for a in alerts.iter().filter(|a| a["labels"]["instance"] == host && a["labels"]["alertname"] == alertname) {
        let (Some(id), Some(t)) = (a["id"].as_str(), seconds(a)) else { continue };
        let severity = a["labels"]["severity"].as_str().unwrap_or_default().to_string();
        let entry = by_id.entry(id.to_string()).or_insert((severity, t, None));
        if a["status"] == "resolved" {
            entry.2 = Some(t);
        }
    }
    by_id.into_values().collect()
}

/// One promtool check: at `at` seconds, the firing alerts of the scenario's name are those of
/// `severities`.
fn check(out: &mut String, s: &Scenario, at: i64, severities: &[String]) {
    let _ = writeln!(out, "      - eval_time: {at}s\n        alertname: {}\n        exp_alerts:", s.alertname);
    if severities.is_empty() {
        out.truncate(out.len() - "\n        exp_alerts:\n".len());
        let _ = writeln!(out, "\n        exp_alerts: []");
        return;
    }
    for severity in severities {
        let _ = writeln!(out, "          - exp_labels:");
        let mut labels: Vec<(&str, &str)> = vec![("instance", s.host), ("job", "node"), ("severity", severity)];
        labels.extend(s.labels.iter().copied());
        for (k, v) in labels {
            let _ = writeln!(out, "              {k}: \"{v}\"");
        }
    }
}

#[test]
#[ignore = "needs promtool: scripts/test.sh installs Debian's prometheus"]
fn every_node_rule_fires_when_and_as_prometheus_fires_the_mixins_alert() {
    let scenarios = scenarios();
    let alerts = replay_alerts_with(&json_lines(&scenarios), "rules/node");
    let dir = temp_dir("node_mixin");
    let alerts_file = std::fs::canonicalize("tests/data/node-mixin/alerts.yml").expect("the PromQL alerts");
    let mut test = format!("rule_files: ['{}']\nevaluation_interval: {EVAL_SECONDS}s\ntests:\n", alerts_file.display());
    let mut fired = Vec::new();
    for s in &scenarios {
        let of_name = vigil_alerts(&alerts, s.host, s.alertname);
        let first = of_name.iter().filter(|(severity, ..)| severity == s.severity).map(|(_, t, _)| *t).min();
        let Some(first) = first else {
            panic!("{}: Vigil raised no {} {}; its alerts: {:?}", s.host, s.severity, s.alertname, of_name);
        };
        fired.push((s.host, s.alertname, first, s.tolerance));
        let _ = writeln!(test, "  - name: {}\n    interval: {}s\n    input_series:", s.host, s.step);
        for series in &s.series {
            let mut labels = format!("instance=\"{}\",job=\"node\"", s.host);
            for (k, v) in &series.labels {
                let _ = write!(labels, ",{k}=\"{v}\"");
            }
            let values: Vec<String> =
                series.values.iter().map(|v| v.map_or_else(|| "_".to_string(), |v| format!("{v}"))).collect();
            let _ =
                writeln!(test, "      - series: '{}{{{labels}}}'\n        values: '{}'", series.name, values.join(" "));
        }
        let _ = writeln!(test, "    alert_rule_test:");
        let active = |t: i64| -> Vec<String> {
            let mut on: Vec<String> = of_name
                .iter()
                .filter(|(_, from, to)| *from <= t && to.is_none_or(|to| t < to))
                .map(|(severity, ..)| severity.clone())
                .collect();
            on.sort();
            on.dedup();
            on
        };
        let (after, before) = (first + s.tolerance, first - s.tolerance - EVAL_SECONDS);
        check(&mut test, s, after, &active(after));
        if before >= 0 {
            check(&mut test, s, before, &active(before));
        }
    }
    let file = dir.join("node-mixin.test.yml");
    std::fs::write(&file, &test).expect("the promtool test");
    let promtool = std::env::var("VIGIL_TEST_PROMTOOL").unwrap_or_else(|_| "promtool".to_string());
    let out = Command::new(&promtool)
        .args(["test", "rules", file.to_str().expect("utf-8")])
        .output()
        .unwrap_or_else(|e| panic!("{promtool} does not run ({e}): scripts/test.sh installs Debian's prometheus"));
    let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "Prometheus disagrees with Vigil ({}):\n{report}", file.display());
    for (host, alertname, t, tolerance) in &fired {
        println!("node-mixin {host}: Vigil's {alertname} at {t} s; Prometheus' within {tolerance} s of it");
    }
    // Every rule of the folder fired in some scenario.
    let rules: std::collections::BTreeSet<&str> = alerts.iter().filter_map(|a| a["rule"].as_str()).collect();
    let set = vigil::ruleset::RuleSet::load(&["rules/node".into()]).expect("rules/node");
    let silent: Vec<String> =
        set.plans().iter().map(|p| p.name.clone()).filter(|n| !rules.contains(n.as_str())).collect();
    assert!(silent.is_empty(), "rules of rules/node that never fired: {silent:?}");
    std::fs::remove_dir_all(&dir).ok();
}
