//! Statistics for the obliviousness tests: Pearson's chi-square tests of uniformity and of
//! independence, returning p-values so a test can state its significance level.

use statrs::distribution::{ChiSquared, ContinuousCDF};

/// Result of a chi-square test.
#[derive(Clone, Copy, Debug)]
pub struct ChiSquare {
    /// The statistic.
    pub statistic: f64,
    /// Degrees of freedom.
    pub dof: f64,
    /// Probability of a statistic at least this large under the null hypothesis.
    pub p_value: f64,
}

fn p_value(statistic: f64, dof: f64) -> f64 {
    let dist = ChiSquared::new(dof).expect("positive degrees of freedom");
    1.0 - dist.cdf(statistic)
}

/// Goodness of fit of `counts` to the uniform distribution over its bins.
///
/// Panics unless there are at least two bins and the expected count per bin is at least 5
/// (below that the chi-square approximation is not valid and the test would be meaningless).
pub fn uniformity(counts: &[u64]) -> ChiSquare {
    assert!(counts.len() >= 2, "need at least two bins");
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    assert!(
        expected >= 5.0,
        "expected count per bin {expected} < 5: use fewer bins or more samples"
    );
    let statistic = counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
    let dof = (counts.len() - 1) as f64;
    ChiSquare { statistic, dof, p_value: p_value(statistic, dof) }
}

/// Histogram of `samples` (each `< bins`).
pub fn histogram(samples: impl IntoIterator<Item = u64>, bins: u64) -> Vec<u64> {
    let mut h = vec![0u64; bins as usize];
    for s in samples {
        assert!(s < bins, "sample {s} outside 0..{bins}");
        h[s as usize] += 1;
    }
    h
}

/// Independence of two categorical variables from their paired observations `(a, b)` with
/// `a < rows`, `b < cols`. Rows or columns that were never observed are dropped.
///
/// Panics if an expected cell count is below 5 (use coarser categories).
pub fn independence(
    pairs: impl IntoIterator<Item = (u64, u64)>,
    rows: u64,
    cols: u64,
) -> ChiSquare {
    let mut table = vec![vec![0u64; cols as usize]; rows as usize];
    for (a, b) in pairs {
        table[a as usize][b as usize] += 1;
    }
    table.retain(|r| r.iter().any(|&c| c > 0));
    let col_sums: Vec<u64> = (0..cols as usize).map(|j| table.iter().map(|r| r[j]).sum()).collect();
    let keep: Vec<usize> = (0..cols as usize).filter(|&j| col_sums[j] > 0).collect();
    let total: u64 = col_sums.iter().sum();
    let row_sums: Vec<u64> = table.iter().map(|r| r.iter().sum()).collect();
    assert!(table.len() >= 2 && keep.len() >= 2, "need at least a 2x2 table");
    let mut statistic = 0.0;
    for (i, r) in table.iter().enumerate() {
        for &j in &keep {
            let e = row_sums[i] as f64 * col_sums[j] as f64 / total as f64;
            assert!(e >= 5.0, "expected count {e} < 5 in cell ({i},{j}): use coarser categories");
            statistic += (r[j] as f64 - e).powi(2) / e;
        }
    }
    let dof = ((table.len() - 1) * (keep.len() - 1)) as f64;
    ChiSquare { statistic, dof, p_value: p_value(statistic, dof) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn uniform_samples_pass_and_skewed_fail() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let h = histogram((0..10_000).map(|_| rng.gen_range(0..64)), 64);
        assert!(uniformity(&h).p_value > 0.001);
        // A mild skew: bin 0 gets 3% extra mass.
        let h = histogram(
            (0..10_000).map(|_| if rng.gen_bool(0.03) { 0 } else { rng.gen_range(0..64) }),
            64,
        );
        assert!(uniformity(&h).p_value < 1e-6);
        // A constant is as far from uniform as it gets.
        let h = histogram(std::iter::repeat_n(3, 1000), 8);
        assert!(uniformity(&h).p_value < 1e-12);
    }

    #[test]
    fn independence_detects_dependence() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let free: Vec<(u64, u64)> =
            (0..10_000).map(|_| (rng.gen_range(0..8), rng.gen_range(0..8))).collect();
        assert!(independence(free, 8, 8).p_value > 0.001);
        // b copies a one time in ten.
        let tied: Vec<(u64, u64)> = (0..10_000)
            .map(|_| {
                let a = rng.gen_range(0..8);
                (a, if rng.gen_bool(0.1) { a } else { rng.gen_range(0..8) })
            })
            .collect();
        assert!(independence(tied, 8, 8).p_value < 1e-6);
    }
}
