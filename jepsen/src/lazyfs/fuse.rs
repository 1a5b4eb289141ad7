//! The `fuser` filesystem: each FUSE request, applied to the backing
//! directory except file data, which stays pending until an FSYNC.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::state::*;

/// How long the kernel may cache attributes and entries: only this daemon
/// changes the backing directory while it is mounted.
pub(super) const TTL: Duration = Duration::from_secs(1);

/// The `fuser` filesystem: each request locks the shared state.
pub(super) struct Lazy {
    pub(super) state: Arc<Mutex<State>>,
}

impl Lazy {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_setattr(
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

    pub(super) fn do_create(
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

    pub(super) fn do_open(&self, ino: u64, flags: i32) -> Result<u64, Errno> {
        let mut st = self.state();
        let accmode = flags & libc::O_ACCMODE;
        st.ensure_file(ino)?;
        if flags & libc::O_TRUNC != 0 && accmode != libc::O_RDONLY {
            st.truncate(ino, 0)?;
        }
        Ok(st.open_handle(ino))
    }

    /// mknod, mkdir and symlink: `make` creates the node at its backing path.
    pub(super) fn do_make(
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

    pub(super) fn do_remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
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
