//! `vigil why`: why a rule did not alert through a past incident ([`vigil_engine::why`]), read
//! from files or from a team's Prometheus, as text, JSON or a plot.

use crate::backtest::{parse_time, PrometheusArgs};
use anyhow::{anyhow, bail, Context, Result};
use std::fmt::Write;
use std::path::PathBuf;
use vigil_engine::event::format_time;
use vigil_engine::replay::ReplayOptions;
use vigil_engine::why::{self, Answer, Change, Cost, Question};
use vigil_formats::input::{Format, InputOptions};
use vigil_lang::plan::RulePlan;

/// What `vigil why` is asked.
#[derive(clap::Args, Debug, Clone)]
pub struct WhyArgs {
    /// The rule asked about.
    #[arg(long)]
    pub rule: String,
    /// Rule file or folder the rule is in.
    #[arg(long, default_value = "rules/metrics")]
    pub rules: PathBuf,
    /// The incident's start: RFC 3339, Unix seconds or `now-2h` (as --start).
    #[arg(long)]
    pub from: String,
    /// The incident's end, written as --from.
    #[arg(long)]
    pub to: String,
    /// Only the groups (series, hosts) whose key contains this text, as alerts write keys:
    /// `s.host=web-1`, `cpu`.
    #[arg(long)]
    pub key: Option<String>,
    /// Input files, replayed from their start so that the rule has learned what it had by the
    /// incident.
    #[arg(required_unless_present = "url")]
    pub inputs: Vec<PathBuf>,
    /// Input format; `auto` decides from the file name and first line.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// Host of NAB series (default: from the file name).
    #[arg(long)]
    pub host: Option<String>,
    /// The history read from Prometheus instead of files (--start early enough for the rule to
    /// have learned).
    #[command(flatten)]
    pub prometheus: Box<PrometheusArgs>,
    /// Count each change's alerts and pages over this fleet too (a file or folder replayed
    /// together, as `vigil eval --budget` does), against the rule as written; repeat for more.
    #[arg(long, value_name = "INPUT")]
    pub cost: Vec<PathBuf>,
    /// With --cost: gather the series onto this many hosts first (as `eval --budget --hosts`).
    #[arg(long, requires = "cost", value_parser = clap::value_parser!(u32).range(1..))]
    pub hosts: Option<u32>,
    /// Write the plot of the first group asked about here, as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The answer and, with --cost, the cost over each of those fleets: the rule as written, then
/// each change that caught the incident.
pub struct Answered {
    pub answer: Answer,
    pub elsewhere: Vec<(PathBuf, Vec<crate::eval::Budget>)>,
}

/// Asks the question of the rule named in `plans`.
pub fn ask(
    args: &WhyArgs,
    plans: &[RulePlan],
    catalog: &vigil_lang::schema::Catalog,
    options: &ReplayOptions,
) -> Result<Answered> {
    let Some(plan) = plans.iter().find(|p| p.name == args.rule) else {
        let names: Vec<&str> = plans.iter().map(|p| p.name.as_str()).collect();
        bail!("no rule `{}` in {}: it has {}", args.rule, args.rules.display(), names.join(", "));
    };
    let now = vigil_engine::event::now_ms();
    let from = parse_time(&args.from, now).map_err(|e| anyhow!("--from: {e}"))?;
    let to = parse_time(&args.to, now).map_err(|e| anyhow!("--to: {e}"))?;
    if to < from {
        bail!("--to ({}) is before --from ({})", format_time(to), format_time(from));
    }
    let question = Question { from, to, key: args.key.clone() };
    let input_options = InputOptions { catalog: catalog.clone(), host: args.host.clone(), ..InputOptions::default() };
    let failures = std::cell::RefCell::new(Vec::new());
    let mut open = |gate: vigil_engine::engine::Gate,
                    pool: std::rc::Rc<std::cell::RefCell<vigil_engine::event::EventPool>>|
     -> Result<Vec<vigil_formats::input::Input<vigil_engine::event::Decoded>>, String> {
        if args.prometheus.url.is_some() {
            let (input, failure) =
                args.prometheus.input(input_options.hosts.remote_write.clone()).map_err(|e| format!("{e:#}"))?;
            failures.borrow_mut().push(failure);
            return Ok(vec![input]);
        }
        args.inputs
            .iter()
            .map(|p| {
                vigil_formats::input::open_gated(p, args.format, &input_options, gate.clone(), pool.clone())
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))
            })
            .collect()
    };
    let answer = why::ask(plan, &question, options, &mut open).map_err(|e| anyhow!(e))?;
    for failure in failures.into_inner() {
        if let Some(e) = failure.lock().ok().and_then(|mut e| e.take()) {
            bail!("reading Prometheus stopped early: {e}");
        }
    }
    let mut elsewhere = Vec::new();
    for fleet in &args.cost {
        let files = crate::eval::files_under(std::slice::from_ref(fleet))?;
        let budget =
            |p: &RulePlan| crate::eval::run_budget(std::slice::from_ref(p), &files, Format::Auto, options, args.hosts);
        let mut budgets = vec![budget(plan)?];
        for change in answer.changes.iter().filter(|c| c.caught.is_some()) {
            let mut changed = plan.clone();
            changed.alert.condition = change.applied(&plan.alert.condition);
            budgets.push(budget(&changed)?);
        }
        elsewhere.push((fleet.clone(), budgets));
    }
    Ok(Answered { answer, elsewhere })
}

/// Runs `vigil why`: prints the answer; `false` (exit 1) if the rule as written did not alert.
pub fn run(
    args: &WhyArgs,
    plans: &[RulePlan],
    catalog: &vigil_lang::schema::Catalog,
    options: &ReplayOptions,
) -> Result<bool> {
    let answered = ask(args, plans, catalog, options)?;
    let answer = &answered.answer;
    if let Some(path) = &args.plot {
        let group = answer.groups.first().context("no group to plot: the rule judged none in the range")?;
        std::fs::write(path, why::plot::svg(answer, group))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        let elsewhere: Vec<serde_json::Value> = answered
            .elsewhere
            .iter()
            .map(|(fleet, budgets)| {
                serde_json::json!({
                    "fleet": fleet.display().to_string(),
                    "as_written": budget_json(&budgets[0]),
                    "changed": budgets[1..].iter().map(budget_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        let mut json = serde_json::to_value(answer)?;
        json["elsewhere"] = serde_json::Value::Array(elsewhere);
        print(&format!("{}\n", serde_json::to_string_pretty(&json)?));
    } else {
        print(&text(&answered));
    }
    Ok(answer.caught)
}

/// Prints `text`, a closed pipe (`| head`) ending the output quietly.
fn print(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn budget_json(b: &crate::eval::Budget) -> serde_json::Value {
    serde_json::json!({
        "series": b.series,
        "hosts": b.hosts,
        "alerts": b.total(),
        "pages": b.pages.values().sum::<usize>(),
        "alerts_per_series_day": b.per_series_day(b.total()),
        "pages_per_host_week": 7.0 * b.per_host_day(b.pages.values().sum()),
    })
}

/// The answer as people read it.
pub fn text(answered: &Answered) -> String {
    let a = &answered.answer;
    let mut out = String::new();
    let _ = writeln!(out, "{}: alert {}", a.rule, a.condition);
    let _ = writeln!(
        out,
        "incident {} to {}{}",
        format_time(a.from),
        format_time(a.to),
        match &a.key {
            Some(k) => format!(", groups matching `{k}`"),
            None => String::new(),
        }
    );
    if a.groups.is_empty() {
        let _ = writeln!(out, "\nthe rule judged no group in the range (no samples it reads, or none matching)");
    }
    for g in &a.groups {
        let _ = writeln!(out, "\n{}: {}", g.key, g.verdict);
        out.push_str(&windows(a, g));
    }
    if !a.caught && !a.changes.is_empty() {
        let _ = writeln!(
            out,
            "\nSmallest changes of one threshold (two when no one suffices), each checked by replaying the input with it:"
        );
        for c in &a.changes {
            out.push_str(&change(c, &a.cost));
        }
    } else if !a.caught {
        let _ = writeln!(out, "\nNo change of one or two thresholds makes the condition hold in a judged window.");
    }
    for (fleet, budgets) in &answered.elsewhere {
        let (base, changed) = budgets.split_first().expect("the rule as written first");
        let _ = writeln!(out, "\nOver {} ({} series on {} hosts):", fleet.display(), base.series, base.hosts);
        let line = |b: &crate::eval::Budget| {
            let pages: usize = b.pages.values().sum();
            format!(
                "{} alerts ({:.3} per series per day), {pages} pages ({:.2} per host per week)",
                b.total(),
                b.per_series_day(b.total()),
                7.0 * b.per_host_day(pages)
            )
        };
        let _ = writeln!(out, "  as written: {}", line(base));
        for (c, b) in a.changes.iter().filter(|c| c.caught.is_some()).zip(changed) {
            let _ = writeln!(out, "  {}: {}", moves(c), line(b));
        }
    }
    out
}

/// The thresholds a change moves: `ss.v > 10 -> 9.4 (-6.0%)`, and ` and ...` for a second.
fn moves(c: &Change) -> String {
    let one = |text: &str, from: f64, to: f64| {
        let shown = vigil_engine::engine::shown_number(to);
        format!("{text} -> {shown} ({:+.1}%)", (to - from) / from.abs().max(f64::MIN_POSITIVE) * 100.0)
    };
    std::iter::once(one(&c.text, c.from, c.to))
        .chain(c.also.iter().map(|m| one(&m.text, m.from, m.to)))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// A change and what the replay with it showed, against the rule as written (`base`).
fn change(c: &Change, base: &Cost) -> String {
    let caught = match &c.caught {
        Some(s) => format!("caught at {} ({}, {})", format_time(s.time), s.severity, s.key),
        None => format!("still not caught: {}", c.missed.as_deref().unwrap_or("no window judged")),
    };
    format!(
        "  {}: {caught}\n    over the input: {} -> {} alerts ({:.3} -> {:.3} per series per day), {} -> {} pages ({:.2} -> {:.2} per host per week)\n",
        moves(c),
        base.alerts,
        c.cost.alerts,
        base.alerts_per_series_day(),
        c.cost.alerts_per_series_day(),
        base.pages,
        c.cost.pages,
        base.pages_per_host_week(),
        c.cost.pages_per_host_week()
    )
}

/// Most windows listed per group: the nearest to firing, in time order.
const LISTED: usize = 24;

/// A group's judged windows: each threshold test's value, and whether the condition held.
fn windows(a: &Answer, g: &why::GroupAnswer) -> String {
    let tests: Vec<usize> = (0..a.tests.len()).filter(|&t| a.tests[t].threshold.is_some()).collect();
    let mut points: Vec<&vigil_engine::engine::trace::TracePoint> = g.points.iter().filter(|p| p.active).collect();
    if points.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    if points.len() > LISTED {
        let passed =
            |p: &&vigil_engine::engine::trace::TracePoint| p.tests.iter().filter(|t| **t == Some(true)).count();
        points.sort_by_key(|p| std::cmp::Reverse(passed(p)));
        points.truncate(LISTED);
        points.sort_by_key(|p| p.end);
        let _ = writeln!(out, "  the {LISTED} of {} judged windows that passed most tests:", g.points.len());
    }
    let _ = write!(out, "  {:<26}", "window end");
    for &t in &tests {
        let _ = write!(out, " {:>16}", head(&a.tests[t].text));
    }
    let _ = writeln!(out, "  held");
    for p in points {
        let _ = write!(out, "  {:<26}", format_time(p.end));
        for &t in &tests {
            let v = p.values.get(t).copied().flatten().map_or("-".to_string(), vigil_engine::engine::shown_number);
            let mark = if p.tests.get(t).copied().flatten() == Some(true) { "*" } else { " " };
            let _ = write!(out, " {:>15}{mark}", v);
        }
        let _ = writeln!(out, "  {}", if p.held { "yes" } else { "" });
    }
    let _ = writeln!(out, "  (* the test passed; - unknown: a scorer still warming up)");
    out
}

/// A test's text cut to a column's width.
fn head(text: &str) -> String {
    if text.chars().count() <= 16 {
        text.to_string()
    } else {
        text.chars().take(15).chain(std::iter::once('~')).collect()
    }
}
