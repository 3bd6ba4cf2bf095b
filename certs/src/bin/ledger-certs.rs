//! `ledger-certs`: the operator's certificate authority for Ledger Relay.
//!
//! A thin command line over [`ledger_relay_certs::CertDir`]: parse, call, print. Every error,
//! including a bad argument, is one line on stderr and exit code 2.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};
use ledger_relay_certs::{
    format_list, rfc3339, CertDir, Issued, DEFAULT_CA_DAYS, DEFAULT_LEAF_DAYS,
};
use ledger_relay_cli::{logging, AssetCommand, LogFormat};

/// Certificate authority for Ledger Relay: a CA, relay (server) and subscriber (client)
/// certificates, and the CRL relays load.
#[derive(Debug, Parser)]
#[command(name = "ledger-certs", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a new CA in DIR: ca.pem, ca.key, an empty signed crl.pem and index.toml.
    /// Refuses to overwrite an existing CA.
    Init {
        /// Certificate directory (created if missing).
        dir: PathBuf,
        /// Validity of the CA in days.
        #[arg(long, default_value_t = DEFAULT_CA_DAYS)]
        days: u32,
    },
    /// Issue a relay certificate DIR/NAME.pem + DIR/NAME.key (EKU serverAuth).
    IssueServer {
        /// Certificate directory.
        dir: PathBuf,
        /// Certificate name: 1-64 of [A-Za-z0-9._-], starting with a letter or digit.
        #[arg(long)]
        name: String,
        /// Subject alternative name: an IP address or a DNS name; repeat for several.
        /// Clients match the relay's address against these.
        #[arg(long = "san", value_name = "DNS|IP")]
        sans: Vec<String>,
        /// Validity in days (at most the CA's remaining validity).
        #[arg(long, default_value_t = DEFAULT_LEAF_DAYS)]
        days: u32,
    },
    /// Issue a subscriber certificate DIR/NAME.pem + DIR/NAME.key (EKU clientAuth, identity
    /// CN=NAME and URI urn:ledger-relay:client:NAME).
    IssueClient {
        /// Certificate directory.
        dir: PathBuf,
        /// Client name, the identity relays authorize (`--allow NAME`).
        #[arg(long)]
        name: String,
        /// Validity in days (at most the CA's remaining validity).
        #[arg(long, default_value_t = DEFAULT_LEAF_DAYS)]
        days: u32,
    },
    /// Revoke the certificate NAME and rewrite DIR/crl.pem with every revoked serial.
    Revoke {
        /// Certificate directory.
        dir: PathBuf,
        /// Name of the certificate to revoke.
        #[arg(long)]
        name: String,
    },
    /// Re-sign DIR/crl.pem with a new CRL number and next update (30 days); revokes nothing.
    RefreshCrl {
        /// Certificate directory.
        dir: PathBuf,
    },
    /// Issue a fresh certificate (new key, same role and SANs) for NAME before its current
    /// one expires. The old NAME.pem/NAME.key move to DIR/renewed/ and stay valid until they
    /// expire; deploy the new files, then restart the relay or subscriber that uses them.
    Renew {
        /// Certificate directory.
        dir: PathBuf,
        /// Name of the certificate to renew.
        #[arg(long)]
        name: String,
        /// Validity of the new certificate in days (at most the CA's remaining validity).
        #[arg(long, default_value_t = DEFAULT_LEAF_DAYS)]
        days: u32,
    },
    /// Print every certificate of DIR: name, role, serial, expiry (not_after), revoked, and a
    /// note: `expires-in-Nd` within 30 days, `expired`, or `renewed`.
    List {
        /// Certificate directory.
        dir: PathBuf,
    },
    #[command(flatten)]
    Assets(AssetCommand),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            // Help and version go to stdout with exit code 0.
            e.exit()
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprintln!(
                "error: a command is required: init, issue-server, issue-client, revoke, \
                 refresh-crl, renew, list, completions or man (see --help)"
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("{}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Escaped: the error may quote a file's content (a certificate, the index).
            let text = format!("error: {}", one_line(&format!("{e:#}")));
            logging::fatal(LogFormat::Text, "ledger-certs", &text);
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Init { dir, days } => {
            let ca = CertDir::init(&dir, days)?;
            let entry = ca.list()?.remove(0);
            println!(
                "created CA in {} (serial {}, expires {}): ca.pem ca.key crl.pem index.toml",
                dir.display(),
                entry.serial_hex(),
                rfc3339(entry.not_after),
            );
        }
        Command::IssueServer {
            dir,
            name,
            sans,
            days,
        } => {
            let issued = CertDir::open(&dir)?.issue_server(&name, &sans, days)?;
            print_issued("server", &issued);
        }
        Command::IssueClient { dir, name, days } => {
            let issued = CertDir::open(&dir)?.issue_client(&name, days)?;
            print_issued("client", &issued);
        }
        Command::Revoke { dir, name } => {
            let ca = CertDir::open(&dir)?;
            ca.revoke(&name)?;
            let entries = ca.list()?;
            let revoked = entries.iter().filter(|e| e.revoked).count();
            let serial = entries
                .iter()
                .rev()
                .find(|e| e.name == name && e.revoked)
                .map(|e| e.serial_hex())
                .context("the revoked certificate is missing from the index")?;
            println!(
                "revoked {name} (serial {serial}); {} lists {revoked} certificate(s), CRL number {}",
                ca.crl_path().display(),
                ca.crl_number()?,
            );
        }
        Command::RefreshCrl { dir } => {
            let ca = CertDir::open(&dir)?;
            let number = ca.refresh_crl()?;
            println!(
                "re-signed {} (CRL number {number})",
                ca.crl_path().display()
            );
        }
        Command::Renew { dir, name, days } => {
            let issued = CertDir::open(&dir)?.renew(&name, days)?;
            print_issued(issued.role.as_str(), &issued);
            println!(
                "the previous {name} certificate is in {} and stays valid until it expires",
                dir.join("renewed").display()
            );
        }
        Command::Assets(assets) => assets.run(Cli::command())?,
        Command::List { dir } => {
            let entries = CertDir::open(&dir)?.list()?;
            print!("{}", format_list(&entries, time::OffsetDateTime::now_utc()));
        }
    }
    Ok(())
}

fn print_issued(role: &str, issued: &Issued) {
    println!(
        "issued {role} certificate {} (serial {}, expires {}): {} {}",
        issued.name,
        issued.serial_hex(),
        rfc3339(issued.not_after),
        issued.cert_path.display(),
        issued.key_path.display(),
    );
}

/// Folds a multi-line message (clap's usage errors) into one line, dropping clap's usage and
/// "--help" hints: scripts read the first line of stderr.
fn one_line(message: &str) -> String {
    let mut out = String::new();
    for line in message.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn clap_errors_fold_into_one_line() {
        let message = "error: the following required arguments were not provided:\n  --name <NAME>\n  <DIR>\n\nUsage: ledger-certs issue-client --name <NAME> <DIR>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(message),
            "error: the following required arguments were not provided: --name <NAME>; <DIR>"
        );
        assert_eq!(one_line("error: x\n"), "error: x");
    }
}
