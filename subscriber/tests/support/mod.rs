//! Test support: real testnet ledgers, certificate directories, and a tiny in-test relay that
//! speaks the protocol over real QUIC on loopback.

pub mod fake_relay;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use ledger_relay_certs::CertDir;
use ledger_relay_subscriber::frame::Start;
use ledger_relay_subscriber::{Credentials, RelayAddr, SubscribeConfig};
use sha2::{Digest, Sha256};

/// 320 consecutive testnet ledgers (1410048..=1410367) in stellar-core's pipe framing.
pub const TESTNET: &str = testdata!("testnet/testnet-1410048-1410367.lcm-v0.framed.xdr");

/// The first testnet ledger's sequence.
pub const FIRST_SEQ: u32 = 1_410_048;

/// The first `n` testnet ledgers.
pub fn testnet_ledgers(n: usize) -> Vec<Bytes> {
    let file = std::fs::File::open(TESTNET).expect("testnet sample (testdata/)");
    ledger_relay_wire::record::Records::new(file, 256 << 20)
        .take(n)
        .map(|r| Bytes::from(r.expect("valid record")))
        .collect()
}

/// A copy of `ledger` whose `previousLedgerHash` is changed and whose stored hash is the
/// sha256 of the changed header: a self-consistent ledger from "another chain".
pub fn from_another_chain(ledger: &Bytes) -> Bytes {
    let info = ledger_relay_wire::header::peek_header(ledger)
        .unwrap()
        .unwrap();
    assert_eq!(info.lcm_version, 0, "the sample is LedgerCloseMeta v0");
    let mut data = ledger.to_vec();
    // v0: union tag (4), hash (32), then the header: ledgerVersion (4), previousLedgerHash.
    data[40] ^= 0xff;
    let hash: [u8; 32] = Sha256::digest(&data[36..info.header_end]).into();
    data[4..36].copy_from_slice(&hash);
    let changed = ledger_relay_wire::header::peek_header(&data)
        .unwrap()
        .unwrap();
    assert_ne!(changed.previous_hash, info.previous_hash);
    Bytes::from(data)
}

/// A copy of `ledger` (a v0 testnet ledger) that carries `filler` where the schema allows any
/// bytes and the header commits to none: the value of an extra SCP message in `scpInfo`. The
/// header, the hash chain and the content hashes are unchanged, so it verifies as the
/// original does, at any size.
pub fn with_filler(ledger: &Bytes, filler: &[u8]) -> Bytes {
    use stellar_xdr::{
        BytesM, Hash, LedgerCloseMeta, LedgerScpMessages, Limits, NodeId, PublicKey, ReadXdr,
        ScpBallot, ScpEnvelope, ScpHistoryEntry, ScpHistoryEntryV0, ScpStatement,
        ScpStatementExternalize, ScpStatementPledges, Signature, Uint256, Value, VecM, WriteXdr,
    };
    let LedgerCloseMeta::V0(mut v0) = LedgerCloseMeta::from_xdr(ledger, Limits::none()).unwrap()
    else {
        panic!("the testnet sample is v0")
    };
    let seq = v0.ledger_header.header.ledger_seq;
    let envelope = ScpEnvelope {
        statement: ScpStatement {
            node_id: NodeId(PublicKey::PublicKeyTypeEd25519(Uint256([7; 32]))),
            slot_index: u64::from(seq),
            pledges: ScpStatementPledges::Externalize(ScpStatementExternalize {
                commit: ScpBallot {
                    counter: 1,
                    value: Value(BytesM::try_from(filler.to_vec()).unwrap()),
                },
                n_h: 1,
                commit_quorum_set_hash: Hash([0; 32]),
            }),
        },
        signature: Signature(vec![9u8; 64].try_into().unwrap()),
    };
    let mut scp = v0.scp_info.to_vec();
    scp.push(ScpHistoryEntry::V0(ScpHistoryEntryV0 {
        quorum_sets: VecM::default(),
        ledger_messages: LedgerScpMessages {
            ledger_seq: seq,
            messages: vec![envelope].try_into().unwrap(),
        },
    }));
    v0.scp_info = scp.try_into().unwrap();
    Bytes::from(LedgerCloseMeta::V0(v0).to_xdr(Limits::none()).unwrap())
}

/// `ledger-subscribe`'s arguments (without the program name) against `relay` as client `rpc-1`
/// of `pki`, from the first testnet ledger, then `extra`.
pub fn subscribe_args(relay: &str, pki: &Pki, extra: &[&str]) -> Vec<String> {
    let base = ["--relay", relay, "--certs", pki.path().to_str().unwrap()];
    let from = FIRST_SEQ.to_string();
    base.into_iter()
        .chain(["--name", "rpc-1", "--from", &from])
        .chain(extra.iter().copied())
        .map(str::to_owned)
        .collect()
}

/// A certificate directory with a relay certificate (`relay`, SANs localhost and 127.0.0.1)
/// and a client certificate (`rpc-1`).
pub struct Pki {
    /// Keeps the directory alive.
    pub _tmp: tempfile::TempDir,
    /// The directory.
    pub dir: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        // Beyond the 30 days within which the subscriber warns of an expiring relay
        // certificate.
        Pki::with_relay_days(90)
    }

    /// A CA whose relay certificate is valid for `days` days.
    pub fn with_relay_days(days: u32) -> Pki {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        let ca = CertDir::init(&dir, 365).unwrap();
        ca.issue_server("relay", &["localhost".into(), "127.0.0.1".into()], days)
            .unwrap();
        ca.issue_client("rpc-1", 30).unwrap();
        Pki { _tmp: tmp, dir }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn credentials(&self, name: &str) -> Credentials {
        Credentials::from_cert_dir(&self.dir, name).unwrap()
    }
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
    }
}

/// A subscriber configuration for tests: quick timeouts and backoff.
pub fn subscriber_config(
    relays: &[std::net::SocketAddr],
    pki: &Pki,
    start: Start,
    lanes: u8,
) -> SubscribeConfig {
    init_tracing();
    let relays = relays.iter().map(|a| RelayAddr::from(*a)).collect();
    let mut config = SubscribeConfig::new(relays, pki.credentials("rpc-1"));
    config.start = start;
    config.lanes = lanes;
    config.stall_timeout = Duration::from_millis(100);
    config.backoff.min = Duration::from_millis(20);
    config.backoff.max = Duration::from_millis(200);
    config.accept_timeout = Duration::from_secs(5);
    // Debug builds on two shared cores can pause a task for a few hundred ms; the watchdog
    // test sets its own.
    config.heartbeat_timeout = Some(Duration::from_secs(2));
    config
}

/// Runs `f` with a deadline, so a hung test fails instead of hanging CI.
pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test timed out")
}
