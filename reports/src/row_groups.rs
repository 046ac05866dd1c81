//! Writing a batch of a table as a Parquet row group, each column chunk encoded the way
//! polars' own writer would choose, without the work it spends choosing.
//!
//! polars' batched writer dictionary-encodes a string or float column chunk when its
//! values repeat: it estimates the distinct values with a HyperLogLog of 16,384 registers
//! (about 73 k instructions whatever the rows), and if fewer than three quarters of the rows
//! are distinct it builds the dictionary by hashing every value again. Nearly every column
//! of Trellis's tables repeats (the run id, suite, scenario, agent, status and check names,
//! a repeated scenario's messages), so for 2,000 trajectories that was 38 M instructions on
//! polars' worker threads, as many as the executor spends on 700 turns. Here one pass over a
//! chunk builds its dictionary and stops as soon as the distinct values pass that share:
//! the same decision, counted exactly instead of estimated, and no second pass. Every other
//! column (integers, booleans, lists) is encoded as polars would.
//!
//! The files have the same schema and read back the same values; only where the estimate
//! was off by enough to cross the threshold does a chunk's encoding differ.

use std::collections::HashMap;

use polars_arrow::array::{
    Array, DictionaryArray, MutableBinaryViewArray, PrimitiveArray, Utf8ViewArray,
};
use polars_arrow::datatypes::ArrowDataType;
use polars_error::{PolarsError, PolarsResult};
use polars_parquet::read::fallible_streaming_iterator;
use polars_parquet::write::{
    DynIter, DynStreamingIterator, Encoding, FileWriter, StatisticsOptions, WriteOptions,
    array_to_columns, compress, get_dtype_encoding,
};

/// Batches of at most this many rows are written with every column plainly encoded. polars
/// dictionary-encodes every column of a batch this small whatever it holds; a file reads
/// the same either way.
pub(crate) const PLAIN_ROWS: usize = 128;

/// A column chunk whose distinct values exceed this share of its rows is plainly encoded
/// (polars' threshold).
const DICTIONARY_MAX_SHARE: f64 = 0.75;

/// Writes one batch of a table, `rows` rows in `arrays` (one per column, in the file's
/// column order), as a row group of `writer`'s file with `options`.
pub(crate) fn write<W: std::io::Write>(
    writer: &mut FileWriter<W>,
    rows: usize,
    arrays: &[Box<dyn Array>],
    options: WriteOptions,
) -> PolarsResult<()> {
    if rows == 0 {
        return Ok(());
    }
    let fields = writer.parquet_schema().fields().to_vec();
    let plain = rows <= PLAIN_ROWS;
    let mut columns = Vec::with_capacity(fields.len());
    for (array, type_) in arrays.iter().zip(&fields) {
        let dictionary = if plain {
            None
        } else {
            dictionary_of(array.as_ref())
        };
        let options = if longest_text(array.as_ref()) > MAX_STATISTICS_TEXT {
            WriteOptions {
                statistics: StatisticsOptions {
                    min_value: false,
                    max_value: false,
                    ..options.statistics
                },
                ..options
            }
        } else {
            options
        };
        let (array, encodings): (&dyn Array, Vec<Encoding>) = match &dictionary {
            Some(dictionary) => (dictionary.as_ref(), vec![Encoding::RleDictionary]),
            None => (array.as_ref(), encodings_of(array.dtype(), plain)),
        };
        for pages in array_to_columns(array, type_.clone(), options, &encodings)? {
            columns.push(
                pages
                    .map(|page| {
                        page.and_then(|page| {
                            compress(page, Vec::new(), options.compression)
                                .map_err(PolarsError::from)
                        })
                    })
                    .collect::<PolarsResult<Vec<_>>>()?,
            );
        }
    }
    let group = DynIter::new(columns.iter().map(|pages| {
        Ok(DynStreamingIterator::new(
            fallible_streaming_iterator::convert(pages.iter().map(PolarsResult::Ok)),
        ))
    }));
    writer.write(rows as u64, group)
}

/// A text column chunk holding a value longer than this is written without its minimum and
/// maximum: polars copies both whole before truncating them to the 64 bytes the file keeps,
/// twice an agent's largest answer for a statistic nobody filters free text on.
const MAX_STATISTICS_TEXT: usize = 64 * 1024;

/// The length of the longest value of a text column (0 for other columns).
fn longest_text(array: &dyn Array) -> usize {
    array
        .as_any()
        .downcast_ref::<Utf8ViewArray>()
        .and_then(|text| text.views().iter().map(|view| view.length).max())
        .map_or(0, |length| length as usize)
}

/// polars' encodings for a column of `dtype`, except that strings and floats (whose
/// dictionary, if any, [`dictionary_of`] has already decided on) and every column of a
/// plain batch are plainly encoded. An integer column keeps polars' dictionary attempt,
/// which for integers is a cheap pass over their range.
fn encodings_of(dtype: &ArrowDataType, plain: bool) -> Vec<Encoding> {
    let decided = matches!(
        dtype,
        ArrowDataType::Utf8View | ArrowDataType::Float64 | ArrowDataType::Float32
    );
    get_dtype_encoding(dtype)
        .into_iter()
        .map(|e| match e {
            Encoding::RleDictionary if plain || decided => Encoding::Plain,
            e => e,
        })
        .collect()
}

/// `array` as a dictionary of its distinct values, if it is a string or float column
/// whose distinct values are at most [`DICTIONARY_MAX_SHARE`] of its rows.
fn dictionary_of(array: &dyn Array) -> Option<Box<dyn Array>> {
    match array.dtype() {
        ArrowDataType::Utf8View => {
            strings_dictionary(array.as_any().downcast_ref::<Utf8ViewArray>()?)
        }
        ArrowDataType::Float64 => {
            floats_dictionary(array.as_any().downcast_ref::<PrimitiveArray<f64>>()?)
        }
        _ => None,
    }
}

/// The most distinct values a dictionary of `rows` rows may hold.
fn most_distinct(rows: usize) -> usize {
    (rows as f64 * DICTIONARY_MAX_SHARE) as usize
}

fn strings_dictionary(array: &Utf8ViewArray) -> Option<Box<dyn Array>> {
    let most = most_distinct(array.len());
    let mut index: HashMap<&str, u32, foldhash::fast::FixedState> =
        HashMap::with_hasher(foldhash::fast::FixedState::default());
    let mut values = MutableBinaryViewArray::<str>::new();
    let mut keys = Vec::with_capacity(array.len());
    let mut last: Option<(&str, u32)> = None;
    for value in array.iter() {
        let key = match value {
            // A null row's key is never read (the validity says it is null); 0 is always
            // in range once there is a value.
            None => 0,
            // Rows often repeat the row before.
            Some(v) => match last {
                Some((l, key)) if l == v => key,
                _ => {
                    let next = u32::try_from(index.len()).ok()?;
                    let key = *index.entry(v).or_insert_with(|| {
                        values.push_value(v);
                        next
                    });
                    if index.len() > most {
                        return None;
                    }
                    last = Some((v, key));
                    key
                }
            },
        };
        keys.push(key);
    }
    dictionary(keys, array.validity().cloned(), values.freeze().boxed())
}

fn floats_dictionary(array: &PrimitiveArray<f64>) -> Option<Box<dyn Array>> {
    let most = most_distinct(array.len());
    // Keyed by bits: every NaN payload and both zeros are values of their own, as the
    // dictionary page writes them.
    let mut index: HashMap<u64, u32, foldhash::fast::FixedState> =
        HashMap::with_hasher(foldhash::fast::FixedState::default());
    let mut values = Vec::new();
    let mut keys = Vec::with_capacity(array.len());
    for value in array.iter() {
        let key = match value {
            None => 0,
            Some(&v) => {
                let next = u32::try_from(index.len()).ok()?;
                let key = *index.entry(v.to_bits()).or_insert_with(|| {
                    values.push(v);
                    next
                });
                if index.len() > most {
                    return None;
                }
                key
            }
        };
        keys.push(key);
    }
    dictionary(
        keys,
        array.validity().cloned(),
        PrimitiveArray::from_vec(values).boxed(),
    )
}

fn dictionary(
    keys: Vec<u32>,
    validity: Option<polars_arrow::bitmap::Bitmap>,
    values: Box<dyn Array>,
) -> Option<Box<dyn Array>> {
    // A column with no value at all is plainly encoded: nothing to look up.
    if values.is_empty() {
        return None;
    }
    let keys = PrimitiveArray::new(ArrowDataType::UInt32, keys.into(), validity);
    DictionaryArray::<u32>::try_from_keys(keys, values, false)
        .ok()
        .map(|d| d.boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dictionary array's keys, row by row, and its values as a `V` array.
    fn parts<V: Array + 'static>(array: &dyn Array) -> (Vec<Option<usize>>, &V) {
        let dictionary = array
            .as_any()
            .downcast_ref::<DictionaryArray<u32>>()
            .expect("a dictionary");
        let values = dictionary
            .values()
            .as_any()
            .downcast_ref::<V>()
            .expect("values of the type asked for");
        let keys = dictionary.keys().iter().map(|k| k.map(|&k| k as usize));
        (keys.collect(), values)
    }

    /// The strings a dictionary array stands for, row by row.
    fn strings(array: &dyn Array) -> Vec<Option<String>> {
        let (keys, values) = parts::<Utf8ViewArray>(array);
        keys.into_iter()
            .map(|key| key.map(|k| values.value(k).to_string()))
            .collect()
    }

    #[test]
    fn repeated_strings_become_a_dictionary_of_the_distinct_ones() {
        let rows = [Some("a"), Some("b"), None, Some("a"), Some("a"), Some("b")];
        let array = Utf8ViewArray::from_slice(rows);
        let dictionary = dictionary_of(&array).expect("4 of 6 rows repeat");
        let expected: Vec<Option<String>> = rows.iter().map(|r| r.map(str::to_string)).collect();
        assert_eq!(strings(dictionary.as_ref()), expected);
        let (_, values) = parts::<Utf8ViewArray>(dictionary.as_ref());
        assert_eq!(values.len(), 2);
    }

    #[test]
    fn mostly_distinct_or_empty_columns_stay_plain() {
        // 4 distinct of 5 rows is over three quarters.
        let array = Utf8ViewArray::from_slice_values(["a", "b", "c", "d", "a"]);
        assert!(dictionary_of(&array).is_none());
        // 3 of 4 is not.
        let array = Utf8ViewArray::from_slice_values(["a", "b", "c", "a"]);
        assert!(dictionary_of(&array).is_some());
        let nulls = Utf8ViewArray::from_slice([None::<&str>, None, None]);
        assert!(dictionary_of(&nulls).is_none());
        let floats = PrimitiveArray::<f64>::from_vec(vec![1.0, 2.0, 3.0, 4.0, 1.0]);
        assert!(dictionary_of(&floats).is_none());
    }

    #[test]
    fn repeated_floats_keep_their_bits() {
        let rows = [
            Some(0.5),
            Some(-0.0),
            None,
            Some(0.5),
            Some(0.0),
            Some(-0.0),
            Some(0.5),
        ];
        let array: PrimitiveArray<f64> = rows.iter().collect();
        let dictionary = dictionary_of(&array).expect("3 of 6 values are distinct");
        let (keys, values) = parts::<PrimitiveArray<f64>>(dictionary.as_ref());
        let read: Vec<Option<u64>> = keys
            .into_iter()
            .map(|k| k.map(|k| values.value(k).to_bits()))
            .collect();
        let expected: Vec<Option<u64>> = rows.iter().map(|r| r.map(f64::to_bits)).collect();
        assert_eq!(read, expected);
    }
}
