//! `trellis`: the command-line front end. Parses arguments, loads suites, and hands work to
//! the engine and the reporters; the commands live in [`cli`].

mod cli;
mod counting;

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// Stack of the thread that runs the command. Suite files are parsed and walked
/// recursively; a generous stack (reserved, not committed) turns absurdly deep nesting into
/// a long parse instead of a crash.
const STACK_SIZE: usize = 512 * 1024 * 1024;

fn main() -> ExitCode {
    counting::start_if_asked();
    // A completion script asking for candidates: answered, and the process exits.
    cli::answer_completion_request();
    // `dataset path="….parquet"`: the language crate reads CSV and JSON itself; Parquet
    // through polars, which only the reports crate links.
    trellis_dsl::dataset::register_reader(
        "parquet",
        std::sync::Arc::new(trellis_reports::dataset::ParquetRows),
    );
    let args = cli::Cli::parse();
    match std::thread::Builder::new()
        .name("trellis".into())
        .stack_size(STACK_SIZE)
        .spawn(move || cli::main(args))
    {
        Ok(command) => command.join().unwrap_or(ExitCode::from(cli::EXIT_FAILED)),
        // No thread: run on this one, with the default stack.
        Err(_) => cli::main(cli::Cli::parse()),
    }
}
