//! The admin listener: Prometheus metrics, health probes, the dashboard and the
//! access-pattern visualizer, on their own address (never on the S3 port or in its namespace).
//!
//! ```text
//! GET  /metrics          Prometheus text format                          credentials
//! GET  /healthz          200 "ok" while the process serves               open
//! GET  /readyz           200 "ready", or 503 once the engine stopped     open
//! GET  /                 the dashboard page (assets embedded)            credentials
//! GET  /visualizer       the access-pattern visualizer page              credentials
//! GET  /api/summary      engine, parameters, totals, a minute of history credentials
//! GET  /api/window       the live recording window (?source=demo: demo)  credentials
//! POST /api/window       record the live gateway for ?seconds=N          credentials + header
//! POST /api/demo         run the demo (?oram=on|off&seconds=N)           credentials + header
//! ```
//!
//! Credentials are HTTP Basic with the gateway's S3 access key and secret key (what a browser
//! asks for), or the admin token (`Authorization: Bearer TOKEN`, or Basic with any user name
//! and the token as password). Comparisons take constant time. A POST must also carry the
//! header `X-Blindfold-Admin: 1`, which a page on another origin cannot add without the
//! browser asking first, so a stored login cannot be replayed by another site. The probes are
//! open (they say only "up" and "ready", as load balancers and orchestrators expect).

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::Mutex;
use serde::Serialize;

use crate::datadir::GatewayParams;
use crate::engine::SharedEngine;
use crate::observe::{Observer, PhysicalView};
use crate::open::Opened;

const DASHBOARD_HTML: &str = include_str!("../assets/dashboard.html");
const VISUALIZER_HTML: &str = include_str!("../assets/visualizer.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");
const ICON_SVG: &str = include_str!("../assets/icon.svg");

/// Longest demo run.
pub const DEMO_MAX: Duration = Duration::from_secs(120);

/// Who may use the admin listener: the S3 keys (HTTP Basic) and, if configured, an admin
/// token (Bearer, or as the Basic password). Built by [`AdminAuth::new`], which refuses a token
/// that is no secret.
#[derive(Clone)]
pub struct AdminAuth {
    /// The S3 access key and secret key.
    credentials: (String, String),
    /// A separate admin token, if one is configured (never blank: see [`check_admin_token`]).
    token: Option<String>,
}

/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// Why `token` cannot be an admin token, if it cannot: a blank token would let anyone in (HTTP
/// Basic with any user name and an empty password), and a short one is guessed.
pub fn check_admin_token(token: &str) -> Result<(), String> {
    const UNSET: &str = "leave --admin-token, $BLINDFOLD_ADMIN_TOKEN and the config file's \
                         admin-token unset to log in with the S3 keys only";
    if token.trim().is_empty() {
        return Err(format!(
            "the admin token is blank, which would let anyone in: give a token of at least \
             {MIN_ADMIN_TOKEN_LEN} characters, or {UNSET}"
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "the admin token holds spaces or control characters (clients cannot send it in a \
             header as given): use visible characters only, or {UNSET}"
        ));
    }
    if token.chars().count() < MIN_ADMIN_TOKEN_LEN {
        return Err(format!(
            "the admin token is shorter than {MIN_ADMIN_TOKEN_LEN} characters, too easy to \
             guess: use a longer one (e.g. `openssl rand -hex 24`), or {UNSET}"
        ));
    }
    Ok(())
}

impl std::fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminAuth")
            .field("access_key", &self.credentials.0)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish()
    }
}

fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    // Length is not secret (the comparison of equal-length strings is constant time).
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl AdminAuth {
    /// Access with the S3 `credentials` and, if given, `token` (refused if it is no secret:
    /// see [`check_admin_token`]). Empty S3 keys are refused too.
    pub fn new(credentials: (String, String), token: Option<String>) -> Result<Self, String> {
        if credentials.0.is_empty() || credentials.1.is_empty() {
            return Err("the S3 access key and secret key must not be empty".into());
        }
        if let Some(t) = &token {
            check_admin_token(t)?;
        }
        Ok(Self { credentials, token })
    }

    /// Whether `authorization` (the header's value) grants access.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        let Some(value) = authorization else { return false };
        let value = value.trim();
        if let Some(token) = value.strip_prefix("Bearer ") {
            return self.token.as_deref().is_some_and(|t| same(t, token.trim()));
        }
        let Some(encoded) = value.strip_prefix("Basic ") else { return false };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return false;
        };
        let Ok(decoded) = String::from_utf8(decoded) else { return false };
        let Some((user, password)) = decoded.split_once(':') else { return false };
        // Whatever was configured, an empty password never opens anything.
        if password.is_empty() {
            return false;
        }
        let by_keys = same(user, &self.credentials.0) & same(password, &self.credentials.1);
        let by_token = self.token.as_deref().is_some_and(|t| same(password, t));
        by_keys | by_token
    }
}

/// What the admin listener serves from.
#[derive(Debug)]
pub struct AdminState {
    observer: Arc<Observer>,
    engine: Arc<dyn SharedEngine>,
    params: GatewayParams,
    /// The live capacity (it changes when the store grows).
    objects: Arc<crate::objects::ObjectLayer>,
    auth: AdminAuth,
    started: Instant,
    demo: Mutex<Option<Arc<Observer>>>,
    price_provider: Option<String>,
    /// The data directory (its disk's free space is shown).
    data_dir: std::path::PathBuf,
    /// The listeners' TLS, once [`serve`] starts (its certificate's expiry is shown).
    tls: Mutex<Option<crate::tls::Tls>>,
}

impl AdminState {
    /// The state for the gateway `opened`; `price_provider` names the price table entry the
    /// cost figures use (shown as their basis).
    pub fn new(opened: &Opened, auth: AdminAuth, price_provider: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            observer: Arc::clone(&opened.observer),
            engine: Arc::clone(opened.objects.engine()),
            params: opened.params.clone(),
            objects: Arc::clone(&opened.objects),
            auth,
            started: Instant::now(),
            demo: Mutex::new(None),
            price_provider,
            data_dir: opened.data_dir.clone(),
            tls: Mutex::new(None),
        })
    }

    /// How full the gateway is now; also sets the observer's gauges.
    fn usage(&self) -> crate::usage::Usage {
        let tls = self.tls.lock().clone();
        let usage = crate::usage::gather(&self.objects, &self.data_dir, tls.as_ref());
        self.observer.set_usage(&usage);
        usage
    }
}

type Body = Full<Bytes>;

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    h.insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-store"));
    h.insert("x-content-type-options", hyper::header::HeaderValue::from_static("nosniff"));
    h.insert("x-frame-options", hyper::header::HeaderValue::from_static("DENY"));
    h.insert(
        "content-security-policy",
        hyper::header::HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
             connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    r
}

fn json(value: &impl Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(v) => reply(StatusCode::OK, "application/json", v),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e.to_string()),
    }
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (k == name).then_some(v)
    })
}

fn seconds_param(query: &str, default: u64, max: Duration) -> Result<Duration, String> {
    let secs = match query_param(query, "seconds") {
        None => default,
        Some(v) => v.parse::<u64>().map_err(|_| format!("seconds={v:?} is not a whole number"))?,
    };
    if secs == 0 || secs > max.as_secs() {
        return Err(format!("seconds must be between 1 and {}", max.as_secs()));
    }
    Ok(Duration::from_secs(secs))
}

#[derive(Serialize)]
struct Summary<'a> {
    version: &'static str,
    engine: String,
    layout: String,
    store: &'a str,
    block_size: u32,
    blocks: u64,
    capacity_bytes: u64,
    z: u32,
    cache_levels: u32,
    /// Buckets kept in memory (the TaoStore engine may keep part of one more level).
    cache_cells: u64,
    pad_objects: bool,
    uptime_s: u64,
    poisoned: bool,
    /// The price table entry the cost figures are computed at (e.g. "AWS S3 Standard,
    /// us-east-1"), whatever the store really is.
    price_provider: Option<&'a str>,
    /// How full the store is (blocks, objects, bytes, the data directory's disk).
    usage: crate::usage::Usage,
    store_counts: blindfold_store::Counts,
    gauges: crate::observe::EngineGauges,
    history: Vec<crate::observe::HistoryPoint>,
}

/// Answers one admin request.
pub async fn route(state: Arc<AdminState>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => return reply(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/readyz") => {
            return if state.observer.is_poisoned() {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "engine stopped\n")
            } else {
                reply(StatusCode::OK, "text/plain", "ready\n")
            };
        }
        _ => {}
    }
    let authorization =
        req.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if !state.auth.allows(authorization) {
        // Debug, not info: anyone can send these, and the log must not grow with them.
        tracing::debug!(path = %path, "admin request refused: no valid credentials");
        let mut r = reply(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "credentials needed: the S3 access key and secret key (HTTP Basic), or the admin \
             token (Bearer)\n",
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Basic realm=\"blindfold admin\""),
        );
        return r;
    }
    if method == Method::POST
        && req.headers().get("x-blindfold-admin").is_none_or(|v| v.as_bytes() != b"1")
    {
        return reply(
            StatusCode::FORBIDDEN,
            "text/plain",
            "a POST to the admin listener must carry the header X-Blindfold-Admin: 1\n",
        );
    }
    match (&method, path.as_str()) {
        (&Method::GET, "/metrics") => {
            state.usage();
            state.observer.refresh(state.engine.gauges());
            reply(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                state.observer.encode(),
            )
        }
        (&Method::GET, "/") | (&Method::GET, "/dashboard") => {
            reply(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD_HTML)
        }
        (&Method::GET, "/visualizer") => {
            reply(StatusCode::OK, "text/html; charset=utf-8", VISUALIZER_HTML)
        }
        (&Method::GET, "/assets/app.js") => {
            reply(StatusCode::OK, "text/javascript; charset=utf-8", APP_JS)
        }
        (&Method::GET, "/assets/style.css") => {
            reply(StatusCode::OK, "text/css; charset=utf-8", STYLE_CSS)
        }
        (&Method::GET, "/assets/icon.svg") => reply(StatusCode::OK, "image/svg+xml", ICON_SVG),
        (&Method::GET, "/api/summary") => {
            let p = &state.params;
            let blocks = state.objects.directory().capacity();
            json(&Summary {
                version: env!("CARGO_PKG_VERSION"),
                engine: p.engine.to_string(),
                layout: p.layout(),
                store: &p.store,
                block_size: p.block_size,
                blocks,
                capacity_bytes: blocks * u64::from(p.block_size),
                z: p.z,
                cache_levels: p.cache_levels,
                cache_cells: p.cached_cells(),
                pad_objects: p.pad_objects,
                uptime_s: state.started.elapsed().as_secs(),
                poisoned: state.observer.is_poisoned(),
                price_provider: state.price_provider.as_deref(),
                usage: state.usage(),
                store_counts: state.observer.store_counts(),
                gauges: state.engine.gauges(),
                history: state.observer.history(),
            })
        }
        (&Method::GET, "/api/window") => {
            let observer = if query_param(&query, "source") == Some("demo") {
                state.demo.lock().clone()
            } else {
                Some(Arc::clone(&state.observer))
            };
            match observer {
                Some(o) => reply(StatusCode::OK, "application/json", o.window_json()),
                None => reply(StatusCode::OK, "application/json", "null"),
            }
        }
        (&Method::POST, "/api/window") => {
            let length = match seconds_param(&query, 10, crate::observe::WINDOW_MAX) {
                Ok(l) => l,
                Err(e) => return reply(StatusCode::BAD_REQUEST, "text/plain", e + "\n"),
            };
            match state.observer.start_window(length, "live gateway") {
                Ok(()) => {
                    tracing::info!(seconds = length.as_secs(), "recording window started");
                    json(&serde_json::json!({"recording": true, "seconds": length.as_secs()}))
                }
                Err(e) => reply(StatusCode::CONFLICT, "text/plain", e + "\n"),
            }
        }
        (&Method::POST, "/api/demo") => {
            let length = match seconds_param(&query, 10, DEMO_MAX) {
                Ok(l) => l,
                Err(e) => return reply(StatusCode::BAD_REQUEST, "text/plain", e + "\n"),
            };
            let oram = match query_param(&query, "oram").unwrap_or("on") {
                "on" | "true" | "1" => true,
                "off" | "false" | "0" => false,
                other => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        "text/plain",
                        format!("oram={other:?}: use on or off\n"),
                    )
                }
            };
            // One demo at a time: the check and the start under one lock.
            let mut demo = state.demo.lock();
            if demo.as_ref().is_some_and(|d| d.window_open()) {
                return reply(
                    StatusCode::CONFLICT,
                    "text/plain",
                    "a demo is running already: watch it, or start another when it ends\n",
                );
            }
            match start_demo(oram, length) {
                Ok(observer) => {
                    *demo = Some(observer);
                    json(
                        &serde_json::json!({"demo": true, "oram": oram, "seconds": length.as_secs()}),
                    )
                }
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e + "\n"),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// Blocks of the demo's data set.
pub const DEMO_BLOCKS: u64 = 1024;
const DEMO_BLOCK_SIZE: u32 = 256;

/// Runs the visualizer's demo in the background: a skewed (Zipf, s = 1.2) workload of reads
/// and writes over [`DEMO_BLOCKS`] blocks in a memory store, through Path ORAM (`oram`) or
/// through the same blocks sealed at fixed places, recorded for `length`. It never touches the
/// gateway's own data.
pub fn start_demo(oram: bool, length: Duration) -> Result<Arc<Observer>, String> {
    use blindfold_crypto::{CellSealer, MasterKey, StoreId};
    use blindfold_oram::{BlockId, Op, PathOramConfig};
    use blindfold_proxy::{SealedDirect, SealedPathOram};
    use blindfold_store::{MemoryStore, Store};
    use rand::{Rng, SeedableRng};

    let key = MasterKey::generate();
    let sealer = CellSealer::new(&key, StoreId::random(), 0);
    let observer = Arc::new(Observer::new());
    let config =
        PathOramConfig::builder(DEMO_BLOCKS, DEMO_BLOCK_SIZE).build().map_err(|e| e.to_string())?;
    let (geometry, view) = if oram {
        let g = SealedPathOram::geometry(&config).map_err(|e| e.to_string())?;
        let leaves = config.trees()[0].shape.leaves();
        (g, PhysicalView::Tree { copy_cells: config.total_cells(), leaves })
    } else {
        let g = SealedDirect::geometry(DEMO_BLOCKS, DEMO_BLOCK_SIZE).map_err(|e| e.to_string())?;
        (g, PhysicalView::Flat { cells: DEMO_BLOCKS })
    };
    let raw: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
    let store = observer.wrap_store(raw, view, geometry.total_bytes());
    let label = if oram { "demo: Path ORAM" } else { "demo: sealed blocks, no ORAM" };
    // Zipf weights, hottest block first; the ranks are scattered over the block ids so the
    // hot set is not simply the first cells.
    let weights: Vec<f64> = (1..=DEMO_BLOCKS).map(|r| 1.0 / (r as f64).powf(1.2)).collect();
    let total: f64 = weights.iter().sum();
    let cumulative: Vec<f64> = weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w / total;
            Some(*acc)
        })
        .collect();
    let spread = |rank: u64| (rank * 389 + 17) % DEMO_BLOCKS;
    let mut engine: Demo = if oram {
        Demo::Oram(Box::new(SealedPathOram::new(config, store, sealer).map_err(|e| e.to_string())?))
    } else {
        Demo::Direct(Box::new(
            SealedDirect::new(store, sealer, DEMO_BLOCK_SIZE).map_err(|e| e.to_string())?,
        ))
    };
    observer.start_window(length, label)?;
    let obs = Arc::clone(&observer);
    tokio::spawn(async move {
        let mut rng = rand_chacha::ChaCha12Rng::from_entropy();
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while started.elapsed() < length {
            tick.tick().await;
            // 400 accesses a second: enough for a clear picture, light on the machine.
            for _ in 0..4 {
                let u: f64 = rng.gen();
                let rank = cumulative.partition_point(|&c| c < u) as u64;
                let block = BlockId(spread(rank.min(DEMO_BLOCKS - 1)));
                let write = rng.gen_bool(0.3);
                obs.blocks(std::iter::once(block.0), write, DEMO_BLOCK_SIZE as usize);
                let op =
                    if write { Op::Write(vec![0x5a; DEMO_BLOCK_SIZE as usize]) } else { Op::Read };
                let r = match &mut engine {
                    Demo::Oram(e) => e.access(block, op).await.map(drop),
                    Demo::Direct(e) => match op {
                        Op::Read => e.read(block).await.map(drop),
                        Op::Write(d) => e.write(block, d).await,
                    },
                };
                if let Err(e) = r {
                    return tracing::warn!(error = %e, "demo stopped");
                }
            }
        }
    });
    Ok(observer)
}

enum Demo {
    Oram(Box<blindfold_proxy::SealedPathOram>),
    Direct(Box<blindfold_proxy::SealedDirect>),
}

/// Samples the dashboard history once a second until the process ends.
pub fn spawn_sampler(state: &Arc<AdminState>) {
    let state = Arc::clone(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            state.usage();
            state.observer.sample(state.engine.gauges());
        }
    });
}

/// Serves the admin listener on `listener` (over TLS if `tls` is given, within `limits`: give
/// it a pool of its own, [`crate::listen::Limits::separate`]) until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    tls: Option<crate::tls::Tls>,
    limits: crate::listen::Limits,
) {
    state.tls.lock().clone_from(&tls);
    spawn_sampler(&state);
    let make_svc = || {
        let state = Arc::clone(&state);
        hyper::service::service_fn(move |req| {
            let state = Arc::clone(&state);
            async move { Ok::<_, std::convert::Infallible>(route(state, req).await) }
        })
    };
    let forever = std::future::pending::<()>();
    crate::listen::accept_until(&listener, tls.as_ref(), &limits, "admin", make_svc, forever).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, password: &str) -> String {
        let raw = format!("{user}:{password}");
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(raw))
    }

    fn keys() -> (String, String) {
        ("AKADMIN".into(), "s3-secret-key-of-forty-characters-000000".into())
    }

    #[test]
    fn a_blank_or_short_token_is_refused_and_says_why() {
        for t in ["", " ", "\t \n", "short", "with a space in it!!"] {
            let e = AdminAuth::new(keys(), Some(t.into())).unwrap_err();
            assert!(e.contains("admin token"), "{t:?}: {e}");
        }
        assert!(AdminAuth::new(keys(), Some(" ".into())).unwrap_err().contains("anyone"));
        assert!(AdminAuth::new(("".into(), "x".into()), None).is_err());
        assert!(AdminAuth::new(("ak".into(), "".into()), None).is_err());
    }

    #[test]
    fn only_the_keys_or_the_token_open_it() {
        let token = "a-real-admin-token-0123";
        let with = AdminAuth::new(keys(), Some(token.into())).unwrap();
        let without = AdminAuth::new(keys(), None).unwrap();
        let (ak, sk) = keys();
        for auth in [&with, &without] {
            assert!(auth.allows(Some(&basic(&ak, &sk))));
            assert!(!auth.allows(Some(&basic("attacker", ""))), "empty password");
            assert!(!auth.allows(Some(&basic(&ak, ""))), "empty password");
            assert!(!auth.allows(Some(&basic("", ""))));
            assert!(!auth.allows(Some("Bearer ")));
            assert!(!auth.allows(Some("Bearer")));
            assert!(!auth.allows(Some(&basic(&ak, &sk[..sk.len() - 1]))));
            assert!(!auth.allows(None));
        }
        assert!(with.allows(Some(&format!("Bearer {token}"))));
        assert!(with.allows(Some(&basic("anyone", token))));
        assert!(!without.allows(Some(&format!("Bearer {token}"))));
        assert!(!with.allows(Some(&format!("Bearer {}", &token[1..]))));
        assert!(!format!("{with:?}").contains(token), "the token never prints");
    }
}
