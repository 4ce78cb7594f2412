//! What the unit tests share.

use std::path::PathBuf;

/// A file of the repository (the shipped rules, the samples) for the unit tests, which run in
/// this crate's folder.
pub(crate) fn repo_file(path: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}
