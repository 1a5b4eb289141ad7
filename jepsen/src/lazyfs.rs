//! A FUSE pass-through filesystem that loses writes not yet fsynced, after
//! Jepsen's LazyFS: the "lost un-fsynced writes on kill" fault. A node's data
//! directory is served through it; killing the node and calling
//! [`LazyFs::lose_unsynced`] then leaves on disk only what the node had made
//! durable, as a power loss would, where a plain `kill -9` leaves everything
//! it wrote in the host's page cache.
//!
//! How it works: `mount` serves `backing` (a real directory) at `mountpoint`
//! through a `fuser` session (pure-Rust mount: `mount(2)` as root, else
//! `fusermount3`; no libfuse). Every request is applied to the backing
//! directory except file data: a FUSE WRITE only lands in memory. FSYNC (fsync
//! or fdatasync, and msync(MS_SYNC), which the kernel turns into the dirty
//! pages' WRITEs followed by an FSYNC) writes the file's pending data to the
//! backing file with `pwrite` and fsyncs it. `lose_unsynced` unmounts (the
//! kernel first writes every dirty page back to us), forgets what is pending
//! and mounts again.
//!
//! Pending state, per inode: a map from 4 KiB page index to the page's full
//! content (a page first written partially is filled from the backing file),
//! plus `end`, the end of the furthest pending write. A read is the backing
//! file's bytes overlaid with the pending pages; the size is the larger of the
//! backing file's size and `end`. A pending page's bytes past the file's size
//! are zero, so truncating or extending needs no more than trimming pages.
//! An fsync writes runs of consecutive pending pages (never whole files), so a
//! 64 MiB segment msynced a little at a time costs what was written.
//!
//! Inodes are numbered in this daemon: a table maps inode numbers to paths
//! relative to the backing directory, updated on rename (with the renamed
//! directory's descendants) and unlink. Pending data hangs off the inode, so a
//! renamed file keeps it; an unlinked file's pending data lives while it is
//! open and is dropped after.
//!
//! Simplifications, against LazyFS proper:
//! - Metadata is durable at once: create, mknod, mkdir, unlink, rmdir, rename,
//!   symlink, chmod/chown/utimes, truncate and fallocate go straight to the
//!   backing directory, where LazyFS can also lose them. A truncate or an
//!   extending fallocate therefore survives a loss even if not fsynced (the
//!   file keeps its new size, zero-filled where data was lost).
//! - An fsync makes all of the file's pending data durable, whatever range the
//!   caller gave (FUSE FSYNC carries none): `msync` of one range also saves
//!   other dirty ranges that the kernel had already written back to us.
//! - No hard links (link returns EPERM), no extended attributes (ENOSYS, so
//!   the kernel answers EOPNOTSUPP), file locks are handled by the kernel.
//! - The daemon runs one request at a time (one session thread).
//! - A backing file's mtime moves when its data is fsynced, not at write().
//! - As root (the harness) backing files are always opened read-write; other
//!   users fall back to the caller's access mode where the file's mode says so.
//!
//! The kernel side: no `direct_io` (so mmap works) and no writeback cache
//! (the FUSE default), so each write() reaches the daemon before it returns.
//! Dirty pages of shared writable maps reach us as WRITEs at msync, at
//! munmap/exit (FUSE writes them back when a map is closed), at background
//! writeback or at unmount, and stay pending until an FSYNC. Files are opened
//! with `keep_cache`: every change goes through this mount, so the kernel's
//! page cache stays coherent with what we serve.
//!
//! The process that owns a `LazyFs` must not itself map files of the mount:
//! munmap writes dirty pages back while holding the process's mm lock, which
//! the serving thread needs as soon as it grows its heap, and both hang (seen
//! on Linux 6.18). Other processes (the nodes) may; the tests map files in
//! forked children for that reason. `lose_unsynced` and `unmount` block (they
//! wait for the kernel and for a busy mount): call them off async threads.

// The harness integrates the API; until then only the tests call it.
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use fuser::{
    AccessFlags, BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// Granularity of pending data.
const PAGE: u64 = 4096;
/// Largest single pwrite when an fsync writes runs of pending pages.
const RUN_MAX: usize = 1 << 20;
/// How long the kernel may cache attributes and entries: only this daemon
/// changes the backing directory while it is mounted.
const TTL: Duration = Duration::from_secs(1);
/// How long an unmount waits for the mount to stop being busy (a killed
/// process's files close as it exits).
const UNMOUNT_PATIENCE: Duration = Duration::from_secs(10);

/// What a simulated power loss dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossReport {
    /// Files that had writes not yet fsynced.
    pub files: usize,
    /// Bytes of the pending 4 KiB pages of those files (up to the end of their
    /// pending writes): an upper bound of the bytes written and not fsynced.
    pub bytes: u64,
}

/// A mounted lazy filesystem; see the module docs.
pub struct LazyFs {
    backing: PathBuf,
    mountpoint: PathBuf,
    state: Arc<Mutex<State>>,
    /// `None` once unmounted (or when a remount failed).
    session: Option<BackgroundSession>,
}

impl LazyFs {
    /// Mounts at `mountpoint` (an existing empty directory) a filesystem mirroring `backing` (an existing directory).
    pub fn mount(backing: &Path, mountpoint: &Path) -> anyhow::Result<LazyFs> {
        check_prerequisites()?;
        let backing = backing
            .canonicalize()
            .with_context(|| format!("lazyfs backing directory {}", backing.display()))?;
        let mountpoint = mountpoint
            .canonicalize()
            .with_context(|| format!("lazyfs mountpoint {}", mountpoint.display()))?;
        if !backing.is_dir() {
            bail!("lazyfs backing {} is not a directory", backing.display());
        }
        if !mountpoint.is_dir() {
            bail!("lazyfs mountpoint {} is not a directory", mountpoint.display());
        }
        let state = Arc::new(Mutex::new(State::new(backing.clone())));
        let session = spawn(&state, &mountpoint)?;
        Ok(LazyFs {
            backing,
            mountpoint,
            state,
            session: Some(session),
        })
    }

    /// Simulates a power loss: unmounts (the kernel first writes back dirty pages, including those of shared mmaps, to the daemon), drops every write that was not fsynced, and mounts again. Call when no process uses the mount (after kill -9 of the node).
    pub fn lose_unsynced(&mut self) -> anyhow::Result<LossReport> {
        self.unmount_session()?;
        let report = {
            let mut state = lock(&self.state);
            let report = state.loss_report();
            *state = State::new(self.backing.clone());
            report
        };
        self.session = Some(spawn(&self.state, &self.mountpoint)?);
        Ok(report)
    }

    /// Writes every pending write to the backing files (no loss) and unmounts.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        self.unmount_session()?;
        self.flush_all()
    }

    /// Unmounts and waits for the session thread to end, so that every dirty
    /// page the kernel held has been handed to us. On failure (still busy),
    /// stays mounted.
    fn unmount_session(&mut self) -> anyhow::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // A session that ended already was unmounted by someone else.
        if !session.guard.is_finished()
            && let Err(e) = umount(&self.mountpoint)
        {
            self.session = Some(session);
            return Err(e);
        }
        session
            .join()
            .with_context(|| format!("lazyfs session at {} ended with an error", self.mountpoint.display()))
    }

    /// Writes every file's pending data to its backing file and fsyncs it.
    fn flush_all(&self) -> anyhow::Result<()> {
        let mut state = lock(&self.state);
        let inos: Vec<u64> = state
            .inodes
            .iter()
            .filter(|(_, i)| !i.pending.is_empty())
            .map(|(&n, _)| n)
            .collect();
        let mut failed = 0;
        for ino in inos {
            // An unlinked file that nobody holds open has nowhere to go.
            if state
                .inodes
                .get(&ino)
                .is_some_and(|i| i.path.is_none() && i.file.is_none())
            {
                continue;
            }
            if state.sync_inode(ino, false).is_err() {
                failed += 1;
            }
        }
        if failed > 0 {
            bail!(
                "lazyfs: {failed} files' pending writes could not be written to {}",
                self.backing.display()
            );
        }
        Ok(())
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if self.session.is_none() {
            return;
        }
        if let Err(e) = self.unmount_session() {
            eprintln!("lazyfs: {e:#}; leaving {} mounted", self.mountpoint.display());
            // Dropping the session detaches its thread; keep what it got so far.
            self.session = None;
        }
        if let Err(e) = self.flush_all() {
            eprintln!("{e:#}");
        }
    }
}

// The harness may hold a `LazyFs` across awaits and move it to blocking threads.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<LazyFs>();
};

/// Fails with what is missing when this machine cannot mount FUSE filesystems.
fn check_prerequisites() -> anyhow::Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("lazyfs needs /dev/fuse (the fuse kernel module; in a container, the device must be passed in)");
    }
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        bail!("lazyfs cannot open /dev/fuse: {e} (run as root, or give this user the device)");
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && find_in_path("fusermount3").is_none() {
        bail!("lazyfs needs root, or fusermount3 (Debian package fuse3) to mount as another user");
    }
    Ok(())
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Mounts a fresh session serving `state` at `mountpoint`.
fn spawn(state: &Arc<Mutex<State>>, mountpoint: &Path) -> anyhow::Result<BackgroundSession> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("lazyfs".to_string()),
        MountOption::Subtype("lazyfs".to_string()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    let fs = Lazy { state: state.clone() };
    fuser::spawn_mount(fs, mountpoint, &config).with_context(|| {
        format!(
            "mounting lazyfs at {} (needs /dev/fuse, and root or fusermount3 from fuse3)",
            mountpoint.display()
        )
    })
}

/// A plain (not lazy) unmount, so that the kernel writes dirty pages back
/// first; waits while the mount is busy.
fn umount(mountpoint: &Path) -> anyhow::Result<()> {
    let c = CString::new(mountpoint.as_os_str().as_bytes()).context("mountpoint path with a NUL byte")?;
    let deadline = Instant::now() + UNMOUNT_PATIENCE;
    loop {
        // SAFETY: `c` is a valid NUL-terminated path.
        let err = if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(());
        } else {
            io::Error::last_os_error()
        };
        match err.raw_os_error() {
            Some(libc::EBUSY) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Some(libc::EINTR) => {}
            // Not root: the setuid helper may unmount what its user mounted.
            Some(libc::EPERM) => {
                let out = Command::new("fusermount3")
                    .arg("-u")
                    .arg("--")
                    .arg(mountpoint)
                    .output()
                    .context("running fusermount3 -u")?;
                if out.status.success() {
                    return Ok(());
                }
                let stderr = String::from_utf8_lossy(&out.stderr);
                if !stderr.contains("busy") || Instant::now() >= deadline {
                    bail!("fusermount3 -u {} failed: {}", mountpoint.display(), stderr.trim());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => return Err(err).with_context(|| format!("unmounting lazyfs at {}", mountpoint.display())),
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic elsewhere must not take the filesystem down with it.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn cpath(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// The errno of a failed libc call.
fn last_errno() -> Errno {
    Errno::from(io::Error::last_os_error())
}

/// An unexpected failure on the data path: logged, and its errno (else EIO) returned.
fn data_error(what: &str, path: Option<&Path>, e: io::Error) -> Errno {
    let path = path
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "(unlinked)".to_string());
    eprintln!("lazyfs: {what} {path}: {e}");
    Errno::from(e)
}

/// Reads into `buf` from `off` until it is full or the file ends; returns the
/// bytes read (the rest of `buf` is left as it was).
fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
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
struct Pending {
    /// Page index -> the page's whole content (`PAGE` bytes).
    pages: BTreeMap<u64, Box<[u8]>>,
    /// End of the furthest pending write; every page starts below it.
    end: u64,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The file's logical size given its backing file's size.
    fn size(&self, backing_len: u64) -> u64 {
        backing_len.max(self.end)
    }

    /// Bytes of pending pages, up to `end`.
    fn bytes(&self) -> u64 {
        self.pages
            .keys()
            .map(|&i| PAGE.min(self.end.saturating_sub(i * PAGE)))
            .sum()
    }

    /// Records `data` at `off`; `fill` supplies the current content of a page
    /// that is only partly overwritten (zeros past the end of the file).
    fn write(
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
    fn overlay(&self, off: u64, buf: &mut [u8]) {
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
    fn zero(&mut self, off: u64, len: u64) {
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
    fn truncate(&mut self, size: u64) {
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
    fn flush_to(&mut self, file: &File) -> io::Result<()> {
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

struct Inode {
    /// Relative to the backing directory; `None` once unlinked or replaced.
    path: Option<PathBuf>,
    /// The backing file, shared by this inode's open handles.
    file: Option<File>,
    /// Whether `file` was opened for writing.
    writable: bool,
    /// Open file handles.
    open: usize,
    pending: Pending,
}

impl Inode {
    fn new(path: PathBuf) -> Inode {
        Inode {
            path: Some(path),
            file: None,
            writable: false,
            open: 0,
            pending: Pending::default(),
        }
    }
}

struct DirEntry {
    ino: u64,
    kind: FileType,
    name: OsString,
}

enum Handle {
    File {
        ino: u64,
    },
    /// A directory's entries as of opendir, so offsets stay stable.
    Dir {
        entries: Vec<DirEntry>,
    },
}

/// Everything the daemon knows; outlives sessions so that, once a session has
/// ended, the pending writes can be dropped or written out.
struct State {
    backing: PathBuf,
    inodes: HashMap<u64, Inode>,
    by_path: HashMap<PathBuf, u64>,
    next_ino: u64,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
}

impl State {
    fn new(backing: PathBuf) -> State {
        let mut state = State {
            backing,
            inodes: HashMap::new(),
            by_path: HashMap::new(),
            next_ino: INodeNo::ROOT.0 + 1,
            handles: HashMap::new(),
            next_fh: 1,
        };
        state.inodes.insert(INodeNo::ROOT.0, Inode::new(PathBuf::new()));
        state.by_path.insert(PathBuf::new(), INodeNo::ROOT.0);
        state
    }

    fn loss_report(&self) -> LossReport {
        let lossy = self.inodes.values().filter(|i| !i.pending.is_empty());
        LossReport {
            files: lossy.clone().count(),
            bytes: lossy.map(|i| i.pending.bytes()).sum(),
        }
    }

    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.backing.clone()
        } else {
            self.backing.join(rel)
        }
    }

    fn rel_path(&self, ino: u64) -> Result<&Path, Errno> {
        self.inodes
            .get(&ino)
            .and_then(|i| i.path.as_deref())
            .ok_or(Errno::ENOENT)
    }

    fn full_path(&self, ino: u64) -> Result<PathBuf, Errno> {
        Ok(self.full(self.rel_path(ino)?))
    }

    /// `name` in directory `parent`, relative to the backing directory.
    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
            return Err(Errno::EINVAL);
        }
        Ok(self.rel_path(parent)?.join(name))
    }

    /// The inode number of `rel`, allocated on first sight.
    fn ino_for(&mut self, rel: &Path) -> u64 {
        if let Some(&ino) = self.by_path.get(rel) {
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, Inode::new(rel.to_path_buf()));
        self.by_path.insert(rel.to_path_buf(), ino);
        ino
    }

    /// `rel` no longer names its inode (unlinked or replaced by a rename): its
    /// pending data lives on only while the inode is open.
    fn detach(&mut self, rel: &Path) {
        let Some(ino) = self.by_path.remove(rel) else { return };
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.path = None;
            if inode.open == 0 {
                self.inodes.remove(&ino);
            }
        }
    }

    /// Removes `rel` and everything below it from the path table; returns the
    /// inodes with their paths relative to `rel`.
    fn take_subtree(&mut self, rel: &Path) -> Vec<(PathBuf, u64)> {
        let paths: Vec<PathBuf> = self.by_path.keys().filter(|p| p.starts_with(rel)).cloned().collect();
        let mut taken = Vec::with_capacity(paths.len());
        for p in paths {
            if let (Some(ino), Ok(suffix)) = (self.by_path.remove(&p), p.strip_prefix(rel)) {
                taken.push((suffix.to_path_buf(), ino));
            }
        }
        taken
    }

    fn put_subtree(&mut self, rel: &Path, entries: Vec<(PathBuf, u64)>) {
        for (suffix, ino) in entries {
            let path = if suffix.as_os_str().is_empty() {
                rel.to_path_buf()
            } else {
                rel.join(&suffix)
            };
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.path = Some(path.clone());
            }
            self.by_path.insert(path, ino);
        }
    }

    fn attr(&self, ino: u64, meta: &Metadata) -> FileAttr {
        let kind = FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile);
        let mut size = meta.len();
        if kind == FileType::RegularFile
            && let Some(inode) = self.inodes.get(&ino)
        {
            size = inode.pending.size(size);
        }
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: meta.blocks(),
            atime: system_time(meta.atime(), meta.atime_nsec()),
            mtime: system_time(meta.mtime(), meta.mtime_nsec()),
            ctime: system_time(meta.ctime(), meta.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (meta.mode() & 0o7777) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: meta.blksize() as u32,
            flags: 0,
        }
    }

    /// Attributes of `ino`: from its path, or from its open file once unlinked.
    fn stat(&self, ino: u64) -> Result<FileAttr, Errno> {
        let inode = self.inodes.get(&ino).ok_or(Errno::ENOENT)?;
        let meta = match (&inode.path, &inode.file) {
            (Some(rel), _) => fs::symlink_metadata(self.full(rel))?,
            (None, Some(file)) => file.metadata()?,
            (None, None) => return Err(Errno::ENOENT),
        };
        Ok(self.attr(ino, &meta))
    }

    /// Looks up `rel` in the backing directory and returns its attributes.
    fn entry(&mut self, rel: &Path) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(self.full(rel))?;
        let ino = self.ino_for(rel);
        Ok(self.attr(ino, &meta))
    }

    /// Makes sure `ino` has its backing file open.
    fn ensure_file(&mut self, ino: u64) -> Result<(), Errno> {
        let full = self.full_path(ino).ok();
        let inode = self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        if inode.file.is_none() {
            let (file, writable) = open_backing(&full.ok_or(Errno::ENOENT)?)?;
            inode.file = Some(file);
            inode.writable = writable;
        }
        Ok(())
    }

    /// Runs `f` with a writable descriptor of `ino`'s backing file (the open
    /// one, else one opened by path for this call) and its pending data.
    fn with_writable<R>(
        &mut self,
        ino: u64,
        f: impl FnOnce(&File, &mut Pending) -> Result<R, Errno>,
    ) -> Result<R, Errno> {
        let path = self.full_path(ino).ok();
        let inode = self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        let opened;
        let file = match &inode.file {
            Some(file) if inode.writable => file,
            _ => {
                let p = path.as_deref().ok_or(Errno::EBADF)?;
                let rw = OpenOptions::new().read(true).write(true).open(p);
                opened = rw.or_else(|_| OpenOptions::new().write(true).open(p))?;
                &opened
            }
        };
        f(file, &mut inode.pending)
    }

    fn open_handle(&mut self, ino: u64) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle::File { ino });
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.open += 1;
        }
        fh
    }

    fn release(&mut self, fh: u64) {
        let Some(Handle::File { ino }) = self.handles.remove(&fh) else {
            return;
        };
        let Some(inode) = self.inodes.get_mut(&ino) else { return };
        inode.open = inode.open.saturating_sub(1);
        if inode.open == 0 {
            inode.file = None;
            if inode.path.is_none() {
                self.inodes.remove(&ino);
            }
        }
    }

    fn read(&mut self, ino: u64, off: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.ensure_file(ino)?;
        let path = self.full_path(ino).ok();
        let inode = self.inodes.get(&ino).ok_or(Errno::ENOENT)?;
        let file = inode.file.as_ref().ok_or(Errno::EBADF)?;
        let backing_len = file
            .metadata()
            .map_err(|e| data_error("fstat", path.as_deref(), e))?
            .len();
        let len = inode.pending.size(backing_len);
        if off >= len {
            return Ok(Vec::new());
        }
        let n = (size as u64).min(len - off) as usize;
        let mut buf = vec![0u8; n];
        if off < backing_len {
            read_full_at(file, &mut buf, off).map_err(|e| data_error("read", path.as_deref(), e))?;
        }
        inode.pending.overlay(off, &mut buf);
        Ok(buf)
    }

    fn write(&mut self, ino: u64, off: u64, data: &[u8]) -> Result<(), Errno> {
        self.ensure_file(ino)?;
        let path = self.full_path(ino).ok();
        let inode = self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        let file = inode.file.as_ref().ok_or(Errno::EBADF)?;
        let fill = |start: u64, page: &mut [u8]| {
            read_full_at(file, page, start)
                .map(|_| ())
                .map_err(|e| data_error("read", path.as_deref(), e))
        };
        inode.pending.write(off, data, fill)
    }

    /// Writes `ino`'s pending data to its backing file and fsyncs that.
    fn sync_inode(&mut self, ino: u64, datasync: bool) -> Result<(), Errno> {
        let path = self.full_path(ino).ok();
        let sync = |file: &File, pending: &mut Pending| {
            pending
                .flush_to(file)
                .map_err(|e| data_error("write back", path.as_deref(), e))?;
            let synced = if datasync { file.sync_data() } else { file.sync_all() };
            synced.map_err(|e| data_error("fsync", path.as_deref(), e))
        };
        let inode = self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        match &inode.file {
            // Nothing to write: fsync through whatever descriptor is open.
            Some(file) if inode.pending.is_empty() => sync(file, &mut inode.pending),
            _ => self.with_writable(ino, sync),
        }
    }

    /// Truncates (or extends) `ino` to `size`, in the backing file at once.
    fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        self.with_writable(ino, |file, pending| {
            file.set_len(size)?;
            pending.truncate(size);
            Ok(())
        })
    }

    fn fallocate(&mut self, ino: u64, off: u64, len: u64, mode: i32) -> Result<(), Errno> {
        // Modes that move data (collapse, insert) would have to shift pending pages.
        let supported = libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !supported != 0 {
            return Err(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let (Ok(off_i), Ok(len_i)) = (i64::try_from(off), i64::try_from(len)) else {
            return Err(Errno::EFBIG);
        };
        self.with_writable(ino, |file, pending| {
            // SAFETY: a valid descriptor; fallocate has no memory arguments.
            if unsafe { libc::fallocate(file.as_raw_fd(), mode, off_i, len_i) } != 0 {
                return Err(last_errno());
            }
            if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                pending.zero(off, len);
            }
            Ok(())
        })
    }

    fn opendir(&mut self, ino: u64) -> Result<u64, Errno> {
        let rel = self.rel_path(ino)?.to_path_buf();
        let parent = rel.parent().map(|p| self.ino_for(p)).unwrap_or(INodeNo::ROOT.0);
        let mut entries = vec![
            DirEntry {
                ino,
                kind: FileType::Directory,
                name: ".".into(),
            },
            DirEntry {
                ino: parent,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        for entry in fs::read_dir(self.full(&rel))? {
            let entry = entry?;
            let kind = entry
                .file_type()
                .ok()
                .and_then(FileType::from_std)
                .unwrap_or(FileType::RegularFile);
            let name = entry.file_name();
            let ino = self.ino_for(&rel.join(&name));
            entries.push(DirEntry { ino, kind, name });
        }
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle::Dir { entries });
        Ok(fh)
    }

    fn rename(&mut self, from: &Path, to: &Path, flags: RenameFlags) -> Result<(), Errno> {
        let (old, new) = (self.full(from), self.full(to));
        if flags.is_empty() {
            fs::rename(&old, &new)?;
        } else {
            if flags.contains(RenameFlags::RENAME_WHITEOUT) {
                return Err(Errno::EINVAL);
            }
            let (o, n) = (cpath(&old)?, cpath(&new)?);
            // SAFETY: valid NUL-terminated paths.
            let r = unsafe { libc::renameat2(libc::AT_FDCWD, o.as_ptr(), libc::AT_FDCWD, n.as_ptr(), flags.bits()) };
            if r != 0 {
                return Err(last_errno());
            }
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let (a, b) = (self.take_subtree(from), self.take_subtree(to));
            self.put_subtree(to, a);
            self.put_subtree(from, b);
        } else if from != to {
            self.detach(to);
            let moved = self.take_subtree(from);
            self.put_subtree(to, moved);
        }
        Ok(())
    }

    /// New nodes belong to the caller, as on a local filesystem (we run as root).
    fn chown_to_caller(&self, rel: &Path, req: &Request) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || (req.uid() == 0 && req.gid() == 0) {
            return;
        }
        if let Err(e) = std::os::unix::fs::lchown(self.full(rel), Some(req.uid()), Some(req.gid())) {
            eprintln!("lazyfs: chown {}: {e}", rel.display());
        }
    }
}

/// Opens a backing file read-write whatever the caller asked, so reads and
/// fsyncs can share it; else read-only (pending pages are filled by reading),
/// else write-only. Returns whether it is writable.
fn open_backing(path: &Path) -> Result<(File, bool), Errno> {
    if let Ok(file) = OpenOptions::new().read(true).write(true).open(path) {
        return Ok((file, true));
    }
    match File::open(path) {
        Ok(file) => Ok((file, false)),
        Err(_) => Ok((OpenOptions::new().write(true).open(path)?, true)),
    }
}

fn system_time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = Duration::from_nanos(nsecs.clamp(0, 999_999_999) as u64);
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, libc::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, libc::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
            Err(e) => {
                let d = e.duration();
                let (s, n) = (-(d.as_secs() as i64), d.subsec_nanos() as i64);
                if n == 0 { (s, 0) } else { (s - 1, 1_000_000_000 - n) }
            }
        },
    };
    libc::timespec { tv_sec, tv_nsec }
}

/// The `fuser` filesystem: each request locks the shared state.
struct Lazy {
    state: Arc<Mutex<State>>,
}

impl Lazy {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setattr(
        &self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> Result<FileAttr, Errno> {
        let mut st = self.state();
        let full = st.full_path(ino).ok();
        // An unlinked but open file is reached through its descriptor.
        let fd = || st.inodes.get(&ino).and_then(|i| i.file.as_ref()).ok_or(Errno::ENOENT);
        if let Some(mode) = mode {
            let perm = fs::Permissions::from_mode(mode & 0o7777);
            match &full {
                Some(p) => fs::set_permissions(p, perm)?,
                None => fd()?.set_permissions(perm)?,
            }
        }
        if uid.is_some() || gid.is_some() {
            match &full {
                Some(p) => std::os::unix::fs::lchown(p, uid, gid)?,
                None => std::os::unix::fs::fchown(fd()?, uid, gid)?,
            }
        }
        if atime.is_some() || mtime.is_some() {
            let times = [timespec(atime), timespec(mtime)];
            // SAFETY: valid path or descriptor, and a two-element timespec array.
            let r = match &full {
                Some(p) => {
                    let c = cpath(p)?;
                    unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }
                }
                None => unsafe { libc::futimens(fd()?.as_raw_fd(), times.as_ptr()) },
            };
            if r != 0 {
                return Err(last_errno());
            }
        }
        if let Some(size) = size {
            st.truncate(ino, size)?;
        }
        st.stat(ino)
    }

    fn do_create(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64), Errno> {
        let mut st = self.state();
        let rel = st.child(parent, name)?;
        let full = st.full(&rel);
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).mode(mode & 0o7777);
        if flags & libc::O_EXCL != 0 {
            opts.create_new(true)
        } else {
            opts.create(true)
        };
        let (file, writable) = match opts.open(&full) {
            Ok(file) => (file, true),
            // An existing file we may not write (non-root): open it as the caller asked.
            Err(e) if e.raw_os_error() == Some(libc::EACCES) && flags & libc::O_EXCL == 0 => open_backing(&full)?,
            Err(e) => return Err(e.into()),
        };
        let existed = st.by_path.contains_key(&rel);
        st.chown_to_caller(&rel, req);
        let ino = st.ino_for(&rel);
        if let Some(inode) = st.inodes.get_mut(&ino)
            && inode.file.is_none()
        {
            inode.file = Some(file);
            inode.writable = writable;
        }
        if existed && flags & libc::O_TRUNC != 0 {
            st.truncate(ino, 0)?;
        }
        let fh = st.open_handle(ino);
        match st.stat(ino) {
            Ok(attr) => Ok((attr, fh)),
            Err(e) => {
                st.release(fh);
                Err(e)
            }
        }
    }

    fn do_open(&self, ino: u64, flags: i32) -> Result<u64, Errno> {
        let mut st = self.state();
        let accmode = flags & libc::O_ACCMODE;
        st.ensure_file(ino)?;
        if flags & libc::O_TRUNC != 0 && accmode != libc::O_RDONLY {
            st.truncate(ino, 0)?;
        }
        Ok(st.open_handle(ino))
    }

    /// mknod, mkdir and symlink: `make` creates the node at its backing path.
    fn do_make(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        make: impl FnOnce(&Path) -> Result<(), Errno>,
    ) -> Result<FileAttr, Errno> {
        let mut st = self.state();
        let rel = st.child(parent, name)?;
        make(&st.full(&rel))?;
        st.chown_to_caller(&rel, req);
        st.entry(&rel)
    }

    fn do_remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut st = self.state();
        let rel = st.child(parent, name)?;
        let full = st.full(&rel);
        if dir {
            fs::remove_dir(full)?
        } else {
            fs::remove_file(full)?
        }
        st.detach(&rel);
        Ok(())
    }
}

impl Filesystem for Lazy {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.state();
        match st.child(parent.0, name).and_then(|rel| st.entry(&rel)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().stat(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.do_setattr(ino.0, mode, uid, gid, size, atime, mtime) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let target = self
            .state()
            .full_path(ino.0)
            .and_then(|p| fs::read_link(p).map_err(Errno::from));
        match target {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let make = |p: &Path| {
            let c = cpath(p)?;
            // SAFETY: a valid NUL-terminated path.
            if unsafe { libc::mknod(c.as_ptr(), (mode & !umask) as libc::mode_t, rdev as libc::dev_t) } != 0 {
                return Err(last_errno());
            }
            Ok(())
        };
        match self.do_make(req, parent.0, name, make) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let make = |p: &Path| Ok(fs::DirBuilder::new().mode(mode & !umask & 0o7777).create(p)?);
        match self.do_make(req, parent.0, name, make) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.do_remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.do_remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let make = |p: &Path| Ok(std::os::unix::fs::symlink(target, p)?);
        match self.do_make(req, parent.0, link_name, make) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        let paths = st
            .child(parent.0, name)
            .and_then(|from| Ok((from, st.child(newparent.0, newname)?)));
        match paths.and_then(|(from, to)| st.rename(&from, &to, flags)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr, reply: ReplyEntry) {
        // One path per inode in the table: hard links are not supported.
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.do_open(ino.0, flags.0) {
            // keep_cache: every change goes through us, so the page cache is never stale.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.state().read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Ok(len) = u32::try_from(data.len()) else {
            return reply.error(Errno::EINVAL);
        };
        match self.state().write(ino.0, offset, data) {
            Ok(()) => reply.written(len),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(): promises no durability.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.state().release(fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        match self.state().sync_inode(ino.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let st = self.state();
        let Some(Handle::Dir { entries }) = st.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, e) in entries
            .iter()
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        {
            if reply.add(INodeNo(e.ino), i as u64 + 1, e.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.state().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let synced = self.state().full_path(ino.0).and_then(|p| {
            let dir = File::open(&p)?;
            if datasync {
                dir.sync_data()?
            } else {
                dir.sync_all()?
            };
            Ok(())
        });
        match synced {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = match cpath(&self.state().backing) {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        // SAFETY: a valid path and a zeroed out-parameter of the right type.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(last_errno());
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let c = match self.state().full_path(ino.0).and_then(|p| cpath(&p)) {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), mask.bits()) } != 0 {
            return reply.error(last_errno());
        }
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.do_create(req, parent.0, name, mode & !umask, flags) {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.state().fallocate(ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::panic::AssertUnwindSafe;

    use memmap2::MmapMut;

    use super::*;

    /// A backing and a mount directory in a fresh temporary directory.
    struct Dirs {
        backing: PathBuf,
        mnt: PathBuf,
        // Last: removed after the mount is gone.
        _tmp: tempfile::TempDir,
    }

    /// An empty file, open for reading and writing.
    fn new_file(path: &Path) -> std::fs::File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap()
    }

    fn dirs() -> Dirs {
        let tmp = tempfile::Builder::new()
            .prefix("lazyfs-test-")
            .tempdir()
            .expect("temporary directory");
        let (backing, mnt) = (tmp.path().join("backing"), tmp.path().join("mnt"));
        fs::create_dir(&backing).expect("backing directory");
        fs::create_dir(&mnt).expect("mount directory");
        Dirs {
            backing,
            mnt,
            _tmp: tmp,
        }
    }

    /// Mounting is required: without it the tests fail, naming what is missing.
    fn mount(d: &Dirs) -> LazyFs {
        LazyFs::mount(&d.backing, &d.mnt)
            .unwrap_or_else(|e| panic!("lazyfs tests need FUSE (root or fusermount3 from fuse3, and /dev/fuse): {e:#}"))
    }

    /// Runs `f` in a forked child and returns its exit code. Mapped writes
    /// must come from another process than the one serving the mount (see the
    /// module docs); the child only makes system calls, nothing that could
    /// wait for a lock another thread of ours held at fork.
    fn in_child(f: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child runs `f` (system calls only) and exits without unwinding.
        match unsafe { libc::fork() } {
            -1 => panic!("fork: {}", io::Error::last_os_error()),
            0 => {
                let code = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(101);
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut status = 0;
                loop {
                    // SAFETY: our own child; `status` is a valid out-parameter.
                    if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
                        break;
                    }
                    let e = io::Error::last_os_error();
                    assert_eq!(e.kind(), io::ErrorKind::Interrupted, "waitpid: {e}");
                }
                if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                }
            }
        }
    }

    fn fallocate(file: &File, len: i64) {
        // SAFETY: a valid descriptor.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        assert_eq!(r, 0, "posix_fallocate: {}", io::Error::from_raw_os_error(r));
    }

    #[test]
    fn lose_unsynced_drops_unsynced_data_and_keeps_fsynced_data() {
        let d = dirs();
        let mut lazy = mount(&d);
        let (unsynced, synced, rewritten) = (d.mnt.join("unsynced"), d.mnt.join("synced"), d.mnt.join("rewritten"));

        fs::write(&unsynced, b"hello, page cache").unwrap();
        let mut f = File::create(&synced).unwrap();
        f.write_all(b"hello, disk").unwrap();
        f.sync_all().unwrap();
        drop(f);
        let mut f = File::create(&rewritten).unwrap();
        f.write_all(b"version 1").unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"VERSION 2", 0).unwrap();
        drop(f);

        // Read-after-write sees everything; the backing files only what was fsynced.
        assert_eq!(fs::read(&unsynced).unwrap(), b"hello, page cache");
        assert_eq!(fs::read(&synced).unwrap(), b"hello, disk");
        assert_eq!(fs::read(&rewritten).unwrap(), b"VERSION 2");
        assert_eq!(fs::metadata(&unsynced).unwrap().len(), 17);
        assert_eq!(fs::read(d.backing.join("unsynced")).unwrap(), b"");
        assert_eq!(fs::read(d.backing.join("synced")).unwrap(), b"hello, disk");

        let report = lazy.lose_unsynced().unwrap();
        assert_eq!(report.files, 2, "{report:?}");
        assert!(report.bytes >= 17 + 9, "{report:?}");

        // The files exist (metadata is durable) with their last fsynced content.
        assert_eq!(fs::read(&unsynced).unwrap(), b"");
        assert_eq!(fs::read(&synced).unwrap(), b"hello, disk");
        assert_eq!(fs::read(&rewritten).unwrap(), b"version 1");
        // Nothing left to lose.
        assert_eq!(lazy.lose_unsynced().unwrap(), LossReport::default());
        lazy.unmount().unwrap();
    }

    #[test]
    fn fsynced_prefix_survives_and_truncate_and_rename_carry_pending_data() {
        let d = dirs();
        let mut lazy = mount(&d);

        // fsync, then more writes: only the fsynced prefix survives.
        let log = d.mnt.join("log");
        let mut f = OpenOptions::new().create(true).append(true).open(&log).unwrap();
        f.write_all(&[b'a'; 10_000]).unwrap();
        f.sync_data().unwrap();
        f.write_all(&[b'b'; 10_000]).unwrap();
        drop(f);
        let mut expected = vec![b'a'; 10_000];
        expected.extend([b'b'; 10_000]);
        assert_eq!(fs::read(&log).unwrap(), expected);

        // A truncate trims pending pages: extending again reads zeros.
        let cut = d.mnt.join("cut");
        let f = File::create(&cut).unwrap();
        f.write_all_at(&[b'q'; 8192], 0).unwrap();
        f.set_len(100).unwrap();
        f.set_len(8192).unwrap();
        let mut expected_cut = vec![b'q'; 100];
        expected_cut.resize(8192, 0);
        assert_eq!(fs::read(&cut).unwrap(), expected_cut);
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(fs::read(d.backing.join("cut")).unwrap(), expected_cut);

        // A truncate of unsynced data is durable metadata: the size stays, the data goes.
        let shrunk = d.mnt.join("shrunk");
        let f = File::create(&shrunk).unwrap();
        f.write_all_at(&[b'x'; 6000], 0).unwrap();
        f.sync_all().unwrap();
        f.write_all_at(&[b'y'; 6000], 6000).unwrap();
        f.set_len(9000).unwrap();
        drop(f);
        let mut expected_shrunk = vec![b'x'; 6000];
        expected_shrunk.extend([b'y'; 3000]);
        assert_eq!(fs::read(&shrunk).unwrap(), expected_shrunk);

        // Renamed files (and files in renamed directories) keep their pending data.
        fs::write(d.mnt.join("meta.tmp"), b"term=7").unwrap();
        fs::rename(d.mnt.join("meta.tmp"), d.mnt.join("meta")).unwrap();
        assert_eq!(fs::read(d.mnt.join("meta")).unwrap(), b"term=7");
        File::open(d.mnt.join("meta")).unwrap().sync_all().unwrap();
        fs::create_dir(d.mnt.join("dir")).unwrap();
        fs::write(d.mnt.join("dir/inner"), b"inner data").unwrap();
        fs::rename(d.mnt.join("dir"), d.mnt.join("moved")).unwrap();
        File::open(d.mnt.join("moved/inner")).unwrap().sync_all().unwrap();
        fs::write(d.mnt.join("lost.tmp"), b"never synced").unwrap();
        fs::rename(d.mnt.join("lost.tmp"), d.mnt.join("lost")).unwrap();
        // Renamed over: the old file's pending data goes with it.
        fs::write(d.mnt.join("over"), b"old").unwrap();
        fs::write(d.mnt.join("over.tmp"), b"new").unwrap();
        File::open(d.mnt.join("over.tmp")).unwrap().sync_all().unwrap();
        fs::rename(d.mnt.join("over.tmp"), d.mnt.join("over")).unwrap();

        let report = lazy.lose_unsynced().unwrap();
        assert_eq!(report.files, 3, "log, shrunk and lost: {report:?}");

        assert_eq!(fs::read(&log).unwrap(), vec![b'a'; 10_000]);
        assert_eq!(fs::read(&cut).unwrap(), expected_cut);
        let mut expected_shrunk = vec![b'x'; 6000];
        expected_shrunk.resize(9000, 0);
        assert_eq!(fs::read(&shrunk).unwrap(), expected_shrunk);
        assert_eq!(fs::read(d.mnt.join("meta")).unwrap(), b"term=7");
        assert_eq!(fs::read(d.mnt.join("moved/inner")).unwrap(), b"inner data");
        assert_eq!(fs::read(d.mnt.join("lost")).unwrap(), b"");
        assert_eq!(fs::read(d.mnt.join("over")).unwrap(), b"new");
        assert!(!d.mnt.join("meta.tmp").exists() && !d.mnt.join("dir").exists());
        lazy.unmount().unwrap();
    }

    #[test]
    fn mmap_msynced_range_survives_and_unflushed_pages_are_lost() {
        const LEN: usize = 1 << 20;
        let d = dirs();
        let mut lazy = mount(&d);
        let path = d.mnt.join("segment");
        let file = new_file(&path);
        fallocate(&file, LEN as i64);
        assert_eq!(file.metadata().unwrap().len(), LEN as u64);

        let code = in_child(|| {
            // SAFETY: nothing else maps or truncates the file meanwhile.
            let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
                return 2;
            };
            map[100..200].fill(1);
            map[4000..4200].fill(2);
            if map.flush_range(0, 8192).is_err() {
                return 3;
            }
            map[300_000..300_100].fill(3);
            map[LEN - 10..].fill(4);
            0
        });
        assert_eq!(code, 0, "child failed");
        // As the node dies: kill -9 with a dirty map.
        let code = in_child(|| {
            // SAFETY: nothing else maps or truncates the file meanwhile.
            let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
                return 2;
            };
            map[600_000..600_100].fill(5);
            // SAFETY: kills this (child) process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            4
        });
        assert_eq!(code, 128 + libc::SIGKILL, "child not killed");
        // The unmaps wrote the unflushed pages back to the daemon: readable, not durable.
        let data = fs::read(&path).unwrap();
        assert!(data[300_000..300_100].iter().all(|&b| b == 3));
        assert!(data[600_000..600_100].iter().all(|&b| b == 5));
        assert!(data[LEN - 10..].iter().all(|&b| b == 4));
        drop(file);

        let report = lazy.lose_unsynced().unwrap();
        assert_eq!(report.files, 1, "{report:?}");
        let data = fs::read(&path).unwrap();
        assert_eq!(data.len(), LEN);
        assert!(data[100..200].iter().all(|&b| b == 1));
        assert!(data[4000..4200].iter().all(|&b| b == 2));
        let nonzero = data
            .iter()
            .enumerate()
            .filter(|&(i, &b)| b != 0 && !(100..200).contains(&i));
        assert_eq!(nonzero.count(), 200, "only the msynced bytes are left");
        lazy.unmount().unwrap();
    }

    #[test]
    fn unmount_writes_every_pending_write() {
        let d = dirs();
        let lazy = mount(&d);
        fs::create_dir(d.mnt.join("sub")).unwrap();
        fs::write(d.mnt.join("sub/plain"), b"written, never fsynced").unwrap();
        std::os::unix::fs::symlink("plain", d.mnt.join("sub/link")).unwrap();
        fs::write(d.mnt.join("sub/gone"), b"unlinked").unwrap();
        fs::remove_file(d.mnt.join("sub/gone")).unwrap();
        let mut names: Vec<_> = fs::read_dir(d.mnt.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["link", "plain"]);
        assert_eq!(fs::read_link(d.mnt.join("sub/link")).unwrap(), Path::new("plain"));

        let mapped = d.mnt.join("mapped");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&mapped)
            .unwrap();
        file.set_len(65536).unwrap();
        let code = in_child(|| {
            // SAFETY: nothing else maps or truncates the file meanwhile.
            let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
                return 2;
            };
            map[..5].copy_from_slice(b"mmap!");
            map[65531..].copy_from_slice(b"tail!");
            0
        });
        assert_eq!(code, 0, "child failed");
        drop(file);
        assert_eq!(fs::read(d.backing.join("sub/plain")).unwrap(), b"");

        lazy.unmount().unwrap();
        assert_eq!(
            fs::read(d.backing.join("sub/plain")).unwrap(),
            b"written, never fsynced"
        );
        let data = fs::read(d.backing.join("mapped")).unwrap();
        assert_eq!(
            (&data[..5], &data[65531..], data.len()),
            (&b"mmap!"[..], &b"tail!"[..], 65536)
        );
        assert!(!d.backing.join("sub/gone").exists());

        // A new mount serves the same bytes, and so does dropping it.
        let lazy = mount(&d);
        assert_eq!(fs::read(d.mnt.join("sub/plain")).unwrap(), b"written, never fsynced");
        fs::write(d.mnt.join("dropped"), b"flushed by drop").unwrap();
        drop(lazy);
        assert_eq!(fs::read(d.backing.join("dropped")).unwrap(), b"flushed by drop");
    }

    /// Timings of a raftmq-like segment: `cargo test ... lazyfs -- --ignored --nocapture`.
    #[test]
    #[ignore = "measurement, not a check"]
    fn segment_throughput() {
        const LEN: usize = 64 << 20;
        let d = dirs();
        let t = Instant::now();
        let mut lazy = mount(&d);
        eprintln!("mount: {:?}", t.elapsed());
        let path = d.mnt.join("segment");
        let file = new_file(&path);
        let t = Instant::now();
        fallocate(&file, LEN as i64);
        eprintln!("posix_fallocate 64 MiB: {:?}", t.elapsed());
        let t = Instant::now();
        let code = in_child(|| {
            // SAFETY: nothing else maps or truncates the file meanwhile.
            let Ok(mut map) = (unsafe { MmapMut::map_mut(&file) }) else {
                return 2;
            };
            let record = [7u8; 4096];
            // 1 KiB records, an msync every 256 KiB.
            for off in (0..LEN).step_by(1024) {
                map[off..off + 1024].copy_from_slice(&record[..1024]);
                if (off + 1024) % (256 << 10) == 0 && map.flush_range(off + 1024 - (256 << 10), 256 << 10).is_err() {
                    return 3;
                }
            }
            0
        });
        assert_eq!(code, 0);
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "64 MiB through the map, msync every 256 KiB: {secs:.2} s, {:.0} MiB/s",
            64.0 / secs
        );
        drop(file);
        let t = Instant::now();
        let report = lazy.lose_unsynced().unwrap();
        eprintln!("lose_unsynced (unmount + mount): {:?}, {report:?}", t.elapsed());
        let t = Instant::now();
        assert!(fs::read(&path).unwrap().iter().all(|&b| b == 7));
        eprintln!("read back 64 MiB: {:?}", t.elapsed());

        // The same through write(): 4 KiB appends, an fdatasync every 256 KiB.
        let mut log = File::create(d.mnt.join("log")).unwrap();
        let t = Instant::now();
        for i in 0..(LEN / 4096) {
            log.write_all(&[9u8; 4096]).unwrap();
            if (i + 1) % 64 == 0 {
                log.sync_data().unwrap();
            }
        }
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "64 MiB of 4 KiB write()s, fdatasync every 256 KiB: {secs:.2} s, {:.0} MiB/s",
            64.0 / secs
        );
        // And 64 MiB never synced, then lost.
        log.write_all(&vec![1u8; LEN]).unwrap();
        drop(log);
        let t = Instant::now();
        let report = lazy.lose_unsynced().unwrap();
        eprintln!("lose_unsynced with 64 MiB pending: {:?}, {report:?}", t.elapsed());
        let t = Instant::now();
        lazy.unmount().unwrap();
        eprintln!("unmount: {:?}", t.elapsed());
    }
}
