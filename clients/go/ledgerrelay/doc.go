// Package ledgerrelay feeds Stellar's Go ingestion code (stellar-rpc, Horizon, Galexie and
// anything else built on the Go SDK's ingest/ledgerbackend) from Ledger Relays instead of a
// captive stellar-core.
//
// It runs ledger-subscribe, the relay's subscriber, as a child process and reads its standard
// output, which is stellar-core's own metadata framing. The child does everything the relay
// protocol needs (multi-lane QUIC with mutual TLS, reassembly, the five integrity checks down
// to Stellar's header hash chain and the transaction-set and result hashes, failover between
// relays, hedging); this package turns that into the SDK's two interfaces:
//
//   - [Stream] implements ledgerbackend.LedgerStream (RawLedgers over a bounded or unbounded
//     range), the seam Stellar's remote-core proof of concept wires into stellar-rpc.
//   - [Backend] implements ledgerbackend.LedgerBackend (PrepareRange, GetLedger,
//     GetLatestLedgerSequence, IsPrepared, Close) for code that takes a LedgerBackend.
//
// Errors: a start below every relay's retention is a [*BelowRetentionError] with the relay's
// bounds; a refused or revoked certificate is [ErrUnauthorized] and final; any other exit of
// the child (a relay lost for longer than ledger-subscribe waits, a crash) restarts it from
// the next ledger, anchored to the last ledger's hash, up to Config.MaxRestarts times in a
// row without progress. Cancelling the context stops the child (SIGTERM, then SIGKILL after
// Config.StopTimeout) and reaps it.
//
// The other way in needs no Go code at all: ledger-captive-core, a stand-in for the
// stellar-core binary, for an unmodified CaptiveStellarCore (see docs/rpc.md).
package ledgerrelay
