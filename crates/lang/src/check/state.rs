//! Windowed state: the `state` block and its aggregates, the invariant learned over it, and
//! the cluster step over its groups.

use super::*;

impl RuleChecker<'_> {
    pub(super) fn state_clause(&mut self) -> Option<StatePlan> {
        let s = self.rule.state.as_ref()?;
        // Without a window (already reported) the state is still bound, so that its uses do not
        // cascade into "unknown name" errors.
        let name = s.name.name.clone();
        if self.events.contains_key(&name) || self.entities.contains_key(&name) {
            self.error(Diagnostic::new(
                codes::DUPLICATE_NAME,
                format!("`{name}` already names a variable"),
                s.name.span,
                "state needs its own name",
            ));
        }
        let history = match s.history {
            None => 1,
            Some((k, span)) if k == 0 || k > MAX_HISTORY => {
                self.error(Diagnostic::new(
                    codes::HISTORY_RANGE,
                    format!("a state keeps 1 to {MAX_HISTORY} windows"),
                    span,
                    format!("{k} is out of range"),
                ));
                1
            }
            Some((k, _)) => k as usize,
        };
        let only = [0usize];
        let scope = Scope {
            place: "the state block",
            vars: Vars::Sources(&only),
            state: false,
            baselines: false,
            cluster: false,
            scores: false,
            special: Special::None,
        };
        let mut fields = Vec::new();
        let mut types = HashMap::new();
        let mut order = Vec::new();
        let mut seen: HashMap<&str, Span> = HashMap::new();
        for f in &s.fields {
            if let Some(first) = seen.insert(&f.name.name, f.name.span) {
                self.error(twice(format!("state field `{}` is defined twice", f.name.name), f.name.span, first));
                continue;
            }
            if let Some(field) = self.aggregate(f, &scope) {
                types.insert(field.name.clone(), field.ty);
                order.push(field.name.clone());
                fields.push(field);
            }
        }
        if s.fields.is_empty() {
            self.error(
                Diagnostic::new(
                    codes::STATE_NEEDS_WINDOW,
                    format!("state `{name}` has no fields"),
                    s.span,
                    "empty state",
                )
                .with_help("add an aggregate, e.g. `n := count()`"),
            );
        }
        let mut group_by = Vec::new();
        let mut key_texts = Vec::new();
        let mut entity_keys = Vec::new();
        for g in &s.group_by {
            if let ExprKind::Name(n) = &g.kind {
                if let Some(info) = self.entities.get(n) {
                    group_by.push(GroupKey::Entity { var: n.clone(), kind: info.kind });
                    entity_keys.push(n.clone());
                    key_texts.push(n.clone());
                    continue;
                }
            }
            let e = self.scalar(g, &scope);
            key_texts.push(g.to_string());
            group_by.push(GroupKey::Value(e));
        }
        self.state =
            Some(StateInfo { name: name.clone(), history, fields: types, field_order: order, key_texts, entity_keys });
        Some(StatePlan { name, history, fields, group_by })
    }

    /// A state field: exactly one aggregate call.
    pub(super) fn aggregate(&mut self, f: &StateField, scope: &Scope) -> Option<StateFieldPlan> {
        let ExprKind::Call(func, args) = &f.value.kind else {
            self.error(
                Diagnostic::new(codes::AGGREGATE_CONTEXT, format!("state field `{}` must be an aggregate", f.name.name), f.value.span, "not an aggregate")
                    .with_help("use one of count, sum, avg, min, max, stddev, percentile, distinct_count, set, first, last, rate, increase, deriv, predict_linear; compute ratios in `alert`"),
            );
            return None;
        };
        let name = func.name.as_str();
        if !AggFunc::NAMES.contains(&name) {
            self.error(
                Diagnostic::new(
                    codes::UNKNOWN_FUNCTION,
                    format!("unknown aggregate `{name}`"),
                    func.span,
                    "not an aggregate",
                )
                .with_help(suggestion(name, &AggFunc::NAMES)),
            );
            return None;
        }
        if let Some(named) = args.iter().find_map(|a| a.name.as_ref()) {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                "aggregates take positional arguments",
                named.span,
                "named argument",
            ));
            return None;
        }
        let (want, usage) = match name {
            "count" => (0..=1, "count() or count(x)"),
            "percentile" => (2..=2, "percentile(x, p) with p from 0 to 100"),
            "predict_linear" => (2..=2, "predict_linear(x, d) with d how far ahead, a duration"),
            _ => (1..=1, "one argument"),
        };
        if !want.contains(&args.len()) {
            self.error(Diagnostic::new(
                codes::ARGUMENTS,
                format!(
                    "`{name}` takes {usage}, not {} argument{}",
                    args.len(),
                    if args.len() == 1 { "" } else { "s" }
                ),
                f.value.span,
                "wrong number of arguments",
            ));
            return None;
        }
        let arg = args.first().map(|a| self.scalar(&a.value, scope));
        let arg_ty = arg.as_ref().map_or(Type::Number, |a| a.ty);
        let (agg, ty) = match name {
            "count" => (AggFunc::Count, Type::Number),
            "distinct_count" => (AggFunc::DistinctCount, Type::Number),
            "set" => {
                self.require(
                    arg_ty,
                    &[Type::Str, Type::Number],
                    args[0].value.span,
                    "`set` collects strings or numbers",
                );
                (AggFunc::Set, Type::Set)
            }
            "first" => (AggFunc::First, arg_ty),
            "last" => (AggFunc::Last, arg_ty),
            "percentile" => {
                self.require(arg_ty, &[Type::Number], args[0].value.span, "`percentile` needs numbers");
                (AggFunc::Percentile(self.percentile_of(&args[1].value)), Type::Number)
            }
            "predict_linear" => {
                self.require(arg_ty, &[Type::Number], args[0].value.span, "`predict_linear` needs numbers");
                (AggFunc::PredictLinear(self.ahead_of(&args[1].value)), Type::Number)
            }
            other => {
                self.require(arg_ty, &[Type::Number], args[0].value.span, &format!("`{other}` needs numbers"));
                let agg = match other {
                    "sum" => AggFunc::Sum,
                    "avg" => AggFunc::Avg,
                    "min" => AggFunc::Min,
                    "max" => AggFunc::Max,
                    "rate" => AggFunc::Rate,
                    "increase" => AggFunc::Increase,
                    "deriv" => AggFunc::Deriv,
                    _ => AggFunc::Stddev,
                };
                (agg, Type::Number)
            }
        };
        let filter_scope = Scope { place: "a state field's `where`", ..*scope };
        let filter = match &f.filter {
            Some(c) if self.filter_reads_no_state(c) => Some(self.condition(c, &filter_scope)),
            _ => None,
        };
        Some(StateFieldPlan { name: f.name.name.clone(), agg, arg, ty, filter })
    }

    /// `percentile`'s rank: a number literal from 0 to 100.
    fn percentile_of(&mut self, e: &Expr) -> f64 {
        match e.kind {
            ExprKind::Number(p) if (0.0..=100.0).contains(&p) => p,
            _ => {
                self.error(Diagnostic::new(
                    codes::ARGUMENTS,
                    "the percentile must be a number from 0 to 100",
                    e.span,
                    "not a percentile",
                ));
                50.0
            }
        }
    }

    /// How far `predict_linear` looks ahead, in seconds: a duration literal.
    fn ahead_of(&mut self, e: &Expr) -> f64 {
        match e.kind {
            ExprKind::Duration(ms) if ms > 0 => ms as f64 / 1000.0,
            _ => {
                self.error(
                    Diagnostic::new(
                        codes::ARGUMENTS,
                        "how far `predict_linear` looks ahead is a duration",
                        e.span,
                        "not a duration",
                    )
                    .with_help("write it as a duration literal: `predict_linear(e.value, 4 h)`"),
                );
                3600.0
            }
        }
    }

    /// Whether a state field's `where` reads only the event at hand: an aggregate there, or the
    /// state being built, is reported (and the filter dropped) with why.
    fn filter_reads_no_state(&mut self, e: &Expr) -> bool {
        let state = self.rule.state.as_ref().map(|s| s.name.name.as_str());
        let mut found = None;
        find_in(e, &mut |sub| match &sub.kind {
            ExprKind::Call(func, args) if is_aggregate_call(&func.name, args) => {
                found.get_or_insert((sub.span, true));
            }
            ExprKind::Name(n) if Some(n.as_str()) == state => {
                found.get_or_insert((sub.span, false));
            }
            _ => {}
        });
        let Some((span, aggregate)) = found else { return true };
        let (code, message, label) = if aggregate {
            (codes::AGGREGATE_CONTEXT, "an aggregate cannot choose the events a state field reads", "an aggregate")
        } else {
            (codes::FOREIGN_VARIABLE, "a state field's `where` cannot read the state it builds", "the state")
        };
        self.error(
            Diagnostic::new(code, message, span, label)
                .with_help("`where` reads the event at hand, e.g. `busy := rate(e.value) where e.labels[\"mode\"] != \"idle\"`; compare aggregates in `alert`"),
        );
        false
    }

    pub(super) fn invariant(&mut self) -> Option<InvariantPlan> {
        let inv = self.rule.invariant.as_ref()?;
        self.state.as_ref()?;
        let (n, nspan) = inv.windows;
        if n == 0 || n > MAX_TRAINING_WINDOWS {
            self.error(Diagnostic::new(
                codes::INVARIANT,
                format!("an invariant trains over 1 to {MAX_TRAINING_WINDOWS} windows"),
                nspan,
                format!("{n} is out of range"),
            ));
        }
        let mode = match inv.mode.name.as_str() {
            "offline" => InvariantMode::Offline,
            "online" => InvariantMode::Online,
            other => {
                self.error(
                    Diagnostic::new(
                        codes::INVARIANT,
                        format!("unknown invariant mode `{other}`"),
                        inv.mode.span,
                        "not a mode",
                    )
                    .with_help(suggestion(other, &["offline", "online"]))
                    .with_note("offline freezes the baseline after training; online keeps updating it"),
                );
                InvariantMode::Offline
            }
        };
        let mut init = Vec::new();
        let mut update = Vec::new();
        for st in &inv.statements {
            let scope = Scope { state: true, baselines: true, ..Scope::new("the invariant", Vars::GroupKeys) };
            let value = self.expr(&st.value, &scope);
            if st.is_init {
                if self.baselines.contains_key(&st.target.name) {
                    self.error(Diagnostic::new(
                        codes::DUPLICATE_NAME,
                        format!("baseline `{}` is declared twice", st.target.name),
                        st.target.span,
                        "declared again",
                    ));
                    continue;
                }
                if self.state.as_ref().is_some_and(|s| s.name == st.target.name)
                    || self.events.contains_key(&st.target.name)
                    || self.entities.contains_key(&st.target.name)
                {
                    self.error(Diagnostic::new(
                        codes::DUPLICATE_NAME,
                        format!("`{}` already names something else", st.target.name),
                        st.target.span,
                        "choose another name",
                    ));
                    continue;
                }
                self.value_type(&value, st.value.span);
                self.baselines.insert(st.target.name.clone(), value.ty);
                init.push((st.target.name.clone(), value));
            } else {
                match self.baselines.get(&st.target.name).copied() {
                    None => {
                        let names: Vec<&str> = self.baselines.keys().map(String::as_str).collect();
                        self.error(
                            Diagnostic::new(
                                codes::UNKNOWN_NAME,
                                format!("baseline `{}` is updated but never declared", st.target.name),
                                st.target.span,
                                "not declared",
                            )
                            .with_help(
                                match crate::diagnostic::nearest(&st.target.name, names.iter().copied()) {
                                    Some(c) => format!("did you mean `{c}`?"),
                                    None => format!("declare it first: `{} := ...`", st.target.name),
                                },
                            ),
                        );
                    }
                    Some(ty) if !compatible(ty, value.ty) => self.error(Diagnostic::new(
                        codes::TYPE_MISMATCH,
                        format!("baseline `{}` is a {ty} but is updated with a {}", st.target.name, value.ty),
                        st.value.span,
                        format!("this is a {}", value.ty),
                    )),
                    Some(_) => update.push((st.target.name.clone(), value)),
                }
            }
        }
        if init.is_empty() {
            self.error(
                Diagnostic::new(codes::INVARIANT, "the invariant declares no baseline", inv.span, "nothing to learn")
                    .with_help("declare and update a baseline: `{ seen := empty_set; seen = seen union ss.users }`"),
            );
        }
        Some(InvariantPlan { training_windows: n, mode, init, update })
    }

    pub(super) fn cluster(&mut self) -> Option<ClusterPlan> {
        let c = self.rule.cluster.as_ref()?;
        self.state.as_ref()?;
        self.has_cluster = true;
        const ARGS: [&str; 3] = ["points", "method", "distance"];
        let mut dims = None;
        let mut per = Vec::new();
        let mut method = None;
        let mut distance = Distance::Euclidean;
        for arg in &c.args {
            match (arg.name.name.as_str(), &arg.value) {
                ("points", ClusterValue::Points { dims: d, per: p, .. }) => {
                    let scope = Scope {
                        place: "the cluster points",
                        vars: Vars::GroupKeys,
                        state: true,
                        baselines: false,
                        cluster: false,
                        scores: false,
                        special: Special::None,
                    };
                    let checked: Vec<TExpr> = d
                        .iter()
                        .map(|e| {
                            let t = self.expr(e, &scope);
                            self.require(t.ty, &[Type::Number], e.span, "a point's coordinates are numbers");
                            t
                        })
                        .collect();
                    dims = Some(checked);
                    let key_scope = Scope {
                        place: "the peer groups",
                        vars: Vars::GroupKeys,
                        state: false,
                        baselines: false,
                        cluster: false,
                        scores: false,
                        special: Special::None,
                    };
                    per = p.iter().map(|e| self.scalar(e, &key_scope)).collect();
                }
                ("points", ClusterValue::Expr(e)) => self.error(
                    Diagnostic::new(codes::CLUSTER, "`points` takes `all(...)`", e.span, "not a point set")
                        .with_help("write `points = all(ss.cpu) per t.job_id`"),
                ),
                ("method", ClusterValue::Expr(e)) => method = self.cluster_method(e),
                ("distance", ClusterValue::Expr(e)) => {
                    distance = match &e.kind {
                        ExprKind::Str(s) if s == "ed" || s == "euclidean" => Distance::Euclidean,
                        ExprKind::Str(s) if s == "manhattan" => Distance::Manhattan,
                        ExprKind::Str(s) if s == "chebyshev" => Distance::Chebyshev,
                        _ => {
                            self.error(
                                Diagnostic::new(codes::CLUSTER, "unknown distance", e.span, "not a distance")
                                    .with_help("use \"ed\" (euclidean), \"manhattan\" or \"chebyshev\""),
                            );
                            distance
                        }
                    }
                }
                (name, _) if ARGS.contains(&name) => self.error(Diagnostic::new(
                    codes::CLUSTER,
                    format!("`{name}` takes an expression"),
                    arg.name.span,
                    "wrong kind of value",
                )),
                (name, _) => self.error(
                    Diagnostic::new(
                        codes::ARGUMENTS,
                        format!("unknown cluster argument `{name}`"),
                        arg.name.span,
                        "not an argument",
                    )
                    .with_help(suggestion(name, &ARGS)),
                ),
            }
        }
        let Some(dims) = dims else {
            self.error(
                Diagnostic::new(codes::CLUSTER, "the cluster step needs `points`", c.span, "no points")
                    .with_help("add `points = all(ss.cpu) per t.job_id`"),
            );
            return None;
        };
        let Some(method) = method else {
            if !c.args.iter().any(|a| a.name.name == "method") {
                self.error(
                    Diagnostic::new(codes::CLUSTER, "the cluster step needs a `method`", c.span, "no method")
                        .with_help("add `method = dbscan(0.05, 3)` or `method = mad(3.5)`"),
                );
            }
            return None;
        };
        Some(ClusterPlan { dims, per, method, distance })
    }

    pub(super) fn cluster_method(&mut self, e: &Expr) -> Option<ClusterMethod> {
        const METHODS: [&str; 3] = ["dbscan", "mad", "zscore"];
        let help = "write `dbscan(eps, minpts)`, `mad(threshold)` or `zscore(threshold)`";
        let ExprKind::Call(name, args) = &e.kind else {
            self.error(
                Diagnostic::new(codes::CLUSTER, "`method` names a clustering method", e.span, "not a method")
                    .with_help(help),
            );
            return None;
        };
        let numbers: Option<Vec<f64>> = args
            .iter()
            .map(|a| match a.value.kind {
                ExprKind::Number(n) if n > 0.0 => Some(n),
                _ => None,
            })
            .collect();
        let method = match (name.name.to_ascii_lowercase().as_str(), numbers.as_deref()) {
            ("dbscan", Some(&[eps, min_pts])) if min_pts.fract() == 0.0 => {
                Some(ClusterMethod::Dbscan { eps, min_pts: min_pts as u64 })
            }
            ("mad", Some(&[threshold])) => Some(ClusterMethod::Mad { threshold }),
            ("zscore", Some(&[threshold])) => Some(ClusterMethod::ZScore { threshold }),
            (other, _) if !METHODS.contains(&other) => {
                self.error(
                    Diagnostic::new(
                        codes::CLUSTER,
                        format!("unknown clustering method `{}`", name.name),
                        name.span,
                        "not a method",
                    )
                    .with_help(suggestion(other, &METHODS)),
                );
                return None;
            }
            _ => None,
        };
        if method.is_none() {
            self.error(
                Diagnostic::new(
                    codes::CLUSTER,
                    format!("wrong arguments for `{}`", name.name),
                    e.span,
                    "expected positive numbers",
                )
                .with_help(help)
                .with_note("DBSCAN's minpts is a whole number"),
            );
        }
        method
    }
}

/// Whether a call is an aggregate over events, not a function of the same name: `min(a, b)` and
/// `max(a, b)` of two values, and `sum`, `avg`... of a list, are functions.
fn is_aggregate_call(name: &str, args: &[CallArg]) -> bool {
    let two_values = matches!(name, "min" | "max") && args.len() == 2;
    let of_list = args.len() == 1 && matches!(args[0].value.kind, ExprKind::List(_) | ExprKind::Range(..));
    AggFunc::NAMES.contains(&name) && !two_values && !of_list
}

/// Calls `visit` on `e` and every expression inside it.
fn find_in(e: &Expr, visit: &mut impl FnMut(&Expr)) {
    visit(e);
    match &e.kind {
        ExprKind::List(items) => items.iter().for_each(|i| find_in(i, visit)),
        ExprKind::Member(base, _)
        | ExprKind::Range(base, ..)
        | ExprKind::Unary(_, base)
        | ExprKind::Cardinality(base) => find_in(base, visit),
        ExprKind::Index(base, index) => {
            find_in(base, visit);
            find_in(index, visit);
        }
        ExprKind::Call(_, args) => args.iter().for_each(|a| find_in(&a.value, visit)),
        ExprKind::Binary(_, l, r) => {
            find_in(l, visit);
            find_in(r, visit);
        }
        ExprKind::Number(_)
        | ExprKind::Str(_)
        | ExprKind::Bool(_)
        | ExprKind::Duration(_)
        | ExprKind::EmptySet
        | ExprKind::Name(_)
        | ExprKind::ClusterRef => {}
    }
}
