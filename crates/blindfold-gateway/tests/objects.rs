//! The object layer over a real (in-memory or recorded) store: semantics, concurrency, the
//! allocator, and what padding hides.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_gateway::objects::ObjectLayer;
use blindfold_gateway::{Directory, GatewayError};
use blindfold_oram::PathOramConfig;
use blindfold_proxy::{DurablePathOram, DurableTao, SealedPathOram, TaoConfig};
use blindfold_store::{MemoryStore, RecordingStore, Store, TraceEvent, TraceOp};
use bytes::Bytes;
use rand::{Rng, SeedableRng};

type Body = futures::stream::Iter<std::vec::IntoIter<Result<Bytes, std::io::Error>>>;

fn body(data: &[u8]) -> Body {
    // Uneven chunks, as a network delivers them.
    let mut chunks = Vec::new();
    let mut at = 0;
    let mut n = 1;
    while at < data.len() {
        let take = n.min(data.len() - at);
        chunks.push(Ok(Bytes::copy_from_slice(&data[at..at + take])));
        at += take;
        n = n * 3 + 7;
    }
    futures::stream::iter(chunks)
}

struct Setup {
    layer: Arc<ObjectLayer>,
    recording: Arc<RecordingStore<MemoryStore>>,
    _dir: tempfile::TempDir,
}

async fn setup(blocks: u64, block_size: u32, pad: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = PathOramConfig::builder(blocks, block_size).build().unwrap();
    let geometry = SealedPathOram::geometry(&config).unwrap();
    let recording = Arc::new(RecordingStore::new(MemoryStore::new(geometry)));
    let store: Arc<dyn Store> = recording.clone();
    let engine = DurablePathOram::create(
        &dir.path().join("oram"),
        config,
        store,
        &MasterKey::generate(),
        StoreId::random(),
    )
    .await
    .unwrap();
    let directory =
        Directory::open(&dir.path().join("meta.redb"), blocks, &MasterKey::generate()).unwrap();
    let layer = Arc::new(ObjectLayer::new(directory, engine, pad));
    layer.directory().create_bucket("b").unwrap();
    Setup { layer, recording, _dir: dir }
}

async fn get(layer: &Arc<ObjectLayer>, key: &str, range: Option<std::ops::Range<u64>>) -> Vec<u8> {
    let meta = layer.directory().object("b", key).unwrap().expect("object exists");
    let range = range.unwrap_or(0..meta.size);
    let mut rx = layer.read_range(&meta, range, 4096).await.unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

async fn put(layer: &Arc<ObjectLayer>, key: &str, data: &[u8]) {
    layer.put_object("b", key, body(data), None, BTreeMap::new(), false).await.unwrap();
}

#[tokio::test]
async fn objects_round_trip_with_ranges_and_overwrites() {
    let s = setup(512, 256, false).await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for size in [0usize, 1, 255, 256, 257, 1000, 5000] {
        let data: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
        let key = format!("k{size}");
        put(&s.layer, &key, &data).await;
        assert_eq!(get(&s.layer, &key, None).await, data, "size {size}");
        let meta = s.layer.directory().object("b", &key).unwrap().unwrap();
        assert_eq!(meta.size, size as u64);
        assert_eq!(meta.etag, hex::encode(md5_of(&data)));
        if size > 10 {
            let r = 3..(size as u64 - 2);
            assert_eq!(get(&s.layer, &key, Some(r.clone())).await, data[3..size - 2].to_vec());
        }
    }
    // Overwrite frees the old blocks.
    let free_before = s.layer.directory().free_blocks();
    put(&s.layer, "k5000", &[7u8; 10]).await;
    assert_eq!(get(&s.layer, "k5000", None).await, vec![7u8; 10]);
    assert_eq!(s.layer.directory().free_blocks(), free_before + 20 - 1);
    assert!(s.layer.delete_object("b", "k5000").await.unwrap());
    assert!(!s.layer.delete_object("b", "k5000").await.unwrap());
    assert_eq!(s.layer.directory().free_blocks(), free_before + 20);
    assert!(s.layer.directory().check().unwrap().is_empty());
}

fn md5_of(data: &[u8]) -> [u8; 16] {
    use md5::Digest;
    md5::Md5::digest(data).into()
}

#[tokio::test]
async fn capacity_is_enforced_and_nothing_leaks() {
    let s = setup(16, 64, false).await;
    put(&s.layer, "a", &[1u8; 64 * 10]).await;
    let err = s
        .layer
        .put_object("b", "big", body(&[2u8; 64 * 10]), None, BTreeMap::new(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Full { capacity: 16 }), "{err}");
    // The failed upload's reserved blocks came back.
    assert_eq!(s.layer.directory().free_blocks(), 6);
    put(&s.layer, "c", &[3u8; 64 * 6]).await;
    assert_eq!(s.layer.directory().free_blocks(), 0);
    assert_eq!(get(&s.layer, "a", None).await, vec![1u8; 640]);
    assert!(s.layer.directory().check().unwrap().is_empty());
}

#[tokio::test]
async fn multipart_upload_assembles_parts_in_order() {
    let s = setup(256, 128, false).await;
    let id =
        s.layer.create_upload("b", "mp", Some("text/plain".into()), BTreeMap::new()).await.unwrap();
    let parts: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 300 + i as usize * 100]).collect();
    let mut etags = Vec::new();
    for (i, p) in parts.iter().enumerate().rev() {
        let part = s.layer.upload_part("b", "mp", &id, i as i32 + 1, body(p)).await.unwrap();
        etags.push((i as i32 + 1, Some(part.etag)));
    }
    // Re-upload part 2 with other data: the first copy's blocks are freed.
    let replacement = vec![9u8; 250];
    let p2 = s.layer.upload_part("b", "mp", &id, 2, body(&replacement)).await.unwrap();
    etags.sort();
    etags[1].1 = Some(p2.etag);
    assert!(matches!(
        s.layer.complete_upload("b", "mp", &id, &[(2, None), (1, None)]).await,
        Err(GatewayError::InvalidPartOrder)
    ));
    assert!(matches!(
        s.layer.complete_upload("b", "mp", &id, &[(1, Some("bad".into()))]).await,
        Err(GatewayError::InvalidPart)
    ));
    let meta = s.layer.complete_upload("b", "mp", &id, &etags).await.unwrap();
    assert!(meta.etag.ends_with("-3"));
    let mut expect = parts[0].clone();
    expect.extend_from_slice(&replacement);
    expect.extend_from_slice(&parts[2]);
    assert_eq!(get(&s.layer, "mp", None).await, expect);
    // Ranges across part boundaries.
    assert_eq!(get(&s.layer, "mp", Some(290..560)).await, expect[290..560].to_vec());
    assert!(s.layer.directory().upload(&id).unwrap().is_none());
    assert!(s.layer.directory().check().unwrap().is_empty());
    // Abort frees everything.
    let before = s.layer.directory().free_blocks();
    let id = s.layer.create_upload("b", "gone", None, BTreeMap::new()).await.unwrap();
    s.layer.upload_part("b", "gone", &id, 1, body(&[1u8; 1000])).await.unwrap();
    s.layer.abort_upload("b", "gone", &id).await.unwrap();
    assert_eq!(s.layer.directory().free_blocks(), before);
    assert!(matches!(
        s.layer.abort_upload("b", "gone", &id).await,
        Err(GatewayError::NoSuchUpload)
    ));
}

/// The layer over the TaoStore engine (the gateway's default).
async fn setup_tao(blocks: u64, block_size: u32, pad: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = TaoConfig::builder(blocks, block_size).write_back_every(8).build().unwrap();
    let recording = Arc::new(RecordingStore::new(MemoryStore::new(config.geometry().unwrap())));
    let store: Arc<dyn Store> = recording.clone();
    let mut engine = DurableTao::create(
        &dir.path().join("oram"),
        config,
        store,
        &MasterKey::generate(),
        StoreId::random(),
    )
    .await
    .unwrap();
    engine.set_max_overlay(300); // commits forced by a full overlay happen too
    let directory =
        Directory::open(&dir.path().join("meta.redb"), blocks, &MasterKey::generate()).unwrap();
    let layer = Arc::new(ObjectLayer::with_engine(directory, Arc::new(engine), pad));
    layer.directory().create_bucket("b").unwrap();
    Setup { layer, recording, _dir: dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_clients() {
    sixty_four_clients(setup(4096, 256, false).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_clients_on_the_tao_engine() {
    let s = setup_tao(4096, 256, false).await;
    sixty_four_clients(s).await;
}

async fn sixty_four_clients(s: Setup) {
    let mut tasks = Vec::new();
    for c in 0..64u64 {
        let layer = Arc::clone(&s.layer);
        tasks.push(tokio::spawn(async move {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(c);
            let mut mine: HashMap<String, Vec<u8>> = HashMap::new();
            for i in 0..6 {
                let key = format!("client{c}/obj{}", i % 4);
                let data: Vec<u8> = (0..rng.gen_range(0..2000)).map(|_| rng.gen()).collect();
                put(&layer, &key, &data).await;
                mine.insert(key.clone(), data);
                let probe = format!("client{c}/obj{}", rng.gen_range(0..4));
                if let Some(expect) = mine.get(&probe) {
                    assert_eq!(&get(&layer, &probe, None).await, expect, "{probe}");
                }
            }
            mine
        }));
    }
    let mut all = HashMap::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    for (k, v) in &all {
        assert_eq!(&get(&s.layer, k, None).await, v, "{k}");
    }
    assert!(s.layer.directory().check().unwrap().is_empty());
}

fn shape(trace: &[TraceEvent]) -> Vec<(TraceOp, usize, u64)> {
    trace.iter().map(TraceEvent::shape).collect()
}

#[tokio::test]
async fn padding_hides_sizes_within_a_class() {
    // Without padding, a 5-block and a 7-block object differ in accesses; with padding both
    // take 8 blocks and their PUT and GET traces have the same shape.
    for pad in [false, true] {
        let mut shapes = Vec::new();
        for blocks in [5usize, 7] {
            let s = setup(256, 64, pad).await;
            s.recording.clear();
            put(&s.layer, "x", &vec![1u8; blocks * 64 - 3]).await;
            let _ = get(&s.layer, "x", Some(0..10)).await;
            shapes.push(shape(&s.recording.take_trace()));
        }
        let reads =
            |s: &Vec<(TraceOp, usize, u64)>| s.iter().filter(|e| e.0 == TraceOp::Read).count();
        if pad {
            assert_eq!(reads(&shapes[0]), reads(&shapes[1]), "padded: same number of path reads");
            // 8 blocks written in one batch (one read of their 8 paths), 8 read back likewise.
            assert_eq!(reads(&shapes[0]), 2, "one batched path read per direction");
            let cells = |s: &Vec<(TraceOp, usize, u64)>| {
                s.iter().filter(|e| e.0 == TraceOp::Read).map(|e| e.1).sum::<usize>()
            };
            assert!(cells(&shapes[0]) > 8, "each batch reads the union of 8 paths");
        }
    }
    // Without padding the size shows, if only statistically now that blocks travel in
    // batches: a PUT of 7 blocks fetches the union of 7 random paths, one of 5 blocks the
    // union of 5 — about 34 against 26 cells in this tree.
    let mut mean = Vec::new();
    for blocks in [5usize, 7] {
        let mut total = 0usize;
        for _ in 0..12 {
            let s = setup(256, 64, false).await;
            s.recording.clear();
            put(&s.layer, "x", &vec![1u8; blocks * 64 - 3]).await;
            let trace = s.recording.take_trace();
            total += trace
                .iter()
                .filter(|e| e.op == TraceOp::Read)
                .map(|e| e.cells.len())
                .sum::<usize>();
        }
        mean.push(total as f64 / 12.0);
    }
    assert!(mean[1] > mean[0] + 3.0, "unpadded sizes are visible: mean cells read {mean:?}");
}

#[tokio::test]
async fn a_streaming_read_survives_replacement_and_block_reuse() {
    // A GET looks the object up, then streams its blocks. Meanwhile a PUT replaces the object
    // (freeing its blocks) and another PUT allocates blocks. The freed blocks must not be
    // reused while the GET still reads them, or it would return the other object's data.
    let s = setup(1024, 4096, false).await;
    // Larger than the stream's buffering, so the reader is still reading when the PUTs run.
    const N: usize = 256 * 4096;
    let old: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    put(&s.layer, "a", &old).await;
    let (meta, pin) = s.layer.lookup_for_read("b", "a").unwrap().expect("object exists");
    let mut rx = s.layer.read_range(&meta, 0..meta.size, 0).await.unwrap();
    drop(pin);
    put(&s.layer, "a", &[1u8; N]).await;
    put(&s.layer, "other", &[2u8; N]).await;
    let mut got = Vec::new();
    while let Some(chunk) = rx.recv().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert!(got == old, "the streamed object changed under the reader");
    assert_eq!(get(&s.layer, "a", None).await, vec![1u8; N]);
    assert_eq!(get(&s.layer, "other", None).await, vec![2u8; N]);
    // Once the read is over, the old blocks are free again.
    put(&s.layer, "third", &[3u8; N]).await;
    assert!(s.layer.directory().check().unwrap().is_empty());
}

/// Uploads `parts` as one multipart object at `key`.
async fn put_multipart(layer: &Arc<ObjectLayer>, key: &str, parts: &[Vec<u8>]) {
    let id = layer.create_upload("b", key, None, BTreeMap::new()).await.unwrap();
    let mut listed = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let n = i as i32 + 1;
        let part = layer.upload_part("b", key, &id, n, body(p)).await.unwrap();
        listed.push((n, Some(part.etag)));
    }
    layer.complete_upload("b", key, &id, &listed).await.unwrap();
}

/// The kinds of the store requests in a trace, in order (cell counts vary with the random
/// paths; the number and kind of requests is what a fixed plan decides).
fn ops(trace: &[TraceEvent]) -> Vec<TraceOp> {
    trace.iter().map(|e| e.op).collect()
}

#[tokio::test]
async fn a_padded_multipart_get_reads_like_a_single_put_of_its_size() {
    // Three parts of 9 blocks: each part is padded to 16 blocks on upload, but the object
    // (27 blocks) is in the 32-block class, like a single PUT of the same bytes. Its GET —
    // whole or ranged — must issue the same requests: 2 batches of 16, not 3.
    // Then parts that are not whole blocks: 449 + 449 + 126 bytes are 16 blocks of data but
    // 18 partly filled blocks as uploaded; the GET must still read one batch of 16.
    for (sizes, batches) in [(vec![9 * 64, 9 * 64, 9 * 64], 2), (vec![449, 449, 126], 1)] {
        let s = setup(512, 64, true).await;
        let parts: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
        let whole: Vec<u8> = parts.concat();
        put_multipart(&s.layer, "mp", &parts).await;
        put(&s.layer, "single", &whole).await;
        for range in [None, Some(0..10), Some(600..1000)] {
            let mut traces = Vec::new();
            for key in ["mp", "single"] {
                s.recording.clear();
                let got = get(&s.layer, key, range.clone()).await;
                let r = range.clone().unwrap_or(0..whole.len() as u64);
                assert_eq!(got, whole[r.start as usize..r.end as usize], "{key} {range:?}");
                traces.push(ops(&s.recording.take_trace()));
            }
            assert_eq!(
                traces[0], traces[1],
                "multipart and single PUT GETs differ ({sizes:?} {range:?})"
            );
            let reads = traces[1].iter().filter(|op| **op == TraceOp::Read).count();
            assert_eq!(reads, batches, "batches of 16 blocks");
        }
        assert!(s.layer.directory().check().unwrap().is_empty());
        assert!(s.layer.directory().uploads().unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_padded_get_finishes_its_reads_when_the_client_goes_away() {
    // 40 blocks of 4 KiB pad to 64: four batches of 16. A reader that goes away at once must
    // not stop the reads after the first batch (whose 64 KiB fill the first chunk).
    let s = setup(256, 4096, true).await;
    put(&s.layer, "x", &vec![7u8; 40 * 4096]).await;
    s.recording.clear();
    let _ = get(&s.layer, "x", None).await;
    let full = ops(&s.recording.take_trace());
    assert_eq!(full.iter().filter(|op| **op == TraceOp::Read).count(), 4);

    let (meta, pin) = s.layer.lookup_for_read("b", "x").unwrap().expect("object exists");
    let rx = s.layer.read_range(&meta, 0..meta.size, 0).await.unwrap();
    drop(pin);
    drop(rx);
    // The reader task holds the object's pin until its last read.
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while s.layer.directory().pinned_blocks() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the reader task ends");
    assert_eq!(ops(&s.recording.take_trace()), full, "the abandoned GET read less");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_padded_multipart_get_on_the_tao_engine_reads_its_class() {
    // The Tao engine reads one path per block access: a GET of a 27-block object padded to
    // 32 makes as many path reads whether it was uploaded in three parts or in one PUT.
    let s = setup_tao(512, 64, true).await;
    let parts: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 9 * 64]).collect();
    let whole: Vec<u8> = parts.concat();
    put_multipart(&s.layer, "mp", &parts).await;
    put(&s.layer, "single", &whole).await;
    let mut reads = Vec::new();
    for key in ["mp", "single"] {
        s.recording.clear();
        assert_eq!(get(&s.layer, key, Some(5..70)).await, whole[5..70]);
        let trace = s.recording.take_trace();
        reads.push(trace.iter().filter(|e| e.op == TraceOp::Read).count());
    }
    assert_eq!(reads[0], reads[1], "path reads of the multipart and the single-PUT GET");
}
