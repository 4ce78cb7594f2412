//! Outlier detection over the groups of one window: DBSCAN, median absolute deviation and
//! z-score, each within a peer group.

use super::eval::{mean, sample_stddev, ClusterResult, MAX_PEERS};
use super::state::{percentile, percentile_of_sorted};
use std::sync::Arc;
use vigil_lang::plan::{ClusterMethod, Distance};

/// Sorted values, or [`MAX_PEERS`] of them evenly spaced in rank (the least and the greatest
/// always among them).
fn peer_sample(sorted: &[f64]) -> Arc<[f64]> {
    if sorted.len() <= MAX_PEERS {
        return sorted.into();
    }
    let last = sorted.len() - 1;
    (0..MAX_PEERS).map(|i| sorted[i * last / (MAX_PEERS - 1)]).collect()
}

/// Judges every point of one peer group. `points[i]` has the same number of dimensions for all
/// `i`; the summary (median, mean, MAD) is of the first dimension.
pub fn judge(points: &[Vec<f64>], method: ClusterMethod, distance: Distance) -> Vec<ClusterResult> {
    let first: Vec<f64> = points.iter().map(|p| p[0]).collect();
    if first.is_empty() {
        return Vec::new();
    }
    // Sorted once, for the median and the peers the evidence shows.
    let mut sorted = first.clone();
    sorted.sort_by(f64::total_cmp);
    let median = percentile_of_sorted(&sorted, 50.0);
    let deviations: Vec<f64> = first.iter().map(|x| (x - median).abs()).collect();
    let mad = percentile(&deviations, 50.0);
    let avg = mean(&first);
    let peers = peer_sample(&sorted);
    let summary = |outlier: bool, score: f64| ClusterResult {
        outlier,
        score,
        median,
        mean: avg,
        mad,
        size: points.len(),
        peers: peers.clone(),
    };
    match method {
        ClusterMethod::Dbscan { eps, min_pts } => {
            let noise = dbscan_noise(points, eps, min_pts as usize, distance);
            (0..points.len())
                .map(|i| {
                    let score = if noise[i] {
                        (0..points.len())
                            .filter(|&j| !noise[j])
                            .map(|j| dist(&points[i], &points[j], distance))
                            .fold(f64::INFINITY, f64::min)
                    } else {
                        0.0
                    };
                    summary(noise[i], score)
                })
                .collect()
        }
        ClusterMethod::Mad { threshold } => {
            // With more than half the values equal the MAD is 0; the mean absolute deviation,
            // scaled to match it on normal data, still measures spread.
            let spread = if mad > 0.0 { mad / 0.6745 } else { mean(&deviations) * 1.2533 };
            first
                .iter()
                .map(|x| {
                    let score = robust_score(*x - median, spread);
                    summary(score > threshold, score)
                })
                .collect()
        }
        ClusterMethod::ZScore { threshold } => {
            let sd = sample_stddev(&first).unwrap_or(0.0);
            first
                .iter()
                .map(|x| {
                    let score = robust_score(*x - avg, sd);
                    summary(score > threshold, score)
                })
                .collect()
        }
    }
}

/// |deviation| / spread, where no spread means no deviation is an outlier and any is.
fn robust_score(deviation: f64, spread: f64) -> f64 {
    if spread > 0.0 {
        deviation.abs() / spread
    } else if deviation == 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

fn dist(a: &[f64], b: &[f64], distance: Distance) -> f64 {
    let diffs = a.iter().zip(b).map(|(x, y)| (x - y).abs());
    match distance {
        Distance::Euclidean => diffs.map(|d| d * d).sum::<f64>().sqrt(),
        Distance::Manhattan => diffs.sum(),
        Distance::Chebyshev => diffs.fold(0.0, f64::max),
    }
}

/// DBSCAN; returns which points are noise (in no cluster). A point is a core point when at
/// least `min_pts` points, itself included, lie within `eps`; clusters grow from core points.
fn dbscan_noise(points: &[Vec<f64>], eps: f64, min_pts: usize, distance: Distance) -> Vec<bool> {
    let n = points.len();
    let neighbours: Vec<Vec<usize>> =
        (0..n).map(|i| (0..n).filter(|&j| dist(&points[i], &points[j], distance) <= eps).collect()).collect();
    let core: Vec<bool> = neighbours.iter().map(|nb| nb.len() >= min_pts).collect();
    let mut in_cluster = vec![false; n];
    let mut stack = Vec::new();
    for start in 0..n {
        if !core[start] || in_cluster[start] {
            continue;
        }
        in_cluster[start] = true;
        stack.push(start);
        while let Some(p) = stack.pop() {
            for &q in &neighbours[p] {
                if !in_cluster[q] {
                    in_cluster[q] = true;
                    if core[q] {
                        stack.push(q);
                    }
                }
            }
        }
    }
    in_cluster.iter().map(|c| !c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(xs: &[f64]) -> Vec<Vec<f64>> {
        xs.iter().map(|x| vec![*x]).collect()
    }

    #[test]
    fn dbscan_flags_the_point_far_from_the_rest() {
        let r = judge(
            &pts(&[0.50, 0.52, 0.51, 0.49, 0.05]),
            ClusterMethod::Dbscan { eps: 0.05, min_pts: 3 },
            Distance::Euclidean,
        );
        let flags: Vec<bool> = r.iter().map(|c| c.outlier).collect();
        assert_eq!(flags, vec![false, false, false, false, true]);
        assert!((r[4].score - 0.44).abs() < 1e-9);
        assert_eq!(r[0].median, 0.50);
    }

    #[test]
    fn mad_and_zscore() {
        let xs = pts(&[10.0, 11.0, 9.0, 10.5, 9.5, 10.0, 30.0]);
        let mad = judge(&xs, ClusterMethod::Mad { threshold: 3.5 }, Distance::Euclidean);
        assert!(mad[6].outlier && mad.iter().take(6).all(|c| !c.outlier));
        let z = judge(&xs, ClusterMethod::ZScore { threshold: 2.0 }, Distance::Euclidean);
        assert!(z[6].outlier && z.iter().take(6).all(|c| !c.outlier));
    }

    #[test]
    fn identical_peers_have_no_outlier_and_a_lone_difference_is_one() {
        let same = judge(&pts(&[1.0, 1.0, 1.0]), ClusterMethod::Mad { threshold: 3.5 }, Distance::Euclidean);
        assert!(same.iter().all(|c| !c.outlier));
        let one_off =
            judge(&pts(&[1.0, 1.0, 1.0, 1.0, 5.0]), ClusterMethod::Mad { threshold: 3.5 }, Distance::Euclidean);
        assert!(one_off[4].outlier);
    }
}

#[cfg(test)]
mod peer_tests {
    use super::*;

    #[test]
    fn the_peers_an_outlier_shows_are_all_of_a_small_group_and_a_rank_sample_of_a_large_one() {
        assert_eq!(&*peer_sample(&[1.0, 2.0, 3.0]), &[1.0, 2.0, 3.0]);
        let many: Vec<f64> = (0..1000).map(f64::from).collect();
        let sample = peer_sample(&many);
        assert_eq!(sample.len(), MAX_PEERS);
        assert_eq!((sample[0], sample[MAX_PEERS - 1]), (0.0, 999.0));
        assert!(sample.windows(2).all(|w| w[0] < w[1]));
        let judged = judge(
            &[vec![1.0], vec![1.1], vec![0.9], vec![9.0]],
            ClusterMethod::Mad { threshold: 3.5 },
            Distance::Euclidean,
        );
        assert!(judged.iter().all(|r| *r.peers == [0.9, 1.0, 1.1, 9.0]));
    }
}
