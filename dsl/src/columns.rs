//! Columns on lines of any length: a text's characters (what diagnostics count) or UTF-16
//! code units (what an editor counts) before any offset, read from running totals kept for
//! each block of the text instead of from the start of the offset's line. A suite written on
//! one line with thousands of mistakes counted that line again for each of them.

/// What a column counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Characters (Unicode scalar values), as diagnostics show columns.
    Char,
    /// UTF-16 code units, as the Language Server Protocol counts columns by default.
    Utf16,
}

impl Unit {
    /// The units of the characters that start in `bytes`: one for each byte that does not
    /// continue a character (`10xxxxxx`), and for UTF-16 a second for each four-byte one's
    /// first byte. Counted from bytes, so a count may start or end inside a character.
    pub fn count(self, bytes: &[u8]) -> usize {
        let starts = |b: u8| usize::from((b as i8) >= -0x40);
        match self {
            Unit::Char => bytes.iter().map(|&b| starts(b)).sum(),
            Unit::Utf16 => bytes
                .iter()
                .map(|&b| starts(b) + usize::from(b >= 0xF0))
                .sum(),
        }
    }
}

/// The bytes between two of [`BlockCounts`]'s totals.
pub const BLOCK: usize = 1024;

/// The [`Unit`]s before each [`BLOCK`] bytes of one text: the count before any offset reads
/// at most a block.
#[derive(Clone, Debug)]
pub struct BlockCounts {
    unit: Unit,
    /// The units before block `i`; one more entry than blocks, the last the whole text's.
    before: Box<[usize]>,
}

impl BlockCounts {
    pub fn new(text: &str, unit: Unit) -> Self {
        let bytes = text.as_bytes();
        let mut total = 0;
        let mut before = Vec::with_capacity(bytes.len() / BLOCK + 2);
        before.push(0);
        for block in bytes.chunks(BLOCK) {
            total += unit.count(block);
            before.push(total);
        }
        BlockCounts {
            unit,
            before: before.into_boxed_slice(),
        }
    }

    /// The units in `text[..offset]` (`text` the one these counts were made from, `offset`
    /// a character boundary; clamped to the text).
    fn before(&self, text: &str, offset: usize) -> usize {
        let bytes = text.as_bytes();
        let offset = offset.min(bytes.len());
        let block = offset / BLOCK;
        self.before.get(block).copied().unwrap_or(0)
            + self.unit.count(&bytes[block * BLOCK..offset])
    }

    /// The units in `text[from..to]`, both character boundaries, `from` not after `to`.
    pub fn between(&self, text: &str, from: usize, to: usize) -> usize {
        // Most columns are short: counted from `from` unless a block's total is nearer.
        if to.saturating_sub(from) <= BLOCK {
            return self
                .unit
                .count(text.as_bytes().get(from..to).unwrap_or_default());
        }
        self.before(text, to)
            .saturating_sub(self.before(text, from))
    }
}
