package ledgerrelay

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stellar/go-stellar-sdk/ingest/ledgerbackend"
	"github.com/stellar/go-stellar-sdk/support/log"
)

// historyArchive serves the one file of a history archive the SDK reads before it starts
// core: the root state, which says the newest checkpoint.
func historyArchive(t testing.TB, current uint32) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/stellar-history.json" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"version":1,"server":"ledger-relay-test","currentLedger":%d,"networkPassphrase":%q,"currentBuckets":[]}`,
			current, testnetPass)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// captiveCore is the SDK's own CaptiveStellarCore with ledger-captive-core as its core
// binary, reaching relay through the environment the stand-in reads; each of params changes
// the captive-core settings first (core's HTTP ports, as stellar-rpc sets them).
func (e *env) captiveCore(t testing.TB, relay string, params ...func(*ledgerbackend.CaptiveCoreTomlParams)) (*ledgerbackend.CaptiveStellarCore, *lockedBuffer) {
	t.Helper()
	t.Setenv("LEDGER_CAPTIVE_CORE_CONFIG", "")
	t.Setenv("LEDGER_CAPTIVE_CORE_RELAY", relay)
	t.Setenv("LEDGER_CAPTIVE_CORE_CERTS", e.certs)
	t.Setenv("LEDGER_CAPTIVE_CORE_NAME", "rpc-1")
	archive := historyArchive(t, testnetLast)
	// No HTTP ports unless params set them: the stand-in would serve core's default 11626,
	// which another test or service on the machine may hold.
	var noHTTPPort uint
	tomlParams := ledgerbackend.CaptiveCoreTomlParams{
		NetworkPassphrase:  testnetPass,
		HistoryArchiveURLs: []string{archive},
		CoreBinaryPath:     e.bin.Captive,
		HTTPPort:           &noHTTPPort,
	}
	for _, p := range params {
		p(&tomlParams)
	}
	toml, err := ledgerbackend.NewCaptiveCoreTomlFromData(ledgerbackend.TestnetDefaultConfig, tomlParams)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	logger := log.New()
	logger.SetLevel(log.InfoLevel)
	logger.SetOutput(logs)
	core, err := ledgerbackend.NewCaptive(ledgerbackend.CaptiveCoreConfig{
		BinaryPath:          e.bin.Captive,
		NetworkPassphrase:   testnetPass,
		HistoryArchiveURLs:  []string{archive},
		CheckpointFrequency: 64,
		Toml:                toml,
		StoragePath:         t.TempDir(),
		Log:                 logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = core.Close()
		if t.Failed() {
			t.Logf("SDK log:\n%s", tailLines(logs.String(), 40))
		}
	})
	return core, logs
}

// lockedBuffer is the SDK's log, written from its goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// commands are the stand-in's command lines in the SDK's log, in order.
func commands(logs *lockedBuffer) []string {
	var out []string
	for _, m := range commandLine.FindAllStringSubmatch(logs.String(), -1) {
		out = append(out, m[1])
	}
	return out
}

var commandLine = regexp.MustCompile(`ledger-captive-core: --conf \S+ --console ([^"\\]*)`)

func readRange(t *testing.T, core ledgerbackend.LedgerBackend, r ledgerbackend.Range, to uint32, src map[uint32][]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := core.PrepareRange(ctx, r); err != nil {
		t.Fatalf("PrepareRange(%v): %v", r, err)
	}
	for seq := r.From(); seq <= to; seq++ {
		lcm, err := core.GetLedger(ctx, seq)
		if err != nil {
			t.Fatalf("GetLedger(%d): %v", seq, err)
		}
		raw, err := lcm.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if lcm.LedgerSequence() != seq || !bytes.Equal(raw, src[seq]) {
			t.Fatalf("ledger %d differs from the source", seq)
		}
	}
}

func TestTheSDKsCaptiveCoreReadsABoundedRangeThroughTheStandIn(t *testing.T) {
	src := sourceLedgers(t)
	e := newEnv(t)
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "2ms", "--emit", "1ms")
	r.waitHolds(t, testnetFirst, testnetLast, 60*time.Second)
	core, logs := e.captiveCore(t, r.Addr)
	// Core's catch-up streams from the checkpoint's first ledger, 1410048: the SDK skips to
	// 1410100 itself.
	readRange(t, core, ledgerbackend.BoundedRange(1410100, 1410200), 1410200, src)
	if latest, err := core.GetLatestLedgerSequence(context.Background()); err != nil || latest != 1410200 {
		t.Errorf("latest %d, %v", latest, err)
	}
	want := []string{"new-db", "catchup 1410200/101 --metadata-output-stream fd:3"}
	if got := commands(logs); !slices.Equal(got, want) {
		t.Errorf("the SDK ran %q, want %q", got, want)
	}
}

func TestTheSDKsCaptiveCoreFollowsAnUnboundedRangeThroughTheStandIn(t *testing.T) {
	src := sourceLedgers(t)
	e := newEnv(t)
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "10ms", "--emit", "1ms")
	core, logs := e.captiveCore(t, r.Addr)
	// new-db, catchup 1410098/0, then run from 1410099; the SDK skips 1410099 itself.
	readRange(t, core, ledgerbackend.UnboundedRange(1410100), testnetLast, src)
	latest, err := core.GetLatestLedgerSequence(context.Background())
	if err != nil || latest < testnetLast {
		t.Errorf("latest %d, %v", latest, err)
	}
	if err := core.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// offline-info runs without --console (its stdout is parsed), so it is not in the log.
	want := []string{"new-db", "catchup 1410098/0", "run --metadata-output-stream fd:3"}
	if got := commands(logs); !slices.Equal(got, want) {
		t.Errorf("the SDK ran %q, want %q", got, want)
	}
}
