//! The rules of a running service: the folder, loaded as a
//! [`RuleSet`](vigil_lang::ruleset::RuleSet), reloaded when it changes (checked every second)
//! or on SIGHUP, and changed through the API.
//!
//! Every change compiles the whole folder as it would be: if any file has a problem the running
//! rules stay as they are (the problems are answered, or logged and counted). A rule changed
//! through the API is written in the file it lives in (any file of the folder, its other rules
//! kept), a new one in `<folder>/<name>.saql`; names are identifiers, so no path can escape the
//! folder. The engine keeps the state of every rule whose state is the same computation.
//!
//! Instances that share a store (a group's members) also share one rule set through it
//! ([`shared`]).

mod live;
pub mod shared;

pub use live::{fingerprint, load, FileStamp, LiveRules, RuleChangeError};
