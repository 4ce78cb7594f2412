//! Range queries of the query API (`GET /api/v1/query_range`) for a series selector: each
//! series' value at every step of a range, as Prometheus evaluates the selector there (its last
//! sample within the lookback delta, five minutes by default). A plain selector keeps the
//! series' names, which functions such as `avg_over_time` drop, so a warm start reads values at
//! a rule's own step rather than aggregates.

use super::proto::{Label, Sample, TimeSeries};
use super::{fatal, Prometheus, PrometheusError};
use serde_json::Value as Json;
use std::time::Duration;

const QUERY_RANGE: &str = "/api/v1/query_range";

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
}
