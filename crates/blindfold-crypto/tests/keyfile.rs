//! Key files: creation, loading, permissions, passphrases, compatibility fixtures.
//!
//! Unix only: the files' permission bits are part of what is tested.
#![cfg(unix)]

use std::fs;
use std::path::{Path, PathBuf};

use blindfold_crypto::{
    create_key_file, create_key_file_with, key_file_permissions_ok, load_key_file, CryptoError,
    KdfParams, Passphrase,
};

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.to_owned())
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

const FIXTURE_MASTER: &str = "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f";

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn raw_key_file_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let created = create_key_file(&path, None).unwrap();
    let loaded = load_key_file(&path, None).unwrap();
    assert_eq!(created, loaded);
    // A passphrase handed to a raw file is ignored.
    assert_eq!(load_key_file(&path, Some(&pass("unused"))).unwrap(), created);

    let json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(json["format"], "blindfold-key");
    assert_eq!(json["version"], 1);
    assert_eq!(json["kind"], "raw");
    assert_eq!(json["key"], hex::encode(created.expose_bytes()));
}

#[test]
fn two_key_files_hold_different_keys() {
    let dir = tempfile::tempdir().unwrap();
    let a = create_key_file(&dir.path().join("a.key"), None).unwrap();
    let b = create_key_file(&dir.path().join("b.key"), None).unwrap();
    assert_ne!(a, b);
}

#[test]
fn key_file_is_created_private_and_temp_files_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    create_key_file(&path, None).unwrap();
    assert_eq!(mode(&path), 0o600);
    assert!(key_file_permissions_ok(&path).unwrap());
    let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["master.key"], "leftover files: {names:?}");
}

#[test]
fn permissions_check_flags_group_or_world_access() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let key = create_key_file(&path, None).unwrap();
    for (bits, ok) in [(0o600, true), (0o400, true), (0o640, false), (0o604, false)] {
        fs::set_permissions(&path, fs::Permissions::from_mode(bits)).unwrap();
        assert_eq!(key_file_permissions_ok(&path).unwrap(), ok, "{bits:o}");
        // Loading still works; warning about it is the binary's job.
        assert_eq!(load_key_file(&path, None).unwrap(), key);
    }
    assert!(matches!(
        key_file_permissions_ok(&dir.path().join("missing")),
        Err(CryptoError::Io { .. })
    ));
}

#[test]
fn refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let first = create_key_file(&path, None).unwrap();
    let before = fs::read(&path).unwrap();
    let err = create_key_file(&path, None).unwrap_err();
    match &err {
        CryptoError::KeyFile { path: p, reason } => {
            assert_eq!(p, &path);
            assert!(reason.contains("already exists"), "{reason}");
        }
        other => panic!("expected KeyFile, got {other:?}"),
    }
    assert_eq!(fs::read(&path).unwrap(), before, "existing file was changed");
    assert_eq!(load_key_file(&path, None).unwrap(), first);

    // Not even an unrelated file (or a dangling symlink) is replaced.
    let other = dir.path().join("notes.txt");
    fs::write(&other, b"keep me").unwrap();
    assert!(matches!(create_key_file(&other, None), Err(CryptoError::KeyFile { .. })));
    assert_eq!(fs::read(&other).unwrap(), b"keep me");
    let link = dir.path().join("dangling.key");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
    assert!(matches!(create_key_file(&link, None), Err(CryptoError::KeyFile { .. })));
    assert!(!dir.path().join("nowhere").exists());
}

#[test]
fn missing_directory_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/master.key");
    assert!(matches!(create_key_file(&path, None), Err(CryptoError::Io { .. })));
    assert!(matches!(load_key_file(&path, None), Err(CryptoError::Io { .. })));
}

#[test]
fn passphrase_key_file_right_wrong_missing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let kdf = KdfParams::insecure_for_tests();
    let created = create_key_file_with(&path, Some(&pass("open sesame")), kdf).unwrap();
    assert_eq!(mode(&path), 0o600);

    let text = fs::read_to_string(&path).unwrap();
    assert!(!text.contains(&hex::encode(created.expose_bytes())), "master key stored in the clear");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["kind"], "argon2id");
    assert_eq!(json["m_cost_kib"], kdf.m_cost_kib);
    assert_eq!(json["t_cost"], kdf.t_cost);
    assert_eq!(json["p_cost"], kdf.p_cost);
    assert_eq!(json["salt"].as_str().unwrap().len(), 32);
    assert_eq!(json["wrapped"].as_str().unwrap().len(), 2 * (12 + 32 + 16));
    assert!(json.get("key").is_none());

    assert_eq!(load_key_file(&path, Some(&pass("open sesame"))).unwrap(), created);
    assert!(matches!(
        load_key_file(&path, Some(&pass("open sesame!"))),
        Err(CryptoError::WrongPassphrase { path: p }) if p == path
    ));
    assert!(matches!(
        load_key_file(&path, None),
        Err(CryptoError::PassphraseRequired { path: p }) if p == path
    ));
}

#[test]
fn tampered_wrapped_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    create_key_file_with(&path, Some(&pass("pw")), KdfParams::insecure_for_tests()).unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let wrapped = json["wrapped"].as_str().unwrap().to_owned();
    let mut bytes = hex::decode(&wrapped).unwrap();
    bytes[20] ^= 1;
    json["wrapped"] = hex::encode(bytes).into();
    let tampered = dir.path().join("tampered.key");
    fs::write(&tampered, serde_json::to_vec(&json).unwrap()).unwrap();
    assert!(matches!(
        load_key_file(&tampered, Some(&pass("pw"))),
        Err(CryptoError::WrongPassphrase { .. })
    ));
}

#[test]
fn empty_passphrase_and_bad_kdf_params_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    assert!(matches!(create_key_file(&path, Some(&pass(""))), Err(CryptoError::KeyFile { .. })));
    let bad = [
        KdfParams { m_cost_kib: 4, ..KdfParams::insecure_for_tests() },
        KdfParams { t_cost: 0, ..KdfParams::insecure_for_tests() },
        KdfParams { p_cost: 0, ..KdfParams::insecure_for_tests() },
        KdfParams { m_cost_kib: KdfParams::MAX_M_COST_KIB + 1, ..KdfParams::default() },
    ];
    for kdf in bad {
        assert!(kdf.validate().is_err(), "{kdf:?}");
        assert!(
            matches!(
                create_key_file_with(&path, Some(&pass("pw")), kdf),
                Err(CryptoError::KeyFile { .. })
            ),
            "{kdf:?}"
        );
    }
    assert!(!path.exists(), "a key file was written despite the errors");
    KdfParams::default().validate().unwrap();
    KdfParams::insecure_for_tests().validate().unwrap();
}

#[test]
fn default_kdf_params_are_strong() {
    let kdf = KdfParams::default();
    assert!(kdf.m_cost_kib >= 64 * 1024, "{kdf:?}");
    assert!(kdf.t_cost >= 3, "{kdf:?}");
    assert!(kdf.p_cost >= 1, "{kdf:?}");
}

/// Files written by an independent Python implementation (see tests/data/README.md).
#[test]
fn loads_fixture_files_from_independent_implementation() {
    let raw = load_key_file(&fixture("key-raw-v1.json"), None).unwrap();
    assert_eq!(hex::encode(raw.expose_bytes()), FIXTURE_MASTER);

    let argon = fixture("key-argon2id-v1.json");
    let key = load_key_file(&argon, Some(&pass("correct horse battery staple"))).unwrap();
    assert_eq!(hex::encode(key.expose_bytes()), FIXTURE_MASTER);
    assert!(matches!(
        load_key_file(&argon, Some(&pass("correct horse battery stapler"))),
        Err(CryptoError::WrongPassphrase { .. })
    ));
    assert!(matches!(load_key_file(&argon, None), Err(CryptoError::PassphraseRequired { .. })));
}

#[test]
fn malformed_key_files_are_refused_without_echoing_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "deadbeef".repeat(8);
    let cases = [
        ("not json".to_owned(), "not a blindfold key file"),
        (
            format!(r#"{{"format":"other","version":1,"kind":"raw","key":"{secret}"}}"#),
            "format",
        ),
        (
            format!(r#"{{"format":"blindfold-key","version":2,"kind":"raw","key":"{secret}"}}"#),
            "version 2",
        ),
        (
            format!(r#"{{"format":"blindfold-key","version":1,"kind":"rot13","key":"{secret}"}}"#),
            "unknown key kind",
        ),
        (
            r#"{"format":"blindfold-key","version":1,"kind":"raw"}"#.to_owned(),
            "missing field \"key\"",
        ),
        (
            format!(
                r#"{{"format":"blindfold-key","version":1,"kind":"raw","key":"{}"}}"#,
                &secret[..62]
            ),
            "64 hex digits",
        ),
        (
            format!(r#"{{"format":"blindfold-key","version":"1","kind":"raw","key":"{secret}"}}"#),
            "line 1",
        ),
        (
            format!(r#"{{"format":"blindfold-key","version":1,"kind":"raw","key":["{secret}"]}}"#),
            "not a blindfold key file",
        ),
        (
            r#"{"format":"blindfold-key","version":1,"kind":"argon2id","m_cost_kib":64,"t_cost":1,"p_cost":1,"salt":"00","wrapped":"00"}"#.to_owned(),
            "salt",
        ),
        (
            r#"{"format":"blindfold-key","version":1,"kind":"argon2id","m_cost_kib":4294967295,"t_cost":1,"p_cost":1,"salt":"000102030405060708090a0b0c0d0e0f","wrapped":"00"}"#.to_owned(),
            "KDF parameters",
        ),
        (" ".repeat(100_000), "larger than"),
    ];
    for (i, (contents, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.key"));
        fs::write(&path, contents).unwrap();
        let err = load_key_file(&path, Some(&pass("pw"))).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, CryptoError::KeyFile { .. }), "case {i}: {err:?}");
        assert!(msg.contains(expected), "case {i}: {msg}");
        assert!(!msg.contains("deadbeef"), "case {i} echoes the key: {msg}");
    }
}

#[test]
fn secrets_never_show_in_debug() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let key = create_key_file(&path, None).unwrap();
    let key_hex = hex::encode(key.expose_bytes());
    let shown = format!("{key:?}");
    assert!(!shown.contains(&key_hex[..16]), "{shown}");
    assert_eq!(shown, "MasterKey(<redacted>)");
    let p = pass("my secret words");
    assert!(!format!("{p:?}").contains("secret words"));
    let sealer = blindfold_crypto::CellSealer::new(&key, blindfold_crypto::StoreId([0; 16]), 0);
    assert!(!format!("{sealer:?}").contains(&key_hex[..16]));
}
