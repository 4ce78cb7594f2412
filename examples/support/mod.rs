//! What the examples that drive a running `vigil serve` share.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Starts `command` (a `vigil serve` with `--http-addr 127.0.0.1:0`) and waits for the URL it
/// says it listens on. The child is killed if it does not say so within a minute.
pub fn start_vigil(command: &mut Command) -> (Child, String) {
    let mut child = command
        .env("VIGIL_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .expect("vigil starts (build it with cargo build --release)");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("vigil: listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(url) => (child, url),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vigil did not start");
        }
    }
}
