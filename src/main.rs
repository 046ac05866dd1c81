//! `trellis`: the command-line front end. Parses arguments, loads suites, and hands work to
//! the engine and the reporters; the commands live in [`cli`].

mod cli;
mod counting;
mod descriptors;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// Stack of the thread that runs the command. Suite files are parsed and walked
/// recursively; a generous stack (reserved, not committed) turns absurdly deep nesting into
/// a long parse instead of a crash.
const STACK_SIZE: usize = 512 * 1024 * 1024;

fn main() {
    counting::start_if_asked();
    // A completion script asking for candidates: answered, and the process exits.
    cli::answer_completion_request();
    // `dataset path="….parquet"`: the language crate reads CSV and JSON itself; Parquet
    // through polars, which only the reports crate links.
    trellis_dsl::dataset::register_reader(
        "parquet",
        std::sync::Arc::new(trellis_reports::dataset::ParquetRows),
    );
    let args = parse_args();
    // While this is the process's only thread: growing the table later stalls the thread
    // that opens the descriptor (the run's, as it connects).
    descriptors::reserve(args.descriptors_wanted());
    let code = match std::thread::Builder::new()
        .name("trellis".into())
        .stack_size(STACK_SIZE)
        .spawn(move || cli::main(args))
    {
        Ok(command) => command.join().unwrap_or(cli::EXIT_FAILED),
        // No thread: run on this one, with the default stack.
        Err(_) => cli::main(parse_args()),
    };
    exit(code)
}

/// The command line, or the process ends as clap ends it, except that help or a version
/// that cannot be written (stdout a full disk, a closed pipe's error aside) exits 3, as any
/// command whose output is lost does: clap's own exit said 0.
fn parse_args() -> cli::Cli {
    match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let shown = matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            );
            let written = e
                .print()
                .and_then(|()| std::io::Write::flush(&mut std::io::stdout()));
            match written {
                Err(lost) if shown && lost.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!(
                        "error: could not write to stdout ({lost}): its output is incomplete"
                    );
                    exit(cli::EXIT_INCOMPLETE)
                }
                _ => exit(u8::try_from(e.exit_code()).unwrap_or(cli::EXIT_INVALID)),
            }
        }
    }
}

/// Ends the process with `code` at once. Every file the command writes is written and closed
/// by now, and the threads still alive hold nothing to write (a pooled connection being
/// closed, idle workers). What the C library's exit handlers would add is mimalloc giving
/// every freed page back to the kernel, which reclaims them at exit anyway: about 4 ms of
/// `madvise` after a 2,000-trajectory run (docs/performance.md,
/// "What was slow, and why it is not any more").
fn exit(code: u8) -> ! {
    counting::report_now();
    cli::write_bench_phases();
    // stdout is line-buffered: a last line without its newline may be waiting.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // SAFETY: `_exit` ends the process without returning and runs no handler.
    unsafe { libc::_exit(i32::from(code)) }
}
