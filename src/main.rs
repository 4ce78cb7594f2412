//! The `vigil` command line.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vigil::Compiled;

#[derive(Parser)]
#[command(name = "vigil", version, about = "Real-time anomaly detection for datacenters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check rule files (`*.saql`, or folders of them); exit 1 if any rule is invalid.
    Check {
        /// Files or folders to check.
        #[arg(default_value = "rules")]
        paths: Vec<PathBuf>,
        /// How to print problems.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print the plan each rule of a file compiles to.
    Explain {
        /// The rule file.
        file: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    /// Source lines with carets under each problem.
    Text,
    /// One JSON array of problems: file, line, column, code, message, labels, notes, help.
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { paths, format } => check(&paths, format),
        Command::Explain { file } => explain(&file),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// The `*.saql` files named by `paths`, folders walked recursively, in a stable order.
fn rule_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            walk(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "saql") {
            out.push(p);
        }
    }
    Ok(())
}

fn load(paths: &[PathBuf]) -> Result<Vec<Compiled>> {
    let files = rule_files(paths)?;
    let inputs = files
        .iter()
        .map(|f| {
            Ok((f.display().to_string(), std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(vigil::compile_all(&inputs))
}

fn check(paths: &[PathBuf], format: Format) -> Result<bool> {
    let compiled = load(paths)?;
    let problems: usize = compiled.iter().map(|c| c.diagnostics.len()).sum();
    match format {
        Format::Json => {
            let all: Vec<_> = compiled.iter().flat_map(|c| c.source().to_json(&c.diagnostics)).collect();
            println!("{}", serde_json::to_string_pretty(&all)?);
        }
        Format::Text => {
            let color = use_color();
            for c in &compiled {
                print!("{}", c.source().render(&c.diagnostics, color));
            }
            let rules: usize = compiled.iter().map(|c| c.rule_names.len()).sum();
            let bad_files = compiled.iter().filter(|c| !c.is_ok()).count();
            if problems == 0 {
                println!(
                    "ok: {} file{}, {rules} rule{} checked",
                    compiled.len(),
                    plural(compiled.len()),
                    plural(rules)
                );
            } else {
                println!(
                    "{problems} problem{} in {bad_files} of {} file{}",
                    plural(problems),
                    compiled.len(),
                    plural(compiled.len())
                );
            }
        }
    }
    Ok(problems == 0)
}

fn explain(file: &Path) -> Result<bool> {
    if std::fs::metadata(file).with_context(|| format!("cannot read {}", file.display()))?.is_dir() {
        bail!("{} is a folder; explain takes one rule file", file.display());
    }
    let compiled = load(&[file.to_path_buf()])?;
    let c = &compiled[0];
    if !c.is_ok() {
        print!("{}", c.source().render(&c.diagnostics, use_color()));
        return Ok(false);
    }
    for (i, plan) in c.plans.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{plan}");
    }
    Ok(true)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
