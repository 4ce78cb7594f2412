//! Expressions and literals: operator chains folded, postfix members and indexes, calls,
//! numbers, strings and durations.

use super::*;

impl Builder<'_> {
    pub(super) fn string(&mut self, p: Pair<Rule>) -> String {
        let inner = p.into_inner().next().expect("string body");
        let base = self.offset + inner.as_span().start();
        self.check_escapes(inner.as_str(), base);
        unescape(inner.as_str())
    }

    pub(super) fn check_escapes(&mut self, raw: &str, base: usize) {
        let mut chars = raw.char_indices();
        while let Some((i, c)) = chars.next() {
            if c == '\\' {
                if let Some((j, e)) = chars.next() {
                    if !matches!(e, 'n' | 't' | 'r' | '\\' | '"' | '\'') {
                        self.diags.push(
                            Diagnostic::new(
                                codes::BAD_LITERAL,
                                format!("unknown escape `\\{e}` in string"),
                                Span::new(base + i, base + j + e.len_utf8()),
                                "not an escape",
                            )
                            .with_help(
                                "the escapes are \\n, \\t, \\r, \\\\, \\\" and \\'; a regex backslash is written `\\\\`",
                            ),
                        );
                    }
                }
            }
        }
    }

    pub(super) fn integer(&mut self, p: Pair<Rule>) -> u64 {
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

    pub(super) fn duration(&mut self, p: Pair<Rule>) -> Duration {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let value: f64 = inner.next().expect("duration number").as_str().parse().unwrap_or(f64::INFINITY);
        let unit = inner.next().expect("duration unit").as_str();
        let per_unit: f64 = match unit {
            "ms" | "millisecond" | "milliseconds" => 1.0,
            "s" | "sec" | "secs" | "second" | "seconds" => 1e3,
            "m" | "min" | "mins" | "minute" | "minutes" => 60e3,
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

    pub(super) fn expr_list(&mut self, p: Pair<Rule>) -> Vec<Expr> {
        p.into_inner().map(|e| self.expr(e)).collect()
    }

    pub(super) fn expr(&mut self, p: Pair<Rule>) -> Expr {
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
    pub(super) fn expr_inner(&mut self, p: Pair<Rule>) -> Expr {
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
            Rule::postfix => self.postfix(p),
            Rule::cardinality => {
                let inner = self.expr_inner(p.into_inner().next().expect("cardinality body"));
                Expr { span, kind: ExprKind::Cardinality(Box::new(inner)) }
            }
            Rule::list => {
                let items = p.into_inner().map(|e| self.expr_inner(e)).collect();
                Expr { span, kind: ExprKind::List(items) }
            }
            Rule::call => self.call(p),
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

    /// `base.member`, `base[index]`, `base[from..to]`, left to right.
    fn postfix(&mut self, p: Pair<Rule>) -> Expr {
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

    /// `name(arg, name = arg, ...)`.
    fn call(&mut self, p: Pair<Rule>) -> Expr {
        let span = self.span(&p);
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
}

pub(super) fn binop(s: &str) -> BinOp {
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
pub(super) fn depth(e: &Expr) -> usize {
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

pub(super) fn unescape(raw: &str) -> String {
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
