//! The error type of every operation of this crate.

use nix::errno::Errno;
use rina_wire::ctl::CtlError;
use std::fmt;
use std::io;

pub use rina_wire::ctl::ErrorKind;

/// What went wrong: a machine-readable [`ErrorKind`] and a sentence for people.
///
/// Errors reported by the daemon keep the daemon's kind and message; errors
/// found by this library (daemon not running, connection lost, SDU too large
/// for the flow) use the same kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// Machine-readable kind.
    pub kind: ErrorKind,
    /// What went wrong, for people.
    pub message: String,
}

/// Result of every fallible operation of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Builds an error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// The kind of the error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// True if the daemon connection or the flow is gone (EOF, reset): retrying
    /// on the same socket is pointless.
    pub fn is_closed(&self) -> bool {
        self.kind == ErrorKind::DaemonGone
    }

    /// Wraps a failed system call: a lost peer becomes [`ErrorKind::DaemonGone`],
    /// anything else [`ErrorKind::Internal`]; `what` says what was being done.
    pub(crate) fn sys(what: &str, errno: Errno) -> Self {
        let kind = match errno {
            Errno::EPIPE | Errno::ECONNRESET | Errno::ENOTCONN | Errno::ECONNABORTED => {
                ErrorKind::DaemonGone
            }
            _ => ErrorKind::Internal,
        };
        Error::new(kind, format!("{what}: {}", errno.desc()))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<CtlError> for Error {
    fn from(e: CtlError) -> Self {
        Error {
            kind: e.kind,
            message: e.message,
        }
    }
}

impl From<Error> for CtlError {
    fn from(e: Error) -> Self {
        CtlError::new(e.kind, e.message)
    }
}

impl From<Errno> for Error {
    fn from(e: Errno) -> Self {
        Error::sys("system call failed", e)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) => Error::sys("I/O error", Errno::from_raw(n)),
            None => {
                let kind = match e.kind() {
                    io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::NotConnected
                    | io::ErrorKind::UnexpectedEof => ErrorKind::DaemonGone,
                    _ => ErrorKind::Internal,
                };
                Error::new(kind, e.to_string())
            }
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match e.kind {
            ErrorKind::DaemonGone => io::ErrorKind::BrokenPipe,
            ErrorKind::DaemonNotRunning => io::ErrorKind::NotFound,
            ErrorKind::Timeout => io::ErrorKind::TimedOut,
            ErrorKind::InvalidRequest | ErrorKind::SduTooLarge => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}
