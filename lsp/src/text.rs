//! Byte offsets (what the loader's spans hold) to LSP positions and back. LSP counts columns
//! in UTF-16 code units unless the client agrees to another encoding.

use lsp_types::{Position, Range};
use trellis_dsl::columns::{BlockCounts, Unit};

/// Where each line of one text starts and ends. Lines end at `\n`, `\r\n` and a lone `\r`,
/// as the LSP specification counts them (a file saved with classic Mac line ends is one
/// line to a count of `\n` alone).
pub struct LineIndex {
    starts: Vec<usize>,
    /// Where each line's text ends: its terminator's first byte, or the end of the text.
    ends: Vec<usize>,
    /// UTF-16 code units before each block of the text, so that a column is counted from
    /// the nearest block, not from its line's start: the outline of 20,000 scenarios written
    /// on one line (1.5 MB) took 90 s counting each symbol's columns.
    units: BlockCounts,
}

impl LineIndex {
    pub fn new(text: &str) -> Self {
        let bytes = text.as_bytes();
        let mut starts = vec![0];
        let mut ends = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\n' => {
                    ends.push(i);
                    starts.push(i + 1);
                }
                b'\r' => {
                    ends.push(i);
                    if bytes.get(i + 1) == Some(&b'\n') {
                        i += 1;
                    }
                    starts.push(i + 1);
                }
                _ => {}
            }
            i += 1;
        }
        ends.push(text.len());
        LineIndex {
            starts,
            ends,
            units: BlockCounts::new(text, Unit::Utf16),
        }
    }

    /// The position of byte `offset` (clamped to the text, moved back to a char boundary).
    pub fn position(&self, text: &str, offset: usize) -> Position {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.starts.partition_point(|&s| s <= offset) - 1;
        let start = self.starts[line];
        let character = self.units.between(text, start, offset);
        Position::new(line as u32, character as u32)
    }

    pub fn range(&self, text: &str, span: std::ops::Range<usize>) -> Range {
        Range::new(
            self.position(text, span.start),
            self.position(text, span.end),
        )
    }

    /// The byte offset of `pos`; past the end of its line is the line's end.
    pub fn offset(&self, text: &str, pos: Position) -> usize {
        let (Some(&start), Some(&end)) = (
            self.starts.get(pos.line as usize),
            self.ends.get(pos.line as usize),
        ) else {
            return text.len();
        };
        let mut units = 0u32;
        for (i, c) in text[start..end].char_indices() {
            if units >= pos.character {
                return start + i;
            }
            units += c.len_utf16() as u32;
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_dsl::columns::BLOCK;

    #[test]
    fn columns_count_utf16_units() {
        let text = "a\né𝄞x\n";
        let index = LineIndex::new(text);
        let x = text.find('x').unwrap();
        assert_eq!(index.position(text, x), Position::new(1, 3));
        assert_eq!(index.offset(text, Position::new(1, 3)), x);
        assert_eq!(index.offset(text, Position::new(1, 99)), text.len() - 1);
        assert_eq!(index.offset(text, Position::new(9, 0)), text.len());
    }

    #[test]
    fn a_column_is_the_code_units_from_its_line_start_across_blocks() {
        // One- to four-byte characters over several blocks, in short lines and in lines
        // longer than a block.
        let mut text = String::new();
        for i in 0..12 * BLOCK {
            let line_end = match i {
                _ if i < 2 * BLOCK && i % 9 == 8 => Some('\n'),
                _ if i < 4 * BLOCK && i % 9 == 8 => Some('\r'),
                _ if i % 3001 == 3000 => Some('\n'),
                _ => None,
            };
            text.push(line_end.unwrap_or(['a', 'é', '€', '𝄞', 'x'][i % 5]));
        }
        let index = LineIndex::new(&text);
        let offsets = (0..=text.len()).filter(|&o| text.is_char_boundary(o));
        for offset in offsets.step_by(7).chain([text.len()]) {
            let start = text[..offset].rfind(['\n', '\r']).map_or(0, |i| i + 1);
            let want: usize = text[start..offset].chars().map(char::len_utf16).sum();
            assert_eq!(
                index.position(&text, offset).character as usize,
                want,
                "at {offset}"
            );
        }
    }

    #[test]
    fn lines_end_at_lf_crlf_and_a_lone_cr() {
        for text in ["a\nbc x\n", "a\r\nbc x\r\n", "a\rbc x\r"] {
            let index = LineIndex::new(text);
            let x = text.find('x').unwrap();
            assert_eq!(index.position(text, x), Position::new(1, 3), "{text:?}");
            assert_eq!(index.offset(text, Position::new(1, 3)), x, "{text:?}");
            // Past the end of the line is its end, before its terminator.
            assert_eq!(index.offset(text, Position::new(1, 99)), x + 1, "{text:?}");
        }
    }
}
