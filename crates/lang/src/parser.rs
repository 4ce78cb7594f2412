//! Text to spanned AST. The only module that sees pest.
//!
//! A file is parsed one rule at a time: after a syntax error the parser skips to the next line
//! that starts with `rule`, so one mistake does not hide the others.

use crate::ast::*;
use crate::diagnostic::{codes, Diagnostic};
use pest::error::{ErrorVariant, InputLocation};
use pest::iterators::Pair;
use pest::Parser as _;
use std::collections::BTreeSet;
use std::sync::Once;

mod errors;
mod expr;

use errors::syntax_error;
use expr::unescape;

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/saql.pest"]
struct SaqlParser;

/// Deepest nesting of brackets and `|x|` accepted. pest descends recursively, so without a limit
/// a file of nested parentheses would exhaust the stack; no sensible rule nests this deep.
pub const MAX_NESTING: usize = 32;
/// Deepest expression tree accepted (a chain `a + b + c` is as deep as it is long).
pub const MAX_EXPR_DEPTH: usize = 200;

/// Parses a whole file, reporting every syntax error it can find.
pub fn parse(src: &str) -> (File, Vec<Diagnostic>) {
    static DETAIL: Once = Once::new();
    DETAIL.call_once(|| pest::set_error_detail(true));

    let mut diags = Vec::new();
    if let Some(d) = check_nesting(src) {
        return (File::default(), vec![d]);
    }
    let mut file = File::default();
    let mut pos = skip_trivia(src, 0);
    while pos < src.len() {
        match SaqlParser::parse(Rule::rule_item, &src[pos..]) {
            Ok(mut pairs) => {
                let item = pairs.next().expect("rule_item always yields itself");
                let def = item.into_inner().next().expect("rule_item holds an item");
                let end = pos + def.as_span().end();
                let mut b = Builder { offset: pos, diags: &mut diags };
                match def.as_rule() {
                    Rule::entity_def => file.entities.push(b.entity(def)),
                    Rule::stream_def => file.streams.push(b.stream(def)),
                    _ => file.rules.push(b.rule(def)),
                }
                pos = skip_trivia(src, end);
            }
            Err(e) => {
                let (d, at) = syntax_error(src, pos, &e);
                diags.push(d);
                match next_rule_start(src, at.max(pos + 1)) {
                    Some(next) => pos = next,
                    None => break,
                }
            }
        }
    }
    (file, diags)
}

/// Parses a duration written as in rules (`5 min`, `500ms`, `1.5 h`) into milliseconds.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let pair = SaqlParser::parse(Rule::duration_only, text.trim())
        .map_err(|_| format!("`{text}` is not a duration; write e.g. `5 s`, `10 min`, `1 h`"))?
        .next()
        .and_then(|p| p.into_inner().next())
        .expect("duration_only holds a duration");
    let mut diags = Vec::new();
    let d = Builder { offset: 0, diags: &mut diags }.duration(pair);
    match diags.first() {
        Some(d) => Err(format!("`{text}`: {}", d.message)),
        None => Ok(d.millis),
    }
}

/// Skips whitespace and comments from `pos`; an unterminated block comment runs to the end.
fn skip_trivia(src: &str, mut pos: usize) -> usize {
    let b = src.as_bytes();
    loop {
        while pos < b.len() && matches!(b[pos], b' ' | b'\t' | b'\r' | b'\n') {
            pos += 1;
        }
        if src[pos..].starts_with('\u{FEFF}') {
            pos += '\u{FEFF}'.len_utf8();
        } else if src[pos..].starts_with("//") {
            pos = src[pos..].find('\n').map_or(src.len(), |i| pos + i);
        } else if src[pos..].starts_with("/*") {
            // An unterminated comment is left for pest to report.
            match src[pos + 2..].find("*/") {
                Some(i) => pos = pos + 2 + i + 2,
                None => return pos,
            }
        } else {
            return pos;
        }
    }
}

/// The start of the next line at or after `from` whose first word is `rule`.
fn next_rule_start(src: &str, from: usize) -> Option<usize> {
    // An error may point inside a character; step to the next whole one.
    let mut from = from.min(src.len());
    while !src.is_char_boundary(from) {
        from += 1;
    }
    let mut line_start = src[..from].rfind('\n').map_or(0, |i| i + 1);
    if line_start < from {
        line_start = src[from..].find('\n').map(|i| from + i + 1)?;
    }
    let mut at = line_start;
    while at < src.len() {
        let line = &src[at..];
        let trimmed = line.trim_start_matches([' ', '\t']);
        let indent = line.len() - trimmed.len();
        let starts =
            |word: &str| trimmed.starts_with(word) && trimmed[word.len()..].starts_with(|c: char| c.is_whitespace());
        if starts("rule") || starts("stream") || starts("entity") {
            return Some(at + indent);
        }
        at = src[at..].find('\n').map(|i| at + i + 1)?;
    }
    None
}

/// Rejects nesting deeper than [`MAX_NESTING`] before pest descends into it.
///
/// `|` both opens and closes a cardinality; it opens where an operand is expected, that is after
/// an operator, an opening bracket or a keyword, and closes after an operand.
fn check_nesting(src: &str) -> Option<Diagnostic> {
    let b = src.as_bytes();
    let mut stack: Vec<u8> = Vec::new();
    // Whether the last token ends an operand (a name, number, string or closing bracket).
    let mut after_operand = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                after_operand = true;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = src[i + 2..].find("*/").map_or(b.len(), |j| i + 2 + j + 2);
                continue;
            }
            b'(' | b'[' | b'{' => {
                stack.push(c);
                after_operand = false;
            }
            b')' | b']' | b'}' => {
                stack.pop();
                after_operand = true;
            }
            b'|' => {
                if after_operand && stack.last() == Some(&b'|') {
                    stack.pop();
                    after_operand = true;
                } else {
                    stack.push(c);
                    after_operand = false;
                }
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                    i += 1;
                }
                let word = &src[start..i];
                after_operand = !matches!(
                    word,
                    "alert"
                        | "where"
                        | "return"
                        | "and"
                        | "or"
                        | "not"
                        | "in"
                        | "like"
                        | "union"
                        | "diff"
                        | "intersect"
                );
                continue;
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => after_operand = false,
        }
        if stack.len() > MAX_NESTING {
            return Some(
                Diagnostic::new(
                    codes::TOO_DEEP,
                    format!("brackets nest deeper than {MAX_NESTING} levels"),
                    Span::new(i, i + 1),
                    "too deep here",
                )
                .with_help("split the expression, or use `in [...]` instead of nested conditions"),
            );
        }
        i += 1;
    }
    None
}

/// Turns a pest error (relative to `base`) into a diagnostic; returns it and the error offset.
/// Builds AST nodes from pairs, shifting spans by the offset of the rule in the file.
struct Builder<'d> {
    offset: usize,
    diags: &'d mut Vec<Diagnostic>,
}

impl Builder<'_> {
    /// A pair's span without the whitespace pest may have consumed after it, so that carets
    /// stop at the last character the user wrote.
    fn span(&self, p: &Pair<Rule>) -> Span {
        let s = p.as_span();
        let len = p.as_str().trim_end().len();
        Span::new(self.offset + s.start(), self.offset + s.start() + len)
    }

    fn ident(&self, p: Pair<Rule>) -> Ident {
        Ident { name: p.as_str().to_string(), span: self.span(&p) }
    }

    fn rule(&mut self, p: Pair<Rule>) -> RuleDecl {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let name = self.ident(inner.next().expect("rule name"));
        let mut r = RuleDecl {
            name,
            span,
            description: None,
            patterns: Vec::new(),
            with: None,
            state: None,
            invariant: None,
            cluster: None,
            score: None,
            alert: None,
            rollup: None,
            labels: Vec::new(),
            annotations: Vec::new(),
            returns: None,
            repeated: Vec::new(),
        };
        for clause in inner {
            let cspan = self.span(&clause);
            match clause.as_rule() {
                Rule::description => {
                    let s = clause.into_inner().next().expect("description string");
                    let text = self.string(s);
                    set_once(&mut r.description, Some((text, cspan)), "description", cspan, &mut r.repeated);
                }
                Rule::pattern => {
                    let pat = self.pattern(clause);
                    r.patterns.push(pat);
                }
                Rule::with_clause => {
                    let w = self.with_clause(clause);
                    set_once(&mut r.with, Some(w), "with", cspan, &mut r.repeated);
                }
                Rule::state_clause => {
                    let s = self.state_clause(clause);
                    set_once(&mut r.state, Some(s), "state", cspan, &mut r.repeated);
                }
                Rule::invariant_clause => {
                    let i = self.invariant_clause(clause);
                    set_once(&mut r.invariant, Some(i), "invariant", cspan, &mut r.repeated);
                }
                Rule::cluster_clause => {
                    let c = self.cluster_clause(clause);
                    set_once(&mut r.cluster, Some(c), "cluster", cspan, &mut r.repeated);
                }
                Rule::score_clause => {
                    let fields = clause
                        .into_inner()
                        .map(|field| {
                            let mut it = field.into_inner();
                            let name = self.ident(it.next().expect("score name"));
                            let value = self.expr(it.next().expect("score value"));
                            StateField { name, value, filter: None }
                        })
                        .collect();
                    set_once(&mut r.score, Some(ScoreClause { span: cspan, fields }), "score", cspan, &mut r.repeated);
                }
                Rule::alert_clause => {
                    let a = self.alert_clause(clause);
                    set_once(&mut r.alert, Some(a), "alert", cspan, &mut r.repeated);
                }
                Rule::rollup_clause => {
                    let rollup = self.rollup_clause(clause);
                    set_once(&mut r.rollup, Some(rollup), "rollup", cspan, &mut r.repeated);
                }
                Rule::labels_clause => {
                    if !r.labels.is_empty() {
                        r.repeated.push(("labels", cspan));
                    }
                    let fields = self.template_fields(clause);
                    r.labels.extend(fields);
                }
                Rule::annotations_clause => {
                    if !r.annotations.is_empty() {
                        r.repeated.push(("annotations", cspan));
                    }
                    let fields = self.template_fields(clause);
                    r.annotations.extend(fields);
                }
                Rule::return_clause => {
                    let items = clause
                        .into_inner()
                        .map(|item| {
                            let mut it = item.into_inner();
                            let value = self.expr(it.next().expect("return value"));
                            let alias = it.next().map(|a| self.ident(a));
                            ReturnItem { value, alias }
                        })
                        .collect();
                    set_once(&mut r.returns, Some(items), "return", cspan, &mut r.repeated);
                }
                other => unreachable!("clause {other:?} is not in the grammar"),
            }
        }
        r
    }

    fn entity(&mut self, p: Pair<Rule>) -> EntityDecl {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let name = self.ident(inner.next().expect("entity name"));
        EntityDecl { name, keys: inner.map(|k| self.ident(k)).collect(), span }
    }

    fn stream(&mut self, p: Pair<Rule>) -> StreamDecl {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let name = self.ident(inner.next().expect("stream name"));
        let mut decl =
            StreamDecl { name, span, fields: Vec::new(), bindings: Vec::new(), operation: None, ops: Vec::new() };
        for item in inner {
            let item_span = self.span(&item);
            match item.as_rule() {
                Rule::fields_decl => {
                    for field in item.into_inner() {
                        let mut parts = field.into_inner().peekable();
                        let name = self.ident(parts.next().expect("field name"));
                        let optional = parts.next_if(|p| p.as_rule() == Rule::optional_mark).is_some();
                        let ty = self.ident(parts.next().expect("field type"));
                        decl.fields.push(FieldDecl { name, ty, optional });
                    }
                }
                Rule::binding_decl => {
                    let mut parts = item.into_inner().peekable();
                    let place =
                        match parts.next_if(|p| p.as_rule() == Rule::binding_role).map(|p| p.as_str().to_string()) {
                            Some(role) if role == "subject" => PlaceDecl::Subject,
                            Some(_) => PlaceDecl::Object,
                            None => PlaceDecl::Both,
                        };
                    let kind = self.ident(parts.next().expect("binding kind"));
                    let attrs = parts
                        .map(|attr| {
                            let mut names = attr.into_inner();
                            let attr = self.ident(names.next().expect("attribute"));
                            let field = names.next().map_or_else(|| attr.clone(), |f| self.ident(f));
                            (attr, field)
                        })
                        .collect();
                    decl.bindings.push(BindingDecl { place, kind, attrs, span: item_span });
                }
                Rule::operation_decl => {
                    let field = self.ident(item.into_inner().next().expect("operation field"));
                    decl.operation = Some(field);
                }
                Rule::op_decl => decl.ops.push(self.op(item, item_span)),
                other => unreachable!("{other:?} in a stream"),
            }
        }
        decl
    }

    fn op(&mut self, p: Pair<Rule>, span: Span) -> OpDecl {
        let mut parts = p.into_inner().peekable();
        let subject = self.ident(parts.next().expect("op subject"));
        let name = self.ident(parts.next().expect("op name"));
        let object = parts.next_if(|p| p.as_rule() == Rule::ident).map(|kind| {
            let optional = parts.next_if(|p| p.as_rule() == Rule::optional_mark).is_some();
            (self.ident(kind), optional)
        });
        let value = parts.next().map(|s| {
            let at = self.span(&s);
            (self.string(s), at)
        });
        OpDecl { subject, name, object, value, span }
    }

    fn pattern(&mut self, p: Pair<Rule>) -> Pattern {
        let span = self.span(&p);
        let mut inner = p.into_inner().peekable();
        let subject_kind = self.ident(inner.next().expect("subject kind"));
        let subject = self.ident(inner.next().expect("subject"));
        let operation = self.ident(inner.next().expect("operation"));
        let object = if inner.peek().map(|p| p.as_rule()) == Some(Rule::entity_kind) {
            let kind = self.ident(inner.next().expect("object kind"));
            let var = self.ident(inner.next().expect("object"));
            Some((kind, var))
        } else {
            None
        };
        let event = self.ident(inner.next().expect("event variable"));
        let mut filter = None;
        let mut window = None;
        for rest in inner {
            match rest.as_rule() {
                Rule::pattern_where => filter = Some(self.expr(rest.into_inner().next().expect("where expr"))),
                Rule::window => window = Some(self.window(rest)),
                other => unreachable!("{other:?} in pattern"),
            }
        }
        Pattern { span, subject_kind, subject, operation, object, event, filter, window }
    }

    fn window(&mut self, p: Pair<Rule>) -> WindowSpec {
        let span = self.span(&p);
        let mut durations = p.into_inner().map(|d| self.duration(d));
        let size = durations.next().expect("window size");
        let slide = durations.next();
        WindowSpec { span, size, slide }
    }

    fn with_clause(&mut self, p: Pair<Rule>) -> WithClause {
        let span = self.span(&p);
        let mut w = WithClause { span, steps: Vec::new(), within: None, group_by: Vec::new(), conditions: Vec::new() };
        for part in p.into_inner() {
            match part.as_rule() {
                Rule::sequence => {
                    for step in part.into_inner() {
                        let s = self.seq_step(step);
                        w.steps.push(s);
                    }
                }
                Rule::within => w.within = Some(self.duration(part.into_inner().next().expect("within duration"))),
                Rule::seq_group => {
                    let list = part.into_inner().next().expect("group list");
                    w.group_by = self.expr_list(list);
                }
                Rule::expr => {
                    let e = self.expr(part);
                    w.conditions.push(e);
                }
                other => unreachable!("{other:?} in with"),
            }
        }
        w
    }

    fn seq_step(&mut self, p: Pair<Rule>) -> SeqStep {
        let span = self.span(&p);
        let step = p.into_inner().next().expect("step body");
        let rule = step.as_rule();
        let mut inner = step.into_inner();
        let event = self.ident(inner.next().expect("step event"));
        let kind = match rule {
            Rule::plain_step => StepKind::Once,
            Rule::absent_step => {
                let bound = self.expr(inner.next().expect("absence bound"));
                match bound.kind {
                    // A plain duration, as before bounds could be expressions.
                    ExprKind::Duration(millis) => StepKind::Absent(Duration { millis, span: bound.span }),
                    _ => StepKind::AbsentFor(bound),
                }
            }
            Rule::count_step => StepKind::Count { min: self.integer(inner.next().expect("count")) },
            other => unreachable!("{other:?} as step"),
        };
        SeqStep { span, event, kind }
    }

    fn state_clause(&mut self, p: Pair<Rule>) -> StateClause {
        let span = self.span(&p);
        let mut s = StateClause {
            span,
            name: Ident { name: String::new(), span },
            history: None,
            fields: Vec::new(),
            group_by: Vec::new(),
        };
        for part in p.into_inner() {
            match part.as_rule() {
                Rule::history => {
                    let hspan = self.span(&part);
                    let n = self.integer(part.into_inner().next().expect("history size"));
                    s.history = Some((n, hspan));
                }
                Rule::ident => s.name = self.ident(part),
                Rule::state_field => {
                    let mut it = part.into_inner();
                    let name = self.ident(it.next().expect("field name"));
                    let value = self.expr(it.next().expect("field value"));
                    let filter = it.next().map(|f| self.expr(f.into_inner().next().expect("filter condition")));
                    s.fields.push(StateField { name, value, filter });
                }
                Rule::expr_list => s.group_by = self.expr_list(part),
                other => unreachable!("{other:?} in state"),
            }
        }
        s
    }

    fn invariant_clause(&mut self, p: Pair<Rule>) -> InvariantClause {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let wpair = inner.next().expect("training windows");
        let wspan = self.span(&wpair);
        let windows = (self.integer(wpair), wspan);
        let mode = self.ident(inner.next().expect("mode"));
        let statements = inner
            .map(|st| {
                let sspan = self.span(&st);
                let mut it = st.into_inner();
                let target = self.ident(it.next().expect("target"));
                let is_init = it.next().expect("assignment").as_str() == ":=";
                let value = self.expr(it.next().expect("value"));
                InvariantStmt { span: sspan, target, is_init, value }
            })
            .collect();
        InvariantClause { span, windows, mode, statements }
    }

    fn cluster_clause(&mut self, p: Pair<Rule>) -> ClusterClause {
        let span = self.span(&p);
        let args = p
            .into_inner()
            .map(|arg| {
                let mut it = arg.into_inner();
                let name = self.ident(it.next().expect("argument name"));
                let v = it.next().expect("argument value");
                let value = if v.as_rule() == Rule::points_arg {
                    let vspan = self.span(&v);
                    let mut lists = v.into_inner();
                    let dims = self.expr_list(lists.next().expect("points"));
                    let per = lists.next().map(|l| self.expr_list(l)).unwrap_or_default();
                    ClusterValue::Points { span: vspan, dims, per }
                } else {
                    ClusterValue::Expr(self.expr(v))
                };
                ClusterArg { name, value }
            })
            .collect();
        ClusterClause { span, args }
    }

    fn alert_clause(&mut self, p: Pair<Rule>) -> AlertClause {
        let span = self.span(&p);
        let mut inner = p.into_inner().peekable();
        let condition = match inner.peek().map(|p| p.as_rule()) {
            Some(Rule::expr) => Some(self.expr(inner.next().expect("peeked"))),
            _ => None,
        };
        let mut a =
            AlertClause { span, condition, severity: None, for_: None, keep_firing_for: None, refractory: None };
        for opt in inner {
            let ospan = self.span(&opt);
            let rule = opt.as_rule();
            let value = opt.into_inner().next().expect("option value");
            let (name, repeated) = match rule {
                Rule::severity_opt => ("severity", a.severity.replace(self.ident(value)).is_some()),
                Rule::for_opt => ("for", a.for_.replace(self.duration(value)).is_some()),
                Rule::keep_firing_opt => ("keep_firing_for", a.keep_firing_for.replace(self.duration(value)).is_some()),
                Rule::refractory_opt => ("refractory", a.refractory.replace(self.duration(value)).is_some()),
                other => unreachable!("{other:?} as alert option"),
            };
            if repeated {
                self.diags.push(Diagnostic::new(
                    codes::REPEATED_CLAUSE,
                    format!("`{name}` is given twice for one alert"),
                    ospan,
                    "second one here",
                ));
            }
        }
        a
    }

    fn rollup_clause(&mut self, p: Pair<Rule>) -> RollupClause {
        let span = self.span(&p);
        let mut it = p.into_inner();
        let by = self.expr(it.next().expect("rollup field"));
        let severity = it.next().map(|s| self.ident(s.into_inner().next().expect("severity name")));
        RollupClause { span, by, severity }
    }

    fn template_fields(&mut self, p: Pair<Rule>) -> Vec<TemplateField> {
        p.into_inner()
            .map(|f| {
                let mut it = f.into_inner();
                let name = self.ident(it.next().expect("field name"));
                let template = self.template(it.next().expect("template string"));
                TemplateField { name, template }
            })
            .collect()
    }

    /// Splits a string into text and `{expr}` holes; each hole is parsed as an expression.
    fn template(&mut self, p: Pair<Rule>) -> Template {
        let span = self.span(&p);
        let inner = p.into_inner().next().expect("string body");
        let raw = inner.as_str();
        let base = self.offset + inner.as_span().start();
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut i = 0;
        let bytes = raw.as_bytes();
        while i < raw.len() {
            match bytes[i] {
                b'{' if bytes.get(i + 1) == Some(&b'{') => {
                    text.push('{');
                    i += 2;
                }
                b'}' if bytes.get(i + 1) == Some(&b'}') => {
                    text.push('}');
                    i += 2;
                }
                b'{' => {
                    let Some(close) = raw[i..].find('}') else {
                        self.diags.push(
                            Diagnostic::new(
                                codes::BAD_TEMPLATE,
                                "unclosed `{` in template",
                                Span::new(base + i, base + i + 1),
                                "opened here",
                            )
                            .with_help("close the hole with `}`, or write `{{` for a literal brace"),
                        );
                        break;
                    };
                    if !text.is_empty() {
                        parts.push(TemplatePart::Text(unescape(&std::mem::take(&mut text))));
                    }
                    let hole_base = base + i + 1;
                    let (hole, format) = self.hole_format(&raw[i + 1..i + close], hole_base);
                    match SaqlParser::parse(Rule::expr_only, hole) {
                        Ok(mut pairs) => {
                            let e = pairs.next().and_then(|p| p.into_inner().next()).expect("expr_only holds expr");
                            let mut b = Builder { offset: hole_base, diags: self.diags };
                            parts.push(TemplatePart::Hole(b.expr(e), format));
                        }
                        Err(_) => self.diags.push(
                            Diagnostic::new(
                                codes::BAD_TEMPLATE,
                                "template hole is not an expression",
                                Span::new(hole_base, hole_base + hole.len()),
                                "not an expression",
                            )
                            .with_help("a hole holds a value such as `{m.machine_id}`; write `{{` for a literal brace"),
                        ),
                    }
                    i += close + 1;
                }
                b'}' => {
                    self.diags.push(
                        Diagnostic::new(
                            codes::BAD_TEMPLATE,
                            "unmatched `}` in template",
                            Span::new(base + i, base + i + 1),
                            "no `{` before it",
                        )
                        .with_help("write `}}` for a literal brace"),
                    );
                    i += 1;
                }
                b'\\' => {
                    let end = (i + 1 + raw[i + 1..].chars().next().map_or(0, char::len_utf8)).min(raw.len());
                    text.push_str(&raw[i..end]);
                    i = end;
                }
                _ => {
                    let c = raw[i..].chars().next().expect("in bounds");
                    text.push(c);
                    i += c.len_utf8();
                }
            }
        }
        if !text.is_empty() {
            parts.push(TemplatePart::Text(unescape(&text)));
        }
        self.check_escapes(raw, base);
        Template { span, parts }
    }

    /// A hole's expression and its `:format`, if it has one (the last `:` outside quotes).
    fn hole_format<'h>(&mut self, hole: &'h str, base: usize) -> (&'h str, HoleFormat) {
        let mut quoted = false;
        let mut colon = None;
        for (i, c) in hole.char_indices() {
            match c {
                '"' => quoted = !quoted,
                ':' if !quoted => colon = Some(i),
                _ => {}
            }
        }
        let Some(at) = colon else { return (hole, HoleFormat::Default) };
        match HoleFormat::parse(&hole[at + 1..]) {
            Some(format) => (&hole[..at], format),
            None => {
                self.diags.push(
                    Diagnostic::new(
                        codes::BAD_TEMPLATE,
                        format!("unknown format `{}` in template hole", hole[at + 1..].trim()),
                        Span::new(base + at + 1, base + hole.len()),
                        "not a format",
                    )
                    .with_help("use `.2` (decimals), `si`, `bytes`, `percent`, `duration` or `raw`"),
                );
                (&hole[..at], HoleFormat::Default)
            }
        }
    }
}

fn set_once<T>(
    slot: &mut Option<T>,
    value: Option<T>,
    name: &'static str,
    span: Span,
    repeated: &mut Vec<(&'static str, Span)>,
) {
    if slot.is_some() {
        repeated.push((name, span));
    } else {
        *slot = value;
    }
}

#[cfg(test)]
mod tests;
