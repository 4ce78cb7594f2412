//! The SAQL language of Vigil: rule text to checked plans, with nothing of the engine or the
//! service. `vigil check`, the parser's tests and anything else that only reads rules build this
//! crate alone.
//!
//! ```text
//! text --parser--> ast::File --check--> plan::RulePlan (one per rule) --> vigil-engine
//!                                 \--> diagnostic::Diagnostic (user mistakes)
//! ```
//!
//! - [`parser::parse`]: source text to a spanned [`ast::File`]; syntax errors as diagnostics.
//! - [`schema::Catalog::declare`]: the files' `stream` and `entity` declarations checked and
//!   registered over Vigil's own ([`schema`]).
//! - [`check::check`]: names resolved against the catalogue, types and bounds checked, one
//!   [`plan::RulePlan`] per rule: the one type that crosses into the engine.
//! - [`compile`] runs both over one file; [`compile_all`] over many, which also catches a rule
//!   name defined in two files; [`ruleset`] loads files and folders and changes them.
//!
//! User mistakes are [`diagnostic::Diagnostic`]s: code, message, labelled spans, notes, help.

pub mod ast;
pub mod check;
pub mod diagnostic;
pub mod parser;
pub mod plan;
pub mod ruleset;
pub mod schema;

use diagnostic::{codes, Diagnostic, Source};
use plan::RulePlan;
use schema::Catalog;
use std::collections::HashMap;

/// One rule file after parsing and checking.
pub struct Compiled {
    /// The file name as given, used in rendered diagnostics.
    pub name: String,
    /// The text diagnostics point into; invalid UTF-8 is replaced so it can still be shown.
    pub text: String,
    pub plans: Vec<RulePlan>,
    pub diagnostics: Vec<Diagnostic>,
    /// Every rule the file declares, valid or not, with the span of its name.
    pub rule_names: Vec<(String, ast::Span)>,
    /// Every rule the file declares with the span of its whole declaration.
    pub rule_spans: Vec<(String, ast::Span)>,
    /// The streams the file declares, by name.
    pub streams: Vec<String>,
    /// The streams and kinds of the files compiled with this one.
    pub catalog: Catalog,
}

impl Compiled {
    pub fn source(&self) -> Source<'_> {
        Source { name: &self.name, text: &self.text }
    }

    pub fn is_ok(&self) -> bool {
        self.diagnostics.is_empty()
    }
}

/// Stack for parsing and checking. pest descends recursively, one deep frame chain per bracket
/// level; [`parser::MAX_NESTING`] bounds the levels and this bounds the frames, whatever thread
/// (a test harness's, an async runtime's) the caller happens to be on.
const COMPILE_STACK: usize = 64 << 20;

/// Parses and checks one file given as raw bytes, with its own declarations over the prelude's.
pub fn compile(name: &str, bytes: &[u8]) -> Compiled {
    let mut out = compile_all(&[(name.to_string(), bytes.to_vec())]);
    out.pop().expect("one file in, one out")
}

/// A file parsed, or the diagnostic that it is not UTF-8.
struct Parsed {
    name: String,
    text: String,
    file: ast::File,
    diagnostics: Vec<Diagnostic>,
}

fn parse_file(name: &str, bytes: &[u8]) -> Parsed {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            let (file, diagnostics) = parser::parse(text);
            Parsed { name: name.to_string(), text: text.to_string(), file, diagnostics }
        }
        Err(e) => {
            let at = e.valid_up_to();
            let len = e.error_len().unwrap_or(1);
            let text = String::from_utf8_lossy(bytes).into_owned();
            // In the lossy text the bad bytes became U+FFFD, three bytes long.
            let d = Diagnostic::new(
                codes::INVALID_UTF8,
                "rule files must be UTF-8",
                ast::Span::new(at, at + '\u{FFFD}'.len_utf8()),
                format!(
                    "{len} byte{} that {} not UTF-8",
                    if len == 1 { "" } else { "s" },
                    if len == 1 { "is" } else { "are" }
                ),
            )
            .with_help("save the file as UTF-8");
            Parsed { name: name.to_string(), text, file: ast::File::default(), diagnostics: vec![d] }
        }
    }
}

/// Parses every file, declares their streams and kinds together, then checks each file's rules
/// against that catalogue.
fn compile_here(files: &[(String, Vec<u8>)], base: &Catalog) -> Vec<Compiled> {
    let mut parsed: Vec<Parsed> = files.iter().map(|(name, bytes)| parse_file(name, bytes)).collect();
    let asts: Vec<&ast::File> = parsed.iter().map(|p| &p.file).collect();
    let (catalog, problems) = base.declare_over(&asts);
    for (i, d) in problems {
        parsed[i].diagnostics.push(d);
    }
    parsed
        .into_iter()
        .map(|p| {
            let Parsed { name, text, file, mut diagnostics } = p;
            let (plans, mut checked) = check::check(&file, &catalog);
            diagnostics.append(&mut checked);
            diagnostics.sort_by_key(|d| d.primary_span().start);
            let rule_names = file.rules.iter().map(|r| (r.name.name.clone(), r.name.span)).collect();
            let rule_spans = file.rules.iter().map(|r| (r.name.name.clone(), r.span)).collect();
            let streams = file.streams.iter().map(|s| s.name.name.clone()).collect();
            Compiled { name, text, plans, diagnostics, rule_names, rule_spans, streams, catalog: catalog.clone() }
        })
        .collect()
}

/// Compiles one file as if it were among the files `base` was declared by (a running rule set's
/// catalogue): its rules may read their streams, and what it declares replaces theirs.
pub fn compile_over(name: &str, bytes: &[u8], base: &Catalog) -> Compiled {
    let mut out = compile_on_stack(&[(name.to_string(), bytes.to_vec())], base);
    out.pop().expect("one file in, one out")
}

/// [`compile_here`] on a thread with a stack of [`COMPILE_STACK`].
fn compile_on_stack(files: &[(String, Vec<u8>)], base: &Catalog) -> Vec<Compiled> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("vigil-compile".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(scope, || compile_here(files, base))
            .map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .unwrap_or_else(|_| compile_here(files, base))
    })
}

/// Compiles several files that are loaded together, and reports a rule name defined in more
/// than one of them (rule names identify alerts, so they must be unique across a rule set).
pub fn compile_all(files: &[(String, Vec<u8>)]) -> Vec<Compiled> {
    let mut out = compile_on_stack(files, Catalog::prelude());
    let mut first: HashMap<String, String> = HashMap::new();
    for c in &mut out {
        let mut clashes = Vec::new();
        for (rule, span) in &c.rule_names {
            match first.get(rule) {
                Some(other) if *other != c.name => clashes.push((rule.clone(), *span, other.clone())),
                Some(_) => {}
                None => {
                    first.insert(rule.clone(), c.name.clone());
                }
            }
        }
        for (rule, span, other) in clashes {
            c.plans.retain(|p| p.name != rule);
            c.diagnostics.push(
                Diagnostic::new(
                    codes::DUPLICATE_RULE,
                    format!("rule `{rule}` is also defined in {other}"),
                    span,
                    "defined again here",
                )
                .with_note("rule names identify alerts, so they must be unique across the rule set"),
            );
        }
    }
    out
}
