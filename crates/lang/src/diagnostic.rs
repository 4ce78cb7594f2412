//! Diagnostics: a user's mistake in a rule file, with a code, a message, labelled spans, notes and
//! a help line. Rendered with carets for a terminal and as JSON for tools and the HTTP API.

use crate::ast::Span;
use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label as CsLabel, Severity};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term;
use serde::Serialize;

/// Diagnostic codes. Each is documented in `docs/language.md#diagnostic-codes`.
pub mod codes {
    pub const INVALID_UTF8: &str = "E0001";
    pub const SYNTAX: &str = "E0002";
    pub const TOO_DEEP: &str = "E0003";
    pub const BAD_LITERAL: &str = "E0004";
    pub const BAD_TEMPLATE: &str = "E0005";
    pub const REPEATED_CLAUSE: &str = "E0006";
    pub const DUPLICATE_RULE: &str = "E0007";

    pub const UNKNOWN_ENTITY: &str = "E0101";
    pub const UNKNOWN_OPERATION: &str = "E0102";
    pub const UNKNOWN_FIELD: &str = "E0103";
    pub const UNKNOWN_NAME: &str = "E0104";
    pub const DUPLICATE_NAME: &str = "E0105";
    pub const ENTITY_CONFLICT: &str = "E0106";
    pub const UNKNOWN_FUNCTION: &str = "E0107";
    pub const FOREIGN_VARIABLE: &str = "E0108";

    pub const TYPE_MISMATCH: &str = "E0201";
    pub const ARGUMENTS: &str = "E0202";
    pub const AGGREGATE_CONTEXT: &str = "E0203";
    pub const HISTORY_RANGE: &str = "E0204";
    pub const NOT_BOOLEAN: &str = "E0205";
    pub const BAD_REGEX: &str = "E0206";

    pub const NO_PATTERN: &str = "E0301";
    pub const UNBOUNDED_SEQUENCE: &str = "E0303";
    pub const SEQUENCE_SHAPE: &str = "E0304";
    pub const WINDOW: &str = "E0305";
    pub const STATE_NEEDS_WINDOW: &str = "E0306";
    pub const INVARIANT: &str = "E0307";
    pub const CLUSTER: &str = "E0308";
    pub const SEVERITY: &str = "E0309";
    pub const DURATION_RANGE: &str = "E0310";
    pub const MODEL_MIX: &str = "E0311";
    pub const COST: &str = "E0312";
    pub const SCORE: &str = "E0313";
    pub const ROLLUP: &str = "E0314";

    pub const DECLARED_TWICE: &str = "E0401";
    pub const FIELD_DECL: &str = "E0402";
    pub const BINDING: &str = "E0403";
    pub const OPERATION_DECL: &str = "E0404";
    pub const STREAM_IN_USE: &str = "E0405";
}

#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub span: Span,
    pub message: String,
    pub primary: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub code: &'static str,
    pub message: String,
    pub labels: Vec<Label>,
    pub notes: Vec<String>,
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic whose primary label points at `span`.
    pub fn new(code: &'static str, message: impl Into<String>, span: Span, label: impl Into<String>) -> Self {
        Diagnostic {
            code,
            message: message.into(),
            labels: vec![Label { span, message: label.into(), primary: true }],
            notes: Vec::new(),
            help: None,
        }
    }

    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Self {
        self.labels.push(Label { span, message: message.into(), primary: false });
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn primary_span(&self) -> Span {
        self.labels.iter().find(|l| l.primary).map(|l| l.span).unwrap_or_default()
    }
}

/// A source file being checked: its name as the user gave it and its text.
pub struct Source<'a> {
    pub name: &'a str,
    pub text: &'a str,
}

impl Source<'_> {
    /// 1-based line and column (in characters) of a byte offset; offsets inside a character or
    /// past the end are clamped.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    /// Renders diagnostics for a terminal, with the source line and carets under the span.
    pub fn render(&self, diagnostics: &[Diagnostic], color: bool) -> String {
        let file = SimpleFile::new(self.name, self.text);
        let config = term::Config::default();
        let mut out = String::new();
        for d in diagnostics {
            let cs = self.to_codespan(d);
            if color {
                let mut buf = term::termcolor::Buffer::ansi();
                // Rendering into memory cannot fail short of a bug in the span arithmetic, which
                // `to_codespan` rules out by clamping.
                let _ = term::emit_to_write_style(&mut buf, &config, &file, &cs);
                out.push_str(&String::from_utf8_lossy(buf.as_slice()));
            } else {
                let _ = term::emit_to_string(&mut out, &config, &file, &cs);
            }
        }
        out
    }

    fn to_codespan(&self, d: &Diagnostic) -> CsDiagnostic<()> {
        let len = self.text.len();
        let clamp = |s: Span| {
            let mut start = s.start.min(len);
            let mut end = s.end.clamp(start, len);
            while !self.text.is_char_boundary(start) {
                start -= 1;
            }
            while !self.text.is_char_boundary(end) {
                end += 1;
            }
            start..end
        };
        let labels = d
            .labels
            .iter()
            .map(|l| {
                let label =
                    if l.primary { CsLabel::primary((), clamp(l.span)) } else { CsLabel::secondary((), clamp(l.span)) };
                label.with_message(l.message.clone())
            })
            .collect();
        let mut notes = d.notes.clone();
        if let Some(help) = &d.help {
            notes.push(format!("help: {help}"));
        }
        CsDiagnostic::new(Severity::Error)
            .with_code(d.code)
            .with_message(&d.message)
            .with_labels(labels)
            .with_notes(notes)
    }

    /// The machine-readable form: one object per diagnostic.
    pub fn to_json(&self, diagnostics: &[Diagnostic]) -> Vec<JsonDiagnostic> {
        diagnostics
            .iter()
            .map(|d| {
                let span = d.primary_span();
                let (line, column) = self.line_col(span.start);
                let (end_line, end_column) = self.line_col(span.end);
                JsonDiagnostic {
                    file: self.name.to_string(),
                    line,
                    column,
                    end_line,
                    end_column,
                    severity: "error",
                    code: d.code,
                    message: d.message.clone(),
                    labels: d
                        .labels
                        .iter()
                        .map(|l| {
                            let (line, column) = self.line_col(l.span.start);
                            JsonLabel { line, column, message: l.message.clone(), primary: l.primary }
                        })
                        .collect(),
                    notes: d.notes.clone(),
                    help: d.help.clone(),
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct JsonDiagnostic {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub severity: &'static str,
    pub code: &'static str,
    pub message: String,
    pub labels: Vec<JsonLabel>,
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JsonLabel {
    pub line: usize,
    pub column: usize,
    pub message: String,
    pub primary: bool,
}

/// The candidate closest to `name`, if it is close enough to be a plausible typo.
pub fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|(d, c)| *d <= (name.len().max(c.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// "did you mean `x`?" for the nearest candidate, else a list of what is valid.
pub fn suggestion(name: &str, candidates: &[&str]) -> String {
    match nearest(name, candidates.iter().copied()) {
        Some(c) => format!("did you mean `{c}`?"),
        None if candidates.is_empty() => "nothing of that kind is defined here".to_string(),
        None => {
            format!("expected one of: {}", candidates.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", "))
        }
    }
}
