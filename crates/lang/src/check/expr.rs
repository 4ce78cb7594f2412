//! Expressions: each typed, and required to be of the type its place needs.

use super::*;

impl RuleChecker<'_> {
    /// An expression that must be a bool.
    pub(super) fn condition(&mut self, e: &Expr, scope: &Scope) -> TExpr {
        let t = self.expr(e, scope);
        if !compatible(t.ty, Type::Bool) {
            self.error(
                Diagnostic::new(
                    codes::NOT_BOOLEAN,
                    format!("{} must be true or false, but this is a {}", capitalise(scope.place), t.ty),
                    e.span,
                    format!("this is a {}", t.ty),
                )
                .with_help("compare it with something, e.g. `x > 0.9`"),
            );
        }
        t
    }

    /// An expression that must be a single value (a key or an aggregate's argument).
    pub(super) fn scalar(&mut self, e: &Expr, scope: &Scope) -> TExpr {
        let t = self.expr(e, scope);
        self.require(
            t.ty,
            &[Type::Number, Type::Str, Type::Bool, Type::Duration, Type::Time],
            e.span,
            "a single value is needed here",
        );
        t
    }

    /// Reports values that cannot be carried by an alert or stored in a baseline.
    pub(super) fn value_type(&mut self, t: &TExpr, span: Span) {
        if matches!(t.ty, Type::State | Type::Cluster | Type::Event(_)) {
            self.error(Diagnostic::new(
                codes::TYPE_MISMATCH,
                format!("a {} is not a value", t.ty),
                span,
                "take one of its fields",
            ));
        }
    }

    /// Requires `got` to be one of `want`, reporting why it must be otherwise (an error type
    /// passes, so that one mistake is reported once).
    pub(super) fn require(&mut self, got: Type, want: &[Type], span: Span, why: &str) -> bool {
        if want.iter().any(|w| compatible(got, *w)) {
            return true;
        }
        let names: Vec<String> = want.iter().map(|t| t.to_string()).collect();
        self.error(
            Diagnostic::new(
                codes::TYPE_MISMATCH,
                format!("expected {}, found {got}", names.join(" or ")),
                span,
                format!("this is a {got}"),
            )
            .with_note(why.to_string()),
        );
        false
    }

    pub(super) fn expr(&mut self, e: &Expr, scope: &Scope) -> TExpr {
        match &e.kind {
            ExprKind::Number(n) => typed(Type::Number, TExprKind::Number(*n)),
            ExprKind::Str(s) => typed(Type::Str, TExprKind::Str(s.clone())),
            ExprKind::Bool(b) => typed(Type::Bool, TExprKind::Bool(*b)),
            ExprKind::Duration(ms) => typed(Type::Duration, TExprKind::Duration(*ms)),
            ExprKind::EmptySet => typed(Type::Set, TExprKind::EmptySet),
            ExprKind::List(items) => {
                let typed_items: Vec<TExpr> = items.iter().map(|i| self.scalar(i, scope)).collect();
                if let Some(first) = typed_items.first().map(|t| t.ty) {
                    if let Some((bad, item)) = typed_items.iter().zip(items).find(|(t, _)| !compatible(t.ty, first)) {
                        self.error(Diagnostic::new(
                            codes::TYPE_MISMATCH,
                            format!("a list holds values of one type; this one starts with a {first}"),
                            item.span,
                            format!("this is a {}", bad.ty),
                        ));
                    }
                }
                let items = typed_items;
                typed(Type::Literals, TExprKind::List(items))
            }
            ExprKind::Name(n) => self.name(n, e.span, scope),
            ExprKind::ClusterRef => {
                if !scope.cluster {
                    self.error(
                        Diagnostic::new(codes::UNKNOWN_NAME, "`cluster` is not defined here", e.span, "no cluster result")
                            .with_note("`cluster` is the result of a rule's `cluster(...)` step, and exists in its alert and return"),
                    );
                    return error_expr();
                }
                typed(Type::Cluster, TExprKind::Bool(false))
            }
            ExprKind::Member(base, field) => self.member(e, base, field, scope),
            ExprKind::Index(base, idx) => self.index(e, base, idx, scope),
            ExprKind::Range(..) => {
                self.error(
                    Diagnostic::new(codes::TYPE_MISMATCH, "a range of windows needs a field", e.span, "no field taken")
                        .with_help(format!("take a field, e.g. `avg({}.cpu)`", e)),
                );
                error_expr()
            }
            ExprKind::Call(name, args) => self.call(e, name, args, scope),
            ExprKind::Unary(op, inner) => {
                let t = self.expr(inner, scope);
                let (want, ty): (&[Type], Type) = match op {
                    UnaryOp::Not => (&[Type::Bool], Type::Bool),
                    UnaryOp::Neg => (&[Type::Number, Type::Duration], t.ty),
                };
                let ok = self.require(
                    t.ty,
                    want,
                    inner.span,
                    if *op == UnaryOp::Not { "`not` negates a condition" } else { "`-` negates a number" },
                );
                TExpr { ty: if ok { ty } else { Type::Error }, kind: TExprKind::Unary(*op, Box::new(t)) }
            }
            ExprKind::Binary(op, l, r) => self.binary(e, *op, l, r, scope),
            ExprKind::Cardinality(inner) => {
                let t = self.expr(inner, scope);
                self.require(
                    t.ty,
                    &[Type::Set, Type::List, Type::Literals, Type::Str],
                    inner.span,
                    "`|x|` counts the members of a set or list, or the characters of a string",
                );
                TExpr { ty: Type::Number, kind: TExprKind::Cardinality(Box::new(t)) }
            }
        }
    }

    pub(super) fn index(&mut self, e: &Expr, base: &Expr, idx: &Expr, scope: &Scope) -> TExpr {
        // A group key written as a lookup (`e.labels["cluster"]`) has one value per group.
        if let (Vars::GroupKeys, true) = (scope.vars, self.is_value_key(e)) {
            let pattern = Scope::new(scope.place, Vars::Sources(&[0]));
            return self.index(e, base, idx, &pattern);
        }
        if scope.state && self.is_state(base) {
            let ExprKind::Name(n) = &base.kind else { unreachable!() };
            let example =
                self.state.as_ref().and_then(|s| s.field_order.first().cloned()).unwrap_or_else(|| "field".into());
            self.error(
                Diagnostic::new(
                    codes::TYPE_MISMATCH,
                    format!("`{e}` is a whole window of state `{n}`"),
                    e.span,
                    "take a field",
                )
                .with_help(format!("write e.g. `{e}.{example}`")),
            );
            return error_expr();
        }
        let map = self.expr(base, scope);
        let key = self.expr(idx, scope);
        if map.ty == Type::Error {
            return error_expr();
        }
        if !compatible(map.ty, Type::Map) {
            self.error(
                Diagnostic::new(
                    codes::TYPE_MISMATCH,
                    format!("a {} cannot be indexed", map.ty),
                    base.span,
                    format!("this is a {}", map.ty),
                )
                .with_note("`x[\"key\"]` looks up a metric label; `ss[1]` is a past window of a state"),
            );
            return error_expr();
        }
        self.require(key.ty, &[Type::Str], idx.span, "labels are looked up by name");
        typed(Type::Str, TExprKind::Lookup(Box::new(map), Box::new(key)))
    }

    pub(super) fn call(&mut self, e: &Expr, name: &Ident, args: &[CallArg], scope: &Scope) -> TExpr {
        if let Some(special) = self.special_call(e, name, args, scope) {
            return special;
        }
        if let Some(named) = args.iter().find_map(|a| a.name.as_ref()) {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                format!("`{}` takes positional arguments", name.name),
                named.span,
                "named argument",
            ));
            return error_expr();
        }
        let targs: Vec<TExpr> = args.iter().map(|a| self.expr(&a.value, scope)).collect();
        let tys: Vec<Type> = targs.iter().map(|t| t.ty).collect();
        if tys.contains(&Type::Error) {
            return error_expr();
        }
        if let Some((func, ty)) = resolve_call(&name.name, &tys) {
            return typed(ty, TExprKind::Call(func, targs));
        }
        self.bad_call(e, name, &tys, scope);
        error_expr()
    }

    /// Says why a call resolved to no function: an aggregate outside a state, wrong
    /// arguments, or an unknown name.
    fn bad_call(&mut self, e: &Expr, name: &Ident, tys: &[Type], scope: &Scope) {
        let n = name.name.as_str();
        const FUNCS: [&str; 15] = [
            "abs", "sqrt", "ln", "round", "floor", "ceil", "lower", "upper", "min", "max", "avg", "sum", "stddev",
            "count", "coalesce",
        ];
        const REDUCTIONS: [&str; 6] = ["avg", "sum", "min", "max", "stddev", "count"];
        if REDUCTIONS.contains(&n) {
            let state = self.state.as_ref().map(|s| s.name.clone());
            let d = match state.filter(|_| scope.state) {
                Some(ss) => Diagnostic::new(
                    codes::AGGREGATE_CONTEXT,
                    format!("`{n}` here takes a range of past windows"),
                    e.span,
                    "not a range of windows",
                )
                .with_help(format!(
                    "write e.g. `{n}({ss}[1..3].field)`; to aggregate events, add a field to state `{ss}`"
                )),
                None => Diagnostic::new(
                    codes::AGGREGATE_CONTEXT,
                    format!("aggregate `{n}` used outside a state block"),
                    e.span,
                    "aggregates events",
                )
                .with_note("aggregates over events need a window and a `state` block")
                .with_help(format!(
                    "add a window and a state, e.g. `#time(5 min)` and `state ss {{ x := {n}(...) }}`, then use `ss.x`"
                )),
            };
            return self.error(d);
        }
        if FUNCS.contains(&n) {
            let shown: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
            return self.error(
                Diagnostic::new(
                    codes::ARGUMENTS,
                    format!("`{n}` cannot take ({})", shown.join(", ")),
                    e.span,
                    "wrong arguments",
                )
                .with_note(signature(n).to_string()),
            );
        }
        let mut all: Vec<&str> = FUNCS.to_vec();
        all.extend(AggFunc::NAMES);
        let d = if AggFunc::NAMES.contains(&n) {
            Diagnostic::new(
                codes::AGGREGATE_CONTEXT,
                format!("aggregate `{n}` used outside a state block"),
                name.span,
                "aggregates belong in `state`",
            )
            .with_help(format!("define it in the state, e.g. `state ss {{ x := {n}(...) }}`, then use `ss.x`"))
        } else {
            Diagnostic::new(codes::UNKNOWN_FUNCTION, format!("unknown function `{n}`"), name.span, "no such function")
                .with_help(suggestion(n, &all))
        };
        self.error(d);
    }

    pub(super) fn binary(&mut self, e: &Expr, op: BinOp, l: &Expr, r: &Expr, scope: &Scope) -> TExpr {
        let lt = self.expr(l, scope);
        let rt = self.expr(r, scope);
        let (a, b) = (lt.ty, rt.ty);
        if a == Type::Error || b == Type::Error {
            return TExpr { ty: Type::Error, kind: TExprKind::Binary(op, Box::new(lt), Box::new(rt)) };
        }
        use Type::*;
        let ty = match op {
            BinOp::And | BinOp::Or => {
                self.require(a, &[Bool], l.span, &format!("`{}` joins conditions", op.symbol()));
                self.require(b, &[Bool], r.span, &format!("`{}` joins conditions", op.symbol()));
                Some(Bool)
            }
            BinOp::Eq | BinOp::Ne => {
                let ok = match (a, b) {
                    (Entity(x), Entity(y)) => x == y,
                    (Entity(_), _) | (_, Entity(_)) => false,
                    (x, y) => x == y && matches!(x, Number | Str | Bool | Duration | Time | Set),
                };
                ok.then_some(Bool)
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                (a == b && matches!(a, Number | Duration | Time | Str)).then_some(Bool)
            }
            BinOp::Match | BinOp::Like => {
                self.require(a, &[Str], l.span, &format!("`{}` matches strings", op.symbol()));
                self.pattern(op, r);
                Some(Bool)
            }
            BinOp::In | BinOp::NotIn => {
                if !self.membership(e, op, (a, b), &rt, r) {
                    return error_expr();
                }
                Some(Bool)
            }
            BinOp::Union | BinOp::Diff | BinOp::Intersect => (a == Set && b == Set).then_some(Set),
            BinOp::Add | BinOp::Sub => match (a, b) {
                (Number, Number) => Some(Number),
                (Duration, Duration) => Some(Duration),
                (Time, Duration) => Some(Time),
                (Time, Time) if op == BinOp::Sub => Some(Duration),
                _ => None,
            },
            BinOp::Mul => match (a, b) {
                (Number, Number) => Some(Number),
                (Number, Duration) | (Duration, Number) => Some(Duration),
                _ => None,
            },
            BinOp::Div => match (a, b) {
                (Number, Number) | (Duration, Duration) => Some(Number),
                (Duration, Number) => Some(Duration),
                _ => None,
            },
            BinOp::Rem => (a == Number && b == Number).then_some(Number),
        };
        let Some(ty) = ty else {
            self.cannot_combine(e, op, a, b);
            return error_expr();
        };
        TExpr { ty, kind: TExprKind::Binary(op, Box::new(lt), Box::new(rt)) }
    }

    /// The pattern on the right of `=~` or `like`: a string literal, and for `=~` a valid
    /// regular expression.
    fn pattern(&mut self, op: BinOp, r: &Expr) {
        match &r.kind {
            ExprKind::Str(pattern) if op == BinOp::Match => {
                if let Err(err) = regex::Regex::new(pattern) {
                    let msg = err.to_string();
                    let last = msg.lines().last().unwrap_or("invalid").trim().trim_start_matches("error: ").to_string();
                    self.error(Diagnostic::new(codes::BAD_REGEX, "invalid regular expression", r.span, last));
                }
            }
            ExprKind::Str(_) => {}
            _ => self.error(
                Diagnostic::new(
                    codes::TYPE_MISMATCH,
                    format!("the pattern after `{}` must be a string literal", op.symbol()),
                    r.span,
                    "not a literal",
                )
                .with_note("patterns are compiled once, when the rule loads"),
            ),
        }
    }

    /// `x in [..]` or `x in set`: a list of `x`'s type or a set on the right. False when the
    /// right side is neither.
    fn membership(&mut self, e: &Expr, op: BinOp, (a, b): (Type, Type), rt: &TExpr, r: &Expr) -> bool {
        use Type::*;
        let elem = match (&rt.kind, b) {
            (TExprKind::List(items), Literals) => items.first().map(|i| i.ty),
            (_, Set) => None,
            _ => {
                self.error(
                    Diagnostic::new(
                        codes::TYPE_MISMATCH,
                        format!("`{}` needs a list or a set on its right", op.symbol()),
                        r.span,
                        format!("this is a {b}"),
                    )
                    .with_help("write e.g. `e.type in [\"FAIL\", \"KILL\"]`"),
                );
                return false;
            }
        };
        if let Some(elem) = elem {
            if !compatible(a, elem) {
                self.error(Diagnostic::new(
                    codes::TYPE_MISMATCH,
                    format!("looking for a {a} in a list of {elem}s"),
                    e.span,
                    "types differ",
                ));
            }
        }
        true
    }

    fn cannot_combine(&mut self, e: &Expr, op: BinOp, a: Type, b: Type) {
        use Type::*;
        let mut d = Diagnostic::new(
            codes::TYPE_MISMATCH,
            format!("`{}` cannot combine a {a} and a {b}", op.symbol()),
            e.span,
            format!("{a} {} {b}", op.symbol()),
        );
        if (a == Number && b == Duration) || (a == Duration && b == Number) {
            d = d.with_help("give the number a unit, e.g. `5 min`");
        } else if a == Set || b == Set {
            d = d.with_help("compare the size of a set with `|s|`, or combine sets with union, diff, intersect");
        }
        self.error(d);
    }
}

fn signature(name: &str) -> &'static str {
    match name {
        "lower" | "upper" => "it takes one string",
        "coalesce" => "it takes two values of one type: `coalesce(e.kind, \"\")`",
        "min" | "max" => "it takes two numbers, two durations, or a range of windows such as `ss[1..3].cpu`",
        _ => "it takes one number",
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// The function a call names, for arguments of these types, with its result type.
fn resolve_call(n: &str, tys: &[Type]) -> Option<(Func, Type)> {
    let one_number = |f: Func| (tys.len() == 1 && compatible(tys[0], Type::Number)).then_some((f, Type::Number));
    match n {
        "abs" => one_number(Func::Abs),
        "sqrt" => one_number(Func::Sqrt),
        "ln" => one_number(Func::Ln),
        "round" => one_number(Func::Round),
        "floor" => one_number(Func::Floor),
        "ceil" => one_number(Func::Ceil),
        "coalesce" if tys.len() == 2 && compatible(tys[0], tys[1]) => {
            Some((Func::Coalesce, if tys[0] == Type::Error { tys[1] } else { tys[0] }))
        }
        "lower" | "upper" if tys.len() == 1 && compatible(tys[0], Type::Str) => {
            Some((if n == "lower" { Func::Lower } else { Func::Upper }, Type::Str))
        }
        "min" | "max"
            if tys.len() == 2
                && (tys.iter().all(|t| compatible(*t, Type::Number))
                    || tys.iter().all(|t| compatible(*t, Type::Duration))) =>
        {
            let ty = if tys.contains(&Type::Duration) { Type::Duration } else { Type::Number };
            Some((if n == "min" { Func::Min2 } else { Func::Max2 }, ty))
        }
        "avg" | "sum" | "min" | "max" | "stddev" | "count" if tys.len() == 1 && compatible(tys[0], Type::List) => {
            let f = match n {
                "avg" => Func::ListAvg,
                "sum" => Func::ListSum,
                "min" => Func::ListMin,
                "max" => Func::ListMax,
                "stddev" => Func::ListStddev,
                _ => Func::ListCount,
            };
            Some((f, Type::Number))
        }
        _ => None,
    }
}
