//! The settings of the engine that every command running rules shares (`replay`, `test`,
//! `eval`, `bench`, `serve`): one type per setting, one flag and environment variable per
//! setting, and the same names in `vigil.toml`'s `[engine]` section.
//!
//! [`EngineArgs`] is what a command line gives (each setting optional); [`EngineArgs::over`]
//! fills the rest from the command's defaults into [`EngineSettings`], the settings in force.
//! Commands differ only in two defaults: the service waits 5 s for late events and runs a worker
//! per core, while files, being read at once, wait for none and run one engine.

use crate::engine::{EngineConfig, Limits};
use crate::event::{Millis, TimeBounds};
use std::time::Duration;

/// The engine's settings in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSettings {
    /// How late an event may arrive and still count.
    pub lateness: Duration,
    /// How far ahead of this machine's clock an event may be dated (zero: no limit).
    pub max_event_future: Duration,
    /// How far ahead of event time an event may jump (zero: no limit).
    pub max_event_jump: Duration,
    /// Threads running the rules' keyed partitions.
    pub workers: usize,
    /// Keyed partitions that split the key groups at the first start (a checkpoint keeps its
    /// own count); `None`: see [`EngineSettings::partitions`].
    pub partitions: Option<usize>,
    /// Most live keys (window groups, partial matches) a rule holds.
    pub max_keys_per_rule: usize,
    /// A partial match or window group without progress for this long is dropped (zero: never).
    pub idle_timeout: Duration,
}

/// The keyed partitions of a first start with several workers: enough for their load to be
/// spread evenly over a few threads, and for a later start with more workers to use them.
pub const PARTITIONS: usize = 16;

/// Threads at most, as `--workers` accepts them.
pub const MAX_WORKERS: usize = 256;

impl EngineSettings {
    /// The defaults of the commands that read files (`replay`, `test`, `eval`, `bench`).
    pub fn batch() -> EngineSettings {
        EngineSettings {
            lateness: Duration::ZERO,
            max_event_future: Duration::from_secs(300),
            max_event_jump: Duration::ZERO,
            workers: 1,
            partitions: None,
            max_keys_per_rule: Limits::default().max_keys,
            idle_timeout: Duration::ZERO,
        }
    }

    /// The defaults of `vigil serve`: events may come 5 s late, and a worker runs per core.
    pub fn serve() -> EngineSettings {
        EngineSettings {
            lateness: Duration::from_secs(5),
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS),
            ..EngineSettings::batch()
        }
    }

    /// The keyed partitions a first start runs: one for one worker (nothing to route), else
    /// [`PARTITIONS`], or one per worker past that.
    pub fn partitions(&self) -> usize {
        match self.partitions {
            Some(n) => n.max(1),
            None if self.workers <= 1 => 1,
            None => self.workers.max(PARTITIONS),
        }
    }

    pub fn lateness_ms(&self) -> Millis {
        millis(self.lateness)
    }

    /// The engine's configuration: lateness and limits, no clock, every key group its own.
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            lateness_ms: self.lateness_ms(),
            limits: Limits { max_keys: self.max_keys_per_rule, idle_ms: millis(self.idle_timeout) },
            ..EngineConfig::default()
        }
    }

    /// The event times taken in.
    pub fn bounds(&self) -> TimeBounds {
        let limit = |d: Duration| (!d.is_zero()).then(|| millis(d));
        TimeBounds { max_future_ms: limit(self.max_event_future), max_jump_ms: limit(self.max_event_jump) }
    }
}

/// A duration as event-time milliseconds, saturating.
pub fn millis(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

/// The engine's settings as a command line gives them: each absent unless its flag or its
/// environment variable is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Engine")]
pub struct EngineArgs {
    /// How late an event may arrive and still count, e.g. `30s` [default: 0s; serve: 5s]
    #[arg(long, env = "VIGIL_LATENESS", value_parser = parse_duration)]
    pub lateness: Option<Duration>,
    /// How far ahead of this machine's clock an event may be dated; later ones are refused as
    /// malformed (`0s`: no limit). Times before 1970 or after 9999 are always refused [default: 5min]
    #[arg(long, env = "VIGIL_MAX_EVENT_FUTURE", value_parser = parse_duration)]
    pub max_event_future: Option<Duration>,
    /// How far ahead of event time an event may jump; further ones are refused as malformed
    /// (`0s`: no limit) [default: 0s]
    #[arg(long, env = "VIGIL_MAX_EVENT_JUMP", value_parser = parse_duration)]
    pub max_event_jump: Option<Duration>,
    /// Threads running the rules' keyed partitions, 1 to 256: worth it for rules that cost much
    /// per event (scorers) [default: 1; serve: the number of cores]
    #[arg(long, env = "VIGIL_WORKERS", value_parser = parse_workers)]
    pub workers: Option<usize>,
    /// Keyed partitions that split the rules' keys, 1 to 256, run on the workers: the most
    /// workers a later start can use, since a checkpoint keeps its count [default: 1 for one
    /// worker, else 16 or one per worker past 16]
    #[arg(long, env = "VIGIL_PARTITIONS", value_parser = parse_workers)]
    pub partitions: Option<usize>,
    /// Most live keys (window groups, partial matches) a rule holds; past it the least recently
    /// active are evicted [default: 1000000]
    #[arg(long, env = "VIGIL_MAX_KEYS_PER_RULE", value_parser = parse_positive::<usize>)]
    pub max_keys_per_rule: Option<usize>,
    /// A partial match or window group with no progress for this long (event time) is dropped
    /// before its `within` or history ends, e.g. `6h`; `0s` never [default: 0s]
    #[arg(long, env = "VIGIL_IDLE_TIMEOUT", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
}

impl EngineArgs {
    /// The settings' names, as `vigil.toml` writes them (flags have `-` for `_`).
    pub const NAMES: [&'static str; 7] = [
        "lateness",
        "max_event_future",
        "max_event_jump",
        "workers",
        "partitions",
        "max_keys_per_rule",
        "idle_timeout",
    ];

    /// Sets the named setting from its text by its flag's parser (for `vigil.toml`); `Ok(false)`
    /// when no setting has that name.
    pub fn set(&mut self, name: &str, text: &str) -> Result<bool, String> {
        match name {
            "lateness" => self.lateness = Some(parse_duration(text)?),
            "max_event_future" => self.max_event_future = Some(parse_duration(text)?),
            "max_event_jump" => self.max_event_jump = Some(parse_duration(text)?),
            "workers" => self.workers = Some(parse_workers(text)?),
            "partitions" => self.partitions = Some(parse_workers(text)?),
            "max_keys_per_rule" => self.max_keys_per_rule = Some(parse_positive(text)?),
            "idle_timeout" => self.idle_timeout = Some(parse_duration(text)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// These settings, each absent one taken from `under` (a flag over the file's value).
    pub fn or(self, under: EngineArgs) -> EngineArgs {
        EngineArgs {
            lateness: self.lateness.or(under.lateness),
            max_event_future: self.max_event_future.or(under.max_event_future),
            max_event_jump: self.max_event_jump.or(under.max_event_jump),
            workers: self.workers.or(under.workers),
            partitions: self.partitions.or(under.partitions),
            max_keys_per_rule: self.max_keys_per_rule.or(under.max_keys_per_rule),
            idle_timeout: self.idle_timeout.or(under.idle_timeout),
        }
    }

    /// The settings in force: those given, the rest from `defaults`.
    pub fn over(&self, defaults: EngineSettings) -> EngineSettings {
        EngineSettings {
            lateness: self.lateness.unwrap_or(defaults.lateness),
            max_event_future: self.max_event_future.unwrap_or(defaults.max_event_future),
            max_event_jump: self.max_event_jump.unwrap_or(defaults.max_event_jump),
            workers: self.workers.unwrap_or(defaults.workers),
            partitions: self.partitions.or(defaults.partitions),
            max_keys_per_rule: self.max_keys_per_rule.unwrap_or(defaults.max_keys_per_rule),
            idle_timeout: self.idle_timeout.unwrap_or(defaults.idle_timeout),
        }
    }
}

/// A duration as rules write them (`5 s`, `10min`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    vigil_lang::parser::parse_duration(s).map(Duration::from_millis)
}

/// A whole number above zero.
pub fn parse_positive<T: std::str::FromStr + PartialEq + Default>(s: &str) -> Result<T, String> {
    match s.trim().parse::<T>() {
        Ok(v) if v != T::default() => Ok(v),
        Ok(_) => Err("must be more than zero".into()),
        Err(_) => Err(format!("`{s}` is not a whole number")),
    }
}

fn parse_workers(s: &str) -> Result<usize, String> {
    match parse_positive::<usize>(s)? {
        n if n > MAX_WORKERS => Err(format!("{n} workers: at most {MAX_WORKERS}")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_fill_the_commands_defaults_and_the_file_fills_the_flags() {
        let flags = EngineArgs { lateness: Some(Duration::from_secs(30)), ..EngineArgs::default() };
        let mut file = EngineArgs::default();
        assert_eq!(file.set("lateness", "1 min"), Ok(true));
        assert_eq!(file.set("workers", "3"), Ok(true));
        assert_eq!(file.set("window", "3"), Ok(false));
        assert!(file.set("workers", "0").is_err());
        assert!(file.set("workers", "257").unwrap_err().contains("at most 256"));
        let s = flags.or(file).over(EngineSettings::batch());
        assert_eq!(s.lateness, Duration::from_secs(30), "the flag over the file");
        assert_eq!(s.workers, 3, "the file over the default");
        assert_eq!(s.max_event_future, Duration::from_secs(300), "the default");
        assert_eq!(EngineArgs::default().over(EngineSettings::serve()).lateness, Duration::from_secs(5));
    }

    #[test]
    fn zero_means_no_bound_and_no_idle_timeout() {
        let s = EngineSettings { max_event_future: Duration::ZERO, ..EngineSettings::batch() };
        assert_eq!(s.bounds(), TimeBounds { max_future_ms: None, max_jump_ms: None });
        assert_eq!(EngineSettings::batch().bounds().max_future_ms, Some(300_000));
        let c = EngineSettings { idle_timeout: Duration::from_secs(60), ..EngineSettings::batch() }.config();
        assert_eq!((c.limits.idle_ms, c.lateness_ms), (60_000, 0));
    }
}
