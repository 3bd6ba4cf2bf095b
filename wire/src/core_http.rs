//! stellar-core's HTTP ports, carried through relays: the request and response a stand-in
//! forwards (`CoreRequest`, `CoreResponse`; `docs/protocol.md` section 6), which endpoints a
//! relay forwards at all, and the form-body rules of core's query server that the stand-in's
//! consistency rule needs.
//!
//! An RPC box without stellar-core still calls core's two HTTP ports on localhost: the query
//! server (`HTTP_QUERY_PORT`, `POST /getledgerentry` for `getLedgerEntries` and
//! `simulateTransaction`) and the command port (`HTTP_PORT`, `GET /tx?blob=` for
//! `sendTransaction`, `GET /info` for Horizon and the SDK's metrics). The stand-in answers
//! those ports and sends each request over its relay connection; the relay forwards it to the
//! stellar-core beside it, or to its own upstream relay.
//!
//! What a relay forwards is a short list ([`Endpoint`]): reads and transaction submission.
//! Everything else core's command port offers (`upgrades`, `manualclose`, `maintenance`,
//! `ll`, ...) would let one RPC box reconfigure the core that feeds a fleet, so it is refused
//! with [`NotForwarded`] before any byte leaves the relay.

use bytes::{Buf, BufMut, Bytes};

use crate::error::FrameError;

/// Fixed part of a `CoreRequest` body: version 2, port 1, method 1, timeout 4, target length 4,
/// content-type length 1.
pub const CORE_REQUEST_FIXED_LEN: usize = 13;
/// Fixed part of a `CoreResponse` body: status 2, origin 1, content-type length 1.
pub const CORE_RESPONSE_FIXED_LEN: usize = 4;

/// Which of core's two HTTP ports a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CorePort {
    /// The command port (`HTTP_PORT`, default 11626): `/tx`, `/info`.
    Command = 1,
    /// The query server (`HTTP_QUERY_PORT`, 11628 under stellar-rpc): `/getledgerentry`.
    Query = 2,
}

impl CorePort {
    fn from_u8(b: u8) -> Option<CorePort> {
        match b {
            1 => Some(CorePort::Command),
            2 => Some(CorePort::Query),
            _ => None,
        }
    }

    /// The port's name in messages, metrics and flags (`http`, `query`, as `--core-http` and
    /// `--core-query`).
    pub fn name(self) -> &'static str {
        match self {
            CorePort::Command => "http",
            CorePort::Query => "query",
        }
    }
}

/// The HTTP methods core's callers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HttpMethod {
    /// `GET`.
    Get = 1,
    /// `POST`.
    Post = 2,
}

impl HttpMethod {
    fn from_u8(b: u8) -> Option<HttpMethod> {
        match b {
            1 => Some(HttpMethod::Get),
            2 => Some(HttpMethod::Post),
            _ => None,
        }
    }

    /// The method as HTTP spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
        }
    }
}

/// One HTTP request for stellar-core, as the stand-in received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreRequest {
    /// Protocol version the sender speaks.
    pub version: u16,
    /// The port it was sent to.
    pub port: CorePort,
    /// Its method.
    pub method: HttpMethod,
    /// How long the sender waits for the answer, ms (0: the relay's own timeout). A relay
    /// answers within the smaller of this and its own timeout.
    pub timeout_ms: u32,
    /// Path and query string as received (`/tx?blob=AAAA%2B...`), never re-encoded: core's
    /// parser decodes the URI once, so a second encoding would change what it reads. Starts
    /// with `/`; visible ASCII only.
    pub target: String,
    /// The request's `Content-Type`, or empty. Visible ASCII and spaces, at most 255 bytes.
    pub content_type: String,
    /// The request body (the query server's form), possibly empty.
    pub body: Bytes,
}

/// Who produced a [`CoreResponse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Origin {
    /// stellar-core answered; status, content type and body are its own, byte for byte.
    Core = 0,
    /// A relay answered instead (refused, timed out, core unreachable); the body is JSON
    /// `{"exception": "ledger-relay: ..."}`.
    Relay = 1,
}

impl Origin {
    fn from_u8(b: u8) -> Option<Origin> {
        match b {
            0 => Some(Origin::Core),
            1 => Some(Origin::Relay),
            _ => None,
        }
    }
}

/// The answer to a [`CoreRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreResponse {
    /// HTTP status, 100..=599.
    pub status: u16,
    /// Who answered.
    pub origin: Origin,
    /// `Content-Type` (core sends `application/json` or `text/html`), or empty.
    pub content_type: String,
    /// The body.
    pub body: Bytes,
}

impl CoreResponse {
    /// A relay's own answer: `status` with a JSON body shaped like core's command-port errors,
    /// `{"exception": "ledger-relay: REASON"}`, so a client that shows core's errors shows this
    /// one too.
    pub fn from_relay(status: u16, reason: &str) -> CoreResponse {
        let body = serde_json::json!({ "exception": format!("ledger-relay: {reason}") });
        CoreResponse {
            status,
            origin: Origin::Relay,
            content_type: "application/json".into(),
            body: Bytes::from(body.to_string()),
        }
    }
}

/// Appends a `CoreRequest` body (the bytes after the frame header).
pub(crate) fn put_request(r: &CoreRequest, out: &mut Vec<u8>) {
    out.put_u16(r.version);
    out.put_u8(r.port as u8);
    out.put_u8(r.method as u8);
    out.put_u32(r.timeout_ms);
    out.put_u32(r.target.len() as u32);
    let content_type = crate::text::truncate_utf8(&r.content_type, u8::MAX as usize);
    out.put_u8(content_type.len() as u8);
    out.put_slice(r.target.as_bytes());
    out.put_slice(content_type.as_bytes());
    out.put_slice(&r.body);
}

/// Appends a `CoreResponse` body.
pub(crate) fn put_response(r: &CoreResponse, out: &mut Vec<u8>) {
    out.put_u16(r.status);
    out.put_u8(r.origin as u8);
    let content_type = crate::text::truncate_utf8(&r.content_type, u8::MAX as usize);
    out.put_u8(content_type.len() as u8);
    out.put_slice(content_type.as_bytes());
    out.put_slice(&r.body);
}

fn malformed(frame: &'static str, what: &'static str) -> FrameError {
    FrameError::Malformed { frame, what }
}

/// Takes `len` bytes of `b` as text whose every byte passes `ok`.
fn take_text(
    b: &mut Bytes,
    len: usize,
    ok: fn(u8) -> bool,
    frame: &'static str,
    what: &'static str,
) -> Result<String, FrameError> {
    if b.len() < len {
        return Err(malformed(frame, "a length runs past the body"));
    }
    let raw = b.split_to(len);
    if !raw.iter().all(|&c| ok(c)) {
        return Err(malformed(frame, what));
    }
    // Every byte is ASCII, so this cannot fail.
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

fn target_byte(c: u8) -> bool {
    c.is_ascii_graphic()
}

fn header_byte(c: u8) -> bool {
    c == b' ' || c.is_ascii_graphic()
}

/// Parses a `CoreRequest` body whose length `check_header` has bounded.
pub(crate) fn parse_request(mut b: Bytes) -> Result<CoreRequest, FrameError> {
    const NAME: &str = "core-request";
    let version = b.get_u16();
    let port = CorePort::from_u8(b.get_u8()).ok_or(malformed(NAME, "unknown port"))?;
    let method = HttpMethod::from_u8(b.get_u8()).ok_or(malformed(NAME, "unknown method"))?;
    let timeout_ms = b.get_u32();
    let target_len = b.get_u32() as usize;
    let type_len = usize::from(b.get_u8());
    let target = take_text(
        &mut b,
        target_len,
        target_byte,
        NAME,
        "target not visible ASCII",
    )?;
    if !target.starts_with('/') {
        return Err(malformed(NAME, "target does not start with /"));
    }
    let content_type = take_text(&mut b, type_len, header_byte, NAME, "bad content type")?;
    Ok(CoreRequest {
        version,
        port,
        method,
        timeout_ms,
        target,
        content_type,
        body: b,
    })
}

/// Parses a `CoreResponse` body whose length `check_header` has bounded.
pub(crate) fn parse_response(mut b: Bytes) -> Result<CoreResponse, FrameError> {
    const NAME: &str = "core-response";
    let status = b.get_u16();
    if !(100..=599).contains(&status) {
        return Err(malformed(NAME, "status outside 100..=599"));
    }
    let origin = Origin::from_u8(b.get_u8()).ok_or(malformed(NAME, "unknown origin"))?;
    let type_len = usize::from(b.get_u8());
    let content_type = take_text(&mut b, type_len, header_byte, NAME, "bad content type")?;
    Ok(CoreResponse {
        status,
        origin,
        content_type,
        body: b,
    })
}

/// The endpoints a relay forwards to stellar-core: what stellar-rpc, Horizon and Galexie call
/// (docs/rpc.md lists each with its caller). Nothing else reaches core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `GET /tx?blob=...` on the command port: submit a transaction (`sendTransaction`,
    /// Horizon's submissions).
    Tx,
    /// `GET /info` on the command port: core's state and ledger (Horizon, the SDK's metrics).
    Info,
    /// `POST /getledgerentry` on the query port: entries with their state at a ledger
    /// (`getLedgerEntries`, `simulateTransaction`).
    GetLedgerEntry,
    /// `POST /getledgerentryraw` on the query port: entries without state.
    GetLedgerEntryRaw,
}

impl Endpoint {
    /// Every endpoint, for docs, metrics and tests.
    pub const ALL: [Endpoint; 4] = [
        Endpoint::Tx,
        Endpoint::Info,
        Endpoint::GetLedgerEntry,
        Endpoint::GetLedgerEntryRaw,
    ];

    /// The port it lives on.
    pub fn port(self) -> CorePort {
        match self {
            Endpoint::Tx | Endpoint::Info => CorePort::Command,
            Endpoint::GetLedgerEntry | Endpoint::GetLedgerEntryRaw => CorePort::Query,
        }
    }

    /// The path, as core routes it.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Tx => "/tx",
            Endpoint::Info => "/info",
            Endpoint::GetLedgerEntry => "/getledgerentry",
            Endpoint::GetLedgerEntryRaw => "/getledgerentryraw",
        }
    }

    /// The method its callers use.
    pub fn method(self) -> HttpMethod {
        match self.port() {
            CorePort::Command => HttpMethod::Get,
            CorePort::Query => HttpMethod::Post,
        }
    }

    /// The endpoint a request is for, or why a relay does not forward it.
    pub fn classify(
        port: CorePort,
        method: HttpMethod,
        target: &str,
    ) -> Result<Endpoint, NotForwarded> {
        let path = target.split_once('?').map_or(target, |(p, _)| p);
        let found = Endpoint::ALL
            .into_iter()
            .find(|e| e.port() == port && e.path() == path);
        match found {
            Some(e) if e.method() == method => Ok(e),
            Some(e) => Err(NotForwarded::Method {
                endpoint: e,
                method,
            }),
            None => Err(NotForwarded::Path {
                port,
                path: crate::text::truncate_utf8(path, 64).to_owned(),
            }),
        }
    }
}

/// Why a relay refuses to forward a request (answered with 403 by the relay, never sent to
/// core).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotForwarded {
    /// The path is not one of the forwarded endpoints on that port.
    #[error("{path} on the {} port is not forwarded to stellar-core", port.name())]
    Path {
        /// The port asked for.
        port: CorePort,
        /// The path (at most 64 bytes of it).
        path: String,
    },
    /// The endpoint is forwarded with another method only.
    #[error("{} {} is not forwarded (only {})", method.as_str(), endpoint.path(), endpoint.method().as_str())]
    Method {
        /// The endpoint.
        endpoint: Endpoint,
        /// The method used.
        method: HttpMethod,
    },
}

/// What a query-server form says about `ledgerSeq`, read the way core reads it: the body is
/// URL-decoded as a whole, split at `&`, and a parameter must appear exactly once and be a
/// whole `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerSeqParam {
    /// No `ledgerSeq`: core answers from its newest snapshot.
    Absent,
    /// Exactly one, a valid number.
    Seq(u32),
    /// Present but not one valid number: core answers with its own error.
    Invalid,
}

/// Decodes `%XX` escapes and `+` (a space) as core's server does before it splits a form;
/// `None` for a bad escape (core answers 400).
pub fn url_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => {
                let hex = raw.get(i + 1..i + 3)?;
                let s = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(s, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// The parameters of a decoded form, in order, as core's `parsePostParams` splits them: at
/// `&`; the first `=` ends the name and every later `=` is dropped; a pair with an empty name
/// or value is skipped.
pub fn form_params(decoded: &[u8]) -> Vec<(&[u8], Vec<u8>)> {
    decoded
        .split(|&c| c == b'&')
        .filter_map(|pair| {
            let at = pair.iter().position(|&c| c == b'=')?;
            let (name, rest) = (&pair[..at], &pair[at + 1..]);
            let value: Vec<u8> = rest.iter().copied().filter(|&c| c != b'=').collect();
            (!name.is_empty() && !value.is_empty()).then_some((name, value))
        })
        .collect()
}

/// The `ledgerSeq` of a query-server form body.
pub fn form_ledger_seq(body: &[u8]) -> LedgerSeqParam {
    let Some(decoded) = url_decode(body) else {
        return LedgerSeqParam::Invalid;
    };
    let params = form_params(&decoded);
    let mut values = params.iter().filter(|(n, _)| *n == b"ledgerSeq");
    match (values.next(), values.next()) {
        (None, _) => LedgerSeqParam::Absent,
        (Some((_, v)), None) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .map_or(LedgerSeqParam::Invalid, LedgerSeqParam::Seq),
        (Some(_), Some(_)) => LedgerSeqParam::Invalid,
    }
}

/// `body` with `&ledgerSeq=SEQ` appended, pinning a form that named no ledger to `seq`.
pub fn pin_ledger_seq(body: &[u8], seq: u32) -> Vec<u8> {
    let mut out = body.to_vec();
    if !out.is_empty() && !out.ends_with(b"&") {
        out.push(b'&');
    }
    out.extend_from_slice(format!("ledgerSeq={seq}").as_bytes());
    out
}

#[cfg(test)]
mod tests;
