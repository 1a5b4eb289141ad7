//! The `raftmq` binary: parse the command line, set up logging, run.

use clap::Parser;

/// mimalloc, not glibc malloc: see its line in Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = match raftmq::cli::Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go to stdout as they are.
        Err(e) if !e.use_stderr() => e.exit(),
        // A usage error is one line (clap's first paragraph, which names
        // what is wrong), and a pointer to --help.
        Err(e) => {
            let text = e.render().to_string();
            let first: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            eprintln!("{} (see --help)", first.join(" "));
            return std::process::ExitCode::from(2);
        }
    };
    raftmq::cli::logging::init(cli.log_format);
    match raftmq::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
