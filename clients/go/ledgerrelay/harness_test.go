package ledgerrelay

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ledger-relay/ledger-relay/clients/go/internal/cluster"
)

// The test ledgers: 320 consecutive testnet ledgers in core's framing.
const (
	testnetFile  = "../../../testdata/testnet/testnet-1410048-1410367.lcm-v0.framed.xdr"
	testnetFirst = 1410048
	testnetLast  = 1410367
	testnetPass  = "Test SDF Network ; September 2015"
)

func findBinaries(t testing.TB) cluster.Bins {
	t.Helper()
	b, err := cluster.FindBins(os.Getenv("LEDGER_RELAY_BIN_DIR"), "../../../target/debug", "../../../target/release")
	if err != nil {
		t.Fatal(err)
	}
	return b
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
	bin   cluster.Bins
	dir   string
	certs string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{bin: findBinaries(t), dir: t.TempDir()}
	e.certs = filepath.Join(e.dir, "ca")
	if err := cluster.NewCA(e.bin, e.certs, []string{"rpc-1"}, []string{"gone"}); err != nil {
		t.Fatal(err)
	}
	return e
}

// relay is a running ledger-relay, stopped when the test ends.
type relay struct{ *cluster.Relay }

func (e *env) startRelay(t testing.TB, name, source string, extra ...string) relay {
	t.Helper()
	r, err := cluster.StartRelay(e.bin, e.dir, e.certs, name, source, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, r.LogTail(30))
		}
	})
	return relay{r}
}

// waitHolds waits until the relay's ring holds exactly oldest..newest.
func (r relay) waitHolds(t testing.TB, oldest, newest uint32, within time.Duration) {
	t.Helper()
	exact := func(o, n uint32) bool { return o == oldest && n == newest }
	if _, _, err := r.WaitHolds(exact, within); err != nil {
		t.Fatalf("%v, want %d..%d", err, oldest, newest)
	}
}

// alive reports whether pid is still a process (a zombie counts: it was not reaped).
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
