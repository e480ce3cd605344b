//! Other users for the access tests: created with `useradd` when the tests
//! run as root, impersonated by one thread at a time (Linux credentials
//! are per thread when set with the raw system calls, so the rest of the
//! test keeps running as root).

use std::process::Command;
use std::sync::Mutex;

/// Serialises looking up and creating users among the tests of one
/// binary: two `useradd` of the same name at once, or an `id -g` while the
/// other is between writing the group and the user, gave a test a user
/// without the group it expected.
static USERS: Mutex<()> = Mutex::new(());

/// A local user for tests.
#[derive(Debug, Clone, Copy)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// The user `name`, created (with a group of the same name) if missing;
/// `None`, after printing why, when the tests do not run as root.
pub fn test_user(name: &str) -> Option<User> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the access tests need root to create and impersonate users");
        return None;
    }
    let _one_at_a_time = USERS.lock().unwrap_or_else(|p| p.into_inner());
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, name]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if id("-u").is_none() {
        let st = Command::new("useradd")
            .args([
                "--no-create-home",
                "--user-group",
                "--shell",
                "/bin/false",
                name,
            ])
            .status()
            .expect("run useradd");
        // Another test binary may have created it meanwhile.
        assert!(st.success() || id("-u").is_some(), "useradd {name} failed");
    }
    Some(User {
        uid: id("-u").expect("uid"),
        gid: id("-g").expect("gid"),
    })
}

/// Runs `f` in a thread whose credentials are `user`'s (no supplementary
/// groups); sockets it connects carry those credentials for good.
pub fn as_user<T: Send + 'static>(user: User, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: raw system calls that change only this thread's
        // credentials (the libc wrappers would change every thread's).
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresgid, user.gid, user.gid, user.gid),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresuid, user.uid, user.uid, user.uid),
                0
            );
        }
        f()
    })
    .join()
    .expect("the impersonating thread panicked")
}
