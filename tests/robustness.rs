//! No input panics or hangs the parser and checker, and too-deep input gets a clear error.
//! The property tests throw arbitrary bytes and mutated real rules at `compile`.

use proptest::prelude::*;

fn codes(src: &[u8]) -> Vec<&'static str> {
    vigil::compile("input.saql", src).diagnostics.iter().map(|d| d.code).collect()
}

#[test]
fn empty_file_is_valid_and_empty() {
    let c = vigil::compile("empty.saql", b"");
    assert!(c.is_ok());
    assert!(c.plans.is_empty());
}

#[test]
fn binary_garbage_is_a_syntax_error() {
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 & 0x7f).collect();
    let c = vigil::compile("garbage.saql", &garbage);
    assert!(!c.diagnostics.is_empty());
}

#[test]
fn invalid_utf8_points_at_the_bad_byte() {
    let mut src = b"rule r {\n  task t fail as e\n  alert e.user == \"".to_vec();
    src.extend([0xff, 0xfe]);
    src.extend(b"\"\n}\n");
    let c = vigil::compile("bad.saql", &src);
    assert_eq!(codes(&src), vec!["E0001"]);
    let json = c.source().to_json(&c.diagnostics);
    assert_eq!((json[0].line, json[0].column), (3, 20));
}

#[test]
fn a_one_megabyte_line_is_handled() {
    let list: Vec<String> = (0..120_000).map(|i| format!("\"u{i}\"")).collect();
    let src = format!("rule big {{ task t fail as e where t.user in [{}] }}", list.join(","));
    assert!(src.len() > 1_000_000);
    let c = vigil::compile("big.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics.first());
    let garbage_line = format!("rule big {{ task t fail as e where {} }}", "e.x ".repeat(300_000));
    assert!(!vigil::compile("big.saql", garbage_line.as_bytes()).is_ok());
}

#[test]
fn ten_thousand_nested_parentheses_hit_the_depth_limit() {
    let src = format!("rule deep {{ task t fail as e alert {}true{} }}", "(".repeat(10_000), ")".repeat(10_000));
    assert_eq!(codes(src.as_bytes()), vec!["E0003"]);
    let bars =
        format!("rule deep {{ task t fail as e alert {}e.priority{} > 1 }}", "|".repeat(10_000), "|".repeat(10_000));
    assert_eq!(codes(bars.as_bytes()), vec!["E0003"]);
}

#[test]
fn nesting_at_the_limit_still_parses() {
    // The rule's own `{` is one level; 31 parentheses make 32, the limit.
    let src = format!("rule deep {{ task t fail as e alert {}e.priority > 1{} }}", "(".repeat(31), ")".repeat(31));
    let c = vigil::compile("deep.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics.first());
}

#[test]
fn long_operator_chains_are_limited_not_stack_overflows() {
    let chain = vec!["e.priority > 1"; 10_000].join(" or ");
    let src = format!("rule chain {{ task t fail as e alert {chain} }}");
    assert_eq!(codes(src.as_bytes()), vec!["E0003"]);
    let nots = format!("rule nots {{ task t fail as e alert {}true }}", "not ".repeat(10_000));
    assert_eq!(codes(nots.as_bytes()), vec!["E0003"]);
}

#[test]
fn a_rule_with_ten_thousand_patterns_checks() {
    let mut src = String::from("rule many {\n");
    let mut steps = Vec::new();
    for i in 0..10_000 {
        src.push_str(&format!("  task t event machine m as e{i}\n"));
        steps.push(format!("e{i}"));
    }
    src.push_str(&format!("  with {} within 1 h\n}}\n", steps.join(" -> ")));
    let c = vigil::compile("many.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics.first());
    assert_eq!(c.plans[0].sources.len(), 10_000);
}

#[test]
fn many_broken_rules_are_all_reported() {
    let src = (0..200).map(|i| format!("rule r{i} {{ task t fial as e }}\n")).collect::<String>();
    assert_eq!(codes(src.as_bytes()).len(), 200);
}

fn shipped_rules() -> Vec<String> {
    let files = vigil::ruleset::read_files_under(std::path::Path::new("rules")).expect("rules folder");
    files.into_iter().map(|(_, bytes)| String::from_utf8(bytes).expect("rules are UTF-8")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let c = vigil::compile("fuzz.saql", &bytes);
        let _ = c.source().render(&c.diagnostics, false);
        let _ = c.source().to_json(&c.diagnostics);
    }

    #[test]
    fn token_soup_never_panics(tokens in proptest::collection::vec(prop::sample::select(vec![
        "rule", "r", "{", "}", "(", ")", "[", "]", "|", "task", "t", "fail", "machine", "m", "as", "e", "where",
        "with", "->", "not", "for", "within", "5 min", "#time(", "state[3]", "ss", ":=", "sum(", "e.cpu", ",",
        "group by", "invariant[2][online]", "cluster(", "points =", "all(", "per", "method =", "dbscan(1, 2)",
        "alert", "severity", "warning", "return", "labels", "\"{e.cpu}\"", "\"", "1..3", "0.5", ">", "and", "or",
        "union", "empty_set", "=", ";", "e{3,}", "\n", "//", "/*", "*/",
    ]), 0..80)) {
        let src = tokens.join(" ");
        let c = vigil::compile("soup.saql", src.as_bytes());
        let _ = c.source().render(&c.diagnostics, false);
    }

    #[test]
    fn mutated_rules_never_panic(
        which in 0usize..64,
        cuts in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let rules = shipped_rules();
        let mut src = rules[which % rules.len()].clone().into_bytes();
        for (at, len, byte) in cuts {
            if src.is_empty() { break; }
            let at = at.index(src.len());
            match byte % 3 {
                0 => { let end = (at + len.index(16)).min(src.len()); src.drain(at..end); }
                1 => src.insert(at, byte),
                _ => { let other = len.index(src.len()); src.swap(at, other); }
            }
        }
        let c = vigil::compile("mutant.saql", &src);
        let _ = c.source().render(&c.diagnostics, false);
        let _ = c.source().to_json(&c.diagnostics);
    }
}

#[test]
fn an_error_inside_a_multibyte_character_does_not_panic() {
    // Found by tests/fuzz.rs: recovery looked for the next rule from inside U+202E.
    let c = vigil::compile("bidi.saql", "\u{202e}rule number_condition {\n  task t use machine m as e\n".as_bytes());
    assert!(!c.diagnostics.is_empty());
}
