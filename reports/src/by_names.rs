//! Values kept per (suite, scenario, agent) while records stream by, for whatever counts
//! them (the report's tally, the console's summary) and orders them only at the end.
//!
//! Ordered maps keyed by copies of the names cost each record a copy of each name per map
//! and a search down each tree of string comparisons: the tally's four maps, seven copies,
//! were 4,700 instructions a trajectory with 20,000 scenarios (docs/performance.md, "The end
//! of big runs: what it reads back, sorts and frees"). Here a record's names are joined in a reused buffer, each after its
//! length so that no two lists of names join alike whatever characters they hold, and
//! looked up by that; they are copied only for a new entry.

use std::collections::HashMap;

/// Values by (suite, scenario, agent). See the module docs.
pub struct ByNames<V> {
    values: HashMap<Vec<u8>, V, foldhash::fast::FixedState>,
    /// The buffer a record's names are joined in to look them up.
    key: Vec<u8>,
}

impl<V> Default for ByNames<V> {
    fn default() -> Self {
        ByNames {
            values: HashMap::default(),
            key: Vec::new(),
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
    pub fn update(&mut self, names: [&str; 3], f: impl FnOnce(&mut V)) {
        joined(&mut self.key, names);
        match self.values.get_mut(self.key.as_slice()) {
            Some(value) => f(value),
            None => {
                let mut value = V::default();
                f(&mut value);
                self.values.insert(self.key.clone(), value);
            }
        }
    }

    /// Every entry, ordered by its names, leaving none.
    pub fn drain_sorted(&mut self) -> Vec<([String; 3], V)> {
        let held = self.values.len();
        let mut entries: Vec<([String; 3], V)> = self
            .values
            .drain()
            .filter_map(|(key, value)| {
                let [suite, scenario, agent] = split(&key)?;
                Some((
                    [suite.to_owned(), scenario.to_owned(), agent.to_owned()],
                    value,
                ))
            })
            .collect();
        // Every key was written by `joined`, and `split` reads each back.
        debug_assert_eq!(entries.len(), held, "a key that does not split");
        // The names tell every two entries apart: the order does not depend on the hashing.
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entries
    }
}

/// `names` joined in `into`, each after its length.
fn joined(into: &mut Vec<u8>, names: [&str; 3]) {
    into.clear();
    for name in names {
        into.extend_from_slice(&(name.len() as u64).to_le_bytes());
        into.extend_from_slice(name.as_bytes());
    }
}

/// The names [`joined`] wrote.
fn split(mut key: &[u8]) -> Option<[&str; 3]> {
    let mut names = [""; 3];
    for name in &mut names {
        let (len, rest) = key.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
        let (text, rest) = rest.split_at_checked(len)?;
        *name = std::str::from_utf8(text).ok()?;
        key = rest;
    }
    key.is_empty().then_some(names)
}

#[cfg(test)]
mod tests {
    use super::ByNames;

    /// Names that would join alike with a separator (one holding it, or shifted from one
    /// name into the next) keep their own values, and come back in their names' order.
    #[test]
    fn names_joined_by_length_never_run_together() {
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
            .map(|(names, n)| (names.to_vec(), n))
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
