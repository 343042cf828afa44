//! The `shaderlm` command line; each subcommand lives in `cli/`, this file only parses and reports errors.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
