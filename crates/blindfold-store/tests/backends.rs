//! The file backend's on-disk behaviour, store URLs and `open_store`.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use blindfold_store::{
    open_store, CellId, FileStore, Geometry, Store, StoreError, StoreUrl, SyncMode,
};

const HEADER: u64 = 4096;

fn geometry() -> Geometry {
    Geometry::new(100, 64).unwrap()
}

fn create(path: &Path) -> FileStore {
    FileStore::create_or_open(path, geometry(), SyncMode::OnFlush).unwrap()
}

fn flip_byte(path: &Path, at: u64) {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[b[0] ^ 0x40], at).unwrap();
}

fn not_a_store_reason(result: blindfold_store::Result<FileStore>) -> String {
    match result {
        Err(StoreError::NotAStore { reason, .. }) => reason,
        other => panic!("expected NotAStore, got {other:?}"),
    }
}

// ---- file store -----------------------------------------------------------------------------

#[tokio::test]
async fn file_store_persists_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep/er/data.cells");
    let id;
    {
        let store = create(&path);
        assert_eq!(store.path(), path);
        id = store.file_id();
        store.write(vec![(CellId(0), vec![1; 64]), (CellId(99), vec![2; 64])]).await.unwrap();
        store.flush().await.unwrap();
    }
    // Preallocated: header plus every cell.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), HEADER + 100 * 64);
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");

    let store = create(&path);
    assert_eq!(store.file_id(), id, "reopening keeps the file id");
    let cells = store.read(&[CellId(0), CellId(50), CellId(99)]).await.unwrap();
    assert_eq!(cells, vec![vec![1; 64], vec![0; 64], vec![2; 64]]);
    drop(store);

    let store = FileStore::open_existing(&path, SyncMode::None).unwrap();
    assert_eq!(store.geometry(), geometry());
    assert_eq!(store.sync_mode(), SyncMode::None);
    assert_eq!(store.read(&[CellId(99)]).await.unwrap(), vec![vec![2; 64]]);

    // A new file at another path gets another id.
    let other = create(&dir.path().join("other.cells"));
    assert_ne!(other.file_id(), id);
}

#[test]
fn cells_are_where_the_format_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("layout.cells");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let store = create(&path);
    rt.block_on(store.write(vec![(CellId(3), vec![0xAA; 64])])).unwrap();
    drop(store);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..16], b"blindfold-cells\0");
    assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(bytes[20..24].try_into().unwrap()), 64);
    assert_eq!(u64::from_le_bytes(bytes[24..32].try_into().unwrap()), 100);
    let cell3 = (HEADER + 3 * 64) as usize;
    assert!(bytes[cell3 - 1] == 0 && bytes[cell3 + 64] == 0);
    assert!(bytes[cell3..cell3 + 64].iter().all(|&b| b == 0xAA));
}

#[test]
fn another_geometry_is_a_mismatch_naming_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.cells");
    drop(create(&path));
    let other = Geometry::new(128, 32).unwrap();
    let err = FileStore::create_or_open(&path, other, SyncMode::OnFlush).unwrap_err();
    assert!(matches!(err, StoreError::GeometryMismatch { .. }), "{err:?}");
    assert!(!err.is_retryable());
    let msg = err.to_string();
    for part in ["100 cells of 64 bytes", "128 cells of 32 bytes", "g.cells"] {
        assert!(msg.contains(part), "{msg:?} should name {part:?}");
    }
    // The file was left alone.
    drop(create(&path));
}

#[test]
fn a_foreign_file_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign.cells");
    std::fs::write(&path, vec![0x5Au8; 10_000]).unwrap();
    let reason = not_a_store_reason(FileStore::create_or_open(&path, geometry(), SyncMode::None));
    assert!(reason.contains("magic"), "{reason}");
    let reason = not_a_store_reason(FileStore::open_existing(&path, SyncMode::None));
    assert!(reason.contains("magic"), "{reason}");
    // It was not overwritten.
    assert_eq!(std::fs::read(&path).unwrap(), vec![0x5Au8; 10_000]);

    std::fs::write(&path, b"short").unwrap();
    let reason = not_a_store_reason(FileStore::open_existing(&path, SyncMode::None));
    assert!(reason.contains("shorter than"), "{reason}");

    let missing = FileStore::open_existing(dir.path().join("missing.cells"), SyncMode::None);
    assert!(matches!(missing, Err(StoreError::Io { .. })), "{missing:?}");
}

#[test]
fn a_corrupted_header_byte_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.cells");
    drop(create(&path));
    // Magic, version, cell size, cell count, file id, checksum, reserved bytes.
    for at in [0, 15, 17, 21, 30, 40, 49, 52, 1000, 4095] {
        flip_byte(&path, at);
        let reason = not_a_store_reason(FileStore::open_existing(&path, SyncMode::None));
        let expected = if at < 16 { "magic" } else { "checksum" };
        assert!(reason.contains(expected), "byte {at}: {reason}");
        flip_byte(&path, at);
        FileStore::open_existing(&path, SyncMode::None).unwrap();
    }
    // Cell bytes are not the store's business: the seal layer checks them.
    flip_byte(&path, HEADER + 5);
    FileStore::open_existing(&path, SyncMode::None).unwrap();
}

#[test]
fn unknown_versions_and_truncation_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.cells");
    drop(create(&path));
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mut header = vec![0u8; HEADER as usize];
    file.read_exact_at(&mut header, 0).unwrap();

    // A future format version with a valid checksum.
    let mut v2 = header.clone();
    v2[16..20].copy_from_slice(&2u32.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&v2[..48]);
    h.update(&v2[52..]);
    v2[48..52].copy_from_slice(&h.finalize().to_le_bytes());
    file.write_all_at(&v2, 0).unwrap();
    let reason = not_a_store_reason(FileStore::open_existing(&path, SyncMode::None));
    assert!(reason.contains("format version 2"), "{reason}");

    file.write_all_at(&header, 0).unwrap();
    file.set_len(HEADER + 99 * 64).unwrap();
    let reason = not_a_store_reason(FileStore::open_existing(&path, SyncMode::None));
    assert!(reason.contains("truncated"), "{reason}");
}

#[test]
fn a_second_handle_is_refused_while_the_first_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.cells");
    let first = create(&path);
    let err = FileStore::open_existing(&path, SyncMode::None).unwrap_err();
    assert!(matches!(err, StoreError::InUse { .. }), "{err:?}");
    assert!(err.to_string().contains("locked.cells"), "{err}");
    drop(first);
    FileStore::open_existing(&path, SyncMode::None).unwrap();
}

#[tokio::test]
async fn millions_of_cells() {
    // Two million cells (128 MiB, preallocated: small enough for any test machine).
    let dir = tempfile::tempdir().unwrap();
    let big = Geometry::new(2_000_000, 64).unwrap();
    let store =
        FileStore::create_or_open(dir.path().join("big.cells"), big, SyncMode::None).unwrap();
    let last = CellId(1_999_999);
    store.write(vec![(last, vec![7; 64]), (CellId(1_000_003), vec![8; 64])]).await.unwrap();
    let cells = store.read(&[last, CellId(1_000_000), CellId(1_000_003)]).await.unwrap();
    assert_eq!(cells, vec![vec![7; 64], vec![0; 64], vec![8; 64]]);
    let err = store.read(&[CellId(2_000_000)]).await.unwrap_err();
    assert!(matches!(err, StoreError::OutOfRange { .. }), "{err:?}");
}

// ---- URLs -----------------------------------------------------------------------------------

fn file_url(dir: &str, sync: SyncMode) -> StoreUrl {
    StoreUrl::File { dir: PathBuf::from(dir), sync }
}

#[test]
fn good_urls_parse() {
    let cases = [
        ("memory:", StoreUrl::Memory),
        ("memory://", StoreUrl::Memory),
        ("MEMORY:", StoreUrl::Memory),
        ("file:///var/lib/blindfold", file_url("/var/lib/blindfold", SyncMode::OnFlush)),
        ("file://localhost/srv/x", file_url("/srv/x", SyncMode::OnFlush)),
        ("file:/abs/dir", file_url("/abs/dir", SyncMode::OnFlush)),
        ("file:cells", file_url("cells", SyncMode::OnFlush)),
        ("file:./a/../b", file_url("./a/../b", SyncMode::OnFlush)),
        ("file:cells?sync=none", file_url("cells", SyncMode::None)),
        ("file:///d?sync=flush", file_url("/d", SyncMode::OnFlush)),
        ("file:///d?sync=always", file_url("/d", SyncMode::Always)),
        ("file:///my%20dir/x%3Fy", file_url("/my dir/x?y", SyncMode::OnFlush)),
        ("file:cells?", file_url("cells", SyncMode::OnFlush)),
    ];
    for (text, want) in cases {
        assert_eq!(StoreUrl::parse(text).unwrap(), want, "{text}");
        assert_eq!(text.parse::<StoreUrl>().unwrap(), want, "{text}");
    }
}

#[test]
fn bad_urls_say_what_is_wrong() {
    let cases = [
        ("rediss://localhost:6379", "rediss:// is not supported yet"),
        ("ftp://host/x", "unknown scheme \"ftp\""),
        ("/var/lib/blindfold", "write `file:/var/lib/blindfold`"),
        ("", "no scheme"),
        ("memory:foo", "takes no path"),
        ("memory:?sync=none", "takes no path"),
        ("file:", "needs a directory"),
        ("file://", "needs an absolute path"),
        ("file://server/share", "cannot name a host"),
        ("file:///d?sync=sometimes", "not one of `none`, `flush`, `always`"),
        ("file:///d?sync=none&sync=always", "more than once"),
        ("file:///d?fsync=none", "unknown option \"fsync\""),
        ("file:///d#frag", "fragment"),
    ];
    for (text, hint) in cases {
        let err = StoreUrl::parse(text).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::InvalidUrl { .. }), "{text}: {err:?}");
        assert!(msg.contains(hint), "{text}: {msg:?} should contain {hint:?}");
        assert!(!err.is_retryable());
    }
    // Errors about the scheme list the accepted forms.
    let msg = StoreUrl::parse("ftp://b").unwrap_err().to_string();
    assert!(msg.contains("memory:") && msg.contains("file:///") && msg.contains("sync="), "{msg}");
    assert!(msg.contains("s3://") && msg.contains("redis://"), "{msg}");
}

#[test]
fn display_round_trips() {
    let urls = [
        StoreUrl::Memory,
        file_url("/var/lib/blindfold", SyncMode::OnFlush),
        file_url("/var/lib/blindfold", SyncMode::None),
        file_url("rel/dir", SyncMode::Always),
        file_url("/with space/and%percent?q#h", SyncMode::OnFlush),
        file_url("ünïcödé", SyncMode::None),
    ];
    for url in urls {
        let text = url.to_string();
        assert_eq!(StoreUrl::parse(&text).unwrap(), url, "{text}");
    }
    assert_eq!(StoreUrl::Memory.to_string(), "memory:");
    assert_eq!(file_url("/a/b", SyncMode::OnFlush).to_string(), "file:///a/b");
    assert_eq!(file_url("a/b", SyncMode::Always).to_string(), "file:a/b?sync=always");
}

// ---- open_store -----------------------------------------------------------------------------

#[tokio::test]
async fn open_store_with_a_file_url_creates_named_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("stores");
    let url = StoreUrl::parse(&format!("file://{}?sync=none", root.display())).unwrap();

    let data = open_store(&url, "data", geometry()).await.unwrap();
    let posmap = open_store(&url, "posmap-1.v2_x", Geometry::new(7, 16).unwrap()).await.unwrap();
    assert!(root.join("data.cells").is_file());
    assert!(root.join("posmap-1.v2_x.cells").is_file());
    assert_eq!(posmap.geometry(), Geometry::new(7, 16).unwrap());

    data.write(vec![(CellId(4), vec![4; 64])]).await.unwrap();
    data.flush().await.unwrap();
    drop(data);
    let again = open_store(&url, "data", geometry()).await.unwrap();
    assert_eq!(again.read(&[CellId(4)]).await.unwrap(), vec![vec![4; 64]]);
    drop(again);

    let err = open_store(&url, "data", Geometry::new(5, 5).unwrap()).await.unwrap_err();
    assert!(matches!(err, StoreError::GeometryMismatch { .. }), "{err:?}");
}

#[tokio::test]
async fn open_store_with_memory_gives_fresh_stores() {
    let a = open_store(&StoreUrl::Memory, "data", geometry()).await.unwrap();
    a.write(vec![(CellId(1), vec![1; 64])]).await.unwrap();
    let b = open_store(&StoreUrl::Memory, "data", geometry()).await.unwrap();
    assert_eq!(b.read(&[CellId(1)]).await.unwrap(), vec![vec![0; 64]]);
    assert_eq!(b.geometry(), geometry());
}

#[tokio::test]
async fn open_store_refuses_bad_names() {
    let dir = tempfile::tempdir().unwrap();
    let url = file_url(dir.path().to_str().unwrap(), SyncMode::None);
    let long = "x".repeat(129);
    for name in ["", ".", "..", ".hidden", "a/b", "../escape", "a b", "ü", "a\0b", long.as_str()] {
        for url in [&url, &StoreUrl::Memory] {
            let err = open_store(url, name, geometry()).await.unwrap_err();
            assert!(matches!(err, StoreError::InvalidName { .. }), "{name:?}: {err:?}");
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was created");
}
