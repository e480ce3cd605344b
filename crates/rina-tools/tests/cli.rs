//! Command-line behaviour that needs no daemon: help, argument errors, and
//! clear failures when the daemon is not running.

use std::process::{Command, Output};

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .env_remove("RINA_SOCKET")
        .output()
        .expect("run the tool")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const CTL: &str = env!("CARGO_BIN_EXE_rinactl");
const ECHO: &str = env!("CARGO_BIN_EXE_rina-echo");
const PERF: &str = env!("CARGO_BIN_EXE_rina-perf");
const DEMO: &str = env!("CARGO_BIN_EXE_rina-demo");

#[test]
fn help_lists_the_options() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            CTL,
            &["--help"],
            &["ipcps", "difs", "names", "flows", "--json", "--socket"],
        ),
        (
            ECHO,
            &["server", "--help"],
            &["--name", "--dif", "--max-flows", "--socket"],
        ),
        (
            ECHO,
            &["client", "--help"],
            &[
                "--dst",
                "--count",
                "--interval-ms",
                "--size",
                "--timeout-ms",
                "--json",
                "--max-delay-ms",
                "--reliable",
            ],
        ),
        (PERF, &["server", "--help"], &["--name", "--max-flows"]),
        (
            PERF,
            &["client", "--help"],
            &[
                "--size",
                "--duration-s",
                "--count",
                "--rate-mbps",
                "--sweep",
                "--json",
                "--csv",
                "--in-order",
                "--max-sdu",
                "--test",
                "--parallel",
                "--outstanding",
                "--response-size",
            ],
        ),
        (DEMO, &["--help"], &["--keep", "--json"]),
    ];
    for (exe, args, want) in cases {
        let out = run(exe, args);
        assert!(
            out.status.success(),
            "{exe} {args:?}: {}",
            text(&out.stderr)
        );
        let help = text(&out.stdout);
        for w in *want {
            assert!(
                help.contains(w),
                "{exe} {args:?} does not mention {w}:\n{help}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    let out = run(PERF, &["client", "--json", "--csv"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    for args in [
        &["client", "--test", "rr", "--size", "20"][..],
        &["client", "--parallel", "0"],
        &["client", "--test", "nope"],
    ] {
        let out = run(PERF, args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = run(ECHO, &["client", "--dst", "a b"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not allowed"),
        "{}",
        text(&out.stderr)
    );
    let out = run(CTL, &["nothing"]);
    assert_eq!(out.status.code(), Some(2));
    // Seconds that are no time are usage errors, before the daemon is
    // asked (`nan` made `ipcp enroll` panic, and `capture` took `-1` and
    // `nan` for no limit).
    let sock = missing_socket();
    for args in [
        &[
            "ipcp",
            "enroll",
            "a.net",
            "b.net",
            "--over",
            "udp",
            "--timeout-s",
            "nan",
        ][..],
        &[
            "ipcp",
            "enroll",
            "a.net",
            "b.net",
            "--over",
            "udp",
            "--timeout-s=-1",
        ],
        &["capture", "a.net", "-", "--duration-s", "nan"],
        &["capture", "a.net", "-", "--duration-s=-1"],
    ] {
        let out = run(CTL, &[&["--socket", &sock][..], args].concat());
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("not a number of seconds"), "{args:?}: {err}");
    }
    // Probes smaller than their header, or none at all, are refused
    // before any flow is asked for.
    for (args, says) in [
        (&["client", "--size", "0"][..], "at least 16 bytes"),
        (&["client", "--count", "0"], "--count"),
    ] {
        let out = run(ECHO, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A reader that goes away (`| head`) ends a tool quietly: no panic about
/// a broken pipe.
#[test]
fn a_closed_stdout_ends_a_tool_without_a_panic() {
    let mut fds = [0; 2];
    // SAFETY: `pipe` fills the two descriptors it is given.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh and owned here alone.
    let (read, write) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    // The reader is gone before the tool writes a line.
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_rina-tgen"))
        .arg("profiles")
        .stdout(std::process::Stdio::from(write))
        .output()
        .expect("run rina-tgen");
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.status.success(), "it wrote into nothing and said ok");
}

fn missing_socket() -> String {
    std::env::temp_dir()
        .join(format!("rina-tools-test-{}-none.sock", std::process::id()))
        .display()
        .to_string()
}

#[test]
fn no_daemon_is_a_clear_error() {
    let sock = missing_socket();
    let out = run(CTL, &["--socket", &sock, "flows"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("daemon_not_running") && err.contains(&sock),
        "{err}"
    );

    let out = run(ECHO, &["client", "--socket", &sock, "--count", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(&sock), "{}", text(&out.stderr));

    let out = run(PERF, &["server", "--socket", &sock]);
    assert_eq!(out.status.code(), Some(2));

    // RINA_SOCKET is honoured.
    let out = Command::new(CTL)
        .arg("ipcps")
        .env("RINA_SOCKET", &sock)
        .output()
        .expect("run rinactl");
    assert!(text(&out.stderr).contains(&sock), "{}", text(&out.stderr));
}

#[test]
fn demo_without_rinad_says_what_to_build() {
    let dir = std::env::temp_dir().join(format!("rina-tools-test-{}-empty", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let out = run(DEMO, &["--bin-dir", dir.to_str().expect("utf-8")]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cargo build --release"), "{err}");
}

#[test]
fn every_tool_generates_its_man_pages_and_completions() {
    let dir = std::env::temp_dir().join(format!("rina-tools-test-{}-docs", std::process::id()));
    let tools = [
        (CTL, "rinactl"),
        (ECHO, "rina-echo"),
        (PERF, "rina-perf"),
        (DEMO, "rina-demo"),
        (env!("CARGO_BIN_EXE_rina-tgen"), "rina-tgen"),
        (env!("CARGO_BIN_EXE_rina-ip"), "rina-ip"),
    ];
    for (exe, name) in tools {
        let out = run(exe, &["--generate-docs", dir.to_str().expect("utf-8")]);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        for f in [
            format!("man/man1/{name}.1"),
            format!("completions/{name}.bash"),
            format!("completions/_{name}"),
            format!("completions/{name}.fish"),
        ] {
            assert!(dir.join(&f).is_file(), "{name}: no {f}");
        }
    }
    // Subcommands get their own page, with their options.
    let page = std::fs::read_to_string(dir.join("man/man1/rina-perf-client.1")).expect("page");
    assert!(
        page.contains("outstanding") && page.contains("parallel"),
        "{page}"
    );
    // The option is hidden from --help.
    let help = text(&run(PERF, &["--help"]).stdout);
    assert!(!help.contains("generate-docs"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}
