//! Times one homomorphic select per Damgård–Jurik layer: `bases` selector elements of layer
//! `s` over as many slots of `columns` full-size chunks (plaintexts of layer `s`, i.e. layer
//! `s - 1` ciphertexts), on all cores, with a 1024-bit key. What Onion ORAM's choice of first
//! layer rests on (`docs/design.md`, "Onion ORAM", "The first layer").
//!
//! `cargo run --release -p blindfold-dj --example select_layers -- [FROM TO BASES COLUMNS]`
//! (default `2 22 16 4`); prints milliseconds per column.

use std::time::Instant;

use blindfold_dj::{Integer, SecretKey};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rug::integer::Order;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u32> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let [from, to, bases, columns] = match args.as_slice() {
        [] => [2, 22, 16, 4],
        &[a, b, c, d] if (2..=b).contains(&a) && c >= 1 && d >= 1 => [a, b, c, d],
        _ => return Err("usage: select_layers [FROM TO BASES COLUMNS], 2 <= FROM <= TO".into()),
    };
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let sk = SecretKey::generate(1024, &mut rng)?;
    let pk = sk.public().clone();
    println!("layer,bases,columns,ms_per_column");
    for layer in from..=to {
        let bits: Vec<Integer> =
            (0..bases).map(|i| Integer::from(u32::from(i == bases / 2))).collect();
        let selector = sk.encrypt_many(&bits, layer, &mut rng)?;
        let len = pk.ciphertext_len(layer - 1)?;
        let bound = pk.plaintext_bound(layer)?;
        let slots: Vec<Vec<Integer>> = (0..bases)
            .map(|_| {
                (0..columns)
                    .map(|_| {
                        let mut buf = vec![0u8; len];
                        rng.fill_bytes(&mut buf);
                        Integer::from_digits(&buf, Order::Msf) % bound
                    })
                    .collect()
            })
            .collect();
        let t = Instant::now();
        let answer = pk.select_blocks(&selector, &slots)?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(answer.len(), columns as usize);
        println!("{layer},{bases},{columns},{:.1}", ms / f64::from(columns));
    }
    Ok(())
}
