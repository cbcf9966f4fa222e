//! `--durability store`: every acknowledged write survives the loss of the gateway's data
//! directory, recovered from the store and the key alone, for every engine of the catalogue.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use blindfold_gateway::server::{self, Durability, OramEngine, ServeConfig};
use blindfold_store::StoreUrl;
use bytes::Bytes;

use crate::common;

fn cfg_on(data: &Path, store: StoreUrl, key: &Path, engine: OramEngine) -> ServeConfig {
    ServeConfig {
        data_dir: data.to_path_buf(),
        store: Some(store),
        key_file: Some(key.to_path_buf()),
        durability: Durability::Store,
        lease_ttl: Some(TTL),
        anchor: None,
        ..common::file_cfg(data, engine)
    }
}

/// Short, so that a successor of a gateway that died waits little.
const TTL: Duration = Duration::from_millis(400);

/// What a successor does after the gateway died: waits for its lease to lapse.
async fn lapse() {
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
}

async fn put(opened: &server::Opened, key: &str, data: &[u8]) {
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.to_vec()))]);
    opened.objects.put_object("b", key, body, None, BTreeMap::new(), false).await.unwrap();
}

fn data(i: usize) -> Vec<u8> {
    (0..300 + i * 517).map(|j| (i * 31 + j) as u8).collect()
}

/// The operator's scenario of the issue: objects, a clean stop, a restart, more objects and a
/// delete, then the machine is lost without a clean stop. Everything acknowledged comes back.
async fn nothing_acknowledged_is_lost(engine: OramEngine) {
    lose_the_data_directory(engine, None).await;
}

/// [`nothing_acknowledged_is_lost`] on `store` (default: files in a temporary directory).
async fn lose_the_data_directory(engine: OramEngine, store: Option<StoreUrl>) {
    lose_the_data_directory_with(engine, store, false).await;
}

/// [`lose_the_data_directory`], the gateways letting reads go ahead of the log if `ahead`:
/// each recovery of an engine whose reads can go ahead then rebuilds the tree (the first one
/// is cut short once, half-way through writing the new tree, and run again); the others'
/// reads wait for the log whatever the flag says, and their recovery continues the tree.
async fn lose_the_data_directory_with(engine: OramEngine, store: Option<StoreUrl>, ahead: bool) {
    let rebuilds = ahead && matches!(engine, OramEngine::Tao | OramEngine::PathOram);
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let store = store
        .unwrap_or(StoreUrl::File { dir: cells.clone(), sync: blindfold_store::SyncMode::OnFlush });
    let cfg = |data: &Path, _: &Path, key: &Path, engine| ServeConfig {
        reads_ahead_of_log: ahead,
        log_feed: None,
        cache_mib: if ahead { 1 } else { 0 },
        ..cfg_on(data, store.clone(), key, engine)
    };
    let first = root.path().join("data1");
    let mut expect = BTreeMap::new();
    {
        let opened = server::open(&cfg(&first, &cells, &key, engine)).await.unwrap();
        assert!(opened.journal.is_some(), "{engine}: --durability store did not start the log");
        let told = opened.notes.iter().any(|n| n.contains("--reads-ahead-of-log changes nothing"));
        assert_eq!(told, ahead && !rebuilds, "{engine}: {:?}", opened.notes);
        opened.objects.directory().create_bucket("b").unwrap();
        opened.objects.directory().settle().await.unwrap();
        for i in 0..5 {
            put(&opened, &format!("k{i}"), &data(i)).await;
            expect.insert(format!("k{i}"), data(i));
        }
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    {
        let opened = server::open(&cfg(&first, &cells, &key, engine)).await.unwrap();
        for i in 5..10 {
            put(&opened, &format!("k{i}"), &data(i)).await;
            expect.insert(format!("k{i}"), data(i));
        }
        // Overwritten and deleted after the last clean stop, too.
        put(&opened, "k1", b"newer").await;
        expect.insert("k1".into(), b"newer".to_vec());
        assert!(opened.objects.delete_object("b", "k2").await.unwrap());
        expect.remove("k2");
        // The machine is lost: no clean stop, no snapshot, the data directory gone.
        drop(opened);
    }
    std::fs::remove_dir_all(&first).unwrap();
    lapse().await;
    let second = root.path().join("data2");
    if rebuilds {
        let cut = server::recover_until(
            &cfg(&second, &cells, &key, engine),
            Some(server::RecoverCrash::HalfWritten),
        )
        .await;
        assert!(cut.is_err(), "{engine}: a recovery cut short half-way succeeded");
    }
    let (opened, about) =
        server::recover(&cfg(&second, &cells, &key, engine)).await.unwrap_or_else(|e| {
            panic!("{engine}: recover: {e}");
        });
    assert!(about.contains("every acknowledged write is back"), "{engine}: {about}");
    assert_eq!(about.contains("rebuilt with fresh leaves"), rebuilds, "{engine}: {about}");
    let names: Vec<String> = opened
        .objects
        .directory()
        .list("b", "", "", 100)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(names, expect.keys().cloned().collect::<Vec<_>>(), "{engine}: {about}");
    for (k, v) in &expect {
        assert_eq!(&common::read_object(&opened, k).await.unwrap(), v, "{engine}: {k}");
    }
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{engine}: {report:?}");
    if rebuilds && cells.exists() {
        // The rebuild's old array leaves the store with the recovered gateway's first store
        // checkpoint, written as it starts (else every loss would leave a whole tree behind).
        let mut arrays: Vec<String> = std::fs::read_dir(&cells)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("oram"))
            .collect();
        arrays.sort();
        assert_eq!(arrays, ["oram.g1.cells"], "{engine}: {about}");
    }
    // The recovered gateway logs to the store in its turn: lose it again, recover again.
    put(&opened, "after", b"after the first recovery").await;
    drop(opened);
    std::fs::remove_dir_all(&second).unwrap();
    lapse().await;
    let third = root.path().join("data3");
    let (opened, _) = server::recover(&cfg(&third, &cells, &key, engine)).await.unwrap();
    assert_eq!(common::read_object(&opened, "after").await.unwrap(), b"after the first recovery");
    assert_eq!(common::read_object(&opened, "k1").await.unwrap(), b"newer");
}

/// A PUT under `--durability store` writes three groups to the store-side log and waits for
/// two of them in turn: its batch's reveal records (before its paths go out), its commit record
/// (beside its cells, in the same round trip), then the frame saying the cells landed with its
/// directory entry (the entry follows the record in the one log, so its being durable makes the
/// record durable). A fourth group would cost every PUT a round trip to the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_writes_three_groups_to_the_store_side_log() {
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let store = StoreUrl::File { dir: cells.clone(), sync: blindfold_store::SyncMode::OnFlush };
    let opened = server::open(&cfg_on(&root.path().join("data"), store, &key, OramEngine::Tao))
        .await
        .unwrap();
    let log = &opened.journal.as_ref().expect("--durability store starts the log").log;
    opened.objects.directory().create_bucket("b").unwrap();
    opened.objects.directory().settle().await.unwrap();
    put(&opened, "warm", b"warm").await;
    for i in 0..4 {
        let before = log.counts().0;
        put(&opened, &format!("k{i}"), &data(i)).await;
        let groups = log.counts().0 - before;
        assert_eq!(groups, 3, "PUT {i}: {groups} group commits of the store-side log");
    }
    for i in 0..4 {
        assert_eq!(common::read_object(&opened, &format!("k{i}")).await.unwrap(), data(i));
    }
}

/// A growth while serving under `--durability store`: the grown engine's log goes to the
/// store, and the machine lost after it comes back at the grown size with every write before
/// and after the growth.
async fn grow_then_lose_the_data_directory(engine: OramEngine) {
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let store = StoreUrl::File { dir: cells.clone(), sync: blindfold_store::SyncMode::OnFlush };
    let first = root.path().join("data1");
    let opened = server::open(&cfg_on(&first, store.clone(), &key, engine)).await.unwrap();
    opened.objects.directory().create_bucket("b").unwrap();
    opened.objects.directory().settle().await.unwrap();
    for i in 0..4 {
        put(&opened, &format!("k{i}"), &data(i)).await;
    }
    let blocks = opened.objects.directory().capacity();
    let grower = opened.grower.clone().unwrap();
    let grown = grower.grow(blocks * 2).await.unwrap_or_else(|e| panic!("{engine}: grow: {e}"));
    assert_eq!(grown.to_blocks, blocks * 2);
    drop(grower);
    for i in 4..8 {
        put(&opened, &format!("k{i}"), &data(i)).await;
    }
    put(&opened, "k0", b"newer").await;
    let (opened, about, _) =
        lose_and_recover(opened, &first, cfg_on(&root.path().join("data2"), store, &key, engine))
            .await;
    assert_eq!(opened.objects.directory().capacity(), blocks * 2, "{engine}: {about}");
    for i in 1..8 {
        let got = common::read_object(&opened, &format!("k{i}")).await;
        assert_eq!(got.unwrap(), data(i), "{engine}: k{i}: {about}");
    }
    assert_eq!(common::read_object(&opened, "k0").await.unwrap(), b"newer", "{engine}");
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{engine}: {report:?}");
}

/// The machine is lost: `opened` goes without a clean stop and its data directory `data` with
/// it; once its lease has lapsed, `recover` rebuilds the gateway of `next` (a new data
/// directory) from the store alone. Returns it, what recover said, and its data directory.
async fn lose_and_recover(
    opened: server::Opened,
    data: &Path,
    next: ServeConfig,
) -> (server::Opened, String, std::path::PathBuf) {
    drop(opened);
    std::fs::remove_dir_all(data).unwrap();
    lapse().await;
    let (opened, about) = server::recover(&next).await.unwrap_or_else(|e| {
        panic!("{}: recover into {}: {e}", next.engine, next.data_dir.display())
    });
    (opened, about, next.data_dir)
}

/// A tao gateway under `--durability store` in `root` with four objects and a clean stop, then
/// `rotate-key`: its key file, store, data directory and the key before the rotation.
async fn rotation_prepared(
    root: &Path,
) -> (std::path::PathBuf, StoreUrl, std::path::PathBuf, blindfold_crypto::MasterKey) {
    let key = root.join("key.json");
    let store =
        StoreUrl::File { dir: root.join("cells"), sync: blindfold_store::SyncMode::OnFlush };
    let first = root.join("data1");
    let cfg = cfg_on(&first, store.clone(), &key, OramEngine::Tao);
    {
        let opened = server::open(&cfg).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        opened.objects.directory().settle().await.unwrap();
        for i in 0..4 {
            put(&opened, &format!("k{i}"), &data(i)).await;
        }
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    let old = blindfold_crypto::load_key_file(&key, None).unwrap();
    blindfold_gateway::rotation::prepare(&first, &key, &old, None).unwrap();
    (key, store, first, old)
}

/// Waits for a rotation's sweep to end (at most two minutes).
async fn sweep_to_the_end(sweeper: &blindfold_gateway::rotation::Sweeper) {
    let t0 = std::time::Instant::now();
    while !sweeper.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the rotation did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A key rotation under `--durability store` ends by replacing what the old key sealed in the
/// store's snapshot area; the machine lost right after it (no clean stop, no checkpoint since)
/// still recovers from the store with the new key, every write back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machine_lost_right_after_a_key_rotation_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let (key, store, first, _) = rotation_prepared(root.path()).await;
    let cfg = cfg_on(&first, store.clone(), &key, OramEngine::Tao);
    let mut opened = server::open(&cfg).await.unwrap();
    for i in 4..6 {
        put(&opened, &format!("k{i}"), &data(i)).await;
    }
    let sweeper = blindfold_gateway::rotation::Sweeper::start(&mut opened).unwrap();
    sweep_to_the_end(&sweeper).await;
    assert!(!first.join(blindfold_gateway::rotation::ROTATION_FILE).exists(), "not finished");
    put(&opened, "after", b"written after the rotation").await;
    // The machine is lost at once: no clean stop, no store checkpoint since the rotation.
    drop(sweeper);
    let second = cfg_on(&root.path().join("data2"), store, &key, OramEngine::Tao);
    let (opened, about, _) = lose_and_recover(opened, &first, second).await;
    for i in 0..6 {
        assert_eq!(
            common::read_object(&opened, &format!("k{i}")).await.unwrap(),
            data(i),
            "k{i}: {about}"
        );
    }
    assert_eq!(common::read_object(&opened, "after").await.unwrap(), b"written after the rotation");
}

/// The machine lost in the middle of a key rotation under `--durability store`: `recover` with
/// the key file of before the rotation (the new one beside it as `.next`) brings every write
/// back and the rotation resumes, to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machine_lost_in_the_middle_of_a_key_rotation_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let (key, store, first, old) = rotation_prepared(root.path()).await;
    let cfg = cfg_on(&first, store.clone(), &key, OramEngine::Tao);
    // Serving with the rotation under way (not swept yet): new writes are sealed under the
    // new key, the old cells still under the old one.
    let opened = server::open(&cfg).await.unwrap();
    assert!(opened.rotation.is_some());
    for i in 4..7 {
        put(&opened, &format!("k{i}"), &data(i)).await;
    }
    put(&opened, "k0", b"newer").await;
    let second = cfg_on(&root.path().join("data2"), store, &key, OramEngine::Tao);
    let (mut opened, about, second) = lose_and_recover(opened, &first, second).await;
    assert!(about.contains("key rotation"), "{about}");
    assert_eq!(common::read_object(&opened, "k0").await.unwrap(), b"newer", "{about}");
    for i in 1..7 {
        let got = common::read_object(&opened, &format!("k{i}")).await;
        assert_eq!(got.unwrap(), data(i), "k{i}: {about}");
    }
    // The rotation resumes and ends: the new key file replaces the old one.
    let sweeper = blindfold_gateway::rotation::Sweeper::start(&mut opened).expect("resumed");
    sweep_to_the_end(&sweeper).await;
    assert!(!second.join(blindfold_gateway::rotation::ROTATION_FILE).exists(), "not finished");
    let now = blindfold_crypto::load_key_file(&key, None).unwrap();
    assert_ne!(now.expose_bytes(), old.expose_bytes(), "the new key file is in place");
    assert_eq!(common::read_object(&opened, "k3").await.unwrap(), data(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growth_while_serving_is_logged_to_the_store() {
    for engine in OramEngine::ALL {
        grow_then_lose_the_data_directory(engine).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_oram_loses_nothing_acknowledged_with_the_data_directory() {
    nothing_acknowledged_is_lost(OramEngine::PathOram).await;
}

/// `--reads-ahead-of-log`: the same, with every recovery rebuilding the tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_ahead_of_the_log_lose_nothing_acknowledged_with_the_data_directory() {
    for engine in [OramEngine::Tao, OramEngine::PathOram] {
        lose_the_data_directory_with(engine, None, true).await;
    }
}

/// The partition engines' and the TEE-assisted engine's reads always wait for the store-side
/// log: asked to read ahead of it, they lose nothing and their recovery rebuilds nothing (a
/// rebuild would cost a second array and, for them, every block in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_whose_reads_wait_for_the_log_recover_without_a_rebuild() {
    for engine in [OramEngine::ObliviStore, OramEngine::Tee] {
        lose_the_data_directory_with(engine, None, true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_loses_nothing_acknowledged_with_the_data_directory() {
    nothing_acknowledged_is_lost(OramEngine::Tao).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tee_loses_nothing_acknowledged_with_the_data_directory() {
    nothing_acknowledged_is_lost(OramEngine::Tee).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engines_lose_nothing_acknowledged_with_the_data_directory() {
    for engine in [OramEngine::ObliviStore, OramEngine::Curious, OramEngine::CuriousPath] {
        nothing_acknowledged_is_lost(engine).await;
    }
}

/// One writer: a second gateway on the store is refused while the first holds its lease; a
/// gateway whose lease was taken over acknowledges nothing more.
async fn one_writer_per_store(store: StoreUrl) {
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("key.json");
    let engine = OramEngine::PathOram;
    let at = |d: &str| cfg_on(&root.path().join(d), store.clone(), &key, engine);
    let first = server::open(&at("a")).await.unwrap();
    first.objects.directory().create_bucket("b").unwrap();
    first.objects.directory().settle().await.unwrap();
    put(&first, "one", b"1").await;
    let generation = first.journal.as_ref().unwrap().log.generation();
    // Long after the ttl: the first renews its lease, the second is refused. (A file store
    // also locks its arrays: the refusal names the other process either way.)
    lapse().await;
    lapse().await;
    let e = server::recover(&at("b")).await.unwrap_err().to_string();
    assert!(e.contains("another"), "{e}");
    // The lease is taken from the first behind its back (as by a successor after a network
    // partition): it learns at its next renewal and stops acknowledging writes.
    let leases = blindfold_store::open_lease_store(&store).await.unwrap();
    leases.release("gateway", generation).await.unwrap();
    let other = leases.acquire("gateway", "someone else", Duration::from_secs(60)).await.unwrap();
    assert_eq!(other.generation, generation + 1);
    lapse().await;
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"late"))]);
    let late = first.objects.put_object("b", "late", body, None, BTreeMap::new(), false).await;
    let e = late.expect_err("a fenced gateway acknowledged a write").to_string();
    assert!(e.contains("lost its lease"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_per_file_store() {
    let root = tempfile::tempdir().unwrap();
    let files =
        StoreUrl::File { dir: root.path().join("cells"), sync: blindfold_store::SyncMode::OnFlush };
    one_writer_per_store(files).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_per_redis_store() {
    let Some(url) = common::redis_url("one-writer") else { return };
    one_writer_per_store(url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_per_s3_store() {
    let Some(url) = blindfold_testkit::servers::s3_url("one-writer", "") else { return };
    one_writer_per_store(url).await;
}

/// The operator's scenario on the real servers: Redis and MinIO hold the log too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_on_redis_and_minio() {
    for url in
        [common::redis_url("durable-redis"), blindfold_testkit::servers::s3_url("durable-s3", "")]
            .into_iter()
            .flatten()
    {
        lose_the_data_directory(OramEngine::PathOram, Some(url)).await;
    }
}

/// A standby follows the primary and takes over within the lease's ttl (plus the replay) of
/// its death, with every write the primary acknowledged, also those made while it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_primary_dies() {
    let root = tempfile::tempdir().unwrap();
    let files =
        StoreUrl::File { dir: root.path().join("cells"), sync: blindfold_store::SyncMode::OnFlush };
    standby_takes_over(files, false).await;
    // A primary whose reads went ahead of the log: the takeover rebuilds the tree.
    let root = tempfile::tempdir().unwrap();
    let files =
        StoreUrl::File { dir: root.path().join("cells"), sync: blindfold_store::SyncMode::OnFlush };
    standby_takes_over(files, true).await;
    for url in
        [common::redis_url("standby-redis"), blindfold_testkit::servers::s3_url("standby-s3", "")]
            .into_iter()
            .flatten()
    {
        standby_takes_over(url, false).await;
    }
}

async fn standby_takes_over(files: StoreUrl, ahead: bool) {
    // A file store is locked by the process that serves it: a standby reads it only once the
    // primary is gone. Over the network it follows the log as it grows.
    let follows = !matches!(files, StoreUrl::File { .. });
    let store_name = |u: &StoreUrl| match u {
        StoreUrl::File { .. } => "files",
        StoreUrl::Redis { .. } => "redis",
        _ => "s3",
    };
    let name = store_name(&files);
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("key.json");
    let engine = OramEngine::Tao;
    let primary_cfg = ServeConfig {
        reads_ahead_of_log: ahead,
        log_feed: None,
        ..cfg_on(&root.path().join("primary"), files.clone(), &key, engine)
    };
    let primary = server::open(&primary_cfg).await.unwrap();
    primary.objects.directory().create_bucket("b").unwrap();
    primary.objects.directory().settle().await.unwrap();
    for i in 0..5 {
        put(&primary, &format!("k{i}"), &data(i)).await;
    }
    let standby_dir = root.path().join("standby");
    let standby_cfg = cfg_on(&standby_dir, files, &key, engine);
    let said = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let heard = std::sync::Arc::clone(&said);
    let standby = tokio::spawn(async move {
        let say: std::sync::Arc<dyn Fn(&str) + Send + Sync> =
            std::sync::Arc::new(move |m: &str| heard.lock().push(m.to_string()));
        blindfold_gateway::standby::take_over(&standby_cfg, say).await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!standby.is_finished(), "the standby took over from a live primary");
    let status = std::fs::read_to_string(standby_dir.join(blindfold_gateway::standby::STATUS_FILE))
        .expect("the standby says where it stands");
    assert!(status.contains("holds the lease"), "{status}");
    assert!(!follows || status.contains("authentic"), "{status}");
    for i in 5..10 {
        put(&primary, &format!("k{i}"), &data(i)).await;
    }
    let died = std::time::Instant::now();
    drop(primary);
    let (opened, about) = standby.await.unwrap().unwrap();
    let took = died.elapsed();
    eprintln!("{name}: primary died, standby serving {:.2} s later; {about}", took.as_secs_f64());
    assert!(took < TTL + Duration::from_secs(5), "takeover took {took:?}: {about}");
    assert!(about.contains("took over"), "{about}");
    assert_eq!(about.contains("rebuilt with fresh leaves"), ahead, "{about}");
    for i in 0..10 {
        assert_eq!(common::read_object(&opened, &format!("k{i}")).await.unwrap(), data(i), "k{i}");
    }
    assert!(said.lock().iter().any(|m| m.contains("lapsed")), "{:?}", said.lock());
    // The standby is the primary now: it holds the lease under the next generation.
    put(&opened, "after", b"after the takeover").await;
    assert_eq!(common::read_object(&opened, "after").await.unwrap(), b"after the takeover");
}

/// A new engine fails to compile here until it has a test above.
#[allow(dead_code)]
fn every_engine_has_a_test(engine: OramEngine) {
    match engine {
        OramEngine::PathOram
        | OramEngine::Tao
        | OramEngine::Tee
        | OramEngine::ObliviStore
        | OramEngine::Curious
        | OramEngine::CuriousPath => {}
    }
}

/// `--anchor`: a store that rolls back (here: puts back an older copy of everything it holds,
/// so that the log, the checkpoints and the cells agree) would roll a recovered gateway back
/// to an earlier acknowledged state. Without the anchor nothing can tell; with it, `recover`
/// refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_turns_a_dropped_log_tail_into_an_error() {
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let store = StoreUrl::File { dir: cells.clone(), sync: blindfold_store::SyncMode::OnFlush };
    let engine = OramEngine::Tao;
    let anchor: blindfold_gateway::anchor::AnchorSpec =
        root.path().join("trusted").to_str().unwrap().parse().unwrap();
    let at = |d: &str, anchored: bool| ServeConfig {
        anchor: anchored.then(|| anchor.clone()),
        ..cfg_on(&root.path().join(d), store.clone(), &key, engine)
    };
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            assert!(e.file_type().unwrap().is_file(), "{:?}: a file store holds files", e.path());
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    let older = root.path().join("older");
    {
        let opened = server::open(&at("a", true)).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        opened.objects.directory().settle().await.unwrap();
        for i in 0..3 {
            put(&opened, &format!("k{i}"), &data(i)).await;
        }
        drop(opened);
    }
    lapse().await;
    // An intact store: the anchor agrees.
    let (opened, about) = server::recover(&at("b", true)).await.unwrap();
    assert!(about.contains("the anchor at") && about.contains("agrees"), "{about}");
    assert_eq!(common::read_object(&opened, "k2").await.unwrap(), data(2));
    // The store keeps a copy of itself as it is now; three more writes are acknowledged.
    copy(&cells, &older);
    for i in 3..6 {
        put(&opened, &format!("k{i}"), &data(i)).await;
    }
    drop(opened);
    lapse().await;
    // The machine is lost and the store puts its older self back.
    std::fs::remove_dir_all(&cells).unwrap();
    copy(&older, &cells);
    let e = server::recover(&at("c", true)).await.expect_err("a rolled-back log was accepted");
    let e = e.to_string();
    assert!(e.contains("rolled the gateway back") && e.contains("trusted"), "{e}");
    assert!(!root.path().join("c/gateway.json").exists(), "a refused recovery left a gateway");
    // What the anchor prevents: without it, the rollback goes unnoticed.
    let (opened, _) = server::recover(&at("d", false)).await.unwrap();
    assert_eq!(common::read_object(&opened, "k2").await.unwrap(), data(2));
    let k3 = opened.objects.directory().object("b", "k3").unwrap();
    assert!(k3.is_none(), "the older store held k3?");
}

/// `--reads-ahead-of-log`: the machine dies while a PUT of new blocks commits, after its
/// reveals reached the store's log and before its commit record did. The recovery replays
/// those reveals (the blocks get leaves, but were never written) and must still rebuild the
/// tree: blocks that were only ever revealed are no damage (the crash loop saw this recovery
/// fall back to the old tree). A store that altered the old tree's cells is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_ahead_of_the_log_rebuild_after_a_put_cut_short() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for engine in [OramEngine::Tao, OramEngine::PathOram] {
        let root = tempfile::tempdir().unwrap();
        let cells = root.path().join("cells");
        let key = root.path().join("key.json");
        let store = StoreUrl::File { dir: cells.clone(), sync: blindfold_store::SyncMode::OnFlush };
        let cfg = |data: &Path| ServeConfig {
            reads_ahead_of_log: true,
            log_feed: None,
            cache_mib: 1,
            ..cfg_on(data, store.clone(), &key, engine)
        };
        let armed = Arc::new(AtomicBool::new(false));
        let ring_cells =
            blindfold_gateway::storelog::CHUNK + blindfold_crypto::CellSealer::OVERHEAD;
        let hooks = {
            let armed = armed.clone();
            blindfold_gateway::server::OpenHooks {
                wrap_store: Some(Box::new(move |inner: Arc<dyn blindfold_store::Store>| {
                    if inner.geometry().cell_size() as usize == ring_cells {
                        return inner;
                    }
                    Arc::new(ArmedWrites { inner, armed: armed.clone(), then: WhenArmed::Fail })
                        as Arc<dyn blindfold_store::Store>
                })),
                ..Default::default()
            }
        };
        let first = root.path().join("data1");
        let opened = server::open_with(&cfg(&first), hooks).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        opened.objects.directory().settle().await.unwrap();
        for i in 0..3 {
            put(&opened, &format!("k{i}"), &data(i)).await;
        }
        armed.store(true, Ordering::SeqCst);
        let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data(12)))]);
        let cut = opened.objects.put_object("b", "cut", body, None, BTreeMap::new(), false).await;
        assert!(cut.is_err(), "{engine}: a PUT whose commit failed was acknowledged");
        // Its reveals are in the store's log (they went out before its paths did).
        let log = &opened.journal.as_ref().unwrap().log;
        tokio::time::timeout(Duration::from_secs(30), log.durable(log.next_entry() - 1))
            .await
            .expect("the log settles")
            .unwrap();
        drop(opened);
        std::fs::remove_dir_all(&first).unwrap();
        lapse().await;
        // A store that altered the engine's cells is refused, and nothing is made a gateway;
        // once the cells are back, the same recovery succeeds.
        let array = cells.join("oram.cells");
        let good = std::fs::read(&array).unwrap();
        let mut bad = good.clone();
        for b in bad.iter_mut().skip(4096) {
            *b ^= 0x5a;
        }
        std::fs::write(&array, &bad).unwrap();
        let second = root.path().join("data2");
        let refused = server::recover(&cfg(&second)).await.map(|_| ()).expect_err("altered cells");
        // Refused by the rebuild, or already by the replay when it reads a path again.
        let why = refused.to_string();
        assert!(
            why.contains("failed authentication") || why.contains("integrity violation"),
            "{engine}: {why}"
        );
        assert!(
            !second.join("gateway.json").exists(),
            "{engine}: a refused recovery made a gateway"
        );
        std::fs::write(&array, &good).unwrap();
        let (opened, about) = server::recover(&cfg(&second))
            .await
            .unwrap_or_else(|e| panic!("{engine}: recover: {e}"));
        assert!(about.contains("rebuilt with fresh leaves"), "{engine}: {about}");
        assert!(!about.contains("could not be rebuilt"), "{engine}: {about}");
        for i in 0..3 {
            let got = common::read_object(&opened, &format!("k{i}")).await.unwrap();
            assert_eq!(got, data(i), "{engine}: k{i}");
        }
        assert!(opened.objects.directory().object("b", "cut").unwrap().is_none(), "{engine}");
        let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
        assert!(report.is_clean(), "{engine}: {report:?}");
    }
}

/// Under `--durability store` a commit's record goes to the store's log beside its cells, not
/// after them (one round trip to the store instead of two). A machine lost while the cells
/// are written leaves a record whose cells never landed; nothing was acknowledged on it, so the recovery drops it and says so, and
/// every acknowledged object reads back, every cell authenticating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_record_goes_beside_its_cells_and_one_cut_off_from_them_is_dropped() {
    // A bucket per store object, and subtrees of three levels per object (the record names
    // buckets; their groups' slots are read back).
    for pack in [1, 3] {
        record_beside_cells_cut_off(pack).await;
    }
}

async fn record_beside_cells_cut_off(pack: u32) {
    use std::sync::Arc;
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("key.json");
    let store =
        StoreUrl::File { dir: root.path().join("cells"), sync: blindfold_store::SyncMode::OnFlush };
    let engine = OramEngine::Tao;
    let Holding { hooks, armed, held, resume } = holding(true);
    let first_dir = root.path().join("a");
    let first = server::open_with(
        &ServeConfig { pack_levels: pack, ..cfg_on(&first_dir, store.clone(), &key, engine) },
        hooks,
    )
    .await
    .unwrap();
    let (mut expect, writing) = put_until_held(&first, &armed, &held, "cut").await;
    // Everything logged so far reaches the store: with the record beside the cells, the
    // commit's record too (the recovery below finds it), though its cells are held.
    let log = Arc::clone(&first.journal.as_ref().unwrap().log);
    tokio::time::timeout(Duration::from_secs(20), log.durable(log.next_entry() - 1))
        .await
        .expect("the log settles while the cells are held")
        .unwrap();
    // The machine dies as the cells are written: nothing more reaches the log.
    first.journal.as_ref().unwrap().freeze();
    resume.add_permits(1);
    let cut = tokio::time::timeout(Duration::from_secs(30), writing).await.unwrap().unwrap();
    assert!(cut.is_err(), "a PUT whose cells never landed was acknowledged");
    drop(log);
    drop(first);
    std::fs::remove_dir_all(&first_dir).unwrap();
    lapse().await;
    let (second, about) = server::recover(&ServeConfig {
        pack_levels: pack,
        ..cfg_on(&root.path().join("b"), store.clone(), &key, engine)
    })
    .await
    .unwrap_or_else(|e| panic!("recover: {e}"));
    let said = format!("{about} {}", second.notes.join(" "));
    assert!(said.contains("dropped 1 commit record"), "pack {pack}: {said}");
    assert_eq!(second.params.tao_pack_levels(), pack);
    for (k, v) in &expect {
        let got = common::read_object(&second, k).await;
        assert!(got.as_ref().ok() == Some(v), "{k}: {:?}", got.map(|g| g.len()));
    }
    assert!(second.objects.directory().object("b", "cut").unwrap().is_none());
    let report = blindfold_gateway::verify::verify(&second, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    // The recovered gateway goes on: a PUT, lost with the machine again, comes back.
    put(&second, "after", &data(4)).await;
    expect.insert("after".to_string(), data(4));
    let (third, _, _) = lose_and_recover(
        second,
        &root.path().join("b"),
        ServeConfig { pack_levels: pack, ..cfg_on(&root.path().join("c"), store, &key, engine) },
    )
    .await;
    for (k, v) in &expect {
        let got = common::read_object(&third, k).await;
        assert!(got.as_ref().ok() == Some(v), "{k}: {:?}", got.map(|g| g.len()));
    }
    let report = blindfold_gateway::verify::verify(&third, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// Open hooks that wrap the engine's array (not the log's ring) in [`ArmedWrites`] holding
/// the first write once `armed` is set, until a permit of `resume`; with `fail`, that write then
/// fails.
struct Holding {
    hooks: server::OpenHooks,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: std::sync::Arc<tokio::sync::Notify>,
    resume: std::sync::Arc<tokio::sync::Semaphore>,
}

/// In a new bucket `b` of `opened`: objects a0–a2 (returned, as expected back), then a PUT of
/// `key` started with the engine's writes armed, returned once its first cell write is held.
async fn put_until_held(
    opened: &server::Opened,
    armed: &std::sync::atomic::AtomicBool,
    held: &tokio::sync::Notify,
    key: &str,
) -> (BTreeMap<String, Vec<u8>>, tokio::task::JoinHandle<Result<(), String>>) {
    opened.objects.directory().create_bucket("b").unwrap();
    opened.objects.directory().settle().await.unwrap();
    let mut expect = BTreeMap::new();
    for i in 0..3 {
        put(opened, &format!("a{i}"), &data(i)).await;
        expect.insert(format!("a{i}"), data(i));
    }
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let writing = {
        let objects = std::sync::Arc::clone(&opened.objects);
        let key = key.to_string();
        tokio::spawn(async move {
            let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data(9)))]);
            let put = objects.put_object("b", &key, body, None, BTreeMap::new(), false).await;
            put.map(|_| ()).map_err(|e| e.to_string())
        })
    };
    tokio::time::timeout(Duration::from_secs(30), held.notified()).await.expect("a write held");
    (expect, writing)
}

fn holding(fail: bool) -> Holding {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let (armed, held) = (Arc::new(AtomicBool::new(false)), Arc::new(tokio::sync::Notify::new()));
    let resume = Arc::new(tokio::sync::Semaphore::new(0));
    let ring_cells = blindfold_gateway::storelog::CHUNK + blindfold_crypto::CellSealer::OVERHEAD;
    let hooks = {
        let (armed, held, resume) = (armed.clone(), held.clone(), resume.clone());
        server::OpenHooks {
            wrap_store: Some(Box::new(move |inner: Arc<dyn blindfold_store::Store>| {
                if inner.geometry().cell_size() as usize == ring_cells {
                    return inner;
                }
                let (held, resume) = (held.clone(), resume.clone());
                let then = if fail {
                    WhenArmed::HoldThenFail { held, resume }
                } else {
                    WhenArmed::Hold { held, resume }
                };
                Arc::new(ArmedWrites { inner, armed: armed.clone(), then })
                    as Arc<dyn blindfold_store::Store>
            })),
            ..Default::default()
        }
    };
    Holding { hooks, armed, held, resume }
}

/// The writes of the engine's array once armed (the log's ring passes): held until released
/// (a process paused in the middle of writing a path), or failed from then on (a machine that
/// dies as a commit writes its cells).
struct ArmedWrites {
    inner: std::sync::Arc<dyn blindfold_store::Store>,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    then: WhenArmed,
}

enum WhenArmed {
    /// The first write after arming waits for a permit of `resume`, after notifying `held`.
    Hold {
        held: std::sync::Arc<tokio::sync::Notify>,
        resume: std::sync::Arc<tokio::sync::Semaphore>,
    },
    /// Every write fails while armed.
    Fail,
    /// As `Hold`, but the held write then fails (the machine died while it was under way).
    HoldThenFail {
        held: std::sync::Arc<tokio::sync::Notify>,
        resume: std::sync::Arc<tokio::sync::Semaphore>,
    },
}

impl std::fmt::Debug for ArmedWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArmedWrites")
    }
}

#[async_trait::async_trait]
impl blindfold_store::Store for ArmedWrites {
    fn geometry(&self) -> blindfold_store::Geometry {
        self.inner.geometry()
    }
    async fn read(
        &self,
        cells: &[blindfold_store::CellId],
    ) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read(cells).await
    }
    async fn read_ranges(
        &self,
        ranges: &[blindfold_store::ByteRange],
    ) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(ranges).await
    }
    async fn write(
        &self,
        cells: Vec<(blindfold_store::CellId, Vec<u8>)>,
    ) -> blindfold_store::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        match &self.then {
            WhenArmed::Hold { held, resume } => {
                if self.armed.swap(false, SeqCst) {
                    held.notify_one();
                    resume.acquire().await.unwrap().forget();
                }
            }
            WhenArmed::HoldThenFail { held, resume } => {
                if self.armed.swap(false, SeqCst) {
                    held.notify_one();
                    resume.acquire().await.unwrap().forget();
                    let died = "the machine died (a test)".to_string();
                    return Err(blindfold_store::StoreError::Fenced(died));
                }
            }
            WhenArmed::Fail => {
                if self.armed.load(SeqCst) {
                    let died = "the machine died (a test)".to_string();
                    return Err(blindfold_store::StoreError::Fenced(died));
                }
            }
        }
        self.inner.write(cells).await
    }
    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }
}

/// A gateway paused for longer than its lease (a stopped VM) in the middle of writing a path
/// resumes after a successor took the store over: its write is refused before it is sent
/// (the lease's gate), so the successor's cells stay its own — the successor and a gateway
/// recovered after it serve every acknowledged object, and every cell authenticates.
async fn a_paused_gateway_writes_nothing_after_its_lease(store: StoreUrl) {
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("key.json");
    let engine = OramEngine::Tao;
    let Holding { hooks, armed, held, resume } = holding(false);
    let first =
        server::open_with(&cfg_on(&root.path().join("a"), store.clone(), &key, engine), hooks)
            .await
            .unwrap();
    // Paused in the middle of a write: the path's cells held, nothing renewing the lease.
    let (mut expect, writing) = put_until_held(&first, &armed, &held, "paused").await;
    first.journal.as_ref().unwrap().freeze();
    lapse().await;
    // A successor takes the store over from its log and writes.
    let (second, _) = server::recover(&cfg_on(&root.path().join("b"), store.clone(), &key, engine))
        .await
        .unwrap_or_else(|e| panic!("the successor: {e}"));
    for i in 0..6 {
        put(&second, &format!("b{i}"), &data(20 + i)).await;
        expect.insert(format!("b{i}"), data(20 + i));
    }
    // The paused gateway resumes: its held write is refused, and it acknowledges nothing.
    resume.add_permits(1);
    let resumed = tokio::time::timeout(Duration::from_secs(30), writing).await.unwrap().unwrap();
    let e = resumed.expect_err("a gateway past its lease acknowledged a write").to_string();
    assert!(e.contains("lapsed") || e.contains("lease"), "{e}");
    drop(first);
    let check = |opened: server::Opened, expect: BTreeMap<String, Vec<u8>>| async move {
        for (k, v) in &expect {
            let got = common::read_object(&opened, k).await;
            assert!(got.as_ref().ok() == Some(v), "{k}: {:?}", got.map(|g| g.len()));
        }
        let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
        assert!(report.is_clean(), "{report:?}");
        opened
    };
    let second = check(second, expect.clone()).await;
    // And the store's log still holds it all: lose the successor, recover once more.
    let (third, _, _) = lose_and_recover(
        second,
        &root.path().join("b"),
        cfg_on(&root.path().join("c"), store, &key, engine),
    )
    .await;
    check(third, expect).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_gateway_writes_nothing_after_its_lease_on_redis_and_minio() {
    // (A file store is locked by the process holding it open: a successor cannot open it
    // while the paused one lives.)
    for url in [common::redis_url("paused"), blindfold_testkit::servers::s3_url("paused", "")]
        .into_iter()
        .flatten()
    {
        a_paused_gateway_writes_nothing_after_its_lease(url).await;
    }
}

/// `--reads-ahead-of-log` without a log in the store, or with a key rotation under way, is
/// refused with what to do instead, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_ahead_of_the_log_needs_a_log_and_no_rotation() {
    let root = tempfile::tempdir().unwrap();
    let local = ServeConfig {
        durability: Durability::Local,
        reads_ahead_of_log: true,
        log_feed: None,
        ..common::file_cfg(root.path(), OramEngine::Tao)
    };
    let e = server::open(&local).await.expect_err("refused").to_string();
    assert!(e.contains("serve with --durability store, or without --reads-ahead-of-log"), "{e}");
    let key = root.path().join("key.json");
    let cells = root.path().join("cells");
    let store = StoreUrl::File { dir: cells, sync: blindfold_store::SyncMode::OnFlush };
    let data = root.path().join("data");
    let cfg = cfg_on(&data, store, &key, OramEngine::Tao);
    let opened = server::open(&cfg).await.unwrap();
    opened.objects.shutdown().await.unwrap();
    server::write_snapshot(&opened).await.unwrap();
    drop(opened);
    let keys = server::data_dir_keys(&data, &key, None).unwrap();
    blindfold_gateway::rotation::prepare(&data, &key, &keys.current, None).unwrap();
    let ahead = ServeConfig { reads_ahead_of_log: true, ..cfg };
    let e = server::open(&ahead).await.expect_err("refused").to_string();
    assert!(e.contains("a key rotation is under way"), "{e}");
}
