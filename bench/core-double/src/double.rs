//! The double itself: the ledgers it replays, the state of those it has closed, and the
//! answers of both ports.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use stellar_xdr::LedgerHeaderHistoryEntry;

use ledger_relay_wire::core_http::{url_decode, CorePort};

use crate::answer::{self, Answer};
use crate::command::{self, InfoFacts, Seen};
use crate::error::DoubleError;
use crate::ledgers::{read_file, Ledger};
use crate::query;
use crate::state::State;

/// Network passphrase of the testnet ledgers in `testdata/`.
pub const TESTNET: &str = "Test SDF Network ; September 2015";

/// How the double behaves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `QUERY_SNAPSHOT_LEDGERS`: the query port holds ledgers `[LCL - this, LCL]`.
    pub snapshot_ledgers: u32,
    /// The network passphrase `/info` reports.
    pub network_passphrase: String,
    /// Every answer waits this long first (a slow core).
    pub delay: Duration,
}

impl Default for Settings {
    /// stellar-rpc's default window (4), the testnet passphrase, no delay.
    fn default() -> Settings {
        Settings {
            snapshot_ledgers: 4,
            network_passphrase: TESTNET.into(),
            delay: Duration::ZERO,
        }
    }
}

/// One request to either port, as the HTTP server received it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The port.
    pub port: CorePort,
    /// Path and query string, not decoded.
    pub target: String,
    /// The body (empty for a `GET`), not decoded.
    pub body: Bytes,
}

/// A ledger the double has just closed: write `raw` to the meta pipe.
#[derive(Debug, Clone)]
pub struct Closed {
    /// Its sequence.
    pub seq: u32,
    /// The record body.
    pub raw: Bytes,
}

/// What the double has applied: the versioned state, which ledgers it closed, and the last.
#[derive(Debug, Default)]
pub struct Book {
    /// The state.
    pub state: State,
    closed: Vec<u32>,
    lcl: Option<(LedgerHeaderHistoryEntry, Instant)>,
    snapshot_ledgers: u32,
}

impl Book {
    /// The last closed ledger.
    pub fn lcl_seq(&self) -> Option<u32> {
        self.closed.last().copied()
    }

    /// Its header.
    pub fn lcl_header(&self) -> Option<&LedgerHeaderHistoryEntry> {
        self.lcl.as_ref().map(|l| &l.0)
    }

    /// When the double closed it.
    pub fn lcl_closed_at(&self) -> Option<Instant> {
        self.lcl.as_ref().map(|l| l.1)
    }

    /// Whether the query port answers for `seq`: closed, and within the snapshot window.
    pub fn holds(&self, seq: u32) -> bool {
        let Some(lcl) = self.lcl_seq() else {
            return false;
        };
        seq <= lcl
            && seq >= lcl.saturating_sub(self.snapshot_ledgers)
            && self.closed.binary_search(&seq).is_ok()
    }
}

/// A test double of stellar-core: closes the ledgers of a file one by one and answers core's
/// two HTTP ports from the state they built. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct CoreDouble {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    ledgers: Vec<Ledger>,
    next: Mutex<usize>,
    book: RwLock<Book>,
    seen: Seen,
    facts: InfoFacts,
    delay_ns: AtomicU64,
}

impl CoreDouble {
    /// A double that will replay `ledgers` (in order), none closed yet.
    pub fn new(ledgers: Vec<Ledger>, settings: Settings) -> CoreDouble {
        let facts = InfoFacts {
            build: format!(
                "ledger-core-double {} (a test double of stellar-core)",
                env!("CARGO_PKG_VERSION")
            ),
            network: settings.network_passphrase,
            started: SystemTime::now(),
        };
        let book = Book {
            snapshot_ledgers: settings.snapshot_ledgers,
            ..Book::default()
        };
        let shared = Shared {
            ledgers,
            next: Mutex::new(0),
            book: RwLock::new(book),
            seen: Seen::default(),
            facts,
            delay_ns: AtomicU64::new(0),
        };
        let double = CoreDouble {
            shared: Arc::new(shared),
        };
        double.set_delay(settings.delay);
        double
    }

    /// [`CoreDouble::new`] with the ledgers of a record-marked file (zstd or not).
    pub fn load(path: &Path, settings: Settings) -> Result<CoreDouble, DoubleError> {
        Ok(CoreDouble::new(read_file(path)?, settings))
    }

    /// Every ledger it replays.
    pub fn ledgers(&self) -> &[Ledger] {
        &self.shared.ledgers
    }

    /// Closes the next ledger: applies its changes and makes it the LCL. `None` once every
    /// ledger is closed.
    pub fn close_next(&self) -> Option<Closed> {
        let mut next = self.shared.next.lock().unwrap_or_else(|p| p.into_inner());
        let ledger = self.shared.ledgers.get(*next)?;
        *next += 1;
        let mut book = self.write_book();
        book.state.apply(ledger.seq, &ledger.meta);
        book.closed.push(ledger.seq);
        book.lcl = Some((ledger.header().clone(), Instant::now()));
        Some(Closed {
            seq: ledger.seq,
            raw: ledger.raw.clone(),
        })
    }

    /// Closes ledgers up to and including `seq` (or to the end); returns those it closed.
    pub fn close_through(&self, seq: u32) -> Vec<Closed> {
        let mut out = Vec::new();
        while self.lcl().is_none_or(|l| l < seq) {
            match self.close_next() {
                Some(c) => out.push(c),
                None => break,
            }
        }
        out
    }

    /// The last closed ledger.
    pub fn lcl(&self) -> Option<u32> {
        self.read_book().lcl_seq()
    }

    /// Reads the state, the closed ledgers and the window.
    pub fn read_book(&self) -> std::sync::RwLockReadGuard<'_, Book> {
        self.shared.book.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_book(&self) -> std::sync::RwLockWriteGuard<'_, Book> {
        self.shared.book.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Every answer waits `delay` first from now on (zero: answer at once).
    pub fn set_delay(&self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay_ns.store(ns, Ordering::Relaxed);
    }

    /// Answers `req` after the configured delay.
    pub async fn answer(&self, req: Request) -> Answer {
        let delay = Duration::from_nanos(self.shared.delay_ns.load(Ordering::Relaxed));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.answer_now(&req)
    }

    /// Answers `req` at once, as core would: the target is URL-decoded whole and routed on its
    /// path; the query port's body is URL-decoded before the route sees it.
    pub fn answer_now(&self, req: &Request) -> Answer {
        let Some(target) = url_decode(req.target.as_bytes()) else {
            return Answer::bad_request();
        };
        let target = target.strip_prefix(b"/").unwrap_or(&target);
        let at = target.iter().position(|&c| c == b'?');
        let (command, query) = target.split_at(at.unwrap_or(target.len()));
        let book = self.read_book();
        match req.port {
            CorePort::Command => match command {
                b"tx" => command::tx(&book, &self.shared.seen, query),
                b"info" => command::info(&book, &self.shared.facts),
                _ => Answer::not_found(answer::COMMAND_NOT_FOUND),
            },
            CorePort::Query => {
                let Some(form) = url_decode(&req.body) else {
                    return Answer::bad_request();
                };
                match command {
                    b"getledgerentry" => query::get_ledger_entry(&book, &form),
                    b"getledgerentryraw" => query::get_ledger_entry_raw(&book, &form),
                    _ => Answer::not_found(answer::QUERY_NOT_FOUND),
                }
            }
        }
    }
}
