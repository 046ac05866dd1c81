//! Values kept per (suite, scenario, agent) while records stream by, for whatever counts
//! them (the report's tally, the console's summary) and orders them only at the end.
//!
//! Ordered maps keyed by copies of the names cost each record a copy of each name per map
//! and a search down each tree of string comparisons: the tally's four maps, seven copies,
//! were 4,700 instructions a trajectory with 20,000 scenarios (docs/performance.md, "The end
//! of big runs: what it reads back, sorts and frees"). Here the names are interned as the
//! statistics' are ([`crate::stats::Interner`]) and the values hashed by them, as the
//! statistics' entries are: a record's names are copied only the first time they come.

use crate::stats::{Interner, Name};

/// Values by (suite, scenario, agent). See the module docs.
pub struct ByNames<V> {
    names: Interner,
    values: std::collections::HashMap<(Name, Name, Name), V, foldhash::fast::FixedState>,
}

impl<V> Default for ByNames<V> {
    fn default() -> Self {
        ByNames {
            names: Interner::default(),
            values: Default::default(),
        }
    }
}

impl<V> std::fmt::Debug for ByNames<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByNames")
            .field("entries", &self.values.len())
            .finish()
    }
}

impl<V: Default> ByNames<V> {
    /// Applies `f` to the value of `names`, a default one if they have none yet.
    pub fn update(&mut self, [suite, scenario, agent]: [&str; 3], f: impl FnOnce(&mut V)) {
        let key = (
            self.names.get(suite),
            self.names.get(scenario),
            self.names.get(agent),
        );
        f(self.values.entry(key).or_default());
    }

    /// Every entry, ordered by its names, leaving none. The names are the interned ones,
    /// shared rather than copied: a dataset's 100,000 instances were 300,000 strings made
    /// for the console's summary and again for the report's tally, and freed after.
    pub fn drain_sorted(&mut self) -> Vec<((Name, Name, Name), V)> {
        let mut entries: Vec<((Name, Name, Name), V)> = self.values.drain().collect();
        // The names tell every two entries apart: the order does not depend on the hashing.
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::ByNames;

    /// Names that would run together if joined (one holding a separator, or shifted from
    /// one name into the next) keep their own values, and come back in their names' order.
    #[test]
    fn names_never_run_together() {
        let mut counts: ByNames<u32> = ByNames::default();
        for names in [
            ["s", "a\0b", "x"],
            ["s", "a", "\0bx"],
            ["sa", "", "bx"],
            ["s", "a\0b", "x"],
            ["s", "é", ""],
        ] {
            counts.update(names, |n| *n += 1);
        }
        let got: Vec<(Vec<String>, u32)> = counts
            .drain_sorted()
            .into_iter()
            .map(|((suite, scenario, agent), n)| {
                (
                    vec![suite.to_string(), scenario.to_string(), agent.to_string()],
                    n,
                )
            })
            .collect();
        let own = |names: [&str; 3]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            got,
            vec![
                (own(["s", "a", "\0bx"]), 1),
                (own(["s", "a\0b", "x"]), 2),
                (own(["s", "é", ""]), 1),
                (own(["sa", "", "bx"]), 1),
            ]
        );
        assert!(counts.drain_sorted().is_empty());
    }
}
