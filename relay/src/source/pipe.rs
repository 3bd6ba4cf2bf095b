//! `pipe:COMMAND`: runs and supervises the writer of core's stream.
//!
//! The command runs as `sh -c COMMAND` with fd 3 the write end of a pipe (so
//! `stellar-core run --metadata-output-stream fd:3` works as is), stdin `/dev/null`, stdout
//! and stderr inherited, in a process group of its own. The pipe is raised to 1 MiB
//! (`F_SETPIPE_SZ`; a warning if the system refuses) so that core, which writes a ledger in one
//! go, is not throttled by a 64 KiB pipe while the relay is busy. The read end is read as the
//! `stream` source reads a FIFO: reads of up to 256 KiB, forwarded as they come.
//!
//! A child's run ends when the pipe reaches EOF (then the child gets [`EXIT_GRACE`] to exit by
//! itself) or when the child exits (then whatever it wrote is drained first, in case a
//! descendant still holds the pipe open). Its process group is then stopped and the child
//! reaped. If the run ended inside a ledger, `Abort` (the partial ledger is never forwarded);
//! then `Down`, and after a backoff the command is started again and `Restarted` sent. The
//! backoff doubles from the least to the greatest of `pipe_restart_backoff` while runs keep
//! failing, and goes back to the least after a run that produced a ledger or lasted
//! [`HEALTHY_RUN`].
//!
//! Stopping a process group: SIGTERM to the group, up to [`KILL_GRACE`] for the child to
//! exit, then SIGKILL to the group (descendants that outlived the child, or a child that
//! ignored SIGTERM), then reap. The child is only peeked at (`waitid` with `WNOWAIT`) until
//! then, so its pid, which is the group id, cannot be reused while the group is signalled. The
//! same happens on shutdown, on failure, and when the source thread unwinds, so a child never
//! outlives its source.
//!
//! A malformed record stream (no last-fragment bit, a record over the limit) fails the source:
//! a writer that breaks the framing is not one a restart will fix.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{pipe2, Pid};

use super::stream::{Pumped, StreamReader, POLL_MS};
use super::{Out, SourceEvent, SourceOptions, Stop};

/// The child's end of the pipe: core writes its meta to `fd:3` by convention.
const CHILD_FD: i32 = 3;

/// Pipe capacity asked for: 1 MiB, the default `/proc/sys/fs/pipe-max-size` (so no privilege
/// is needed), about 70 ms of core's writing at the 14.5 MiB / 8 ms profile.
const PIPE_SIZE: i32 = 1 << 20;

/// After EOF on the pipe, how long the child may take to exit by itself before it is stopped.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// After SIGTERM, how long the child may take to exit before its group gets SIGKILL.
pub(super) const KILL_GRACE: Duration = Duration::from_secs(2);

/// A run this long counts as healthy even without a ledger: the backoff resets.
const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// After the child exited, longest time spent draining what is left in the pipe (a descendant
/// may hold it open and keep writing).
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// How often a stopping child is checked for exit.
const EXIT_POLL: Duration = Duration::from_millis(10);

pub(super) fn run(command: &str, opts: &SourceOptions, out: &Out) -> Result<(), Stop> {
    let (least, most) = opts.pipe_restart_backoff;
    let mut delay = least;
    let mut restarts: u32 = 0;
    // Why the previous child ended, once there was one.
    let mut previous: Option<String> = None;
    loop {
        let mut child = match Supervised::start(command, opts.max_record_len) {
            Ok(child) => child,
            Err(e) => {
                let reason = format!("cannot start `sh -c {command}`: {e}");
                // The first start failing is a configuration error; a restart failing may be
                // a passing shortage (fork's EAGAIN), so it is retried.
                if previous.is_none() {
                    return Err(Stop::Failed(reason));
                }
                tracing::warn!(%reason, ?delay, "pipe source: restart failed, retrying");
                out.send(SourceEvent::Down {
                    reason: format!("restart failed: {reason}"),
                })?;
                out.sleep_until(Instant::now() + delay)?;
                delay = (delay * 2).min(most);
                continue;
            }
        };
        tracing::info!(
            pid = child.pid.as_raw(),
            command,
            "pipe source: child started"
        );
        if let Some(reason) = previous.take() {
            restarts = restarts.saturating_add(1);
            out.send(SourceEvent::Restarted {
                attempt: restarts,
                reason,
            })?;
        }

        let run = child.supervise(out)?;
        let healthy = run.ledgers > 0 || run.ran >= HEALTHY_RUN;
        if healthy {
            delay = least;
        }
        tracing::warn!(
            reason = %run.reason,
            ledgers = run.ledgers,
            ran = ?run.ran,
            ?delay,
            "pipe source: child ended, restarting"
        );
        out.send(SourceEvent::Down {
            reason: run.reason.clone(),
        })?;
        previous = Some(run.reason);
        drop(child);
        out.sleep_until(Instant::now() + delay)?;
        delay = (delay * 2).min(most);
    }
}

/// How one run of the child went.
#[derive(Debug)]
struct RunEnd {
    /// Why it ended, for `Restarted`.
    reason: String,
    /// Ledgers it delivered whole.
    ledgers: u64,
    /// How long it ran.
    ran: Duration,
}

/// A running child, its group and the read end of its pipe. Dropping it stops the group.
struct Supervised {
    child: Child,
    /// The child's pid, which is also its process group id.
    pid: Pid,
    reader: StreamReader,
    started: Instant,
    /// Set once the child is reaped.
    status: Option<ExitStatus>,
}

impl Supervised {
    fn start(command: &str, max_record_len: u32) -> io::Result<Self> {
        // O_CLOEXEC: neither end may leak into a process that another thread starts
        // concurrently (a leaked write end would keep the pipe from ever reaching EOF).
        // command-fds dup2s the write end onto the child's fd 3, which clears the flag there.
        let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
        if let Err(e) = fcntl(read.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE)) {
            tracing::warn!(
                error = %e,
                "pipe source: cannot raise the pipe to 1 MiB (see /proc/sys/fs/pipe-max-size); \
                 core may block on a full pipe"
            );
        }
        let child = {
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg(command)
                .stdin(Stdio::null())
                .process_group(0);
            cmd.fd_mappings(vec![FdMapping {
                parent_fd: write,
                child_fd: CHILD_FD,
            }])
            .map_err(io::Error::other)?;
            cmd.spawn()?
            // `cmd` drops here and closes the relay's copy of the write end: EOF then means
            // that the child and all its descendants closed theirs.
        };
        // pid_t is an i32 and Linux pids stay below 2^22, so the cast is lossless.
        let pid = Pid::from_raw(child.id() as i32);
        Ok(Self {
            child,
            pid,
            reader: StreamReader::new(
                std::fs::File::from(read),
                format!("pipe from child {pid}"),
                max_record_len,
            ),
            started: Instant::now(),
            status: None,
        })
    }

    /// Forwards the child's stream until its run ends, then stops its group and reports how
    /// it went. A ledger cut short by the end is aborted.
    fn supervise(&mut self, out: &Out) -> Result<RunEnd, Stop> {
        let mut ledgers = 0;
        let mut closed_early = false;
        loop {
            match self.reader.pump(out, POLL_MS)? {
                Pumped::Read { ended } => ledgers += ended,
                Pumped::Idle => {}
                Pumped::Eof => {
                    let deadline = Instant::now() + EXIT_GRACE;
                    while !self.exited() && Instant::now() < deadline {
                        out.check().map_err(|stop| self.abort_open(out, stop))?;
                        std::thread::sleep(EXIT_POLL);
                    }
                    closed_early = !self.exited();
                    break;
                }
            }
            if self.exited() {
                // Forward what the child wrote before it exited.
                let deadline = Instant::now() + DRAIN_LIMIT;
                while Instant::now() < deadline {
                    match self.reader.pump(out, 0)? {
                        Pumped::Read { ended } => ledgers += ended,
                        Pumped::Idle | Pumped::Eof => break,
                    }
                }
                break;
            }
        }
        let reason = match self.stop() {
            Ok(status) if closed_early => {
                format!("child closed its stream and was stopped ({status})")
            }
            Ok(status) => format!("child exited ({status})"),
            Err(e) => format!("child ended, but reaping it failed: {e}"),
        };
        self.reader.end(out, Some(&reason))?;
        Ok(RunEnd {
            reason,
            ledgers,
            ran: self.started.elapsed(),
        })
    }

    /// Sends `Abort` if a ledger is in progress and passes `stop` on.
    fn abort_open(&mut self, out: &Out, stop: Stop) -> Stop {
        if self.reader.in_ledger() {
            out.abort(stop)
        } else {
            stop
        }
    }

    /// Whether the child has exited, without reaping it.
    fn exited(&self) -> bool {
        if self.status.is_some() {
            return true;
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(self.pid), flags) {
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => false,
            // Any other answer, including ECHILD, means there is no live child to wait for.
            Ok(_) | Err(_) => true,
        }
    }

    /// Stops the child's process group and reaps the child: SIGTERM, up to [`KILL_GRACE`],
    /// SIGKILL. Idempotent.
    fn stop(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        if !self.exited() {
            signal_group(self.pid, Signal::SIGTERM);
            let deadline = Instant::now() + KILL_GRACE;
            while !self.exited() && Instant::now() < deadline {
                std::thread::sleep(EXIT_POLL);
            }
        }
        // Whatever is left of the group: descendants, or a child that ignored SIGTERM. The
        // child is not reaped yet, so the group id cannot belong to anyone else.
        signal_group(self.pid, Signal::SIGKILL);
        let status = self.child.wait()?;
        self.status = Some(status);
        Ok(status)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(pid = self.pid.as_raw(), error = %e, "pipe source: cannot reap the child");
        }
    }
}

/// Sends `signal` to process group `pgid`; a group already gone is not an error.
fn signal_group(pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => {
            tracing::warn!(pgid = pgid.as_raw(), %signal, error = %e, "pipe source: cannot signal the child's group")
        }
    }
}
