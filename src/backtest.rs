//! `vigil replay --from-prometheus`: a backtest of rules over a team's Prometheus history, read
//! with remote-read ([`vigil_service::history`]), with a replay's output, summary and progress.

use anyhow::{anyhow, bail, Result};
use std::time::Duration;
use vigil_engine::event::Decoded;
use vigil_formats::input::Input;
use vigil_formats::remote_write::HostLabels;
pub use vigil_service::history::parse_time;
use vigil_service::history::{self, backtest, Auth, Prometheus, ReadMode};

/// Where history is read from, and which of it.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PrometheusArgs {
    /// Read the inputs from this Prometheus (or any server of its remote-read API: Mimir,
    /// Cortex) instead of files: its base URL, `http://prometheus:9090`.
    #[arg(long = "from-prometheus", value_name = "URL", conflicts_with = "inputs")]
    pub url: Option<String>,
    /// A series selector, as in PromQL (`node_cpu_seconds_total{mode!="idle"}`,
    /// `{job="node"}`); repeat for more. Required with --from-prometheus.
    #[arg(long = "match", value_name = "SELECTOR", requires = "url")]
    pub selectors: Vec<String>,
    /// The range's start: RFC 3339 (`2026-11-22T00:00:00Z`), Unix seconds, or `now-7d`.
    #[arg(long, requires = "url")]
    pub start: Option<String>,
    /// The range's end, written as --start [default: now].
    #[arg(long, requires = "url")]
    pub end: Option<String>,
    /// The time read in one request: longer asks more of Prometheus' memory at once.
    #[arg(long, default_value = "1 h", value_parser = vigil_engine::settings::parse_duration)]
    pub page: Duration,
    /// `streamed` (chunks, as the server reads them) or `samples` (one message per page).
    #[arg(long = "prometheus-read", default_value = "streamed", value_parser = parse_mode)]
    pub mode: ReadMode,
    /// Timeout of one request.
    #[arg(long = "prometheus-timeout", default_value = "2 min", value_parser = vigil_engine::settings::parse_duration)]
    pub timeout: Duration,
    /// Basic auth: the user (the password from VIGIL_PROMETHEUS_PASSWORD).
    #[arg(long = "prometheus-user", env = "VIGIL_PROMETHEUS_USER")]
    pub user: Option<String>,
    #[arg(long = "prometheus-password", env = "VIGIL_PROMETHEUS_PASSWORD", hide_env_values = true, requires = "user")]
    pub password: Option<String>,
    /// A bearer token, sent as `Authorization: Bearer`.
    #[arg(
        long = "prometheus-bearer-token",
        env = "VIGIL_PROMETHEUS_BEARER_TOKEN",
        hide_env_values = true,
        conflicts_with = "user"
    )]
    pub bearer_token: Option<String>,
}

fn parse_mode(s: &str) -> Result<ReadMode, String> {
    match s {
        "streamed" => Ok(ReadMode::Streamed),
        "samples" => Ok(ReadMode::Samples),
        _ => Err(format!("`{s}` is not a read mode: streamed or samples")),
    }
}

impl PrometheusArgs {
    /// The backtest's input, its samples mapped to hosts by `hosts`.
    pub fn input(&self, hosts: HostLabels) -> Result<(Input<Decoded>, backtest::Failure)> {
        let Some(url) = &self.url else { bail!("no --from-prometheus") };
        if self.selectors.is_empty() {
            bail!("--from-prometheus needs at least one --match SELECTOR");
        }
        let selectors = self
            .selectors
            .iter()
            .map(|s| history::selector::parse(s).map(|m| (s.clone(), m)).map_err(|e| anyhow!("--match `{s}`: {e}")))
            .collect::<Result<Vec<_>>>()?;
        let now = vigil_engine::event::now_ms();
        let Some(start) = &self.start else { bail!("--from-prometheus needs --start") };
        let start = parse_time(start, now).map_err(|e| anyhow!("--start: {e}"))?;
        let end = match &self.end {
            Some(end) => parse_time(end, now).map_err(|e| anyhow!("--end: {e}"))?,
            None => now,
        };
        let auth = Auth::of(self.user.as_deref(), self.password.as_deref(), self.bearer_token.as_deref());
        let read = Prometheus::new(url, auth, self.mode, self.timeout)?;
        let page_ms = (self.page.as_millis() as i64).max(1);
        Ok(backtest::input(backtest::Backtest { read, selectors, start, end, page_ms, hosts })?)
    }
}
