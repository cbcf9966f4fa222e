//! Hostile requests into the Swift API and the admin API over real sockets: random methods,
//! paths (near the real routes and not), queries, headers (valid and forged tokens, the headers
//! each front end reads, random bytes) and bodies. Every request must get a well-formed HTTP
//! answer that is not a server error, and both listeners must still serve afterwards.
//!
//! Cases: `BLINDFOLD_FUZZ_CASES` (see `blindfold_testkit::fuzz`), a quarter of them per front
//! end (a connection each).

use std::sync::Arc;
use std::time::Duration;

use blindfold_gateway::listen::Limits;
use blindfold_gateway::users::Access;
use blindfold_gateway::{admin, server, swift};
use blindfold_testkit::fuzz;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;

const ACCESS: &str = "AKFRONTFUZZ";
const SECRET: &str = "front-fuzz-secret";

#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// Send the valid token (Swift) or the valid keys (admin).
    authorized: bool,
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec!["GET", "PUT", "POST", "DELETE", "HEAD", "COPY"]).prop_map(str::to_owned),
        1 => "[A-Z]{1,8}",
    ]
}

/// A path segment: plain, percent-encoded (valid or not), long, or odd.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9._-]{0,12}",
        "(%[0-9A-Fa-f]{2}){1,6}",
        "%[G-Z]{2}",
        "[A-Za-z0-9._~!$&'()*+,;=:@-]{0,20}",
        (1usize..3000).prop_map(|n| "x".repeat(n)),
        Just("..".to_owned()),
    ]
}

fn query() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        prop::sample::select(vec![
            "limit",
            "marker",
            "end_marker",
            "prefix",
            "delimiter",
            "format",
            "reverse",
            "seconds",
            "oram",
            "source",
            "multipart-manifest",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,8}",
    ];
    let value = prop_oneof![
        "[0-9]{0,7}",
        prop::sample::select(vec!["json", "xml", "plain", "on", "off", "demo", "-1", "1e9"])
            .prop_map(str::to_owned),
        "[A-Za-z0-9%._~/-]{0,16}",
    ];
    prop::collection::vec((name, value), 0..4).prop_map(|q| {
        if q.is_empty() {
            String::new()
        } else {
            let pairs: Vec<String> = q.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("?{}", pairs.join("&"))
        }
    })
}

fn header() -> impl Strategy<Value = (String, Vec<u8>)> {
    let name = prop_oneof![
        prop::sample::select(vec![
            "X-Auth-User",
            "X-Auth-Key",
            "X-Storage-User",
            "X-Storage-Pass",
            "X-Auth-Token",
            "X-Copy-From",
            "Destination",
            "ETag",
            "Range",
            "If-Match",
            "If-None-Match",
            "Content-Type",
            "X-Object-Meta-Color",
            "X-Container-Meta-A",
            "X-Blindfold-Admin",
            "Authorization",
            "Transfer-Encoding",
            "Expect",
        ])
        .prop_map(str::to_owned),
        "X-[A-Za-z-]{1,12}",
    ];
    let value = prop_oneof![
        "[ -~]{0,40}".prop_map(String::into_bytes),
        prop::sample::select(vec![
            "bytes=0-3",
            "bytes=-5",
            "bytes=9-2",
            "bytes=0-0,2-3",
            "team:AKFRONTFUZZ",
            "front-fuzz-secret",
            "AUTH_tkforged",
            "1",
            "chunked",
            "100-continue",
            "Basic !!!",
            "Bearer ",
            "box/o",
            "/box/o",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ];
    (name, value)
}

fn request(routes: &'static [&'static str]) -> impl Strategy<Value = Req> {
    let path = prop_oneof![
        3 => (prop::sample::select(routes.to_vec()), prop::collection::vec(segment(), 0..3), query())
            .prop_map(|(r, s, q)| {
                let mut p = r.to_owned();
                for seg in s {
                    p.push('/');
                    p.push_str(&seg);
                }
                p + &q
            }),
        1 => "/[ -~]{0,60}".prop_filter("a request target has no spaces", |p| !p.contains(' ')),
    ];
    (
        method(),
        path,
        prop::collection::vec(header(), 0..5),
        prop::collection::vec(any::<u8>(), 0..64),
        any::<bool>(),
    )
        .prop_map(|(method, path, headers, body, authorized)| Req {
            method,
            path,
            headers,
            body,
            authorized,
        })
}

/// Sends `r` with `auth` (extra header lines) on a fresh connection; the status of the answer.
async fn send(addr: std::net::SocketAddr, r: &Req, auth: &str) -> Result<u16, String> {
    let mut sock = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut req = format!("{} {} HTTP/1.1\r\nHost: fuzz\r\n", r.method, r.path).into_bytes();
    if r.authorized {
        req.extend_from_slice(auth.as_bytes());
    }
    for (k, v) in &r.headers {
        if k.eq_ignore_ascii_case("content-length") {
            continue;
        }
        req.extend_from_slice(k.as_bytes());
        req.extend_from_slice(b": ");
        req.extend(v.iter().filter(|&&b| b != b'\r' && b != b'\n'));
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(format!("Content-Length: {}\r\n", r.body.len()).as_bytes());
    req.extend_from_slice(b"Connection: close\r\n\r\n");
    req.extend_from_slice(&r.body);
    // The server may answer and close before reading everything (a bad head): not an error.
    let _ = sock.write_all(&req).await;
    let mut out = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut out)).await {
        Err(_) => return Err("no answer within 10 s".into()),
        Ok(Err(e)) if out.is_empty() => return Err(format!("connection failed: {e}")),
        Ok(_) => {}
    }
    let text = String::from_utf8_lossy(&out);
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    if parts.next() != Some("HTTP/1.1") {
        return Err(format!("not an HTTP answer: {:?}", &text[..text.len().min(200)]));
    }
    parts.next().and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status in {line:?}"))
}

const SWIFT_ROUTES: &[&str] = &[
    "/auth/v1.0",
    "/auth/v1",
    "/info",
    "/v1/AUTH_team",
    "/v1/AUTH_team/box",
    "/v1/AUTH_team/box/o",
    "/v1/AUTH_other",
    "/v1",
];

const ADMIN_ROUTES: &[&str] = &[
    "/",
    "/healthz",
    "/readyz",
    "/metrics",
    "/visualizer",
    "/api/summary",
    "/api/window",
    "/api/demo",
    "/assets/app.js",
    "/assets",
];

#[test]
fn hostile_swift_and_admin_requests_get_well_formed_answers() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::memory_cfg(dir.path(), ACCESS, SECRET);
    let (swift_addr, admin_addr, _opened) = rt.block_on(async {
        let opened = server::open(&cfg).await.unwrap();
        let access = Arc::new(Access::new((ACCESS.into(), SECRET.into()), None));
        let front = Arc::new(swift::Swift::new(Arc::clone(&opened.objects), access, false));
        let swift_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let swift_addr = swift_listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        std::mem::forget(stop);
        tokio::spawn(swift::serve(swift_listener, front, None, Limits::default(), stopped));
        let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_addr = admin_listener.local_addr().unwrap();
        let auth = admin::AdminAuth::new((ACCESS.into(), SECRET.into()), None).unwrap();
        let state = admin::AdminState::new(&opened, auth, None);
        tokio::spawn(admin::serve(admin_listener, state, None, Limits::default()));
        (swift_addr, admin_addr, opened)
    });
    // A token, a container and an object for the random requests to find.
    let token = rt.block_on(async {
        let sign_in = Req {
            method: "GET".into(),
            path: "/auth/v1.0".into(),
            headers: vec![],
            body: vec![],
            authorized: true,
        };
        let mut sock = tokio::net::TcpStream::connect(swift_addr).await.unwrap();
        sock.write_all(
            format!(
                "GET {} HTTP/1.1\r\nHost: fuzz\r\nX-Auth-User: team:{ACCESS}\r\nX-Auth-Key: \
                 {SECRET}\r\nConnection: close\r\n\r\n",
                sign_in.path
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        sock.read_to_string(&mut out).await.unwrap();
        let token = out
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("x-auth-token:").map(|_| l))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .expect("a token");
        let auth = format!("X-Auth-Token: {token}\r\n");
        for (path, body) in [("/v1/AUTH_team/box", ""), ("/v1/AUTH_team/box/o", "hello")] {
            let put = Req {
                method: "PUT".into(),
                path: path.into(),
                headers: vec![],
                body: body.into(),
                authorized: true,
            };
            let status = send(swift_addr, &put, &auth).await.unwrap();
            assert!((200..300).contains(&status), "setup {path}: {status}");
        }
        auth
    });
    let admin_auth = {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{ACCESS}:{SECRET}"));
        format!("Authorization: Basic {b}\r\nX-Blindfold-Admin: 1\r\n")
    };
    for (what, addr, routes, auth) in [
        ("swift", swift_addr, SWIFT_ROUTES, token.as_str()),
        ("admin", admin_addr, ADMIN_ROUTES, admin_auth.as_str()),
    ] {
        let mut runner = TestRunner::new(fuzz::config_scaled(4));
        runner
            .run(&request(routes), |r| {
                let status = rt.block_on(send(addr, &r, auth)).map_err(TestCaseError::fail)?;
                prop_assert!(
                    !(500..600).contains(&status) || status == 501,
                    "{what}: {status} for {r:?}"
                );
                Ok(())
            })
            .unwrap();
        // Still serving.
        let probe = Req {
            method: "GET".into(),
            path: if what == "swift" { "/info".into() } else { "/healthz".into() },
            headers: vec![],
            body: vec![],
            authorized: false,
        };
        assert_eq!(rt.block_on(send(addr, &probe, "")).unwrap(), 200, "{what} after the fuzz");
    }
}
