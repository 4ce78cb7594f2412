//! The runtime's threads: each runs its share of the keyed partitions, one job at a time in
//! the order jobs were sent, and hands back the job's alerts and reply.

use crate::alert::Alert;
use crate::engine::{Engine, EngineConfig, Shard};
use std::any::Any;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;
use vigil_lang::plan::RulePlan;

/// Batches in flight before the oldest one's alerts are waited for.
pub(crate) const DEPTH: usize = 4;

type Reply = Box<dyn Any + Send>;
type Job = Box<dyn FnOnce(&mut [Engine], &mut Vec<Alert>) -> Reply + Send>;

/// Where partition `p` runs among `threads`: on thread `p % threads`, at slot `p / threads` of
/// its engines.
pub(crate) fn place(partition: usize, threads: usize) -> (usize, usize) {
    (partition % threads, partition / threads)
}

/// The threads, each with the engines of its partitions.
pub(crate) struct Lanes {
    work: Vec<SyncSender<Job>>,
    done: Vec<Receiver<(Vec<Alert>, Reply)>>,
    threads: Vec<JoinHandle<()>>,
}

impl Lanes {
    /// `threads` threads (at least one, at most `partitions`) running `partitions` engines.
    pub(crate) fn start(plans: &[RulePlan], config: &EngineConfig, partitions: usize, threads: usize) -> Lanes {
        let threads = threads.clamp(1, partitions.max(1));
        let mut lanes = Lanes { work: Vec::new(), done: Vec::new(), threads: Vec::new() };
        for t in 0..threads {
            let engines: Vec<Engine> = (t..partitions)
                .step_by(threads)
                .map(|index| {
                    let shard = Shard { index, count: partitions };
                    Engine::new(plans.to_vec(), EngineConfig { shard, clock: None, ..config.clone() })
                })
                .collect();
            let (work_tx, work_rx) = sync_channel::<Job>(DEPTH + 1);
            let (done_tx, done_rx) = sync_channel(DEPTH + 1);
            let thread = std::thread::Builder::new()
                .name(format!("vigil-worker-{t}"))
                .spawn(move || run(engines, work_rx, done_tx))
                .expect("a worker thread starts");
            lanes.work.push(work_tx);
            lanes.done.push(done_rx);
            lanes.threads.push(thread);
        }
        lanes
    }

    pub(crate) fn count(&self) -> usize {
        self.threads.len()
    }

    /// Runs `job(thread, its engines, alerts)` on thread `t`, after the jobs sent to it before.
    pub(crate) fn send_to<R: Send + 'static>(
        &mut self,
        t: usize,
        job: impl FnOnce(&mut [Engine], &mut Vec<Alert>) -> R + Send + 'static,
    ) {
        let job: Job =
            Box::new(move |engines: &mut [Engine], out: &mut Vec<Alert>| Box::new(job(engines, out)) as Reply);
        if self.work[t].send(job).is_err() {
            self.join_failed();
        }
    }

    /// The oldest job's replies, by thread; its alerts from every thread go to `out`, in
    /// detection order.
    pub(crate) fn recv<R: 'static>(&mut self, out: &mut Vec<Alert>) -> Vec<R> {
        let from = out.len();
        let mut replies = Vec::with_capacity(self.done.len());
        for i in 0..self.done.len() {
            let Ok((alerts, reply)) = self.done[i].recv() else { self.join_failed() };
            out.extend(alerts);
            replies.push(*reply.downcast::<R>().expect("a job's reply has the type it was sent with"));
        }
        out[from..].sort_by_key(|a| a.detected_at);
        replies
    }

    /// A thread stopped: its panic goes on here, as one engine's would.
    fn join_failed(&mut self) -> ! {
        for thread in self.threads.drain(..) {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
        unreachable!("a worker stopped without a panic while work was in flight")
    }
}

fn run(mut engines: Vec<Engine>, work: Receiver<Job>, done: SyncSender<(Vec<Alert>, Reply)>) {
    let mut out = Vec::new();
    for job in work {
        let reply = job(&mut engines, &mut out);
        if done.send((std::mem::take(&mut out), reply)).is_err() {
            return;
        }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        // Closed both ways first, so that no thread waits to hand over results no one takes.
        self.done.clear();
        self.work.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
