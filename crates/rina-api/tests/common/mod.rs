//! Helpers for the C API tests: real `rinad` processes on loopback, and C
//! programs compiled with `cc` against the library cargo just built.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `target/debug` (or `release`): where cargo put the libraries and `rinad`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/debug/deps/capi-HASH -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The `rinad` binary, built first if this test runs alone (`cargo test -p
/// rina-api` does not build other packages' binaries).
pub fn rinad() -> PathBuf {
    let dir = target_dir();
    let bin = dir.join("rinad");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "rinad"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("run cargo").success(), "building rinad");
    }
    bin
}

/// Where this build's `librina_api.a` and `.so` are: `cargo test` leaves
/// them in `deps/` beside the test executable (only `cargo build` copies them
/// up to `target/debug`, where they may be stale).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    if deps.join("librina_api.a").exists() && deps.join("librina_api.so").exists() {
        deps
    } else {
        target_dir()
    }
}

/// The crate's `include` directory.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// How a test program links the library.
#[derive(Clone, Copy, Debug)]
pub enum Link {
    /// Against `librina_api.a`.
    Static,
    /// Against `librina_api.so`, found at run time through an rpath.
    Shared,
}

/// Compiles `tests/c/<name>.c` into `out`; panics with the compiler's output.
pub fn compile(name: &str, out: &Path, link: Link) -> PathBuf {
    let lib = lib_dir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let exe = out.join(format!("{name}-{link:?}").to_lowercase());
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args([
        "-std=c99",
        "-D_DEFAULT_SOURCE",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
    ])
    .arg(include_dir())
    .arg(&src)
    .arg("-o")
    .arg(&exe);
    match link {
        Link::Static => {
            cc.arg(lib.join("librina_api.a")).args([
                "-lpthread",
                "-ldl",
                "-lm",
                "-lrt",
                "-lutil",
                "-lgcc_s",
            ]);
        }
        Link::Shared => {
            cc.arg("-L")
                .arg(&lib)
                .arg("-lrina_api")
                .arg(format!("-Wl,-rpath,{}", lib.display()));
        }
    }
    let o = cc.output().expect("run cc");
    assert!(
        o.status.success(),
        "cc {name}.c failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

/// A fresh directory for one test.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(
        format!("rina-api-{tag}-{}-{:?}", std::process::id(), Instant::now())
            .replace([' ', '{', '}', ':', ','], ""),
    );
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Waits for `cond` with a deadline; panics with `what` if it never holds.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// A running `rinad` with one shim-udp IPCP in DIF `udp`; killed on drop.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: PathBuf,
}

impl Daemon {
    /// Starts `name` with its shim bound to an ephemeral loopback port and
    /// the directory entries `(name, udp address)`.
    pub fn start(name: &str, directory: &[(&str, String)]) -> Daemon {
        let dir = temp_dir(name);
        let mut cfg = format!(
            "[system]\nname = \"{name}\"\n[[ipcp]]\nname = \"{name}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\nmax_sdu = 1400\n[ipcp.directory]\n"
        );
        for (n, a) in directory {
            cfg.push_str(&format!("\"{n}\" = \"{a}\"\n"));
        }
        let conf = dir.join("rinad.toml");
        std::fs::write(&conf, cfg).expect("config");
        let socket = dir.join("rinad.sock");
        let log = std::fs::File::create(dir.join("rinad.log")).expect("log");
        let child = Command::new(rinad())
            .arg("--config")
            .arg(&conf)
            .arg("--socket")
            .arg(&socket)
            .arg("--log-level")
            .arg("debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rinad");
        let d = Daemon { child, socket, dir };
        wait_for("rinad to answer", Duration::from_secs(10), || {
            rina::Client::connect_to(&d.socket).is_ok()
        });
        d
    }

    /// The UDP address its shim IPCP is bound to.
    pub fn udp_addr(&self) -> String {
        let mut c = rina::Client::connect_to(&self.socket).expect("connect");
        c.list_ipcps().expect("list ipcps")[0].address.clone()
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.join("rinad.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.dir.display(), self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server daemon `beta` and the client daemon `alpha`, which knows
/// `names` at `beta`.
pub fn pair(names: &[&str]) -> (Daemon, Daemon) {
    let beta = Daemon::start("beta", &[]);
    let addr = beta.udp_addr();
    let dir: Vec<(&str, String)> = names.iter().map(|n| (*n, addr.clone())).collect();
    let alpha = Daemon::start("alpha", &dir);
    (alpha, beta)
}

/// The lines a child prints, delivered by a reader thread.
pub struct Lines(mpsc::Receiver<String>);

impl Lines {
    pub fn new(out: ChildStdout) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// The next line, waiting at most `t`; `None` at end or timeout.
    pub fn next(&self, t: Duration) -> Option<String> {
        self.0.recv_timeout(t).ok()
    }
}

/// Kills a child when dropped (a failed test leaves nothing running).
pub struct Killer(pub Child);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rina_flow_alloc` from `local` to `remote`, in a DIF the daemon
/// chooses, with the default spec.
pub fn alloc(local: &std::ffi::CStr, remote: &std::ffi::CStr, flags: libc::c_uint) -> libc::c_int {
    // SAFETY: NUL-terminated names; a NULL DIF and spec are the defaults.
    unsafe {
        rina_api::rina_flow_alloc(
            std::ptr::null(),
            local.as_ptr(),
            remote.as_ptr(),
            std::ptr::null(),
            flags,
        )
    }
}
