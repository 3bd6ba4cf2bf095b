package ledgerrelay

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stellar/go-stellar-sdk/ingest/ledgerbackend"
	"github.com/stellar/go-stellar-sdk/xdr"
)

// Config says how to reach the relays. Relays, CertDir and Name are required.
type Config struct {
	// Binary is the ledger-subscribe executable (default: "ledger-subscribe" on PATH).
	Binary string
	// Relays are the relays' addresses, HOST:PORT, in order of preference (ledger-subscribe
	// --relay).
	Relays []string
	// CertDir holds ca.pem, Name.pem and Name.key (ledger-subscribe --certs).
	CertDir string
	// Name is this subscriber's certificate name (ledger-subscribe --name).
	Name string
	// Hedge subscribes to every relay at once and takes each ledger from whichever delivers
	// it first (ledger-subscribe --hedge).
	Hedge bool
	// Lanes is the number of lanes per relay (0: ledger-subscribe's default, 4).
	Lanes int
	// ServerName is the TLS name the relays' certificates must hold (default: each
	// address's host).
	ServerName string
	// ExtraArgs are added to ledger-subscribe's command line (for example --max-mtu 8952).
	ExtraArgs []string
	// MaxRestarts is how many times in a row a child that failed without delivering a ledger
	// is restarted before the stream fails (0: 5; negative: never restarted).
	MaxRestarts int
	// RestartDelay is the pause before a restart (0: 1s).
	RestartDelay time.Duration
	// StopTimeout is how long a stopped child may take to exit after SIGTERM before it is
	// killed (0: 5s).
	StopTimeout time.Duration
	// PipeBytes is the size asked of the kernel for the pipe from the child (0: 1 MiB, the
	// default limit of /proc/sys/fs/pipe-max-size; negative: the system's 64 KiB). Only
	// Linux can resize a pipe: elsewhere the system's size is used.
	PipeBytes int
	// MaxLedgerBytes bounds one ledger record (0: 256 MiB).
	MaxLedgerBytes int
	// Stderr receives the child's log lines (nil: kept only for error messages).
	Stderr io.Writer
}

func (c Config) withDefaults() Config {
	if c.Binary == "" {
		c.Binary = "ledger-subscribe"
	}
	if c.MaxRestarts == 0 {
		c.MaxRestarts = 5
	}
	if c.RestartDelay == 0 {
		c.RestartDelay = time.Second
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 5 * time.Second
	}
	if c.PipeBytes == 0 {
		c.PipeBytes = 1 << 20
	}
	if c.MaxLedgerBytes == 0 {
		c.MaxLedgerBytes = 256 << 20
	}
	return c
}

// Exit codes of ledger-subscribe, from the command contract in docs/operations.md. The
// stream reads them to tell how a child ended; an [ExitError]'s Code is ExitFailed,
// ExitSignaled, or another code the child ended with (101: a panic).
const (
	// ExitDone means ledger-subscribe wrote every ledger of its --count and stopped, or was
	// asked to stop (SIGINT, SIGTERM).
	ExitDone = 0
	// ExitFailed means any other error: bad arguments, no relay reachable at the start, a
	// ledger that failed a check. The stream restarts the child after it.
	ExitFailed = 2
	// ExitUnauthorized means a certificate was refused: this subscriber's by the relay
	// (revoked, expired, not allowed), or the relay's by this subscriber. The stream ends
	// with [ErrUnauthorized].
	ExitUnauthorized = 3
	// ExitBelowRetention means the start is older than the oldest ledger every relay holds.
	// The stream ends with a [*BelowRetentionError].
	ExitBelowRetention = 4
	// ExitSignaled is not ledger-subscribe's but this package's: the child was killed by a
	// signal, or could not be waited for.
	ExitSignaled = -1
)

// ErrUnauthorized is the stream's error when a certificate was refused: the relay refused
// this subscriber's (revoked, expired, not allowed), or this subscriber refused the relay's
// (ledger-subscribe exit 3). It is final: the stream is not restarted.
var ErrUnauthorized = errors.New("ledgerrelay: certificate refused (ledger-subscribe exit 3)")

// ErrTruncated is the stream's error when a bounded range ended before its last ledger: the
// child exited 0 early, stopped from outside.
var ErrTruncated = errors.New("ledgerrelay: bounded range cut short")

// BelowRetentionError is the stream's error when the requested start is older than the
// oldest ledger every relay holds (ledger-subscribe exit 4). It is final: read the older
// ledgers from a history archive or a data lake.
type BelowRetentionError struct {
	// Requested is the ledger the child was asked to start at.
	Requested uint32
	// Oldest and Newest are the ledgers the relay holds, as ledger-subscribe reported them
	// (0: unknown).
	Oldest, Newest uint32
	// Message is ledger-subscribe's error line.
	Message string
}

// Error names the requested ledger and the relay's bounds.
func (e *BelowRetentionError) Error() string {
	return fmt.Sprintf("ledgerrelay: ledger %d is below the relays' retention (oldest held %d, newest %d)",
		e.Requested, e.Oldest, e.Newest)
}

// ExitError is the stream's error when the child failed, for a reason other than a refused
// certificate or a start below retention, Config.MaxRestarts times in a row without
// delivering a ledger.
type ExitError struct {
	// Code is the exit code: ExitFailed, ExitSignaled, or another code the child ended with.
	Code int
	// Message is the child's last error line.
	Message string
}

// Error names the exit code and the child's last error line.
func (e *ExitError) Error() string {
	return fmt.Sprintf("ledgerrelay: ledger-subscribe exited with %d: %s", e.Code, e.Message)
}

// Stream is a ledgerbackend.LedgerStream over relays: each iteration of RawLedgers runs
// ledger-subscribe as a child process and reads its standard output.
type Stream struct {
	cfg Config
	// started, if set, is told each child's pid (tests).
	started func(pid int)
}

var _ ledgerbackend.LedgerStream = (*Stream)(nil)

// NewStream checks cfg and returns a stream; nothing runs until RawLedgers is iterated.
func NewStream(cfg Config) (*Stream, error) {
	if len(cfg.Relays) == 0 || cfg.CertDir == "" || cfg.Name == "" {
		return nil, errors.New("ledgerrelay: Config needs Relays, CertDir and Name")
	}
	return &Stream{cfg: cfg.withDefaults()}, nil
}

// RawLedgers yields each ledger's LedgerCloseMeta XDR in ledgerRange, in order, each
// verified by ledger-subscribe. Each slice is borrowed until the next step. An unbounded
// range runs until the loop breaks or ctx is cancelled. Options (WithStreamMetrics) are
// accepted and ignored: their settings are private to the SDK.
func (s *Stream) RawLedgers(ctx context.Context, r ledgerbackend.Range, _ ...ledgerbackend.StreamOption) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		next := r.From()
		if next < 2 {
			next = 2
		}
		var anchor string
		failures := 0
		for {
			var count uint32
			if r.Bounded() {
				if next > r.To() {
					return
				}
				count = r.To() - next + 1
			}
			c, err := s.start(next, count, anchor)
			if err != nil {
				yield(nil, err)
				return
			}
			// Cancellation interrupts a blocked read: the child is told to stop, and its
			// output ends.
			unhook := context.AfterFunc(ctx, func() { c.signalStop(s.cfg.StopTimeout) })
			progressed := false
			stop := false
			for {
				raw, rerr := c.records.next()
				if errors.Is(rerr, errRecordTooLarge) {
					c.stop(s.cfg.StopTimeout)
					yield(nil, rerr)
					return
				}
				if rerr != nil {
					break
				}
				view := xdr.LedgerCloseMetaView(raw)
				seq, verr := view.LedgerSequence()
				if verr != nil || seq != next {
					c.stop(s.cfg.StopTimeout)
					yield(nil, fmt.Errorf("ledgerrelay: expected ledger %d, read %d (%v)", next, seq, verr))
					return
				}
				if hash, herr := view.LedgerHash(); herr == nil {
					anchor = fmt.Sprintf("%d:%s", seq, hex.EncodeToString(hash))
				}
				progressed = true
				next++
				if !yield(raw, nil) {
					stop = true
					break
				}
				if ctx.Err() != nil {
					stop = true
					break
				}
			}
			unhook()
			if stop || ctx.Err() != nil {
				c.stop(s.cfg.StopTimeout)
				if !stop {
					yield(nil, ctx.Err())
				}
				return
			}
			// The child ended its output: find out why.
			code, msg := c.wait()
			switch {
			case code == ExitDone && r.Bounded() && next > r.To():
				return
			case code == ExitDone:
				yield(nil, fmt.Errorf("%w: stopped before ledger %d", ErrTruncated, next))
				return
			case code == ExitUnauthorized:
				yield(nil, fmt.Errorf("%w: %s", ErrUnauthorized, msg))
				return
			case code == ExitBelowRetention:
				yield(nil, belowRetention(next, c.stderr.String(), msg))
				return
			}
			if progressed {
				failures = 0
			}
			failures++
			if s.cfg.MaxRestarts < 0 || failures > s.cfg.MaxRestarts {
				yield(nil, &ExitError{Code: code, Message: msg})
				return
			}
			select {
			case <-ctx.Done():
				yield(nil, ctx.Err())
				return
			case <-time.After(s.cfg.RestartDelay):
			}
		}
	}
}

// belowRetentionLine is the line ledger-subscribe writes for programs when it exits 4. It
// writes it last, after its error line, and escapes every line that may quote a relay, so no
// text a relay chose can start a line of stderr. The last such line is taken all the same:
// whatever came before it is not the subscriber's verdict.
var belowRetentionLine = regexp.MustCompile(`(?m)^below-retention requested=(\d+) oldest=(\d+) newest=(\d+)$`)

func belowRetention(next uint32, stderr, msg string) *BelowRetentionError {
	e := &BelowRetentionError{Requested: next, Message: msg}
	if all := belowRetentionLine.FindAllStringSubmatch(stderr, -1); len(all) > 0 {
		m := all[len(all)-1]
		parse := func(s string) uint32 { v, _ := strconv.ParseUint(s, 10, 32); return uint32(v) }
		e.Requested, e.Oldest, e.Newest = parse(m[1]), parse(m[2]), parse(m[3])
	}
	return e
}

// child is one ledger-subscribe process.
type child struct {
	cmd     *exec.Cmd
	stdout  *os.File
	records *recordReader
	stderr  *tail
	waited  sync.Once
	code    int
}

func (s *Stream) start(from, count uint32, anchor string) (*child, error) {
	args := []string{
		"--relay", strings.Join(s.cfg.Relays, ","),
		"--certs", s.cfg.CertDir,
		"--name", s.cfg.Name,
		"--from", strconv.FormatUint(uint64(from), 10),
		"--out", "-",
		"--quiet",
	}
	if anchor != "" {
		args = append(args, "--anchor", anchor)
	}
	if count > 0 {
		args = append(args, "--count", strconv.FormatUint(uint64(count), 10))
	}
	if s.cfg.Hedge {
		args = append(args, "--hedge")
	}
	if s.cfg.Lanes > 0 {
		args = append(args, "--lanes", strconv.Itoa(s.cfg.Lanes))
	}
	if s.cfg.ServerName != "" {
		args = append(args, "--server-name", s.cfg.ServerName)
	}
	args = append(args, s.cfg.ExtraArgs...)
	cmd := exec.Command(s.cfg.Binary, args...)
	dieWithParent(cmd)
	t := &tail{copyTo: s.cfg.Stderr}
	cmd.Stderr = t
	stdout, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	if s.cfg.PipeBytes > 0 {
		setPipeSize(w, s.cfg.PipeBytes)
	}
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		stdout.Close()
		return nil, fmt.Errorf("ledgerrelay: cannot start %s: %w", s.cfg.Binary, err)
	}
	if s.started != nil {
		s.started(cmd.Process.Pid)
	}
	return &child{cmd: cmd, stdout: stdout, records: newRecordReader(stdout, s.cfg.MaxLedgerBytes), stderr: t}, nil
}

// wait reaps the child: its exit code (ExitSignaled for a signal) and last error line.
func (c *child) wait() (int, string) {
	c.waited.Do(func() {
		err := c.cmd.Wait()
		c.stdout.Close()
		var exit *exec.ExitError
		switch {
		case err == nil:
			c.code = ExitDone
		case errors.As(err, &exit):
			c.code = exit.ExitCode()
		default:
			c.code = ExitSignaled
		}
	})
	return c.code, c.stderr.lastError()
}

// signalStop sends SIGTERM, and SIGKILL after timeout if it is still running; it does not
// reap.
func (c *child) signalStop(timeout time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	time.AfterFunc(timeout, func() { _ = c.cmd.Process.Kill() })
}

// stop asks the child to stop (SIGTERM), kills it after timeout, and reaps it.
func (c *child) stop(timeout time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		c.wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// tail keeps the last 64 KiB of the child's stderr and copies it on.
type tail struct {
	mu     sync.Mutex
	buf    []byte
	copyTo io.Writer
}

// Write keeps p and copies it on; it never fails.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 64<<10 {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-(64<<10):]...)
	}
	if t.copyTo != nil {
		_, _ = t.copyTo.Write(p)
	}
	return len(p), nil
}

// String is the text kept.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// lastError is the last line starting "ledger-subscribe:" (the error), else the last line.
func (t *tail) lastError() string {
	lines := strings.Split(strings.TrimSpace(t.String()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "ledger-subscribe:") {
			return lines[i]
		}
	}
	return lines[len(lines)-1]
}
