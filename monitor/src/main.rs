//! The `datapath-monitor` command line.

use std::process::ExitCode;

use clap::Parser as _;
use datapath_monitor::{
    agent, cli,
    config::{Cli, Command, Config, LogFormat},
    errors,
};
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: log files and journald get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) if args.dry_run => Config::resolve(*args)
            .map_err(anyhow::Error::from)
            .and_then(|config| Ok(config.to_toml()?))
            .map(|text| print!("{text}")),
        Command::Run(args) => match Config::resolve(*args) {
            Ok(config) => {
                init_logging(config.log_format);
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|runtime| runtime.block_on(agent::run(config)))
            }
            Err(error) => Err(error.into()),
        },
        Command::Status { server } => cli::status(&server).map(|text| print!("{text}")),
        Command::Incidents { server, json } => cli::incidents(&server, json).map(|text| print!("{text}")),
        Command::Detach { pin_dir } => datapath_monitor::datapath::detach_everything(&pin_dir)
            .map_err(anyhow::Error::from)
            .map(|text| println!("{text}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("datapath-monitor: {}", errors::chain(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}
