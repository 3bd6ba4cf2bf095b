package ledgerrelay

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"iter"
)

// ReadRecords yields each record of stellar-core's record-marked stream r (what core writes
// to --metadata-output-stream, and ledger-subscribe to --out): one LedgerCloseMeta each,
// borrowed until the next step, none longer than max bytes. It ends at a clean end of r, or
// with an error (io.ErrUnexpectedEOF for a record cut short).
func ReadRecords(r io.Reader, max int) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		rr := newRecordReader(r, max)
		for {
			raw, err := rr.next()
			if err == io.EOF {
				return
			}
			if !yield(raw, err) || err != nil {
				return
			}
		}
	}
}

// recordReader reads stellar-core's record-marked stream (RFC 5531 record marking: a 4-byte
// big-endian header per fragment, the top bit set on a record's last fragment).
type recordReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

func newRecordReader(r io.Reader, max int) *recordReader {
	return &recordReader{r: bufio.NewReaderSize(r, 1<<20), max: max}
}

// errRecordTooLarge is returned for a record longer than the reader's bound.
var errRecordTooLarge = errors.New("ledger record larger than Config.MaxLedgerBytes")

// next returns the next record, borrowed until the following call; io.EOF at a clean end
// between records, io.ErrUnexpectedEOF inside one.
func (rr *recordReader) next() ([]byte, error) {
	rr.buf = rr.buf[:0]
	var head [4]byte
	for first := true; ; first = false {
		if _, err := io.ReadFull(rr.r, head[:]); err != nil {
			if first && errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
			return nil, io.ErrUnexpectedEOF
		}
		h := binary.BigEndian.Uint32(head[:])
		n := int(h & 0x7fffffff)
		if len(rr.buf)+n > rr.max {
			return nil, fmt.Errorf("%w (%d bytes)", errRecordTooLarge, len(rr.buf)+n)
		}
		start := len(rr.buf)
		if cap(rr.buf) < start+n {
			grown := make([]byte, start, start+n)
			copy(grown, rr.buf)
			rr.buf = grown
		}
		rr.buf = rr.buf[:start+n]
		if _, err := io.ReadFull(rr.r, rr.buf[start:]); err != nil {
			return nil, io.ErrUnexpectedEOF
		}
		if h&0x80000000 != 0 {
			return rr.buf, nil
		}
	}
}
