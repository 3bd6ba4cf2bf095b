//! What the double answers, in core's exact texts (see the crate doc for the sources).

use bytes::Bytes;

/// `Content-Type` of core's JSON answers.
pub const JSON: &str = "application/json";
/// `Content-Type` of core's errors and 404 pages.
pub const HTML: &str = "text/html";

/// Query port: no snapshot of the requested ledger (not applied yet, or out of the window).
pub const LEDGER_NOT_FOUND: &str = "Ledger not found\n";
/// Query port: the same key twice in one `/getledgerentry`.
pub const DUPLICATE_KEYS: &str = "Duplicate keys\n";
/// Query port: a TTL key in `/getledgerentry`.
pub const TTL_KEYS: &str = "TTL keys are not allowed\n";
/// Query port: `/getledgerentry` without a key.
pub const NO_KEY: &str = "Must specify key in POST body: key=<LedgerKey in base64 XDR format>\n";
/// Query port: `/getledgerentryraw` without a key (thrown, hence the `exception: ` prefix
/// and no newline).
pub const NO_KEY_RAW: &str =
    "exception: Must specify ledger key in POST body: key=<LedgerKey in base64 XDR format>";
/// Query port: `ledgerSeq` given more than once.
pub const SEQ_TWICE: &str = "exception: Expected exactly one 'ledgerSeq' argument";
/// Query port: `ledgerSeq` not a `u32`.
pub const SEQ_UNPARSED: &str = "exception: Failed to parse 'ledgerSeq' argument";
/// Command port: `/tx` without a blob.
pub const NO_BLOB: &str = r#"{"exception": "Must specify a tx blob: tx?blob=<tx in xdr format>"}"#;
/// Command port: before the double has closed a ledger.
pub const BOOTING: &str = r#"{"error": "Core is booting, try again later"}"#;
/// The stock 400 reply of both servers (a bad `%` escape, a POST without `Content-Length`).
pub const BAD_REQUEST: &str =
    "<html><head><title>Bad Request</title></head><body><h1>400 Bad Request</h1></body></html>";
/// The command port's 404 page.
pub const COMMAND_NOT_FOUND: &str = concat!(
    "<b>Welcome to stellar-core!</b><p>Supported HTTP commands are listed in the <a href=\"",
    "https://github.com/stellar/stellar-core/blob/master/docs/software/commands.md#http-commands",
    "\">docs</a> as well as in the man pages.</p><p>Have fun!</p>"
);
/// The query port's 404 page.
pub const QUERY_NOT_FOUND: &str = concat!(
    "<b>Welcome to stellar-core!</b><p>Supported HTTP queries are listed in the <a href=\"",
    "https://github.com/stellar/stellar-core/blob/master/docs/software/commands.md#http-commands",
    "\">docs</a> as well as in the man pages.</p>",
    "<p>Note that this port is for HTTP queries only, not commands.</p><p>Have fun!</p>"
);

/// One HTTP answer: status, `Content-Type` and body, as core's servers send them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// 200 with a JSON body.
    pub fn json(body: impl Into<Bytes>) -> Answer {
        Answer {
            status: 200,
            content_type: JSON,
            body: body.into(),
        }
    }

    /// 404 `text/html` with `body`: how the query server answers every error.
    pub fn not_found(body: impl Into<Bytes>) -> Answer {
        Answer {
            status: 404,
            content_type: HTML,
            body: body.into(),
        }
    }

    /// The stock 400 reply.
    pub fn bad_request() -> Answer {
        Answer {
            status: 400,
            content_type: HTML,
            body: Bytes::from_static(BAD_REQUEST.as_bytes()),
        }
    }

    /// The body as text (lossy), for messages and tests.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}
