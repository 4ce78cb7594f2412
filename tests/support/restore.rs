//! Runs events through an engine that is checkpointed after `cut` of them, through bytes as a
//! store would keep it, and restored into a fresh engine that takes the rest.

use vigil::alert::Alert;
use vigil::engine::{Engine, Snapshot};
use vigil::event::Event;

/// The alerts of the interrupted run, and how many rules the restore reported restored.
pub fn run_with_restore(engine: impl Fn() -> Engine, events: &[Event], cut: usize) -> (Vec<Alert>, usize) {
    let mut first = engine();
    let mut alerts = Vec::new();
    for e in &events[..cut] {
        first.push(e.clone(), &mut alerts);
    }
    let bytes = first.snapshot().expect("snapshot").to_bytes().expect("serialise");
    drop(first);
    let mut second = engine();
    let restored = second.restore(Snapshot::from_bytes(&bytes).expect("deserialise")).expect("restore");
    for e in &events[cut..] {
        second.push(e.clone(), &mut alerts);
    }
    second.flush(&mut alerts);
    (alerts, restored.len())
}
