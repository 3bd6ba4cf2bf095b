//go:build !linux

package ledgerrelay

import (
	"os"
	"os/exec"
)

// dieWithParent does nothing: only Linux can tie a child's life to its parent's
// (Pdeathsig). Elsewhere a ledger-subscribe whose parent was killed runs on until it writes
// to the closed pipe, or until its --count ends; a parent that stops normally still stops
// and reaps it.
func dieWithParent(*exec.Cmd) {}

// setPipeSize does nothing: only Linux can resize a pipe (F_SETPIPE_SZ), so the system's
// size is used.
func setPipeSize(*os.File, int) {}
