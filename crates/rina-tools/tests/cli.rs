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
const TGEN: &str = env!("CARGO_BIN_EXE_rina-tgen");
const CAT: &str = env!("CARGO_BIN_EXE_rina-cat");

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
        (
            CAT,
            &["--help"],
            &[
                "--listen",
                "--keep-listening",
                "--no-stdin",
                "--wait-ms",
                "--unreliable",
                "--qos-cube",
                "--verbose",
                "--socket",
            ],
        ),
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
        // A thread and a flow each: at most 1024.
        &["client", "--parallel", "1025"],
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

/// Runs `exe` with `args` against a socket nobody listens on and checks
/// that it refused the options (exit code 2, `says` in the message) before
/// it looked for the daemon.
fn refused_before_the_daemon(exe: &str, args: &[&str], says: &str) {
    let sock = missing_socket();
    let out = run(
        exe,
        &[&args[..1], &["--socket", &sock], &args[1..]].concat(),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{exe} {args:?}: {err}");
    assert!(!err.contains("panicked"), "{exe} {args:?}: {err}");
    assert!(!err.contains("no RINA daemon"), "{exe} {args:?}: {err}");
    assert!(err.contains(says), "{exe} {args:?}: {err}");
}

/// rina-tgen's ON and OFF periods apply to the profiles that have them;
/// on any other (CBR, Poisson, the varying-rate sources) they were dropped
/// without a word and the flow ran as if they had not been given.
#[test]
fn tgen_refuses_overrides_its_profile_does_not_use() {
    for (args, says) in [
        (
            &["client", "--profile", "cbr", "--on-s", "2"][..],
            "profile cbr has no ON and OFF periods, so --on-s would change nothing",
        ),
        (
            &["client", "--profile", "video-hd", "--off-s", "1"],
            "profile video-hd has no ON and OFF periods, so --off-s",
        ),
    ] {
        refused_before_the_daemon(TGEN, args, says);
    }
    // A profile with periods still takes them (and then wants the daemon).
    let sock = missing_socket();
    let out = run(
        TGEN,
        &[
            "client",
            "--socket",
            &sock,
            "--profile",
            "voip",
            "--on-s",
            "2",
        ],
    );
    assert!(
        text(&out.stderr).contains("no RINA daemon"),
        "{}",
        text(&out.stderr)
    );
}

/// Values out of range were taken: rina-tgen panicked on `nan` seconds and
/// flooded probes at `--probe-interval-ms 0`; rina-perf ran unpaced at
/// `--rate-mbps 0` or `-1`, sent nothing at `--count 0` and answered
/// `--response-size 5` with 17 bytes; a negative delay bound became 0 ms
/// (and, 7 December tools audit, sizes, rates and periods out of range).
#[test]
fn option_values_out_of_range_are_refused() {
    for (exe, args, says) in [
        (
            TGEN,
            &["client", "--report-wait-s", "nan"][..],
            "not a number of seconds",
        ),
        (
            TGEN,
            &["client", "--alloc-retry-s=-1"],
            "not a number of seconds",
        ),
        (
            TGEN,
            &["client", "--interval-s=-1"],
            "not a number of seconds",
        ),
        (
            TGEN,
            &["client", "--probe-interval-ms", "nan"],
            "not a number above 0",
        ),
        (
            TGEN,
            &["client", "--probe-interval-ms", "0"],
            "not a number above 0",
        ),
        (
            TGEN,
            &["client", "--duration-s", "1e300"],
            "not a length of time",
        ),
        (
            PERF,
            &["client", "--rate-mbps", "0"],
            "not a number above 0",
        ),
        (PERF, &["client", "--rate-mbps=-1"], "not a number above 0"),
        (PERF, &["client", "--count", "0"], "--count"),
        (
            PERF,
            &["client", "--duration-s", "inf"],
            "not a length of time",
        ),
        (
            PERF,
            &["client", "--test", "rr", "--response-size", "5"],
            "--response-size",
        ),
        (
            PERF,
            &["client", "--test", "rr", "--timeout-ms", "0"],
            "--timeout-ms",
        ),
        (
            ECHO,
            &["client", "--max-delay-ms=-5"],
            "not a number, 0 or more",
        ),
        (
            PERF,
            &["client", "--max-delay-ms", "nan"],
            "not a number, 0 or more",
        ),
        // A pace of 10^-9 Mb/s slept 130 days between two SDUs.
        (PERF, &["client", "--rate-mbps", "1e-9"], "--rate-mbps"),
        (PERF, &["client", "--rate-mbps", "1e-9"], "is not a pace"),
        // A buffer of the size was allocated before the flow was asked.
        (
            PERF,
            &["client", "--size", "1099511627776"],
            "more than 1048576",
        ),
        (PERF, &["client", "--sweep", "64,2000000"], "bad size"),
        // Sources the generator's loops never got out of, or allocated.
        (TGEN, &["client", "--rate-bps", "1e300"], "--rate-bps"),
        (
            TGEN,
            &["client", "--profile", "on-off", "--on-s", "1e-300"],
            "--on-s",
        ),
        (
            TGEN,
            &["client", "--profile", "voice", "--off-s", "0"],
            "--off-s",
        ),
        (TGEN, &["client", "--size", "1099511627776"], "--size"),
        (
            TGEN,
            &["client", "--profile", "voice", "--rate-bps", "1e12"],
            "SDU interval (voice's rate sets it)",
        ),
        (ECHO, &["server", "--max-flows", "0"], "--max-flows"),
        // Every reply was late: 100 % loss.
        (ECHO, &["client", "--timeout-ms", "0"], "--timeout-ms"),
        (PERF, &["server", "--max-flows", "0"], "--max-flows"),
        (TGEN, &["server", "--max-flows", "0"], "--max-flows"),
        // --max-sdu below what the run writes: the DIF was told one size
        // and given another.
        (
            ECHO,
            &["client", "--max-sdu", "10"],
            "bad --max-sdu: 10 bytes is less than the probes of 64 bytes",
        ),
        (
            PERF,
            &["client", "--sweep", "100,1000", "--max-sdu", "500"],
            "the DATA SDUs of 1000 bytes",
        ),
        (
            TGEN,
            &["client", "--max-sdu", "1000"],
            "the SDUs of 1400 bytes",
        ),
    ] {
        refused_before_the_daemon(exe, args, says);
    }
}

/// Options a run does not use were dropped without a word: rina-perf's
/// request/response options on a perf test (and its pacing on an rr test),
/// rina-tgen's one-flow options beside a traffic matrix.
#[test]
fn options_the_run_does_not_use_are_refused() {
    for (exe, args, says) in [
        (
            PERF,
            &["client", "--outstanding", "4"][..],
            "bad --outstanding: it is for request/response tests",
        ),
        (
            PERF,
            &["client", "--response-size", "100"],
            "bad --response-size",
        ),
        (PERF, &["client", "--timeout-ms", "50"], "bad --timeout-ms"),
        (
            PERF,
            &["client", "--test", "rr", "--rate-mbps", "10"],
            "bad --rate-mbps: it paces perf tests",
        ),
        (
            TGEN,
            &["client", "--matrix", "m.toml", "--profile", "voip"],
            "cannot be used with",
        ),
        (
            TGEN,
            &["client", "--matrix", "m.toml", "--reliable"],
            "cannot be used with",
        ),
        (
            TGEN,
            &["client", "--matrix", "m.toml", "--duration-s", "5"],
            "cannot be used with",
        ),
        // --size beside --sweep was dropped for the sweep's sizes.
        (
            PERF,
            &["client", "--size", "100", "--sweep", "200,300"],
            "cannot be used with",
        ),
    ] {
        refused_before_the_daemon(exe, args, says);
    }
}

/// A reader that goes away (`| head`) ends a tool quietly: no panic about
/// a broken pipe.
#[test]
fn a_closed_stdout_ends_a_tool_without_a_panic() {
    let mut fds = [0; 2];
    // Close-on-exec: a process another test thread spawns meanwhile must
    // not inherit the read end and keep the pipe open.
    // SAFETY: `pipe2` fills the two descriptors it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
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
        (env!("CARGO_BIN_EXE_rina-gw"), "rina-gw"),
        (CAT, "rina-cat"),
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

/// rina-gw says what is wrong with a mapping, and that it has none.
#[test]
fn rina_gw_refuses_bad_or_missing_mappings() {
    let gw = env!("CARGO_BIN_EXE_rina-gw");
    let out = run(gw, &["--socket", "/nonexistent/rinad.sock"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("give at least one --tcp-to-rina"),
        "{}",
        text(&out.stderr)
    );
    let out = run(gw, &["--tcp-to-rina", "127.0.0.1:80"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("has no `=` between its two sides"),
        "{}",
        text(&out.stderr)
    );
    let out = run(gw, &["--rina-to-tcp", "web=nowhere"]);
    assert!(
        text(&out.stderr).contains("`nowhere` is not a TCP address"),
        "{}",
        text(&out.stderr)
    );
    // A configuration file's bad line is named, with the file.
    let conf = std::env::temp_dir().join(format!("rina-gw-test-{}.conf", std::process::id()));
    std::fs::write(&conf, "# mappings\nI2R net web 127.0.0.1\n").unwrap();
    let out = run(gw, &["--config", conf.to_str().unwrap()]);
    let _ = std::fs::remove_file(&conf);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(".conf: line 2: `I2R` takes four words, DIF APP IP PORT, not 3"),
        "{err}"
    );
    // No daemon: the registration fails at once, naming the name.
    let out = run(
        gw,
        &[
            "--socket",
            "/nonexistent/rinad.sock",
            "--rina-to-tcp",
            "web=127.0.0.1:80",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("rina-gw: cannot register web"),
        "{}",
        text(&out.stderr)
    );
}

/// rina-cat refuses options its role does not use, and says what it
/// could not start: exit code 2 either way.
#[test]
fn rina_cat_refuses_options_its_role_does_not_use_and_needs_a_daemon() {
    let sock = missing_socket();
    for (args, says) in [
        (&["-k", "app"][..], "--listen"),
        (&["-l", "--wait-ms", "100", "app"], "cannot be used with"),
        (&["-l", "--unreliable", "app"], "cannot be used with"),
        (&["-l", "--name", "me", "app"], "cannot be used with"),
        (&["--wait-ms=-1", "app"], "--wait-ms"),
        (&["a b"], "not allowed"),
        (&[], "<NAME>"),
    ] {
        let out = run(CAT, &[&["--socket", &sock][..], args].concat());
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("no RINA daemon"), "{args:?}: {err}");
    }
    for args in [&["app"][..], &["-l", "app"]] {
        let out = run(CAT, &[&["--socket", &sock][..], args].concat());
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("rina-cat: cannot connect to the daemon") && err.contains(&sock),
            "{args:?}: {err}"
        );
    }
}
