//! HA pairs of Prometheus: two (or more) replicas scrape the same targets and remote-write the
//! same series, told apart by an external label (`__replica__`, `prometheus_replica`). Vigil
//! takes one replica per cluster and drops the others' samples, so nothing is judged or paged
//! twice; when the elected replica has sent nothing for the failover time, the next replica
//! heard is elected (as Mimir's HA tracker does). The replica label is taken off the series, so
//! a failover continues the same series.
//!
//! A series without a replica label is always taken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vigil_engine::event::{Event, Value};

/// How many clusters are tracked at most; a series of a cluster beyond them is taken.
const MAX_CLUSTERS: usize = 10_000;

/// Which label names a series' replica and which its cluster, and when to fail over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaLabels {
    /// The labels that name a replica, the first present deciding; none turns tracking off.
    pub replica: Vec<String>,
    /// The label that names a cluster; series without it are of one unnamed cluster.
    pub cluster: String,
    /// How long the elected replica may be silent before another takes over.
    pub failover: Duration,
}

/// The replica elected for each cluster, and when it was last heard.
#[derive(Debug)]
pub struct HaTracker {
    labels: HaLabels,
    elected: Mutex<HashMap<String, (String, Instant)>>,
}

impl HaTracker {
    pub fn new(labels: HaLabels) -> Self {
        HaTracker { labels, elected: Mutex::default() }
    }

    /// Whether the samples of one series (`events`, which share their labels) are taken, at
    /// `now`; if they are, their replica label is taken off.
    pub fn admit(&self, events: &mut [Event], now: Instant) -> bool {
        let Some(Value::Map(labels)) = events.first().map(|e| e.get("labels")) else { return true };
        let Some(replica) = self.labels.replica.iter().find_map(|n| labels.get(n).cloned()) else {
            return true;
        };
        let cluster = labels.get(&self.labels.cluster).cloned().unwrap_or_default();
        if !self.elect(cluster, &replica, now) {
            return false;
        }
        let mut rest = (*labels).clone();
        for replica_label in &self.labels.replica {
            rest.remove(replica_label);
        }
        let rest = if rest.is_empty() { Value::Null } else { Value::Map(Arc::new(rest)) };
        for e in events.iter_mut() {
            e.set("labels", rest.clone());
        }
        true
    }

    /// Whether `replica` is (now) the one taken for `cluster`.
    fn elect(&self, cluster: String, replica: &str, now: Instant) -> bool {
        let mut elected = self.elected.lock().unwrap_or_else(|e| e.into_inner());
        let full = elected.len() >= MAX_CLUSTERS;
        match elected.get_mut(&cluster) {
            Some((current, heard)) if current == replica => {
                *heard = now;
                true
            }
            Some((current, heard)) => {
                if now.saturating_duration_since(*heard) < self.labels.failover {
                    return false;
                }
                tracing::info!(%cluster, from = %current, to = %replica, "HA pair: the elected replica went quiet; failing over");
                *current = replica.to_string();
                *heard = now;
                true
            }
            None if full => true,
            None => {
                tracing::info!(%cluster, %replica, "HA pair: replica elected");
                elected.insert(cluster, (replica.to_string(), now));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use vigil_lang::schema::Stream;

    fn series(replica: &str) -> Vec<Event> {
        let labels = BTreeMap::from([
            ("cluster".to_string(), "eu".to_string()),
            ("__replica__".to_string(), replica.to_string()),
            ("job".to_string(), "node".to_string()),
        ]);
        let mut e = Event::new(Stream::Metric, 1);
        e.set("host", Value::str("web-1")).set("labels", Value::Map(Arc::new(labels)));
        vec![e.clone(), e]
    }

    fn tracker() -> HaTracker {
        HaTracker::new(HaLabels {
            replica: vec!["__replica__".into(), "prometheus_replica".into()],
            cluster: "cluster".into(),
            failover: Duration::from_secs(30),
        })
    }

    #[test]
    fn one_replica_is_taken_until_it_goes_quiet_and_its_label_is_taken_off() {
        let ha = tracker();
        let t0 = Instant::now();
        let mut a = series("a");
        assert!(ha.admit(&mut a, t0), "the first replica heard is elected");
        assert_eq!(a[1].get("labels").to_text(), "{cluster=eu, job=node}", "the replica label is taken off");
        assert!(!ha.admit(&mut series("b"), t0 + Duration::from_secs(1)), "the other replica is dropped");
        assert!(ha.admit(&mut series("a"), t0 + Duration::from_secs(20)));
        assert!(!ha.admit(&mut series("b"), t0 + Duration::from_secs(49)), "a was heard 29 s ago");
        assert!(ha.admit(&mut series("b"), t0 + Duration::from_secs(51)), "a quiet for 31 s: b takes over");
        assert!(!ha.admit(&mut series("a"), t0 + Duration::from_secs(52)), "and a is now the one dropped");
    }

    #[test]
    fn series_without_a_replica_label_are_always_taken() {
        let ha = tracker();
        let mut e = Event::new(Stream::Metric, 1);
        e.set("host", Value::str("web-1"));
        assert!(ha.admit(&mut [e], Instant::now()));
        let mut only_replica = series("a");
        for e in &mut only_replica {
            e.set("labels", Value::Map(Arc::new(BTreeMap::from([("__replica__".into(), "a".into())]))));
        }
        assert!(ha.admit(&mut only_replica, Instant::now()));
        assert_eq!(only_replica[0].get("labels"), Value::Null, "no label left is no label set");
    }
}
