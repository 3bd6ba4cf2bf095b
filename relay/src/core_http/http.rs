//! The relay's client of stellar-core's HTTP ports (`--core-http URL`, `--core-query URL`).
//!
//! Core's two servers are strict and old-fashioned (HTTP/1.0 answers, one request per
//! connection; the query server finds `Content-Length` only spelled exactly so, and takes no
//! chunked body), so the client is set up to send what a Go client sends them: HTTP/1.1 with
//! title-case header names, an explicit `Content-Length` on every POST, the request target
//! appended to the URL's path as the stand-in received it (core decodes a URI once, so it must
//! not be decoded and encoded again), no proxy (an `HTTP_PROXY` in the relay's environment must
//! not carry transactions elsewhere) and no redirects. Core's answer is read bounded by
//! `max_core_response` and passed on byte for byte.

use std::fmt;
use std::str::FromStr;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use ledger_relay_wire::core_http::{HttpMethod, CORE_RESPONSE_FIXED_LEN};
use ledger_relay_wire::Limits;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::Url;
use tokio::time::Instant;

use super::{CoreBackend, CorePort, CoreRequest, CoreResponse, Origin};

/// The URL of one of core's HTTP ports: `http://HOST:PORT`, with an optional base path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreUrl {
    /// Scheme, authority and path, without a trailing `/`: a target is appended to it.
    base: String,
}

/// Why a `--core-http` or `--core-query` URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadCoreUrl {
    /// Not a URL at all.
    #[error("not a URL: {reason}")]
    Parse {
        /// What the parser said.
        reason: String,
    },
    /// Another scheme than `http` (core's ports speak plain HTTP).
    #[error("scheme {scheme} is not http (stellar-core's ports speak plain HTTP)")]
    NotHttp {
        /// The scheme given.
        scheme: String,
    },
    /// No host.
    #[error("no host")]
    NoHost,
    /// No explicit port (core's are 11626 and 11628, never HTTP's 80 by default).
    #[error("no port (stellar-core's are HTTP_PORT, 11626, and HTTP_QUERY_PORT, 11628 under stellar-rpc)")]
    NoPort,
    /// A part that has no meaning here (user info, a query or a fragment).
    #[error("a URL of core's port has no {part}")]
    Extra {
        /// Which part.
        part: &'static str,
    },
}

impl FromStr for CoreUrl {
    type Err = BadCoreUrl;

    fn from_str(s: &str) -> Result<CoreUrl, BadCoreUrl> {
        let url = Url::parse(s).map_err(|e| BadCoreUrl::Parse {
            reason: e.to_string(),
        })?;
        if url.scheme() != "http" {
            return Err(BadCoreUrl::NotHttp {
                scheme: url.scheme().to_owned(),
            });
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(BadCoreUrl::NoHost);
        }
        if !has_explicit_port(s) {
            return Err(BadCoreUrl::NoPort);
        }
        let extra = [
            (
                !url.username().is_empty() || url.password().is_some(),
                "user info",
            ),
            (url.query().is_some(), "query"),
            (url.fragment().is_some(), "fragment"),
        ];
        if let Some((_, part)) = extra.into_iter().find(|(present, _)| *present) {
            return Err(BadCoreUrl::Extra { part });
        }
        Ok(CoreUrl {
            base: url.as_str().trim_end_matches('/').to_owned(),
        })
    }
}

/// Whether the authority of `raw` (an http URL) names a port. The parsed URL cannot tell:
/// it drops a port that is the scheme's default.
fn has_explicit_port(raw: &str) -> bool {
    let rest = raw.split_once("://").map_or(raw, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match host_port.rsplit_once(':') {
        // `[::1]` alone has colons inside the brackets only.
        Some((host, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!host.starts_with('[') || host.ends_with(']'))
        }
        None => false,
    }
}

impl fmt::Display for CoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)
    }
}

impl CoreUrl {
    /// The URL a request for `target` goes to: the target appended to the base as it is.
    /// Only `#`, which a URL would take for the start of a fragment and never send, is
    /// written `%23`; the URL parser also escapes `"`, `'`, `<`, `>` and `` ` `` in the
    /// query. Core decodes the whole URI before it reads it, so it reads what the stand-in
    /// received either way; nothing already escaped (`%2B` in a `/tx` blob) is touched.
    pub fn for_target(&self, target: &str) -> Result<Url, BadCoreUrl> {
        let joined = format!("{}{}", self.base, target.replace('#', "%23"));
        Url::parse(&joined).map_err(|e| BadCoreUrl::Parse {
            reason: e.to_string(),
        })
    }
}

/// Forwards requests to one of stellar-core's HTTP ports.
#[derive(Debug)]
pub struct HttpBackend {
    url: CoreUrl,
    port: CorePort,
    client: reqwest::Client,
    /// `max_core_response`: the largest `CoreResponse` body.
    max_response: u32,
}

impl HttpBackend {
    /// A client of core's `port` at `url`, whose answers may be as large as `limits` allow.
    pub fn new(url: CoreUrl, port: CorePort, limits: &Limits) -> Result<HttpBackend, String> {
        // The URL is http: TLS is never used, but reqwest's rustls wants a configuration, and
        // has no crypto provider of its own (see the workspace manifest).
        let tls =
            rustls::ClientConfig::builder_with_provider(ledger_relay_transport::crypto_provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
        let client = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .http1_title_case_headers()
            .redirect(reqwest::redirect::Policy::none())
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|e| error_chain(&e))?;
        Ok(HttpBackend {
            url,
            port,
            client,
            max_response: limits.max_core_response,
        })
    }

    /// Sends `request` to core and reads its answer (the caller bounds the time).
    async fn send(&self, request: CoreRequest) -> CoreResponse {
        let url = match self.url.for_target(&request.target) {
            Ok(url) => url,
            Err(e) => return self.failed(502, &format!("target cannot be sent: {e}")),
        };
        let mut builder = match request.method {
            HttpMethod::Get => self.client.get(url),
            HttpMethod::Post => self
                .client
                .post(url)
                // Explicit, so the body is never sent chunked: core's query server refuses a
                // body without a `Content-Length`.
                .header(CONTENT_LENGTH, request.body.len())
                .body(request.body),
        };
        if !request.content_type.is_empty() {
            builder = builder.header(CONTENT_TYPE, request.content_type);
        }
        match builder.send().await {
            Ok(response) => self.carry(response).await,
            Err(e) => self.send_failed(e),
        }
    }

    /// Core's answer as a `CoreResponse`, or 502 when it cannot be one.
    async fn carry(&self, mut response: reqwest::Response) -> CoreResponse {
        let status = response.status().as_u16();
        if !(100..=599).contains(&status) {
            return self.failed(502, &format!("status {status} cannot be passed on"));
        }
        let content_type = match response.headers().get(CONTENT_TYPE) {
            None => String::new(),
            Some(v)
                if v.len() <= 255 && v.as_bytes().iter().all(|&b| (0x20..0x7f).contains(&b)) =>
            {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            }
            Some(_) => return self.failed(502, "its content type cannot be passed on"),
        };
        let limit = (self.max_response as usize)
            .saturating_sub(CORE_RESPONSE_FIXED_LEN + content_type.len());
        let body = match read_bounded(&mut response, limit).await {
            Ok(body) => body,
            Err(why) => return self.failed(502, &why),
        };
        CoreResponse {
            status,
            origin: Origin::Core,
            content_type,
            body,
        }
    }

    /// The answer to a request that got no HTTP answer.
    fn send_failed(&self, e: reqwest::Error) -> CoreResponse {
        let status = if e.is_connect() {
            503
        } else if e.is_timeout() {
            504
        } else {
            502
        };
        let what = match status {
            503 => "cannot be reached",
            504 => "did not answer in time",
            _ => "gave no HTTP answer",
        };
        self.failed(
            status,
            &format!("{what}: {}", error_chain(&e.without_url())),
        )
    }

    fn failed(&self, status: u16, why: &str) -> CoreResponse {
        let port = self.port.name();
        CoreResponse::from_relay(status, &format!("stellar-core's {port} port {why}"))
    }
}

/// The body of `response`, or why it cannot be passed on: longer than `limit`, or cut off.
async fn read_bounded(response: &mut reqwest::Response, limit: usize) -> Result<Bytes, String> {
    let too_large = || format!("answered more than the {limit} bytes a relay passes on");
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = BytesMut::new();
    loop {
        match response.chunk().await {
            Ok(Some(piece)) if body.len() + piece.len() > limit => return Err(too_large()),
            Ok(Some(piece)) => body.extend_from_slice(&piece),
            Ok(None) => return Ok(body.freeze()),
            Err(e) => return Err(format!("answer cut off: {}", error_chain(&e.without_url()))),
        }
    }
}

/// `e` and its causes, `: `-separated.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

impl CoreBackend for HttpBackend {
    fn forward<'a>(
        &'a self,
        request: CoreRequest,
        _identity: &'a str,
        deadline: Instant,
    ) -> BoxFuture<'a, CoreResponse> {
        Box::pin(async move {
            match tokio::time::timeout_at(deadline, self.send(request)).await {
                Ok(response) => response,
                Err(_) => self.failed(504, "did not answer in time"),
            }
        })
    }
}
