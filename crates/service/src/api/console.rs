//! The web console: one page and its assets, built into the binary (no CDN, no build step).
//! The page reads the same API as everyone else, with the token in a header when one is set.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// The console's files: name, content type, bytes.
const FILES: &[(&str, &str, &str)] = &[
    ("app.js", "text/javascript; charset=utf-8", include_str!("../../assets/console/app.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("../../assets/console/app.css")),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/console/vendor/uplot/uPlot.iife.min.js"),
    ),
    ("uPlot.min.css", "text/css; charset=utf-8", include_str!("../../assets/console/vendor/uplot/uPlot.min.css")),
];

const INDEX: &str = include_str!("../../assets/console/index.html");

/// Scripts and styles from this origin only; data from this origin only.
const POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
                      connect-src 'self'; frame-ancestors 'none'";

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

pub(super) async fn asset(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, ..)| *n == name) {
        Some((_, content_type, body)) => page(content_type, body),
        None => super::ApiError::new(StatusCode::NOT_FOUND, format!("no console file `{name}`")).into_response(),
    }
}
