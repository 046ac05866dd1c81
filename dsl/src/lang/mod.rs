//! The language as data: every node kind the suite language accepts is declared once as a
//! [`NodeSpec`], and every protocol as a [`ProtocolSpec`]. Decoding, the unknown / duplicate /
//! wrong-type diagnostics, `trellis check`, the language reference in docs/language.md and the
//! editor integration read these declarations; hand-written code remains only for what a node
//! means.

pub mod spec;

pub use spec::*;
