//! Polars' Parquet decoder panics on some damaged files (a footer whose thrift is cut short,
//! statistics of the wrong type, a column chunk without its offsets) instead of returning an
//! error. Every read of a file Trellis did not just write (a `dataset`, a run directory
//! someone copied) goes through [`decode`], so a damaged file is an error that names it,
//! not a crash with a backtrace.

use std::any::Any;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs the decoder: its panics are errors, not crashes, so the
    /// process's hook does not print them.
    static DECODING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `decode` (a call into polars' Parquet decoder), its panic an `Err` with the panic's
/// message. Other threads' panics are printed as before.
pub(crate) fn decode<T>(decode: impl FnOnce() -> T) -> Result<T, String> {
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !DECODING.get() {
                previous(info);
            }
        }));
    });
    let outer = DECODING.replace(true);
    let result = panic::catch_unwind(AssertUnwindSafe(decode));
    DECODING.set(outer);
    result.map_err(|payload| message(payload.as_ref()))
}

fn message(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    format!("the Parquet decoder failed on damaged data ({text})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_an_error_with_its_message_and_the_thread_goes_on() {
        let failed = decode(|| -> u8 { panic!("thrift bool field") });
        assert_eq!(
            failed,
            Err("the Parquet decoder failed on damaged data (thrift bool field)".to_string())
        );
        assert_eq!(decode(|| 7), Ok(7));
        assert!(!DECODING.get());
    }
}
