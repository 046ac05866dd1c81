//! Names to their positions in a list, for lists long enough that finding each name by a
//! scan would take the square of their length (a scenario may have 100,000 trajectories and
//! twice as many nodes).

use std::collections::HashMap;

/// Names a list is scanned for, past which it gets a [`Positions`] map: most scenarios have
/// a few trajectories, and a map each would cost more than it saves.
pub(crate) const SCANNED: usize = 32;

/// The distinct names of a sequence, each at its position among them in the order they
/// first come.
#[derive(Debug)]
pub(crate) struct Positions(HashMap<Box<str>, usize, foldhash::fast::RandomState>);

impl Positions {
    pub(crate) fn of<'n>(names: impl IntoIterator<Item = &'n str>) -> Self {
        let mut positions = Positions(HashMap::default());
        for name in names {
            positions.push(name);
        }
        positions
    }

    /// Adds `name` at the end, unless it is there already.
    pub(crate) fn push(&mut self, name: &str) {
        if !self.0.contains_key(name) {
            let next = self.0.len();
            self.0.insert(name.into(), next);
        }
    }

    /// Where `name` is, if it is.
    pub(crate) fn get(&self, name: &str) -> Option<usize> {
        self.0.get(name).copied()
    }

    /// Where `name` is; a name not among them is past their end.
    pub(crate) fn rank(&self, name: &str) -> usize {
        self.get(name).unwrap_or(self.0.len())
    }
}
