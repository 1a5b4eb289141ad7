//! The `raftmq` binary: parse the command line, set up logging, run.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = match raftmq::cli::Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go to stdout as they are.
        Err(e) if !e.use_stderr() => e.exit(),
        // A usage error is one line (clap's first), and a pointer to --help.
        Err(e) => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: bad arguments");
            eprintln!("{first} (see --help)");
            return std::process::ExitCode::from(2);
        }
    };
    raftmq::cli::init_tracing(&cli);
    match raftmq::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
