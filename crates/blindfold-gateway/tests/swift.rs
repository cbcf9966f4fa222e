//! The Swift front end over raw HTTP: sign-in, listings paged with markers and delimiters,
//! uploads that do not match their ETag (nothing stored, nothing replaced), and hostile
//! requests answered with clear errors. The real `python-swiftclient` runs in
//! `scripts/e2e.sh`.

use std::sync::Arc;

use blindfold_gateway::server;
use blindfold_gateway::swift::{self, Swift};
use blindfold_gateway::users::{Access, UserFile};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common;

struct Front {
    addr: std::net::SocketAddr,
    _opened: server::Opened,
    _stop: tokio::sync::watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

async fn start() -> Front {
    start_with(false).await.0
}

/// A Swift front end; with `users`, reading `<data-dir>/users.sealed` (returned to edit) as
/// `blindfold serve` does.
async fn start_with(users: bool) -> (Front, Arc<Access>, Option<UserFile>) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::memory_cfg(dir.path(), "AKSWIFTTEST", "swift-test-secret");
    let opened = server::open(&cfg).await.unwrap();
    let file = users.then(|| UserFile::new(&opened.data_dir, &opened.key));
    let access = Arc::new(Access::new(
        ("AKSWIFTTEST".into(), "swift-test-secret".into()),
        users.then(|| UserFile::new(&opened.data_dir, &opened.key)),
    ));
    let front = Arc::new(Swift::new(Arc::clone(&opened.objects), Arc::clone(&access), false));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let limits = blindfold_gateway::listen::Limits::default();
    tokio::spawn(swift::serve(listener, front, None, limits, stopped));
    (Front { addr, _opened: opened, _stop: stop, _dir: dir }, access, file)
}

/// One request on a fresh connection: (status code, lower-cased head, body).
async fn call(
    f: &Front,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut sock = TcpStream::connect(f.addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", f.addr);
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    sock.write_all(req.as_bytes()).await.unwrap();
    sock.write_all(body).await.unwrap();
    let (head, body) = common::read_response(&mut sock, method == "HEAD").await;
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, body)
}

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest as _;
    hex::encode(md5::Md5::digest(data))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).map(str::trim)
}

/// Signs in; returns the token and the storage path (`/v1/AUTH_…`).
async fn token(f: &Front) -> (String, String) {
    token_of(f, "AKSWIFTTEST", "swift-test-secret").await
}

/// Signs in to account `team` with an access key and secret.
async fn token_of(f: &Front, access_key: &str, secret: &str) -> (String, String) {
    let user = format!("team:{access_key}");
    let (status, head, _) =
        call(f, "GET", "/auth/v1.0", &[("X-Auth-User", &user), ("X-Auth-Key", secret)], b"").await;
    assert_eq!(status, 200, "{head}");
    // (The reader lower-cases heads: the account and the token's prefix are restored.)
    let url = header(&head, "x-storage-url").unwrap();
    assert_eq!(url, format!("http://{}/v1/auth_team", f.addr));
    let token = header(&head, "x-auth-token").unwrap().strip_prefix("auth_tk").unwrap();
    assert_eq!(token.len(), 32);
    (format!("AUTH_tk{token}"), "/v1/AUTH_team".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_with_the_s3_keys_only() {
    let f = start().await;
    for (user, key) in [
        ("team:AKSWIFTTEST", "wrong"),
        ("team:NOSUCHKEY", "swift-test-secret"),
        ("AKSWIFTTEST", "swift-test-secret"),
        ("te am:AKSWIFTTEST", "swift-test-secret"),
    ] {
        let (status, _, _) =
            call(&f, "GET", "/auth/v1.0", &[("X-Auth-User", user), ("X-Auth-Key", key)], b"").await;
        assert_eq!(status, 401, "{user} {key}");
    }
    let (status, _, _) = call(&f, "GET", "/v1/AUTH_team", &[], b"").await;
    assert_eq!(status, 401);
    let (tok, path) = token(&f).await;
    let (status, _, _) = call(&f, "HEAD", &path, &[("X-Auth-Token", &tok)], b"").await;
    assert_eq!(status, 204);
    // A token works only for the account it was issued for.
    let (status, _, _) = call(&f, "HEAD", "/v1/AUTH_other", &[("X-Auth-Token", &tok)], b"").await;
    assert_eq!(status, 401);
    let (status, _, _) = call(&f, "HEAD", &path, &[("X-Auth-Token", "AUTH_tkforged")], b"").await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_page_through_markers_and_delimiters() {
    let f = start().await;
    let (tok, path) = token(&f).await;
    let t = [("X-Auth-Token", tok.as_str())];
    assert_eq!(call(&f, "PUT", &format!("{path}/box"), &t, b"").await.0, 201);
    assert_eq!(call(&f, "PUT", &format!("{path}/box"), &t, b"").await.0, 202);
    for key in ["a/1", "a/2", "a/3/x", "b/1", "c", "d/x/y", "e"] {
        let (status, _, _) =
            call(&f, "PUT", &format!("{path}/box/{key}"), &t, key.as_bytes()).await;
        assert_eq!(status, 201, "{key}");
    }
    // One entry per page, each page starting after the previous page's last entry.
    let mut marker = String::new();
    let mut pages = Vec::new();
    for _ in 0..10 {
        let q = format!("{path}/box?delimiter=/&limit=1&marker={marker}");
        let (status, _, body) = call(&f, "GET", &q, &t, b"").await;
        if status == 204 {
            break;
        }
        assert_eq!(status, 200);
        let name = String::from_utf8(body).unwrap().trim_end().to_owned();
        marker = name.replace('/', "%2F");
        pages.push(name);
    }
    assert_eq!(pages, ["a/", "b/", "c", "d/", "e"]);
    let (_, _, body) = call(&f, "GET", &format!("{path}/box?prefix=a/&delimiter=/"), &t, b"").await;
    assert_eq!(String::from_utf8(body).unwrap(), "a/1\na/2\na/3/\n");
    let (_, _, body) =
        call(&f, "GET", &format!("{path}/box?marker=a/2&end_marker=d"), &t, b"").await;
    assert_eq!(String::from_utf8(body).unwrap(), "a/3/x\nb/1\nc\n");
    let (status, head, body) =
        call(&f, "GET", &format!("{path}/box?prefix=a/&delimiter=/&format=json"), &t, b"").await;
    assert_eq!(status, 200);
    assert!(header(&head, "content-type").unwrap().starts_with("application/json"));
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json[0]["name"], "a/1");
    assert_eq!(json[0]["bytes"], 3);
    assert_eq!(json[0]["hash"], md5_hex(b"a/1"));
    assert_eq!(json[2]["subdir"], "a/3/");
    // The account listing and counts.
    let (_, _, body) = call(&f, "GET", &format!("{path}?format=json"), &t, b"").await;
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json[0]["name"], "box");
    assert_eq!(json[0]["count"], 7);
    let (status, head, _) = call(&f, "HEAD", &format!("{path}/box"), &t, b"").await;
    assert_eq!(status, 204);
    assert_eq!(header(&head, "x-container-object-count"), Some("7"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_etag_differs_stores_and_replaces_nothing() {
    let f = start().await;
    let (tok, path) = token(&f).await;
    let t = [("X-Auth-Token", tok.as_str())];
    call(&f, "PUT", &format!("{path}/box"), &t, b"").await;
    let obj = format!("{path}/box/doc");
    let md5 = md5_hex(b"first");
    let with_etag = [("X-Auth-Token", tok.as_str()), ("ETag", md5.as_str())];
    assert_eq!(call(&f, "PUT", &obj, &with_etag, b"first").await.0, 201);
    let (status, _, _) = call(&f, "PUT", &obj, &with_etag, b"second").await;
    assert_eq!(status, 422);
    let (status, head, body) = call(&f, "GET", &obj, &t, b"").await;
    assert_eq!((status, body.as_slice()), (200, &b"first"[..]));
    assert_eq!(header(&head, "etag"), Some(md5.as_str()));
    // Ranges: one range, a suffix, an unsatisfiable one (416), a malformed one (ignored).
    let (status, head, body) = call(&f, "GET", &obj, &[t[0], ("Range", "bytes=1-3")], b"").await;
    assert_eq!((status, body.as_slice()), (206, &b"irs"[..]));
    assert_eq!(header(&head, "content-range"), Some("bytes 1-3/5"));
    let (_, _, body) = call(&f, "GET", &obj, &[t[0], ("Range", "bytes=-2")], b"").await;
    assert_eq!(body, b"st");
    let (status, head, _) = call(&f, "GET", &obj, &[t[0], ("Range", "bytes=9-")], b"").await;
    assert_eq!(status, 416);
    assert_eq!(header(&head, "content-range"), Some("bytes */5"));
    let (status, _, body) = call(&f, "GET", &obj, &[t[0], ("Range", "bytes=3-1")], b"").await;
    assert_eq!((status, body.as_slice()), (200, &b"first"[..]));
    // Copy, delete, and the container's emptiness rule.
    let copy = [t[0], ("X-Copy-From", "/box/doc")];
    assert_eq!(call(&f, "PUT", &format!("{path}/box/copy"), &copy, b"").await.0, 201);
    assert_eq!(call(&f, "GET", &format!("{path}/box/copy"), &t, b"").await.2, b"first");
    assert_eq!(call(&f, "DELETE", &format!("{path}/box"), &t, b"").await.0, 409);
    assert_eq!(call(&f, "DELETE", &obj, &t, b"").await.0, 204);
    assert_eq!(call(&f, "DELETE", &obj, &t, b"").await.0, 404);
    assert_eq!(call(&f, "DELETE", &format!("{path}/box/copy"), &t, b"").await.0, 204);
    assert_eq!(call(&f, "DELETE", &format!("{path}/box"), &t, b"").await.0, 204);
    assert_eq!(call(&f, "HEAD", &format!("{path}/box"), &t, b"").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_clear_errors() {
    let f = start().await;
    let (tok, path) = token(&f).await;
    let t = [("X-Auth-Token", tok.as_str())];
    call(&f, "PUT", &format!("{path}/box"), &t, b"").await;
    let long = "x".repeat(1025);
    for (method, p, want) in [
        ("PUT", format!("{path}/Bad_Name"), 400),
        ("PUT", format!("{path}/ab"), 400),
        ("GET", format!("{path}/box/%FF%FE"), 400),
        ("PUT", format!("{path}/box/{long}"), 400),
        ("GET", format!("{path}/box?limit=abc"), 412),
        ("GET", format!("{path}/box?limit=10001"), 412),
        ("GET", format!("{path}/box?format=xml"), 400),
        ("GET", format!("{path}/nosuch"), 404),
        ("GET", format!("{path}/nosuch/obj"), 404),
        ("GET", format!("{path}/box/nosuch"), 404),
        ("GET", "/v2/AUTH_team".to_owned(), 404),
        ("GET", "/v1/team".to_owned(), 404),
        ("PATCH", format!("{path}/box/x"), 405),
    ] {
        let (status, _, _) = call(&f, method, &p, &t, b"").await;
        assert_eq!(status, want, "{method} {}", &p[..p.len().min(80)]);
    }
    let (status, _, _) =
        call(&f, "PUT", &format!("{path}/box/x"), &[t[0], ("ETag", "not-hex")], b"data").await;
    assert_eq!(status, 422);
    let (status, _, _) =
        call(&f, "PUT", &format!("{path}/box/x"), &[t[0], ("X-Copy-From", "nosep")], b"").await;
    assert_eq!(status, 412);
}

/// Waits until the S3 side refuses `secret` for `access_key` (the users file is re-read at
/// most once a second), then returns at once.
async fn until_s3_refuses(access: &Access, access_key: &str, secret: &str) {
    let started = std::time::Instant::now();
    while access.secret_matches(access_key, secret) {
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "the S3 side never noticed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_or_removing_a_user_signs_out_its_swift_tokens_when_s3_refuses_it() {
    let (f, access, file) = start_with(true).await;
    let file = file.unwrap();
    let (tok, path) = token(&f).await;
    call(&f, "PUT", &format!("{path}/box"), &[("X-Auth-Token", &tok)], b"").await;
    let alice = file.add("alice", vec!["box".into()], false).unwrap();
    let bob = file.add("bob", vec!["box".into()], true).unwrap();
    let (a_tok, _) = token_of(&f, &alice.access_key, alice.secret_key()).await;
    let (b_tok, _) = token_of(&f, &bob.access_key, bob.secret_key()).await;
    let put = |tok: String| {
        let f = &f;
        let path = path.clone();
        async move { call(f, "PUT", &format!("{path}/box/o"), &[("X-Auth-Token", &tok)], b"x").await.0 }
    };
    let get = |tok: String| {
        let f = &f;
        let path = path.clone();
        async move { call(f, "GET", &format!("{path}/box/o"), &[("X-Auth-Token", &tok)], b"").await.0 }
    };
    assert_eq!(put(a_tok.clone()).await, 201);
    assert_eq!(get(b_tok.clone()).await, 200);
    assert_eq!(put(b_tok.clone()).await, 403, "bob reads only");

    // A rotation: the old token goes the moment the S3 side refuses the old secret.
    let rotated = file.rotate("alice").unwrap();
    until_s3_refuses(&access, &alice.access_key, alice.secret_key()).await;
    assert_eq!(get(a_tok.clone()).await, 401, "a token from before the rotation still reads");
    assert_eq!(put(a_tok.clone()).await, 401, "a token from before the rotation still writes");
    // The new secret signs in again.
    let (a_new, _) = token_of(&f, &rotated.access_key, rotated.secret_key()).await;
    assert_eq!(get(a_new.clone()).await, 200);

    // A removal likewise.
    file.remove("bob").unwrap();
    until_s3_refuses(&access, &bob.access_key, bob.secret_key()).await;
    assert_eq!(get(b_tok).await, 401, "a removed user's token still reads");
    // Nobody else was signed out.
    assert_eq!(get(a_new).await, 200);
    assert_eq!(get(tok).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_again_and_again_signs_out_nobody_else() {
    let (f, _access, file) = start_with(true).await;
    let file = file.unwrap();
    let (admin_tok, path) = token(&f).await;
    call(&f, "PUT", &format!("{path}/box"), &[("X-Auth-Token", &admin_tok)], b"").await;
    let mallory = file.add("mallory", vec!["box".into()], true).unwrap();
    let (first, _) = token_of(&f, &mallory.access_key, mallory.secret_key()).await;
    // Far more sign-ins than one user may hold tokens.
    for _ in 0..swift::MAX_TOKENS_PER_USER + 10 {
        token_of(&f, &mallory.access_key, mallory.secret_key()).await;
    }
    let head = |tok: String| {
        let f = &f;
        let path = path.clone();
        async move { call(f, "HEAD", &path, &[("X-Auth-Token", &tok)], b"").await.0 }
    };
    assert_eq!(head(admin_tok).await, 204, "another user's token was evicted");
    assert_eq!(head(first).await, 401, "a user's own oldest token goes first");
}

#[tokio::test]
async fn a_bucket_policy_deny_binds_swift_too() {
    use blindfold_gateway::sharing::{Policy, POLICY};
    let (f, _access, file) = start_with(true).await;
    let alice = file.unwrap().add("alice", vec!["docs".into()], false).unwrap();
    let (tok, path) = token_of(&f, &alice.access_key, alice.secret_key()).await;
    let call = |method: &'static str, obj: &'static str, headers: Vec<(&'static str, String)>| {
        let (f, path, tok) = (&f, path.clone(), tok.clone());
        async move {
            let mut h: Vec<(&str, &str)> = vec![("X-Auth-Token", tok.as_str())];
            h.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
            call(f, method, &format!("{path}/docs{obj}"), &h, b"data").await.0
        }
    };
    assert!(call("PUT", "", vec![]).await < 300);
    assert_eq!(call("PUT", "/keep/a", vec![]).await, 201);
    let doc = r#"{"Statement":{"Effect":"Deny","Principal":{"AWS":"alice"},
        "Action":["s3:DeleteObject","s3:GetObject"],"Resource":"arn:aws:s3:::docs/keep/*"}}"#;
    let stored = serde_json::to_string(&Policy::parse(doc, "docs").unwrap()).unwrap();
    f._opened
        .objects
        .directory()
        .transact_durable(&[], |tx| tx.set_bucket_setting("docs", POLICY, Some(&stored)))
        .await
        .unwrap();
    // What the policy denies on S3 is denied on Swift: delete, read, and a copy out.
    assert_eq!(call("DELETE", "/keep/a", vec![]).await, 403);
    assert_eq!(call("GET", "/keep/a", vec![]).await, 403);
    let from = vec![("X-Copy-From", "docs/keep/a".to_owned())];
    assert_eq!(call("PUT", "/copied", from).await, 403);
    // The rest works as before.
    assert_eq!(call("PUT", "/free", vec![]).await, 201);
    assert_eq!(call("GET", "/free", vec![]).await, 200);
    assert_eq!(call("DELETE", "/free", vec![]).await, 204);
}
