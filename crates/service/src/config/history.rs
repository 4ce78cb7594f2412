//! What `[warm]` reads from: the team's Prometheus, for a warm start and for "why didn't it
//! page?".

use super::ServeConfig;
use std::time::Duration;

impl ServeConfig {
    /// The warm start `--warm-from-prometheus` asks for, if any.
    pub fn warm_start(&self) -> Result<Option<crate::history::warm::WarmStart>, crate::history::PrometheusError> {
        let Some(history) = self.history()? else { return Ok(None) };
        Ok(Some(crate::history::warm::WarmStart {
            prometheus: history.prometheus,
            selector: history.selector,
            lookback: history.lookback,
            step: self.warm_step,
            raw: self.warm_raw,
            hosts: history.hosts,
            dropped_labels: self.remote_write_ha().replica,
            max_state_bytes: self.max_state_bytes(),
            families: Default::default(),
            stop: None,
        }))
    }

    /// The team's Prometheus `--warm-from-prometheus` names, and its series, if it names one:
    /// what a warm start and "why didn't it page?" read.
    pub fn history(&self) -> Result<Option<crate::history::Source>, crate::history::PrometheusError> {
        let Some(url) = &self.warm_from_prometheus else { return Ok(None) };
        use crate::history::{Auth, Prometheus, ReadMode};
        let auth = Auth::of(
            self.prometheus_user.as_deref(),
            self.prometheus_password.as_deref(),
            self.prometheus_bearer_token.as_deref(),
        );
        Ok(Some(crate::history::Source {
            prometheus: Prometheus::new(url, auth, ReadMode::default(), Duration::from_secs(120))?,
            selector: self.warm_match.clone(),
            lookback: self.warm_lookback,
            hosts: self.host_mapping().remote_write,
        }))
    }
}
