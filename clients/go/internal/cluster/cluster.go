// Package cluster starts the product's binaries on loopback for the Go tests and the Go
// benchmark: a certificate authority, relays, and their health.
package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Bins are the paths of the product's executables, and of the test double of stellar-core
// the tests put behind a relay.
type Bins struct {
	// Relay is ledger-relay.
	Relay string
	// Certs is ledger-certs.
	Certs string
	// Subscribe is ledger-subscribe.
	Subscribe string
	// Captive is ledger-captive-core, the stand-in for stellar-core.
	Captive string
	// CoreDouble is ledger-core-double, the test double of stellar-core.
	CoreDouble string
}

// FindBins returns the first of dirs (empty ones skipped) holding all five executables.
func FindBins(dirs ...string) (Bins, error) {
	for _, d := range dirs {
		if d == "" {
			continue
		}
		b := Bins{
			Relay:      filepath.Join(d, "ledger-relay"),
			Certs:      filepath.Join(d, "ledger-certs"),
			Subscribe:  filepath.Join(d, "ledger-subscribe"),
			Captive:    filepath.Join(d, "ledger-captive-core"),
			CoreDouble: filepath.Join(d, "ledger-core-double"),
		}
		found := true
		for _, p := range []*string{&b.Relay, &b.Certs, &b.Subscribe, &b.Captive, &b.CoreDouble} {
			abs, err := filepath.Abs(*p)
			if _, serr := os.Stat(abs); err != nil || serr != nil {
				found = false
				break
			}
			*p = abs
		}
		if found {
			return b, nil
		}
	}
	return Bins{}, fmt.Errorf("ledger-relay, ledger-certs, ledger-subscribe, ledger-captive-core and ledger-core-double not found in %v: "+
		"run `cargo build --bins` (or `cargo build --release --bins`) at the workspace root, or set LEDGER_RELAY_BIN_DIR", dirs)
}

// NewCA makes a certificate authority in dir with a server certificate "relay" (for
// 127.0.0.1 and localhost) and a client certificate for each of clients; revoked clients
// are issued and then revoked.
func NewCA(b Bins, dir string, clients, revoked []string) error {
	run := func(args ...string) error {
		out, err := exec.Command(b.Certs, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ledger-certs %v: %v\n%s", args, err, out)
		}
		return nil
	}
	steps := [][]string{
		{"init", dir},
		{"issue-server", dir, "--name", "relay", "--san", "127.0.0.1", "--san", "localhost"},
	}
	for _, c := range append(append([]string(nil), clients...), revoked...) {
		steps = append(steps, []string{"issue-client", dir, "--name", c})
	}
	for _, c := range revoked {
		steps = append(steps, []string{"revoke", dir, "--name", c})
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	return nil
}

// FreePort returns a loopback port nothing listens on now (network "udp" or "tcp").
func FreePort(network string) (int, error) {
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Relay is a running `ledger-relay run`.
type Relay struct {
	// Cmd is the relay's process.
	Cmd *exec.Cmd
	// Addr is where it listens for subscribers, 127.0.0.1:PORT (UDP).
	Addr string
	// Metrics is where it serves /metrics and /healthz, 127.0.0.1:PORT (TCP).
	Metrics string
	// Log is the file its standard output and error go to.
	Log     string
	logFile *os.File
}

// StartRelay runs `ledger-relay run` on loopback with source and extra flags, its data and
// log (NAME.log) in dir, and waits until it listens.
func StartRelay(b Bins, dir, certs, name, source string, extra ...string) (*Relay, error) {
	up, err := FreePort("udp")
	if err != nil {
		return nil, err
	}
	tp, err := FreePort("tcp")
	if err != nil {
		return nil, err
	}
	r := &Relay{
		Addr:    fmt.Sprintf("127.0.0.1:%d", up),
		Metrics: fmt.Sprintf("127.0.0.1:%d", tp),
		Log:     filepath.Join(dir, name+".log"),
	}
	if r.logFile, err = os.Create(r.Log); err != nil {
		return nil, err
	}
	args := append([]string{"run", "--listen", r.Addr, "--certs", certs, "--name", "relay",
		"--data-dir", filepath.Join(dir, name+"-data"), "--source", source, "--metrics", r.Metrics}, extra...)
	r.Cmd = exec.Command(b.Relay, args...)
	r.Cmd.Stdout, r.Cmd.Stderr = r.logFile, r.logFile
	r.Cmd.Env = append(os.Environ(), "RUST_LOG=info")
	if err := r.Cmd.Start(); err != nil {
		r.logFile.Close()
		return nil, err
	}
	if err := r.WaitLog("relay listening", 30*time.Second); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

// Stop kills the relay and reaps it.
func (r *Relay) Stop() {
	_ = r.Cmd.Process.Kill()
	_ = r.Cmd.Wait()
	r.logFile.Close()
}

// LogTail returns the last n lines of the relay's log.
func (r *Relay) LogTail(n int) string {
	text, _ := os.ReadFile(r.Log)
	lines := strings.Split(string(text), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitLog waits until the relay's log holds what.
func (r *Relay) WaitLog(what string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		text, _ := os.ReadFile(r.Log)
		if bytes.Contains(text, []byte(what)) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the relay's log did not show %q within %v", what, within)
}

// Holds returns the oldest and newest ledgers the relay's ring holds, from /healthz.
func (r *Relay) Holds() (oldest, newest uint32, err error) {
	resp, err := http.Get("http://" + r.Metrics + "/healthz")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var h struct {
		RingOldest uint32 `json:"ring_oldest"`
		RingNewest uint32 `json:"ring_newest"`
	}
	err = json.NewDecoder(resp.Body).Decode(&h)
	return h.RingOldest, h.RingNewest, err
}

// WaitHolds waits until done(oldest, newest) holds for the relay's ring and returns the
// bounds it read last.
func (r *Relay) WaitHolds(done func(oldest, newest uint32) bool, within time.Duration) (uint32, uint32, error) {
	deadline := time.Now().Add(within)
	var o, n uint32
	for time.Now().Before(deadline) {
		var err error
		if o, n, err = r.Holds(); err == nil && done(o, n) {
			return o, n, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return o, n, fmt.Errorf("the relay holds %d..%d after %v", o, n, within)
}
