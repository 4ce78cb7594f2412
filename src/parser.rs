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
        return (File { rules: Vec::new() }, vec![d]);
    }
    let mut rules = Vec::new();
    let mut pos = skip_trivia(src, 0);
    while pos < src.len() {
        match SaqlParser::parse(Rule::rule_item, &src[pos..]) {
            Ok(mut pairs) => {
                let item = pairs.next().expect("rule_item always yields itself");
                let def = item.into_inner().next().expect("rule_item holds rule_def");
                let end = pos + def.as_span().end();
                let mut b = Builder { offset: pos, diags: &mut diags };
                rules.push(b.rule(def));
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
    (File { rules }, diags)
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
        if trimmed.starts_with("rule") && trimmed[4..].starts_with(|c: char| c.is_whitespace()) {
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
fn syntax_error(src: &str, base: usize, e: &pest::error::Error<Rule>) -> (Diagnostic, usize) {
    let at = base
        + match e.location {
            InputLocation::Pos(p) => p,
            InputLocation::Span((s, _)) => s,
        };
    let mut expected: BTreeSet<String> = BTreeSet::new();
    if let ErrorVariant::ParsingError { positives, .. } = &e.variant {
        for r in positives {
            if let Some(words) = describe_rule(*r) {
                expected.insert(words.to_string());
            }
        }
    }
    if let Some(attempts) = e.parse_attempts() {
        // The token type is not exported by pest; its text is all that is needed.
        for token in attempts.expected_tokens() {
            if let Some(words) = describe_literal(&token.to_string()) {
                expected.insert(words);
            }
        }
    }
    if src[at..].starts_with("/*") {
        let d = Diagnostic::new(
            codes::SYNTAX,
            "unclosed block comment",
            Span::new(at, at + 2),
            "opened here, never closed",
        )
        .with_help("close it with `*/`");
        return (d, at);
    }
    // Alert options are listed one by one as keywords and once as a group; keep the group.
    if expected.contains(ALERT_OPTIONS) {
        for kw in ["`for`", "`severity`", "`keep_firing_for`"] {
            expected.remove(kw);
        }
    }
    let found = found_at(src, at);
    let mut list: Vec<String> = expected.into_iter().collect();
    // Clause and operator are the longest lists; say them last so the specific ones lead.
    list.sort_by_key(|s| (s.starts_with("a clause") || s.starts_with("an operator"), s.clone()));
    let label = match list.len() {
        0 => "unexpected here".to_string(),
        1 => format!("expected {}", list[0]),
        _ => {
            let last = list.pop().unwrap_or_default();
            format!("expected {} or {}", list.join(", "), last)
        }
    };
    let end = (at + found.1).min(src.len());
    let mut d = Diagnostic::new(codes::SYNTAX, format!("unexpected {}", found.0), Span::new(at, end), label);
    if found.1 == 0 {
        d = d.with_secondary(Span::new(base, base + 4), "this rule is never closed");
    }
    let word = &src[at..end];
    if let Some(kw) = crate::diagnostic::nearest(word, CLAUSE_KEYWORDS.iter().copied()).filter(|kw| *kw != word) {
        d = d.with_help(format!("did you mean `{kw}`?"));
    }
    (d, at)
}

const ALERT_OPTIONS: &str = "an alert option (severity, for, keep_firing_for)";
const CLAUSE_KEYWORDS: &[&str] = &[
    "rule",
    "description",
    "with",
    "within",
    "state",
    "invariant",
    "cluster",
    "alert",
    "labels",
    "annotations",
    "return",
    "where",
    "severity",
    "keep_firing_for",
];

/// How to name what stands at `at`, and its length in bytes.
fn found_at(src: &str, at: usize) -> (String, usize) {
    let rest = &src[at.min(src.len())..];
    let Some(c) = rest.chars().next() else {
        return ("end of file".to_string(), 0);
    };
    if c.is_alphanumeric() || c == '_' {
        let word: String =
            rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.').take(40).collect();
        let len = word.len();
        (format!("`{word}`"), len)
    } else if c == '"' {
        ("string".to_string(), 1)
    } else {
        (format!("`{c}`"), c.len_utf8())
    }
}

/// Grammar rules in words a user knows; `None` for rules that are not worth naming.
fn describe_rule(r: Rule) -> Option<&'static str> {
    Some(match r {
        Rule::rule_def => "`rule`",
        Rule::ident | Rule::field_name => "a name",
        Rule::expr
        | Rule::or_expr
        | Rule::and_expr
        | Rule::not_expr
        | Rule::cmp_expr
        | Rule::set_expr
        | Rule::add_expr
        | Rule::mul_expr
        | Rule::unary
        | Rule::postfix
        | Rule::call
        | Rule::list
        | Rule::cardinality
        | Rule::string
        | Rule::number
        | Rule::boolean
        | Rule::empty_set
        | Rule::cluster_ref
        | Rule::expr_list
        | Rule::per_list
        | Rule::return_item
        | Rule::call_arg => "an expression",
        Rule::duration => "a duration such as `5 min`",
        Rule::time_unit => "a time unit (ms, s, min, h, d, w)",
        Rule::integer | Rule::history => "a whole number",
        Rule::entity_kind | Rule::pattern => "a clause",
        Rule::description
        | Rule::with_clause
        | Rule::state_clause
        | Rule::invariant_clause
        | Rule::cluster_clause
        | Rule::alert_clause
        | Rule::labels_clause
        | Rule::annotations_clause
        | Rule::return_clause => "a clause",
        Rule::operation => "an operation such as `fail` or `use`",
        Rule::window => "a window `#time(...)`",
        Rule::pattern_where => "`where`",
        Rule::seq_step | Rule::plain_step | Rule::count_step | Rule::absent_step | Rule::sequence => "an event name",
        Rule::within => "`within`",
        Rule::state_field => "a state field `name := aggregate(...)`",
        Rule::inv_stmt => "a statement `name := value` or `name = value`",
        Rule::inv_mode => "`offline` or `online`",
        Rule::cluster_arg => "a cluster argument `name = value`",
        Rule::template_field => "a field `name = \"text\"`",
        Rule::severity_opt | Rule::for_opt | Rule::keep_firing_opt => ALERT_OPTIONS,
        Rule::or_op
        | Rule::and_op
        | Rule::cmp_op
        | Rule::set_op
        | Rule::add_op
        | Rule::mul_op
        | Rule::member
        | Rule::index
        | Rule::in_op
        | Rule::not_in
        | Rule::like_op => "an operator",
        Rule::EOI => "end of file",
        _ => return None,
    })
}

/// Literal tokens in words: keywords and punctuation quoted, whitespace and operators folded.
fn describe_literal(token: &str) -> Option<String> {
    const OPERATORS: &[&str] = &[
        "+",
        "-",
        "*",
        "/",
        "%",
        "==",
        "!=",
        "<",
        "<=",
        ">",
        ">=",
        "=~",
        ".",
        "[",
        "or",
        "and",
        "in",
        "not",
        "like",
        "union",
        "diff",
        "intersect",
    ];
    const CLAUSES: &[&str] = &[
        "description",
        "with",
        "state",
        "invariant",
        "cluster",
        "alert",
        "labels",
        "annotations",
        "return",
        "task",
        "machine",
        "host",
        "metric",
    ];
    let is_range = token.chars().count() == 4 && token.chars().nth(1) == Some('.') && token.chars().nth(2) == Some('.');
    // Whitespace, comments, character ranges, pest's placeholder and the exponent of a number
    // are never what a user forgot to type.
    if token.trim().is_empty()
        || matches!(token, "//" | "/*" | "\u{FEFF}" | "BUILTIN_RULE" | "E" | "_" | "\\")
        || is_range
    {
        None
    } else if OPERATORS.contains(&token) {
        Some("an operator".to_string())
    } else if CLAUSES.contains(&token) {
        Some("a clause".to_string())
    } else if token == "#time" {
        Some("a window `#time(...)`".to_string())
    } else {
        Some(format!("`{token}`"))
    }
}

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
            alert: None,
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
                Rule::alert_clause => {
                    let a = self.alert_clause(clause);
                    set_once(&mut r.alert, Some(a), "alert", cspan, &mut r.repeated);
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
            Rule::absent_step => StepKind::Absent(self.duration(inner.next().expect("absence duration"))),
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
                    s.fields.push(StateField { name, value });
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
        let mut a = AlertClause { span, condition, severity: None, for_: None, keep_firing_for: None };
        for opt in inner {
            let ospan = self.span(&opt);
            let rule = opt.as_rule();
            let value = opt.into_inner().next().expect("option value");
            let (name, repeated) = match rule {
                Rule::severity_opt => ("severity", a.severity.replace(self.ident(value)).is_some()),
                Rule::for_opt => ("for", a.for_.replace(self.duration(value)).is_some()),
                Rule::keep_firing_opt => ("keep_firing_for", a.keep_firing_for.replace(self.duration(value)).is_some()),
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
                    let hole = &raw[i + 1..i + close];
                    let hole_base = base + i + 1;
                    match SaqlParser::parse(Rule::expr_only, hole) {
                        Ok(mut pairs) => {
                            let e = pairs.next().and_then(|p| p.into_inner().next()).expect("expr_only holds expr");
                            let mut b = Builder { offset: hole_base, diags: self.diags };
                            parts.push(TemplatePart::Hole(b.expr(e)));
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

    fn string(&mut self, p: Pair<Rule>) -> String {
        let inner = p.into_inner().next().expect("string body");
        let base = self.offset + inner.as_span().start();
        self.check_escapes(inner.as_str(), base);
        unescape(inner.as_str())
    }

    fn check_escapes(&mut self, raw: &str, base: usize) {
        let mut chars = raw.char_indices();
        while let Some((i, c)) = chars.next() {
            if c == '\\' {
                if let Some((j, e)) = chars.next() {
                    if !matches!(e, 'n' | 't' | 'r' | '\\' | '"') {
                        self.diags.push(
                            Diagnostic::new(
                                codes::BAD_LITERAL,
                                format!("unknown escape `\\{e}` in string"),
                                Span::new(base + i, base + j + e.len_utf8()),
                                "not an escape",
                            )
                            .with_help(
                                "the escapes are \\n, \\t, \\r, \\\\ and \\\"; a regex backslash is written `\\\\`",
                            ),
                        );
                    }
                }
            }
        }
    }

    fn integer(&mut self, p: Pair<Rule>) -> u64 {
        let span = self.span(&p);
        p.as_str().parse().unwrap_or_else(|_| {
            self.diags.push(Diagnostic::new(
                codes::BAD_LITERAL,
                "number is too large",
                span,
                "does not fit in 64 bits",
            ));
            0
        })
    }

    fn duration(&mut self, p: Pair<Rule>) -> Duration {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let value: f64 = inner.next().expect("duration number").as_str().parse().unwrap_or(f64::INFINITY);
        let unit = inner.next().expect("duration unit").as_str();
        let per_unit: f64 = match unit {
            "ms" | "millisecond" | "milliseconds" => 1.0,
            "s" | "sec" | "secs" | "second" | "seconds" => 1e3,
            "min" | "mins" | "minute" | "minutes" => 60e3,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600e3,
            "d" | "day" | "days" => 86400e3,
            _ => 7.0 * 86400e3,
        };
        let millis = value * per_unit;
        // Ten years is far beyond any window or bound that makes sense for a stream.
        if !millis.is_finite() || millis > 10.0 * 365.0 * 86400e3 {
            self.diags.push(
                Diagnostic::new(codes::DURATION_RANGE, "duration is too long", span, "longer than ten years")
                    .with_help("windows and time bounds are meant for minutes to days"),
            );
            return Duration { millis: 0, span };
        }
        Duration { millis: millis.round() as u64, span }
    }

    fn expr_list(&mut self, p: Pair<Rule>) -> Vec<Expr> {
        p.into_inner().map(|e| self.expr(e)).collect()
    }

    fn expr(&mut self, p: Pair<Rule>) -> Expr {
        let e = self.expr_inner(p);
        if depth(&e) > MAX_EXPR_DEPTH {
            self.diags.push(
                Diagnostic::new(
                    codes::TOO_DEEP,
                    format!("expression is nested deeper than {MAX_EXPR_DEPTH} levels"),
                    e.span,
                    "too deep",
                )
                .with_help("a long chain of `or` comparisons reads better as `x in [a, b, c]`"),
            );
            return Expr { span: e.span, kind: ExprKind::Bool(false) };
        }
        e
    }

    /// Builds an expression; operator chains fold in a loop so that length costs no stack.
    fn expr_inner(&mut self, p: Pair<Rule>) -> Expr {
        let span = self.span(&p);
        match p.as_rule() {
            Rule::expr => self.expr_inner(p.into_inner().next().expect("expr body")),
            Rule::or_expr | Rule::and_expr | Rule::set_expr | Rule::add_expr | Rule::mul_expr | Rule::cmp_expr => {
                let mut inner = p.into_inner();
                let mut acc = self.expr_inner(inner.next().expect("first operand"));
                while let Some(op) = inner.next() {
                    let rhs = self.expr_inner(inner.next().expect("operand after operator"));
                    let op = binop(op.as_str());
                    let span = acc.span.to(rhs.span);
                    acc = Expr { span, kind: ExprKind::Binary(op, Box::new(acc), Box::new(rhs)) };
                }
                acc
            }
            Rule::not_expr | Rule::unary => {
                let mut ops = Vec::new();
                let mut operand = None;
                for part in p.into_inner() {
                    match part.as_rule() {
                        Rule::not_op => ops.push((UnaryOp::Not, self.span(&part))),
                        Rule::neg_op => ops.push((UnaryOp::Neg, self.span(&part))),
                        _ => operand = Some(self.expr_inner(part)),
                    }
                }
                let mut acc = operand.expect("unary operand");
                for (op, ospan) in ops.into_iter().rev() {
                    let span = ospan.to(acc.span);
                    acc = Expr { span, kind: ExprKind::Unary(op, Box::new(acc)) };
                }
                acc
            }
            Rule::postfix => {
                let mut inner = p.into_inner();
                let mut acc = self.expr_inner(inner.next().expect("postfix base"));
                for suffix in inner {
                    let sspan = self.span(&suffix);
                    let span = acc.span.to(sspan);
                    let kind = match suffix.as_rule() {
                        Rule::member => {
                            let field = self.ident(suffix.into_inner().next().expect("member name"));
                            ExprKind::Member(Box::new(acc), field)
                        }
                        Rule::index => {
                            let idx = suffix.into_inner().next().expect("index body");
                            if idx.as_rule() == Rule::range {
                                let mut r = idx.into_inner();
                                let lo = self.integer(r.next().expect("range start"));
                                let hi = self.integer(r.next().expect("range end"));
                                ExprKind::Range(Box::new(acc), lo, hi)
                            } else {
                                ExprKind::Index(Box::new(acc), Box::new(self.expr_inner(idx)))
                            }
                        }
                        other => unreachable!("{other:?} as postfix"),
                    };
                    acc = Expr { span, kind };
                }
                acc
            }
            Rule::cardinality => {
                let inner = self.expr_inner(p.into_inner().next().expect("cardinality body"));
                Expr { span, kind: ExprKind::Cardinality(Box::new(inner)) }
            }
            Rule::list => {
                let items = p.into_inner().map(|e| self.expr_inner(e)).collect();
                Expr { span, kind: ExprKind::List(items) }
            }
            Rule::call => {
                let mut inner = p.into_inner();
                let name = self.ident(inner.next().expect("function name"));
                let args = inner
                    .map(|arg| {
                        let mut it = arg.into_inner().peekable();
                        let name = if it.peek().map(|p| p.as_rule()) == Some(Rule::ident) {
                            Some(self.ident(it.next().expect("peeked")))
                        } else {
                            None
                        };
                        let value = self.expr_inner(it.next().expect("argument value"));
                        CallArg { name, value }
                    })
                    .collect();
                Expr { span, kind: ExprKind::Call(name, args) }
            }
            Rule::duration => {
                let d = self.duration(p);
                Expr { span, kind: ExprKind::Duration(d.millis) }
            }
            Rule::number => {
                let n: f64 = p.as_str().parse().unwrap_or(f64::INFINITY);
                if !n.is_finite() {
                    self.diags.push(Diagnostic::new(
                        codes::BAD_LITERAL,
                        "number is too large",
                        span,
                        "not a finite number",
                    ));
                }
                Expr { span, kind: ExprKind::Number(if n.is_finite() { n } else { 0.0 }) }
            }
            Rule::string => {
                let s = self.string(p);
                Expr { span, kind: ExprKind::Str(s) }
            }
            Rule::boolean => Expr { span, kind: ExprKind::Bool(p.as_str() == "true") },
            Rule::empty_set => Expr { span, kind: ExprKind::EmptySet },
            Rule::cluster_ref => Expr { span, kind: ExprKind::ClusterRef },
            Rule::ident => Expr { span, kind: ExprKind::Name(p.as_str().to_string()) },
            other => unreachable!("{other:?} as expression"),
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

fn binop(s: &str) -> BinOp {
    match s.split_whitespace().collect::<Vec<_>>().join(" ").as_str() {
        "or" => BinOp::Or,
        "and" => BinOp::And,
        "==" => BinOp::Eq,
        "!=" => BinOp::Ne,
        "<" => BinOp::Lt,
        "<=" => BinOp::Le,
        ">" => BinOp::Gt,
        ">=" => BinOp::Ge,
        "=~" => BinOp::Match,
        "like" => BinOp::Like,
        "in" => BinOp::In,
        "not in" => BinOp::NotIn,
        "union" => BinOp::Union,
        "diff" => BinOp::Diff,
        "intersect" => BinOp::Intersect,
        "+" => BinOp::Add,
        "-" => BinOp::Sub,
        "*" => BinOp::Mul,
        "/" => BinOp::Div,
        "%" => BinOp::Rem,
        other => unreachable!("operator {other:?} is not in the grammar"),
    }
}

/// Depth of an expression tree, measured without recursion so that it is safe on any input.
fn depth(e: &Expr) -> usize {
    let mut max = 0;
    let mut stack = vec![(e, 1usize)];
    while let Some((e, d)) = stack.pop() {
        max = max.max(d);
        match &e.kind {
            ExprKind::Member(b, _) | ExprKind::Range(b, _, _) | ExprKind::Unary(_, b) | ExprKind::Cardinality(b) => {
                stack.push((b, d + 1))
            }
            ExprKind::Index(a, b) | ExprKind::Binary(_, a, b) => {
                stack.push((a, d + 1));
                stack.push((b, d + 1));
            }
            ExprKind::List(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            ExprKind::Call(_, args) => stack.extend(args.iter().map(|a| (&a.value, d + 1))),
            _ => {}
        }
    }
    max
}

fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            // `\\`, `\"` and unknown escapes (already reported) keep the escaped character.
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_sequence_rule() {
        let src = r#"
            rule r {
              task t evict machine m1 as e1
              task t fail machine m2 as e2 where e2.priority >= 9
              with e1 -> e2 within 10 min, m1 != m2
              alert true severity warning
              return t.job_id, m1.machine_id as from
            }"#;
        let (file, diags) = parse(src);
        assert!(diags.is_empty(), "{diags:?}");
        let r = &file.rules[0];
        assert_eq!(r.patterns.len(), 2);
        let w = r.with.as_ref().unwrap();
        assert_eq!(w.within.unwrap().millis, 600_000);
        assert_eq!(w.conditions[0].to_string(), "m1 != m2");
        assert_eq!(r.returns.as_ref().unwrap()[1].alias.as_ref().unwrap().name, "from");
    }

    #[test]
    fn precedence_and_printing_round_trip() {
        let src = "rule r { metric m sample as e alert not a + b * c > 2 and d or -e.x < 1 }";
        let (file, diags) = parse(src);
        assert!(diags.is_empty(), "{diags:?}");
        let cond = file.rules[0].alert.as_ref().unwrap().condition.as_ref().unwrap();
        assert_eq!(cond.to_string(), "not a + b * c > 2 and d or -e.x < 1");
        match &cond.kind {
            ExprKind::Binary(BinOp::Or, l, _) => assert!(matches!(l.kind, ExprKind::Binary(BinOp::And, _, _))),
            other => panic!("expected `or` at the top, got {other:?}"),
        }
    }

    #[test]
    fn durations_and_counts() {
        let src = "rule r { task t fail as e with e{5,} within 1.5 h group by t.job_id alert true }";
        let (file, diags) = parse(src);
        assert!(diags.is_empty(), "{diags:?}");
        let w = file.rules[0].with.as_ref().unwrap();
        assert_eq!(w.within.unwrap().millis, 5_400_000);
        assert_eq!(w.steps[0].kind, StepKind::Count { min: 5 });
    }

    #[test]
    fn recovers_at_the_next_rule() {
        let src =
            "rule a { task t fail as e alert ( }\nrule b { task t fail as e alert true }\nrule c { alert severity }";
        let (file, diags) = parse(src);
        assert_eq!(file.rules.len(), 1);
        assert_eq!(file.rules[0].name.name, "b");
        assert_eq!(diags.len(), 2);
    }

    #[test]
    fn durations_from_the_command_line() {
        assert_eq!(parse_duration("5s"), Ok(5_000));
        assert_eq!(parse_duration(" 1.5 h "), Ok(5_400_000));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("99999 w").is_err());
    }

    #[test]
    fn templates_split_into_holes() {
        let src =
            r#"rule r { metric m sample as e alert true annotations { summary = "cpu {e.value} on {m.host} {{x}}" } }"#;
        let (file, diags) = parse(src);
        assert!(diags.is_empty(), "{diags:?}");
        let t = &file.rules[0].annotations[0].template;
        assert_eq!(t.parts.len(), 5);
        assert_eq!(t.parts[4], TemplatePart::Text(" {x}".to_string()));
    }

    #[test]
    fn nesting_limit_counts_cardinality_bars() {
        let deep = format!("rule r {{ alert {}x{} > 0 }}", "|".repeat(100), "|".repeat(100));
        let (_, diags) = parse(&deep);
        assert_eq!(diags[0].code, codes::TOO_DEEP);
        let flat = format!("rule r {{ alert {} > 0 }}", vec!["|a|"; 100].join(" + "));
        let (_, diags) = parse(&flat);
        assert!(diags.iter().all(|d| d.code != codes::TOO_DEEP), "{diags:?}");
    }
}
