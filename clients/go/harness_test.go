package ledgerrelay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test ledgers: 320 consecutive testnet ledgers in core's framing.
const (
	testnetFile  = "../../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
	testnetFirst = 1410048
	testnetLast  = 1410367
	testnetPass  = "Test SDF Network ; September 2015"
)

// binaries are the product's executables: LEDGER_RELAY_BIN_DIR, else the workspace's
// target/debug or target/release (built by `cargo build --bins`).
type binaries struct{ relay, certs, subscribe, captive string }

func findBinaries(t testing.TB) binaries {
	t.Helper()
	dirs := []string{os.Getenv("LEDGER_RELAY_BIN_DIR"), "../../target/debug", "../../target/release"}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		b := binaries{
			relay:     filepath.Join(d, "ledger-relay"),
			certs:     filepath.Join(d, "ledger-certs"),
			subscribe: filepath.Join(d, "ledger-subscribe"),
			captive:   filepath.Join(d, "ledger-captive-core"),
		}
		ok := true
		for _, p := range []string{b.relay, b.certs, b.subscribe, b.captive} {
			if _, err := os.Stat(p); err != nil {
				ok = false
			}
		}
		if ok {
			for _, p := range []*string{&b.relay, &b.certs, &b.subscribe, &b.captive} {
				*p, _ = filepath.Abs(*p)
			}
			return b
		}
	}
	t.Fatalf("ledger-relay, ledger-certs, ledger-subscribe and ledger-captive-core not found in %v: "+
		"run `cargo build --bins` at the workspace root, or set LEDGER_RELAY_BIN_DIR", dirs)
	return binaries{}
}

// sourceLedgers reads the test ledgers as the relay's source holds them.
func sourceLedgers(t testing.TB) map[uint32][]byte {
	t.Helper()
	f, err := os.Open(testnetFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rr := newRecordReader(f, 64<<20)
	out := map[uint32][]byte{}
	for seq := uint32(testnetFirst); ; seq++ {
		raw, err := rr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out[seq] = append([]byte(nil), raw...)
	}
	if len(out) != testnetLast-testnetFirst+1 {
		t.Fatalf("read %d test ledgers", len(out))
	}
	return out
}

// env is a certificate authority with a server and two client certificates (rpc-1, and
// gone, which is revoked).
type env struct {
	bin   binaries
	dir   string
	certs string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{bin: findBinaries(t), dir: t.TempDir()}
	e.certs = filepath.Join(e.dir, "ca")
	run(t, e.bin.certs, "init", e.certs)
	run(t, e.bin.certs, "issue-server", e.certs, "--name", "relay", "--san", "127.0.0.1", "--san", "localhost")
	run(t, e.bin.certs, "issue-client", e.certs, "--name", "rpc-1")
	run(t, e.bin.certs, "issue-client", e.certs, "--name", "gone")
	run(t, e.bin.certs, "revoke", e.certs, "--name", "gone")
	return e
}

func run(t testing.TB, bin string, args ...string) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
}

// relay is a running ledger-relay.
type relay struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
	log     string
}

func freePort(t testing.TB, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startRelay runs `ledger-relay run` on loopback with source and extra flags, and waits until
// it listens. It is killed when the test ends.
func (e *env) startRelay(t testing.TB, name, source string, extra ...string) *relay {
	t.Helper()
	r := &relay{
		addr:    fmt.Sprintf("127.0.0.1:%d", freePort(t, "udp")),
		metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp")),
		log:     filepath.Join(e.dir, name+".log"),
	}
	logFile, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"run", "--listen", r.addr, "--certs", e.certs, "--name", "relay",
		"--data-dir", filepath.Join(e.dir, name+"-data"), "--source", source, "--metrics", r.metrics}, extra...)
	r.cmd = exec.Command(e.bin.relay, args...)
	r.cmd.Stdout, r.cmd.Stderr = logFile, logFile
	r.cmd.Env = append(os.Environ(), "RUST_LOG=info")
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		logFile.Close()
		if t.Failed() {
			text, _ := os.ReadFile(r.log)
			t.Logf("%s log:\n%s", name, tailLines(string(text), 30))
		}
	})
	r.waitLog(t, "relay listening", 30*time.Second)
	return r
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (r *relay) waitLog(t testing.TB, what string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		text, _ := os.ReadFile(r.log)
		if bytes.Contains(text, []byte(what)) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the relay's log did not show %q within %v", what, within)
}

// health is the part of /healthz the tests read.
type health struct {
	RingOldest uint32 `json:"ring_oldest"`
	RingNewest uint32 `json:"ring_newest"`
}

// waitHolds waits until the relay's ring holds exactly oldest..newest.
func (r *relay) waitHolds(t testing.TB, oldest, newest uint32, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var h health
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + r.metrics + "/healthz")
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
			if h.RingOldest == oldest && h.RingNewest == newest {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the relay holds %d..%d, not %d..%d, after %v", h.RingOldest, h.RingNewest, oldest, newest, within)
}

// alive reports whether pid is still a process (a zombie counts: it was not reaped).
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}
