//! Errors of the C API and the `errno` values they become.

use nix::errno::Errno;
use rina_wire::ctl::{CtlError, ErrorKind};
use std::cell::RefCell;
use std::ffi::CString;
use std::fmt;

/// Why a call of the C API failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// The daemon answered the request with an error.
    Daemon(CtlError),
    /// A system call failed with this errno; the text says what was done.
    Sys(Errno, String),
    /// An argument is invalid (a NULL where a value is needed, a bad name,
    /// a flow spec of an unknown version).
    Invalid(String),
    /// The descriptor is not one this library handed out (or it was closed).
    BadFd(String),
    /// The daemon sent something that does not follow the control protocol.
    Protocol(String),
    /// The daemon did not answer in time.
    Timeout(String),
}

impl ApiError {
    /// The `errno` value a C caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            ApiError::Daemon(e) => kind_errno(e.kind),
            ApiError::Sys(e, _) => *e as i32,
            ApiError::Invalid(_) => libc::EINVAL,
            ApiError::BadFd(_) => libc::EBADF,
            ApiError::Protocol(_) => libc::EPROTO,
            ApiError::Timeout(_) => libc::ETIMEDOUT,
        }
    }

    /// Builds a [`ApiError::Sys`].
    pub fn sys(e: Errno, what: impl Into<String>) -> Self {
        ApiError::Sys(e, what.into())
    }
}

/// The `errno` value for an error kind of the control protocol.
pub fn kind_errno(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::DaemonNotRunning => libc::ECONNREFUSED,
        ErrorKind::DaemonGone => libc::ECONNRESET,
        ErrorKind::UnknownDif | ErrorKind::NoDif => libc::ENXIO,
        ErrorKind::NameNotFound | ErrorKind::NotRegistered => libc::EHOSTUNREACH,
        ErrorKind::NameInUse => libc::EBUSY,
        ErrorKind::Refused => libc::ECONNREFUSED,
        ErrorKind::QosNotSatisfiable => libc::ENOTSUP,
        ErrorKind::SduTooLarge => libc::EMSGSIZE,
        ErrorKind::Timeout => libc::ETIMEDOUT,
        ErrorKind::InvalidRequest | ErrorKind::RequestGone => libc::EINVAL,
        ErrorKind::UnknownFlow => libc::EBADF,
        ErrorKind::NoResources => libc::ENOBUFS,
        ErrorKind::Internal => libc::EPROTO,
        ErrorKind::PermissionDenied => libc::EACCES,
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Daemon(e) => write!(f, "rinad: {}", e.message),
            ApiError::Sys(e, what) => write!(f, "{what}: {}", e.desc()),
            ApiError::Invalid(m)
            | ApiError::BadFd(m)
            | ApiError::Protocol(m)
            | ApiError::Timeout(m) => f.write_str(m),
        }
    }
}

impl From<CtlError> for ApiError {
    fn from(e: CtlError) -> Self {
        ApiError::Daemon(e)
    }
}

/// Result of the library's internal operations.
pub type Result<T> = std::result::Result<T, ApiError>;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as the calling thread's last error and sets `errno`.
pub fn set_last(e: &ApiError) {
    let text = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
    // In an atexit handler or a pthread key's destructor, the thread's own
    // storage may be gone already (`with` would panic, and a panic in a C
    // call aborts the program): errno still says what failed.
    let _ = LAST.try_with(|l| *l.borrow_mut() = text);
    Errno::set_raw(e.errno());
}

/// Said by [`last_ptr`] once the calling thread's storage is gone.
static GONE: &std::ffi::CStr =
    c"(no error text: the calling thread's storage is already destroyed; errno says what failed)";

/// The calling thread's last error message (empty if none); valid until the
/// thread's next failing call.
pub fn last_ptr() -> *const libc::c_char {
    LAST.try_with(|l| l.borrow().as_ptr())
        .unwrap_or(GONE.as_ptr())
}
