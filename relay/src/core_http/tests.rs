use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use ledger_relay_wire::core_http::{url_decode, HttpMethod};

use super::*;

fn request(port: CorePort, method: HttpMethod, target: &str, body: &[u8]) -> CoreRequest {
    CoreRequest {
        version: 1,
        port,
        method,
        timeout_ms: 0,
        target: target.into(),
        content_type: String::new(),
        body: Bytes::copy_from_slice(body),
    }
}

fn tx() -> CoreRequest {
    request(CorePort::Command, HttpMethod::Get, "/tx?blob=AAAA%2B", b"")
}

fn query() -> CoreRequest {
    request(
        CorePort::Query,
        HttpMethod::Post,
        "/getledgerentry",
        b"key=AAAA&ledgerSeq=5",
    )
}

fn open_rule() -> PortRule {
    PortRule {
        backend: true,
        allow: None,
    }
}

fn rules() -> Rules {
    Rules {
        command: open_rule(),
        query: open_rule(),
        max_request: 100,
        concurrency: 2,
    }
}

fn allow(names: &[&str]) -> Option<BTreeSet<String>> {
    Some(names.iter().map(|n| n.to_string()).collect())
}

#[test]
fn a_request_that_passes_every_check_goes_to_its_endpoint() {
    assert_eq!(decide(&rules(), &tx(), "rpc-1", 0), Ok(Endpoint::Tx));
    assert_eq!(
        decide(&rules(), &query(), "rpc-1", 1),
        Ok(Endpoint::GetLedgerEntry)
    );
    let info = request(CorePort::Command, HttpMethod::Get, "/info", b"");
    assert_eq!(decide(&rules(), &info, "rpc-1", 0), Ok(Endpoint::Info));
}

#[test]
fn endpoints_that_could_reconfigure_core_are_refused_with_403() {
    for (port, method, target) in [
        (CorePort::Command, HttpMethod::Get, "/upgrades?mode=set"),
        (CorePort::Command, HttpMethod::Get, "/manualclose"),
        (CorePort::Command, HttpMethod::Post, "/tx?blob=AAAA"),
        (CorePort::Query, HttpMethod::Get, "/getledgerentry"),
        (CorePort::Query, HttpMethod::Post, "/tx"),
        (CorePort::Command, HttpMethod::Get, "/tx/"),
    ] {
        let r = decide(&rules(), &request(port, method, target, b""), "rpc-1", 0);
        match r {
            Err(e @ Refusal::NotForwarded(_)) => assert_eq!(e.status(), 403, "{target}"),
            other => panic!("{target}: {other:?}"),
        }
    }
}

#[test]
fn the_checks_run_in_order_and_the_first_failure_answers() {
    // Everything wrong at once: not forwarded wins.
    let mut r = rules();
    r.command.allow = allow(&["other"]);
    r.command.backend = false;
    r.max_request = 1;
    r.concurrency = 1;
    let bad = request(CorePort::Command, HttpMethod::Get, "/upgrades", b"");
    assert!(matches!(
        decide(&r, &bad, "rpc-1", 5),
        Err(Refusal::NotForwarded(_))
    ));
    // Then the allow-list, then the backend, then the size, then the concurrency.
    let e = decide(&r, &tx(), "rpc-1", 5).unwrap_err();
    assert_eq!(
        e,
        Refusal::NotAllowed {
            identity: "rpc-1".into(),
            port: CorePort::Command
        }
    );
    assert_eq!(e.status(), 403);
    r.command.allow = allow(&["rpc-1"]);
    let e = decide(&r, &tx(), "rpc-1", 5).unwrap_err();
    assert_eq!(
        e,
        Refusal::NoCore {
            port: CorePort::Command
        }
    );
    assert_eq!(e.status(), 403);
    r.command.backend = true;
    let e = decide(&r, &tx(), "rpc-1", 5).unwrap_err();
    assert_eq!(e, Refusal::TooLarge { len: 16, limit: 1 });
    assert_eq!(e.status(), 413);
    r.max_request = 16;
    let e = decide(&r, &tx(), "rpc-1", 5).unwrap_err();
    assert_eq!(
        e,
        Refusal::Busy {
            identity: "rpc-1".into(),
            limit: 1
        }
    );
    assert_eq!(e.status(), 429);
    assert_eq!(decide(&r, &tx(), "rpc-1", 0), Ok(Endpoint::Tx));
}

#[test]
fn each_port_has_its_own_allow_list_and_backend() {
    let mut r = rules();
    r.query.allow = allow(&["rpc-2"]);
    r.command.backend = false;
    assert!(matches!(
        decide(&r, &query(), "rpc-1", 0),
        Err(Refusal::NotAllowed { .. })
    ));
    assert_eq!(
        decide(&r, &query(), "rpc-2", 0),
        Ok(Endpoint::GetLedgerEntry)
    );
    assert!(matches!(
        decide(&r, &tx(), "rpc-2", 0),
        Err(Refusal::NoCore { .. })
    ));
}

#[test]
fn the_size_counts_target_content_type_and_body() {
    let mut q = query();
    q.content_type = "application/x-www-form-urlencoded".into();
    let len = "/getledgerentry".len() + q.content_type.len() + q.body.len();
    assert_eq!(request_size(&q), len);
    let mut r = rules();
    r.max_request = len as u32;
    assert!(decide(&r, &q, "rpc-1", 0).is_ok(), "a request of the limit");
    r.max_request = len as u32 - 1;
    assert_eq!(
        decide(&r, &q, "rpc-1", 0),
        Err(Refusal::TooLarge {
            len,
            limit: len as u32 - 1
        })
    );
}

#[test]
fn refusals_answer_as_the_relay_in_cores_error_shape() {
    let r = Refusal::Busy {
        identity: "rpc-1".into(),
        limit: 16,
    }
    .response();
    assert_eq!((r.status, r.origin), (429, Origin::Relay));
    assert_eq!(r.content_type, "application/json");
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        body["exception"],
        "ledger-relay: client rpc-1 already has 16 requests in flight"
    );
}

#[test]
fn the_budget_is_the_shorter_of_the_relays_timeout_and_the_senders() {
    let five = Duration::from_secs(5);
    assert_eq!(budget(five, 0), five, "0 names no timeout");
    assert_eq!(budget(five, 2000), Duration::from_secs(2));
    assert_eq!(budget(five, 9000), five);
    assert_eq!(budget(five, 1), Duration::from_millis(1));
}

#[test]
fn outcomes_follow_who_answered_and_how() {
    let core = |status| CoreResponse {
        status,
        origin: Origin::Core,
        content_type: "text/html".into(),
        body: Bytes::new(),
    };
    assert_eq!(Outcome::of(&core(200)), Outcome::Answered);
    assert_eq!(
        Outcome::of(&core(404)),
        Outcome::Answered,
        "core's own errors are answers"
    );
    let relay = |status| Outcome::of(&CoreResponse::from_relay(status, "x"));
    assert_eq!(relay(403), Outcome::Refused);
    assert_eq!(relay(413), Outcome::Refused);
    assert_eq!(relay(429), Outcome::Refused);
    assert_eq!(relay(503), Outcome::Unavailable);
    assert_eq!(relay(504), Outcome::TimedOut);
    assert_eq!(relay(502), Outcome::Failed);
    assert_eq!(relay(500), Outcome::Failed);
}

#[test]
fn core_urls_are_plain_http_with_a_host_and_a_port() {
    let ok: CoreUrl = "http://127.0.0.1:11626".parse().unwrap();
    assert_eq!(ok.to_string(), "http://127.0.0.1:11626");
    let with_path: CoreUrl = "http://core.internal:80/core/".parse().unwrap();
    assert_eq!(with_path.to_string(), "http://core.internal/core");
    let v6: CoreUrl = "http://[::1]:11628".parse().unwrap();
    assert_eq!(v6.to_string(), "http://[::1]:11628");
    for (bad, what) in [
        ("https://127.0.0.1:11626", "not http"),
        ("http://127.0.0.1", "no port"),
        ("http://[::1]", "no port"),
        ("http://127.0.0.1:", "no port"),
        ("127.0.0.1:11626", "no scheme"),
        ("http://u:p@127.0.0.1:11626", "user info"),
        ("http://127.0.0.1:11626/?x=1", "query"),
        ("http://127.0.0.1:11626/#x", "fragment"),
        ("http://:11626", "no host"),
    ] {
        assert!(bad.parse::<CoreUrl>().is_err(), "{bad}: {what}");
    }
    assert!(matches!(
        "http://127.0.0.1".parse::<CoreUrl>(),
        Err(http::BadCoreUrl::NoPort)
    ));
}

/// Core decodes the whole URI once before it reads it: whatever the URL layer escapes, core
/// reads the target the stand-in received, and what was escaped (`%2B` in a blob) stays so.
#[test]
fn a_target_reaches_core_as_core_reads_the_one_received() {
    let base: CoreUrl = "http://127.0.0.1:11626/base".parse().unwrap();
    let visible: String = (0x21u8..=0x7e).map(char::from).collect();
    let targets = [
        "/tx?blob=AAAA%2BBBB%3D%3D".to_owned(),
        format!("/tx?blob={}", visible.replace('%', "%25")),
        "/info".to_owned(),
        "/tx?a=1#frag&b=\"x\"".to_owned(),
    ];
    for target in targets {
        let url = base.for_target(&target).unwrap();
        assert_eq!(url.fragment(), None, "{target}: nothing is left unsent");
        let sent = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let sent = sent.strip_prefix("/base").expect("the base path first");
        assert_eq!(
            url_decode(sent.as_bytes()),
            url_decode(target.as_bytes()),
            "{target} sent as {sent}"
        );
    }
    let url = base.for_target("/tx?blob=AAAA%2BBBB%3D%3D").unwrap();
    assert_eq!(
        url.as_str(),
        "http://127.0.0.1:11626/base/tx?blob=AAAA%2BBBB%3D%3D"
    );
}

#[test]
fn a_request_of_another_protocol_version_is_refused_with_400_before_any_other_check() {
    let mut r = request(CorePort::Command, HttpMethod::Get, "/upgrades", b"");
    r.version = 2;
    let e = decide(&rules(), &r, "rpc-1", 0).unwrap_err();
    assert_eq!(e, Refusal::Version { version: 2 });
    assert_eq!(e.status(), 400);
}
