//! A file's writes not yet fsynced: whole 4 KiB pages in memory, overlaid
//! on the backing file when read, written out in runs at fsync.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use fuser::Errno;

/// Granularity of pending data.
pub(super) const PAGE: u64 = 4096;
/// Largest single pwrite when an fsync writes runs of pending pages.
pub(super) const RUN_MAX: usize = 1 << 20;

/// Reads into `buf` from `off` until it is full or the file ends; returns the
/// bytes read (the rest of `buf` is left as it was).
pub(super) fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Writes not yet fsynced, for one inode.
#[derive(Default)]
pub(super) struct Pending {
    /// Page index -> the page's whole content (`PAGE` bytes).
    pub(super) pages: BTreeMap<u64, Box<[u8]>>,
    /// End of the furthest pending write; every page starts below it.
    pub(super) end: u64,
}

impl Pending {
    pub(super) fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The file's logical size given its backing file's size.
    pub(super) fn size(&self, backing_len: u64) -> u64 {
        backing_len.max(self.end)
    }

    /// Bytes of pending pages, up to `end`.
    pub(super) fn bytes(&self) -> u64 {
        self.pages
            .keys()
            .map(|&i| PAGE.min(self.end.saturating_sub(i * PAGE)))
            .sum()
    }

    /// Records `data` at `off`; `fill` supplies the current content of a page
    /// that is only partly overwritten (zeros past the end of the file).
    pub(super) fn write(
        &mut self,
        off: u64,
        data: &[u8],
        mut fill: impl FnMut(u64, &mut [u8]) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        if data.is_empty() {
            return Ok(());
        }
        let end = off.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        let mut pos = off;
        while pos < end {
            let idx = pos / PAGE;
            let start = idx * PAGE;
            let in_page = (pos - start) as usize;
            let n = (PAGE - in_page as u64).min(end - pos) as usize;
            let page = match self.pages.entry(idx) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
                    if n < PAGE as usize {
                        fill(start, &mut page)?;
                    }
                    v.insert(page)
                }
            };
            let from = (pos - off) as usize;
            page[in_page..in_page + n].copy_from_slice(&data[from..from + n]);
            pos += n as u64;
        }
        self.end = self.end.max(end);
        Ok(())
    }

    /// Copies the pending bytes that fall in `[off, off + buf.len())` over `buf`.
    pub(super) fn overlay(&self, off: u64, buf: &mut [u8]) {
        if buf.is_empty() {
            return;
        }
        let last = off + buf.len() as u64;
        for (&idx, page) in self.pages.range(off / PAGE..=(last - 1) / PAGE) {
            let start = idx * PAGE;
            let lo = start.max(off);
            let hi = (start + PAGE).min(last);
            buf[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&page[(lo - start) as usize..(hi - start) as usize]);
        }
    }

    /// Zeroes pending bytes in `[off, off + len)` (a punched or zeroed range).
    pub(super) fn zero(&mut self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        let last = off.saturating_add(len);
        for (&idx, page) in self.pages.range_mut(off / PAGE..=(last - 1) / PAGE) {
            let start = idx * PAGE;
            let lo = start.max(off);
            let hi = (start + PAGE).min(last);
            page[(lo - start) as usize..(hi - start) as usize].fill(0);
        }
    }

    /// The file was cut (or extended) to `size`: pages past it go, the tail of
    /// the page it falls in becomes zero (a later extension reads zeros).
    pub(super) fn truncate(&mut self, size: u64) {
        let first_gone = size.div_ceil(PAGE);
        self.pages.split_off(&first_gone);
        if !size.is_multiple_of(PAGE)
            && let Some(page) = self.pages.get_mut(&(size / PAGE))
        {
            page[(size % PAGE) as usize..].fill(0);
        }
        self.end = self.end.min(size);
    }

    /// Writes the pending pages to `file` in runs of consecutive pages and
    /// forgets them. On error they stay pending (rewriting them is harmless).
    pub(super) fn flush_to(&mut self, file: &File) -> io::Result<()> {
        if self.pages.is_empty() {
            return Ok(());
        }
        let size = self.size(file.metadata()?.len());
        let mut run: Vec<u8> = Vec::with_capacity(RUN_MAX.min(self.pages.len() * PAGE as usize));
        let mut run_start = 0u64;
        for (&idx, page) in &self.pages {
            let start = idx * PAGE;
            if start >= size {
                continue;
            }
            let len = PAGE.min(size - start) as usize;
            if !run.is_empty() && (run_start + run.len() as u64 != start || run.len() >= RUN_MAX) {
                file.write_all_at(&run, run_start)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = start;
            }
            run.extend_from_slice(&page[..len]);
        }
        if !run.is_empty() {
            file.write_all_at(&run, run_start)?;
        }
        self.pages.clear();
        self.end = 0;
        Ok(())
    }
}
