//! stellar-core's HTTP ports carried through relays, end to end with the real binaries: the
//! stand-in (`ledger-captive-core`) answering on core's command and query ports, one or two
//! `ledger-relay` processes between, and behind them the test double of stellar-core
//! (`ledger-relay-core-double`, in this process). The test drives the double as core runs:
//! it closes a ledger, then writes it to the relay's `fifo:` source. Every answer through the
//! stand-in is compared with the double's own answer to the same request: status,
//! `Content-Type` and body, byte for byte.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use ledger_relay_core_double::{CoreDouble, Servers, Settings};
use ledger_relay_wire::core_http::CorePort;
use ledger_relay_wire::record::write_record_to;
use stellar_xdr::{
    AccountId, LedgerKey, LedgerKeyAccount, Limits, Operation, PublicKey, Transaction,
    TransactionEnvelope, TransactionV1Envelope, Uint256, WriteXdr,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::{metric_at, metrics_addr, RelayProcess};
use crate::support::{free_port, within, TestDir, FIRST, TESTNET};

/// A busy testnet account, live throughout; and one merged away in 1410051.
const BUSY: &str = "644f51e502775e0ec67b4922b8ded549649f50c3df4e38543abe1894f3be834d";
const MERGED: &str = "6ee6f96ff50ad37b9250bf5f248a7060a911d8b22778a6cbe9f15edb4be67649";

/// An HTTP answer as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// One request on a fresh connection (`Connection: close`): `POST` with `body`, or `GET`.
pub(crate) async fn call(addr: SocketAddr, target: &str, body: Option<&str>) -> Answer {
    try_call(addr, target, body)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// [`call`] on one connection, or why it could not connect.
async fn try_call(addr: SocketAddr, target: &str, body: Option<&str>) -> std::io::Result<Answer> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = match body {
        Some(b) => format!(
            "POST {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        ),
        None => format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    };
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut raw))
        .await
        .expect("an answer within 20 s")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("headers");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    Ok(Answer {
        status,
        content_type,
        body: body.to_owned(),
    })
}

/// Base64 of the account key of a hex public key, escaped as stellar-rpc's client escapes it.
pub(crate) fn account_key(hex: &str) -> String {
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let key = LedgerKey::Account(LedgerKeyAccount {
        account_id: AccountId(PublicKey::PublicKeyTypeEd25519(Uint256(k))),
    });
    escaped(&key)
}

fn escaped(v: &impl WriteXdr) -> String {
    ledger_relay_core_double::form::encode_xdr(v).unwrap()
}

/// `/tx?blob=` of a transaction of `ops` operations offering `fee`.
pub(crate) fn tx_target(fee: u32, ops: usize) -> String {
    let tx = Transaction {
        fee,
        operations: vec![Operation::default(); ops].try_into().unwrap(),
        ..Default::default()
    };
    let env = TransactionEnvelope::Tx(TransactionV1Envelope {
        tx,
        signatures: Default::default(),
    });
    format!("/tx?blob={}", escaped(&env))
}

/// The double behind the relay, with the FIFO its ledgers go to.
pub(crate) struct Core {
    pub double: CoreDouble,
    pub servers: Servers,
    fifo: PathBuf,
    writer: std::fs::File,
}

impl Core {
    /// The testnet double (window of 4 ledgers) serving both ports on loopback, and the FIFO
    /// `dir/meta.fifo` opened for writing (read and write, so that it neither blocks nor ends
    /// before the relay opens it).
    pub(crate) async fn start(dir: &Path) -> Core {
        let double = CoreDouble::load(Path::new(TESTNET), Settings::default()).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let servers = Servers::start(double.clone(), Some(any), Some(any))
            .await
            .unwrap();
        let fifo = dir.join("meta.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        Core {
            double,
            servers,
            fifo,
            writer,
        }
    }

    /// The relay's source and its `--core-*` flags for this double.
    pub(crate) fn relay_args(&self) -> Vec<String> {
        let url = |p| format!("http://{}", self.servers.addr(p).unwrap());
        vec![
            "--source".into(),
            format!("fifo:{}", self.fifo.display()),
            "--core-http".into(),
            url(CorePort::Command),
            "--core-query".into(),
            url(CorePort::Query),
        ]
    }

    /// Closes ledgers through `seq` and writes each to the relay, as core does.
    pub(crate) fn close_through(&mut self, seq: u32) {
        for closed in self.double.close_through(seq) {
            write_record_to(&mut self.writer, &closed.raw).unwrap();
        }
    }

    pub(crate) fn addr(&self, port: CorePort) -> SocketAddr {
        self.servers.addr(port).unwrap()
    }
}

/// A relay process with `args`, and its port.
pub(crate) async fn relay(dir: &TestDir, name: &str, args: &[String]) -> (RelayProcess, u16) {
    let port = free_port();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let data = dir.path().join(name);
    (
        RelayProcess::start(dir.certs.path(), &data, port, &args).await,
        port,
    )
}

/// `ledger-captive-core` as the SDK runs it for stellar-rpc (`new-db`, `catchup` to the
/// ledger before the first, `run` with its meta to /dev/null), as client `name` of the relay
/// on `port`, its two ports from its config file.
pub(crate) struct StandIn {
    child: tokio::process::Child,
    pub http: SocketAddr,
    pub query: SocketAddr,
    log: PathBuf,
}

impl StandIn {
    /// Starts the stand-in on two free ports. They are picked here and bound by the stand-in a
    /// moment later (after `new-db` and `catchup`): another process on the machine can take
    /// one in between, and the stand-in then exits, unable to listen; it is started again on
    /// other ports, a bounded number of times.
    pub(crate) async fn start(dir: &TestDir, tag: &str, name: &str, port: u16) -> StandIn {
        for attempt in 1..=3 {
            let mut s = StandIn::spawn(dir, tag, name, port);
            match s.wait_listening().await {
                Ok(()) => return s,
                Err(log) if attempt < 3 && log.contains("cannot listen on") => {
                    eprintln!("attempt {attempt}: a port was taken; again on others\n{log}");
                }
                Err(log) => panic!("{log}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn spawn(dir: &TestDir, tag: &str, name: &str, port: u16) -> StandIn {
        let bin =
            Path::new(env!("CARGO_BIN_EXE_ledger-relay")).with_file_name("ledger-captive-core");
        assert!(
            bin.exists(),
            "{} is missing: run the workspace's tests (`cargo test --workspace`) or `cargo build --bins` first",
            bin.display()
        );
        let home = dir.path().join(tag);
        std::fs::create_dir_all(&home).unwrap();
        let free = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (http, query) = (free(), free());
        let conf = home.join("stellar-core.conf");
        let text = format!(
            "HTTP_PORT = {}\nHTTP_QUERY_PORT = {}\n",
            http.port(),
            query.port()
        );
        std::fs::write(&conf, text).unwrap();
        let (b, c) = (bin.display(), conf.display());
        let script = format!(
            "{b} --conf {c} new-db && {b} --conf {c} catchup {}/0 && exec {b} --conf {c} run --metadata-output-stream fd:3 3>/dev/null",
            FIRST - 1
        );
        let log = home.join("stand-in.log");
        let child = tokio::process::Command::new("sh")
            .args(["-c", &script])
            .current_dir(&home)
            .env("LEDGER_CAPTIVE_CORE_CONFIG", "")
            .env("LEDGER_CAPTIVE_CORE_RELAY", format!("127.0.0.1:{port}"))
            .env("LEDGER_CAPTIVE_CORE_CERTS", dir.certs.path())
            .env("LEDGER_CAPTIVE_CORE_NAME", name)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        StandIn {
            child,
            http,
            query,
            log,
        }
    }

    /// Waits until the stand-in serves both its ports, as its log says (a connection alone
    /// could reach another process that took the port meanwhile); its exit status and log if
    /// it exited instead.
    async fn wait_listening(&mut self) -> Result<(), String> {
        const SERVING: &str = "serving stellar-core's port through the relays";
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.log().matches(SERVING).count() < 2 {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Err(format!("the stand-in exited ({st}): {}", self.log()));
            }
            assert!(
                Instant::now() < deadline,
                "the stand-in does not listen: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The double, a relay forwarding to it with `extra` flags, and a stand-in (`rpc-1`) on the
/// relay, with ledgers through `FIRST + 10` written and the stand-in holding them.
pub(crate) struct Rig {
    pub dir: TestDir,
    pub core: Core,
    /// Kept running for the test's length.
    pub _relay: RelayProcess,
    pub port: u16,
    pub stand_in: StandIn,
}

/// The last ledger the rig closes at the start.
pub(crate) const TIP: u32 = FIRST + 10;

impl Rig {
    pub(crate) async fn start(extra: &[&str]) -> Rig {
        let dir = TestDir::new();
        let mut core = Core::start(dir.path()).await;
        let mut args = core.relay_args();
        args.extend(extra.iter().map(|s| s.to_string()));
        let (relay, port) = relay(&dir, "root", &args).await;
        let stand_in = StandIn::start(&dir, "stand-in", "rpc-1", port).await;
        core.close_through(TIP);
        wait_written(&stand_in, TIP).await;
        Rig {
            dir,
            core,
            _relay: relay,
            port,
            stand_in,
        }
    }

    /// The same request to the stand-in's `port` and to the double's.
    pub(crate) async fn both(
        &self,
        port: CorePort,
        target: &str,
        body: Option<&str>,
    ) -> (Answer, Answer) {
        let through = match port {
            CorePort::Command => self.stand_in.http,
            CorePort::Query => self.stand_in.query,
        };
        let relayed = call(through, target, body).await;
        let direct = call(self.core.addr(port), target, body).await;
        (relayed, direct)
    }
}

/// `key=...&key=...` of `accounts`, and `&ledgerSeq=N` when given.
pub(crate) fn form(accounts: &[&str], seq: Option<u32>) -> String {
    let mut parts: Vec<String> = accounts
        .iter()
        .map(|a| format!("key={}", account_key(a)))
        .collect();
    parts.extend(seq.map(|s| format!("ledgerSeq={s}")));
    parts.join("&")
}

/// The `ledgerSeq` of a 200 answer.
fn answered_seq(a: &Answer) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(&a.body).ok()?;
    v["ledgerSeq"].as_u64()
}

/// Waits until the stand-in pins a query without `ledgerSeq` to `seq`: it has written `seq`.
pub(crate) async fn wait_written(s: &StandIn, seq: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = form(&[BUSY], None);
    loop {
        // One connection per attempt; a refusal is retried, and reported with the stand-in's
        // log if it lasts.
        let a = try_call(s.query, "/getledgerentry", Some(&body)).await;
        if a.as_ref().ok().and_then(answered_seq) == Some(u64::from(seq)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the stand-in did not reach {seq}: {a:?}\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An account live at `seq` whose entry changed after it, by [`TIP`]: its key, escaped.
fn changed_account(double: &CoreDouble, seq: u32) -> String {
    let book = double.read_book();
    let changed = |k: &&LedgerKey| {
        let versions = book.state.history(k).iter();
        versions.map(|v| v.0).any(|from| from > seq && from <= TIP)
    };
    let mut accounts = book.state.live_accounts(seq);
    let key = accounts
        .find(changed)
        .expect("an account changed within the window");
    escaped(key)
}

/// The first entry of a 200 answer, base64.
fn entry(a: &Answer) -> String {
    let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    v["entries"][0]["entry"].as_str().unwrap().to_owned()
}

fn states(a: &Answer) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_entries_through_the_stand_in_are_the_cores_answers() {
    let rig = Rig::start(&[]).await;
    let q = CorePort::Query;
    // Found and not found, at the ledger the stand-in wrote last.
    let (relayed, direct) = rig
        .both(
            q,
            "/getledgerentry",
            Some(&form(&[BUSY, MERGED], Some(TIP))),
        )
        .await;
    assert_eq!(relayed, direct);
    assert_eq!(
        (relayed.status, relayed.content_type.as_str()),
        (200, "application/json")
    );
    assert_eq!(states(&relayed), ["live", "not-found"]);
    // An older ledger inside the window: forwarded as asked, so the entry is the one of then.
    let moved = changed_account(&rig.core.double, TIP - 3);
    let at = |seq: u32| format!("key={moved}&ledgerSeq={seq}");
    let (older, direct) = rig.both(q, "/getledgerentry", Some(&at(TIP - 3))).await;
    assert_eq!(older, direct);
    assert_eq!(answered_seq(&older), Some(u64::from(TIP - 3)));
    let newer = call(rig.stand_in.query, "/getledgerentry", Some(&at(TIP))).await;
    assert_eq!(states(&older), ["live"]);
    assert_eq!(states(&newer), ["live"]);
    assert_ne!(entry(&older), entry(&newer));
    // No ledgerSeq: pinned to the stand-in's last written ledger.
    let pinned = call(
        rig.stand_in.query,
        "/getledgerentry",
        Some(&form(&[BUSY], None)),
    )
    .await;
    let at_tip = call(
        rig.core.addr(q),
        "/getledgerentry",
        Some(&form(&[BUSY], Some(TIP))),
    )
    .await;
    assert_eq!(pinned, at_tip);
    // Out of the double's window of 4: core's own 404.
    let (relayed, direct) = rig
        .both(q, "/getledgerentry", Some(&form(&[BUSY], Some(TIP - 5))))
        .await;
    assert_eq!(relayed, direct);
    assert_eq!(
        (relayed.status, relayed.body.as_str()),
        (404, "Ledger not found\n")
    );
    // The raw endpoint.
    let (relayed, direct) = rig
        .both(q, "/getledgerentryraw", Some(&form(&[MERGED, BUSY], None)))
        .await;
    assert_eq!(relayed, direct);
    assert_eq!(relayed.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_newer_than_the_stand_in_wrote_is_waited_for_then_not_found() {
    let mut rig = Rig::start(&[]).await;
    let next = form(&[BUSY], Some(TIP + 1));
    let through = rig.stand_in.query;
    let waiting = tokio::spawn({
        let next = next.clone();
        async move { call(through, "/getledgerentry", Some(&next)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.core.close_through(TIP + 1);
    let answered = waiting.await.unwrap();
    assert_eq!(
        answered,
        call(
            rig.core.addr(CorePort::Query),
            "/getledgerentry",
            Some(&next)
        )
        .await
    );
    assert_eq!(answered_seq(&answered), Some(u64::from(TIP + 1)));
    // Never written: after the stand-in's wait, core's answer for a ledger it has not applied.
    let t = Instant::now();
    let (relayed, direct) = rig
        .both(
            CorePort::Query,
            "/getledgerentry",
            Some(&form(&[BUSY], Some(TIP + 5))),
        )
        .await;
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(relayed, direct);
    assert_eq!(
        (
            relayed.status,
            relayed.content_type.as_str(),
            relayed.body.as_str()
        ),
        (404, "text/html", "Ledger not found\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_through_the_stand_in_get_the_cores_status() {
    let rig = Rig::start(&[]).await;
    let c = CorePort::Command;
    let new = tx_target(300, 3);
    let relayed = call(rig.stand_in.http, &new, None).await;
    assert_eq!(
        (relayed.status, relayed.body.as_str()),
        (200, "{\"status\":\"PENDING\"}\n")
    );
    // The double saw it: the same envelope, directly, is a duplicate, and so through the relay.
    let (relayed, direct) = rig.both(c, &new, None).await;
    assert_eq!(relayed, direct);
    assert_eq!(relayed.body, "{\"status\":\"DUPLICATE\"}\n");
    let (relayed, direct) = rig.both(c, &tx_target(299, 3), None).await;
    assert_eq!(relayed, direct);
    let v: serde_json::Value = serde_json::from_str(&relayed.body).unwrap();
    assert_eq!(v["status"], "ERROR");
    let xdr = base64::engine::general_purpose::STANDARD
        .decode(v["error"].as_str().unwrap())
        .unwrap();
    let result =
        <stellar_xdr::TransactionResult as stellar_xdr::ReadXdr>::from_xdr(xdr, Limits::none())
            .unwrap();
    assert_eq!(
        result.result,
        stellar_xdr::TransactionResultResult::TxInsufficientFee
    );
    let (relayed, direct) = rig.both(c, "/tx?blob=AAAA", None).await;
    assert_eq!(relayed, direct);
    assert!(relayed.body.starts_with("{\"exception\": "), "{relayed:?}");
    // /info: the same but for the seconds since the ledger closed.
    let (relayed, direct) = rig.both(c, "/info", None).await;
    let no_age = |a: &Answer| {
        a.body
            .lines()
            .filter(|l| !l.contains("\"age\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        (relayed.status, no_age(&relayed)),
        (direct.status, no_age(&direct))
    );
    assert!(
        relayed.body.contains(&format!("\"num\" : {TIP}")),
        "{relayed:?}"
    );
    // Not a forwarded endpoint: the relay refuses it.
    let upgrades = call(rig.stand_in.http, "/upgrades?mode=get", None).await;
    assert_eq!(upgrades.status, 403, "{upgrades:?}");
}

/// A relay's own answer: `status` and core's exception shape naming the relay.
fn assert_relays_answer(a: &Answer, status: u16) {
    assert_eq!(a.status, status, "{a:?}");
    assert_eq!(a.content_type, "application/json");
    let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    let why = v["exception"].as_str().unwrap_or_default();
    assert!(why.starts_with("ledger-relay: "), "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_down_slow_or_refused_gets_the_relays_status_within_its_timeout() {
    let flags = [
        "--core-timeout",
        "1s",
        "--core-max-request",
        "16KiB",
        "--core-query-allow",
        "rpc-1",
        "--core-http-allow",
        "rpc-1",
    ];
    let mut rig = Rig::start(&flags).await;
    let body = form(&[BUSY], Some(TIP));
    let q = |rig: &Rig| call(rig.stand_in.query, "/getledgerentry", Some(&body));
    // Another client of the same CA, not on the allow-lists.
    rig.dir.certs.issue_client("other", 30).unwrap();
    let other = StandIn::start(&rig.dir, "other", "other", rig.port).await;
    let refused = call(other.query, "/getledgerentry", Some(&body)).await;
    assert_relays_answer(&refused, 403);
    assert_relays_answer(&call(other.http, "/info", None).await, 403);
    // Larger than --core-max-request.
    let big = form(&vec![BUSY; 400], None);
    assert!(big.len() > 16 << 10);
    assert_relays_answer(
        &call(rig.stand_in.query, "/getledgerentry", Some(&big)).await,
        413,
    );
    // Slow: the relay's timeout.
    rig.core.double.set_delay(Duration::from_secs(5));
    let t = Instant::now();
    assert_relays_answer(&q(&rig).await, 504);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    rig.core.double.set_delay(Duration::ZERO);
    // Down: refused at once, so unavailable, well within the timeout.
    rig.core.servers.stop().await;
    let t = Instant::now();
    assert_relays_answer(&q(&rig).await, 503);
    assert_relays_answer(&call(rig.stand_in.http, "/info", None).await, 503);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    rig.core.servers.resume().await.unwrap();
    assert_eq!(q(&rig).await.status, 200);
}

/// A root relay on the double and a tier relay fed by it, with the tier's own allow-lists and
/// size limit; a stand-in (`rpc-1`) on the tier holding ledgers through [`TIP`].
async fn tier() -> (TestDir, Core, Vec<RelayProcess>, u16, StandIn) {
    let dir = TestDir::new();
    dir.certs.issue_client("edge", 30).unwrap();
    let mut core = Core::start(dir.path()).await;
    let root_metrics = metrics_addr();
    let mut root_args = core.relay_args();
    root_args.extend(["--metrics".into(), root_metrics.to_string()]);
    let (root, root_port) = relay(&dir, "root", &root_args).await;
    let tier_args: Vec<String> = [
        "--source",
        &format!("relay:127.0.0.1:{root_port}"),
        "--upstream-name",
        "edge",
        "--core-query-allow",
        "rpc-1",
        "--core-http-allow",
        "rpc-1",
        "--core-max-request",
        "16KiB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tier_metrics = metrics_addr();
    let tier_args: Vec<String> = tier_args
        .into_iter()
        .chain(["--metrics".into(), tier_metrics.to_string()])
        .collect();
    let (tier, tier_port) = relay(&dir, "tier", &tier_args).await;
    // A tier with an empty ring starts at its upstream's newest ledger when its session opens:
    // it must hold the first ledger (the stand-in's start) before the double closes the rest,
    // or, its session resolving late on a loaded machine, it starts at a later one, the
    // stand-in's start is below the tier's retention, and the stand-in exits.
    within(20, "the tier connected to the root", async {
        while metric_at(root_metrics, "ledger_relay_connections_open")
            .await
            .unwrap_or(0)
            == 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    core.close_through(FIRST);
    within(20, "the tier read the first ledger", async {
        while metric_at(tier_metrics, "ledger_relay_source_newest")
            .await
            .unwrap_or(0)
            < u64::from(FIRST)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let stand_in = StandIn::start(&dir, "stand-in", "rpc-1", tier_port).await;
    core.close_through(TIP);
    wait_written(&stand_in, TIP).await;
    (dir, core, vec![root, tier], tier_port, stand_in)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_tier_relay_the_same_answers_and_refusals() {
    let (dir, mut core, _relays, tier_port, stand_in) = tier().await;
    let q = core.addr(CorePort::Query);
    // Found and not found, out of the window, and pinned (no ledgerSeq: the stand-in's last).
    let cases = [
        (
            form(&[BUSY, MERGED], Some(TIP)),
            form(&[BUSY, MERGED], Some(TIP)),
        ),
        (form(&[BUSY], Some(TIP - 5)), form(&[BUSY], Some(TIP - 5))),
        (form(&[BUSY], None), form(&[BUSY], Some(TIP))),
    ];
    for (asked, same_as) in cases {
        let relayed = call(stand_in.query, "/getledgerentry", Some(&asked)).await;
        assert_eq!(
            relayed,
            call(q, "/getledgerentry", Some(&same_as)).await,
            "{asked}"
        );
    }
    let tx = tx_target(500, 5);
    assert_eq!(
        call(stand_in.http, &tx, None).await.body,
        "{\"status\":\"PENDING\"}\n"
    );
    assert_eq!(
        call(stand_in.http, &tx, None).await.body,
        "{\"status\":\"DUPLICATE\"}\n"
    );
    let low = tx_target(499, 5);
    assert_eq!(
        call(stand_in.http, &low, None).await,
        call(core.addr(CorePort::Command), &low, None).await
    );
    // The tier's own checks: its allow-lists and its size limit.
    dir.certs.issue_client("other", 30).unwrap();
    let other = StandIn::start(&dir, "other", "other", tier_port).await;
    assert_relays_answer(
        &call(
            other.query,
            "/getledgerentry",
            Some(&form(&[BUSY], Some(TIP))),
        )
        .await,
        403,
    );
    assert_relays_answer(&call(other.http, "/info", None).await, 403);
    let big = form(&vec![BUSY; 400], None);
    assert_relays_answer(
        &call(stand_in.query, "/getledgerentry", Some(&big)).await,
        413,
    );
    // The root's answers for a slow and a stopped core come back through the tier.
    let body = form(&[BUSY], Some(TIP));
    core.double.set_delay(Duration::from_secs(5));
    let t = Instant::now();
    assert_relays_answer(
        &call(stand_in.query, "/getledgerentry", Some(&body)).await,
        504,
    );
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    core.double.set_delay(Duration::ZERO);
    core.servers.stop().await;
    assert_relays_answer(
        &call(stand_in.query, "/getledgerentry", Some(&body)).await,
        503,
    );
    core.servers.resume().await.unwrap();
    core.close_through(TIP + 1);
    wait_written(&stand_in, TIP + 1).await;
}

/// Queries in flight at once during the flood, each task back to back.
const FLOODERS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_queries_does_not_hold_up_ledgers() {
    let mut rig = Rig::start(&[]).await;
    let sub = crate::support::Collector::start(
        crate::support::sub_config(
            vec![crate::support::local(rig.port)],
            rig.dir.certs.path(),
            "rpc-1",
            4,
            ledger_relay_wire::frame::Start::Seq(TIP + 1),
        ),
        TIP + 60,
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let flood: Vec<_> = (0..FLOODERS)
        .map(|i| {
            let (addr, stop) = (rig.stand_in.query, stop.clone());
            let body = form(&[BUSY, MERGED], None);
            tokio::spawn(async move {
                let mut answered = Vec::new();
                // Bounded: until stopped, at most 2000 queries per task.
                while !stop.is_cancelled() && answered.len() < 2000 {
                    answered.push(call(addr, "/getledgerentry", Some(&body)).await.status);
                }
                (i, answered)
            })
        })
        .collect();
    // 60 ledgers, one every 50 ms, each stamped as written.
    let mut written = Vec::new();
    for seq in TIP + 1..=TIP + 60 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        rig.core.close_through(seq);
        written.push((seq, ledger_relay::source::now_ns()));
    }
    let out = sub.finish(60).await;
    stop.cancel();
    let mut statuses = Vec::new();
    for task in flood {
        statuses.extend(task.await.unwrap().1);
    }
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.got.len(), 60);
    let worst_ms = out
        .got
        .iter()
        .zip(&written)
        .map(|(l, (seq, at))| {
            assert_eq!(l.seq, *seq);
            l.received_ns.saturating_sub(*at) as f64 / 1e6
        })
        .fold(0.0, f64::max);
    let ok = statuses.iter().filter(|s| **s == 200).count();
    eprintln!(
        "flood: {} queries ({ok} answered 200), worst ledger delay {worst_ms:.1} ms",
        statuses.len()
    );
    assert!(
        ok >= 200,
        "the flood ran: {ok} of {} answered",
        statuses.len()
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert!(
        worst_ms < 1000.0,
        "a ledger took {worst_ms:.1} ms to arrive under the flood"
    );
}
