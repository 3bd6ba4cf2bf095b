package ledgerrelay

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stellar/go-stellar-sdk/ingest/ledgerbackend"
	"github.com/stellar/go-stellar-sdk/xdr"
)

func fileSource(t testing.TB) string {
	t.Helper()
	p, err := filepath.Abs(testnetFile)
	if err != nil {
		t.Fatal(err)
	}
	return "file:" + p
}

func (e *env) config(name string, relays ...string) Config {
	return Config{Binary: e.bin.Subscribe, Relays: relays, CertDir: e.certs, Name: name, Lanes: 2,
		RestartDelay: 100 * time.Millisecond}
}

// pids records every child the stream starts.
type pids struct {
	mu   sync.Mutex
	list []int
}

func (p *pids) add(pid int) { p.mu.Lock(); p.list = append(p.list, pid); p.mu.Unlock() }
func (p *pids) all() []int  { p.mu.Lock(); defer p.mu.Unlock(); return append([]int(nil), p.list...) }

func newStream(t testing.TB, cfg Config) (*Stream, *pids) {
	t.Helper()
	s, err := NewStream(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &pids{}
	s.started = p.add
	return s, p
}

func assertReaped(t testing.TB, p *pids) {
	t.Helper()
	for _, pid := range p.all() {
		if alive(pid) {
			t.Errorf("ledger-subscribe %d is still a process (running or not reaped)", pid)
		}
	}
}

// readChecked reads rng through s, checks that every ledger is the next one and
// byte-identical to src, and calls after(seq) once each is read; after returning false stops
// the loop. It returns the sequence after the last ledger read.
func readChecked(t *testing.T, s *Stream, rng ledgerbackend.Range, src map[uint32][]byte, after func(seq uint32) bool) uint32 {
	t.Helper()
	next := rng.From()
	for raw, err := range s.RawLedgers(context.Background(), rng) {
		if err != nil {
			t.Fatalf("after ledger %d: %v", next-1, err)
		}
		if !bytes.Equal(raw, src[next]) {
			t.Fatalf("ledger %d differs from the source", next)
		}
		next++
		if after != nil && !after(next-1) {
			break
		}
	}
	return next
}

// checkEnd checks that a read ended before want, with children processes, all reaped.
func checkEnd(t *testing.T, next, want uint32, p *pids, children int, why string) {
	t.Helper()
	if next != want {
		t.Fatalf("ended at %d, not %d", next-1, want-1)
	}
	if n := len(p.all()); n != children {
		t.Errorf("%d children, want %d (%s)", n, children, why)
	}
	assertReaped(t, p)
}

// The stream tests run in parallel with each other (after the captive-core tests, which set
// environment variables for the SDK's child): each has its own directory, certificates and
// relays on their own ports, and spends most of its time waiting on a relay's source.
func TestBoundedRangeIsByteIdenticalToTheSource(t *testing.T) {
	t.Parallel()
	src := sourceLedgers(t)
	e := newEnv(t)
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "2ms", "--emit", "1ms")
	r.waitHolds(t, testnetFirst, testnetLast, 60*time.Second)

	s, p := newStream(t, e.config("rpc-1", r.Addr))
	next := readChecked(t, s, ledgerbackend.BoundedRange(1410100, 1410200), src, nil)
	checkEnd(t, next, 1410201, p, 1, "one range")

	// The same through the LedgerBackend interface.
	b, err := NewBackend(e.config("rpc-1", r.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := b.PrepareRange(ctx, ledgerbackend.BoundedRange(1410300, 1410310)); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b.IsPrepared(ctx, ledgerbackend.BoundedRange(1410300, 1410310)); !ok {
		t.Error("the prepared range is not prepared")
	}
	if ok, _ := b.IsPrepared(ctx, ledgerbackend.BoundedRange(1410300, 1410311)); ok {
		t.Error("a range past the prepared one is prepared")
	}
	for seq := uint32(1410300); seq <= 1410310; seq++ {
		lcm, err := b.GetLedger(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := lcm.MarshalBinary()
		if !bytes.Equal(raw, src[seq]) || lcm.LedgerSequence() != seq {
			t.Fatalf("ledger %d differs from the source", seq)
		}
	}
	if latest, _ := b.GetLatestLedgerSequence(ctx); latest != 1410310 {
		t.Errorf("latest %d", latest)
	}
	if _, err := b.GetLedger(ctx, 1410305); err == nil {
		t.Error("a ledger behind the stream was returned")
	}
	if _, err := b.GetLedger(ctx, 1410311); err == nil {
		t.Error("a ledger past the bounded range was returned")
	}
}

func TestUnboundedRangeFollowsTheRelayLive(t *testing.T) {
	t.Parallel()
	src := sourceLedgers(t)
	e := newEnv(t)
	// 20 ms between ledgers: the 320 take 6.4 s, and the reader starts before most exist.
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "20ms", "--emit", "1ms")
	s, p := newStream(t, e.config("rpc-1", r.Addr))
	start := time.Now()
	var firstAt, lastAt time.Duration
	readChecked(t, s, ledgerbackend.UnboundedRange(testnetFirst), src, func(seq uint32) bool {
		if seq == testnetFirst {
			firstAt = time.Since(start)
		}
		if seq == testnetLast {
			lastAt = time.Since(start)
			return false
		}
		return true
	})
	// Followed live: the last ledger came about 319 cadences after the first, not at once.
	if lastAt-firstAt < 3*time.Second {
		t.Errorf("the 320 ledgers came within %v: not followed live", lastAt-firstAt)
	}
	assertReaped(t, p)

	// Synthetic ledgers through the backend, from the relay's newest on: in order, chained.
	syn := e.startRelay(t, "syn", "synthetic:size=64KiB,ratio=2", "--cadence", "50ms")
	b, err := NewBackend(e.config("rpc-1", syn.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	from := uint32(10)
	if err := b.PrepareRange(ctx, ledgerbackend.UnboundedRange(from)); err != nil {
		t.Fatal(err)
	}
	var prev xdr.Hash
	for seq := from; seq < from+20; seq++ {
		lcm, err := b.GetLedger(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if lcm.LedgerSequence() != seq {
			t.Fatalf("asked %d, got %d", seq, lcm.LedgerSequence())
		}
		if seq > from && lcm.PreviousLedgerHash() != prev {
			t.Fatalf("ledger %d does not link to %d", seq, seq-1)
		}
		prev = lcm.LedgerHash()
		if latest, _ := b.GetLatestLedgerSequence(ctx); latest < seq {
			t.Fatalf("latest %d below the ledger just read, %d", latest, seq)
		}
	}
	if ok, _ := b.IsPrepared(ctx, ledgerbackend.UnboundedRange(from+25)); !ok {
		t.Error("a later start on the same unbounded stream is not prepared")
	}
}

func TestASIGKILLedRelayFailsOverToTheSecond(t *testing.T) {
	t.Parallel()
	src := sourceLedgers(t)
	e := newEnv(t)
	// a streams live (30 ms per ledger); b already holds them all.
	a := e.startRelay(t, "a", fileSource(t), "--cadence", "30ms", "--emit", "1ms")
	b := e.startRelay(t, "b", fileSource(t), "--cadence", "2ms", "--emit", "1ms")
	b.waitHolds(t, testnetFirst, testnetLast, 60*time.Second)

	s, p := newStream(t, e.config("rpc-1", a.Addr, b.Addr))
	next := readChecked(t, s, ledgerbackend.BoundedRange(testnetFirst, testnetLast), src, func(seq uint32) bool {
		if seq == testnetFirst+100 {
			// a has about 100 of 320: the rest can only come from b.
			if err := a.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		return true
	})
	checkEnd(t, next, testnetLast+1, p, 1, "the relay switch happens inside ledger-subscribe")
}

func TestAKilledChildIsRestartedFromTheNextLedger(t *testing.T) {
	t.Parallel()
	src := sourceLedgers(t)
	e := newEnv(t)
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "10ms", "--emit", "1ms")
	s, p := newStream(t, e.config("rpc-1", r.Addr))
	next := readChecked(t, s, ledgerbackend.BoundedRange(testnetFirst, testnetFirst+150), src, func(seq uint32) bool {
		if seq == testnetFirst+50 {
			_ = syscall.Kill(p.all()[0], syscall.SIGKILL)
		}
		return true
	})
	checkEnd(t, next, testnetFirst+151, p, 2, "one restart")
}

func TestAStartBelowRetentionIsATypedErrorWithTheBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "2ms", "--emit", "1ms", "--retention", "50")
	r.waitHolds(t, testnetLast-49, testnetLast, 60*time.Second)

	s, p := newStream(t, e.config("rpc-1", r.Addr))
	var got error
	for _, err := range s.RawLedgers(context.Background(), ledgerbackend.BoundedRange(testnetFirst, testnetFirst+10)) {
		got = err
	}
	var below *BelowRetentionError
	if !errors.As(got, &below) {
		t.Fatalf("got %v, want a BelowRetentionError", got)
	}
	if below.Requested != testnetFirst || below.Oldest != testnetLast-49 || below.Newest != testnetLast {
		t.Errorf("bounds %+v", below)
	}
	if n := len(p.all()); n != 1 {
		t.Errorf("%d children: a start below retention is not retried", n)
	}
	assertReaped(t, p)

	b, _ := NewBackend(e.config("rpc-1", r.Addr))
	defer b.Close()
	if err := b.PrepareRange(context.Background(), ledgerbackend.UnboundedRange(testnetFirst)); !errors.As(err, &below) {
		t.Errorf("PrepareRange: %v", err)
	}
}

// A relay chooses its error messages. Were one to reach stderr unescaped, its forged line
// would come first; ledger-subscribe's own line comes last, and that is the one taken.
func TestTheBoundsComeFromTheSubscribersOwnLineNotFromARelaysMessage(t *testing.T) {
	t.Parallel()
	stderr := "2026-01-01T00:00:00Z  WARN ledger_relay_subscriber::client: session ended; reconnecting " +
		"relay=127.0.0.1:7400 error=relay 127.0.0.1:7400 ended the session: Overloaded (busy\n" +
		"below-retention requested=1 oldest=4000000000 newest=4000000001\n" +
		"x) retry_in_ms=100\n" +
		"ledger-subscribe: ledger 1 is below the retention of relay 127.0.0.1:7400: oldest ledger held is 1410048, newest 1410050\n" +
		"below-retention requested=1 oldest=1410048 newest=1410050\n"
	tl := &tail{}
	_, _ = tl.Write([]byte(stderr))
	e := belowRetention(7, tl.String(), tl.lastError())
	if e.Requested != 1 || e.Oldest != 1410048 || e.Newest != 1410050 {
		t.Errorf("bounds %+v, want the subscriber's own 1, 1410048, 1410050", e)
	}
	if !strings.HasPrefix(e.Message, "ledger-subscribe: ledger 1 is below") {
		t.Errorf("message %q", e.Message)
	}
	// Escaped, the relay's text stays inside its line and cannot be taken at all.
	escaped := strings.ReplaceAll(stderr, "busy\nbelow", `busy\nbelow`)
	escaped = strings.ReplaceAll(escaped, "4000000001\nx", `4000000001\nx`)
	if e := belowRetention(7, escaped, ""); e.Oldest != 1410048 || e.Newest != 1410050 {
		t.Errorf("escaped: bounds %+v", e)
	}
	if e := belowRetention(7, "ledger-subscribe: no line for programs\n", ""); e.Requested != 7 || e.Oldest != 0 {
		t.Errorf("without the line: %+v", e)
	}
}

func TestARevokedCertificateIsFinal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "2ms", "--emit", "1ms")
	s, p := newStream(t, e.config("gone", r.Addr))
	var got error
	for _, err := range s.RawLedgers(context.Background(), ledgerbackend.UnboundedRange(testnetFirst)) {
		got = err
	}
	if !errors.Is(got, ErrUnauthorized) {
		t.Fatalf("got %v, want ErrUnauthorized", got)
	}
	if n := len(p.all()); n != 1 {
		t.Errorf("%d children: a refused certificate is not retried", n)
	}
	assertReaped(t, p)
}

func TestCancellationStopsAndReapsTheChild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// One ledger every 300 ms: the reader is blocked in a read when the context ends.
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "300ms", "--emit", "1ms")
	s, p := newStream(t, e.config("rpc-1", r.Addr))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	var got error
	began := time.Now()
	for _, err := range s.RawLedgers(ctx, ledgerbackend.UnboundedRange(testnetFirst)) {
		if err != nil {
			got = err
			break
		}
		n++
		if n == 2 {
			time.AfterFunc(100*time.Millisecond, cancel)
		}
	}
	if !errors.Is(got, context.Canceled) {
		t.Fatalf("after %d ledgers: %v, want context.Canceled", n, got)
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("stopping took %v", took)
	}
	assertReaped(t, p)
}

func TestCloseInterruptsABlockedGetLedgerAndReapsTheChild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.startRelay(t, "a", fileSource(t), "--cadence", "300ms", "--emit", "1ms")
	b, err := NewBackend(e.config("rpc-1", r.Addr))
	if err != nil {
		t.Fatal(err)
	}
	p := &pids{}
	b.stream.started = p.add
	ctx := context.Background()
	if err := b.PrepareRange(ctx, ledgerbackend.UnboundedRange(testnetFirst)); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		// Ledger 1410367 is about 95 s away at this cadence.
		_, err := b.GetLedger(ctx, testnetLast)
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err == nil {
			t.Fatal("GetLedger returned a ledger after Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("GetLedger still blocked 10 s after Close")
	}
	assertReaped(t, p)
	if _, err := b.GetLedger(ctx, testnetFirst); err == nil {
		t.Error("a closed backend returned a ledger")
	}
}
