//! Golden diagnostics: every `tests/diagnostics/*.saql` is a wrong rule file, and the matching
//! `.expected` file is its exact rendered error. Run with `VIGIL_BLESS=1` to rewrite the expected
//! files after a deliberate change to a message, then review the diff.

use std::path::Path;

/// Compiles one golden case and compares its rendered problems with the expected file.
fn golden(case: &str) {
    let name = format!("tests/diagnostics/{case}.saql");
    let bytes = std::fs::read(&name).expect("readable case");
    let compiled = vigil::compile(&name, &bytes);
    assert!(!compiled.diagnostics.is_empty(), "{name} is meant to be wrong but checks clean");
    let rendered = compiled.source().render(&compiled.diagnostics, false);
    let expected_path = Path::new(&name).with_extension("expected");
    if std::env::var_os("VIGIL_BLESS").is_some() {
        std::fs::write(&expected_path, &rendered).expect("writable expected file");
        return;
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    assert_eq!(expected, rendered, "{} differs (VIGIL_BLESS=1 rewrites it)", expected_path.display());
}

/// One test per golden case, so that each runs alone (`cargo test --test suite diagnostics::case_05`).
macro_rules! golden_cases {
    ($($test:ident => $case:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                golden($case);
            }
        )*

        const CASES: &[&str] = &[$($case),*];
    };
}

golden_cases! {
    case_01_unknown_field => "01_unknown_field",
    case_02_unknown_operation => "02_unknown_operation",
    case_03_wrong_object => "03_wrong_object",
    case_04_unknown_name => "04_unknown_name",
    case_05_type_mismatch => "05_type_mismatch",
    case_06_history_out_of_range => "06_history_out_of_range",
    case_07_unbounded_sequence => "07_unbounded_sequence",
    case_08_missing_with => "08_missing_with",
    case_09_syntax_missing_brace => "09_syntax_missing_brace",
    case_10_syntax_bad_clause => "10_syntax_bad_clause",
    case_11_three_mistakes => "11_three_mistakes",
    case_12_aggregate_outside_state => "12_aggregate_outside_state",
    case_13_not_boolean => "13_not_boolean",
    case_14_unknown_severity => "14_unknown_severity",
    case_15_window_without_state => "15_window_without_state",
    case_16_state_without_window => "16_state_without_window",
    case_17_slide_not_divisor => "17_slide_not_divisor",
    case_18_invariant_mode => "18_invariant_mode",
    case_19_invariant_undeclared => "19_invariant_undeclared",
    case_20_cluster_method => "20_cluster_method",
    case_21_cluster_without_state => "21_cluster_without_state",
    case_22_foreign_variable => "22_foreign_variable",
    case_23_not_a_group_key => "23_not_a_group_key",
    case_24_entity_conflict => "24_entity_conflict",
    case_25_bad_regex => "25_bad_regex",
    case_26_duration_needs_unit => "26_duration_needs_unit",
    case_27_absence_first => "27_absence_first",
    case_28_duplicate_rule => "28_duplicate_rule",
    case_29_bad_escape => "29_bad_escape",
    case_30_template_hole => "30_template_hole",
    case_31_unclosed_comment => "31_unclosed_comment",
    case_32_entity_field_on_event => "32_entity_field_on_event",
    case_33_absent_event_used => "33_absent_event_used",
    case_34_uppercase_string => "34_uppercase_string",
    case_35_too_deep => "35_too_deep",
    case_36_count_range => "36_count_range",
    case_37_count_not_first => "37_count_not_first",
    case_38_huge_history_index => "38_huge_history_index",
    case_39_window_bomb => "39_window_bomb",
    case_40_state_too_large => "40_state_too_large",
    case_41_bad_format => "41_bad_format",
    case_42_score_without_state => "42_score_without_state",
    case_43_scorer_outside_score => "43_scorer_outside_score",
    case_44_scorer_parameter => "44_scorer_parameter",
    case_45_interval_outside_absence => "45_interval_outside_absence",
    case_46_rollup_not_a_key_field => "46_rollup_not_a_key_field",
    case_47_rollup_without_state => "47_rollup_without_state",
    case_48_stream_declared_twice => "48_stream_declared_twice",
    case_49_field_declaration => "49_field_declaration",
    case_50_binding_without_key => "50_binding_without_key",
    case_51_operation_declaration => "51_operation_declaration",
    case_52_unknown_kind_in_pattern => "52_unknown_kind_in_pattern",
    case_53_state_filter_not_a_condition => "53_state_filter_not_a_condition",
    case_54_predict_linear_ahead => "54_predict_linear_ahead",
    case_55_state_filter_reads_state => "55_state_filter_reads_state",
    case_56_state_filter_aggregate => "56_state_filter_aggregate",
}

#[test]
fn every_golden_file_has_its_test() {
    let mut files: Vec<String> = std::fs::read_dir("tests/diagnostics")
        .expect("tests/diagnostics exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "saql"))
        .map(|p| p.file_stem().expect("a name").to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, CASES, "add the new case to golden_cases!");
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
