//! Man pages and shell completions from a tool's clap definition, so they never drift from
//! the flags the binary really takes. Each binary exposes them (`ledger-relay man DIR`,
//! `ledger-relay completions SHELL`, and the same for the others); `packaging/README.md`
//! says where a package puts them.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub use clap_complete::Shell;

/// Writes `NAME.1` for `cmd` and `NAME-SUB.1` for each subcommand (recursively, without
/// `help`) into `dir`, which is created if missing. Returns the files written.
pub fn write_man_pages(mut cmd: clap::Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    // Building fills in each subcommand's display name (`ledger-relay-run`).
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, dir, &mut written)?;
    Ok(written)
}

fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> io::Result<()> {
    let name = cmd
        .get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned();
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    std::fs::write(&path, page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}

/// Writes `shell`'s completion script for `cmd` to `out`.
pub fn write_completions(mut cmd: clap::Command, shell: Shell, out: &mut dyn Write) {
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, &mut cmd, name, out);
}

/// Writes the man pages of `cmd` into `dir` (see [`write_man_pages`]) and prints their paths on
/// stdout, one a line.
pub fn print_man_pages(cmd: clap::Command, dir: &Path) -> io::Result<()> {
    for page in write_man_pages(cmd, dir)? {
        println!("{}", page.display());
    }
    Ok(())
}

/// The `completions` and `man` subcommands of a tool that has subcommands (`ledger-relay`,
/// `ledger-certs`): flatten it into the tool's command enum with `#[command(flatten)]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum AssetCommand {
    /// Print the shell completion script for SHELL on stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Write the man pages (one for the command and one per subcommand) into DIR.
    Man {
        /// Directory, created if missing.
        dir: PathBuf,
    },
}

impl AssetCommand {
    /// Carries it out for the tool whose clap definition is `cmd`: the completion script on
    /// stdout, or the man pages written and their paths on stdout. An error names the
    /// directory.
    pub fn run(&self, cmd: clap::Command) -> io::Result<()> {
        match self {
            AssetCommand::Completions { shell } => {
                write_completions(cmd, *shell, &mut io::stdout());
                Ok(())
            }
            AssetCommand::Man { dir } => print_man_pages(cmd, dir).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("writing man pages to {}: {e}", dir.display()),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> clap::Command {
        clap::Command::new("tool")
            .about("A tool.")
            .subcommand(
                clap::Command::new("run").about("Runs it.").arg(
                    clap::Arg::new("listen")
                        .long("listen")
                        .help("Where to listen."),
                ),
            )
            .subcommand(clap::Command::new("check").about("Checks it."))
    }

    #[test]
    fn one_page_per_command_with_its_flags() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_man_pages(cmd(), dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["tool.1", "tool-run.1", "tool-check.1"]);
        let run = std::fs::read_to_string(dir.path().join("tool-run.1")).unwrap();
        assert!(run.starts_with(".ie"), "roff: {run}");
        assert!(run.contains("tool\\-run"), "{run}");
        assert!(run.contains("listen"), "{run}");
    }

    #[test]
    fn completions_name_the_subcommands() {
        let mut out = Vec::new();
        write_completions(cmd(), Shell::Bash, &mut out);
        let script = String::from_utf8(out).unwrap();
        assert!(script.contains("_tool()"), "{script}");
        assert!(script.contains("run") && script.contains("check"));
        assert!(script.contains("--listen"));
    }
}
