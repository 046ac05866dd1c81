//! `trellis`: the command-line front end. Parses arguments, loads suites, and hands work to
//! the engine and the reporters; the commands live in [`cli`].

mod cli;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::main(args)
}
