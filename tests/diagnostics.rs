//! Golden diagnostics: every `tests/diagnostics/*.saql` is a wrong rule file, and the matching
//! `.expected` file is its exact rendered error. Run with `VIGIL_BLESS=1` to rewrite the expected
//! files after a deliberate change to a message, then review the diff.

use std::path::Path;

#[test]
fn golden_diagnostics() {
    let dir = Path::new("tests/diagnostics");
    let mut cases: Vec<_> = std::fs::read_dir(dir)
        .expect("tests/diagnostics exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "saql"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 25, "only {} golden cases", cases.len());
    let bless = std::env::var_os("VIGIL_BLESS").is_some();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.to_str().expect("utf-8 path");
        let bytes = std::fs::read(case).expect("readable case");
        let compiled = vigil::compile(name, &bytes);
        assert!(!compiled.diagnostics.is_empty(), "{name} is meant to be wrong but checks clean");
        let rendered = compiled.source().render(&compiled.diagnostics, false);
        let expected_path = case.with_extension("expected");
        if bless {
            std::fs::write(&expected_path, &rendered).expect("writable expected file");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != rendered {
            failures.push(format!("--- {}\n{}\n+++ actual\n{}", expected_path.display(), expected, rendered));
        }
    }
    assert!(failures.is_empty(), "{} golden case(s) differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn json_diagnostics_carry_line_and_column() {
    let src = std::fs::read("tests/diagnostics/11_three_mistakes.saql").expect("case exists");
    let compiled = vigil::compile("three.saql", &src);
    let json = compiled.source().to_json(&compiled.diagnostics);
    let positions: Vec<(usize, usize, &str)> = json.iter().map(|d| (d.line, d.column, d.code)).collect();
    assert_eq!(positions, vec![(3, 37, "E0103"), (5, 12, "E0204"), (5, 27, "E0201")]);
    let value = serde_json::to_value(&json).expect("serialisable");
    assert_eq!(value[0]["file"], "three.saql");
    assert_eq!(value[0]["help"], "did you mean `cpu`?");
}
