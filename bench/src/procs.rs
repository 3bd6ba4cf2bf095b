//! Child processes and what `/proc` says about them: the workspace's binaries, CPU time, resident
//! memory sampled on a thread of its own, and waiting for a child without losing its CPU time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Finds `name` next to the running executable, or one level up (test binaries in `deps/`).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let mut dir = exe.parent().map(Path::to_path_buf);
    for _ in 0..2 {
        let Some(d) = dir else { break };
        if d.join(name).is_file() {
            return Ok(d.join(name));
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    bail!(
        "{name} not found next to {}: build it first (cargo build --release --workspace)",
        exe.display()
    )
}

/// Waits until `child`'s log holds `what`; fails if it exits or `within` passes first.
pub fn wait_log(child: &mut Child, log: &Path, what: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !std::fs::read_to_string(log).is_ok_and(|t| t.contains(what)) {
        if let Some(st) = child.try_wait()? {
            bail!("exited ({st}): {}", log_tail(log, 5));
        }
        if Instant::now() > deadline {
            bail!("no {what:?} within {within:?}: {}", log_tail(log, 5));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The last `n` lines of a log, newest first, joined by ` | ` (for error messages).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().rev().take(n).collect::<Vec<_>>().join(" | ")
}

/// User plus system CPU seconds in the text of a `/proc/PID/stat` (or `.../task/TID/stat`).
pub fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name (field 2) may hold spaces: fields are counted after its last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the name.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let hz = match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    };
    Some(ticks / hz)
}

/// CPU seconds of process `pid`, threads included, or `None` when it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds of process `pid`'s live threads, summed by thread name.
pub fn thread_cpu_seconds(pid: u32) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let (Some(a), Some(b), Some(cpu)) =
            (stat.find('('), stat.rfind(')'), stat_cpu_seconds(&stat))
        {
            *out.entry(stat[a + 1..b].to_owned()).or_insert(0.0) += cpu;
        }
    }
    out
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`), or `None` when the process is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    proc_value(pid, "status", field)
}

/// The number of field `field` in `/proc/PID/FILE` (`io`'s `wchar`).
pub fn proc_value(pid: u32, file: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    let mut lines = text.lines();
    let value = lines.find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    value.split_whitespace().next()?.parse().ok()
}

/// The machine's load averages (1, 5, 15 min).
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut v = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([v.next()??, v.next()??, v.next()??])
}

/// Whether `child` has exited, without reaping it (its `/proc/PID/stat` stays readable): its
/// exit code (-1: ended by a signal), or `None` while it runs.
pub fn peek_exit(child: &Child) -> anyhow::Result<Option<i32>> {
    let pid = Pid::from_raw(child.id() as i32);
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
    match waitid(Id::Pid(pid), flags) {
        Ok(WaitStatus::StillAlive) => Ok(None),
        Ok(WaitStatus::Exited(_, code)) => Ok(Some(code)),
        Ok(_) => Ok(Some(-1)),
        Err(e) => bail!("waiting for pid {pid}: {e}"),
    }
}

/// Waits for `child` to exit until `deadline`; on exit reads its CPU seconds before reaping it
/// (a zombie's `/proc/PID/stat` still holds its totals). `None` on timeout (still running).
pub fn wait_with_cpu(
    child: &mut Child,
    deadline: Instant,
) -> anyhow::Result<Option<(ExitStatus, f64)>> {
    while peek_exit(child)?.is_none() {
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let cpu = cpu_seconds(child.id()).unwrap_or(f64::NAN);
    let status = child.wait().context("reaping a child")?;
    untrack(child.id());
    Ok(Some((status, cpu)))
}

/// SIGINT to `child`, SIGKILL after `grace`; its exit status and CPU seconds if it stopped.
pub fn stop(child: &mut Child, grace: Duration) -> Option<(ExitStatus, f64)> {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
    match wait_with_cpu(child, Instant::now() + grace) {
        Ok(Some(r)) => Some(r),
        _ => {
            kill_all(std::slice::from_mut(child));
            None
        }
    }
}

/// Kills and reaps every child still running.
pub fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        if let Ok(None) = c.try_wait() {
            let _ = c.kill();
            let _ = c.wait();
        }
        untrack(c.id());
    }
}

/// Children still running, for the Ctrl-C handler.
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

/// Kills every tracked child (they are reaped when this process exits).
pub fn kill_tracked() {
    if let Ok(v) = CHILDREN.lock() {
        for pid in v.iter() {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
}

/// One resident-memory sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RssSample {
    /// Seconds since the sampler started.
    pub t_s: f64,
    /// Resident set, KiB.
    pub rss_kib: u64,
}

/// Samples a process's `VmRSS` on a thread of its own at a fixed interval until finished.
#[derive(Debug)]
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<RssSample>>,
}

impl RssSampler {
    /// Samples `pid` every `every` until it is gone or `limit` samples are taken.
    pub fn start(pid: u32, every: Duration, limit: usize) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let (t0, mut v) = (Instant::now(), Vec::new());
            while !flag.load(Ordering::Relaxed) && v.len() < limit {
                let Some(kib) = status_kib(pid, "VmRSS") else {
                    break;
                };
                v.push(RssSample {
                    t_s: t0.elapsed().as_secs_f64(),
                    rss_kib: kib,
                });
                std::thread::sleep(every);
            }
            v
        });
        RssSampler { stop, handle }
    }

    /// Stops and returns the samples.
    pub fn finish(self) -> Vec<RssSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// KiB to MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
