//! Syntax errors in words a user knows: what was expected, what was found, and where.

use super::*;

pub(super) fn syntax_error(src: &str, base: usize, e: &pest::error::Error<Rule>) -> (Diagnostic, usize) {
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
        for kw in ["`for`", "`severity`", "`keep_firing_for`", "`refractory`"] {
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
    if list.iter().any(|s| s.starts_with("an operation")) {
        if let Some(d) = misspelt_clause(src, at) {
            return (d, at);
        }
    }
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

/// A clause keyword misspelt at the start of the line of `at` (`alret e.priority > 5`): entity
/// kinds are declared, so the grammar reads it as a pattern's kind and fails later, where the
/// operation should be. The word is what to point at.
fn misspelt_clause(src: &str, at: usize) -> Option<Diagnostic> {
    let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let start = line_start + (src[line_start..at].len() - src[line_start..at].trim_start().len());
    let word: &str = src[start..at].split(|c: char| !(c.is_alphanumeric() || c == '_')).next()?;
    if word.is_empty() {
        return None;
    }
    let kw = crate::diagnostic::nearest(word, CLAUSE_KEYWORDS.iter().copied()).filter(|kw| *kw != word)?;
    Some(
        Diagnostic::new(
            codes::SYNTAX,
            format!("unexpected `{word}`"),
            Span::new(start, start + word.len()),
            "expected a clause, or a pattern over a declared entity kind",
        )
        .with_help(format!("did you mean `{kw}`?")),
    )
}

const ALERT_OPTIONS: &str = "an alert option (severity, for, keep_firing_for, refractory)";
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
    "refractory",
    "rollup",
    "score",
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
        | Rule::score_clause
        | Rule::alert_clause
        | Rule::rollup_clause
        | Rule::labels_clause
        | Rule::annotations_clause
        | Rule::return_clause => "a clause",
        Rule::operation => "an operation such as `fail` or `use`",
        Rule::window => "a window `#time(...)`",
        Rule::pattern_where => "`where`",
        Rule::seq_step | Rule::plain_step | Rule::count_step | Rule::absent_step | Rule::sequence => "an event name",
        Rule::within => "`within`",
        Rule::state_field => "a state field `name := aggregate(...)`",
        Rule::label_name => "a label or annotation name",
        Rule::single_inner => "the text of a string",
        Rule::field_filter => "`where` and the events a state field reads",
        Rule::inv_stmt => "a statement `name := value` or `name = value`",
        Rule::inv_mode => "`offline` or `online`",
        Rule::cluster_arg => "a cluster argument `name = value`",
        Rule::template_field => "a field `name = \"text\"`",
        Rule::severity_opt | Rule::for_opt | Rule::keep_firing_opt | Rule::refractory_opt => ALERT_OPTIONS,
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
        "score",
        "invariant",
        "cluster",
        "alert",
        "rollup",
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
