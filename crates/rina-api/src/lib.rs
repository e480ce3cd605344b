//! The C API of RINA programs, `rina/api.h` as rlite defined it (and IRATI
//! adopted it), over `rinad`'s control socket.
//!
//! Built as `librina_api.so` and `librina_api.a`, with the header in
//! `include/rina/api.h` and `rina-api.pc` for pkg-config
//! (`scripts/install-capi.sh PREFIX` installs all three). Every function
//! returns -1 (0 for [`rina_flow_mss_get`]) with `errno` set on failure;
//! [`rina_api_last_error`] has the sentence.
//!
//! * A control descriptor ([`rina_open`]) is one end of a socket pair; a
//!   relay thread per descriptor passes it the flow requests of the names
//!   it registered (and the flows the daemon accepted for names registered
//!   with [`RINA_F_ACCEPT`]), so it polls readable exactly when one waits
//!   (see [`control`]).
//! * [`rina_flow_alloc`] uses a daemon connection of its own; with
//!   `RINA_F_NOWAIT` that connection is the descriptor returned.
//! * Flow descriptors are the daemon's `SOCK_SEQPACKET` flow sockets: one
//!   `write` is one SDU, one `read` one SDU, `close` deallocates.
//! * Names are `name|instance|entity|instance` (rlite) or this project's
//!   `name/instance/entity/instance` ([`name`]).

pub mod control;
pub mod error;
pub mod flow;
pub mod name;
pub mod spec;
pub mod sys;
pub mod wait;

use error::{ApiError, Result};
use libc::{c_char, c_int, c_uint};
use rina_wire::ctl::{AutoAccept, ErrorKind, Op, Reply};
use rina_wire::name::MAX_NAME_LEN;
use rina_wire::{AppName, QosSpec};
use spec::RinaFlowSpec;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

/// `RINA_F_NOWAIT`: start the operation, return a descriptor to wait on.
pub const RINA_F_NOWAIT: c_uint = 1 << 0;
/// `RINA_F_NORESP`: accept a request without answering it yet.
pub const RINA_F_NORESP: c_uint = 1 << 1;
/// `RINA_F_ACCEPT` (this library's, not rlite's): a registration whose
/// flow requests the daemon accepts itself, so that an allocation waits
/// for no round trip to the program; `rina_flow_accept` hands the flows
/// over.
pub const RINA_F_ACCEPT: c_uint = 1 << 2;

/// Runs `f`, turning its error (or a panic) into -1 and `errno`; nothing
/// it does, recording the error included, unwinds into C.
fn ffi(f: impl FnOnce() -> Result<c_int>) -> c_int {
    let run = || match f() {
        Ok(v) => v,
        Err(e) => {
            error::set_last(&e);
            -1
        }
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
        let internal = ApiError::Protocol("internal error in librina_api".into());
        let _ = std::panic::catch_unwind(|| error::set_last(&internal));
        -1
    })
}

/// A C string argument; `None` for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller promises a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| ApiError::Invalid(format!("{what} is not valid UTF-8")))
}

/// An application name argument, which may not be NULL.
///
/// # Safety
/// As for [`opt_str`].
unsafe fn app_name(p: *const c_char, what: &str) -> Result<AppName> {
    // SAFETY: forwarded.
    let s =
        unsafe { opt_str(p, what)? }.ok_or_else(|| ApiError::Invalid(format!("{what} is NULL")))?;
    name::parse(&s).map_err(ApiError::Invalid)
}

/// A DIF name argument: NULL or empty means "any DIF". One longer than
/// any DIF's name may be is refused here: sent, it would make the daemon's
/// answer (which quotes it) too large to read.
///
/// # Safety
/// As for [`opt_str`].
unsafe fn dif_name(p: *const c_char) -> Result<Option<String>> {
    // SAFETY: forwarded.
    let dif = unsafe { opt_str(p, "dif_name")? }.filter(|d| !d.is_empty());
    if let Some(d) = dif.as_ref().filter(|d| d.len() > MAX_NAME_LEN) {
        return Err(ApiError::Invalid(format!(
            "dif_name is {} bytes long; a DIF name has at most {MAX_NAME_LEN}",
            d.len()
        )));
    }
    Ok(dif)
}

/// Refuses `flags` holding anything but `allowed`, as rlite does.
fn check_flags(flags: c_uint, allowed: c_uint) -> Result<()> {
    if flags & !allowed != 0 {
        return Err(ApiError::Invalid(format!(
            "flags {flags:#x} hold bits this call does not know (it takes {allowed:#x})"
        )));
    }
    Ok(())
}

/// Takes ownership of a descriptor the library handed out as a wait
/// handle, unless it is non-blocking and its answer has not come: then
/// EAGAIN, and it stays open for the next try (as in rlite).
fn own(fd: c_int, what: &str) -> Result<OwnedFd> {
    if fd < 0 {
        return Err(ApiError::BadFd(format!("{what} {fd} is not a descriptor")));
    }
    // The descriptor must be open; fstat tells without touching it.
    let key = sys::key(fd).map_err(|_| ApiError::BadFd(format!("{what} {fd} is not open")))?;
    // A control descriptor given by mistake would lose a flow request to
    // the wait and then be closed, withdrawing its names.
    if control::is_control(key) {
        return Err(ApiError::BadFd(format!(
            "{what} {fd} is a control descriptor from rina_open(), not one a \
             RINA_F_NOWAIT call returned"
        )));
    }
    // Nor a flow's: the wait would eat an SDU, or wait 30 s for one, then
    // close the flow.
    if flow::is_flow(key) {
        return Err(ApiError::BadFd(format!(
            "{what} {fd} is a flow descriptor, not one a RINA_F_NOWAIT call returned"
        )));
    }
    // Nor any other (a file, a pipe, a socket of the program's): the wait
    // would read from it and then close it.
    if !wait::is_handle(key) {
        return Err(ApiError::BadFd(format!(
            "{what} {fd} is not a descriptor a RINA_F_NOWAIT call returned \
             (or it was waited on already)"
        )));
    }
    if sys::would_block(fd) {
        return Err(ApiError::sys(
            nix::errno::Errno::EAGAIN,
            format!("{what} {fd} is non-blocking and the daemon has not answered yet"),
        ));
    }
    wait::taken(key);
    // SAFETY: the caller hands the descriptor over, as the API says.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a control descriptor for registering names and receiving flow
/// requests.
#[no_mangle]
pub extern "C" fn rina_open() -> c_int {
    ffi(control::open)
}

fn registration(
    fd: c_int,
    dif: Option<String>,
    name: AppName,
    flags: c_uint,
    register: bool,
) -> Result<c_int> {
    let conn = control::lookup(fd)?;
    let op = if register {
        Op::Register {
            name,
            dif,
            accept: (flags & RINA_F_ACCEPT != 0).then(AutoAccept::default),
        }
    } else {
        Op::Unregister { name, dif }
    };
    if flags & RINA_F_NOWAIT != 0 {
        return wait::hand_out(conn.request(op)?);
    }
    // As a call: its reply route is forgotten if the wait times out.
    conn.call(op).map(|_| 0)
}

/// Registers `local_appl` (in `dif_name`, or in every DIF if NULL); flow
/// requests for it then arrive on `fd`. With `RINA_F_NOWAIT`, returns a
/// descriptor that turns readable when done: finish with
/// [`rina_register_wait`]. With [`RINA_F_ACCEPT`], the daemon accepts
/// every request for it at once and `fd` carries the flows instead.
///
/// # Safety
/// The strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rina_register(
    fd: c_int,
    dif_name: *const c_char,
    local_appl: *const c_char,
    flags: c_int,
) -> c_int {
    ffi(|| {
        check_flags(flags as c_uint, RINA_F_NOWAIT | RINA_F_ACCEPT)?;
        // SAFETY: the caller's promise, forwarded.
        let (dif, name) = unsafe {
            (
                self::dif_name(dif_name)?,
                app_name(local_appl, "local_appl")?,
            )
        };
        registration(fd, dif, name, flags as c_uint, true)
    })
}

/// Withdraws a registration made on `fd`; `RINA_F_NOWAIT` as for
/// [`rina_register`].
///
/// # Safety
/// The strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rina_unregister(
    fd: c_int,
    dif_name: *const c_char,
    local_appl: *const c_char,
    flags: c_int,
) -> c_int {
    ffi(|| {
        check_flags(flags as c_uint, RINA_F_NOWAIT)?;
        // SAFETY: the caller's promise, forwarded.
        let (dif, name) = unsafe {
            (
                self::dif_name(dif_name)?,
                app_name(local_appl, "local_appl")?,
            )
        };
        registration(fd, dif, name, flags as c_uint, false)
    })
}

/// Completes a `RINA_F_NOWAIT` (un)registration: waits for its answer on
/// `wfd`, closes `wfd`, returns 0. `wfd` is closed even if `fd` is no
/// longer a control descriptor (the program closed it meanwhile, which
/// withdrew its names): only a descriptor that is no wait descriptor, or
/// one non-blocking whose answer has not come, is left open.
#[no_mangle]
pub extern "C" fn rina_register_wait(fd: c_int, wfd: c_int) -> c_int {
    ffi(|| {
        // Owned first, so that a failing lookup closes it too.
        let w = own(wfd, "wfd")?;
        let conn = control::lookup(fd)?;
        let reply = control::wait_reply(&w, true);
        drop(w);
        if matches!(reply, Err(ApiError::Timeout(_))) {
            // The route of the reply that did not come holds a descriptor.
            conn.forget_abandoned();
        }
        match reply? {
            (Reply::Registered { .. } | Reply::Done, _) => Ok(0),
            _ => Err(ApiError::BadFd(format!(
                "wfd {wfd} did not come from rina_register() or rina_unregister()"
            ))),
        }
    })
}

/// Takes the next flow request that arrived on `fd` (blocking unless `fd`
/// is non-blocking); fills `*remote_appl` (malloc'd, for the caller to free)
/// and `*spec` if not NULL. Accepts it and returns the flow's descriptor,
/// or with `RINA_F_NORESP` returns a handle for [`rina_flow_respond`].
/// A flow the daemon accepted (a name registered with [`RINA_F_ACCEPT`])
/// is taken the same way: its descriptor, or with `RINA_F_NORESP` a
/// handle whose refusal closes the flow.
///
/// # Safety
/// `remote_appl` and `spec` are NULL or valid for writing.
#[no_mangle]
pub unsafe extern "C" fn rina_flow_accept(
    fd: c_int,
    remote_appl: *mut *mut c_char,
    spec: *mut RinaFlowSpec,
    flags: c_uint,
) -> c_int {
    ffi(|| {
        if !remote_appl.is_null() {
            // As in rlite: NULL unless a name is given, so that a caller
            // may free() it whatever happened.
            // SAFETY: the caller gives a pointer valid for writing.
            unsafe { *remote_appl = std::ptr::null_mut() };
        }
        check_flags(flags, RINA_F_NORESP)?;
        let conn = control::lookup(fd)?;
        // A request the daemon withdrew meanwhile (its timeout passed, or
        // the requester gave up) is passed over: the next one is taken, as
        // an rlite program that exits when accepting fails expects.
        let ((remote_name, qos), h) = loop {
            let (who, pending) = match control::next_request(fd)? {
                control::Arrival::Request(req) => {
                    ((req.remote, req.qos), control::Pending::Request(req.handle))
                }
                control::Arrival::Accepted(info, flow) => {
                    if let Ok(k) = sys::key(flow.as_raw_fd()) {
                        flow::remember(k, info.max_sdu);
                    }
                    ((info.remote, info.qos), control::Pending::Accepted(flow))
                }
            };
            let handle = conn.new_handle(pending);
            if flags & RINA_F_NORESP != 0 {
                break (who, handle);
            }
            match respond(fd, handle, 0) {
                Ok(flow) => break (who, flow),
                Err(ApiError::Daemon(e)) if e.kind == ErrorKind::RequestGone => continue,
                Err(e) => return Err(e),
            }
        };
        let remote = if remote_appl.is_null() {
            std::ptr::null_mut()
        } else {
            let s = std::ffi::CString::new(name::format(&remote_name))
                .map_err(|_| ApiError::Protocol("the remote name holds a NUL".into()))?;
            // SAFETY: strdup copies a valid C string into malloc'd memory.
            let p = unsafe { libc::strdup(s.as_ptr()) };
            if p.is_null() {
                if flags & RINA_F_NORESP == 0 {
                    // SAFETY: h is the flow just accepted, handed to no one.
                    unsafe { libc::close(h) };
                }
                return Err(ApiError::sys(nix::errno::Errno::ENOMEM, "remote_appl"));
            }
            p
        };
        // SAFETY: the caller gives pointers valid for writing, or NULL.
        unsafe {
            if !remote_appl.is_null() {
                *remote_appl = remote;
            }
            if !spec.is_null() {
                *spec = RinaFlowSpec::from_qos(&qos);
            }
        }
        Ok(h)
    })
}

fn respond(fd: c_int, handle: c_int, response: c_int) -> Result<c_int> {
    let conn = control::lookup(fd)?;
    match conn.take_handle(handle)? {
        control::Pending::Request(h) if response == 0 => {
            flow::take_flow(conn.call(Op::Accept {
                handle: h,
                rings: false,
                direct: false,
                bundle: None,
            })?)
        }
        control::Pending::Request(h) => {
            let reason = format!("the application refused the flow (response {response})");
            conn.call(Op::Refuse { handle: h, reason }).map(|_| 0)
        }
        control::Pending::Accepted(flow) if response == 0 => {
            // Not close-on-exec once handed over, as a flow an answer
            // brings.
            // SAFETY: fcntl on a descriptor we own.
            unsafe { libc::fcntl(flow.as_raw_fd(), libc::F_SETFD, 0) };
            Ok(flow.into_raw_fd())
        }
        // Closing it deallocates the flow the daemon accepted.
        control::Pending::Accepted(_) => Ok(0),
    }
}

/// Answers a flow request taken with `RINA_F_NORESP`: 0 accepts (returns
/// the flow's descriptor), anything else refuses (returns 0). For a flow
/// the daemon accepted ([`RINA_F_ACCEPT`]), refusing closes the flow.
#[no_mangle]
pub extern "C" fn rina_flow_respond(fd: c_int, handle: c_int, response: c_int) -> c_int {
    ffi(|| respond(fd, handle, response))
}

/// Allocates a flow from `local_appl` to `remote_appl` (in `dif_name` if
/// not NULL) with `flowspec` (best effort if NULL). Returns the flow's
/// descriptor, or with `RINA_F_NOWAIT` a descriptor that turns readable
/// when the daemon answers: finish with [`rina_flow_alloc_wait`].
///
/// # Safety
/// The strings are NULL or NUL-terminated; `flowspec` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn rina_flow_alloc(
    dif_name: *const c_char,
    local_appl: *const c_char,
    remote_appl: *const c_char,
    flowspec: *const RinaFlowSpec,
    flags: c_uint,
) -> c_int {
    ffi(|| {
        check_flags(flags, RINA_F_NOWAIT)?;
        // SAFETY: the caller's promises, forwarded.
        let (dif, local, remote, spec) = unsafe {
            (
                self::dif_name(dif_name)?,
                app_name(local_appl, "local_appl")?,
                app_name(remote_appl, "remote_appl")?,
                flowspec.as_ref().copied(),
            )
        };
        let qos = match spec {
            None => QosSpec::default(),
            Some(s) => s.to_qos().map_err(ApiError::Invalid)?,
        };
        let w = flow::start_alloc(dif, local, remote, qos)?;
        if flags & RINA_F_NOWAIT != 0 {
            return wait::hand_out(w);
        }
        flow::finish_alloc(w)
    })
}

/// Completes a `RINA_F_NOWAIT` allocation: waits for the answer on `wfd`,
/// closes `wfd`, returns the flow's descriptor.
#[no_mangle]
pub extern "C" fn rina_flow_alloc_wait(wfd: c_int) -> c_int {
    ffi(|| flow::finish_alloc(own(wfd, "wfd")?))
}

/// Fills `spec` with the best-effort spec (unreliable, no bounds).
///
/// # Safety
/// `spec` is NULL (nothing happens) or valid for writing.
#[no_mangle]
pub unsafe extern "C" fn rina_flow_spec_unreliable(spec: *mut RinaFlowSpec) {
    if !spec.is_null() {
        // SAFETY: the caller gives a pointer valid for writing.
        unsafe { *spec = RinaFlowSpec::unreliable() };
    }
}

/// The older name of [`rina_flow_spec_unreliable`].
///
/// # Safety
/// As for [`rina_flow_spec_unreliable`].
#[no_mangle]
pub unsafe extern "C" fn rina_flow_spec_default(spec: *mut RinaFlowSpec) {
    // SAFETY: forwarded.
    unsafe { rina_flow_spec_unreliable(spec) }
}

/// The largest SDU one `write` may carry on flow descriptor `fd`; 0 with
/// `errno` set if `fd` is not a flow (`EBADF`) or the daemon cannot be
/// asked. A flow this library did not hand out (inherited across `exec`,
/// or passed by another process) is looked up in the daemon by its
/// socket, once.
#[no_mangle]
pub extern "C" fn rina_flow_mss_get(fd: c_int) -> c_uint {
    let r = ffi(|| flow::mss(fd).map(|m| c_int::try_from(m).unwrap_or(c_int::MAX)));
    c_uint::try_from(r).unwrap_or(0)
}

/// This thread's last error, as a sentence (an extension of this library;
/// not in rlite). Never NULL; valid until this thread's next failing call.
#[no_mangle]
pub extern "C" fn rina_api_last_error() -> *const c_char {
    std::panic::catch_unwind(error::last_ptr).unwrap_or(c"".as_ptr())
}
