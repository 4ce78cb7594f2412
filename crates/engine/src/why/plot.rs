//! An answer drawn as SVG: one panel per threshold test of the condition, the group's value
//! through the incident against the threshold as written and as changed.

use super::{Answer, GroupAnswer};
use crate::event::{format_time, Millis};
use std::fmt::Write;

const WIDTH: f64 = 760.0;
const PANEL: f64 = 130.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 28.0;

/// The SVG of `group`'s judgements in `answer`.
pub fn svg(answer: &Answer, group: &GroupAnswer) -> String {
    let panels: Vec<usize> = (0..answer.tests.len()).filter(|&t| answer.tests[t].threshold.is_some()).collect();
    let height = TOP + PANEL * panels.len().max(1) as f64 + 24.0;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(out, r#"<text x="{LEFT}" y="16" font-weight="bold">{}</text>"#, escape(&group.key));
    let _ = write!(
        out,
        r##"<text x="{}" y="16" text-anchor="end" fill="#555">value (blue), threshold (red dashes), changed (green dashes), held (dots), alert (red line)</text>"##,
        WIDTH - RIGHT
    );
    let (from, to) = (answer.from, answer.to.max(answer.from + 1));
    let x = |t: Millis| LEFT + (t - from) as f64 / (to - from) as f64 * (WIDTH - LEFT - RIGHT);
    for (i, &test) in panels.iter().enumerate() {
        let top = TOP + PANEL * i as f64;
        panel(&mut out, answer, group, test, top, &x);
    }
    let bottom = TOP + PANEL * panels.len().max(1) as f64 + 14.0;
    let _ = write!(out, r#"<text x="{LEFT}" y="{bottom}">{}</text>"#, format_time(from));
    let _ = write!(out, r#"<text x="{}" y="{bottom}" text-anchor="end">{}</text>"#, WIDTH - RIGHT, format_time(to));
    for a in &group.alerts {
        let ax = x(a.time);
        let _ = write!(
            out,
            r##"<line x1="{ax:.1}" x2="{ax:.1}" y1="{TOP}" y2="{:.1}" stroke="#c62828" stroke-width="2"><title>alert {} at {}</title></line>"##,
            bottom - 14.0,
            escape(&a.severity),
            format_time(a.time)
        );
    }
    out.push_str("</svg>");
    out
}

/// One test's panel: its values, its threshold, the change found for it.
fn panel(out: &mut String, answer: &Answer, group: &GroupAnswer, test: usize, top: f64, x: &dyn Fn(Millis) -> f64) {
    let shown = &answer.tests[test];
    let threshold = shown.threshold.unwrap_or(0.0);
    let change = answer.changes.iter().find_map(|c| c.literals().find(|m| m.0 == test)).map(|m| m.1);
    let values: Vec<(Millis, f64)> = group
        .points
        .iter()
        .filter_map(|p| Some((p.end, p.values.get(test).copied().flatten().filter(|v| v.is_finite())?)))
        .collect();
    let mut lo = values.iter().map(|v| v.1).fold(threshold, f64::min);
    let mut hi = values.iter().map(|v| v.1).fold(threshold, f64::max);
    if let Some(c) = change {
        (lo, hi) = (lo.min(c), hi.max(c));
    }
    let pad = ((hi - lo) * 0.08).max(1e-9);
    let (lo, hi) = (lo - pad, hi + pad);
    let height = PANEL - 22.0;
    let y = |v: f64| top + 14.0 + (hi - v) / (hi - lo) * height;
    let _ = write!(
        out,
        r##"<rect x="{LEFT}" y="{:.1}" width="{:.1}" height="{height:.1}" fill="#fafafa" stroke="#ddd"/>"##,
        top + 14.0,
        WIDTH - LEFT - RIGHT
    );
    let _ = write!(out, r#"<text x="{LEFT}" y="{:.1}">{}</text>"#, top + 10.0, escape(&shown.text));
    for v in [hi - pad, lo + pad] {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 4.0,
            y(v) + 4.0,
            crate::engine::shown_number(v)
        );
    }
    let line = |out: &mut String, v: f64, color: &str, label: &str| {
        let _ = write!(
            out,
            r#"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{color}" stroke-dasharray="5 3"><title>{label}</title></line>"#,
            WIDTH - RIGHT,
            y(v),
            y(v)
        );
    };
    line(out, threshold, "#c62828", &format!("threshold {}", crate::engine::shown_number(threshold)));
    if let Some(c) = change {
        line(out, c, "#2e7d32", &format!("changed to {}", crate::engine::shown_number(c)));
    }
    // The values as a line, broken where a window's value is unknown.
    let mut path = String::new();
    let mut last: Option<Millis> = None;
    let step = group.points.windows(2).map(|w| w[1].end - w[0].end).filter(|d| *d > 0).min().unwrap_or(1);
    for &(t, v) in &values {
        let joined = last.is_some_and(|l| t - l <= step);
        let _ = write!(path, "{}{:.1},{:.1} ", if joined { "L" } else { "M" }, x(t), y(v));
        last = Some(t);
    }
    let _ = write!(out, r##"<path d="{path}" fill="none" stroke="#1565c0" stroke-width="1.5"/>"##);
    for p in group.points.iter().filter(|p| p.held) {
        if let Some(v) = p.values.get(test).copied().flatten() {
            let _ = write!(out, r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#c62828"/>"##, x(p.end), y(v));
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
