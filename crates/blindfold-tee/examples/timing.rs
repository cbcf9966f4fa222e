//! One-off timing of the trusted component's two entry points at the engine's sizes:
//! `evict` of 5600 blocks of 1 KiB (a layer of q + Z blocks) and `query` over 5 candidates.
//!
//! ```text
//! cargo run --release -p blindfold-tee --example timing [BLOCKS] [BLOCK_SIZE]
//! ```

use std::time::Instant;

use blindfold_tee::{Enclave, EvictTicket, QueryTicket, TeeCipher, TeeKey};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let s: usize = args.next().map_or(Ok(5600), |a| a.parse())?;
    let bs: usize = args.next().map_or(Ok(1024), |a| a.parse())?;
    let key = TeeKey::generate()?;
    let cipher = TeeCipher::new(&key, bs);
    let enclave = Enclave::new(&key, bs);
    let stream = [1u8; 16];

    let t = Instant::now();
    let mut blocks: Vec<Vec<u8>> = (0..s)
        .map(|i| cipher.seal(&[i as u8; 32], &vec![i as u8; bs]))
        .collect::<Result<_, _>>()?;
    let seal = t.elapsed();
    println!(
        "seal: {s} blocks of {bs} B in {:.2} ms ({:.2} us per block)",
        seal.as_secs_f64() * 1e3,
        seal.as_secs_f64() * 1e6 / s as f64
    );

    let mut x = 0x1234_5678_9abc_def0u64;
    let mut times = Vec::new();
    for round in 0..5u64 {
        let mut perm: Vec<u32> = (0..s as u32).collect();
        for i in (1..s).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            perm.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let ticket = cipher.seal_evict(&EvictTicket { stream, round, layer: 0, perm })?;
        let t = Instant::now();
        enclave.evict(&mut blocks, &ticket)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "evict: {s} blocks of {bs} B: best {:.2} ms, median {:.2} ms ({} runs; {:.1} MB/s of cells)",
        times[0],
        times[times.len() / 2],
        times.len(),
        (s * cipher.cell_len()) as f64 / times[0] / 1e3
    );

    let candidates: Vec<Vec<u8>> =
        (0..5u8).map(|i| cipher.seal(&[i; 32], &vec![i; bs])).collect::<Result<_, _>>()?;
    let mut times = Vec::new();
    for q in 0..2000u64 {
        let target = (q % 5) as u32;
        let ticket = cipher.seal_query(&QueryTicket {
            stream,
            query_id: q,
            candidates: 5,
            target,
            ads: (0..5u8).map(|i| [i; 32]).collect(),
        })?;
        let t = Instant::now();
        let answer = enclave.query(&candidates, &ticket)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(cipher.open_answer(&stream, q, &answer)?, vec![target as u8; bs]);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "query: 5 candidates: best {:.1} us, median {:.1} us",
        times[0],
        times[times.len() / 2]
    );
    Ok(())
}
