//! A redb storage backend that keeps the directory database sealed at rest.
//!
//! redb sees a plain byte array of whole 4 KiB pages; on disk each page is AES-256-GCM
//! sealed under a key derived from the master key, so bucket names, object keys, sizes, ETags
//! and metadata never touch the disk in the clear, and a passphrase-protected key protects
//! them too. Layout (see `docs/design.md`):
//!
//! ```text
//! offset 0, 64 bytes: magic "BFSEALDB" | format u32 LE (1) | page size u32 LE (4096)
//!                     | file id (16 random bytes) | nonce (12) | tag (16) | 4 zero bytes
//! then page i at 64 + i * 4124: nonce (12 random bytes) | ciphertext (4096) | tag (16)
//!
//! key       = HKDF-SHA256(salt = file id, ikm = master key, info = "blindfold directory v1")
//! page ad   = "blindfold-dir-page-v1" | file id | i u64 LE
//! header    = tag of AES-256-GCM(key, nonce, ad = "blindfold-dir-header-v1" | bytes 0..32, "")
//! ```
//!
//! The header's tag checks the key before any page is read, so a wrong key is named as such.
//! A page that fails authentication is an I/O error (`InvalidData`) that redb reports; wrong
//! data is never returned.
//!
//! # Security
//!
//! - Confidentiality of the contents; the file's length (its number of pages) shows, as does
//!   which pages change when.
//! - Integrity of each page and its place (a page moved to another index, or into another
//!   directory file, fails). An older copy of the *same* page, or of the whole file, is not
//!   detected: the data directory is trusted for integrity, sealing is about it at rest.
//! - Nonces are random: one file must see far fewer than 2^32 page writes (NIST SP 800-38D);
//!   a commit writes a handful of pages, so that is centuries at the gateway's commit rates.
//!
//! # Crashes
//!
//! A page is written with one positioned write, and a process crash never tears one. A power
//! loss in the middle of a page write can; that page then fails authentication and the
//! directory refuses to open (`blindfold recover` rebuilds it from the store's snapshot).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use blindfold_crypto::{derive_key, MasterKey, DIRECTORY_KEY_LABEL};
use parking_lot::RwLock;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes per logical page.
pub const PAGE: usize = 4096;
/// The magic number that starts a sealed directory file.
pub const MAGIC: &[u8; 8] = b"BFSEALDB";
const FORMAT: u32 = 1;
const HEADER_LEN: u64 = 64;
const TAG_LEN: usize = 16;
/// Bytes per stored page: nonce, ciphertext, tag.
const SLOT: usize = NONCE_LEN + PAGE + TAG_LEN;
const PAGE_AD: &[u8] = b"blindfold-dir-page-v1";
const HEADER_AD: &[u8] = b"blindfold-dir-header-v1";
/// Pages sealed per positioned write when many are written at once.
const WRITE_CHUNK: usize = 64;

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The sealed file under one redb database. See the [module docs](self).
pub struct SealedFile {
    file: File,
    key: LessSafeKey,
    id: [u8; 16],
    rng: SystemRandom,
    /// Readers share; writes and resizes are exclusive, so a read never sees half a page.
    lock: RwLock<()>,
}

impl std::fmt::Debug for SealedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedFile").field("id", &hex::encode(self.id)).finish_non_exhaustive()
    }
}

fn page_key(master: &MasterKey, id: &[u8; 16]) -> LessSafeKey {
    let bytes = derive_key(master, id, DIRECTORY_KEY_LABEL);
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes[..]).expect("32-byte AES-256 key"))
}

fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{} is in use by another process", path.display()),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

impl SealedFile {
    /// Whether the file at `path` starts like a sealed directory file.
    pub fn is_sealed(path: &Path) -> io::Result<bool> {
        let mut magic = [0u8; 8];
        let file = File::open(path)?;
        match file.read_exact_at(&mut magic, 0) {
            Ok(()) => Ok(&magic == MAGIC),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates a new, empty sealed file (mode 0600; fails if `path` exists).
    pub fn create(path: &Path, master: &MasterKey) -> io::Result<Self> {
        let rng = SystemRandom::new();
        let mut id = [0u8; 16];
        rng.fill(&mut id).map_err(|_| io::Error::other("the system RNG failed"))?;
        let key = page_key(master, &id);
        let mut header = [0u8; HEADER_LEN as usize];
        header[0..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        header[12..16].copy_from_slice(&(PAGE as u32).to_le_bytes());
        header[16..32].copy_from_slice(&id);
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill(&mut nonce).map_err(|_| io::Error::other("the system RNG failed"))?;
        let ad = [HEADER_AD, &header[..32]].concat();
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&ad),
                &mut [],
            )
            .map_err(|_| io::Error::other("sealing the directory header failed"))?;
        header[32..44].copy_from_slice(&nonce);
        header[44..60].copy_from_slice(tag.as_ref());
        let file =
            OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)?;
        lock_exclusive(&file, path)?;
        file.write_all_at(&header, 0)?;
        file.sync_all()?;
        Ok(Self { file, key, id, rng, lock: RwLock::new(()) })
    }

    /// Opens an existing sealed file, checking that `master` is its key.
    pub fn open(path: &Path, master: &MasterKey) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        lock_exclusive(&file, path)?;
        let mut header = [0u8; HEADER_LEN as usize];
        file.read_exact_at(&mut header, 0).map_err(|e| {
            invalid(format!("{}: the sealed directory header is cut short ({e})", path.display()))
        })?;
        if &header[0..8] != MAGIC {
            return Err(invalid(format!("{} is not a sealed directory file", path.display())));
        }
        let format = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
        let page = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
        if format != FORMAT || page as usize != PAGE {
            return Err(invalid(format!(
                "{}: sealed directory format {format} with {page}-byte pages; this gateway \
                 reads format {FORMAT} with {PAGE}-byte pages",
                path.display()
            )));
        }
        let id: [u8; 16] = header[16..32].try_into().expect("16 bytes");
        let key = page_key(master, &id);
        let nonce: [u8; NONCE_LEN] = header[32..44].try_into().expect("12 bytes");
        let ad = [HEADER_AD, &header[..32]].concat();
        let mut tag = header[44..60].to_vec();
        key.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&ad), &mut tag).map_err(
            |_| {
                invalid(format!(
                    "{}: the directory was sealed under another key, or its header is damaged",
                    path.display()
                ))
            },
        )?;
        Ok(Self { file, key, id, rng: SystemRandom::new(), lock: RwLock::new(()) })
    }

    fn page_ad(&self, index: u64) -> [u8; PAGE_AD.len() + 16 + 8] {
        let mut ad = [0u8; PAGE_AD.len() + 16 + 8];
        ad[..PAGE_AD.len()].copy_from_slice(PAGE_AD);
        ad[PAGE_AD.len()..PAGE_AD.len() + 16].copy_from_slice(&self.id);
        ad[PAGE_AD.len() + 16..].copy_from_slice(&index.to_le_bytes());
        ad
    }

    fn slot_offset(index: u64) -> u64 {
        HEADER_LEN + index * SLOT as u64
    }

    /// Whole pages stored. A partly written last slot (a power loss while the file grew)
    /// does not count.
    fn pages(&self) -> io::Result<u64> {
        let len = self.file.metadata()?.len();
        Ok(len.saturating_sub(HEADER_LEN) / SLOT as u64)
    }

    /// Reads and opens pages `first..first + count` into `out` (`count * PAGE` bytes).
    fn read_pages(&self, first: u64, out: &mut [u8]) -> io::Result<()> {
        let count = out.len() / PAGE;
        let mut slots = vec![0u8; count * SLOT];
        self.file.read_exact_at(&mut slots, Self::slot_offset(first))?;
        for (i, (slot, page)) in slots.chunks_mut(SLOT).zip(out.chunks_mut(PAGE)).enumerate() {
            let index = first + i as u64;
            let (nonce, sealed) = slot.split_at_mut(NONCE_LEN);
            let nonce: [u8; NONCE_LEN] = (&*nonce).try_into().expect("12 bytes");
            let plain = self
                .key
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(self.page_ad(index)),
                    sealed,
                )
                .map_err(|_| {
                    invalid(format!(
                        "directory page {index} failed authentication (damaged or tampered with)"
                    ))
                })?;
            page.copy_from_slice(plain);
        }
        Ok(())
    }

    /// Seals `data` (whole pages) as pages `first..` and writes them.
    fn write_pages(&self, first: u64, data: &[u8]) -> io::Result<()> {
        for (c, chunk) in data.chunks(WRITE_CHUNK * PAGE).enumerate() {
            let start = first + (c * WRITE_CHUNK) as u64;
            let mut slots = vec![0u8; chunk.len() / PAGE * SLOT];
            for (i, (slot, page)) in slots.chunks_mut(SLOT).zip(chunk.chunks(PAGE)).enumerate() {
                let mut nonce = [0u8; NONCE_LEN];
                self.rng.fill(&mut nonce).map_err(|_| io::Error::other("the system RNG failed"))?;
                slot[..NONCE_LEN].copy_from_slice(&nonce);
                let body = &mut slot[NONCE_LEN..NONCE_LEN + PAGE];
                body.copy_from_slice(page);
                let tag = self
                    .key
                    .seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key(nonce),
                        Aad::from(self.page_ad(start + i as u64)),
                        body,
                    )
                    .map_err(|_| io::Error::other("sealing a directory page failed"))?;
                slot[NONCE_LEN + PAGE..].copy_from_slice(tag.as_ref());
            }
            self.file.write_all_at(&slots, Self::slot_offset(start))?;
        }
        Ok(())
    }
}

impl redb::StorageBackend for SealedFile {
    fn len(&self) -> io::Result<u64> {
        let _g = self.lock.read();
        Ok(self.pages()? * PAGE as u64)
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let _g = self.lock.read();
        let end = offset.checked_add(len as u64).ok_or_else(|| invalid("read overflow".into()))?;
        if end > self.pages()? * PAGE as u64 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the directory file",
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let first = offset / PAGE as u64;
        let last = (end - 1) / PAGE as u64;
        let mut pages = vec![0u8; (last - first + 1) as usize * PAGE];
        self.read_pages(first, &mut pages)?;
        let at = (offset - first * PAGE as u64) as usize;
        pages.truncate(at + len);
        pages.drain(..at);
        Ok(pages)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let _g = self.lock.write();
        if !len.is_multiple_of(PAGE as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the sealed directory file holds whole {PAGE}-byte pages, not {len} bytes"),
            ));
        }
        let want = len / PAGE as u64;
        let have = self.pages()?;
        if want <= have {
            return self.file.set_len(Self::slot_offset(want));
        }
        // Drop a partly written slot, then append sealed zero pages (never unsealed zeros,
        // which would not authenticate).
        self.file.set_len(Self::slot_offset(have))?;
        let zeros = vec![0u8; WRITE_CHUNK * PAGE];
        let mut at = have;
        while at < want {
            let n = (want - at).min(WRITE_CHUNK as u64) as usize;
            self.write_pages(at, &zeros[..n * PAGE])?;
            at += n as u64;
        }
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        let _g = self.lock.write();
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let _g = self.lock.write();
        if data.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| invalid("write overflow".into()))?;
        let have = self.pages()?;
        let first = offset / PAGE as u64;
        let last = (end - 1) / PAGE as u64;
        let mut pages = vec![0u8; (last - first + 1) as usize * PAGE];
        // Partly covered pages keep their other bytes: read them first (pages past the end
        // are zeros, as a file grown by writing past its end).
        let head = (offset - first * PAGE as u64) as usize;
        if head != 0 && first < have {
            self.read_pages(first, &mut pages[..PAGE])?;
        }
        let tail = (end - last * PAGE as u64) as usize;
        if tail != PAGE && last < have && (last != first || head == 0) {
            let at = pages.len() - PAGE;
            self.read_pages(last, &mut pages[at..])?;
        }
        pages[head..head + data.len()].copy_from_slice(data);
        if first > have {
            // Writing past the end: the pages in between become sealed zeros.
            let zeros = vec![0u8; PAGE];
            for i in have..first {
                self.write_pages(i, &zeros)?;
            }
        }
        self.write_pages(first, &pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use redb::StorageBackend;

    #[test]
    fn the_backend_behaves_like_a_byte_vector() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let key = MasterKey::from_bytes([3u8; 32]);
        let mut f = SealedFile::create(&path, &key).unwrap();
        let mut model: Vec<u8> = Vec::new();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for step in 0..400 {
            match rng.gen_range(0..10) {
                0 => {
                    let len = rng.gen_range(0..12u64) * PAGE as u64;
                    f.set_len(len).unwrap();
                    model.resize(len as usize, 0);
                }
                1..=5 => {
                    // Writes anywhere, also unaligned, across pages and past the end.
                    let off = rng.gen_range(0..=model.len() + 2 * PAGE);
                    let n = rng.gen_range(0..3 * PAGE);
                    let data: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                    f.write(off as u64, &data).unwrap();
                    if off + n > model.len() && n > 0 {
                        let pages = (off + n).div_ceil(PAGE);
                        model.resize(pages * PAGE, 0);
                    }
                    if n > 0 {
                        model[off..off + n].copy_from_slice(&data);
                    }
                }
                6 => {
                    // Reopen: everything is on disk.
                    f.sync_data(false).unwrap();
                    drop(f);
                    f = SealedFile::open(&path, &key).unwrap();
                }
                _ if model.is_empty() => {}
                _ => {
                    let off = rng.gen_range(0..model.len());
                    let n = rng.gen_range(0..=(model.len() - off).min(3 * PAGE));
                    assert_eq!(f.read(off as u64, n).unwrap(), model[off..off + n], "step {step}");
                }
            }
            assert_eq!(f.len().unwrap(), model.len() as u64, "step {step}");
        }
        assert!(f.read(model.len() as u64, 1).is_err(), "reads past the end fail");
        assert!(f.set_len(100).is_err(), "whole pages only");
    }

    #[test]
    fn a_wrong_key_or_a_damaged_page_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let key = MasterKey::from_bytes([3u8; 32]);
        let f = SealedFile::create(&path, &key).unwrap();
        f.write(0, &[5u8; 3 * PAGE]).unwrap();
        drop(f);
        let err = SealedFile::open(&path, &MasterKey::from_bytes([4u8; 32])).unwrap_err();
        assert!(err.to_string().contains("another key"), "{err}");
        // Flip one byte in page 1's ciphertext: that page no longer opens, the others do.
        let at = SealedFile::slot_offset(1) + 100;
        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, at).unwrap();
        file.write_all_at(&[b[0] ^ 1], at).unwrap();
        drop(file);
        let f = SealedFile::open(&path, &key).unwrap();
        assert_eq!(f.read(0, PAGE).unwrap(), vec![5u8; PAGE]);
        let err = f.read(PAGE as u64 + 10, 10).unwrap_err();
        assert!(err.to_string().contains("page 1 failed authentication"), "{err}");
        // The plaintext is nowhere in the file.
        let bytes = std::fs::read(&path).unwrap();
        assert!(!bytes.windows(64).any(|w| w == [5u8; 64]));
    }

    #[test]
    fn a_second_open_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let key = MasterKey::from_bytes([3u8; 32]);
        let _f = SealedFile::create(&path, &key).unwrap();
        let err = SealedFile::open(&path, &key).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    }
}
