//! The `vigil` command line.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vigil::input::InputOptions;
use vigil::replay::{Progress, ReplayOptions};
use vigil::ruleset::RuleSet;
use vigil::settings::{EngineArgs, EngineSettings};

/// mimalloc rather than the system allocator: every event makes and frees a few small
/// allocations, and mimalloc's per-thread free lists make those markedly cheaper.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "vigil", version, about = "Real-time anomaly detection for datacenters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check rule files (`*.saql`, or folders of them); exit 1 if any rule is invalid.
    Check {
        /// Files or folders to check.
        #[arg(default_value = "rules")]
        paths: Vec<PathBuf>,
        /// How to print problems.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print the plan each rule compiles to, or (`--physical`) what the engine builds from them.
    Explain {
        /// Rule files or folders.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print the physical plan of the rule set: operators, shared filters and state, routing
        /// indexes and the gate.
        #[arg(long)]
        physical: bool,
    },
    /// Run recorded events through rules; alerts come out as JSON lines.
    Replay {
        /// Rule file or folder.
        #[arg(long, default_value = "rules")]
        rules: PathBuf,
        /// Input files: JSON lines, NAB CSV, Google 2011 or Alibaba 2017 traces (`.gz` too).
        #[arg(required_unless_present = "url")]
        inputs: Vec<PathBuf>,
        /// Input format; `auto` decides from the file name and first line.
        #[arg(long, value_enum, default_value_t = vigil::input::Format::Auto)]
        format: vigil::input::Format,
        /// `max`, or event time at a multiple of real time: `1x`, `60x`.
        #[arg(long, default_value = "max")]
        speed: vigil::replay::Speed,
        /// Write alerts here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Stop at the first malformed line.
        #[arg(long)]
        strict: bool,
        /// Host of NAB series (default: from the file name).
        #[arg(long)]
        host: Option<String>,
        /// Metric name of NAB series (default: from the file name).
        #[arg(long)]
        metric_name: Option<String>,
        /// Unit of line protocol timestamps (`--format influx`): ns, us, ms, s, m, h.
        #[arg(long, default_value = "ns")]
        precision: vigil::influx::Precision,
        /// The tag of line protocol that names the host (`--format influx`, `telegraf-json`),
        /// as `vigil serve` names it (`--host-tag` too).
        #[arg(long = "influx-host-tag", alias = "host-tag", default_value = "host")]
        host_tag: String,
        /// The attribute of OTLP metrics that names the host (`--format otlp-json`), as
        /// `vigil serve` names it (`--host-attribute` too).
        #[arg(long = "otlp-host-attribute", alias = "host-attribute", default_value = "host.name")]
        host_attribute: String,
        /// The label that names the host (`--format prometheus-kafka-adapter`), its `:port`
        /// dropped, as `vigil serve` names it (`--host-label` too).
        #[arg(long = "remote-write-host-label", alias = "host-label", default_value = "instance")]
        host_label: String,
        /// A backtest: the inputs read from Prometheus.
        #[command(flatten)]
        prometheus: Box<vigil::backtest::PrometheusArgs>,
        /// Lateness, time bounds, workers and limits. With several workers the alerts are those
        /// of one engine, in detection order within each batch of 1,024 events; 1 keeps the
        /// order of a single engine exactly.
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Run the service: Kafka or HTTP ingest in, alerts stored, streamed and pushed to a webhook.
    Serve(Box<vigil::service::config::ServeArgs>),
    /// Send a recorded file's events to Kafka, as JSON, to exercise a deployment.
    Produce {
        /// Kafka bootstrap servers.
        #[arg(long, env = "VIGIL_KAFKA_BROKERS")]
        brokers: String,
        /// Topic for every event [default: the topic named as each event's stream]
        #[arg(long)]
        topic: Option<String>,
        /// `max`, or event time at a multiple of real time: `1x`, `60x`.
        #[arg(long, default_value = "max")]
        speed: vigil::replay::Speed,
        /// Input format; `auto` decides from the file name and first line.
        #[arg(long, value_enum, default_value_t = vigil::input::Format::Auto)]
        format: vigil::input::Format,
        /// Create the topics first if they do not exist.
        #[arg(long)]
        create_topics: bool,
        /// Partitions of the topics `--create-topics` creates.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=10_000))]
        partitions: i32,
        /// A librdkafka property for the producer, KEY=VALUE, repeatable (as `serve --kafka-option`).
        #[arg(long = "kafka-option", value_parser = vigil::service::config::parse_kafka_option)]
        kafka_options: Vec<(String, String)>,
        /// Files to send.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
    },
    /// Measure throughput, latency and memory on a generated workload (see BENCHMARKS.md).
    Bench {
        /// Which workload.
        #[arg(long, value_enum, default_value_t = vigil::bench::Workload::Filter)]
        workload: vigil::bench::Workload,
        /// Events to generate.
        #[arg(long, default_value_t = 2_000_000)]
        events: u64,
        /// Distinct keys (machines; tasks for `outlier`).
        #[arg(long, default_value_t = 1_000)]
        keys: u64,
        /// Rules for the `mixed` workload.
        #[arg(long, default_value_t = 100)]
        rules_count: usize,
        /// Event time between generated events, in microseconds (1000: one event per ms).
        #[arg(long, default_value_t = 1000)]
        step_us: u64,
        /// Read events from this JSON-lines file instead of generating them.
        #[arg(long)]
        input: Option<PathBuf>,
        /// Use these rules (a file or a folder) instead of the workload's.
        #[arg(long)]
        rules: Option<PathBuf>,
        /// Write the workload's generated events to this file and stop, without running them:
        /// the same events for another tool (BENCHMARKS.md runs Flink on them) or for `--input`.
        #[arg(long, conflicts_with = "input")]
        write_events: Option<PathBuf>,
        /// Time the latency of one line in this many (1: every line). Reading the clock costs
        /// about 35 ns here, several percent of an event's time.
        #[arg(long, default_value_t = 16)]
        latency_every: u64,
        /// Run the workload over `usage`, a stream declared with task_usage's fields, instead
        /// of task_usage itself: what a stream of a user's costs beside Vigil's own.
        #[arg(long)]
        declared_stream: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Score rules on labelled series (NAB's three profiles, per file, per family and in all),
    /// or (`--budget`) count their alerts per series per day on unlabelled input.
    Eval {
        /// Rule file or folder.
        #[arg(long, default_value = "rules/metrics")]
        rules: PathBuf,
        /// Input files or folders: NAB CSV files for scoring; any format for `--budget`.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// NAB's anomaly windows [default: `labels/combined_windows.json` in or above an input folder]
        #[arg(long)]
        labels: Option<PathBuf>,
        /// Published scores to print beside ours [default: `scoreboard.md` beside the labels folder, if any]
        #[arg(long)]
        scoreboard: Option<PathBuf>,
        /// Count alerts per series per day over the inputs replayed together, instead of scoring.
        #[arg(long)]
        budget: bool,
        /// Judge the rules that judge silence instead: cut three 12-hour outages into each NAB
        /// CSV file and count those detected, their delay, and silence alerts elsewhere.
        #[arg(long, conflicts_with = "budget")]
        outages: bool,
        /// Input format for `--budget`; `auto` decides from each file's name and first line.
        #[arg(long, value_enum, default_value_t = vigil::input::Format::Auto)]
        format: vigil::input::Format,
        /// With `--budget`: gather the series onto this many hosts (each keeps its own host as
        /// the label `instance`), to measure roll-ups on hosts of many series.
        #[arg(long, requires = "budget", value_parser = clap::value_parser!(u32).range(1..))]
        hosts: Option<u32>,
        /// Files scored at once.
        #[arg(long)]
        threads: Option<usize>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Why a rule did not alert through a past incident: its tests' values in each window against
    /// its thresholds, the smallest change of one threshold that would have caught it (checked by
    /// replaying with it) and that change's alerts and pages; exit 1 if the rule did not alert.
    Why {
        #[command(flatten)]
        args: Box<vigil::why::WhyArgs>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Run rule test files (`*.toml`, or folders of them); exit 1 if any case fails.
    Test {
        /// Test files or folders.
        #[arg(default_value = "rules")]
        paths: Vec<PathBuf>,
        /// The engine of every case; `--lateness` applies to cases whose file sets none.
        #[command(flatten)]
        engine: EngineArgs,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    /// Source lines with carets under each problem.
    Text,
    /// One JSON array of problems: file, line, column, code, message, labels, notes, help.
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { paths, format } => check(&paths, format),
        Command::Explain { paths, physical } => explain(&paths, physical),
        Command::Replay {
            rules,
            inputs,
            format,
            speed,
            out,
            strict,
            host,
            metric_name,
            precision,
            host_tag,
            host_attribute,
            host_label,
            prometheus,
            engine,
        } => {
            let options = ReplayOptions { speed, strict, engine: engine.over(EngineSettings::batch()) };
            let input_options = InputOptions {
                host,
                metric_name,
                hosts: vigil::HostMapping {
                    influx: vigil::influx::Mapping { host_tag, precision },
                    otlp_attribute: host_attribute,
                    remote_write: vigil::remote_write::HostLabels::new(&host_label),
                },
                ..InputOptions::default()
            };
            let from = Inputs { files: &inputs, format, prometheus: &prometheus };
            replay(&rules, from, &input_options, &options, out.as_deref())
        }
        Command::Why { args, engine } => why(&args, &engine),
        Command::Test { paths, engine } => rule_tests(&paths, &engine.over(EngineSettings::batch())),
        Command::Eval { rules, inputs, labels, scoreboard, budget, outages, format, hosts, threads, engine } => {
            let options = ReplayOptions {
                speed: vigil::replay::Speed::Max,
                strict: false,
                engine: engine.over(EngineSettings::batch()),
            };
            let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            if outages {
                evaluate_outages(&rules, &inputs, &options, threads)
            } else {
                evaluate(&rules, &inputs, labels, scoreboard, budget.then_some((format, hosts)), &options, threads)
            }
        }
        Command::Bench {
            workload,
            events,
            keys,
            rules_count,
            step_us,
            input,
            rules,
            write_events,
            latency_every,
            declared_stream,
            json,
            engine,
        } => {
            let options = vigil::bench::BenchOptions {
                workload,
                events,
                keys,
                rules: rules_count,
                step_us,
                input,
                rules_path: rules,
                latency_every,
                declared_stream,
                engine: engine.over(EngineSettings::batch()),
            };
            match write_events {
                Some(path) => vigil::bench::generate(&path, &options)
                    .map(|()| true)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display())),
                None => bench(&options, json),
            }
        }
        Command::Serve(args) => serve(*args),
        Command::Produce { brokers, topic, speed, format, create_topics, partitions, kafka_options, inputs } => {
            let options = kafka_options.into_iter().collect();
            let create = create_topics.then_some(partitions);
            produce(&brokers, &options, topic.as_deref(), speed, format, create, &inputs)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

fn load(paths: &[PathBuf]) -> Result<RuleSet> {
    Ok(RuleSet::load(paths)?)
}

fn check(paths: &[PathBuf], format: Format) -> Result<bool> {
    let set = load(paths)?;
    let compiled = set.files();
    let problems: usize = compiled.iter().map(|c| c.diagnostics.len()).sum();
    match format {
        Format::Json => {
            println!("{}", serde_json::to_string_pretty(&set.to_json())?);
        }
        Format::Text => {
            print!("{}", set.render(use_color()));
            let rules: usize = compiled.iter().map(|c| c.rule_names.len()).sum();
            let bad_files = compiled.iter().filter(|c| !c.is_ok()).count();
            if problems == 0 {
                println!(
                    "ok: {} file{}, {rules} rule{} checked",
                    compiled.len(),
                    plural(compiled.len()),
                    plural(rules)
                );
            } else {
                println!(
                    "{problems} problem{} in {bad_files} of {} file{}",
                    plural(problems),
                    compiled.len(),
                    plural(compiled.len())
                );
            }
        }
    }
    Ok(problems == 0)
}

fn explain(paths: &[PathBuf], physical: bool) -> Result<bool> {
    if !physical {
        for path in paths {
            if std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?.is_dir() {
                bail!("{} is a folder; explain takes rule files (or a folder with --physical)", path.display());
            }
        }
    }
    let Some(plans) = load_plans(paths)? else { return Ok(false) };
    if physical {
        let engine = vigil::engine::Engine::new(plans, Default::default());
        print!("{}", engine.layout());
        return Ok(true);
    }
    for (i, plan) in plans.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{plan}");
    }
    Ok(true)
}

/// Loads rules, printing their problems; `None` if any rule is invalid.
fn load_plans(paths: &[PathBuf]) -> Result<Option<Vec<vigil::plan::RulePlan>>> {
    Ok(load_checked(paths)?.map(|set| set.plans()))
}

/// [`load_plans`], with the set itself: its catalogue names the streams inputs may have.
fn load_checked(paths: &[PathBuf]) -> Result<Option<RuleSet>> {
    let set = load(paths)?;
    if !set.is_ok() {
        eprint!("{}", set.render(std::io::stderr().is_terminal()));
        return Ok(None);
    }
    Ok(Some(set))
}

/// What a replay reads: files, or a range of Prometheus' history.
struct Inputs<'a> {
    files: &'a [PathBuf],
    format: vigil::input::Format,
    prometheus: &'a vigil::backtest::PrometheusArgs,
}

fn replay(
    rules: &Path,
    inputs: Inputs,
    input_options: &InputOptions,
    options: &ReplayOptions,
    out: Option<&Path>,
) -> Result<bool> {
    let Some(set) = load_checked(&[rules.to_path_buf()])? else { return Ok(false) };
    let plans = set.plans();
    if plans.is_empty() {
        bail!("no rules in {}", rules.display());
    }
    let input_options = &InputOptions { catalog: set.catalog().clone(), ..input_options.clone() };
    let (mut driven, gate) = vigil::replay::engines(plans, &options.engine);
    // The decoders and the engine share one pool of events: the engine gives back those no rule
    // kept, and the decoders read later lines into them.
    let pool = std::rc::Rc::new(std::cell::RefCell::new(vigil::event::EventPool::default()));
    let (opened, failure) = match inputs.prometheus.url {
        Some(_) => {
            let (input, failure) = inputs.prometheus.input(input_options.hosts.remote_write.clone())?;
            (vec![input], Some(failure))
        }
        None => {
            let opened = inputs
                .files
                .iter()
                .map(|p| {
                    vigil::input::open_gated(p, inputs.format, input_options, gate.clone(), pool.clone())
                        .with_context(|| format!("cannot read {}", p.display()))
                })
                .collect::<Result<Vec<_>>>()?;
            (opened, None)
        }
    };
    let mut writer: Box<dyn std::io::Write> = match out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut bar = Bar::new();
    let summary = vigil::replay::replay(driven.as_mut(), opened, &pool, options, &mut writer, &mut bar)?;
    bar.finish();
    eprint!("{}", summary.report());
    if let Some(e) = failure.and_then(|f| f.lock().ok().and_then(|mut e| e.take())) {
        bail!("the backtest stopped early: {e}");
    }
    Ok(summary.stopped_at.is_none())
}

fn why(args: &vigil::why::WhyArgs, engine: &EngineArgs) -> Result<bool> {
    let Some(set) = load_checked(std::slice::from_ref(&args.rules))? else { return Ok(false) };
    let options =
        ReplayOptions { speed: vigil::replay::Speed::Max, strict: false, engine: engine.over(EngineSettings::batch()) };
    vigil::why::run(args, &set.plans(), set.catalog(), &options)
}

fn evaluate_outages(rules: &Path, inputs: &[PathBuf], options: &ReplayOptions, threads: usize) -> Result<bool> {
    let Some(plans) = load_plans(&[rules.to_path_buf()])? else { return Ok(false) };
    let started = std::time::Instant::now();
    let files: Vec<PathBuf> =
        vigil::eval::files_under(inputs)?.into_iter().filter(|f| f.extension().is_some_and(|e| e == "csv")).collect();
    if files.is_empty() {
        bail!("no NAB CSV file (timestamp,value) among the inputs");
    }
    let results = vigil::eval::outages::run_outages(&plans, &files, options, threads)?;
    print!("{}", vigil::eval::report::outages(&results));
    eprintln!("{} files in {:.1} s", files.len(), started.elapsed().as_secs_f64());
    Ok(true)
}

fn evaluate(
    rules: &Path,
    inputs: &[PathBuf],
    labels: Option<PathBuf>,
    scoreboard: Option<PathBuf>,
    budget: Option<(vigil::input::Format, Option<u32>)>,
    options: &ReplayOptions,
    threads: usize,
) -> Result<bool> {
    let Some(plans) = load_plans(&[rules.to_path_buf()])? else { return Ok(false) };
    if plans.is_empty() {
        bail!("no rules in {}", rules.display());
    }
    let started = std::time::Instant::now();
    if let Some((format, hosts)) = budget {
        let files = vigil::eval::files_under(inputs)?;
        let b = vigil::eval::run_budget(&plans, &files, format, options, hosts)?;
        print!("{}", vigil::eval::report::budget(&b));
        eprintln!("{} files in {:.1} s", files.len(), started.elapsed().as_secs_f64());
        return Ok(true);
    }
    let labels = match labels {
        Some(l) => l,
        None => inputs
            .iter()
            .flat_map(|i| i.ancestors().map(|a| a.join("labels/combined_windows.json")).collect::<Vec<_>>())
            .find(|p| p.is_file())
            .context("no labels found: give --labels (NAB's labels/combined_windows.json)")?,
    };
    let scoreboard = scoreboard.or_else(|| {
        let beside = labels.parent()?.parent()?.join("scoreboard.md");
        beside.is_file().then_some(beside)
    });
    let anchors = scoreboard.as_deref().map(vigil::eval::report::Anchors::read).transpose()?;
    let windows = vigil::eval::read_labels(&labels)?;
    let files = vigil::eval::labelled_files(inputs, &windows)?;
    if files.is_empty() {
        bail!("none of the inputs is a file {} labels", labels.display());
    }
    let n = files.len();
    let run = vigil::eval::run_labelled(&plans, files, options, threads)?;
    let label = format!("Vigil ({})", rules.display());
    print!("{}", vigil::eval::report::labelled(&run, anchors.as_ref(), &label));
    eprintln!("{n} files in {:.1} s", started.elapsed().as_secs_f64());
    Ok(true)
}

/// A progress bar on standard error, drawn only when it is a terminal.
struct Bar {
    bar: indicatif::ProgressBar,
    started: std::time::Instant,
    shown: u64,
}

/// Malformed lines printed one by one before the rest are only counted.
const MALFORMED_SHOWN: u64 = 50;

impl Bar {
    fn new() -> Self {
        let target = if std::io::stderr().is_terminal() {
            indicatif::ProgressDrawTarget::stderr()
        } else {
            indicatif::ProgressDrawTarget::hidden()
        };
        let bar = indicatif::ProgressBar::with_draw_target(Some(0), target);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:30} {percent:>3}% {msg}") {
            bar.set_style(style);
        }
        Bar { bar, started: std::time::Instant::now(), shown: 0 }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn advance(&mut self, events: u64, alerts: u64, (read, total): (u64, u64)) {
        self.bar.set_length(total.max(1));
        self.bar.set_position(read.min(total));
        let rate = events as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        self.bar.set_message(format!("{events} events, {rate:.0} events/s, {alerts} alerts"));
    }

    fn malformed(&mut self, message: &str) {
        self.shown += 1;
        if self.shown <= MALFORMED_SHOWN {
            self.bar.suspend(|| eprintln!("malformed: {message}"));
        } else if self.shown == MALFORMED_SHOWN + 1 {
            self.bar.suspend(|| eprintln!("(more malformed lines are counted in the summary only)"));
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VIGIL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn serve(args: vigil::service::config::ServeArgs) -> Result<bool> {
    init_logging();
    let config =
        vigil::service::config::ServeConfig::resolve(args).map_err(|e| anyhow::anyhow!("bad configuration:\n{e}"))?;
    runtime()?.block_on(vigil::service::serve(config))?;
    Ok(true)
}

fn produce(
    brokers: &str,
    options: &std::collections::BTreeMap<String, String>,
    topic: Option<&str>,
    speed: vigil::replay::Speed,
    format: vigil::input::Format,
    create_topics: Option<i32>,
    inputs: &[PathBuf],
) -> Result<bool> {
    let opened = inputs
        .iter()
        .map(|p| {
            vigil::input::open(p, format, &InputOptions::default())
                .with_context(|| format!("cannot read {}", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let (sent, malformed) =
        runtime()?.block_on(vigil::service::kafka::produce(brokers, options, topic, opened, speed, create_topics))?;
    eprintln!("sent {sent} events to Kafka ({malformed} malformed lines skipped)");
    Ok(malformed == 0)
}

fn bench(options: &vigil::bench::BenchOptions, json: bool) -> Result<bool> {
    let report = vigil::bench::run(options)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(true)
}

fn rule_tests(paths: &[PathBuf], engine: &EngineSettings) -> Result<bool> {
    let files = vigil::ruletest::test_files(paths).context("cannot list test files")?;
    if files.is_empty() {
        bail!("no rule test files (*.toml) under the given paths");
    }
    let report = vigil::ruletest::run(&files, engine, &mut std::io::stdout().lock())?;
    Ok(report.failed == 0)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
