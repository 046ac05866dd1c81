//! Agreement statistics between two raters (a person and an LLM judge): Cohen's kappa and
//! raw agreement on categories, Pearson and Spearman correlation and the mean absolute error
//! on scores, each with a 95 % confidence interval.
//!
//! Pure functions over pairs; `trellis calibrate` ([`crate::calibration`]) feeds them. A
//! figure that cannot be computed (fewer than [`MIN_PAIRS`] pairs, a rater who gave every
//! item the same score, one category only) is a [`Figure`] without a value and with a
//! `note` saying why: never NaN, never a panic.
//!
//! Methods: kappa's standard error is the large-sample one of Fleiss, Cohen & Everitt
//! (1969), not the one that assumes kappa = 0, and its interval is kappa ± z·SE clipped to
//! [−1, 1]. Correlations use Fisher's z with SE 1/√(n−3) (Pearson) and √(1.06/(n−3))
//! (Spearman, Fieller, Hartley & Pearson 1957); Spearman ranks ties by their average rank.
//! The mean absolute error's interval is the t interval of the absolute differences,
//! clipped at 0.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// Fewer pairs than this and no figure is computed.
pub const MIN_PAIRS: usize = 3;

/// One agreement figure, or why there is none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// The estimate; `None` when it could not be computed (`note` says why).
    #[serde(default)]
    pub value: Option<f64>,
    /// Its standard error, where the method gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standard_error: Option<f64>,
    /// The 95 % confidence interval, `[low, high]`.
    #[serde(default)]
    pub ci95: Option<[f64; 2]>,
    /// Why the value or its interval is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Figure {
    fn missing(why: impl Into<String>) -> Figure {
        Figure {
            note: Some(why.into()),
            ..Figure::default()
        }
    }

    /// Keeps only finite numbers: a value that is not finite becomes a missing figure.
    fn checked(self) -> Figure {
        match self.value {
            Some(v) if v.is_finite() => Figure {
                standard_error: self.standard_error.filter(|s| s.is_finite()),
                ci95: self.ci95.filter(|[a, b]| a.is_finite() && b.is_finite()),
                ..self
            },
            Some(_) => Figure::missing("the computation did not give a finite number"),
            None => self,
        }
    }
}

/// The two-sided 95 % normal quantile (1.959964…).
fn z95() -> f64 {
    Normal::standard().inverse_cdf(0.975)
}

fn too_few(n: usize) -> Option<Figure> {
    (n < MIN_PAIRS).then(|| {
        Figure::missing(format!(
            "{n} pair{} (at least {MIN_PAIRS} are needed)",
            if n == 1 { "" } else { "s" }
        ))
    })
}

/// Share of pairs whose categories are equal, with a Wilson 95 % interval.
pub fn raw_agreement<S: AsRef<str>>(pairs: &[(S, S)]) -> Figure {
    if let Some(f) = too_few(pairs.len()) {
        return f;
    }
    let agree = pairs
        .iter()
        .filter(|(a, b)| a.as_ref() == b.as_ref())
        .count();
    let n = pairs.len() as u64;
    Figure {
        value: Some(agree as f64 / n as f64),
        ci95: crate::stats::wilson_interval(agree as u64, n, 0.95).map(|i| [i.low, i.high]),
        ..Figure::default()
    }
    .checked()
}

/// Cohen's kappa of (first rater, second rater) category pairs, with its standard error
/// and 95 % interval (see the module documentation).
pub fn cohen_kappa<S: AsRef<str>>(pairs: &[(S, S)]) -> Figure {
    if let Some(f) = too_few(pairs.len()) {
        return f;
    }
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for (a, b) in pairs {
        index.entry(a.as_ref()).or_insert(0);
        index.entry(b.as_ref()).or_insert(0);
    }
    for (i, slot) in index.values_mut().enumerate() {
        *slot = i;
    }
    let k = index.len();
    let n = pairs.len() as f64;
    // counts[i][j]: pairs where the first rater said i and the second j.
    let mut counts = vec![vec![0u64; k]; k];
    for (a, b) in pairs {
        if let (Some(&i), Some(&j)) = (index.get(a.as_ref()), index.get(b.as_ref()))
            && let Some(cell) = counts.get_mut(i).and_then(|row| row.get_mut(j))
        {
            *cell += 1;
        }
    }
    let row_counts: Vec<u64> = counts.iter().map(|row| row.iter().sum()).collect();
    let col_counts: Vec<u64> = (0..k)
        .map(|j| counts.iter().filter_map(|row| row.get(j)).sum())
        .collect();
    // The same as shares, for the standard error.
    let p: Vec<Vec<f64>> = counts
        .iter()
        .map(|row| row.iter().map(|&c| c as f64 / n).collect())
        .collect();
    let rows: Vec<f64> = row_counts.iter().map(|&c| c as f64 / n).collect();
    let cols: Vec<f64> = col_counts.iter().map(|&c| c as f64 / n).collect();
    let chance: f64 = rows.iter().zip(&cols).map(|(r, c)| r * c).sum();
    if 1.0 - chance < 1e-12 {
        return Figure::missing(
            "both raters used one and the same category for every item: kappa is undefined",
        );
    }
    // A rater who gave every item one category agrees with the other exactly as often as
    // chance predicts, so kappa is 0 whatever the agreement; the large-sample variance
    // degenerates with it (a "0.00 [0.00, 0.00]" read as a confident zero).
    let constant = |counts: &[u64]| counts.iter().filter(|&&c| c > 0).count() == 1;
    let one_category = |counts: &[u64]| {
        index
            .iter()
            .find(|&(_, &i)| counts.get(i).is_some_and(|&c| c > 0))
            .map_or("", |(name, _)| *name)
    };
    if constant(&col_counts) || constant(&row_counts) {
        let (who, counts) = if constant(&col_counts) {
            ("the judge", &col_counts)
        } else {
            ("the labels", &row_counts)
        };
        return Figure {
            value: Some(0.0),
            note: Some(format!(
                "{who} gave every item `{}`: kappa is 0 whatever the agreement, and has no \
                 interval",
                one_category(counts)
            )),
            ..Figure::default()
        };
    }
    // From the whole counts, one division: (n·agreed − Σ rowᵢ·colᵢ) / (n² − Σ rowᵢ·colᵢ).
    // From the shares, p_o = 0.8 and p_e = 0.5 gave 0.5999999999999999, and a judge exactly
    // at the default floor of 0.6 was marked below it.
    let total = pairs.len() as u128;
    let agreed: u128 = (0..k)
        .filter_map(|i| counts.get(i)?.get(i))
        .map(|&c| u128::from(c))
        .sum();
    let by_chance: u128 = row_counts
        .iter()
        .zip(&col_counts)
        .map(|(&r, &c)| u128::from(r) * u128::from(c))
        .sum();
    let kappa =
        ((total * agreed) as f64 - by_chance as f64) / ((total * total) as f64 - by_chance as f64);
    let spare = 1.0 - kappa;
    let mut diagonal = 0.0;
    let mut off_diagonal = 0.0;
    for (i, row) in p.iter().enumerate() {
        for (j, &pij) in row.iter().enumerate() {
            let (Some(&ri), Some(&ci), Some(&rj)) = (rows.get(i), cols.get(i), rows.get(j)) else {
                continue;
            };
            if i == j {
                diagonal += pij * (1.0 - (ri + ci) * spare).powi(2);
            } else {
                off_diagonal += pij * (ci + rj).powi(2);
            }
        }
    }
    let variance = (diagonal + spare * spare * off_diagonal - (kappa - chance * spare).powi(2))
        / (n * (1.0 - chance).powi(2));
    // Rounding can push a zero variance (perfect agreement) just below 0.
    let se = variance.max(0.0).sqrt();
    let half = z95() * se;
    Figure {
        value: Some(kappa),
        standard_error: Some(se),
        ci95: Some([(kappa - half).max(-1.0), (kappa + half).min(1.0)]),
        note: (se < 1e-12).then(|| {
            "the large-sample standard error is 0 when every item agrees; with few labels it \
             understates the uncertainty"
                .to_owned()
        }),
    }
    .checked()
}

/// Pearson's r of (first, second) score pairs, with a Fisher-z 95 % interval.
pub fn pearson(pairs: &[(f64, f64)]) -> Figure {
    correlation(pairs, 1.0)
}

/// Spearman's rho (Pearson's r of average ranks), with a Fisher-z 95 % interval.
pub fn spearman(pairs: &[(f64, f64)]) -> Figure {
    let first = average_ranks(pairs.iter().map(|p| p.0));
    let second = average_ranks(pairs.iter().map(|p| p.1));
    let ranked: Vec<(f64, f64)> = first.into_iter().zip(second).collect();
    correlation(&ranked, 1.06)
}

/// Ranks from 1, ties given the average of the ranks they span.
pub fn average_ranks(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let values: Vec<f64> = values.collect();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (values.get(a), values.get(b));
        x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let value = order.get(start).and_then(|&i| values.get(i));
        let mut end = start + 1;
        while end < order.len() && order.get(end).and_then(|&i| values.get(i)) == value {
            end += 1;
        }
        // Positions start..end hold ranks start+1..=end: their mean.
        let rank = (start + 1 + end) as f64 / 2.0;
        for &i in order.get(start..end).unwrap_or_default() {
            if let Some(slot) = ranks.get_mut(i) {
                *slot = rank;
            }
        }
        start = end;
    }
    ranks
}

/// Pearson's r with a Fisher-z interval whose variance is `variance_factor / (n − 3)`.
fn correlation(pairs: &[(f64, f64)], variance_factor: f64) -> Figure {
    if let Some(f) = too_few(pairs.len()) {
        return f;
    }
    if pairs.iter().any(|(a, b)| !a.is_finite() || !b.is_finite()) {
        return Figure::missing("a score is not a finite number");
    }
    let n = pairs.len() as f64;
    let mean_a = pairs.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_b = pairs.iter().map(|p| p.1).sum::<f64>() / n;
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (a, b) in pairs {
        let (da, db) = (a - mean_a, b - mean_b);
        sab += da * db;
        saa += da * da;
        sbb += db * db;
    }
    const FLAT: f64 = 1e-12;
    match (saa < FLAT, sbb < FLAT) {
        (true, true) => return Figure::missing("both raters gave every item the same score"),
        (true, false) => return Figure::missing("the human gave every item the same score"),
        (false, true) => return Figure::missing("the judge gave every item the same score"),
        (false, false) => {}
    }
    let r = (sab / (saa.sqrt() * sbb.sqrt())).clamp(-1.0, 1.0);
    if pairs.len() < 4 {
        return Figure {
            value: Some(r),
            note: Some("the interval needs at least 4 pairs".into()),
            ..Figure::default()
        }
        .checked();
    }
    let ci95 = if (1.0 - r.abs()) < 1e-12 {
        // Fisher's z is infinite at ±1: the interval collapses onto r.
        [r, r]
    } else {
        let z = r.atanh();
        let half = z95() * (variance_factor / (n - 3.0)).sqrt();
        [(z - half).tanh(), (z + half).tanh()]
    };
    Figure {
        value: Some(r),
        ci95: Some(ci95),
        ..Figure::default()
    }
    .checked()
}

/// Mean of |first − second|, with a Student-t 95 % interval clipped at 0.
pub fn mean_absolute_error(pairs: &[(f64, f64)]) -> Figure {
    if let Some(f) = too_few(pairs.len()) {
        return f;
    }
    let errors: Vec<f64> = pairs.iter().map(|(a, b)| (a - b).abs()).collect();
    if errors.iter().any(|e| !e.is_finite()) {
        return Figure::missing("a score is not a finite number");
    }
    let n = errors.len() as f64;
    let mean = errors.iter().sum::<f64>() / n;
    let variance = errors.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let se = (variance / n).sqrt();
    let ci95 = StudentsT::new(0.0, 1.0, n - 1.0)
        .ok()
        .map(|t| t.inverse_cdf(0.975) * se)
        .map(|half| [(mean - half).max(0.0), mean + half]);
    Figure {
        value: Some(mean),
        standard_error: Some(se),
        ci95,
        note: None,
    }
    .checked()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-5
    }

    fn pairs(table: &[(&'static str, &'static str, usize)]) -> Vec<(&'static str, &'static str)> {
        table
            .iter()
            .flat_map(|&(a, b, count)| std::iter::repeat_n((a, b), count))
            .collect()
    }

    #[test]
    fn a_kappa_of_exactly_the_floor_is_the_floor() {
        // 10 items: p_o = 0.8, p_e = 0.5: kappa is 0.6, which the shares gave as
        // 0.5999999999999999 (below the default floor of 0.6).
        let p = pairs(&[
            ("pass", "pass", 4),
            ("pass", "fail", 1),
            ("fail", "pass", 1),
            ("fail", "fail", 4),
        ]);
        assert_eq!(cohen_kappa(&p).value, Some(0.6));
    }

    #[test]
    fn kappa_of_the_textbook_two_by_two_table() {
        // 50 items: both yes 20, A yes B no 5, A no B yes 10, both no 15.
        // p_o = 0.7, p_e = 0.5·0.6 + 0.5·0.4 = 0.5, kappa = 0.2/0.5 = 0.4.
        // Fleiss-Cohen-Everitt variance, by hand: diagonal 0.4(1 − 1.1·0.6)² + 0.3(1 −
        // 0.9·0.6)² = 0.10972; off-diagonal 0.36(0.1·1.1² + 0.2·0.9²) = 0.10188; minus
        // (0.4 − 0.5·0.6)² = 0.01; over 50·0.25: 0.016128, SE 0.126996.
        let p = pairs(&[
            ("yes", "yes", 20),
            ("yes", "no", 5),
            ("no", "yes", 10),
            ("no", "no", 15),
        ]);
        let k = cohen_kappa(&p);
        assert!(close(k.value.unwrap(), 0.4), "{k:?}");
        assert!(
            close(k.standard_error.unwrap(), 0.016128_f64.sqrt()),
            "{k:?}"
        );
        let [low, high] = k.ci95.unwrap();
        assert!(close(low, 0.4 - 1.959964 * 0.126996), "{low}");
        assert!(close(high, 0.4 + 1.959964 * 0.126996), "{high}");
        let a = raw_agreement(&p);
        assert!(close(a.value.unwrap(), 0.7));
    }

    #[test]
    fn kappa_of_perfect_and_of_chance_agreement() {
        let p = pairs(&[("pass", "pass", 3), ("fail", "fail", 2)]);
        let k = cohen_kappa(&p);
        assert_eq!(k.value, Some(1.0));
        assert!(close(k.standard_error.unwrap(), 0.0));
        assert_eq!(k.ci95, Some([1.0, 1.0]));
        assert!(k.note.unwrap().contains("understates"));
        // The judge says pass to everything the human calls fail and vice versa.
        let p = pairs(&[("pass", "fail", 2), ("fail", "pass", 2)]);
        assert!(close(cohen_kappa(&p).value.unwrap(), -1.0));
    }

    #[test]
    fn degenerate_kappa_says_why() {
        let p = pairs(&[("pass", "pass", 5)]);
        let k = cohen_kappa(&p);
        assert_eq!(k.value, None);
        assert!(k.note.unwrap().contains("one and the same category"));
        let k = cohen_kappa(&pairs(&[("pass", "pass", 2)]));
        assert_eq!(k.value, None);
        assert!(k.note.unwrap().contains("at least 3"));
        let empty: Vec<(&str, &str)> = Vec::new();
        assert_eq!(cohen_kappa(&empty).value, None);
        // Each rater used one category, but not the same one: chance agreement is 0.
        let k = cohen_kappa(&pairs(&[("pass", "fail", 4)]));
        assert_eq!(k.value, Some(0.0));
        assert_eq!(k.ci95, None);
        // A judge that says `pass` to everything: kappa 0, no interval, and the note says so.
        let k = cohen_kappa(&pairs(&[("pass", "pass", 6), ("fail", "pass", 4)]));
        assert_eq!(k.value, Some(0.0));
        assert_eq!((k.ci95, k.standard_error), (None, None));
        let note = k.note.unwrap();
        assert!(
            note.starts_with("the judge gave every item `pass`"),
            "{note}"
        );
        let k = cohen_kappa(&pairs(&[("fail", "pass", 6), ("fail", "fail", 4)]));
        assert!(
            k.note
                .unwrap()
                .starts_with("the labels gave every item `fail`")
        );
    }

    #[test]
    fn pearson_and_spearman_of_known_data() {
        // x = 1..5, y = 2 1 4 3 5: deviations give Σxy = 8, Σx² = Σy² = 10, r = 0.8.
        let p: Vec<(f64, f64)> = [(1., 2.), (2., 1.), (3., 4.), (4., 3.), (5., 5.)].into();
        let r = pearson(&p);
        assert!(close(r.value.unwrap(), 0.8));
        // atanh(0.8) = 1.098612 ± 1.959964/√2 → tanh: [−0.279594, 0.986315].
        let [low, high] = r.ci95.unwrap();
        assert!(
            close(low, (1.098_612_3_f64 - 1.385_904_f64).tanh()),
            "{low}"
        );
        assert!(
            close(high, (1.098_612_3_f64 + 1.385_904_f64).tanh()),
            "{high}"
        );
        // The values are their own ranks: the same rho, a wider interval (1.06/(n−3)).
        let s = spearman(&p);
        assert!(close(s.value.unwrap(), 0.8));
        let half = 1.959964 * (1.06_f64 / 2.0).sqrt();
        assert!(close(s.ci95.unwrap()[0], (0.8_f64.atanh() - half).tanh()));
    }

    #[test]
    fn spearman_ranks_ties_by_their_average() {
        assert_eq!(
            average_ranks([1.0, 2.0, 2.0, 3.0].into_iter()),
            vec![1.0, 2.5, 2.5, 4.0]
        );
        // Ranks (1, 2.5, 2.5, 4) against (1, 3, 2, 4): Σ = 4.5, Σx² = 4.5, Σy² = 5,
        // rho = 4.5/√22.5 = 0.948683 (scipy.stats.spearmanr agrees).
        let p: Vec<(f64, f64)> = [(0.1, 0.1), (0.5, 0.7), (0.5, 0.6), (0.9, 0.8)].into();
        assert!(close(spearman(&p).value.unwrap(), 4.5 / 22.5_f64.sqrt()));
    }

    #[test]
    fn degenerate_correlations_say_why() {
        let flat_judge: Vec<(f64, f64)> = [(0.1, 0.5), (0.4, 0.5), (0.9, 0.5), (1.0, 0.5)].into();
        let r = pearson(&flat_judge);
        assert_eq!(r.value, None);
        assert!(
            r.note
                .unwrap()
                .contains("judge gave every item the same score")
        );
        let three: Vec<(f64, f64)> = [(0.1, 0.2), (0.5, 0.4), (0.9, 0.9)].into();
        let r = pearson(&three);
        assert!(r.value.is_some());
        assert_eq!(r.ci95, None);
        assert!(r.note.unwrap().contains("at least 4"));
        let perfect: Vec<(f64, f64)> = [(0.1, 0.2), (0.5, 0.6), (0.9, 1.0), (0.3, 0.4)].into();
        let r = pearson(&perfect);
        assert!(close(r.value.unwrap(), 1.0));
        assert_eq!(r.ci95, Some([1.0, 1.0]));
        assert_eq!(pearson(&[(0.1, 0.2)]).value, None);
    }

    #[test]
    fn mean_absolute_error_with_its_t_interval() {
        // |d| = 0.2 0 0.4 0: mean 0.15, sd √(0.11/3), se sd/2 = 0.0957427;
        // t(3, 0.975) = 3.182446: 0.15 ± 0.304694, the low end clipped at 0.
        let p: Vec<(f64, f64)> = [(0.0, 0.2), (0.5, 0.5), (1.0, 0.6), (0.8, 0.8)].into();
        let m = mean_absolute_error(&p);
        assert!(close(m.value.unwrap(), 0.15));
        assert!(close(m.standard_error.unwrap(), 0.095_742_7));
        assert_eq!(m.ci95.unwrap()[0], 0.0);
        assert!(close(m.ci95.unwrap()[1], 0.15 + 3.182446 * 0.095_742_7));
        assert_eq!(mean_absolute_error(&[(0.0, 1.0), (1.0, 0.0)]).value, None);
    }
}
