package ledgerrelay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stellar/go-stellar-sdk/ingest/ledgerbackend"
	"github.com/stellar/go-stellar-sdk/xdr"
)

// Backend is a ledgerbackend.LedgerBackend over relays, with captive core's semantics:
// PrepareRange starts streaming the range and returns once its first ledger arrived;
// GetLedger returns ledgers in order (the last one returned may be asked for again);
// GetLatestLedgerSequence is the bounded range's end, or the newest ledger received.
// Like the SDK's backends it is not safe for concurrent use, except Close.
type Backend struct {
	stream *Stream
	// life ends at Close, which cancels it first so that a blocked call returns at once.
	life     context.Context
	shutdown context.CancelFunc

	mu       sync.Mutex
	prepared *ledgerbackend.Range
	run      *prepared
	closed   atomic.Bool
}

var _ ledgerbackend.LedgerBackend = (*Backend)(nil)

// prepared is one streaming range: a goroutine reads the stream ahead into ch.
type prepared struct {
	cancel  context.CancelFunc
	done    chan struct{}
	ch      chan item
	latest  atomic.Uint32
	next    uint32 // the sequence GetLedger reads next from ch
	cached  *item
	failure error // the stream's error, once read from ch
}

type item struct {
	seq uint32
	raw []byte
	err error
}

// NewBackend returns a backend over the relays of cfg.
func NewBackend(cfg Config) (*Backend, error) {
	s, err := NewStream(cfg)
	if err != nil {
		return nil, err
	}
	life, shutdown := context.WithCancel(context.Background())
	return &Backend{stream: s, life: life, shutdown: shutdown}, nil
}

// PrepareRange starts streaming r (stopping a previous range unless it already covers r) and
// blocks until r's first ledger arrived or the stream failed.
func (b *Backend) PrepareRange(ctx context.Context, r ledgerbackend.Range) error {
	if b.closed.Load() {
		return errors.New("ledgerrelay: backend closed")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.isPrepared(r) {
		return nil
	}
	b.stopRun()
	runCtx, cancel := context.WithCancel(b.life)
	p := &prepared{cancel: cancel, done: make(chan struct{}), ch: make(chan item, 2), next: r.From()}
	go func() {
		defer close(p.done)
		defer close(p.ch)
		for raw, err := range b.stream.RawLedgers(runCtx, r) {
			it := item{err: err}
			if err == nil {
				it.raw = append([]byte(nil), raw...)
				seq, _ := xdr.LedgerCloseMetaView(it.raw).LedgerSequence()
				it.seq = seq
				p.latest.Store(seq)
			}
			select {
			case p.ch <- it:
			case <-runCtx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	b.run = p
	rr := r
	b.prepared = &rr
	// Block until the first ledger (or the stream's error), as captive core does.
	if _, err := b.fetch(ctx, r.From()); err != nil {
		b.stopRun()
		return err
	}
	return nil
}

// IsPrepared reports whether r can be read from the current stream.
func (b *Backend) IsPrepared(_ context.Context, r ledgerbackend.Range) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.isPrepared(r), nil
}

func (b *Backend) isPrepared(r ledgerbackend.Range) bool {
	if b.closed.Load() || b.prepared == nil || b.run == nil || b.run.failure != nil {
		return false
	}
	p := b.run
	startOK := p.next <= r.From() || (p.cached != nil && p.cached.seq == r.From())
	if !b.prepared.Bounded() {
		return startOK
	}
	return startOK && r.Bounded() && r.To() <= b.prepared.To()
}

// GetLedger blocks until ledger seq arrived and returns it. Ledgers before it that were not
// asked for are skipped; a ledger before the last one returned is an error.
func (b *Backend) GetLedger(ctx context.Context, seq uint32) (xdr.LedgerCloseMeta, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	raw, err := b.fetch(ctx, seq)
	if err != nil {
		return xdr.LedgerCloseMeta{}, err
	}
	var lcm xdr.LedgerCloseMeta
	if err := xdr.SafeUnmarshal(raw, &lcm); err != nil {
		return xdr.LedgerCloseMeta{}, fmt.Errorf("ledgerrelay: decoding ledger %d: %w", seq, err)
	}
	return lcm, nil
}

func (b *Backend) fetch(ctx context.Context, seq uint32) ([]byte, error) {
	if b.closed.Load() {
		return nil, errors.New("ledgerrelay: backend closed")
	}
	p := b.run
	if p == nil || b.prepared == nil {
		return nil, errors.New("ledgerrelay: not prepared, call PrepareRange first")
	}
	if p.cached != nil && p.cached.seq == seq {
		return p.cached.raw, nil
	}
	if p.failure != nil {
		return nil, p.failure
	}
	if seq < p.next {
		return nil, fmt.Errorf("ledgerrelay: ledger %d is behind the stream (next is %d)", seq, p.next)
	}
	if b.prepared.Bounded() && seq > b.prepared.To() {
		return nil, fmt.Errorf("ledgerrelay: ledger %d is past the prepared range %v", seq, *b.prepared)
	}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.life.Done():
			return nil, errors.New("ledgerrelay: backend closed")
		case it, ok := <-p.ch:
			if !ok {
				p.failure = errors.New("ledgerrelay: the stream ended")
				return nil, p.failure
			}
			if it.err != nil {
				p.failure = it.err
				return nil, it.err
			}
			p.next = it.seq + 1
			p.cached = &it
			if it.seq == seq {
				return it.raw, nil
			}
		}
	}
}

// GetLatestLedgerSequence returns the bounded range's end, or the newest ledger received.
func (b *Backend) GetLatestLedgerSequence(_ context.Context) (uint32, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errors.New("ledgerrelay: backend closed")
	}
	if b.prepared == nil || b.run == nil {
		return 0, errors.New("ledgerrelay: not prepared, call PrepareRange first")
	}
	if b.prepared.Bounded() {
		return b.prepared.To(), nil
	}
	latest := b.run.latest.Load()
	if c := b.run.cached; c != nil && c.seq > latest {
		latest = c.seq
	}
	return latest, nil
}

// Close stops the stream and its child process; safe from any goroutine.
func (b *Backend) Close() error {
	b.closed.Store(true)
	b.shutdown()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopRun()
	return nil
}

func (b *Backend) stopRun() {
	if b.run != nil {
		b.run.cancel()
		<-b.run.done
	}
	b.run = nil
	b.prepared = nil
}
