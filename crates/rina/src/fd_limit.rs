//! The process's limit of open descriptors: every flow is one, in the
//! application that holds it and in `rinad`, so a program with thousands
//! of flows needs more than the usual 1,024.

/// Raises this process's limit of open descriptors (`RLIMIT_NOFILE`) to
/// `wanted`: the hard limit too where the process may
/// (`CAP_SYS_RESOURCE`), else the soft limit as far as the hard one
/// allows. Children started afterwards inherit it. Never lowers the limit.
/// Returns the soft limit now in force (0 if it could not be read).
pub fn raise_fd_limit(wanted: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    if r.rlim_cur >= wanted {
        return r.rlim_cur;
    }
    if r.rlim_max < wanted {
        let more = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: wanted,
        };
        // SAFETY: a valid pointer to an rlimit; refused without the privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &more) } == 0 {
            return wanted;
        }
    }
    let up = libc::rlimit {
        rlim_cur: wanted.min(r.rlim_max),
        rlim_max: r.rlim_max,
    };
    // SAFETY: a valid pointer to an rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &up) } == 0 {
        return up.rlim_cur;
    }
    r.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::raise_fd_limit;

    fn limits() -> (u64, u64) {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid pointer to an rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        (r.rlim_cur, r.rlim_max)
    }

    #[test]
    fn the_soft_limit_rises_to_what_is_wanted_and_never_falls() {
        let (soft, hard) = limits();
        // Below the current limit: nothing changes.
        assert_eq!(raise_fd_limit(soft / 2), soft);
        assert_eq!(limits(), (soft, hard));
        // Up to the hard limit (or beyond it, where this process may).
        let want = hard.saturating_add(1000).min(1 << 20);
        let got = raise_fd_limit(want);
        let (now_soft, now_hard) = limits();
        assert_eq!(got, now_soft, "what it says is in force");
        assert!(now_soft >= soft && now_hard >= hard, "never lower");
        assert!(
            now_soft == want || now_soft == hard,
            "raised to {want} or to the hard limit {hard}: {now_soft}"
        );
    }
}
