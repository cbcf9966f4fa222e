//! Known-answer tests: the primitives we build on (through the same crates and calls we use),
//! and our own sealed-segment format decoded through the public API.

use argon2::{Algorithm, Argon2, AssociatedData, ParamsBuilder, Version};
use blindfold_crypto::{CellAd, CellSealer, CryptoError, MasterKey, StoreId};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf;

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

/// AES-256-GCM, Test Case 16 of McGrew & Viega, "The Galois/Counter Mode of Operation (GCM)",
/// 2005, Appendix B (256-bit key, 60-byte plaintext, 20-byte AAD, 96-bit IV).
#[test]
fn aes_256_gcm_mcgrew_viega_test_case_16() {
    let key = unhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
    let iv: [u8; 12] = unhex("cafebabefacedbaddecaf888").try_into().unwrap();
    let aad = unhex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
    let plaintext = unhex(
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
         1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
    );
    let ciphertext = "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                      8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662";
    let tag = "76fc6ece0f4e1768cddf8853bb2d551b";

    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).unwrap());
    let mut buf = plaintext.clone();
    let got_tag = key
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(iv), Aad::from(&aad[..]), &mut buf)
        .unwrap();
    assert_eq!(hex::encode(&buf), ciphertext);
    assert_eq!(hex::encode(got_tag.as_ref()), tag);

    buf.extend_from_slice(got_tag.as_ref());
    let opened =
        key.open_in_place(Nonce::assume_unique_for_key(iv), Aad::from(&aad[..]), &mut buf).unwrap();
    assert_eq!(opened, &plaintext[..]);
}

/// ring's HKDF needs a `KeyType` for the output length; this one allows any length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-SHA256, RFC 5869 Appendix A.1 (Test Case 1). ring does not expose the PRK, so only
/// the OKM is checked (the PRK is an input to it).
#[test]
fn hkdf_sha256_rfc5869_test_case_1() {
    let ikm = [0x0b; 22];
    let salt = unhex("000102030405060708090a0b0c");
    let info = unhex("f0f1f2f3f4f5f6f7f8f9");
    let okm_expected = "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf\
                        34007208d5b887185865";

    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(&ikm);
    let mut okm = [0u8; 42];
    prk.expand(&[&info[..]], Len(42)).unwrap().fill(&mut okm).unwrap();
    assert_eq!(hex::encode(okm), okm_expected);

    // `info` given in pieces (as our key schedule does) is concatenated.
    let mut okm2 = [0u8; 42];
    prk.expand(&[&info[..3], &info[3..]], Len(42)).unwrap().fill(&mut okm2).unwrap();
    assert_eq!(okm2, okm);
}

/// Argon2id, RFC 9106 §5.3 (version 0x13, m = 32 KiB, t = 3, p = 4, with secret and
/// associated data).
#[test]
fn argon2id_rfc9106_section_5_3() {
    let secret = [0x03; 8];
    let params = ParamsBuilder::new()
        .m_cost(32)
        .t_cost(3)
        .p_cost(4)
        .output_len(32)
        .data(AssociatedData::new(&[0x04; 12]).unwrap())
        .build()
        .unwrap();
    let argon2 =
        Argon2::new_with_secret(&secret, Algorithm::Argon2id, Version::V0x13, params).unwrap();
    let mut tag = [0u8; 32];
    argon2.hash_password_into(&[0x01; 32], &[0x02; 16], &mut tag).unwrap();
    assert_eq!(
        hex::encode(tag),
        "0d640df58d78766c08c037a34a8b53c9d01ef0452d75b65eb52520e96b01e659"
    );
}

/// A segment of our format produced by an independent implementation (Python's `hmac` for
/// HKDF-SHA256 and `cryptography` 48's AESGCM):
///
/// ```text
/// master = 00 01 .. 1f, store id = a0 a1 .. af, epoch = 7, nonce = 10 11 .. 1b,
/// cell = 0x0102030405060708, version = 42, segment = 3,
/// plaintext = "blindfold known-answer test"
/// key    = HKDF-SHA256(ikm = master, salt = store id, info = "blindfold/seal/v1" || 07000000)
/// ad     = "blindfold-cell-v1" || store id || cell LE || version LE || segment LE
/// sealed = 07000000 || nonce || AESGCM(key).encrypt(nonce, plaintext, ad)
/// ```
const FOREIGN_SEGMENT: &str = "07000000101112131415161718191a1b\
     1fc1a662f3c5e54f0b7bc70a85f39f4534424001fa6d2cd6e76c26\
     92140c6e4f2da0685bf48da51e3c50ec";

fn foreign_setup() -> (MasterKey, StoreId, CellAd) {
    let master = MasterKey::from_bytes(core::array::from_fn(|i| i as u8));
    let store = StoreId::from_hex("a0a1a2a3a4a5a6a7a8a9aaabacadaeaf").unwrap();
    let ad = CellAd { cell: 0x0102_0304_0506_0708, version: 42, segment: 3 };
    (master, store, ad)
}

#[test]
fn opens_segment_sealed_by_independent_implementation() {
    let (master, store, ad) = foreign_setup();
    let sealed = unhex(FOREIGN_SEGMENT);
    // Any sealer that has reached epoch 7 can read it: epoch 7 itself, and a later one.
    for epoch in [7, 9] {
        let sealer = CellSealer::new(&master, store, epoch);
        assert_eq!(sealer.open(&ad, &sealed).unwrap(), b"blindfold known-answer test");
        let mut buf = sealed.clone();
        assert_eq!(sealer.open_in_place(&ad, &mut buf).unwrap(), b"blindfold known-answer test");
    }
    // A sealer still at epoch 6 must refuse the epoch-7 segment.
    let early = CellSealer::new(&master, store, 6);
    assert!(matches!(early.open(&ad, &sealed), Err(CryptoError::Integrity { .. })));
}

#[test]
fn our_segments_have_the_documented_layout() {
    let (master, store, ad) = foreign_setup();
    let sealer = CellSealer::new(&master, store, 0x0a0b_0c0d);
    let plaintext = b"some cell bytes";
    let sealed = sealer.seal(&ad, plaintext).unwrap();
    assert_eq!(sealed.len(), plaintext.len() + CellSealer::OVERHEAD);
    assert_eq!(CellSealer::OVERHEAD, 4 + 12 + 16);
    assert_eq!(&sealed[..4], &[0x0d, 0x0c, 0x0b, 0x0a], "epoch u32 LE first");

    // Decrypt with ring directly, from the documented key schedule and AD alone.
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &store.0).extract(master.expose_bytes());
    let mut key = [0u8; 32];
    prk.expand(&[b"blindfold/seal/v1", &0x0a0b_0c0du32.to_le_bytes()], Len(32))
        .unwrap()
        .fill(&mut key)
        .unwrap();
    let mut aad = b"blindfold-cell-v1".to_vec();
    aad.extend_from_slice(&store.0);
    aad.extend_from_slice(&ad.cell.to_le_bytes());
    aad.extend_from_slice(&ad.version.to_le_bytes());
    aad.extend_from_slice(&ad.segment.to_le_bytes());
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).unwrap());
    let nonce = Nonce::try_assume_unique_for_key(&sealed[4..16]).unwrap();
    let mut body = sealed[16..].to_vec();
    let opened = key.open_in_place(nonce, Aad::from(&aad[..]), &mut body).unwrap();
    assert_eq!(opened, plaintext);
}
