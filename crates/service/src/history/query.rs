//! Range queries of the query API (`GET /api/v1/query_range`) for a series selector: each
//! series' value at every step of a range, as Prometheus evaluates the selector there (its last
//! sample within the lookback delta, five minutes by default). A plain selector keeps the
//! series' names, which functions such as `avg_over_time` drop, so a warm start reads values at
//! a rule's own step rather than aggregates.

use super::proto::{Label, Sample, TimeSeries};
use super::{fatal, Prometheus, PrometheusError};
use serde_json::Value as Json;
use std::time::Duration;
use vigil_formats::metric_kind::Family;

const QUERY_RANGE: &str = "/api/v1/query_range";
const CONFIG: &str = "/api/v1/status/config";
const METADATA: &str = "/api/v1/metadata";

/// Most points a series may have in one answer (Prometheus refuses more than 11,000).
pub const MAX_POINTS: i64 = 10_000;

impl Prometheus {
    /// The series `selector` (PromQL) selects, each with its value at `start`, `start + step`,
    /// ... up to `end` (ms); at most [`MAX_POINTS`] steps.
    pub async fn query_range(
        &self,
        selector: &str,
        start: i64,
        end: i64,
        step: Duration,
    ) -> Result<Vec<TimeSeries>, PrometheusError> {
        let step_ms = step.as_millis().max(1) as i64;
        if (end - start) / step_ms >= MAX_POINTS {
            return Err(fatal(format!(
                "{} steps of {step_ms} ms at once: at most {MAX_POINTS}",
                (end - start) / step_ms + 1
            )));
        }
        let seconds = |ms: i64| format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000));
        let params = [
            ("query", selector.to_string()),
            ("start", seconds(start)),
            ("end", seconds(end)),
            ("step", seconds(step_ms)),
        ];
        let once = || async {
            let request = self.http.get(format!("{}{QUERY_RANGE}", self.base)).query(&params);
            let response = self.send(request, QUERY_RANGE).await?;
            let body = self.body(response, QUERY_RANGE).await?;
            matrix(&body).map_err(|e| fatal(format!("{}: {e}", self.endpoint(QUERY_RANGE))))
        };
        self.tried("a range query", once).await
    }
}

impl Prometheus {
    /// The external labels of the server's configuration (`global.external_labels`), which it
    /// adds to what it remote-writes but not to range queries' answers.
    pub async fn external_labels(&self) -> Result<Vec<(String, String)>, PrometheusError> {
        let once = || async {
            let response = self.send(self.http.get(format!("{}{CONFIG}", self.base)), CONFIG).await?;
            let body = self.body(response, CONFIG).await?;
            let answer: Json = serde_json::from_slice(&body)
                .map_err(|e| fatal(format!("{}: the answer is not JSON: {e}", self.endpoint(CONFIG))))?;
            Ok(external_labels(answer["data"]["yaml"].as_str().unwrap_or_default()))
        };
        self.tried("reading the configuration", once).await
    }
}

impl Prometheus {
    /// The type and unit of each metric family the server's targets describe (`# TYPE`,
    /// `# UNIT`), as the metadata API serves them: what live remote-write samples are kinded by.
    /// A family its targets give different types is left out (its series are kinded by name).
    pub async fn metadata(&self) -> Result<Vec<(String, Family, String)>, PrometheusError> {
        let once = || async {
            let response = self.send(self.http.get(format!("{}{METADATA}", self.base)), METADATA).await?;
            let body = self.body(response, METADATA).await?;
            metadata(&body).map_err(|e| fatal(format!("{}: {e}", self.endpoint(METADATA))))
        };
        self.tried("reading the metadata", once).await
    }
}

/// The families of a metadata answer, each with its type and unit.
fn metadata(body: &[u8]) -> Result<Vec<(String, Family, String)>, String> {
    let answer: Json = serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if answer["status"] != "success" {
        return Err(format!("the request failed: {}", answer["error"].as_str().unwrap_or("no reason given")));
    }
    let Some(families) = answer["data"].as_object() else { return Err("no data".into()) };
    let mut out = Vec::with_capacity(families.len());
    for (name, described) in families {
        let described = described.as_array().map(Vec::as_slice).unwrap_or_default();
        let Some(first) = described.first() else { continue };
        let kind = first["type"].as_str().unwrap_or_default();
        if described.iter().all(|d| d["type"].as_str() == Some(kind)) {
            out.push((name.clone(), Family::from_type_name(kind), first["unit"].as_str().unwrap_or_default().into()));
        }
    }
    Ok(out)
}

/// `global.external_labels` of a configuration as Prometheus writes it back: the block's
/// `key: value` lines, indented under `external_labels:`, itself under `global:`.
fn external_labels(yaml: &str) -> Vec<(String, String)> {
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut out = Vec::new();
    let (mut in_global, mut under) = (false, None);
    for line in yaml.lines().filter(|l| !l.trim().is_empty()) {
        let depth = indent(line);
        if depth == 0 {
            in_global = line.trim_end() == "global:";
            under = None;
            continue;
        }
        match under {
            Some(block) if depth > block => {
                if let Some((k, v)) = line.trim().split_once(':') {
                    let unquote = |s: &str| s.trim().trim_matches(|c| c == '"' || c == '\'').to_string();
                    out.push((unquote(k), unquote(v)));
                }
            }
            _ => under = (in_global && line.trim() == "external_labels:").then_some(depth),
        }
    }
    out
}

/// The series of a `matrix` answer.
fn matrix(body: &[u8]) -> Result<Vec<TimeSeries>, String> {
    let answer: Json = serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if answer["status"] != "success" {
        return Err(format!("the query failed: {}", answer["error"].as_str().unwrap_or("no reason given")));
    }
    if answer["data"]["resultType"] != "matrix" {
        return Err(format!("a {} answer, not a matrix", answer["data"]["resultType"]));
    }
    let Some(result) = answer["data"]["result"].as_array() else { return Err("no result".into()) };
    let mut out = Vec::with_capacity(result.len());
    for series in result {
        let labels = series["metric"]
            .as_object()
            .map(|m| {
                m.iter().filter_map(|(k, v)| Some(Label { name: k.clone(), value: v.as_str()?.to_string() })).collect()
            })
            .unwrap_or_default();
        let mut samples = Vec::new();
        for point in series["values"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let (Some(t), Some(v)) = (point[0].as_f64(), point[1].as_str()) else {
                return Err(format!("a point is not [time, \"value\"]: {point}"));
            };
            let value = match v {
                "NaN" => f64::NAN,
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().map_err(|_| format!("`{v}` is not a value"))?,
            };
            samples.push(Sample { timestamp: (t * 1000.0).round() as i64, value });
        }
        out.push(TimeSeries { labels, samples });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_answer_reads_as_series_of_samples() {
        let body = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"up","instance":"h:9100"},"values":[[1700000000,"1"],[1700000150.5,"NaN"]]}]}}"#;
        let series = matrix(body).expect("matrix");
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].labels.len(), 2);
        assert_eq!(series[0].samples[0], Sample { timestamp: 1_700_000_000_000, value: 1.0 });
        assert_eq!(series[0].samples[1].timestamp, 1_700_000_150_500);
        assert!(series[0].samples[1].value.is_nan());
        let failed = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert_eq!(matrix(failed).expect_err("failed"), "the query failed: parse error");
    }

    #[test]
    fn metadata_gives_each_familys_type_and_unit_unless_its_targets_disagree() {
        let body = br#"{"status":"success","data":{
            "queue_total":[{"type":"gauge","help":"Jobs waiting.","unit":""}],
            "rpc_seconds":[{"type":"summary","help":"a","unit":"seconds"},{"type":"summary","help":"b","unit":"seconds"}],
            "mixed":[{"type":"counter","help":"","unit":""},{"type":"gauge","help":"","unit":""}]}}"#;
        let mut families = metadata(body).expect("metadata");
        families.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            families,
            [
                ("queue_total".into(), Family::Gauge, String::new()),
                ("rpc_seconds".into(), Family::Distribution, "seconds".into())
            ]
        );
        let failed = br#"{"status":"error","error":"timeout"}"#;
        assert_eq!(metadata(failed).expect_err("failed"), "the request failed: timeout");
    }

    #[test]
    fn external_labels_read_from_the_configuration_prometheus_writes_back() {
        let yaml = "global:\n  scrape_interval: 1m\n  external_labels:\n    __replica__: a\n    cluster: \"eu 1\"\n  \
                    evaluation_interval: 1m\nscrape_configs:\n- job_name: x\n  external_labels:\n    not: this\n";
        assert_eq!(external_labels(yaml), [("__replica__".into(), "a".into()), ("cluster".into(), "eu 1".into())]);
        assert_eq!(external_labels("global:\n  scrape_interval: 1m\n"), Vec::new());
    }
}
