package ledgerrelay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func mark(last bool, body []byte) []byte {
	h := uint32(len(body))
	if last {
		h |= 0x80000000
	}
	return append(binary.BigEndian.AppendUint32(nil, h), body...)
}

func TestRecordsAreReadWholeAcrossFragments(t *testing.T) {
	var in []byte
	in = append(in, mark(true, []byte("one"))...)
	in = append(in, mark(false, []byte("tw"))...)
	in = append(in, mark(true, []byte("o"))...)
	in = append(in, mark(true, nil)...)
	rr := newRecordReader(bytes.NewReader(in), 16)
	for _, want := range []string{"one", "two", ""} {
		got, err := rr.next()
		if err != nil || string(got) != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
	if _, err := rr.next(); err != io.EOF {
		t.Fatalf("at the end: %v, want io.EOF", err)
	}
}

func TestABrokenOrOversizedRecordIsAnErrorNotAnAllocation(t *testing.T) {
	cases := map[string][]byte{
		"cut in the header": {0x80, 0},
		"cut in the body":   mark(true, []byte("abcdef"))[:6],
		"no last fragment":  mark(false, []byte("ab")),
	}
	for name, in := range cases {
		if _, err := newRecordReader(bytes.NewReader(in), 16).next(); err != io.ErrUnexpectedEOF {
			t.Errorf("%s: %v, want io.ErrUnexpectedEOF", name, err)
		}
	}
	// A header claiming 2 GiB is refused before anything is allocated for it.
	huge := []byte{0xff, 0xff, 0xff, 0xff}
	if _, err := newRecordReader(bytes.NewReader(huge), 16).next(); !errors.Is(err, errRecordTooLarge) {
		t.Errorf("huge record: %v", err)
	}
	// So are fragments that add up past the bound.
	var in []byte
	in = append(in, mark(false, make([]byte, 10))...)
	in = append(in, mark(true, make([]byte, 10))...)
	if _, err := newRecordReader(bytes.NewReader(in), 16).next(); !errors.Is(err, errRecordTooLarge) {
		t.Errorf("fragments past the bound: %v", err)
	}
}

func FuzzRecordReader(f *testing.F) {
	f.Add(mark(true, []byte("ledger")))
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		rr := newRecordReader(bytes.NewReader(in), 1<<10)
		for i := 0; i < 1000; i++ {
			got, err := rr.next()
			if err != nil {
				return
			}
			if len(got) > 1<<10 {
				t.Fatalf("a record of %d bytes past the bound", len(got))
			}
		}
	})
}
