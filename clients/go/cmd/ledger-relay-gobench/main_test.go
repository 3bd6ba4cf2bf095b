package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A tiny run: every path measures every ledger and the verdicts are printed.
func TestATinyRunPrintsEveryPathAndTheVerdicts(t *testing.T) {
	bin := os.Getenv("LEDGER_RELAY_BIN_DIR")
	if bin == "" {
		bin = "../../../../target/debug"
	}
	var out strings.Builder
	o := options{bin: bin, ledgers: 3, cadence: 200 * time.Millisecond, size: "256KiB",
		payloads: []string{"raw", "compressed"}, rounds: 1, lanes: 2}
	if err := run(o, &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, row := range []string{`\| raw \| subscribe \| 3 \|`, `\| raw \| go \| 3 \|`, `\| raw \| file \| 3 \|`,
		`\| compressed \| go \| 3 \|`, `(?m)^raw: the Go client adds [-+]\d+\.\d ms p99 \(target <= 2: (met|missed)\)`} {
		if !regexp.MustCompile(row).MatchString(text) {
			t.Errorf("no %s in:\n%s", row, text)
		}
	}
}
