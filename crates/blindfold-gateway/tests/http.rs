//! HTTP/1.1 behaviour of a running gateway, on raw sockets: when it says `Connection: close`,
//! and that it then closes (or keeps serving) the connection as it said.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common;

/// The test credentials.
const KEYS: (&str, &str) = ("AKIDHTTPTEST", "http-test-secret");

struct Running;

impl Running {
    async fn start() -> common::Running {
        common::Running::start(KEYS, None).await
    }
}

/// Reads one response head (status line and headers, lower-cased) and its body.
async fn response(sock: &mut TcpStream) -> (String, Vec<u8>) {
    common::read_response(sock, false).await
}

/// Whether the server closes the connection within 10 s (reads return end of stream).
async fn closed(sock: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut rest)).await,
        Ok(Ok(0))
    )
}

fn says_close(head: &str) -> bool {
    head.lines().any(|l| l.trim() == "connection: close")
}

#[tokio::test]
async fn empty_body_with_expect_continue_is_answered_at_once_and_closes() {
    // hyper sends no `100 Continue` for an empty body, only the final answer; botocore then
    // misreads the next response on that connection unless the connection ends here.
    let g = Running::start().await;
    let mut sock = TcpStream::connect(g.addr).await.unwrap();
    sock.write_all(
        b"PUT /bucket/empty HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    let t0 = std::time::Instant::now();
    let (head, _) = response(&mut sock).await;
    assert!(t0.elapsed() < Duration::from_secs(1), "answered after {:?}", t0.elapsed());
    assert!(!head.starts_with("http/1.1 100"), "{head}");
    assert!(says_close(&head), "no `Connection: close` in\n{head}");
    assert!(closed(&mut sock).await, "said close but kept the connection open");
    g.stop().await;
}

#[tokio::test]
async fn a_request_refused_before_its_body_says_close() {
    // Refused (unsigned) before the body is read: without `Connection: close`, a client would
    // reuse a connection the server is about to drop (RFC 9110 §10.1.1).
    let g = Running::start().await;
    for expect in ["Expect: 100-continue\r\n", ""] {
        let mut sock = TcpStream::connect(g.addr).await.unwrap();
        let req =
            format!("PUT /bucket/k HTTP/1.1\r\nHost: gw\r\n{expect}Content-Length: 4\r\n\r\n");
        sock.write_all(req.as_bytes()).await.unwrap();
        let (mut head, _) = response(&mut sock).await;
        if head.starts_with("http/1.1 100") {
            sock.write_all(b"data").await.unwrap();
            head = response(&mut sock).await.0;
        }
        assert!(head.starts_with("http/1.1 403"), "{head}");
        assert!(says_close(&head), "{expect:?}: no `Connection: close` in\n{head}");
        assert!(closed(&mut sock).await, "{expect:?}: said close but kept the connection open");
    }
    g.stop().await;
}

#[tokio::test]
async fn requests_without_a_body_keep_the_connection() {
    let g = Running::start().await;
    let mut sock = TcpStream::connect(g.addr).await.unwrap();
    for _ in 0..3 {
        sock.write_all(b"GET /bucket/k HTTP/1.1\r\nHost: gw\r\n\r\n").await.unwrap();
        let (head, body) = response(&mut sock).await;
        assert!(head.starts_with("http/1.1 403"), "{head}");
        assert!(!says_close(&head), "{head}");
        assert!(String::from_utf8_lossy(&body).contains("AccessDenied"));
    }
    g.stop().await;
}

use common::{exchange, signed_as, status};

fn refused_as_sigv2(head: &str, body: &str) -> bool {
    head.starts_with("http/1.1 403") && body.contains("Signature Version 2 is not accepted")
}

#[tokio::test]
async fn sigv2_is_refused_with_a_reason() {
    let g = Running::start().await;
    let (head, body) = exchange(
        &g,
        b"GET /bucket/k HTTP/1.1\r\nHost: gw\r\nAuthorization: AWS AKIDHTTPTEST:c2ln\r\n\r\n",
    )
    .await;
    assert!(refused_as_sigv2(&head, &body), "{head}{body}");
    g.stop().await;
}

/// SigV2 presigned-URL parameters with a real access key and an expiry far ahead: what would
/// reach the SigV2 signature comparison if it were not refused.
const V2_QUERY: &str = "AWSAccessKeyId=AKIDHTTPTEST&Expires=4102444800";

#[tokio::test]
async fn sigv2_with_a_percent_encoded_parameter_name_is_refused() {
    let g = Running::start().await;
    for name in ["%53ignature", "Sig%6Eature", "%53%69%67%6e%61%74%75%72%65"] {
        let req = format!("GET /bucket/k?{V2_QUERY}&{name}=c2ln HTTP/1.1\r\nHost: gw\r\n\r\n");
        let (head, body) = exchange(&g, req.as_bytes()).await;
        assert!(refused_as_sigv2(&head, &body), "{name}: {head}{body}");
    }
    g.stop().await;
}

#[tokio::test]
async fn sigv2_beside_a_dummy_sigv4_signature_is_refused() {
    let g = Running::start().await;
    let req = format!(
        "GET /bucket/k?{V2_QUERY}&Signature=c2ln&X-Amz-Signature=00 HTTP/1.1\r\nHost: gw\r\n\r\n"
    );
    let (head, body) = exchange(&g, req.as_bytes()).await;
    assert!(refused_as_sigv2(&head, &body), "{head}{body}");
    g.stop().await;
}

#[tokio::test]
async fn a_browser_form_post_with_a_sigv2_signature_is_refused() {
    let g = Running::start().await;
    let policy = "eyJleHBpcmF0aW9uIjoiMjEwMC0wMS0wMVQwMDowMDowMFoiLCJjb25kaXRpb25zIjpbXX0=";
    let mut form = String::new();
    for (name, value) in [
        ("key", "k"),
        ("AWSAccessKeyId", "AKIDHTTPTEST"),
        ("policy", policy),
        ("signature", "c2lnbmF0dXJl"),
    ] {
        form +=
            &format!("--XYZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n");
    }
    form += "--XYZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
             Content-Type: text/plain\r\n\r\ndata\r\n--XYZ--\r\n";
    let req = format!(
        "POST /bucket HTTP/1.1\r\nHost: gw\r\nContent-Type: multipart/form-data; boundary=XYZ\r\n\
         Content-Length: {}\r\n\r\n{form}",
        form.len()
    );
    let (head, body) = exchange(&g, req.as_bytes()).await;
    assert!(head.starts_with("http/1.1 403"), "{head}{body}");
    assert!(body.contains("Browser-form (POST) uploads are not accepted"), "{body}");
    g.stop().await;
}

#[tokio::test]
async fn an_unknown_access_key_is_invalid_access_key_id() {
    let g = Running::start().await;
    let now = time::OffsetDateTime::now_utc();
    let day = format!("{:04}{:02}{:02}", now.year(), u8::from(now.month()), now.day());
    let stamp = format!("{day}T{:02}{:02}{:02}Z", now.hour(), now.minute(), now.second());
    let req = format!(
        "GET /bucket/k HTTP/1.1\r\nHost: gw\r\nx-amz-date: {stamp}\r\n\
         x-amz-content-sha256: UNSIGNED-PAYLOAD\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=NOSUCHKEY/{day}/us-east-1/s3/aws4_request, \
         SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={}\r\n\r\n",
        "0".repeat(64)
    );
    let mut sock = TcpStream::connect(g.addr).await.unwrap();
    sock.write_all(req.as_bytes()).await.unwrap();
    let (head, body) = response(&mut sock).await;
    let body = String::from_utf8_lossy(&body);
    assert!(head.starts_with("http/1.1 403"), "{head}");
    assert!(body.contains("<Code>InvalidAccessKeyId</Code>"), "{body}");
    g.stop().await;
}

/// A SigV4-signed request (header auth, unsigned payload) for the test credentials.
fn signed(method: &str, path: &str, extra_headers: &str) -> String {
    signed_as(KEYS, method, path, extra_headers)
}

#[tokio::test]
async fn errors_carry_the_standard_message() {
    let g = Running::start().await;
    let (head, body) =
        exchange(&g, format!("{}\r\n", signed("GET", "/nobucket/k", "")).as_bytes()).await;
    assert!(head.starts_with("http/1.1 404"), "{head}{body}");
    assert!(
        body.contains(
            "<Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>"
        ),
        "{body}"
    );
    // A signature that does not match (s3s's own error, raised without a message).
    let bad = signed("GET", "/nobucket/k", "").replace("Signature=", "Signature=0");
    let (head, body) = exchange(&g, format!("{bad}\r\n").as_bytes()).await;
    assert!(head.starts_with("http/1.1 403"), "{head}{body}");
    assert!(body.contains("<Message>The request signature we calculated"), "{body}");
    g.stop().await;
}

#[tokio::test]
async fn a_chunked_body_without_a_length_is_stored() {
    let g = Running::start().await;
    let (head, body) =
        exchange(&g, format!("{}\r\n", signed("PUT", "/bucket", "")).as_bytes()).await;
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    let put = signed("PUT", "/bucket/k", "Transfer-Encoding: chunked\r\n");
    let req = format!("{put}\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n");
    let (head, body) = exchange(&g, req.as_bytes()).await;
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    let (head, body) =
        exchange(&g, format!("{}\r\n", signed("GET", "/bucket/k", "")).as_bytes()).await;
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    assert_eq!(body, "abcdefg");
    g.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The admin listener.

/// One request to the admin listener; returns the status line, the head and the body.
async fn admin_exchange(
    g: &common::Running,
    method: &str,
    path: &str,
    headers: &str,
) -> (String, String) {
    let mut sock = TcpStream::connect(g.admin).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\n{headers}Content-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let (head, body) = response(&mut sock).await;
    (head, String::from_utf8_lossy(&body).into_owned())
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Authorization: Basic {b}\r\n")
}

fn keys() -> String {
    basic("AKIDHTTPTEST", "http-test-secret")
}

#[tokio::test]
async fn admin_probes_are_open_and_everything_else_wants_credentials() {
    let g = Running::start().await;
    let (head, body) = admin_exchange(&g, "GET", "/healthz", "").await;
    assert!(head.starts_with("http/1.1 200") && body == "ok\n", "{head}{body}");
    let (head, body) = admin_exchange(&g, "GET", "/readyz", "").await;
    assert!(head.starts_with("http/1.1 200") && body == "ready\n", "{head}{body}");
    for path in ["/metrics", "/", "/visualizer", "/api/summary", "/api/window", "/assets/app.js"] {
        for auth in [
            String::new(),
            basic("AKIDHTTPTEST", "wrong-secret"),
            basic("AKIDHTTPTEST", "http-test-secreT"),
            basic("someone", "http-test-secret"),
            "Authorization: Bearer admin-test-tokeN\r\n".into(),
            "Authorization: Bearer http-test-secret\r\n".into(),
            "Authorization: Basic !!!\r\n".into(),
            "Authorization: Digest x\r\n".into(),
        ] {
            let (head, body) = admin_exchange(&g, "GET", path, &auth).await;
            assert!(head.starts_with("http/1.1 401"), "{path} with {auth:?}: {head}");
            assert!(head.contains("www-authenticate: basic"), "{head}");
            assert!(!body.contains("blindfold_"), "{path}: {body}");
        }
    }
    for auth in [
        keys(),
        "Authorization: Bearer admin-test-token\r\n".into(),
        basic("anyone", "admin-test-token"),
    ] {
        let (head, body) = admin_exchange(&g, "GET", "/metrics", &auth).await;
        assert!(head.starts_with("http/1.1 200"), "{auth:?}: {head}{body}");
        assert!(body.contains("blindfold_info{"), "{body}");
    }
    g.stop().await;
}

#[tokio::test]
async fn admin_posts_need_the_header_and_sane_parameters() {
    let g = Running::start().await;
    let (head, body) = admin_exchange(&g, "POST", "/api/window?seconds=5", &keys()).await;
    assert!(head.starts_with("http/1.1 403"), "{head}");
    assert!(body.contains("X-Blindfold-Admin: 1"), "{body}");
    let with = format!("{}X-Blindfold-Admin: 1\r\n", keys());
    for bad in ["/api/window?seconds=abc", "/api/window?seconds=100000", "/api/demo?oram=maybe"] {
        let (head, body) = admin_exchange(&g, "POST", bad, &with).await;
        assert!(head.starts_with("http/1.1 400"), "{bad}: {head}{body}");
    }
    let (head, body) = admin_exchange(&g, "POST", "/api/window?seconds=5", &with).await;
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    assert!(body.contains("\"recording\":true"), "{body}");
    let (head, _) = admin_exchange(&g, "GET", "/nothing-here", &keys()).await;
    assert!(head.starts_with("http/1.1 404"), "{head}");
    g.stop().await;
}

#[tokio::test]
async fn one_demo_runs_at_a_time_and_window_polls_share_one_report() {
    let g = Running::start().await;
    let with = format!("{}X-Blindfold-Admin: 1\r\n", keys());
    let (head, body) = admin_exchange(&g, "POST", "/api/demo?oram=on&seconds=5", &with).await;
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    for oram in ["on", "off"] {
        let path = format!("/api/demo?oram={oram}&seconds=5");
        let (head, body) = admin_exchange(&g, "POST", &path, &with).await;
        assert!(head.starts_with("http/1.1 409"), "a second demo at once: {head}{body}");
        assert!(body.contains("running"), "{body}");
    }
    // The demo records 400 accesses a second; polls close together get one report.
    let mut bodies = Vec::new();
    for _ in 0..5 {
        bodies.push(admin_exchange(&g, "GET", "/api/window?source=demo", &keys()).await.1);
    }
    bodies.dedup();
    assert!(bodies.len() <= 2, "{} reports built for 5 quick polls", bodies.len());
    let first: serde_json::Value = serde_json::from_str(&bodies[0]).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (_, later) = admin_exchange(&g, "GET", "/api/window?source=demo", &keys()).await;
    let later: serde_json::Value = serde_json::from_str(&later).unwrap();
    assert!(later["elapsed_ms"].as_u64() > first["elapsed_ms"].as_u64(), "the report moves on");
    g.stop().await;
}

/// S3 traffic shows in the metrics by operation and status, and bucket and object names never
/// do; a recording window the operator opened holds the names.
#[tokio::test]
async fn metrics_count_s3_traffic_without_names() {
    let g = Running::start().await;
    let with = format!("{}X-Blindfold-Admin: 1\r\n", keys());
    let (head, _) = admin_exchange(&g, "POST", "/api/window?seconds=30", &with).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let (head, body) =
        exchange(&g, format!("{}\r\n", signed("PUT", "/payroll", "")).as_bytes()).await;
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    let put = signed("PUT", "/payroll/salaries.xlsx", "Content-Length: 5000\r\n");
    let mut req = format!("{put}\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'x', 5000));
    let (head, body) = exchange(&g, &req).await;
    assert!(head.starts_with("http/1.1 200"), "{head}{body}");
    let (head, body) =
        exchange(&g, format!("{}\r\n", signed("GET", "/payroll/salaries.xlsx", "")).as_bytes())
            .await;
    assert!(head.starts_with("http/1.1 200") && body.len() == 5000, "{head}");
    let (head, _) =
        exchange(&g, format!("{}\r\n", signed("GET", "/payroll/missing", "")).as_bytes()).await;
    assert!(head.starts_with("http/1.1 404"), "{head}");

    let (_, metrics) = admin_exchange(&g, "GET", "/metrics", &keys()).await;
    let value = |series: &str| metric_value(&metrics, series);
    assert_eq!(
        value("blindfold_s3_requests_total{operation=\"CreateBucket\",status=\"200\"}"),
        1.0
    );
    assert_eq!(value("blindfold_s3_requests_total{operation=\"PutObject\",status=\"200\"}"), 1.0);
    assert_eq!(value("blindfold_s3_requests_total{operation=\"GetObject\",status=\"200\"}"), 1.0);
    assert_eq!(value("blindfold_s3_requests_total{operation=\"GetObject\",status=\"404\"}"), 1.0);
    assert!(value("blindfold_s3_received_bytes_total") >= 5000.0);
    assert!(value("blindfold_s3_sent_bytes_total") >= 5000.0);
    assert!(value("blindfold_store_requests_total{kind=\"write\"}") > 0.0);
    assert!(value("blindfold_block_bytes_total{direction=\"written\"}") >= 5000.0);
    assert!(value("blindfold_commits_total") >= 1.0);
    assert!(value("blindfold_bandwidth_blowup") > 1.0);
    assert!(value("blindfold_process_resident_bytes") > 0.0);
    assert_eq!(value("blindfold_engine_poisoned"), 0.0);
    for word in ["payroll", "salaries", "xlsx", "missing"] {
        assert!(!metrics.contains(word), "{word:?} is in the metrics");
    }
    // The summary says what the engine is, and carries no names either.
    let (_, summary) = admin_exchange(&g, "GET", "/api/summary", &keys()).await;
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(summary["block_size"], 4096);
    assert!(!summary.to_string().contains("payroll"));
    // The window has the names (and the store's view of the same time).
    let (_, window) = admin_exchange(&g, "GET", "/api/window", &keys()).await;
    let window: serde_json::Value = serde_json::from_str(&window).unwrap();
    let names: Vec<&str> =
        window["requests"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    assert!(names.contains(&"payroll/salaries.xlsx"), "{names:?}");
    assert!(!window["physical"].as_array().unwrap().is_empty());
    assert!(!window["logical"].as_array().unwrap().is_empty());
    g.stop().await;
}

/// How full the store is shows in the metrics and the summary: blocks in use of the
/// capacity, objects and their bytes (an overwrite replaces, a delete frees), and the data
/// directory's disk.
#[tokio::test]
async fn store_fullness_is_in_the_metrics_and_the_summary() {
    let g = Running::start().await;
    let put = |path: &str, len: usize| {
        let mut req = format!("{}\r\n", signed("PUT", path, &format!("Content-Length: {len}\r\n")))
            .into_bytes();
        req.extend(std::iter::repeat_n(b'x', len));
        req
    };
    let ok = |r: (String, String)| assert!(r.0.starts_with("http/1.1 2"), "{}{}", r.0, r.1);
    ok(exchange(&g, format!("{}\r\n", signed("PUT", "/full", "")).as_bytes()).await);
    // 4 KiB blocks: 5000 bytes take 2, 10000 take 3, 100 take 1.
    ok(exchange(&g, &put("/full/a", 5000)).await);
    ok(exchange(&g, &put("/full/b", 10000)).await);
    ok(exchange(&g, &put("/full/c", 100)).await);
    ok(exchange(&g, &put("/full/a", 100)).await);
    ok(exchange(&g, format!("{}\r\n", signed("DELETE", "/full/c", "")).as_bytes()).await);

    let (_, metrics) = admin_exchange(&g, "GET", "/metrics", &keys()).await;
    let value = |series: &str| metric_value(&metrics, series);
    assert_eq!(value("blindfold_store_blocks_capacity"), 256.0);
    assert_eq!(value("blindfold_store_blocks_used"), 4.0);
    assert_eq!(value("blindfold_objects"), 2.0);
    assert_eq!(value("blindfold_object_bytes"), 10100.0);
    let free = value("blindfold_data_dir_free_bytes");
    let size = value("blindfold_data_dir_size_bytes");
    assert!(free > 0.0 && size >= free, "free {free}, size {size}");
    assert_eq!(value("blindfold_integrity_errors_total"), 0.0);
    assert!(
        !metrics.contains("blindfold_tls_certificate_expiry_timestamp_seconds "),
        "no certificate without TLS:\n{metrics}"
    );

    let (_, summary) = admin_exchange(&g, "GET", "/api/summary", &keys()).await;
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    let usage = &summary["usage"];
    assert_eq!(usage["blocks_used"], 4, "{summary}");
    assert_eq!(usage["blocks_capacity"], 256, "{summary}");
    assert_eq!(usage["objects"], 2, "{summary}");
    assert_eq!(usage["object_bytes"], 10100, "{summary}");
    assert!(usage["data_dir_free_bytes"].as_u64().unwrap() > 0, "{summary}");
    assert!(usage["tls_not_after"].is_null(), "{summary}");
    g.stop().await;
}

/// The visualizer's demo: the same skewed workload through Path ORAM looks uniform to the
/// store, and without it does not.
#[tokio::test]
async fn the_demo_shows_uniform_targets_with_oram_and_skew_without() {
    use blindfold_gateway::admin::start_demo;
    let on = start_demo(true, Duration::from_secs(4)).unwrap();
    let off = start_demo(false, Duration::from_secs(4)).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let on = on.window().unwrap();
    let off = off.window().unwrap();
    assert!(!on.recording && !off.recording);
    let p_on = on.uniformity.p_value.expect("enough samples with ORAM");
    let p_off = off.uniformity.p_value.expect("enough samples without ORAM");
    // With ORAM the test may reject by chance with probability 1e-4; without, the Zipf skew
    // gives p far below 1e-6 at these sample counts.
    assert!(p_on > 1e-4, "ORAM looked skewed: {:?} {:?}", on.uniformity, on.histogram);
    assert!(p_off < 1e-6, "no ORAM looked uniform: {:?} {:?}", off.uniformity, off.histogram);
}

// ---------------------------------------------------------------------------------------------
// Several users.

/// Sends a request signed with `keys` (with `body` if any); returns the status line and body.
async fn as_user(
    g: &common::Running,
    keys: (&str, &str),
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> (String, String) {
    let (head, body) = common::request(g, Some(keys), method, path, headers, body).await;
    (head.lines().next().unwrap_or("").to_owned(), body)
}

#[tokio::test]
async fn users_see_and_touch_only_their_buckets() {
    use blindfold_gateway::users::UserFile;
    let g = Running::start().await;
    let admin = ("AKIDHTTPTEST", "http-test-secret");
    let file = UserFile::new(&g.data_dir, &g.key);
    let alice = file.add("alice", vec!["team-*".into(), "alice".into()], false).unwrap();
    let bob = file.add("bob", vec!["team-shared".into()], true).unwrap();
    let a = (alice.access_key.as_str(), alice.secret_key());
    let b = (bob.access_key.as_str(), bob.secret_key());

    assert_eq!(status(&as_user(&g, admin, "PUT", "/payroll", "", b"").await), 200);
    assert_eq!(status(&as_user(&g, admin, "PUT", "/payroll/salaries", "", b"secret").await), 200);
    assert_eq!(status(&as_user(&g, a, "PUT", "/team-shared", "", b"").await), 200);
    assert_eq!(status(&as_user(&g, a, "PUT", "/team-shared/doc", "", b"hello").await), 200);
    assert_eq!(status(&as_user(&g, a, "PUT", "/alice", "", b"").await), 200);

    // Outside the policy: AccessDenied, for every kind of operation.
    for (method, path) in [
        ("PUT", "/elsewhere"),
        ("GET", "/payroll/salaries"),
        ("HEAD", "/payroll/salaries"),
        ("GET", "/payroll?list-type=2"),
        ("PUT", "/payroll/mine"),
        ("DELETE", "/payroll/salaries"),
        ("DELETE", "/payroll"),
        ("GET", "/payroll?uploads"),
        ("POST", "/payroll/x?uploads"),
    ] {
        let r = as_user(&g, a, method, path, "", b"").await;
        assert_eq!(status(&r), 403, "alice {method} {path}: {r:?}");
        if method != "HEAD" {
            assert!(r.1.contains("<Code>AccessDenied</Code>"), "{}", r.1);
            assert!(!r.1.contains("salaries"), "{}", r.1);
        }
    }
    // A copy whose source is outside the policy, into a bucket inside it.
    let copy = as_user(
        &g,
        a,
        "PUT",
        "/team-shared/stolen",
        "x-amz-copy-source: /payroll/salaries\r\n",
        b"",
    )
    .await;
    assert_eq!(status(&copy), 403, "{copy:?}");
    let copy =
        as_user(&g, a, "PUT", "/team-shared/copy", "x-amz-copy-source: /team-shared/doc\r\n", b"")
            .await;
    assert_eq!(status(&copy), 200, "{copy:?}");

    // A read-only user reads, and writes nothing.
    let r = as_user(&g, b, "GET", "/team-shared/doc", "", b"").await;
    assert_eq!((status(&r), r.1.as_str()), (200, "hello"));
    assert_eq!(status(&as_user(&g, b, "GET", "/team-shared?list-type=2", "", b"").await), 200);
    for (method, path) in
        [("PUT", "/team-shared/x"), ("DELETE", "/team-shared/doc"), ("PUT", "/team-other")]
    {
        let r = as_user(&g, b, method, path, "", b"").await;
        assert_eq!(status(&r), 403, "bob {method} {path}: {r:?}");
    }
    let r = as_user(&g, b, "GET", "/team-shared/doc", "", b"").await;
    assert_eq!(r.1, "hello", "a refused DELETE deleted");

    // ListBuckets: each sees its own buckets only; the administrator sees all.
    let names = |body: &str| -> Vec<String> {
        body.split("<Name>")
            .skip(1)
            .filter_map(|s| s.split("</Name>").next())
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(names(&as_user(&g, a, "GET", "/", "", b"").await.1), ["alice", "team-shared"]);
    assert_eq!(names(&as_user(&g, b, "GET", "/", "", b"").await.1), ["team-shared"]);
    assert_eq!(
        names(&as_user(&g, admin, "GET", "/", "", b"").await.1),
        ["alice", "payroll", "team-shared"]
    );

    // Rotation: the old secret stops working, the new one works; removal: the key is unknown.
    let rotated = file.rotate("alice").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = as_user(&g, a, "GET", "/team-shared/doc", "", b"").await;
    assert_eq!(status(&r), 403, "old secret still works: {r:?}");
    assert!(r.1.contains("SignatureDoesNotMatch"), "{}", r.1);
    let a2 = (rotated.access_key.as_str(), rotated.secret_key());
    assert_eq!(status(&as_user(&g, a2, "GET", "/team-shared/doc", "", b"").await), 200);
    file.remove("alice").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = as_user(&g, a2, "GET", "/team-shared/doc", "", b"").await;
    assert!(r.1.contains("InvalidAccessKeyId"), "removed user still signs in: {r:?}");

    // A damaged users file: no user signs in, the administrator still does.
    let path = g.data_dir.join(blindfold_gateway::users::USERS_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = as_user(&g, b, "GET", "/team-shared/doc", "", b"").await;
    assert!(r.1.contains("InvalidAccessKeyId"), "a user signed in from a damaged file: {r:?}");
    assert_eq!(status(&as_user(&g, admin, "GET", "/team-shared/doc", "", b"").await), 200);
    g.stop().await;
}

/// The value of the sample `series` (name and labels, as printed) in a `/metrics` page.
fn metric_value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{series} missing from\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}
