//! Named columns of Trellis's own Parquet tables, read back into plain vectors with polars'
//! Parquet decoder: a run's totals (`trellis history`), its turn latencies (`compare`), the
//! scenarios' costs (`--shard`) and its checks (`calibrate`).
//!
//! Only the columns asked for are decoded. Numbers are read whatever their width, as
//! polars' casts read them: a value that does not fit the type asked for reads as null.

use std::fs::File;
use std::io::Cursor;
use std::path::Path;

use crate::contained::decode;
use polars_arrow::array::{
    Array, BooleanArray, ListArray, PrimitiveArray, Utf8Array, Utf8ViewArray,
};
use polars_arrow::datatypes::{ArrowDataType, Field};
use polars_error::{PolarsError, PolarsResult};
use polars_parquet::read::{
    BasicDecompressor, PageReader, column_iter_to_arrays, infer_schema, read_metadata,
};

/// The columns of one file that were asked for and that it has, each as the arrays of its
/// row groups.
pub(crate) struct Columns {
    rows: usize,
    columns: Vec<(String, Vec<Box<dyn Array>>)>,
}

fn damaged(why: String) -> PolarsError {
    PolarsError::ComputeError(why.into())
}

/// Reads the columns of `path` named in `names` that the file has.
pub(crate) fn read(path: &Path, names: &[&str]) -> PolarsResult<Columns> {
    let mut file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let metadata = decode(|| read_metadata(&mut file)).map_err(damaged)??;
    let schema = decode(|| infer_schema(&metadata)).map_err(damaged)??;
    let fields: Vec<&Field> = schema
        .iter_values()
        .filter(|field| names.contains(&field.name.as_str()))
        .collect();
    let mut columns: Vec<(String, Vec<Box<dyn Array>>)> = fields
        .iter()
        .map(|field| (field.name.to_string(), Vec::new()))
        .collect();
    let mut rows = 0;
    for group in &metadata.row_groups {
        rows += group.num_rows();
        for (field, (_, arrays)) in fields.iter().zip(columns.iter_mut()) {
            let chunks = group.columns_under_root_iter(&field.name).ok_or_else(|| {
                PolarsError::ComputeError(
                    format!("column `{}` is missing from a row group", field.name).into(),
                )
            })?;
            let mut pages = Vec::new();
            let mut types = Vec::new();
            for meta in chunks {
                let bytes = crate::dataset::read_chunk(&mut file, file_len, meta)
                    .and_then(|bytes| {
                        crate::dataset::check_pages(meta, &bytes, group.num_rows())?;
                        Ok(bytes)
                    })
                    .map_err(|e| PolarsError::ComputeError(e.to_string().into()))?;
                pages.push(BasicDecompressor::new(
                    PageReader::new(Cursor::new(bytes), meta, Vec::new(), usize::MAX),
                    Vec::new(),
                ));
                types.push(&meta.descriptor().descriptor.primitive_type);
            }
            let (read, _) = decode(|| column_iter_to_arrays(pages, types, (*field).clone(), None))
                .map_err(damaged)??;
            arrays.extend(read);
        }
    }
    Ok(Columns { rows, columns })
}

impl Columns {
    /// How many rows the file has.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    fn find(&self, name: &str) -> Option<&[Box<dyn Array>]> {
        self.columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, arrays)| arrays.as_slice())
    }

    fn arrays(&self, name: &str) -> PolarsResult<&[Box<dyn Array>]> {
        self.find(name)
            .ok_or_else(|| PolarsError::ColumnNotFound(format!("`{name}`").into()))
    }

    /// Whether the file has the column `name` (and it was asked for).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// A text column's values.
    pub(crate) fn strings(&self, name: &str) -> PolarsResult<Vec<Option<String>>> {
        let mut values = Vec::with_capacity(self.rows);
        for array in self.arrays(name)? {
            strings_of(array.as_ref(), name, &mut values)?;
        }
        Ok(values)
    }

    /// A numeric column's values as `f64`.
    pub(crate) fn floats(&self, name: &str) -> PolarsResult<Vec<Option<f64>>> {
        self.numbers(name, |n| match n {
            Number::Float(v) => Some(v),
            Number::Signed(v) => Some(v as f64),
            Number::Unsigned(v) => Some(v as f64),
        })
    }

    /// An integer column's values as `u64`; negative values and fractions read as null.
    pub(crate) fn unsigned(&self, name: &str) -> PolarsResult<Vec<Option<u64>>> {
        self.numbers(name, |n| match n {
            Number::Unsigned(v) => Some(v),
            Number::Signed(v) => u64::try_from(v).ok(),
            Number::Float(v) => {
                (v.fract() == 0.0 && v >= 0.0 && v <= u64::MAX as f64).then_some(v as u64)
            }
        })
    }

    /// A boolean column's values.
    pub(crate) fn bools(&self, name: &str) -> PolarsResult<Vec<Option<bool>>> {
        let mut values = Vec::with_capacity(self.rows);
        for array in self.arrays(name)? {
            let array = array
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| mismatch(name, "booleans", array.dtype()))?;
            values.extend(array.iter());
        }
        Ok(values)
    }

    /// A column of lists of text.
    pub(crate) fn string_lists(
        &self,
        name: &str,
    ) -> PolarsResult<Vec<Option<Vec<Option<String>>>>> {
        let mut values = Vec::with_capacity(self.rows);
        for array in self.arrays(name)? {
            match array.dtype() {
                ArrowDataType::LargeList(_) => lists_of::<i64>(array.as_ref(), name, &mut values)?,
                ArrowDataType::List(_) => lists_of::<i32>(array.as_ref(), name, &mut values)?,
                other => return Err(mismatch(name, "lists", other)),
            }
        }
        Ok(values)
    }

    fn numbers<T>(
        &self,
        name: &str,
        convert: impl Fn(Number) -> Option<T>,
    ) -> PolarsResult<Vec<Option<T>>> {
        let mut values = Vec::with_capacity(self.rows);
        for array in self.arrays(name)? {
            let array = array.as_ref();
            macro_rules! extend {
                ($t:ty, $variant:ident, $as:ty) => {
                    values.extend(
                        downcast::<PrimitiveArray<$t>>(array, name, "numbers")?
                            .iter()
                            .map(|v| v.and_then(|&v| convert(Number::$variant(v as $as)))),
                    )
                };
            }
            match array.dtype() {
                ArrowDataType::Int8 => extend!(i8, Signed, i64),
                ArrowDataType::Int16 => extend!(i16, Signed, i64),
                ArrowDataType::Int32 => extend!(i32, Signed, i64),
                ArrowDataType::Int64 => extend!(i64, Signed, i64),
                ArrowDataType::UInt8 => extend!(u8, Unsigned, u64),
                ArrowDataType::UInt16 => extend!(u16, Unsigned, u64),
                ArrowDataType::UInt32 => extend!(u32, Unsigned, u64),
                ArrowDataType::UInt64 => extend!(u64, Unsigned, u64),
                ArrowDataType::Float32 => extend!(f32, Float, f64),
                ArrowDataType::Float64 => extend!(f64, Float, f64),
                ArrowDataType::Null => values.extend((0..array.len()).map(|_| None)),
                other => return Err(mismatch(name, "numbers", other)),
            }
        }
        Ok(values)
    }
}

/// A value of a numeric column, whatever its width.
#[derive(Clone, Copy)]
enum Number {
    Signed(i64),
    Unsigned(u64),
    Float(f64),
}

fn strings_of(array: &dyn Array, name: &str, values: &mut Vec<Option<String>>) -> PolarsResult<()> {
    let owned = |s: Option<&str>| s.map(str::to_owned);
    match array.dtype() {
        ArrowDataType::Utf8View => values.extend(
            downcast::<Utf8ViewArray>(array, name, "text")?
                .iter()
                .map(owned),
        ),
        ArrowDataType::LargeUtf8 => values.extend(
            downcast::<Utf8Array<i64>>(array, name, "text")?
                .iter()
                .map(owned),
        ),
        ArrowDataType::Utf8 => values.extend(
            downcast::<Utf8Array<i32>>(array, name, "text")?
                .iter()
                .map(owned),
        ),
        ArrowDataType::Null => values.extend((0..array.len()).map(|_| None)),
        other => return Err(mismatch(name, "text", other)),
    }
    Ok(())
}

fn lists_of<O: polars_arrow::offset::Offset>(
    array: &dyn Array,
    name: &str,
    values: &mut Vec<Option<Vec<Option<String>>>>,
) -> PolarsResult<()> {
    let lists = downcast::<ListArray<O>>(array, name, "lists")?;
    for list in lists.iter() {
        values.push(match list {
            Some(list) => {
                let mut items = Vec::with_capacity(list.len());
                strings_of(list.as_ref(), name, &mut items)?;
                Some(items)
            }
            None => None,
        });
    }
    Ok(())
}

fn downcast<'a, T: 'static>(array: &'a dyn Array, name: &str, what: &str) -> PolarsResult<&'a T> {
    array
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| mismatch(name, what, array.dtype()))
}

fn mismatch(name: &str, what: &str, dtype: &ArrowDataType) -> PolarsError {
    PolarsError::SchemaMismatch(format!("column `{name}` holds {dtype:?}, not {what}").into())
}

#[cfg(test)]
mod tests {
    /// A run directory's table damaged on disk (`history`, `compare` and `calibrate` read
    /// them back) is an error, never a panic or an abort, whatever byte is wrong.
    #[test]
    fn a_damaged_table_is_an_error_whatever_byte_is_wrong() {
        let good = crate::dataset::tests::parquet_bytes();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.parquet");
        std::fs::write(&path, &good).unwrap();
        assert_eq!(super::read(&path, &["id", "name"]).unwrap().rows(), 3);
        let panicked = crate::dataset::tests::panicking_damage(&good, &path, |path| {
            let _ = super::read(path, &["id", "name"]);
        });
        assert!(
            panicked.is_empty(),
            "panicked at bytes {panicked:?} of {}",
            good.len()
        );
    }
}
