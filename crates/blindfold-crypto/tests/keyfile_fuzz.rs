//! Hostile key files: random bytes, random JSON documents with every field right, wrong, missing
//! or of another type, and near misses of the two fixtures. Loading never panics, never
//! allocates beyond the file's size limit and the KDF's cost ceiling, and its errors never quote
//! key material.
//!
//! Cases: `BLINDFOLD_FUZZ_CASES` (see `blindfold_testkit::fuzz`).
#![cfg(unix)]

use std::path::Path;

use blindfold_crypto::{load_key_file, CryptoError, Passphrase};
use blindfold_testkit::fuzz;
use proptest::prelude::*;
use serde_json::{json, Value};

const RAW: &str = include_str!("data/key-raw-v1.json");
const WRAPPED: &str = include_str!("data/key-argon2id-v1.json");
const MASTER_HEX: &str = "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f";

fn pass() -> Passphrase {
    Passphrase::new("correct horse battery staple".to_owned())
}

/// Loads `contents` as a key file, with and without a passphrase. The passphrase is offered
/// only when `cheap` (the document's KDF costs, if any, are small), so a test case never asks
/// Argon2 for gigabytes; the bounds on those costs have their own tests.
fn load(dir: &Path, contents: &[u8], cheap: bool) -> Vec<Result<[u8; 32], CryptoError>> {
    let path = dir.join("key.json");
    std::fs::write(&path, contents).unwrap();
    let mut out = vec![load_key_file(&path, None).map(|k| *k.expose_bytes())];
    if cheap {
        out.push(load_key_file(&path, Some(&pass())).map(|k| *k.expose_bytes()));
    }
    out
}

fn check_errors(results: &[Result<[u8; 32], CryptoError>]) {
    for r in results {
        if let Err(e) = r {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            assert!(!msg.contains(&MASTER_HEX[..16]), "an error quotes key material: {msg}");
        }
    }
}

/// A JSON value of any type, for a field that should be something else.
fn any_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        "[0-9a-f]{0,130}".prop_map(Value::from),
        prop::collection::vec(any::<u8>(), 0..4).prop_map(|v| json!(v)),
        Just(json!({"nested": {"key": MASTER_HEX}})),
    ]
}

/// A field value: usually the fixture's, sometimes a neighbour, sometimes anything.
fn field(
    good: Value,
    near: impl Strategy<Value = Value> + 'static,
) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => Just(Some(good)),
        2 => near.prop_map(Some),
        1 => any_json().prop_map(Some),
        1 => Just(None),
    ]
}

fn small_cost() -> impl Strategy<Value = Value> {
    prop_oneof![(0u32..128).prop_map(Value::from), any::<u32>().prop_map(Value::from)]
}

fn any_doc() -> impl Strategy<Value = Value> {
    let fixture: Value = serde_json::from_str(WRAPPED).unwrap();
    let get = move |k: &str| fixture[k].clone();
    (
        field(get("format"), Just(json!("blindfold-kez"))),
        field(get("version"), any::<u32>().prop_map(Value::from)),
        field(get("kind"), prop_oneof![Just(json!("raw")), Just(json!("argon2i"))]),
        field(json!(MASTER_HEX), "[0-9a-fA-F]{0,70}".prop_map(Value::from)),
        field(get("m_cost_kib"), small_cost()),
        field(get("t_cost"), small_cost()),
        field(get("p_cost"), small_cost()),
        field(get("salt"), "[0-9a-f]{0,40}".prop_map(Value::from)),
        field(get("wrapped"), "[0-9a-f]{0,140}".prop_map(Value::from)),
        prop::option::of((".{1,8}", any_json())),
    )
        .prop_map(|(format, version, kind, key, m, t, p, salt, wrapped, extra)| {
            let mut doc = serde_json::Map::new();
            for (name, v) in [
                ("format", format),
                ("version", version),
                ("kind", kind),
                ("key", key),
                ("m_cost_kib", m),
                ("t_cost", t),
                ("p_cost", p),
                ("salt", salt),
                ("wrapped", wrapped),
            ] {
                if let Some(v) = v {
                    doc.insert(name.to_owned(), v);
                }
            }
            if let Some((k, v)) = extra {
                doc.insert(k, v);
            }
            Value::Object(doc)
        })
}

/// Whether a document's KDF costs are small enough to run in a test.
fn cheap(doc: &Value) -> bool {
    let small = |k: &str, max: u64| doc.get(k).and_then(Value::as_u64).is_none_or(|v| v <= max);
    small("m_cost_kib", 4096) && small("t_cost", 4) && small("p_cost", 4)
}

proptest! {
    #![proptest_config(fuzz::config())]

    #[test]
    fn random_bytes_are_refused_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let dir = tempfile::tempdir().unwrap();
        let results = load(dir.path(), &bytes, true);
        check_errors(&results);
        prop_assert!(results.iter().all(Result::is_err));
    }

    #[test]
    fn random_documents_load_or_fail_cleanly(doc in any_doc()) {
        let dir = tempfile::tempdir().unwrap();
        let text = serde_json::to_vec(&doc).unwrap();
        let results = load(dir.path(), &text, cheap(&doc));
        check_errors(&results);
        for r in results.iter().flatten() {
            // Whatever loads is a key the document really holds: the raw key, or the fixture's
            // wrapped master key (the only wrapped key that authenticates).
            prop_assert!(doc["kind"] == json!("raw") || *r == <[u8; 32]>::try_from(hex::decode(MASTER_HEX).unwrap()).unwrap());
        }
    }

    #[test]
    fn near_misses_of_the_fixtures_fail_cleanly(
        raw in any::<bool>(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in 0usize..4,
    ) {
        let mut bytes = if raw { RAW } else { WRAPPED }.as_bytes().to_vec();
        for (at, v) in edits {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        bytes.truncate(bytes.len() - cut);
        let dir = tempfile::tempdir().unwrap();
        // Edits can raise a cost: offer the passphrase only if the costs stayed small.
        let doc: Option<Value> = serde_json::from_slice(&bytes).ok();
        let results = load(dir.path(), &bytes, doc.as_ref().is_none_or(cheap));
        check_errors(&results);
    }
}

#[test]
fn an_oversized_file_is_refused_before_it_is_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let mut big = RAW.trim_end().trim_end_matches('}').to_owned();
    big.push_str(&format!(", \"pad\": \"{}\"}}", "x".repeat(100_000)));
    let err = load(dir.path(), big.as_bytes(), false).remove(0).unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
}
