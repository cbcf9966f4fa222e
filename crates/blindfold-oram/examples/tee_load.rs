//! Runs the TEE engine's planner alone (no cryptography, no store) for many rounds of uniformly
//! random queries, each round landing after a set number of further queries as it would while
//! the trusted component works, and reports whether any node overflowed.
//!
//! ```text
//! cargo run --release -p blindfold-oram --example tee_load [BLOCKS] [ROUND_QUERIES] [ROUNDS] [IN_FLIGHT]
//! ```
//!
//! Defaults: 2^20 blocks, rounds of 450 queries, 1,000 rounds, rounds landing 170 queries
//! after they start (about what a 1 GiB store of 1 KiB blocks sees on a 2-core machine).

use std::time::Instant;

use blindfold_oram::tee::{QueryStep, TeeOram, TeeOramConfig};
use blindfold_oram::BlockId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut next = |default: u64| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(args.next().map_or(Ok(default), |a| a.parse())?)
    };
    let blocks = next(1 << 20)?;
    let k = next(450)? as u32;
    let rounds = next(1000)?;
    let in_flight = next(170)?;
    let config = TeeOramConfig::builder(blocks, 16).round_queries(k).build()?;
    println!(
        "{blocks} blocks, k = {k}: {} layers, Z1 = {}, Z0 = {}, D = {}, c = {}",
        config.layers(),
        config.node_slots(),
        config.leaf_slots(),
        config.dummy_reads(),
        config.round_blocks()
    );
    let mut oram = TeeOram::with_seed(config, 7);
    oram.bulk_place(blocks)?;
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let started = Instant::now();
    let mut pending: Option<u64> = None;
    let mut queries = 0u64;
    while oram.stats().rounds < rounds {
        let block = BlockId(rng.gen_range(0..blocks));
        let plan = loop {
            match oram.plan_query(block)? {
                QueryStep::Query(p) => break p,
                QueryStep::Wait => {
                    oram.finish_round()?;
                    pending = None;
                }
                QueryStep::Reshuffle(_) => oram.finish_round()?,
            }
        };
        let data = if plan.real { Some(vec![0u8; 16]) } else { plan.data.clone() };
        oram.finish_query(block, data, None)?;
        queries += 1;
        if let Some(left) = pending.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                oram.finish_round()?;
                pending = None;
            }
        }
        if oram.round_due() {
            oram.plan_round()?;
            pending = Some(in_flight.max(1));
        }
    }
    let stats = oram.stats();
    let config = oram.config();
    let d = config.dummy_reads();
    println!(
        "{} rounds, {} reshuffles, {queries} queries, no overflow ({:.1} s); most live blocks \
         kept: {} of {} in a node, {} of {} in a leaf; most waiting in the ring: {}",
        stats.rounds,
        stats.reshuffles,
        started.elapsed().as_secs_f64(),
        stats.max_node_live,
        config.node_slots() - d,
        stats.max_leaf_live,
        config.leaf_slots() - d,
        stats.max_waiting
    );
    Ok(())
}
