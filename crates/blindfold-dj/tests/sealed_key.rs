//! The Damgård–Jurik secret key sealed like the rest of the gateway's local state.

use blindfold_crypto::{MasterKey, StateSealer};
use blindfold_dj::{Integer, SecretKey};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

#[test]
fn secret_key_survives_sealing_and_refuses_other_keys_or_labels() {
    let mut rng = ChaCha20Rng::seed_from_u64(77);
    let sk = SecretKey::generate(256, &mut rng).unwrap();
    let c = sk.public().encrypt(&Integer::from(31337), 2, &mut rng).unwrap();

    let sealer = StateSealer::new(&MasterKey::from_bytes([7; 32]));
    let sealed = sealer.seal(SecretKey::SEAL_AAD, &sk.to_bytes()).unwrap();
    let opened = sealer.open(SecretKey::SEAL_AAD, &sealed).unwrap();
    let back = SecretKey::from_bytes(&opened).unwrap();
    assert_eq!(back.public(), sk.public());
    assert_eq!(back.decrypt(&c), 31337);

    // Another master key, another label, or a flipped bit: nothing opens.
    let other = StateSealer::new(&MasterKey::from_bytes([8; 32]));
    assert!(other.open(SecretKey::SEAL_AAD, &sealed).is_err());
    assert!(sealer.open(b"blindfold/checkpoint/v1", &sealed).is_err());
    let mut flipped = sealed.clone();
    flipped[20] ^= 1;
    assert!(sealer.open(SecretKey::SEAL_AAD, &flipped).is_err());
}
