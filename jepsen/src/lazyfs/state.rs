//! What the daemon knows, outliving sessions: inodes by number and path,
//! open handles, each inode's pending writes; and the libc helpers the data
//! path shares.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, RenameFlags, Request, TimeOrNow};

use super::pending::*;

/// What a simulated power loss dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossReport {
    /// Files that had writes not yet fsynced.
    pub files: usize,
    /// Bytes of the pending 4 KiB pages of those files (up to the end of their
    /// pending writes): an upper bound of the bytes written and not fsynced.
    pub bytes: u64,
}

pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic elsewhere must not take the filesystem down with it.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn cpath(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// The errno of a failed libc call.
pub(super) fn last_errno() -> Errno {
    Errno::from(io::Error::last_os_error())
}

/// An unexpected failure on the data path: logged, and its errno (else EIO) returned.
pub(super) fn data_error(what: &str, path: Option<&Path>, e: io::Error) -> Errno {
    let path = path
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "(unlinked)".to_string());
    eprintln!("lazyfs: {what} {path}: {e}");
    Errno::from(e)
}

pub(super) struct Inode {
    /// Relative to the backing directory; `None` once unlinked or replaced.
    pub(super) path: Option<PathBuf>,
    /// The backing file, shared by this inode's open handles.
    pub(super) file: Option<File>,
    /// Whether `file` was opened for writing.
    pub(super) writable: bool,
    /// Open file handles.
    pub(super) open: usize,
    pub(super) pending: Pending,
}

impl Inode {
    pub(super) fn new(path: PathBuf) -> Inode {
        Inode {
            path: Some(path),
            file: None,
            writable: false,
            open: 0,
            pending: Pending::default(),
        }
    }
}

pub(super) struct DirEntry {
    pub(super) ino: u64,
    pub(super) kind: FileType,
    pub(super) name: OsString,
}

pub(super) enum Handle {
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
pub(super) struct State {
    pub(super) backing: PathBuf,
    pub(super) inodes: HashMap<u64, Inode>,
    pub(super) by_path: HashMap<PathBuf, u64>,
    pub(super) next_ino: u64,
    pub(super) handles: HashMap<u64, Handle>,
    pub(super) next_fh: u64,
}

impl State {
    pub(super) fn new(backing: PathBuf) -> State {
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

    pub(super) fn loss_report(&self) -> LossReport {
        let lossy = self.inodes.values().filter(|i| !i.pending.is_empty());
        LossReport {
            files: lossy.clone().count(),
            bytes: lossy.map(|i| i.pending.bytes()).sum(),
        }
    }

    pub(super) fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.backing.clone()
        } else {
            self.backing.join(rel)
        }
    }

    pub(super) fn rel_path(&self, ino: u64) -> Result<&Path, Errno> {
        self.inodes
            .get(&ino)
            .and_then(|i| i.path.as_deref())
            .ok_or(Errno::ENOENT)
    }

    pub(super) fn full_path(&self, ino: u64) -> Result<PathBuf, Errno> {
        Ok(self.full(self.rel_path(ino)?))
    }

    /// `name` in directory `parent`, relative to the backing directory.
    pub(super) fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
            return Err(Errno::EINVAL);
        }
        Ok(self.rel_path(parent)?.join(name))
    }

    /// The inode number of `rel`, allocated on first sight.
    pub(super) fn ino_for(&mut self, rel: &Path) -> u64 {
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
    pub(super) fn detach(&mut self, rel: &Path) {
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
    pub(super) fn take_subtree(&mut self, rel: &Path) -> Vec<(PathBuf, u64)> {
        let paths: Vec<PathBuf> = self.by_path.keys().filter(|p| p.starts_with(rel)).cloned().collect();
        let mut taken = Vec::with_capacity(paths.len());
        for p in paths {
            if let (Some(ino), Ok(suffix)) = (self.by_path.remove(&p), p.strip_prefix(rel)) {
                taken.push((suffix.to_path_buf(), ino));
            }
        }
        taken
    }

    pub(super) fn put_subtree(&mut self, rel: &Path, entries: Vec<(PathBuf, u64)>) {
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

    pub(super) fn attr(&self, ino: u64, meta: &Metadata) -> FileAttr {
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
    pub(super) fn stat(&self, ino: u64) -> Result<FileAttr, Errno> {
        let inode = self.inodes.get(&ino).ok_or(Errno::ENOENT)?;
        let meta = match (&inode.path, &inode.file) {
            (Some(rel), _) => fs::symlink_metadata(self.full(rel))?,
            (None, Some(file)) => file.metadata()?,
            (None, None) => return Err(Errno::ENOENT),
        };
        Ok(self.attr(ino, &meta))
    }

    /// Looks up `rel` in the backing directory and returns its attributes.
    pub(super) fn entry(&mut self, rel: &Path) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(self.full(rel))?;
        let ino = self.ino_for(rel);
        Ok(self.attr(ino, &meta))
    }

    /// Makes sure `ino` has its backing file open.
    pub(super) fn ensure_file(&mut self, ino: u64) -> Result<(), Errno> {
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
    pub(super) fn with_writable<R>(
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

    pub(super) fn open_handle(&mut self, ino: u64) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle::File { ino });
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.open += 1;
        }
        fh
    }

    pub(super) fn release(&mut self, fh: u64) {
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

    pub(super) fn read(&mut self, ino: u64, off: u64, size: u32) -> Result<Vec<u8>, Errno> {
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

    pub(super) fn write(&mut self, ino: u64, off: u64, data: &[u8]) -> Result<(), Errno> {
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
    pub(super) fn sync_inode(&mut self, ino: u64, datasync: bool) -> Result<(), Errno> {
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
    pub(super) fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        self.with_writable(ino, |file, pending| {
            file.set_len(size)?;
            pending.truncate(size);
            Ok(())
        })
    }

    pub(super) fn fallocate(&mut self, ino: u64, off: u64, len: u64, mode: i32) -> Result<(), Errno> {
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

    pub(super) fn opendir(&mut self, ino: u64) -> Result<u64, Errno> {
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

    pub(super) fn rename(&mut self, from: &Path, to: &Path, flags: RenameFlags) -> Result<(), Errno> {
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
    pub(super) fn chown_to_caller(&self, rel: &Path, req: &Request) {
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
pub(super) fn open_backing(path: &Path) -> Result<(File, bool), Errno> {
    if let Ok(file) = OpenOptions::new().read(true).write(true).open(path) {
        return Ok((file, true));
    }
    match File::open(path) {
        Ok(file) => Ok((file, false)),
        Err(_) => Ok((OpenOptions::new().write(true).open(path)?, true)),
    }
}

pub(super) fn system_time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = Duration::from_nanos(nsecs.clamp(0, 999_999_999) as u64);
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
}

pub(super) fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
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
