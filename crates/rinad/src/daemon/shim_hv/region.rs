//! The shared-memory region of a shim-hv device: the file, the checks
//! that nobody else can cut it short under the daemon, and its mapping.

use super::*;

/// A shared mapping of a file, unmapped on drop.
pub(in crate::daemon) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    pub(in crate::daemon) fn new(file: &std::fs::File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the
        // kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    pub(in crate::daemon) fn region(&self) -> Region {
        // SAFETY: the mapping is page-aligned, readable and writable for
        // `len` bytes, and outlives the link using it (both live in
        // `Attached`, the link dropped first).
        unsafe { Region::new(self.ptr, self.len) }.expect("mmap is page-aligned")
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no handle is used after.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A link and the mapping it lives in (fields drop in order: link first).
pub(super) struct Attached {
    pub(super) link: Link,
    pub(super) _map: Mapping,
}

/// Refuses a host's shared-memory file that someone else could shrink
/// under the daemon (a mapping of a file cut short faults with SIGBUS,
/// which kills it): one that is not a regular file, belongs to another
/// user or is writable by anyone (the file the daemon creates is 0600; an
/// existing one is taken only on these terms, so that a file another
/// user made, or left writable, is never adopted). A group the file's
/// owner gave write access is trusted (a QEMU running as another user).
/// Nor is a file taken that holds something else than a region (or
/// zeros): it would be resized and overwritten.
pub(super) fn host_file_is_ours(file: &std::fs::File, path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}; remove it (or fix its owner and mode) and start again",
                path.display()
            ),
        ))
    };
    if !m.file_type().is_file() {
        return refuse("is not a regular file".into());
    }
    let euid = sys::euid();
    if m.uid() != euid {
        return refuse(format!(
            "belongs to uid {}, not to the daemon's user (uid {euid}), who could cut it short under the daemon",
            m.uid()
        ));
    }
    if m.mode() & 0o002 != 0 {
        return refuse(format!(
            "is writable by every user (mode {:o}), any of whom could cut it short under the daemon",
            m.mode() & 0o7777
        ));
    }
    // The daemon resizes and lays out the file: one that holds something
    // else (a typo'd path, /etc/passwd asked for by an administrator who
    // is not root) is not overwritten.
    let mut head = [0u8; 8];
    let got = std::os::unix::fs::FileExt::read_at(file, &mut head, 0)?;
    let fresh = head[..got].iter().all(|&b| b == 0);
    if !fresh && head[..got] != rina_core::shim_hv::link::MAGIC[..got] {
        return refuse(format!(
            "holds {} bytes that are not a shim-hv region (no {:?} magic), which the daemon would overwrite",
            m.len(),
            String::from_utf8_lossy(&rina_core::shim_hv::link::MAGIC)
        ));
    }
    Ok(())
}

/// Refuses a file for the guest side that someone other than the
/// daemon's user or root could cut short under its mapping (the first
/// touch of a page past the new end kills the daemon with SIGBUS): one
/// that belongs to another user, or that every user may write. (Anyone
/// may make the file at a host's path before the host does: the host
/// then refuses it, but a guest waiting for the layout took it.) The
/// host's own file qualifies, and so does a device's BAR in sysfs, which
/// belongs to root.
pub(super) fn guest_file_is_safe(file: &std::fs::File, path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    let euid = sys::euid();
    let why = if m.uid() != euid && m.uid() != 0 {
        format!(
            "belongs to uid {}, neither the daemon's user (uid {euid}) nor root",
            m.uid()
        )
    } else if m.mode() & 0o002 != 0 {
        format!("is writable by every user (mode {:o})", m.mode() & 0o7777)
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} {why}, who could cut it short under the daemon; not attached",
            path.display()
        ),
    ))
}

/// Gives the first `len` bytes of the host's file (the header and the
/// rings) their memory now. Pages of a sparse file get theirs when first
/// touched, and on a file system that filled up meanwhile (any user may
/// fill `/dev/shm`) there is none: the process that touches such a page
/// through its mapping is killed (SIGBUS), this daemon or the guest's.
/// A file system without room for them is refused now, with the reason.
/// (One that cannot allocate ahead at all is taken as it is.)
pub(super) fn allocate_rings(file: &std::fs::File, len: usize) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor we own; a negative return is an
    // error. Mode 0 keeps the bytes there are and allocates the holes.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return Ok(());
    }
    Err(io::Error::new(
        e.kind(),
        format!("cannot allocate the {len} bytes of its rings ahead: {e}"),
    ))
}

/// Opens and maps the region: the host creates and lays it out, the guest
/// attaches to what is there.
pub(super) fn open_region(path: &Path, side: Side, session: u32) -> io::Result<Attached> {
    let to_io = |e: RingError| io::Error::other(e.to_string());
    match side {
        Side::Host => {
            let size = region_size(GEOMETRY);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)?;
            host_file_is_ours(&file, path)?;
            file.set_len(size as u64)?;
            allocate_rings(&file, region_used(GEOMETRY))?;
            let map = Mapping::new(&file, size)?;
            let link = Link::create(map.region(), GEOMETRY, session, LinkConfig::default())
                .map_err(to_io)?;
            Ok(Attached { link, _map: map })
        }
        Side::Guest => {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            guest_file_is_safe(&file, path)?;
            let len = file.metadata()?.len() as usize;
            if len < rina_core::shim_hv::link::HEADER {
                return Err(io::Error::other("the file is not laid out yet"));
            }
            let map = Mapping::new(&file, len)?;
            let link = Link::attach(map.region(), session, LinkConfig::default()).map_err(to_io)?;
            Ok(Attached { link, _map: map })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory of its own under the system's temporary one.
    pub(super) fn scratch(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rinad-hv-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    pub(super) fn refusal(path: &Path) -> String {
        match open_region(path, Side::Host, 1) {
            Ok(_) => panic!("{} was taken", path.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    pub(super) fn the_host_takes_only_a_file_no_one_else_can_cut_short() {
        let d = scratch("owner");
        // Its own file: created 0600 and laid out.
        let own = d.join("own");
        open_region(&own, Side::Host, 1).expect("a new file");
        let m = std::fs::metadata(&own).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(m.len() as usize, region_size(GEOMETRY));
        // Taken again as it is (a restart).
        open_region(&own, Side::Host, 2).expect("its own file again");

        // Writable by every user: refused, and left as it was.
        let open = d.join("open");
        std::fs::write(&open, b"").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = refusal(&open);
        assert!(e.contains("writable by every user (mode 666)"), "{e}");
        assert_eq!(std::fs::metadata(&open).unwrap().len(), 0);

        // A file of the daemon's user that holds something else: refused,
        // left as it was (it would have been resized and overwritten).
        let other = d.join("other");
        std::fs::write(&other, b"root:x:0:0:root:/root:/bin/bash\n").unwrap();
        let e = refusal(&other);
        assert!(e.contains("not a shim-hv region"), "{e}");
        assert_eq!(
            std::fs::read(&other).unwrap(),
            b"root:x:0:0:root:/root:/bin/bash\n"
        );
        // An empty (or zeroed) one is laid out.
        let empty = d.join("empty");
        std::fs::write(&empty, b"").unwrap();
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
        open_region(&empty, Side::Host, 1).expect("an empty file");

        // A symbolic link is not followed; a directory is not a file.
        let link = d.join("link");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        let e = refusal(&link);
        assert!(
            e.contains("symbolic links") || e.contains("(os error 40)"),
            "{e}"
        );
        let e = refusal(&d);
        assert!(
            e.contains("directory") || e.contains("not a regular file"),
            "{e}"
        );

        // Another user's file (root can make one to test with).
        if sys::euid() == 0 {
            let theirs = d.join("theirs");
            std::fs::write(&theirs, b"").unwrap();
            std::os::unix::fs::chown(&theirs, Some(65_534), Some(65_534)).unwrap();
            let e = refusal(&theirs);
            assert!(e.contains("belongs to uid 65534"), "{e}");
            assert_eq!(std::fs::metadata(&theirs).unwrap().len(), 0);
        } else {
            println!("skipped the file of another user: making one needs root");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
