//! The shape of the code, checked: no source file over 800 lines, no function over 100 lines,
//! the workspace's crates depending only downward (lang, engine, service, the binary), and within
//! each crate no import cycle between its modules: a module that refers to another may not be
//! referred to by it, directly or through others. A module may use what its ancestors define
//! (they contain it, as `event` contains `event::json`); every other reference, `crate::`,
//! `super::` or a submodule's name, counts. Test code (`#[cfg(test)]` modules and files) is left
//! out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 100;

/// The workspace's crates, each above the ones before it: what each may depend on of the others,
/// and the folder of its sources.
const CRATES: &[(&str, &[&str], &str)] = &[
    ("vigil-lang", &[], "crates/lang/src"),
    ("vigil-engine", &["vigil-lang"], "crates/engine/src"),
    ("vigil-formats", &["vigil-lang", "vigil-engine"], "crates/formats/src"),
    ("vigil-service", &["vigil-lang", "vigil-engine", "vigil-formats"], "crates/service/src"),
    ("vigil", &["vigil-lang", "vigil-engine", "vigil-formats", "vigil-service"], "src"),
];

/// Every `.rs` file of every crate, with its crate's source folder and its module path within
/// it (`engine::window`; `crate` for lib.rs).
fn all_sources() -> Vec<(PathBuf, String)> {
    CRATES.iter().flat_map(|(_, _, root)| sources(root)).collect()
}

/// Every `.rs` file under one crate's source folder, with its module path.
fn sources(root: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from(root)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && path.file_name() != Some("main.rs".as_ref()) {
                out.push((path.clone(), module_of(root, &path)));
            }
        }
    }
    out.sort();
    out
}

fn module_of(root: &str, path: &Path) -> String {
    let rel = path.strip_prefix(root).expect("under the crate's sources").with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    if parts.is_empty() {
        "crate".into()
    } else {
        parts.join("::")
    }
}

/// The file's text without its test module, and whether the file is test code as a whole
/// (declared under `#[cfg(test)]` by its parent).
fn non_test_text(path: &Path, test_files: &BTreeSet<String>, module: &str) -> Option<String> {
    if test_files.contains(module) {
        return None;
    }
    let text = std::fs::read_to_string(path).expect("readable");
    let code = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => &text,
    };
    // Comments (doc links among them) are not imports.
    Some(code.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n"))
}

/// Modules declared `#[cfg(test)] mod name;` (test code in files of their own).
fn test_modules(files: &[(PathBuf, String)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (path, module) in files {
        let text = std::fs::read_to_string(path).expect("readable");
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.windows(2) {
            if pair[0].trim() == "#[cfg(test)]" {
                if let Some(name) = pair[1].trim().strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                    out.insert(if module == "crate" { name.to_string() } else { format!("{module}::{name}") });
                }
            }
        }
    }
    out
}

#[test]
fn no_source_file_is_over_800_lines() {
    let long: Vec<String> = all_sources()
        .into_iter()
        .map(|(p, _)| (std::fs::read_to_string(&p).expect("readable").lines().count(), p))
        .filter(|(n, _)| *n > MAX_FILE_LINES)
        .map(|(n, p)| format!("{}: {n} lines", p.display()))
        .collect();
    assert!(long.is_empty(), "files over {MAX_FILE_LINES} lines:\n{}", long.join("\n"));
}

/// Functions longer than the limit: from the line of `fn` to the line that closes its body.
fn long_functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let Some(at) = code.find("fn ") else { continue };
        let before = code[..at].trim();
        let is_item = before.is_empty()
            || before.split_whitespace().all(|w| {
                ["pub", "pub(crate)", "pub(super)", "const", "async", "unsafe", "extern"].contains(&w)
                    || w.starts_with("pub(")
            });
        if !is_item || code.trim_end().ends_with(';') {
            continue;
        }
        let name: String = code[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // Find the body's opening brace, then its match.
        let (mut depth, mut opened, mut end) = (0i32, false, None);
        'scan: for (j, l) in lines.iter().enumerate().skip(i) {
            let mut in_str = false;
            let mut prev = ' ';
            // Brace characters as literals (`b'{'`) do not open or close anything.
            let code = l.split("//").next().unwrap_or("").replace("'{'", "''").replace("'}'", "''");
            for c in code.chars() {
                if c == '"' && prev != '\\' {
                    in_str = !in_str;
                }
                if !in_str {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        ';' if !opened && depth == 0 => break 'scan,
                        _ => {}
                    }
                }
                prev = c;
            }
            if opened && depth == 0 {
                end = Some(j);
                break;
            }
        }
        if let Some(end) = end {
            let n = end - i + 1;
            if n > MAX_FN_LINES {
                out.push((name, n));
            }
        }
    }
    out
}

#[test]
fn no_function_is_over_100_lines() {
    let mut long = Vec::new();
    for (_, _, root) in CRATES {
        let files = sources(root);
        let tests = test_modules(&files);
        for (path, module) in &files {
            let Some(text) = non_test_text(path, &tests, module) else { continue };
            for (name, n) in long_functions(&text) {
                long.push(format!("{}: fn {name}, {n} lines", path.display()));
            }
        }
    }
    assert!(long.is_empty(), "functions over {MAX_FN_LINES} lines:\n{}", long.join("\n"));
}

/// The modules a file's code refers to: `crate::a::b` and `super::a` paths, resolved to the
/// longest module path that is a file of `src/`.
fn references(module: &str, text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let parent = |m: &str| -> String {
        match m.rsplit_once("::") {
            Some((p, _)) => p.to_string(),
            None if m == "crate" => "crate".to_string(),
            None => "crate".to_string(),
        }
    };
    // Where `super` points from this file: the parent of its module.
    let sup = parent(module);
    let resolve = |path: Vec<String>| -> Option<String> {
        (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| modules.contains(m))
    };
    let bytes: Vec<char> = text.chars().collect();
    let text_str: String = bytes.iter().collect();
    for (prefix, base) in [("crate::", "crate".to_string()), ("super::", sup.clone())] {
        let mut from = 0;
        while let Some(at) = text_str[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            // Not part of a longer name (`some_crate::`).
            if start > 0 && text_str[..start].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest: String =
                text_str[from..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            let mut path: Vec<String> =
                if base == "crate" { Vec::new() } else { base.split("::").map(String::from).collect() };
            path.extend(rest.split("::").filter(|p| !p.is_empty()).map(String::from));
            // `use super::{a, b::C}`: each item of the group.
            let mut items = vec![Vec::new()];
            if text_str[from + rest.len()..].starts_with('{') {
                let group: String = text_str[from + rest.len() + 1..].chars().take_while(|c| *c != '}').collect();
                items = group
                    .split(',')
                    .map(|item| {
                        item.trim().split("::").map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect()
                    })
                    .collect();
            }
            for item in items {
                let mut full = path.clone();
                full.extend(item);
                let target = resolve(full).unwrap_or_else(|| base.clone());
                if target != module {
                    out.insert(target);
                }
            }
        }
    }
    // A submodule named in code (`scan::scan(..)`, `physical::build(..)`).
    let prefix = if module == "crate" { String::new() } else { format!("{module}::") };
    for child in modules.iter().filter_map(|m| m.strip_prefix(&prefix)).filter(|c| !c.contains("::")) {
        let needle = format!("{child}::");
        let mut from = 0;
        while let Some(at) = text_str[from..].find(&needle) {
            let start = from + at;
            from = start + needle.len();
            let before = text_str[..start].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            out.insert(format!("{prefix}{child}"));
        }
    }
    // `use a::b` inside a module that declares `mod a`: a child.
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("use ").or_else(|| line.strip_prefix("pub use ")) else { continue };
        let first: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let child = if module == "crate" { first.clone() } else { format!("{module}::{first}") };
        if modules.contains(&child) {
            let rest: Vec<String> = rest.trim_end_matches(';').split("::").map(|p| p.trim().to_string()).collect();
            let mut path: Vec<String> =
                if module == "crate" { Vec::new() } else { module.split("::").map(String::from).collect() };
            path.extend(rest.into_iter().filter(|p| p.chars().all(|c| c.is_alphanumeric() || c == '_')));
            if let Some(t) = resolve(path) {
                out.insert(t);
            }
        }
    }
    out
}

#[test]
fn no_import_cycle_between_source_files() {
    let report: Vec<String> = CRATES.iter().flat_map(|(_, _, root)| cycles(root)).collect();
    assert!(report.is_empty(), "import cycles between files:\n{}", report.join("\n"));
}

/// The vigil crates a crate's manifest names, in `[dependencies]` and `[dev-dependencies]`
/// alike (a test that reached up would tie the layers as surely as code).
fn vigil_dependencies(manifest: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).expect("readable manifest");
    let mut out = BTreeSet::new();
    let mut in_dependencies = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line.ends_with("dependencies]");
        } else if in_dependencies && line.starts_with("vigil") {
            let name: String = line.chars().take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_').collect();
            out.insert(name);
        }
    }
    out
}

#[test]
fn crates_depend_only_on_the_layers_below_them() {
    for (name, allowed, root) in CRATES {
        let manifest = Path::new(root).parent().expect("crate folder").join("Cargo.toml");
        let manifest = if *root == "src" { PathBuf::from("Cargo.toml") } else { manifest };
        let found = vigil_dependencies(manifest.to_str().expect("utf-8 path"));
        let above: Vec<&String> = found.iter().filter(|d| !allowed.contains(&d.as_str())).collect();
        assert!(above.is_empty(), "{name} depends on {above:?}, which are not below it");
    }
}

/// The import cycles between the modules of one crate, each with its edges.
fn cycles(root: &str) -> Vec<String> {
    let files = sources(root);
    let tests = test_modules(&files);
    let modules: BTreeSet<String> = files.iter().map(|(_, m)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, module) in &files {
        let Some(text) = non_test_text(path, &tests, module) else { continue };
        let refs = references(module, &text, &modules);
        let ancestor = |r: &String| r == "crate" || module.starts_with(&format!("{r}::"));
        graph.insert(module.clone(), refs.into_iter().filter(|r| !tests.contains(r) && !ancestor(r)).collect());
    }
    // Strongly connected components (Tarjan): any with more than one module is a cycle.
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        next: usize,
        cycles: Vec<Vec<String>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &str) {
            self.index.insert(v.to_string(), self.next);
            self.low.insert(v.to_string(), self.next);
            self.next += 1;
            self.stack.push(v.to_string());
            self.on_stack.insert(v.to_string());
            for w in self.graph.get(v).cloned().unwrap_or_default() {
                if !self.index.contains_key(&w) {
                    self.visit(&w);
                    let lw = self.low[&w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(&w) {
                    let iw = self.index[&w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(&w);
                    let done = w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.cycles.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        cycles: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.cycles
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|a| graph[a].iter().filter(|b| c.contains(b)).map(move |b| format!("{a} -> {b}")))
                .collect();
            format!("{root}: {}\n  {}", c.join(", "), edges.join("\n  "))
        })
        .collect()
}
