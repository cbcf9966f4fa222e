//! The reproduction, at the gateway: a GET of one object before a crash and a GET of
//! the same object after the restart used to read exactly the same cells. With the reveal log
//! they share only what two GETs without a crash share (the top of the tree).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::common;

use blindfold_gateway::server::{self, OpenHooks, OramEngine, ServeConfig};
use blindfold_store::{CellId, RecordingStore, Store, TraceOp};
use bytes::Bytes;
use common::{file_cfg, read_object};
use parking_lot::Mutex;

type Rec = Arc<RecordingStore<Arc<dyn Store>>>;

/// Opens the gateway with a recording store in front of its ORAM store.
async fn open(cfg: &ServeConfig) -> (server::Opened, Rec) {
    let slot: Arc<Mutex<Option<Rec>>> = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&slot);
    let hooks = OpenHooks {
        wrap_store: Some(Box::new(move |inner| {
            let rec = Arc::new(RecordingStore::new(inner));
            // The ORAM's array comes first (the store-side log's, if any, is wrapped too).
            keep.lock().get_or_insert_with(|| Arc::clone(&rec));
            rec as Arc<dyn Store>
        })),
        ..OpenHooks::default()
    };
    let opened = server::open_with(cfg, hooks).await.unwrap();
    let rec = slot.lock().take().expect("the store was wrapped");
    (opened, rec)
}

/// The tree cells read since the last call. New gateways keep two slots per cell: store cell
/// `c + n` is the second copy of tree cell `c`, and which copy a read goes to follows the
/// commits (which the store sees anyway), so reads are compared as tree cells.
fn reads(rec: &Rec) -> HashSet<CellId> {
    let n = rec.geometry().cell_count() / 2;
    rec.take_trace()
        .into_iter()
        .filter(|e| e.op == TraceOp::Read)
        .flat_map(|e| e.cells)
        .map(|c| CellId(c.0 % n))
        .collect()
}

/// Asserts that GETs after a loss (`lost`: the share of cells each has in common with the GET
/// of the same object before the loss) share no more than GETs without one (`calm`), and that
/// little: `what` names the loss for the message.
fn assert_as_fresh(lost: &[f64], calm: &[f64], what: &str) {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (l, n) = (mean(lost), mean(calm));
    assert!(
        l < 0.6 && (l - n).abs() < 0.25,
        "{what} shares {:.0} % of its cells with the GET before it (without one: {:.0} %)",
        l * 100.0,
        n * 100.0
    );
}

async fn check(engine: OramEngine) {
    let root = tempfile::tempdir().unwrap();
    let cfg = file_cfg(root.path(), engine);
    let (mut opened, mut rec) = open(&cfg).await;
    assert!(opened.params.two_slots());
    opened.objects.directory().create_bucket("b").unwrap();
    let data = vec![7u8; 6 * 1024]; // six blocks
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.clone()))]);
    opened.objects.put_object("b", "k", body, None, BTreeMap::new(), false).await.unwrap();
    let (mut crashed, mut calm) = (Vec::new(), Vec::new());
    for trial in 0..16 {
        // A PUT commits everything so far: the GET below starts from a committed state.
        let d = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 10]))]);
        opened.objects.put_object("b", "d", d, None, BTreeMap::new(), false).await.unwrap();
        rec.clear();
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
        let first = reads(&rec);
        if trial % 2 == 0 {
            // kill -9: nothing is committed, shut down or snapshotted.
            drop(opened);
            drop(rec);
            (opened, rec) = open(&cfg).await;
            rec.clear();
        }
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
        let second = reads(&rec);
        let share = first.intersection(&second).count() as f64 / first.len() as f64;
        if trial % 2 == 0 {
            crashed.push(share)
        } else {
            calm.push(share)
        }
    }
    assert_as_fresh(&crashed, &calm, &format!("{engine:?}: a GET after a crash"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_after_kill_reads_fresh_paths_tao() {
    check(OramEngine::Tao).await;
}

#[tokio::test]
async fn get_after_kill_reads_fresh_paths_path_oram() {
    check(OramEngine::PathOram).await;
}

/// With `--reads-ahead-of-log`, a GET goes out before the store holds its reveal record. Here
/// the store never takes it (the log's tail is lost with the machine), the data directory is
/// lost too, and the gateway is recovered from the store alone: the next GET of the same
/// object must share no more with the one before the loss than two GETs without one do.
/// (Continuing the recovered tree would read the object's blocks on the very same paths.)
async fn check_store_only(engine: OramEngine) {
    use std::time::Duration;
    let ttl = Duration::from_millis(300);
    let root = tempfile::tempdir().unwrap();
    let cfg_in = |data: &str| ServeConfig {
        data_dir: root.path().join(data),
        durability: server::Durability::Store,
        lease_ttl: Some(ttl),
        reads_ahead_of_log: true,
        log_feed: None,
        ..file_cfg(root.path(), engine)
    };
    let mut cfg = cfg_in("data0");
    let (mut opened, mut rec) = open(&cfg).await;
    assert!(opened.journal.as_ref().is_some_and(|j| j.log.reads_ahead()));
    opened.objects.directory().create_bucket("b").unwrap();
    let data = vec![7u8; 6 * 1024]; // six blocks
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.clone()))]);
    opened.objects.put_object("b", "k", body, None, BTreeMap::new(), false).await.unwrap();
    let (mut lost, mut calm) = (Vec::new(), Vec::new());
    for trial in 0..8 {
        let d = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 10]))]);
        opened.objects.put_object("b", "d", d, None, BTreeMap::new(), false).await.unwrap();
        rec.clear();
        let losing = trial % 2 == 0;
        if losing {
            // The reveal record of the GET below never reaches the store.
            opened.journal.as_ref().unwrap().log.withhold_writes();
        }
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
        let first = reads(&rec);
        if losing {
            // The machine is lost: no clean stop, the data directory gone.
            drop(opened);
            drop(rec);
            std::fs::remove_dir_all(&cfg.data_dir).unwrap();
            tokio::time::sleep(ttl + Duration::from_millis(100)).await;
            cfg = cfg_in(&format!("data{}", trial + 1));
            let (recovered, about) = server::recover(&cfg).await.unwrap();
            assert!(about.contains("rebuilt with fresh leaves"), "{engine:?}: {about}");
            // Stopped cleanly and opened again, to record what the store sees.
            recovered.objects.shutdown().await.unwrap();
            server::write_snapshot(&recovered).await.unwrap();
            drop(recovered);
            (opened, rec) = open(&cfg).await;
            rec.clear();
        }
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
        let second = reads(&rec);
        let share = first.intersection(&second).count() as f64 / first.len() as f64;
        if losing {
            lost.push(share)
        } else {
            calm.push(share)
        }
    }
    assert_as_fresh(
        &lost,
        &calm,
        &format!("{engine:?}: a GET after a recovery from the store alone"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_after_store_only_recovery_reads_fresh_paths_tao() {
    check_store_only(OramEngine::Tao).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_after_store_only_recovery_reads_fresh_paths_path_oram() {
    check_store_only(OramEngine::PathOram).await;
}

/// Waits until the primary's log feed lets reads go on its standby's word.
async fn standby_active(opened: &server::Opened) {
    let feed = opened.journal.as_ref().unwrap().log.feed().expect("a log feed").clone();
    for _ in 0..200 {
        if feed.describe().contains("whichever holds their record first") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the standby never caught up: {}", feed.describe());
}

/// Waits (up to 10 s) until the primary's log feed says no standby is connected; returns
/// whether it does.
async fn standby_gone(feed: &blindfold_gateway::feed::Feed) -> bool {
    for _ in 0..200 {
        if feed.describe().contains("no standby is connected") {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

/// `--standby-listen`: a GET goes out once the standby holds its reveal record. Here the store
/// never gets that record (the log's tail is lost with the machine), and the standby takes
/// over with its copy of the tail: it replays the record instead of rebuilding the tree, and
/// the next GET of the same object shares no more with the GET before the loss than two GETs
/// without a loss do. (Continuing the store's log without the tail would read the object's
/// blocks on the very same paths.) A recovery from the store alone, with no tail, rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_after_a_standby_takeover_reads_fresh_paths() {
    use blindfold_gateway::feed::LogFeed;
    use std::time::Duration;
    let ttl = Duration::from_millis(300);
    let root = tempfile::tempdir().unwrap();
    let engine = OramEngine::Tao;
    let cfg_in = |data: &str, feed: LogFeed| ServeConfig {
        data_dir: root.path().join(data),
        durability: server::Durability::Store,
        lease_ttl: Some(ttl),
        log_feed: Some(feed),
        ..file_cfg(root.path(), engine)
    };
    let serve = || LogFeed::Serve("127.0.0.1:0".parse().unwrap());
    let mut cfg = cfg_in("data0", serve());
    let (mut opened, mut rec) = open(&cfg).await;
    opened.objects.directory().create_bucket("b").unwrap();
    let data = vec![7u8; 6 * 1024]; // six blocks
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.clone()))]);
    opened.objects.put_object("b", "k", body, None, BTreeMap::new(), false).await.unwrap();
    let (mut lost, mut calm) = (Vec::new(), Vec::new());
    for trial in 0..6 {
        let losing = trial % 2 == 0;
        let next = format!("data{}", trial + 1);
        let standby = if losing {
            let addr = opened.journal.as_ref().unwrap().feed_addr.unwrap();
            let standby_cfg = cfg_in(&next, LogFeed::Follow(addr.to_string()));
            let say: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(|_: &str| {});
            let task = tokio::spawn(async move {
                blindfold_gateway::standby::take_over(&standby_cfg, say).await
            });
            standby_active(&opened).await;
            Some(task)
        } else {
            None
        };
        let d = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 10]))]);
        opened.objects.put_object("b", "d", d, None, BTreeMap::new(), false).await.unwrap();
        rec.clear();
        if losing {
            // The reveal record of the GET below never reaches the store; the standby has it.
            opened.journal.as_ref().unwrap().log.withhold_writes();
        }
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
        let first = reads(&rec);
        if let Some(standby) = standby {
            // The machine is lost: no clean stop, the data directory gone.
            drop(opened);
            drop(rec);
            std::fs::remove_dir_all(&cfg.data_dir).unwrap();
            let (recovered, about) = standby.await.unwrap().unwrap();
            assert!(!about.contains("rebuilt"), "{about}");
            assert!(
                about.contains("more from this standby's copy") && !about.contains(" 0 more"),
                "the takeover did not use the standby's tail: {about}"
            );
            // Stopped cleanly and opened again, to record what the store sees.
            recovered.objects.shutdown().await.unwrap();
            server::write_snapshot(&recovered).await.unwrap();
            drop(recovered);
            cfg = cfg_in(&next, serve());
            (opened, rec) = open(&cfg).await;
            rec.clear();
        }
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
        let second = reads(&rec);
        let share = first.intersection(&second).count() as f64 / first.len() as f64;
        if losing {
            lost.push(share)
        } else {
            calm.push(share)
        }
    }
    assert_as_fresh(&lost, &calm, "a GET after a standby's takeover");

    // The same loss with nobody holding the tail: the store's log says that reads went ahead
    // on a standby's word, so a recovery from the store alone rebuilds the tree.
    let addr = opened.journal.as_ref().unwrap().feed_addr.unwrap();
    let journal = opened.journal.as_ref().unwrap();
    let follower =
        blindfold_gateway::feed::follow(addr.to_string(), Arc::clone(&opened.key), "t".into());
    standby_active(&opened).await;
    journal.log.withhold_writes();
    assert_eq!(read_object(&opened, "k").await.unwrap(), data);
    drop(follower);
    drop(opened);
    drop(rec);
    std::fs::remove_dir_all(&cfg.data_dir).unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let alone = ServeConfig { log_feed: None, ..cfg_in("alone", serve()) };
    let (recovered, about) = server::recover(&alone).await.unwrap();
    assert!(about.contains("rebuilt with fresh leaves") && about.contains("standby"), "{about}");
    assert_eq!(read_object(&recovered, "k").await.unwrap(), data);
}

/// The log feed's listener is reachable from the network: a peer without the key, bytes that
/// are not the feed, a length meant to exhaust memory, and a second standby are all refused,
/// and the primary goes on serving (its reads waiting for the store) until its standby comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_feed_refuses_strangers_and_a_second_standby() {
    use blindfold_gateway::feed::{follow, LogFeed};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let root = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(300);
    let cfg = ServeConfig {
        durability: server::Durability::Store,
        lease_ttl: Some(ttl),
        log_feed: Some(LogFeed::Serve("127.0.0.1:0".parse().unwrap())),
        ..file_cfg(root.path(), OramEngine::Tao)
    };
    let (opened, rec) = open(&cfg).await;
    opened.objects.directory().create_bucket("b").unwrap();
    let addr = opened.journal.as_ref().unwrap().feed_addr.unwrap();
    let feed = opened.journal.as_ref().unwrap().log.feed().unwrap().clone();
    let put = |k: &'static str| {
        let objects = Arc::clone(&opened.objects);
        async move {
            let body =
                futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![3u8; 2000]))]);
            objects.put_object("b", k, body, None, BTreeMap::new(), false).await.unwrap();
        }
    };
    // Another key.
    let stranger = follow(
        addr.to_string(),
        Arc::new(blindfold_crypto::MasterKey::from_bytes([5; 32])),
        "stranger".into(),
    );
    // Not the feed at all, and a frame claiming 4 GiB after a well-formed opening.
    let mut junk = tokio::net::TcpStream::connect(addr).await.unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef0123456789abcdef")
        .await
        .unwrap();
    let mut huge = tokio::net::TcpStream::connect(addr).await.unwrap();
    huge.write_all(b"BFFEED01").await.unwrap();
    huge.write_all(&[9u8; 32]).await.unwrap();
    let mut opening = [0u8; 40];
    huge.read_exact(&mut opening).await.unwrap();
    huge.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    put("a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(feed.describe().contains("no standby is connected"), "{}", feed.describe());
    assert!(stranger.describe().contains("same key file"), "{}", stranger.describe());
    // Both closed by the primary: the first once it has sent its own opening (40 bytes).
    let mut got = Vec::new();
    let junk_read = tokio::time::timeout(Duration::from_secs(5), junk.read_to_end(&mut got)).await;
    assert!(matches!(junk_read, Ok(Ok(40)) | Ok(Err(_))), "{junk_read:?}, {} bytes", got.len());
    let mut buf = [0u8; 64];
    let huge_read = tokio::time::timeout(Duration::from_secs(5), huge.read(&mut buf)).await;
    assert!(matches!(huge_read, Ok(Ok(0)) | Ok(Err(_))), "a 4 GiB frame was not refused");
    drop(stranger);
    // The standby with the key is taken; a second one is refused while it follows.
    let standby = follow(addr.to_string(), Arc::clone(&opened.key), "first".into());
    standby_active(&opened).await;
    let second = follow(addr.to_string(), Arc::clone(&opened.key), "second".into());
    put("b").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(feed.describe().contains("first"), "{}", feed.describe());
    assert!(!second.describe().starts_with("following"), "{}", second.describe());
    // The standby holds what the store may not: entries beyond the store's end, then none.
    drop(second);
    let tail = standby.stop().expect("a session");
    assert!(tail.base > 0, "{tail:?}");
    // The standby gone, the log says so once the store holds the next group: the machine
    // lost then, a recovery from the store alone needs no rebuild.
    standby_gone(&feed).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    put("c").await;
    assert_eq!(read_object(&opened, "c").await.unwrap(), vec![3u8; 2000]);
    drop(feed);
    drop(opened);
    drop(rec);
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let again = ServeConfig { data_dir: root.path().join("again"), log_feed: None, ..cfg };
    let (recovered, about) = server::recover(&again).await.unwrap();
    assert!(!about.contains("rebuilt"), "the session's end was not logged: {about}");
    assert_eq!(read_object(&recovered, "c").await.unwrap(), vec![3u8; 2000]);
}

/// While a standby's word lets reads go, a GET's reveal record does not cost the store a group
/// write of its own: records wait up to the log's linger for company (the next commit's record,
/// or other reads'), and still reach the store soon after. Once the standby is gone, a GET
/// waits for the store again, and its record goes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reveals_on_a_standby_word_share_the_store_writes() {
    use blindfold_gateway::feed::{follow, LogFeed};
    use std::time::{Duration, Instant};
    let root = tempfile::tempdir().unwrap();
    let cfg = ServeConfig {
        durability: server::Durability::Store,
        lease_ttl: Some(Duration::from_millis(300)),
        log_feed: Some(LogFeed::Serve("127.0.0.1:0".parse().unwrap())),
        ..file_cfg(root.path(), OramEngine::Tao)
    };
    let (opened, _rec) = open(&cfg).await;
    opened.objects.directory().create_bucket("b").unwrap();
    let data = vec![5u8; 6 * 1024];
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.clone()))]);
    opened.objects.put_object("b", "k", body, None, BTreeMap::new(), false).await.unwrap();
    let journal = opened.journal.as_ref().unwrap();
    let log = Arc::clone(&journal.log);
    let standby =
        follow(journal.feed_addr.unwrap().to_string(), Arc::clone(&opened.key), "s".into());
    standby_active(&opened).await;
    // Twenty GETs one after the other, each with a reveal record of its own.
    let gets = 20;
    let before = log.counts().0;
    let started = Instant::now();
    for _ in 0..gets {
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
    }
    let took = started.elapsed();
    let groups = log.counts().0 - before;
    // One group per linger at most, plus one in flight at either end.
    let bound = 2 + (took.as_millis() / 100) as u64;
    assert!(
        groups <= bound.min(gets / 2),
        "{gets} GETs on a standby's word took {groups} store groups in {took:?} (at most {bound})"
    );
    // Still in the store soon, without anything else waiting for it.
    let queued = log.next_entry();
    for _ in 0..100 {
        if log.durable_entries() >= queued {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        log.durable_entries() >= queued,
        "the reveal records never reached the store: {} of {queued} entries",
        log.durable_entries()
    );
    // The standby gone, a GET waits for the store: its record goes without lingering.
    drop(standby);
    let feed = log.feed().unwrap().clone();
    assert!(standby_gone(&feed).await, "{}", feed.describe());
    let before = log.counts().0;
    for _ in 0..3 {
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
    }
    assert!(log.counts().0 - before >= 3, "GETs without a standby shared store groups");
}
