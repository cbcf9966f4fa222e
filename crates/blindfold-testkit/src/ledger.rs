//! [`CrashLedger`]: what a crash test may expect of each block after the store died under an
//! engine at a random instant, and the write-and-commit loop such tests drive.

use std::collections::HashMap;
use std::future::Future;

use rand::Rng;

/// Per block: the last acknowledged value, and the values written since, any of which a crash
/// may or may not have kept. An acknowledged value must never be lost; a block never
/// acknowledged reads as zeros unless one of its later writes survived.
#[derive(Debug)]
pub struct CrashLedger {
    block_size: usize,
    acked: HashMap<u64, Vec<u8>>,
    unacked: HashMap<u64, Vec<Vec<u8>>>,
    /// Writes that returned since the last commit, not yet acknowledged.
    pending: HashMap<u64, Vec<u8>>,
}

impl CrashLedger {
    /// An empty ledger for blocks of `block_size` bytes.
    pub fn new(block_size: usize) -> Self {
        Self { block_size, acked: HashMap::new(), unacked: HashMap::new(), pending: HashMap::new() }
    }

    /// Every block ever written, in order.
    pub fn blocks(&self) -> Vec<u64> {
        let mut blocks: Vec<u64> = self.acked.keys().chain(self.unacked.keys()).copied().collect();
        blocks.sort_unstable();
        blocks.dedup();
        blocks
    }

    /// Blocks with an acknowledged value, in order.
    pub fn acked_blocks(&self) -> Vec<u64> {
        let mut blocks: Vec<u64> = self.acked.keys().copied().collect();
        blocks.sort_unstable();
        blocks
    }

    /// Panics unless `got` is a value `block` may hold (`when` says at what point).
    pub fn check(&self, block: u64, got: &[u8], when: &str) {
        let zeros = vec![0; self.block_size];
        let acked = self.acked.get(&block).unwrap_or(&zeros);
        let later = self.unacked.get(&block).map(Vec::as_slice).unwrap_or_default();
        assert!(
            got == acked.as_slice() || later.iter().any(|v| v == got),
            "block {block} {when}: {:?} is none of the values it may have",
            got.get(..8).map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")))
        );
    }

    /// [`CrashLedger::check`] for a read right after a recovery; what recovery kept is the
    /// block's durable value from now on.
    pub fn recovered(&mut self, block: u64, got: Vec<u8>, when: &str) {
        self.check(block, &got, when);
        self.acked.insert(block, got);
        self.unacked.remove(&block);
    }

    /// A commit (or a clean stop) returned: every write that returned before it is
    /// acknowledged.
    pub fn committed(&mut self) {
        for (b, d) in self.pending.drain() {
            self.acked.insert(b, d);
            self.unacked.remove(&b);
        }
    }

    /// The engine stopped without a clean stop: the writes since the last commit stay possible
    /// values, none acknowledged.
    pub fn crashed(&mut self) {
        self.pending.clear();
    }

    /// Writes `ops` times a block drawn from `0..blocks` with the contents `data(i)`,
    /// committing after a tenth of them (drawn from `rng`), until `write` or `commit` reports
    /// a failure (`false`). Returns whether one did (the store died).
    pub async fn write_and_commit<W, WF, C, CF>(
        &mut self,
        ops: u64,
        blocks: u64,
        rng: &mut impl Rng,
        mut data: impl FnMut(u64) -> Vec<u8>,
        mut write: W,
        mut commit: C,
    ) -> bool
    where
        W: FnMut(u64, Vec<u8>) -> WF,
        WF: Future<Output = bool>,
        C: FnMut() -> CF,
        CF: Future<Output = bool>,
    {
        for i in 0..ops {
            let b = rng.gen_range(0..blocks);
            let d = data(i);
            self.unacked.entry(b).or_default().push(d.clone());
            if !write(b, d.clone()).await {
                return true;
            }
            self.pending.insert(b, d);
            if rng.gen_bool(0.1) {
                if !commit().await {
                    return true;
                }
                self.committed();
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(v: u8) -> Vec<u8> {
        vec![v; 16]
    }

    #[tokio::test]
    async fn a_lost_acknowledged_write_fails_and_a_lost_unacknowledged_one_does_not() {
        let mut rng = rand::thread_rng();
        let mut ledger = CrashLedger::new(16);
        // Every write returns and the first commit acknowledges them.
        let died = ledger
            .write_and_commit(
                50,
                1,
                &mut rng,
                |i| block(i as u8 + 1),
                |_, _| async { true },
                || async { true },
            )
            .await;
        assert!(!died);
        ledger.committed();
        let acked = ledger.acked[&0].clone();
        // A later write that never returned may or may not survive.
        assert!(
            ledger
                .write_and_commit(
                    1,
                    1,
                    &mut rng,
                    |_| block(200),
                    |_, _| async { false },
                    || async { true }
                )
                .await
        );
        ledger.crashed();
        ledger.check(0, &block(200), "after a crash");
        ledger.check(0, &acked, "after a crash");
        // Zeros or an older value would mean the acknowledged write was lost.
        let lost = std::panic::catch_unwind(|| ledger.check(0, &block(0), "after a crash"));
        assert!(lost.is_err());
        ledger.recovered(0, block(200), "after a crash");
        let old = std::panic::catch_unwind(|| ledger.check(0, &acked, "later"));
        assert!(old.is_err(), "a value recovery replaced came back");
    }
}
