//! Vigil's integration tests, one binary for the `vigil` crate (one link instead of one per
//! file): each file below is a module. Those that need Kafka, PostgreSQL, Alertmanager or a
//! browser are `#[ignore]`d for a bare `cargo test`; `scripts/test.sh` runs them all, the
//! group and fault suites apart (`cargo test --test suite group::`), as they stop and start
//! brokers and databases and are timed against them.

mod support;

mod alertmanager;
mod backtest;
mod checkpoint;
mod cli;
mod collectors;
mod diagnostics;
mod faults;
mod fleet;
mod fuzz;
mod group;
mod group_formats;
mod group_outage;
mod group_warm;
mod hostile;
mod monitoring;
mod node_mixin;
mod node_warm;
mod properties;
mod robustness;
mod rule_behaviour;
mod rules;
mod scores;
mod service;
mod structure;
mod tls;
mod why;
