//! The `raftmq` binary: parse the command line, set up logging, run.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = raftmq::cli::Cli::parse();
    raftmq::cli::init_tracing(&cli);
    match raftmq::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
