package ledgerrelay

import (
	"os"
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel send cmd's process SIGKILL when this process dies, even
// by SIGKILL, so that no ledger-subscribe outlives the program reading it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// fSetPipeSize is F_SETPIPE_SZ, Linux's fcntl command that resizes a pipe.
const fSetPipeSize = 1031

// setPipeSize asks the kernel for a pipe of n bytes behind w: 1 MiB instead of 64 KiB lets a
// 14.5 MiB ledger cross in 15 wake-ups, not 232. Best effort: the kernel may refuse or cap it
// (/proc/sys/fs/pipe-max-size), and then the pipe keeps its size.
func setPipeSize(w *os.File, n int) {
	_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, w.Fd(), fSetPipeSize, uintptr(n))
}
