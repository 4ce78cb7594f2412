//! A time-bounded fuzz of the rule compiler, and of the engine on what compiles.
//!
//! Inputs are mutations of a corpus (the shipped rules and the diagnostic examples): bytes
//! flipped, ranges cut, repeated or spliced in from another file, language tokens inserted.
//! Every input must compile to plans or diagnostics without a panic, every diagnostic must
//! point inside the input, and every rule set that compiles must run over sample events
//! without a panic. An input that breaks this is written to `target/fuzz-failures/` and named in
//! the failure. `VIGIL_FUZZ_SECONDS` sets the budget (5 s by default; scripts/test.sh gives it
//! more), `VIGIL_FUZZ_SEED` repeats a run.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TOKENS: &[&str] = &[
    "rule ",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    " -> ",
    " within ",
    " min",
    " s",
    " h",
    " d",
    " not ",
    " for ",
    " as ",
    " with ",
    " state ",
    " := ",
    " group by ",
    " alert ",
    " severity ",
    " labels ",
    " annotations ",
    " return ",
    " invariant ",
    " offline",
    " online",
    " cluster",
    "(method = ",
    "dbscan(",
    "mad(",
    "zscore(",
    " #time(",
    " #sliding(",
    "ss[1]",
    "ss.",
    "e1.",
    "avg(",
    "count()",
    "max(",
    "min(",
    "sum(",
    "stddev(",
    " && ",
    " || ",
    " == ",
    " != ",
    " <= ",
    " >= ",
    " > ",
    " < ",
    " + ",
    " - ",
    " * ",
    " / ",
    " % ",
    "!",
    "e{3,}",
    "e{0,}",
    "e{",
    "\"",
    "\"{t.job_id}\"",
    "'",
    "//",
    "/*",
    "\n",
    " ",
    ",",
    ".",
    "0",
    "-1",
    "1e308",
    "999999999999999999999",
    "0.0",
    " task ",
    " machine ",
    " metric ",
    " host ",
    " t ",
    " m ",
    " evict ",
    " fail ",
    " submit ",
    " use ",
    "\u{0}",
    "\u{feff}",
    "é",
    "\u{202e}",
    "\t",
];

fn corpus() -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["rules", "rules/metrics", "tests/diagnostics"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "saql")));
        }
    }
    files.sort();
    let corpus: Vec<Vec<u8>> = files.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    assert!(corpus.len() > 20, "the corpus is the shipped rules and diagnostics: run from the crate root");
    corpus
}

fn mutate(rng: &mut fastrand::Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut input = corpus[rng.usize(..corpus.len())].clone();
    for _ in 0..rng.usize(1..8) {
        let len = input.len();
        let at = rng.usize(..=len);
        match rng.u8(..6) {
            0 if len > 0 => {
                let i = rng.usize(..len);
                input[i] ^= 1 << rng.u8(..8);
            }
            1 => {
                let token = TOKENS[rng.usize(..TOKENS.len())].as_bytes();
                input.splice(at..at, token.iter().copied());
            }
            2 if len > 0 => {
                let end = (at + rng.usize(..64)).min(len);
                input.drain(at.min(end)..end);
            }
            3 if len > 0 => {
                // Repeat a range, up to a few times: nesting and long chains.
                let start = rng.usize(..len);
                let end = (start + rng.usize(1..32)).min(len);
                let piece = input[start..end].to_vec();
                for _ in 0..rng.usize(1..20) {
                    input.splice(start..start, piece.iter().copied());
                }
            }
            4 => {
                let other = &corpus[rng.usize(..corpus.len())];
                if !other.is_empty() {
                    let from = rng.usize(..other.len());
                    let to = (from + rng.usize(1..200)).min(other.len());
                    input.splice(at..at, other[from..to].iter().copied());
                }
            }
            _ => {
                let junk: Vec<u8> = (0..rng.usize(1..16)).map(|_| rng.u8(..)).collect();
                input.splice(at..at, junk);
            }
        }
    }
    input
}

fn sample_events() -> Vec<vigil::event::Event> {
    let text = std::fs::read_to_string("samples/datacenter.jsonl").expect("sample events");
    text.lines().take(300).filter_map(|l| vigil::event::decode(l, None).ok()).collect()
}

/// Compiles one input and runs what compiles: whether it compiled without diagnostics, or the
/// problem found.
fn check(input: &[u8], events: &[vigil::event::Event]) -> Result<bool, String> {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let compiled = vigil::compile("fuzz.saql", input);
        // Spans index the text the diagnostics are shown against (invalid UTF-8 made lossy).
        let text = &compiled.text;
        for d in &compiled.diagnostics {
            for label in &d.labels {
                let (start, end) = (label.span.start, label.span.end);
                if start > end || end > text.len() || !text.is_char_boundary(start) || !text.is_char_boundary(end) {
                    return Err(format!(
                        "{}: span {start}..{end} is not a piece of the {} bytes of text",
                        d.code,
                        text.len()
                    ));
                }
            }
        }
        if !compiled.plans.is_empty() {
            let mut engine = vigil::engine::Engine::new(compiled.plans, vigil::engine::EngineConfig::default());
            let mut out = Vec::new();
            for e in events {
                engine.push(e.clone(), &mut out);
            }
            engine.flush(&mut out);
        }
        Ok(compiled.diagnostics.is_empty())
    }));
    match outcome {
        Ok(result) => result,
        Err(panic) => Err(format!(
            "panic: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

fn keep(input: &[u8], n: usize) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
    std::fs::create_dir_all(&dir).ok();
    let path = dir.join(format!("failure-{n}.saql"));
    std::fs::write(&path, input).ok();
    path
}

#[test]
fn the_compiler_and_engine_survive_mutated_rules_for_the_time_budget() {
    let budget =
        Duration::from_secs(std::env::var("VIGIL_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5));
    let seed = std::env::var("VIGIL_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let corpus = corpus();
    let events = sample_events();
    let mut rng = fastrand::Rng::with_seed(seed);
    // Panics are caught and reported with their input; keep the default hook from printing each.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let started = Instant::now();
    let (mut inputs, mut compiled_clean) = (0usize, 0usize);
    let mut failures = Vec::new();
    while started.elapsed() < budget {
        let input = mutate(&mut rng, &corpus);
        inputs += 1;
        match check(&input, &events) {
            Ok(clean) => compiled_clean += usize::from(clean),
            Err(problem) => {
                failures.push(format!("{}: {problem}", keep(&input, failures.len()).display()));
                if failures.len() >= 10 {
                    break;
                }
            }
        }
    }
    std::panic::set_hook(hook);
    println!(
        "fuzz: seed {seed}, {inputs} inputs in {:.1} s, {compiled_clean} compiled clean",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "seed {seed}: {} inputs broke the compiler or engine:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(inputs > 100, "the fuzz ran only {inputs} inputs");
}
