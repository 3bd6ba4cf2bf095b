//! `ledger-captive-core`: stands in for stellar-core under the Go SDK's `CaptiveStellarCore`
//! and streams verified ledgers from relays (see `ledger_relay_subscriber_bin::captive` and
//! docs/rpc.md). Answers the commands the SDK runs; exits non-zero with one line on stderr on
//! failure.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ledger_relay_cli::{logging, LogFormat};
use ledger_relay_subscriber::SubscribeConfig;
use ledger_relay_subscriber_bin::captive::{
    anchored_start, catchup_range, parse_args, run_start, stream, version_text, CaptiveError,
    Command, CoreConf, Serve, Settings, State,
};
use ledger_relay_subscriber_bin::cli;

const PROGRAM: &str = "ledger-captive-core";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.as_slice(), [a] if a == "--help" || a == "-h" || a == "help") {
        print!("{}", help());
        return ExitCode::SUCCESS;
    }
    logging::init(LogFormat::Text, "warn");
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let below = match &e {
                CaptiveError::Subscribe(s) => Some(s),
                _ => None,
            };
            cli::report_failure(LogFormat::Text, PROGRAM, &e, below);
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(args: &[String]) -> Result<(), CaptiveError> {
    let command = parse_args(args)?;
    // One line per command, as core logs its own start: the SDK copies it into its log.
    eprintln!("{PROGRAM}: {}", args.join(" "));
    let env: HashMap<String, String> = std::env::vars().collect();
    let dir = PathBuf::from(".");
    match command {
        Command::Version => {
            let settings = Settings::load(&env)?;
            let state = State::find(&dir);
            print!(
                "{}",
                version_text(settings.protocol_version(state.as_ref()))
            );
            Ok(())
        }
        // A fresh database at ledger 1.
        Command::NewDb => State::move_to(&dir, 1),
        Command::OfflineInfo => {
            let settings = Settings::load(&env)?;
            let state = State::load(&dir)?.ok_or_else(|| CaptiveError::NoDatabase(cwd()))?;
            let protocol = settings.protocol_version(Some(&state));
            let build = version_text(protocol);
            print!(
                "{}",
                state.info_json(build.lines().next().unwrap_or(""), protocol)
            );
            Ok(())
        }
        // Without a metadata stream core only applies the ledgers; here that is recording where
        // `run` resumes.
        Command::Catchup {
            to, stream: None, ..
        }
        | Command::Catchup { to, count: 0, .. } => State::move_to(&dir, to),
        Command::Catchup {
            to,
            count,
            stream: Some(fd),
            conf,
        } => {
            let settings = Settings::load(&env)?;
            let (start, wanted) = catchup_range(to, count, settings.checkpoint_frequency())?;
            let at = anchored_start(start, None, settings.anchor()?)?;
            let config = settings.subscription(at.from, at.anchor)?;
            let runtime = runtime()?;
            let serve = serve(&settings, &config, conf.as_deref())?;
            let (written, _) = runtime.block_on(stream(
                config,
                Some(wanted),
                fd,
                &dir,
                at.write_from,
                serve,
                cli::shutdown_signal(),
            ))?;
            if written < wanted {
                // Stopped by a signal before the end, as core would be: non-zero.
                return Err(CaptiveError::Usage(format!(
                    "stopped after {written} of {wanted} ledgers"
                )));
            }
            Ok(())
        }
        Command::Run {
            stream: fd,
            conf,
            start_at,
            start_hash,
        } => {
            let settings = Settings::load(&env)?;
            let state = State::load(&dir)?.ok_or_else(|| CaptiveError::NoDatabase(cwd()))?;
            let (from, anchor) = run_start(state, start_at, start_hash)?;
            let Some(fd) = fd else {
                return Err(CaptiveError::Usage(
                    "run without --metadata-output-stream: nothing to do".into(),
                ));
            };
            let at = anchored_start(from, anchor, settings.anchor()?)?;
            let config = settings.subscription(at.from, at.anchor)?;
            let runtime = runtime()?;
            let serve = serve(&settings, &config, conf.as_deref())?;
            runtime.block_on(stream(
                config,
                None,
                fd,
                &dir,
                at.write_from,
                serve,
                cli::shutdown_signal(),
            ))?;
            Ok(())
        }
    }
}

/// Core's HTTP ports from the `--conf` file (none without one), answered through the
/// subscription's relays.
fn serve(
    settings: &Settings,
    config: &SubscribeConfig,
    conf: Option<&Path>,
) -> Result<Option<Serve>, CaptiveError> {
    let Some(path) = conf else {
        return Ok(None);
    };
    let conf = CoreConf::load(path)?;
    if let (Some(n), true) = (conf.query_snapshot_ledgers, conf.query_port != 0) {
        tracing::info!(
            query_snapshot_ledgers = n,
            "queries for ledgers the source core no longer holds answer 404: give it a \
             QUERY_SNAPSHOT_LEDGERS of at least the fleet's lag in ledgers + {n}"
        );
    }
    Ok(Some(Serve {
        listen: conf.listen_addrs(),
        options: settings.http_options(config)?,
    }))
}

fn cwd() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

fn runtime() -> Result<tokio::runtime::Runtime, CaptiveError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| CaptiveError::Io {
            what: "cannot start the async runtime".into(),
            source,
        })
}

fn help() -> String {
    format!(
        "{PROGRAM} {}: stands in for stellar-core under the Go SDK's CaptiveStellarCore and
streams verified ledgers from Ledger Relays on the metadata file descriptor.

Commands (as the SDK runs them; `--console` is accepted and ignored):
  version                          core's version line and `ledger protocol version: N`
                                   (the last streamed ledger's protocol, at least 23)
  new-db                           forget the last closed ledger
  offline-info                     core's info JSON with the last closed ledger
  catchup TO/0                     set the last closed ledger to TO
  catchup TO/COUNT --metadata-output-stream fd:N
                                   stream from the checkpoint start of TO-COUNT+1 to TO, exit 0
  run --metadata-output-stream fd:N [--start-at-ledger S --start-at-hash H]
                                   stream from the last closed ledger + 1 until SIGINT/SIGTERM

While run and catchup stream, core's HTTP ports from `--conf FILE` (HTTP_PORT, HTTP_QUERY_PORT;
127.0.0.1 unless PUBLIC_HTTP_PORT=true; 0: not served) are answered through the relays:
/tx and /info on the command port, /getledgerentry and /getledgerentryraw on the query port,
which answers as of the last ledger written on the stream.

Settings: the TOML file ${cfg} names (default {default}), keys relay, certs, name, hedge,
lanes, server_name, connect_timeout, checkpoint_frequency, protocol_version, query_wait (1s),
core_timeout (2s), anchor; each can be set or overridden by the environment variable
{prefix}KEY (upper case), e.g. {prefix}RELAY=10.0.0.5:7000,10.0.1.5:7000. anchor = SEQ:HASH
is a trusted ledger that a stream with no hash of its own to start from (after new-db or
catchup TO/0) is checked against; without it such a stream trusts the relays' first ledger.

Exit codes: 0 done, 2 failure, 3 certificate refused, 4 start below every relay's retention
(with a line `below-retention requested=R oldest=O newest=N`). See docs/rpc.md.
",
        env!("CARGO_PKG_VERSION"),
        cfg = ledger_relay_subscriber_bin::captive::CONFIG_ENV,
        default = ledger_relay_subscriber_bin::captive::DEFAULT_CONFIG,
        prefix = ledger_relay_subscriber_bin::captive::ENV_PREFIX,
    )
}
