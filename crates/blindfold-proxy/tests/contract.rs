//! The engine conformance suite ([`blindfold_testkit::engines`]) over every engine of the
//! catalogue: one test per engine and check, so that a failure names both.

use blindfold_proxy::catalogue::OramEngine;
use blindfold_testkit::engines::{self, CatalogueEngine};

macro_rules! checks {
    ($variant:ident: $($check:ident)*) => {
        fn subject() -> CatalogueEngine {
            CatalogueEngine::small(OramEngine::$variant)
        }

        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                engines::$check(&subject()).await;
            }
        )*
    };
}

macro_rules! contract {
    ($($engine:ident => $variant:ident),* $(,)?) => {
        $(
            mod $engine {
                use super::*;
                checks!($variant: model crash fresh_after_crash tamper swap rollback abandoned
                    trace rotate);
            }
        )*
    };
}

contract! {
    tao => Tao,
    path_oram => PathOram,
    oblivistore => ObliviStore,
    curious => Curious,
    curious_path => CuriousPath,
}

mod tee {
    use super::*;
    checks!(Tee: model crash fresh_after_crash tamper swap rollback abandoned rotate);

    /// Fails: how far the eviction rounds lag behind the queries depends on the workload, and
    /// the store sees it. With 128 blocks of 64 bytes (`catalogue::tee_config`: k = 8 queries
    /// per round) and 300 sequential accesses (writes and reads alternating, a commit every
    /// 20), the store saw 21-25 write requests (3 per round) under a hammered block, 26-29
    /// under uniform blocks and 37-40 under a scan, where SECURITY.md promises a round every
    /// `k` queries (public). Every query is there (one per access) and every round comes in
    /// the end (a probe on `DurableTee` directly: 300 queries, 13 rounds during the run and 24
    /// more at `settle` for the hammer; 17 and 20 for a scan; 37 in all each time), so what
    /// differs is the lag. The likely cause: queries wait for a round only when the ring is
    /// full (`lagging` in `DurableTee::access_inner` counts `oram.waiting()`, the blocks
    /// written and not yet evicted: one under a hammer, many under a scan), so the ring's
    /// occupancy — secret — sets how far queries run ahead of the rounds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "the TEE engine's eviction rounds depend on the workload (see the doc comment)"]
    async fn trace() {
        engines::trace(&subject()).await;
    }
}
