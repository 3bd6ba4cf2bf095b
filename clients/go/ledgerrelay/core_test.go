package ledgerrelay

import (
	"context"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stellar/go-stellar-sdk/clients/stellarcore"
	"github.com/stellar/go-stellar-sdk/ingest/ledgerbackend"
	proto "github.com/stellar/go-stellar-sdk/protocols/stellarcore"
	"github.com/stellar/go-stellar-sdk/xdr"

	"github.com/ledger-relay/ledger-relay/clients/go/internal/cluster"
)

// Accounts of the test ledgers: busy pays fees and bumps its sequence in many ledgers and is
// live at the last one; merged was created in 1410049 and merged away in 1410051.
const (
	busyAccount   = "644f51e502775e0ec67b4922b8ded549649f50c3df4e38543abe1894f3be834d"
	mergedAccount = "6ee6f96ff50ad37b9250bf5f248a7060a911d8b22778a6cbe9f15edb4be67649"
)

func accountKey(t testing.TB, hexKey string) xdr.LedgerKey {
	t.Helper()
	raw, err := hex.DecodeString(hexKey)
	if err != nil || len(raw) != 32 {
		t.Fatalf("bad key %q", hexKey)
	}
	var u xdr.Uint256
	copy(u[:], raw)
	id := xdr.AccountId(xdr.PublicKey{Type: xdr.PublicKeyTypePublicKeyTypeEd25519, Ed25519: &u})
	return xdr.LedgerKey{Type: xdr.LedgerEntryTypeAccount, Account: &xdr.LedgerKeyAccount{AccountId: id}}
}

// envelope is a transaction of ops sequence bumps offering fee, as base64.
func envelope(t testing.TB, fee uint32, ops int) string {
	t.Helper()
	var source xdr.Uint256
	source[0] = byte(ops)
	tx := xdr.Transaction{
		SourceAccount: xdr.MuxedAccount{Type: xdr.CryptoKeyTypeKeyTypeEd25519, Ed25519: &source},
		Fee:           xdr.Uint32(fee),
		SeqNum:        1,
		Cond:          xdr.Preconditions{Type: xdr.PreconditionTypePrecondNone},
		Memo:          xdr.Memo{Type: xdr.MemoTypeMemoNone},
	}
	for i := 0; i < ops; i++ {
		bump := &xdr.BumpSequenceOp{BumpTo: xdr.SequenceNumber(i + 2)}
		tx.Operations = append(tx.Operations, xdr.Operation{Body: xdr.OperationBody{Type: xdr.OperationTypeBumpSequence, BumpSequenceOp: bump}})
	}
	env := xdr.TransactionEnvelope{Type: xdr.EnvelopeTypeEnvelopeTypeTx, V1: &xdr.TransactionV1Envelope{Tx: tx}}
	b64, err := xdr.MarshalBase64(env)
	if err != nil {
		t.Fatal(err)
	}
	return b64
}

// coreDoubleRelay is a relay whose pipe: source is the test double of stellar-core replaying
// the test ledgers, with the double's ports forwarded; it returns the relay and the double's
// query URL (to call the double directly).
func (e *env) coreDoubleRelay(t testing.TB) (relay, string) {
	t.Helper()
	ledgers, err := filepath.Abs(testnetFile)
	if err != nil {
		t.Fatal(err)
	}
	httpPort, err1 := cluster.FreePort("tcp")
	queryPort, err2 := cluster.FreePort("tcp")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	source := fmt.Sprintf("pipe:%s --ledgers %s --cadence 10ms --http-port %d --query-port %d",
		e.bin.CoreDouble, ledgers, httpPort, queryPort)
	r := e.startRelay(t, "core-side", source,
		"--core-http", fmt.Sprintf("http://127.0.0.1:%d", httpPort),
		"--core-query", fmt.Sprintf("http://127.0.0.1:%d", queryPort))
	return r, fmt.Sprintf("http://127.0.0.1:%d", queryPort)
}

// stellarRPCsCore is the SDK's captive core as stellar-rpc configures it (both HTTP ports,
// the query server's settings), followed to the last test ledger, and the SDK's core clients
// for its command and query ports, as stellar-rpc builds them.
func (e *env) stellarRPCsCore(t *testing.T, r relay) (command, query *stellarcore.Client) {
	t.Helper()
	httpPort, err1 := cluster.FreePort("tcp")
	queryPort, err2 := cluster.FreePort("tcp")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	core, _ := e.captiveCore(t, r.Addr, func(p *ledgerbackend.CaptiveCoreTomlParams) {
		port := uint(httpPort)
		p.HTTPPort = &port
		p.HTTPQueryServerParams = &ledgerbackend.HTTPQueryServerParams{
			Port: uint16(queryPort), ThreadPoolSize: 2, SnapshotLedgers: 4,
		}
	})
	readRange(t, core, ledgerbackend.UnboundedRange(1410100), testnetLast, sourceLedgers(t))
	command = &stellarcore.Client{URL: fmt.Sprintf("http://localhost:%d", httpPort)}
	query = &stellarcore.Client{URL: fmt.Sprintf("http://localhost:%d", queryPort)}
	return command, query
}

func TestStellarRPCsLedgerEntryQueriesReachTheCoreBehindTheRelay(t *testing.T) {
	e := newEnv(t)
	r, doubleURL := e.coreDoubleRelay(t)
	_, query := e.stellarRPCsCore(t, r)
	direct := &stellarcore.Client{URL: doubleURL}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := []xdr.LedgerKey{accountKey(t, busyAccount), accountKey(t, mergedAccount)}

	// As stellar-rpc asks: at the ledger it has ingested.
	got, err := query.GetLedgerEntries(ctx, testnetLast, keys...)
	if err != nil {
		t.Fatal(err)
	}
	want, err := direct.GetLedgerEntries(ctx, testnetLast, keys...)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("through the relay %+v, from the double %+v", got, want)
	}
	if got.Ledger != testnetLast || len(got.Entries) != 2 ||
		got.Entries[0].State != proto.LedgerEntryStateLive || got.Entries[1].State != proto.LedgerEntryStateNotFound {
		t.Fatalf("want the busy account live and the merged one not found at %d: %+v", testnetLast, got)
	}
	var entry xdr.LedgerEntry
	if err := xdr.SafeUnmarshalBase64(got.Entries[0].Entry, &entry); err != nil || entry.Data.Account == nil {
		t.Fatalf("entry %q: %v", got.Entries[0].Entry, err)
	}

	// No ledgerSeq: pinned to the last ledger the stand-in wrote.
	if pinned, err := query.GetLedgerEntries(ctx, 0, keys...); err != nil || pinned.Ledger != testnetLast {
		t.Fatalf("without ledgerSeq: %+v, %v", pinned, err)
	}
	// Out of the double's snapshot window (4 ledgers), and never written: core's 404.
	for _, seq := range []uint32{testnetLast - 10, testnetLast + 1} {
		_, err := query.GetLedgerEntries(ctx, seq, keys...)
		if err == nil || !strings.Contains(err.Error(), "(404)") {
			t.Errorf("ledgerSeq %d: %v, want a 404", seq, err)
		}
	}
}

func TestStellarRPCsTransactionSubmissionReachesTheCoreBehindTheRelay(t *testing.T) {
	e := newEnv(t)
	r, _ := e.coreDoubleRelay(t)
	command, _ := e.stellarRPCsCore(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	blob := envelope(t, 200, 2)
	for _, want := range []string{proto.TXStatusPending, proto.TXStatusDuplicate} {
		resp, err := command.SubmitTransaction(ctx, blob)
		if err != nil || resp.Status != want || resp.IsException() {
			t.Fatalf("submission: %+v, %v, want %s", resp, err, want)
		}
	}
	resp, err := command.SubmitTransaction(ctx, envelope(t, 199, 2))
	if err != nil || resp.Status != proto.TXStatusError {
		t.Fatalf("a fee under 100 per operation: %+v, %v", resp, err)
	}
	var result xdr.TransactionResult
	if err := xdr.SafeUnmarshalBase64(resp.Error, &result); err != nil {
		t.Fatalf("result %q: %v", resp.Error, err)
	}
	if result.Result.Code != xdr.TransactionResultCodeTxInsufficientFee || result.FeeCharged != 199 {
		t.Fatalf("result %+v, want txINSUFFICIENT_FEE charging 199", result)
	}
	resp, err = command.SubmitTransaction(ctx, "AAAA")
	if err != nil || !resp.IsException() {
		t.Fatalf("an undecodable envelope: %+v, %v", resp, err)
	}
}
