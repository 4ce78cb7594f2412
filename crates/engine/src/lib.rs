//! The engine of Vigil: events in, alerts out, for the rules `vigil-lang` has checked. Nothing
//! here does network or database I/O; `vigil-service` wraps it in sources and destinations.
//!
//! ```text
//!   recorded files, collectors' payloads (decoded by vigil-formats)
//!                                  |
//!                                  v  event::Event
//! RulePlan --> engine::Engine: routing --> filters, windows + scorers + roll-up,
//!                                          sequences, outliers, stage two --> alert::Alert
//! ```
//!
//! - [`event`]: the event, its values, and the JSON decoder that reads a line into a pooled
//!   event without allocating for the keys it matches.
//! - [`engine`]: [`engine::Engine::new`] builds operators from plans; `push` events in, alerts
//!   out. Windowed rules score their series with [`engine`]'s scorers and roll them up by host;
//!   its state is checkpointed by structural identity.
//! - [`alert`]: what a rule raises, with the values and scores that say why.
//! - [`runtime`]: the rule set as keyed partitions on threads, events routed to the
//!   partitions that keep their keys, and the checkpoint record of them all.
//! - [`settings`]: lateness, time bounds, workers and limits, as every command takes them.
//! - [`replay`] runs inputs (records of events with their lines, as `vigil-formats` reads
//!   files) through the runtime, merged by event time.

pub mod alert;
pub mod engine;
pub mod event;
pub mod replay;
pub mod runtime;
pub mod settings;
pub mod why;
