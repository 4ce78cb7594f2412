//! The runtime's threads: each runs the keyed partitions placed on it, one job at a time in
//! the order jobs were sent, and hands back the job's alerts and reply. A thread holds its
//! partitions by number (`None` for the partitions placed elsewhere), so that a partition can
//! move between threads ([`Lanes::place`]).

use super::partition::Partition;
use crate::alert::Alert;
use crate::engine::{EngineConfig, Shard};
use std::any::Any;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;
use vigil_lang::plan::RulePlan;

/// Batches in flight before the oldest one's alerts are waited for.
pub(crate) const DEPTH: usize = 16;

type Reply = Box<dyn Any + Send>;
type Job = Box<dyn FnOnce(&mut [Option<Partition>], &mut Vec<Alert>) -> Reply + Send>;

/// The threads, each with the partitions placed on it.
pub(crate) struct Lanes {
    work: Vec<SyncSender<Job>>,
    done: Vec<Receiver<(Vec<Alert>, Reply)>>,
    threads: Vec<JoinHandle<()>>,
    /// The thread of each partition.
    placed: Vec<usize>,
}

impl Lanes {
    /// `threads` threads (at least one, at most `partitions`) running `partitions` partitions,
    /// partition `p` on thread `p % threads` to begin with.
    pub(crate) fn start(plans: &[RulePlan], config: &EngineConfig, partitions: usize, threads: usize) -> Lanes {
        let threads = threads.clamp(1, partitions.max(1));
        let placed: Vec<usize> = (0..partitions).map(|p| p % threads).collect();
        let mut lanes = Lanes { work: Vec::new(), done: Vec::new(), threads: Vec::new(), placed: placed.clone() };
        for t in 0..threads {
            // The router's thread judges the fleet-wide rules ([`super::Runtime`]).
            let held: Vec<Option<Partition>> = (0..partitions)
                .map(|index| {
                    let config =
                        EngineConfig { shard: Shard { index, count: partitions }, clock: None, ..config.clone() };
                    (placed[index] == t).then(|| Partition::new(plans.to_vec(), config, false))
                })
                .collect();
            let (work_tx, work_rx) = sync_channel::<Job>(DEPTH + 1);
            let (done_tx, done_rx) = sync_channel(DEPTH + 1);
            let thread = std::thread::Builder::new()
                .name(format!("vigil-worker-{t}"))
                .spawn(move || run(held, work_rx, done_tx))
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

    /// The thread partition `p` runs on.
    pub(crate) fn thread_of(&self, p: usize) -> usize {
        self.placed[p]
    }

    /// Moves partitions to the threads `to` gives, by partition: they leave their threads in
    /// one round of jobs and join the new ones in the next. The caller has
    /// collected every job in flight.
    pub(crate) fn place(&mut self, to: &[usize]) {
        let moving: Vec<(usize, usize)> =
            (0..to.len()).filter(|&p| to[p] != self.placed[p]).map(|p| (p, self.placed[p])).collect();
        if moving.is_empty() {
            return;
        }
        for t in 0..self.count() {
            let leaving: Vec<usize> = moving.iter().filter(|m| m.1 == t).map(|m| m.0).collect();
            self.send_to(t, move |held, _| {
                leaving.into_iter().map(|p| (p, held[p].take().expect("placed here"))).collect::<Vec<_>>()
            });
        }
        let left: Vec<Vec<(usize, Partition)>> = self.recv(&mut Vec::new());
        let mut joining: Vec<Vec<(usize, Partition)>> = (0..self.count()).map(|_| Vec::new()).collect();
        for (p, partition) in left.into_iter().flatten() {
            joining[to[p]].push((p, partition));
        }
        for (t, arriving) in joining.into_iter().enumerate() {
            self.send_to(t, move |held, _| {
                for (p, partition) in arriving {
                    held[p] = Some(partition);
                }
            });
        }
        self.recv::<()>(&mut Vec::new());
        self.placed = to.to_vec();
    }

    /// Runs `job(its partitions by number, alerts)` on thread `t`, after the jobs sent to it
    /// before.
    pub(crate) fn send_to<R: Send + 'static>(
        &mut self,
        t: usize,
        job: impl FnOnce(&mut [Option<Partition>], &mut Vec<Alert>) -> R + Send + 'static,
    ) {
        let job: Job =
            Box::new(move |held: &mut [Option<Partition>], out: &mut Vec<Alert>| Box::new(job(held, out)) as Reply);
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

/// Threads for partitions by their load, most loaded first, each to the thread with the
/// least load so far (longest processing time first): within a third of the largest
/// partition's load of the best placement.
pub(crate) fn balanced(load: &[u64], threads: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..load.len()).collect();
    order.sort_by_key(|&p| (std::cmp::Reverse(load[p]), p));
    let mut total = vec![0u64; threads];
    let mut to = vec![0; load.len()];
    for p in order {
        let t = (0..threads).min_by_key(|&t| (total[t], t)).unwrap_or(0);
        total[t] += load[p];
        to[p] = t;
    }
    to
}

/// The load of the busiest thread under a placement.
pub(crate) fn busiest(load: &[u64], placed: impl Fn(usize) -> usize, threads: usize) -> u64 {
    let mut total = vec![0u64; threads];
    for (p, l) in load.iter().enumerate() {
        total[placed(p)] += l;
    }
    total.into_iter().max().unwrap_or(0)
}

fn run(mut held: Vec<Option<Partition>>, work: Receiver<Job>, done: SyncSender<(Vec<Alert>, Reply)>) {
    let mut out = Vec::new();
    for job in work {
        let reply = job(&mut held, &mut out);
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

#[cfg(test)]
mod tests {
    #[test]
    fn partitions_go_to_the_least_loaded_thread_heaviest_first() {
        let load = [50, 10, 10, 10, 10, 10, 40, 0];
        let to = super::balanced(&load, 2);
        assert_eq!(super::busiest(&load, |p| to[p], 2), 70);
        assert_eq!(super::busiest(&load, |p| p % 2, 2), 110, "by partition number");
        assert_eq!(super::balanced(&[], 3), Vec::<usize>::new());
    }
}
