//! Series selectors as PromQL writes them (`node_cpu_seconds_total{mode!="idle",
//! instance=~"web-.*"}`), read into remote-read's label matchers.

use super::proto::{LabelMatcher, EQ, NEQ, NRE, RE};

/// What is wrong with a selector, and where (1-based column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    pub column: usize,
    pub reason: String,
}

impl std::fmt::Display for SelectorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "column {}: {}", self.column, self.reason)
    }
}

struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn error<T>(&self, reason: impl Into<String>) -> Result<T, SelectorError> {
        Err(SelectorError { column: self.text[..self.at].chars().count() + 1, reason: reason.into() })
    }

    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_space(&mut self) {
        let trimmed = self.rest().trim_start();
        self.at = self.text.len() - trimmed.len();
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_space();
        let found = self.rest().starts_with(s);
        if found {
            self.at += s.len();
        }
        found
    }

    /// A metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*` (no `:` in a label's).
    fn name(&mut self, colons: bool) -> Option<&str> {
        self.skip_space();
        let ok = |c: char, first: bool| {
            c.is_ascii_alphabetic() || c == '_' || (colons && c == ':') || (!first && c.is_ascii_digit())
        };
        let mut end = 0;
        for (i, c) in self.rest().char_indices() {
            if !ok(c, i == 0) {
                break;
            }
            end = i + c.len_utf8();
        }
        let start = self.at;
        self.at += end;
        (end > 0).then(|| &self.text[start..start + end])
    }

    /// A quoted string (`"`, `'` or a backtick), with Go's escapes in the first two.
    fn string(&mut self) -> Result<String, SelectorError> {
        self.skip_space();
        let Some(quote) = self.rest().chars().next().filter(|c| matches!(c, '"' | '\'' | '`')) else {
            return self.error("expected a quoted value");
        };
        self.at += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            if c == quote {
                self.at += i + 1;
                return Ok(out);
            }
            if c != '\\' || quote == '`' {
                out.push(c);
                continue;
            }
            let escaped = match chars.next().map(|(_, e)| e) {
                Some('n') => '\n',
                Some('t') => '\t',
                Some('\\') => '\\',
                Some(e) if e == quote => e,
                Some(e) => {
                    self.at += i;
                    return self.error(format!("unknown escape `\\{e}`"));
                }
                None => break,
            };
            out.push(escaped);
        }
        self.error("the value's quote is not closed")
    }
}

/// The matchers of a selector: the metric name (when given) as `__name__`, then the braces'.
/// A selector must match something narrower than every series: at least one matcher that an
/// empty value does not satisfy, as Prometheus asks.
pub fn parse(text: &str) -> Result<Vec<LabelMatcher>, SelectorError> {
    let mut r = Reader { text, at: 0 };
    let mut out = Vec::new();
    if let Some(name) = r.name(true) {
        out.push(LabelMatcher { r#type: EQ, name: "__name__".into(), value: name.to_string() });
    }
    if r.eat("{") {
        while !r.eat("}") {
            let Some(label) = r.name(false).map(str::to_string) else { return r.error("expected a label name") };
            let kind = if r.eat("=~") {
                RE
            } else if r.eat("!~") {
                NRE
            } else if r.eat("!=") {
                NEQ
            } else if r.eat("=") {
                EQ
            } else {
                return r.error("expected =, !=, =~ or !~");
            };
            let value = r.string()?;
            if kind == RE || kind == NRE {
                if let Err(e) = regex::Regex::new(&format!("^(?:{value})$")) {
                    return r.error(format!("`{value}` is not a regular expression: {e}"));
                }
            }
            out.push(LabelMatcher { r#type: kind, name: label, value });
            if !r.eat(",") && !r.rest().trim_start().starts_with('}') {
                return r.error("expected `,` or `}`");
            }
        }
    }
    r.skip_space();
    if !r.rest().is_empty() {
        return r.error("unexpected text after the selector");
    }
    if out.is_empty() {
        return r.error("an empty selector: give a metric name or label matchers");
    }
    let narrow = out.iter().any(|m| match m.r#type {
        EQ => !m.value.is_empty(),
        RE => !regex::Regex::new(&format!("^(?:{})$", m.value)).is_ok_and(|re| re.is_match("")),
        _ => false,
    });
    if !narrow {
        return r.error("the selector matches every series: give a matcher that an empty value does not meet");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(kind: i32, name: &str, value: &str) -> LabelMatcher {
        LabelMatcher { r#type: kind, name: name.into(), value: value.into() }
    }

    #[test]
    fn selectors_read_as_promql_writes_them() {
        assert_eq!(parse("up").expect("name"), [m(EQ, "__name__", "up")]);
        assert_eq!(
            parse(r#"node_cpu_seconds_total{mode!="idle", instance=~'web-.*',}"#).expect("braces"),
            [m(EQ, "__name__", "node_cpu_seconds_total"), m(NEQ, "mode", "idle"), m(RE, "instance", "web-.*")]
        );
        assert_eq!(
            parse(r#"{job="node",__name__!~"go_.*"}"#).expect("no name"),
            [m(EQ, "job", "node"), m(NRE, "__name__", "go_.*")]
        );
        assert_eq!(parse(r#"{__name__=~".+"}"#).expect("every named series"), [m(RE, "__name__", ".+")]);
        assert_eq!(parse(r#"x{a="q\"uote\\"}"#).expect("escapes")[1].value, "q\"uote\\");
    }

    #[test]
    fn a_bad_selector_says_where_and_why() {
        let err = |s: &str| parse(s).expect_err(s).to_string();
        assert_eq!(err(r#"up{job="node""#), "column 14: expected `,` or `}`");
        assert_eq!(err(r#"up{job=node}"#), "column 8: expected a quoted value");
        assert_eq!(err(r#"up{job~"x"}"#), "column 7: expected =, !=, =~ or !~");
        assert_eq!(
            err(r#"{job=~".*"}"#),
            "column 12: the selector matches every series: give a matcher that an empty value does not meet"
        );
        assert!(err(r#"{job=~"("}"#).starts_with("column 10: `(` is not a regular expression"));
        assert_eq!(err("up down"), "column 4: unexpected text after the selector");
        assert_eq!(err(""), "column 1: an empty selector: give a metric name or label matchers");
    }
}
