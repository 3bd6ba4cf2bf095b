// Ledger-relay-gobench measures what the Go client adds to ledger-subscribe: it
// starts a relay on loopback with synthetic ledgers and, for raw and compressed payloads,
// compares
//
//   - subscribe: ledger-subscribe --out FILE alone (a file on disk, as an operator writes),
//   - go: the same ledger-subscribe under ledgerrelay.Stream, ledgers read by this process,
//   - file: this process reading a local file in core's framing (what the pipe of a local
//     captive core gives),
//
// live (delivery from the relay's last byte to the consumer, p50/p99/max, and CPU per ledger)
// and catching up (ledgers per second). Runs alternate subscribe and go, round by round.
//
//	go run ./cmd/ledger-relay-gobench -bin ../../target/release
package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ledger-relay/ledger-relay/clients/go/internal/cluster"
	"github.com/ledger-relay/ledger-relay/clients/go/ledgerrelay"
	"github.com/stellar/go-stellar-sdk/ingest/ledgerbackend"
	"github.com/stellar/go-stellar-sdk/xdr"
)

type options struct {
	bin      string
	ledgers  int
	cadence  time.Duration
	size     string
	payloads []string
	rounds   int
	lanes    int
	pipe     int
}

// payload is a synthetic source and the relay codec for it.
var payloads = map[string]struct{ ratio, codec string }{
	"raw":        {"1", "none"},
	"compressed": {"7.6", "zstd"},
}

func main() {
	var o options
	var pl string
	flag.StringVar(&o.bin, "bin", "target/release", "directory of ledger-relay, ledger-certs, ledger-subscribe, ledger-captive-core")
	flag.IntVar(&o.ledgers, "ledgers", 20, "ledgers per run")
	flag.DurationVar(&o.cadence, "cadence", time.Second, "time between ledgers at the relay")
	flag.StringVar(&o.size, "size", "14.5MiB", "ledger size (the relay's synthetic source)")
	flag.StringVar(&pl, "payload", "raw,compressed", "payloads: raw (incompressible, --codec none), compressed (ratio 7.6, zstd)")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds of subscribe, go (alternating)")
	flag.IntVar(&o.lanes, "lanes", 4, "lanes")
	flag.IntVar(&o.pipe, "pipe", 0, "bytes of the pipe from ledger-subscribe to the Go client (0: its default, 1 MiB; -1: the system's 64 KiB)")
	flag.Parse()
	o.payloads = strings.Split(pl, ",")
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ledger-relay-gobench:", err)
		os.Exit(2)
	}
}

// result is one mode's figures over all its runs.
type result struct {
	delivery  []float64 // ms per ledger, live
	childCPU  float64   // ms of ledger-subscribe CPU, live
	selfCPU   float64   // ms of this process's CPU, live
	ledgers   int       // live ledgers
	catchWall float64   // s, catching up
	catchN    int
}

func run(o options, w io.Writer) error {
	bins, err := cluster.FindBins(o.bin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ledger-relay-gobench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	certs := filepath.Join(dir, "ca")
	if err := cluster.NewCA(bins, certs, []string{"bench"}, nil); err != nil {
		return err
	}
	fmt.Fprintf(w, "ledger-relay-gobench: %d ledgers x %d rounds, size %s, cadence %v, %d lanes, pipe %d; load average %s\n\n",
		o.ledgers, o.rounds, o.size, o.cadence, o.lanes, o.pipe, loadAverage())
	fmt.Fprintln(w, "| payload | path | ledgers | delivery p50 ms | p99 ms | max ms | CPU ms/ledger: ledger-subscribe | Go | total | catch-up ledgers/s |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, name := range o.payloads {
		p, ok := payloads[name]
		if !ok {
			return fmt.Errorf("unknown payload %q (raw, compressed)", name)
		}
		source := fmt.Sprintf("synthetic:size=%s,ratio=%s", o.size, p.ratio)
		relay, err := cluster.StartRelay(bins, dir, certs, "relay-"+name, source,
			"--codec", p.codec, "--cadence", o.cadence.String(),
			// Enough for the catch-up runs, and no more: 14.5 MiB ledgers fill a disk fast.
			"--retention", strconv.Itoa(o.ledgers+10))
		if err != nil {
			return err
		}
		res, file, err := measure(o, bins, certs, dir, relay)
		relay.Stop()
		if err != nil {
			return fmt.Errorf("%s: %w (relay log: %s)", name, err, relay.LogTail(5))
		}
		sub, gor := res["subscribe"], res["go"]
		for _, mode := range []string{"subscribe", "go"} {
			r := res[mode]
			total := (r.childCPU + r.selfCPU) / float64(r.ledgers)
			goCPU := "-"
			if mode == "go" {
				goCPU = fmt.Sprintf("%.1f", r.selfCPU/float64(r.ledgers))
			}
			fmt.Fprintf(w, "| %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %s | %.1f | %.1f |\n", name, mode, r.ledgers,
				pct(r.delivery, 0.5), pct(r.delivery, 0.99), pct(r.delivery, 1),
				r.childCPU/float64(r.ledgers), goCPU, total, float64(r.catchN)/r.catchWall)
		}
		fmt.Fprintf(w, "| %s | file | %d | - | - | - | - | %.1f | %.1f | %.1f |\n", name, file.catchN,
			file.selfCPU/float64(file.catchN), file.selfCPU/float64(file.catchN), float64(file.catchN)/file.catchWall)
		addP99 := pct(gor.delivery, 0.99) - pct(sub.delivery, 0.99)
		subTotal := sub.childCPU / float64(sub.ledgers)
		goTotal := (gor.childCPU + gor.selfCPU) / float64(gor.ledgers)
		addCPU := 100 * (goTotal - subTotal) / subTotal
		defer fmt.Fprintf(w, "%s: the Go client adds %+.1f ms p99 (target <= 2: %s) and %+.1f%% CPU per ledger (target <= 10%%: %s)\n",
			name, addP99, verdict(addP99 <= 2), addCPU, verdict(addCPU <= 10))
	}
	fmt.Fprintln(w)
	return nil
}

// loadAverage is the system's 1, 5 and 15 minute load averages from /proc/loadavg, or
// "unknown" where there is no such file (macOS).
func loadAverage() string {
	load, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(load)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// pct is the q-quantile (nearest rank) of v.
func pct(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(v))
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func measure(o options, bins cluster.Bins, certs, dir string, relay *cluster.Relay) (map[string]*result, *result, error) {
	res := map[string]*result{"subscribe": {}, "go": {}}
	// Live: each run starts at the ledger after the newest held, so every ledger is
	// delivered as the relay gets it.
	for round := 0; round < o.rounds; round++ {
		for _, mode := range []string{"subscribe", "go"} {
			_, newest, err := relay.WaitHolds(func(_, n uint32) bool { return n > 0 }, 60*time.Second)
			if err != nil {
				return nil, nil, err
			}
			if err := once(o, bins, certs, dir, relay, mode, newest+1, res[mode], false); err != nil {
				return nil, nil, err
			}
		}
	}
	// Catching up: the last o.ledgers held, all in the ring.
	out := filepath.Join(dir, "ledgers.xdr")
	for _, mode := range []string{"subscribe", "go"} {
		_, newest, err := relay.Holds()
		if err != nil {
			return nil, nil, err
		}
		if err := once(o, bins, certs, dir, relay, mode, newest-uint32(o.ledgers)+1, res[mode], true); err != nil {
			return nil, nil, err
		}
	}
	// The local file the catch-up subscribe run wrote, read as a captive core's pipe is.
	file := &result{}
	f, err := os.Open(out)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	cpu0, start := selfCPU(), time.Now()
	for raw, err := range ledgerrelay.ReadRecords(f, 256<<20) {
		if err != nil {
			return nil, nil, err
		}
		if _, err := xdr.LedgerCloseMetaView(raw).LedgerSequence(); err != nil {
			return nil, nil, err
		}
		file.catchN++
	}
	file.catchWall = time.Since(start).Seconds()
	file.selfCPU = selfCPU() - cpu0
	return res, file, nil
}

// once runs one mode from ledger from for o.ledgers ledgers and adds its figures to r.
func once(o options, bins cluster.Bins, certs, dir string, relay *cluster.Relay, mode string, from uint32, r *result, catchUp bool) error {
	stats := filepath.Join(dir, "stats.csv")
	args := []string{"--relay", relay.Addr, "--certs", certs, "--name", "bench", "--lanes", strconv.Itoa(o.lanes),
		"--from", strconv.FormatUint(uint64(from), 10), "--count", strconv.Itoa(o.ledgers), "--stats", stats, "--quiet"}
	child0, self0 := childCPU(), selfCPU()
	start := time.Now()
	gotAt := map[uint32]float64{} // ms since the epoch, when this process had the ledger
	switch mode {
	case "subscribe":
		// A file, as an operator's --out: the live runs overwrite one, the catch-up run
		// writes the file the "file" path reads.
		out := filepath.Join(dir, "live.xdr")
		if catchUp {
			out = filepath.Join(dir, "ledgers.xdr")
		}
		cmd := exec.Command(bins.Subscribe, append(args, "--out", out)...)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("ledger-subscribe: %w", err)
		}
	case "go":
		s, err := ledgerrelay.NewStream(ledgerrelay.Config{Binary: bins.Subscribe, Relays: []string{relay.Addr},
			CertDir: certs, Name: "bench", Lanes: o.lanes, PipeBytes: o.pipe, ExtraArgs: []string{"--stats", stats}, Stderr: os.Stderr})
		if err != nil {
			return err
		}
		rng := ledgerbackend.BoundedRange(from, from+uint32(o.ledgers)-1)
		for raw, err := range s.RawLedgers(context.Background(), rng) {
			if err != nil {
				return err
			}
			now := float64(time.Now().UnixNano()) / 1e6
			seq, err := xdr.LedgerCloseMetaView(raw).LedgerSequence()
			if err != nil {
				return err
			}
			gotAt[seq] = now
		}
	}
	wall := time.Since(start).Seconds()
	if catchUp {
		r.catchWall += wall
		r.catchN += o.ledgers
		return nil
	}
	rows, err := readStats(stats)
	if err != nil {
		return err
	}
	for _, row := range rows {
		d := row.delivery
		if mode == "go" {
			at, ok := gotAt[row.seq]
			if !ok {
				return fmt.Errorf("ledger %d in the stats was not read", row.seq)
			}
			// From the relay's last byte (received - delivery) to this process.
			d = at - (row.received - row.delivery)
		}
		r.delivery = append(r.delivery, d)
	}
	r.childCPU += childCPU() - child0
	if mode == "go" {
		r.selfCPU += selfCPU() - self0
	}
	r.ledgers += len(rows)
	return nil
}

type statsRow struct {
	seq                uint32
	delivery, received float64
}

// readStats reads ledger-subscribe's --stats CSV: seq, raw_bytes, wire_bytes, delivery_ms,
// inter_arrival_ms, received_unix_ms.
func readStats(path string) ([]statsRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(bufio.NewReader(f)).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows []statsRow
	for _, rec := range recs[1:] {
		seq, err1 := strconv.ParseUint(rec[0], 10, 32)
		d, err2 := strconv.ParseFloat(rec[3], 64)
		at, err3 := strconv.ParseFloat(rec[5], 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("%s: bad row %v", path, rec)
		}
		rows = append(rows, statsRow{uint32(seq), d, at})
	}
	return rows, nil
}

func cpuMs(who int) float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
}

// childCPU is the CPU of the children this process has reaped.
func childCPU() float64 { return cpuMs(syscall.RUSAGE_CHILDREN) }

// selfCPU is this process's CPU.
func selfCPU() float64 { return cpuMs(syscall.RUSAGE_SELF) }
