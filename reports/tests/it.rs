//! Integration tests for `trellis-reports`: real journals in a temporary directory, every
//! output file read back.

mod it {
    mod browser;
    pub mod fixtures;
    mod html_junit;
    mod journal;
    mod parquet;
}
