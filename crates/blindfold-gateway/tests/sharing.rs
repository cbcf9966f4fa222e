//! Sharing through a running gateway, over HTTP: canned ACLs let unsigned requests (or any
//! signed one) read what was made public and nothing else; bucket policies allow and deny by
//! user, action and resource, a Deny wins over every other permission, and what a policy
//! cannot enforce is refused rather than saved.

use crate::common::{self, request, status};
use blindfold_gateway::users::UserFile;

const ADMIN: (&str, &str) = ("AKIDSHARING", "sharing-test-secret");

async fn start() -> common::Running {
    common::Running::start(ADMIN, None).await
}

async fn admin(g: &common::Running, method: &str, path: &str, headers: &str, body: &[u8]) -> u16 {
    let r = request(g, Some(ADMIN), method, path, headers, body).await;
    assert!(status(&r) < 300, "admin {method} {path}: {r:?}");
    status(&r)
}

async fn anon(g: &common::Running, method: &str, path: &str) -> (String, String) {
    request(g, None, method, path, "", b"").await
}

/// The Content-MD5 header of `body` (DeleteObjects and PutBucketCors need one).
fn content_md5(body: &[u8]) -> String {
    use base64::Engine as _;
    use md5::Digest as _;
    let md5 = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body));
    format!("Content-MD5: {md5}\r\n")
}

fn delete_objects_body(keys: &[&str]) -> (String, Vec<u8>) {
    let objects: String = keys.iter().map(|k| format!("<Object><Key>{k}</Key></Object>")).collect();
    let body = format!("<Delete>{objects}</Delete>").into_bytes();
    (content_md5(&body), body)
}

#[tokio::test]
async fn canned_acls_open_reads_and_nothing_else() {
    let g = start().await;
    let file = UserFile::new(&g.data_dir, &g.key);
    let outsider = file.add("outsider", vec!["elsewhere".into()], false).unwrap();
    let out = (outsider.access_key.as_str(), outsider.secret_key());
    admin(&g, "PUT", "/pubs", "", b"").await;
    admin(&g, "PUT", "/pubs/k", "", b"shared bytes").await;
    admin(&g, "PUT", "/pubs/auth", "x-amz-acl: authenticated-read\r\n", b"for signed readers")
        .await;

    // Private by default: unsigned requests and strangers see nothing.
    for (method, path) in [("GET", "/pubs/k"), ("HEAD", "/pubs/k"), ("GET", "/pubs?list-type=2")] {
        assert_eq!(status(&anon(&g, method, path).await), 403, "{method} {path}");
    }
    assert_eq!(status(&request(&g, Some(out), "GET", "/pubs/k", "", b"").await), 403);

    // public-read on the object: anyone reads it, nobody unsigned writes or deletes.
    admin(&g, "PUT", "/pubs/k?acl", "x-amz-acl: public-read\r\n", b"").await;
    let r = anon(&g, "GET", "/pubs/k").await;
    assert_eq!((status(&r), r.1.as_str()), (200, "shared bytes"), "{r:?}");
    assert_eq!(status(&anon(&g, "HEAD", "/pubs/k").await), 200);
    assert_eq!(status(&request(&g, None, "PUT", "/pubs/k", "", b"defaced").await), 403);
    assert_eq!(status(&anon(&g, "DELETE", "/pubs/k").await), 403);
    let (md5, body) = delete_objects_body(&["k"]);
    assert_eq!(status(&request(&g, None, "POST", "/pubs?delete", &md5, &body).await), 403);
    assert_eq!(status(&request(&g, Some(out), "DELETE", "/pubs/k", "", b"").await), 403);
    assert_eq!(status(&anon(&g, "GET", "/pubs?list-type=2").await), 403, "an object ACL lists");
    let acl = request(&g, Some(ADMIN), "GET", "/pubs/k?acl", "", b"").await;
    assert!(acl.1.contains("groups/global/AllUsers") && acl.1.contains("READ"), "{acl:?}");

    // authenticated-read: any signed user of this gateway, never an unsigned request.
    assert_eq!(status(&anon(&g, "GET", "/pubs/auth").await), 403);
    let r = request(&g, Some(out), "GET", "/pubs/auth", "", b"").await;
    assert_eq!((status(&r), r.1.as_str()), (200, "for signed readers"), "{r:?}");
    assert_eq!(status(&request(&g, Some(out), "PUT", "/pubs/auth", "", b"x").await), 403);

    // A copy needs to read its source: a public object can be copied out, a private one not.
    admin(&g, "PUT", "/elsewhere", "", b"").await;
    let copy = |src: &str| format!("x-amz-copy-source: {src}\r\n");
    let r = request(&g, Some(out), "PUT", "/elsewhere/c", &copy("/pubs/k"), b"").await;
    assert_eq!(status(&r), 200, "{r:?}");
    admin(&g, "PUT", "/pubs/private", "", b"not yours").await;
    let r = request(&g, Some(out), "PUT", "/elsewhere/p", &copy("/pubs/private"), b"").await;
    assert_eq!(status(&r), 403, "{r:?}");

    // An overwrite is private again unless it says otherwise (as in S3).
    admin(&g, "PUT", "/pubs/k", "", b"new private bytes").await;
    assert_eq!(status(&anon(&g, "GET", "/pubs/k").await), 403);

    // public-read on the bucket lists it, and reads no object.
    admin(&g, "PUT", "/pubs?acl", "x-amz-acl: public-read\r\n", b"").await;
    let r = anon(&g, "GET", "/pubs?list-type=2").await;
    assert_eq!(status(&r), 200, "{r:?}");
    assert!(r.1.contains("<Key>k</Key>"), "{r:?}");
    assert_eq!(status(&anon(&g, "GET", "/pubs/private").await), 403);
    let r = request(&g, Some(ADMIN), "GET", "/pubs?policyStatus", "", b"").await;
    assert!(r.1.contains("<IsPublic>true</IsPublic>"), "a public-read bucket: {r:?}");
    // Back to private.
    admin(&g, "PUT", "/pubs?acl", "x-amz-acl: private\r\n", b"").await;
    let r = request(&g, Some(ADMIN), "GET", "/pubs?policyStatus", "", b"").await;
    assert!(r.1.contains("<IsPublic>false</IsPublic>"), "a private bucket: {r:?}");
    assert_eq!(status(&anon(&g, "GET", "/pubs?list-type=2").await), 403);

    // What cannot be honoured is refused, and nothing changes.
    for h in ["x-amz-acl: public-read-write\r\n", "x-amz-grant-read: id=\"someone\"\r\n"] {
        let r = request(&g, Some(ADMIN), "PUT", "/pubs?acl", h, b"").await;
        assert_eq!(status(&r), 400, "{h}: {r:?}");
        assert!(r.1.contains("AccessControlListNotSupported"), "{r:?}");
    }
    assert_eq!(status(&anon(&g, "GET", "/pubs?list-type=2").await), 403);
    // Nothing at the root for an unsigned request.
    assert_eq!(status(&anon(&g, "GET", "/").await), 403);
    g.stop().await;
}

#[tokio::test]
async fn policies_allow_and_deny_and_deny_wins() {
    let g = start().await;
    let file = UserFile::new(&g.data_dir, &g.key);
    let alice = file.add("alice", vec!["pubs".into()], false).unwrap();
    let bob = file.add("bob", vec!["other".into()], false).unwrap();
    let a = (alice.access_key.as_str(), alice.secret_key());
    let b = (bob.access_key.as_str(), bob.secret_key());
    let carol = file.add("carol", vec!["pubs".into()], true).unwrap();
    let c = (carol.access_key.as_str(), carol.secret_key());
    admin(&g, "PUT", "/pubs", "", b"").await;
    for k in ["pub/x", "priv/y", "keep/z"] {
        admin(&g, "PUT", &format!("/pubs/{k}"), "", k.as_bytes()).await;
    }
    assert_eq!(status(&request(&g, Some(ADMIN), "GET", "/pubs?policy", "", b"").await), 404);

    let policy = format!(
        r#"{{"Version":"2012-10-17","Statement":[
        {{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::pubs/pub/*"}},
        {{"Effect":"Allow","Principal":{{"AWS":"arn:aws:iam::000:user/bob"}},"Action":["s3:ListBucket","s3:PutObject"],
          "Resource":["arn:aws:s3:::pubs","arn:aws:s3:::pubs/drop/*"]}},
        {{"Effect":"Allow","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::pubs/inbox/*"}},
        {{"Effect":"Deny","Principal":{{"AWS":["{}"]}},"Action":"s3:DeleteObject","Resource":"arn:aws:s3:::pubs/keep/*"}}]}}"#,
        alice.access_key
    );
    admin(&g, "PUT", "/pubs?policy", "", policy.as_bytes()).await;
    let r = request(&g, Some(ADMIN), "GET", "/pubs?policy", "", b"").await;
    assert_eq!(r.1, policy, "GetBucketPolicy answers the document as given");

    // Allow: unsigned reads under pub/, nothing else.
    assert_eq!(status(&anon(&g, "GET", "/pubs/pub/x").await), 200);
    assert_eq!(status(&anon(&g, "GET", "/pubs/priv/y").await), 403);
    assert_eq!(status(&request(&g, None, "PUT", "/pubs/pub/new", "", b"x").await), 403);
    // Allow to a named user beyond its buckets: bob lists and drops, and reads nothing else.
    let r = request(&g, Some(b), "GET", "/pubs?list-type=2", "", b"").await;
    assert!(status(&r) == 200 && r.1.contains("priv/y"), "{r:?}");
    assert_eq!(status(&request(&g, Some(b), "PUT", "/pubs/drop/f", "", b"from bob").await), 200);
    assert_eq!(status(&request(&g, Some(b), "PUT", "/pubs/elsewhere", "", b"x").await), 403);
    assert_eq!(status(&request(&g, Some(b), "GET", "/pubs/priv/y", "", b"").await), 403);
    assert_eq!(
        status(&request(&g, Some(b), "PUT", "/pubs?policy", "", policy.as_bytes()).await),
        403
    );

    // A policy never makes an unsigned request or a read-only user write.
    assert_eq!(status(&request(&g, Some(b), "PUT", "/pubs/inbox/x", "", b"x").await), 200);
    assert_eq!(status(&request(&g, None, "PUT", "/pubs/inbox/y", "", b"x").await), 403);
    assert_eq!(status(&request(&g, Some(c), "PUT", "/pubs/inbox/z", "", b"x").await), 403);
    assert_eq!(status(&request(&g, Some(c), "GET", "/pubs/priv/y", "", b"").await), 200);

    // Deny wins over alice's own access to the bucket, on every delete path.
    assert_eq!(status(&request(&g, Some(a), "DELETE", "/pubs/keep/z", "", b"").await), 403);
    let (md5, body) = delete_objects_body(&["priv/y", "keep/z"]);
    let r = request(&g, Some(a), "POST", "/pubs?delete", &md5, &body).await;
    assert_eq!(status(&r), 403, "{r:?}");
    assert_eq!(status(&request(&g, Some(a), "GET", "/pubs/keep/z", "", b"").await), 200);
    assert_eq!(status(&request(&g, Some(a), "GET", "/pubs/priv/y", "", b"").await), 200);
    assert_eq!(status(&request(&g, Some(a), "DELETE", "/pubs/pub/x", "", b"").await), 204);

    // A Deny to everyone stops the administrator too, except from mending the policy.
    let lockout = r#"{"Statement":{"Effect":"Deny","Principal":"*","Action":"s3:*",
        "Resource":["arn:aws:s3:::pubs","arn:aws:s3:::pubs/*"]}}"#;
    admin(&g, "PUT", "/pubs?policy", "", lockout.as_bytes()).await;
    assert_eq!(status(&request(&g, Some(ADMIN), "GET", "/pubs/keep/z", "", b"").await), 403);
    assert_eq!(status(&request(&g, Some(a), "GET", "/pubs/keep/z", "", b"").await), 403);
    let r = request(&g, Some(ADMIN), "GET", "/pubs?policyStatus", "", b"").await;
    assert!(r.1.contains("<IsPublic>false</IsPublic>"), "{r:?}");
    admin(&g, "GET", "/pubs?policy", "", b"").await;
    admin(&g, "DELETE", "/pubs?policy", "", b"").await;
    assert_eq!(status(&request(&g, Some(ADMIN), "GET", "/pubs/keep/z", "", b"").await), 200);
    assert_eq!(status(&anon(&g, "GET", "/pubs/pub/x").await), 403, "the policy is gone");

    // What a policy cannot enforce is refused, and the old policy (none) stays.
    for bad in [
        r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::pubs/*","Condition":{"IpAddress":{"aws:SourceIp":"10.0.0.0/8"}}}}"#,
        r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}}"#,
        "not json",
    ] {
        let r = request(&g, Some(ADMIN), "PUT", "/pubs?policy", "", bad.as_bytes()).await;
        assert_eq!(status(&r), 400, "{bad}: {r:?}");
        assert!(r.1.contains("MalformedPolicy"), "{r:?}");
    }
    assert_eq!(status(&request(&g, Some(ADMIN), "GET", "/pubs?policy", "", b"").await), 404);
    g.stop().await;
}

#[tokio::test]
async fn cors_rules_answer_preflights_and_add_headers_without_granting_access() {
    let g = start().await;
    admin(&g, "PUT", "/pubs", "", b"").await;
    admin(&g, "PUT", "/pubs/k", "x-amz-acl: public-read\r\n", b"page data").await;
    admin(&g, "PUT", "/pubs/private", "", b"secret").await;
    let preflight = |origin: &str, method: &str, headers: &str| {
        format!(
            "Origin: {origin}\r\nAccess-Control-Request-Method: {method}\r\n{}",
            if headers.is_empty() {
                String::new()
            } else {
                format!("Access-Control-Request-Headers: {headers}\r\n")
            }
        )
    };
    let allow_origin = |r: &(String, String)| {
        r.0.lines().find_map(|l| l.strip_prefix("access-control-allow-origin: ")).map(str::to_owned)
    };
    // No rules yet: preflights are refused, answers carry no CORS headers.
    let r =
        request(&g, None, "OPTIONS", "/pubs/k", &preflight("https://app.example", "GET", ""), b"")
            .await;
    assert_eq!(status(&r), 403, "{r:?}");
    assert_eq!(status(&request(&g, Some(ADMIN), "GET", "/pubs?cors", "", b"").await), 404);
    let r = request(&g, None, "GET", "/pubs/k", "Origin: https://app.example\r\n", b"").await;
    assert_eq!((status(&r), allow_origin(&r)), (200, None));

    let rules = b"<CORSConfiguration><CORSRule><AllowedOrigin>https://*.example</AllowedOrigin>\
        <AllowedMethod>GET</AllowedMethod><AllowedMethod>PUT</AllowedMethod>\
        <AllowedHeader>x-amz-*</AllowedHeader><ExposeHeader>ETag</ExposeHeader>\
        <MaxAgeSeconds>600</MaxAgeSeconds></CORSRule></CORSConfiguration>";
    admin(&g, "PUT", "/pubs?cors", &content_md5(rules), rules).await;
    let r = request(&g, Some(ADMIN), "GET", "/pubs?cors", "", b"").await;
    assert!(r.1.contains("<AllowedOrigin>https://*.example</AllowedOrigin>"), "{r:?}");

    // A preflight the rules allow: the origin, methods, asked headers and max age.
    let r = request(
        &g,
        None,
        "OPTIONS",
        "/pubs/k",
        &preflight("https://app.example", "PUT", "X-Amz-Date"),
        b"",
    )
    .await;
    assert_eq!(status(&r), 200, "{r:?}");
    assert_eq!(allow_origin(&r).as_deref(), Some("https://app.example"));
    for h in [
        "access-control-allow-methods: get, put",
        "access-control-allow-headers: x-amz-date",
        "access-control-max-age: 600",
    ] {
        assert!(r.0.contains(h), "{h} in {}", r.0);
    }
    // Another origin, method or header: refused. No Origin at all: a bad request.
    for (o, m, h) in [
        ("https://evil.test", "GET", ""),
        ("https://app.example", "DELETE", ""),
        ("https://app.example", "GET", "authorization"),
    ] {
        let r = request(&g, None, "OPTIONS", "/pubs/k", &preflight(o, m, h), b"").await;
        assert_eq!(status(&r), 403, "{o} {m} {h}: {r:?}");
        assert_eq!(allow_origin(&r), None);
    }
    assert_eq!(status(&request(&g, None, "OPTIONS", "/pubs/k", "", b"").await), 400);
    // A preflight with a body (never read) ends its connection.
    let pre = preflight("https://app.example", "GET", "");
    let r =
        request(&g, None, "OPTIONS", "/pubs/k", &format!("{pre}Content-Length: 2\r\n"), b"").await;
    assert!(r.0.contains("connection: close"), "{}", r.0);
    let r = request(&g, None, "OPTIONS", "/pubs/k", &pre, b"").await;
    assert!(status(&r) == 200 && !r.0.contains("connection: close"), "{}", r.0);

    // Ordinary answers carry the headers for an allowed origin, even errors.
    let r = request(&g, None, "GET", "/pubs/k", "Origin: https://app.example\r\n", b"").await;
    assert_eq!((status(&r), allow_origin(&r).as_deref()), (200, Some("https://app.example")));
    assert!(r.0.contains("access-control-expose-headers: etag"), "{}", r.0);
    // CORS grants nothing: the private object stays refused to an unsigned request.
    let r = request(&g, None, "GET", "/pubs/private", "Origin: https://app.example\r\n", b"").await;
    assert_eq!((status(&r), allow_origin(&r).as_deref()), (403, Some("https://app.example")));
    let r = request(&g, None, "GET", "/pubs/k", "Origin: https://evil.test\r\n", b"").await;
    assert_eq!((status(&r), allow_origin(&r)), (200, None));

    // Bad rules are refused; deleting the rules turns CORS off.
    let bad = b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin>\
        <AllowedMethod>PATCH</AllowedMethod></CORSRule></CORSConfiguration>";
    let r = request(&g, Some(ADMIN), "PUT", "/pubs?cors", &content_md5(bad), bad).await;
    assert_eq!(status(&r), 400, "{r:?}");
    admin(&g, "DELETE", "/pubs?cors", "", b"").await;
    let r =
        request(&g, None, "OPTIONS", "/pubs/k", &preflight("https://app.example", "GET", ""), b"")
            .await;
    assert_eq!(status(&r), 403, "{r:?}");
    g.stop().await;
}

/// Every store request the gateway has made so far, from its metrics.
async fn store_requests(g: &common::Running) -> f64 {
    use base64::Engine as _;
    use tokio::io::AsyncWriteExt as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", ADMIN.0, ADMIN.1));
    let mut sock = tokio::net::TcpStream::connect(g.admin).await.unwrap();
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: admin\r\nAuthorization: Basic {auth}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let (_, body) = common::read_response(&mut sock, false).await;
    String::from_utf8(body)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("blindfold_store_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test]
async fn refusals_and_preflights_make_no_store_request() {
    let g = start().await;
    admin(&g, "PUT", "/pubs", "", b"").await;
    admin(&g, "PUT", "/pubs/private", "", b"secret").await;
    admin(&g, "PUT", "/pubs/open", "x-amz-acl: public-read\r\n", b"open").await;
    let deny = br#"{"Statement":{"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::pubs/*"}}"#;
    admin(&g, "PUT", "/pubs?policy", "", deny).await;
    let cors = b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin>\
        <AllowedMethod>GET</AllowedMethod></CORSRule></CORSConfiguration>";
    admin(&g, "PUT", "/pubs?cors", &content_md5(cors), cors).await;
    let before = store_requests(&g).await;
    assert!(before > 0.0, "the setup wrote to the store");
    for _ in 0..10 {
        assert_eq!(status(&anon(&g, "GET", "/pubs/private").await), 403);
        assert_eq!(status(&anon(&g, "GET", "/pubs?list-type=2").await), 403);
        let r = request(&g, Some(ADMIN), "PUT", "/pubs/denied", "", b"x").await;
        assert_eq!(status(&r), 403);
        let pre = "Origin: https://a.example\r\nAccess-Control-Request-Method: GET\r\n";
        assert_eq!(status(&request(&g, None, "OPTIONS", "/pubs/open", pre, b"").await), 200);
    }
    assert_eq!(store_requests(&g).await, before, "a refusal or preflight reached the store");
    // The allowed read does reach it (the count can move at all).
    assert_eq!(status(&anon(&g, "GET", "/pubs/open").await), 200);
    assert!(store_requests(&g).await > before);
    g.stop().await;
}
