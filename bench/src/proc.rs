//! Child processes: finding the workspace's binaries, CPU time from `/proc/PID/stat`, and
//! waiting for a child with a deadline without losing its CPU time.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;

/// Finds `name` next to the running executable (`target/release/` for `ledger-bench`; one
/// level up for test binaries in `target/release/deps/`).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the ledger-bench executable")?;
    let mut dir = exe.parent().map(Path::to_path_buf);
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    bail!(
        "{name} not found next to {}: build it first (cargo build --release --workspace)",
        exe.display()
    )
}

/// Clock ticks per second for `/proc/PID/stat` (USER_HZ, 100 on Linux).
fn ticks_per_sec() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// User plus system CPU seconds of process `pid` (threads included), or `None` when it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds of process `pid`'s live threads, summed by thread name (`comm`).
pub fn thread_cpu_seconds(pid: u32) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let name = match (stat.find('('), stat.rfind(')')) {
            (Some(a), Some(b)) if a < b => stat[a + 1..b].to_owned(),
            _ => continue,
        };
        if let Some(cpu) = stat_cpu_seconds(&stat) {
            *out.entry(name).or_insert(0.0) += cpu;
        }
    }
    out
}

/// User plus system CPU seconds in the text of a `/proc/PID/stat` (or `/proc/PID/task/TID/stat`)
/// file.
pub fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name (field 2) may contain spaces: fields are counted after its last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based), so 11 and 12 here.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_sec())
}

/// Waits for `child` to exit, until `deadline`. On exit, reads its CPU time before reaping it
/// (a zombie's `/proc/PID/stat` still holds its totals). Returns `None` on timeout (the child
/// is left running).
pub fn wait_with_cpu(
    child: &mut Child,
    deadline: Instant,
) -> anyhow::Result<Option<(ExitStatus, f64)>> {
    let pid = Pid::from_raw(child.id() as i32);
    loop {
        // WNOWAIT: look without reaping, so /proc/PID/stat stays readable.
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
        match waitid(Id::Pid(pid), flags) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {}
            Ok(_) => {
                let cpu = cpu_seconds(child.id()).unwrap_or(f64::NAN);
                let status = child.wait().context("reaping a child")?;
                untrack(child.id());
                return Ok(Some((status, cpu)));
            }
            Err(e) => bail!("waiting for pid {pid}: {e}"),
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends SIGINT (graceful stop) to `child`, waits up to `grace`, then SIGKILL.
pub fn stop(child: &mut Child, grace: Duration) -> Option<(ExitStatus, f64)> {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGINT);
    match wait_with_cpu(child, Instant::now() + grace) {
        Ok(Some(r)) => Some(r),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            untrack(child.id());
            None
        }
    }
}

/// Kills and reaps every child still running (error paths).
pub fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        if let Ok(None) = c.try_wait() {
            let _ = c.kill();
            let _ = c.wait();
        }
        untrack(c.id());
    }
}

/// Children still running, for the signal handler.
static CHILDREN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Records a child so that [`kill_tracked`] stops it on Ctrl-C.
pub fn track(child: &Child) {
    if let Ok(mut v) = CHILDREN.lock() {
        v.push(child.id());
    }
}

fn untrack(pid: u32) {
    if let Ok(mut v) = CHILDREN.lock() {
        v.retain(|p| *p != pid);
    }
}

/// Kills every tracked child (signal handler; they are reaped when we exit).
pub fn kill_tracked() {
    if let Ok(v) = CHILDREN.lock() {
        for pid in v.iter() {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
}

/// `--max-mtu N` and `--min-mtu N`, each where given: the flags `ledger-subscribe` and
/// `ledger-relay demo` take.
pub fn mtu_flags(max_mtu: Option<u16>, min_mtu: Option<u16>) -> Vec<String> {
    [("--max-mtu", max_mtu), ("--min-mtu", min_mtu)]
        .into_iter()
        .filter_map(|(flag, mtu)| mtu.map(|m| [flag.to_owned(), m.to_string()]))
        .flatten()
        .collect()
}

/// The relay's `run` arguments for these QUIC packet sizes: `--config FILE`, FILE written in
/// `dir` with a `[transport]` table holding `max_mtu` and `min_mtu` where given; none when
/// neither is (subscribers take [`mtu_flags`]).
pub fn mtu_config(
    dir: &Path,
    max_mtu: Option<u16>,
    min_mtu: Option<u16>,
) -> anyhow::Result<Vec<String>> {
    if max_mtu.is_none() && min_mtu.is_none() {
        return Ok(Vec::new());
    }
    let mut table = String::from("[transport]\n");
    for (key, mtu) in [("max_mtu", max_mtu), ("min_mtu", min_mtu)] {
        if let Some(mtu) = mtu {
            table.push_str(&format!("{key} = {mtu}\n"));
        }
    }
    let config = dir.join("relay-transport.toml");
    std::fs::write(&config, table).with_context(|| format!("writing {}", config.display()))?;
    Ok(vec!["--config".into(), config.display().to_string()])
}

#[cfg(test)]
mod mtu_tests {
    use super::*;

    #[test]
    fn mtu_flags_and_the_relay_config_name_only_what_is_given() {
        assert!(mtu_flags(None, None).is_empty());
        assert_eq!(mtu_flags(Some(8952), None), ["--max-mtu", "8952"]);
        assert_eq!(
            mtu_flags(Some(8952), Some(1300)),
            ["--max-mtu", "8952", "--min-mtu", "1300"]
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(mtu_config(dir.path(), None, None).unwrap().is_empty());
        let relay = mtu_config(dir.path(), None, Some(8952)).unwrap();
        assert_eq!(relay[0], "--config");
        let table = std::fs::read_to_string(&relay[1]).unwrap();
        assert_eq!(table, "[transport]\nmin_mtu = 8952\n");
    }
}
