//! Run records: the stored schema, defined in the `trellis-records` crate (`records/`) so
//! that reading them needs nothing of the engine. Re-exported whole: `crate::record::X` is
//! the engine's one path to a record type, and this module is the engine's bottom layer
//! (`tests/it/layers.rs`).

pub use trellis_records::*;
