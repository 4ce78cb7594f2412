//! Vigil: real-time anomaly detection for datacenters, driven by a SAQL-style rule language.
//!
//! The workspace is layered, each crate depending only on those above it here; the one type
//! that crosses each boundary is named on the arrow (`docs/architecture.md` draws it whole):
//!
//! ```text
//! vigil-lang     text --parser--> ast --check--> RulePlan
//!                                                   |
//! vigil-engine                          Event --> Engine --> Alert
//!                                         ^                    |
//! vigil-formats  files, collectors' formats                    |
//!                                         ^                    |
//! vigil-service  Kafka, HTTP ingest, files                     Alert --> store, webhook,
//!                (alone, or one member of a group)             Alertmanager, API, console
//!                                                                  |
//! vigil          the command line: check, explain, replay, test, eval, bench, why, serve
//! ```
//!
//! - [`vigil_lang`]: [`compile`] parses and checks rule files into [`plan::RulePlan`]s;
//!   [`ruleset`] loads files and folders; user mistakes are [`diagnostic::Diagnostic`]s.
//! - [`vigil_engine`]: [`engine::Engine`] turns plans into operators, takes events and gives
//!   alerts; [`replay`] runs inputs through the [`runtime`]: the rules' keyed partitions on
//!   threads.
//! - [`vigil_formats`]: [`Format`], the one list of what Vigil reads; [`input`] reads recorded
//!   files, [`otlp`], [`remote_write`] and [`influx`] decode what collectors send.
//! - [`service`] (`vigil-service`): `vigil serve`, the engine between its sources and its
//!   destinations.
//! - This crate: [`ruletest`] runs rule test files, [`eval`] scores rules on labelled series
//!   and counts their alerts on unlabelled fleets, [`bench`] times workloads; the binary is the
//!   command line.
//!
//! The layers' modules are re-exported here under their own names, so that `vigil::engine`,
//! `vigil::plan` and `vigil::service` name the same things as in the crates that define them.

pub mod backtest;
pub mod bench;
pub mod eval;
pub mod ruletest;
pub mod why;

pub use vigil_engine::{alert, engine, event, replay, runtime, settings};
pub use vigil_formats::{influx, input, metric_kind, otlp, remote_write, Format, HostMapping};
pub use vigil_lang::{ast, check, compile, compile_all, diagnostic, parser, plan, ruleset, schema, Compiled};
pub use vigil_service as service;
