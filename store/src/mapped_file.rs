//! A preallocated file of fixed length mapped into memory: the building block
//! of CommitLog segments, ConsumeQueue files and key-index files.
//!
//! The map is a raw pointer ([`memmap2::MmapRaw`]) because one writer appends
//! into the free tail while readers hold slices of the written prefix. Each
//! owner publishes how far its data is written (an atomic, release/acquire)
//! and only hands out slices below that mark, which is what makes the
//! `unsafe` accessors here sound: no byte is ever written while a slice of it
//! is alive. The accessors return errors instead of panicking on a range that
//! falls outside the file, because ranges are often computed from bytes read
//! off disk.
//!
//! Files are preallocated with `posix_fallocate` so that a write into the map
//! can never hit a full disk (which would kill the process with SIGBUS rather
//! than return an error).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{IoContext, Result, StoreError};

/// Page size used for warm-up strides. Linux on x86-64 and arm64 uses 4 KiB
/// base pages; a larger real page only makes the warm-up touch pages twice.
const PAGE: u64 = 4096;

/// How a new mapped file is prepared.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MapOptions {
    /// Touch every page of a newly created file so the writer never takes a
    /// page fault.
    pub warm_up: bool,
    /// `mlock` the mapping so it is never paged out.
    pub mlock: bool,
}

pub(crate) struct MappedFile {
    path: PathBuf,
    // Kept open for the lifetime of the map; also what `sync_all` would use.
    _file: File,
    map: MmapRaw,
    len: u64,
    /// How far the file is faulted in ahead of its writer (bytes from its
    /// start), kept by the prefault thread.
    faulted_to: AtomicU64,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl MappedFile {
    /// Creates a new file of exactly `len` bytes (all zero), preallocated and
    /// mapped. Fails if the file already exists.
    pub fn create(path: &Path, len: u64, opts: MapOptions) -> Result<MappedFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .at(path)?;
        // Out of space, say: leave nothing behind, so the same create can be
        // tried again once there is room.
        let remove = |e: StoreError| {
            let _ = std::fs::remove_file(path);
            e
        };
        preallocate(&file, len).at(path).map_err(remove)?;
        let mapped = Self::map(path, file, len, opts).map_err(remove)?;
        if opts.warm_up {
            mapped.warm_up(0);
        }
        Ok(mapped)
    }

    /// Opens an existing file that should be `len` bytes long. A shorter file
    /// (cut by a crash or by hand) is extended with zeros, which recovery then
    /// treats as the end of data; a longer one means the configured size
    /// changed under existing data, which is refused.
    pub fn open(path: &Path, len: u64, opts: MapOptions) -> Result<MappedFile> {
        let file = OpenOptions::new().read(true).write(true).open(path).at(path)?;
        let actual = file.metadata().at(path)?.len();
        if actual > len {
            return Err(StoreError::BadArgument(format!(
                "{} is {actual} bytes but the configured file size is {len}; \
                 the size cannot change while files of the old size exist",
                path.display()
            )));
        }
        if actual < len {
            tracing::warn!(path = %path.display(), actual, expected = len, "file shorter than its configured size; extending with zeros");
            preallocate(&file, len).at(path)?;
        }
        Self::map(path, file, len, opts)
    }

    fn map(path: &Path, file: File, len: u64, opts: MapOptions) -> Result<MappedFile> {
        let map_len = usize::try_from(len)
            .map_err(|_| StoreError::BadArgument(format!("file size {len} does not fit in memory")))?;
        let map = MmapOptions::new().len(map_len).map_raw(&file).at(path)?;
        if opts.mlock {
            map.lock().at(path)?;
        }
        Ok(MappedFile {
            path: path.to_path_buf(),
            _file: file,
            map,
            len,
            faulted_to: AtomicU64::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records that the file was renamed.
    pub fn set_path(&mut self, path: PathBuf) {
        self.path = path;
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    fn check(&self, pos: u64, len: u64) -> Result<()> {
        match pos.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(StoreError::corrupt(
                &self.path,
                pos,
                format!("range of {len} bytes runs past the end of the {}-byte file", self.len),
            )),
        }
    }

    /// A view of `len` bytes at `pos`.
    ///
    /// # Safety
    /// No write to any byte of the range may happen while the returned slice
    /// is alive (the owner only hands out ranges below its published write
    /// mark, and never writes below it while views may exist).
    pub unsafe fn slice(&self, pos: u64, len: u64) -> Result<&[u8]> {
        self.check(pos, len)?;
        // SAFETY: the range is inside the mapping (checked above), the mapping
        // lives as long as `self`, and the caller rules out concurrent writes.
        Ok(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(pos as usize), len as usize) })
    }

    /// Copies `data` into the file at `pos`.
    ///
    /// # Safety
    /// No slice of the range may be alive, and no other thread may write the
    /// same range concurrently.
    pub unsafe fn write(&self, pos: u64, data: &[u8]) -> Result<()> {
        self.check(pos, data.len() as u64)?;
        // SAFETY: in bounds (checked); exclusive access promised by the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_mut_ptr().add(pos as usize), data.len());
        }
        Ok(())
    }

    /// Writes `bufs`, one after another, at `pos` through the file
    /// (`pwritev`) instead of through the map; readers of the map see the
    /// bytes as soon as this returns, since both are the same page-cache
    /// pages.
    ///
    /// Why not the map: the first store to a page of a preallocated file
    /// faults, and the kernel zeroes a fresh page before the store may
    /// proceed, only for the writer to overwrite it; a write through the
    /// file fills a page it covers whole without zeroing it (about a fifth
    /// of a leader's CPU went to that zeroing). A full disk is an error
    /// here, not a SIGBUS, though preallocation already rules it out.
    ///
    /// # Safety
    /// As for [`MappedFile::write`]: no slice of the range may be alive.
    pub unsafe fn write_through(&self, pos: u64, bufs: &[&[u8]]) -> Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.check(pos, total)?;
        let fd = self._file.as_raw_fd();
        let mut iov: Vec<libc::iovec> = bufs
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let mut first = 0;
        let mut at = pos;
        while first < iov.len() {
            // IOV_MAX is 1024 on Linux.
            let n = (iov.len() - first).min(1024);
            // SAFETY: the iovecs point into live slices of `bufs`; the range
            // is inside the file (checked above).
            let wrote = unsafe { libc::pwritev(fd, iov[first..].as_ptr(), n as libc::c_int, at as libc::off_t) };
            if wrote < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e).at(&self.path);
            }
            if wrote == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "pwritev wrote nothing",
                ))
                .at(&self.path);
            }
            at += wrote as u64;
            // Skip what was written: whole buffers, then part of the next.
            let mut left = wrote as usize;
            while left > 0 && first < iov.len() {
                if left >= iov[first].iov_len {
                    left -= iov[first].iov_len;
                    first += 1;
                } else {
                    // SAFETY: advancing within the same buffer.
                    iov[first].iov_base = unsafe { (iov[first].iov_base as *mut u8).add(left) } as *mut libc::c_void;
                    iov[first].iov_len -= left;
                    left = 0;
                }
            }
        }
        Ok(())
    }

    /// Sets `len` bytes at `pos` to zero.
    ///
    /// # Safety
    /// As for [`MappedFile::write`].
    pub unsafe fn zero(&self, pos: u64, len: u64) -> Result<()> {
        self.check(pos, len)?;
        // SAFETY: as for `write`.
        unsafe { std::ptr::write_bytes(self.map.as_mut_ptr().add(pos as usize), 0, len as usize) };
        Ok(())
    }

    /// Offset one past the last non-zero byte at or after `from`, or `from`
    /// when everything after it is zero. Used by recovery to find how much
    /// stale data must be wiped behind a truncation point.
    ///
    /// # Safety
    /// As for [`MappedFile::slice`] over `[from, len)`.
    pub unsafe fn nonzero_end(&self, from: u64) -> Result<u64> {
        let tail = unsafe { self.slice(from, self.len.saturating_sub(from))? };
        Ok(match tail.iter().rposition(|&b| b != 0) {
            Some(i) => from + i as u64 + 1,
            None => from,
        })
    }

    /// Makes `[pos, pos + len)` durable (`msync(MS_SYNC)`; on Linux this is
    /// an fdatasync of the range, enough because the file size never changes).
    pub fn flush(&self, pos: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check(pos, len)?;
        self.map.flush_range(pos as usize, len as usize).at(&self.path)
    }

    pub(crate) fn faulted_to(&self) -> &AtomicU64 {
        &self.faulted_to
    }

    /// `madvise` over `[pos, pos + len)`, clamped to the file. Advice never
    /// changes the file's bytes (only which pages are resident).
    pub(crate) fn advise(&self, advice: memmap2::Advice, pos: u64, len: u64) -> std::io::Result<()> {
        let end = pos.saturating_add(len).min(self.len);
        if pos >= end {
            return Ok(());
        }
        self.map.advise_range(advice, pos as usize, (end - pos) as usize)
    }

    /// How many of the file's pages are resident (`mincore`), for tests.
    #[cfg(test)]
    pub(crate) fn resident_pages(&self) -> std::io::Result<usize> {
        let pages = self.len.div_ceil(PAGE) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: the mapping is `len` bytes long and page aligned; `vec`
        // has one byte per page, as mincore requires.
        let rc = unsafe { libc::mincore(self.map.as_mut_ptr().cast(), self.len as usize, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count())
    }

    /// Faults in every page from `from` on by writing a zero to it. Only used
    /// on freshly created (all-zero) files, so the content does not change.
    fn warm_up(&self, from: u64) {
        let mut pos = from;
        while pos < self.len {
            // SAFETY: in bounds; a fresh file has no views and no other writer.
            unsafe { std::ptr::write_volatile(self.map.as_mut_ptr().add(pos as usize), 0u8) };
            pos += PAGE;
        }
    }
}

/// Reserves disk blocks for the whole file, so later writes through the map
/// cannot fail for lack of space.
fn preallocate(file: &File, len: u64) -> std::io::Result<()> {
    let len_off = libc::off_t::try_from(len)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "file too large"))?;
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
    match rc {
        0 => Ok(()),
        // Some file systems cannot reserve blocks; a sparse file still works,
        // it just loses the out-of-space guarantee.
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// Digits of a file name: every store file is named by the offset of its
/// first byte or unit, zero-padded so that names sort like offsets.
pub(crate) const OFFSET_NAME_DIGITS: usize = 20;

/// The file name for `offset`.
pub(crate) fn offset_name(offset: u64) -> String {
    format!("{offset:0width$}", width = OFFSET_NAME_DIGITS)
}

/// The offset a file name stands for, if it is exactly 20 digits.
pub(crate) fn parse_offset_name(name: &str) -> Option<u64> {
    if name.len() == OFFSET_NAME_DIGITS && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok()
    } else {
        None
    }
}

/// Fsyncs a directory so that file creations, renames and deletions in it
/// are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_through_lands_every_buffer_in_order_and_the_map_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = MappedFile::create(&dir.path().join("f"), 1 << 20, MapOptions::default()).unwrap();
        // More buffers than one pwritev takes (1024), some empty.
        let bufs: Vec<Vec<u8>> = (0..3000u32).map(|i| vec![(i % 251) as u8; (i % 7) as usize]).collect();
        let slices: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        let want: Vec<u8> = bufs.concat();
        unsafe { f.write_through(100, &slices).unwrap() };
        assert_eq!(unsafe { f.slice(100, want.len() as u64).unwrap() }, &want[..]);
        assert_eq!(unsafe { f.slice(0, 100).unwrap() }, &[0u8; 100][..]);
        // Past the end is an error, and nothing is written.
        assert!(unsafe { f.write_through((1 << 20) - 1, &[b"ab"]) }.is_err());
    }

    #[test]
    fn create_write_read_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = MappedFile::create(
            &path,
            8192,
            MapOptions {
                warm_up: true,
                mlock: false,
            },
        )
        .unwrap();
        unsafe { f.write(100, b"hello").unwrap() };
        assert_eq!(unsafe { f.slice(100, 5).unwrap() }, b"hello");
        assert_eq!(unsafe { f.nonzero_end(0).unwrap() }, 105);
        f.flush(0, 8192).unwrap();
        assert!(
            unsafe { f.write(8190, b"abc") }.is_err(),
            "writes past the end are refused"
        );
        drop(f);
        assert!(MappedFile::create(&path, 8192, MapOptions::default()).is_err());
        let f = MappedFile::open(&path, 8192, MapOptions::default()).unwrap();
        assert_eq!(unsafe { f.slice(100, 5).unwrap() }, b"hello");
    }

    #[test]
    fn short_file_is_extended_and_long_file_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let f = MappedFile::open(&path, 4096, MapOptions::default()).unwrap();
        assert_eq!(unsafe { f.slice(0, 4).unwrap() }, b"abc\0");
        drop(f);
        assert!(matches!(
            MappedFile::open(&path, 1024, MapOptions::default()),
            Err(StoreError::BadArgument(_))
        ));
    }
}
