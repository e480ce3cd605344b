//! The shim DIF for hypervisors with a real virtual machine: a QEMU guest
//! whose `rinad` maps the BAR 2 of an `ivshmem-plain` device, backed by the
//! file the host's `rinad` lays out in `/dev/shm`. No doorbells (a real
//! ivshmem-plain device has none): both sides poll every millisecond.
//!
//! The guest (kernel and busybox from Debian's packages, this build's
//! binaries, `tests/qemu/init.sh` as `/init`) is built by
//! `tests/qemu/build-guest.sh` into `<target>/qemu-guest/`. The test:
//!
//! * guest -> host: `rina-echo client` and `rina-perf client` in the guest
//!   against servers on the host (results on the serial console);
//! * host -> guest: SDUs of 1 byte to 64 KiB echoed by `rina-echo server`
//!   in the guest, checked byte for byte, and `rina-perf client` on the
//!   host against `rina-perf server` in the guest;
//! * the host's counters: both allocations arrived, no ring errors, no
//!   doorbell.
//!
//! Skipped (with the reason printed) without `qemu-system-x86_64`, or when
//! the guest cannot be built here (no apt-get, no package download).
//! `RINA_QEMU_ACCEL=kvm|tcg|auto` picks the accelerator (auto: KVM when
//! `/dev/kvm` opens and the guest boots with it in 15 s, else TCG).

mod common;

use common::{name, temp_dir, wait_for, Daemon};
use rina::{Client, QosSpec};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The whole test, boot included, ends within this (QEMU is killed).
const OVERALL: Duration = Duration::from_secs(180);
/// How long a KVM guest may take to reach `/init` before TCG is tried.
const KVM_BOOT: Duration = Duration::from_secs(15);
const T: Duration = Duration::from_secs(10);
const DIF: &str = "hv0";
const ECHO_COUNT: u64 = 20;
const PERF_SIZES: &str = "1400,65536";

#[test]
fn qemu_guest_over_ivshmem() {
    let Some(qemu) = find_in_path("qemu-system-x86_64") else {
        println!("skipped: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)");
        return;
    };
    let bin = tool_dir();
    let image = match build_guest(&bin) {
        Ok(i) => i,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };

    // The host: rinad on a fresh file in /dev/shm, echo and perf servers.
    let shm = ShmFile::new();
    let host = start_host(&shm);
    let (_echo_srv, _perf_srv) = start_host_servers(&bin, &host);

    let deadline = Instant::now() + OVERALL;
    let (mut vm, accel) = boot(&qemu, &image, &shm.0, deadline);
    check_guest_boots(&mut vm, accel, &host, deadline);

    // Guest -> host: the guest's clients report on the console.
    check_guest_to_host(&mut vm, &host, deadline);

    // Host -> guest: SDUs of every size echoed intact.
    let mut c = host.client();
    check_host_to_guest_echo(&vm, &mut c);
    check_host_to_guest_perf(&vm, &bin, &host);

    // The guest's servers had one flow each: it powers off.
    check_guest_powers_off(&mut vm, deadline);

    // A guest that powered off stops its heartbeat: the host notices.
    check_host_sees_guest_gone(&vm, &bin, &host, accel);
}

/// Starts the host's `rinad` with a shim-hv IPCP on the shared-memory file.
fn start_host(shm: &ShmFile) -> Daemon {
    Daemon::start_with(
        "qemu-host",
        &format!(
            "[system]\nname = \"host\"\n\n[[ipcp]]\nname = \"host.hv\"\ntype = \"shim-hv\"\ndif = \"{DIF}\"\npath = \"{}\"\nside = \"host\"\n",
            shm.0.display()
        ),
    )
}

/// Starts the host's echo and perf servers and waits until both registered.
fn start_host_servers(bin: &Path, host: &Daemon) -> (Proc, Proc) {
    let echo_srv = Proc::spawn(
        Command::new(bin.join("rina-echo"))
            .args(["server", "--dif", DIF, "--name", "echo", "--socket"])
            .arg(&host.socket),
    );
    let perf_srv = Proc::spawn(
        Command::new(bin.join("rina-perf"))
            .args(["server", "--dif", DIF, "--name", "perf", "--socket"])
            .arg(&host.socket),
    );
    wait_for("the host servers to register", T, || {
        let names = host.client().list_names().unwrap();
        ["echo", "perf"]
            .iter()
            .all(|n| names.iter().any(|x| x.name == name(n)))
    });
    (echo_srv, perf_srv)
}

/// Waits for the guest to boot and bring its shim-hv peer up; prints the times.
fn check_guest_boots(vm: &mut Vm, accel: &str, host: &Daemon, deadline: Instant) {
    let booted = vm.expect("GUEST-BOOT", deadline);
    let dev = vm.expect("GUEST-DEV", deadline);
    let up = vm.expect("GUEST-UP", deadline);
    println!(
        "guest ({accel}): /init after {:.2} s, shim-hv peer up after {:.2} s (QEMU start to serial line; {booted}; {dev})",
        vm.at(&booted).as_secs_f64(),
        vm.at(&up).as_secs_f64()
    );
    assert_eq!(host.counter("peer_up"), 1, "the host sees the guest");
}

/// Checks the echo and perf reports of the guest's clients (guest -> host).
fn check_guest_to_host(vm: &mut Vm, host: &Daemon, deadline: Instant) {
    let serving = vm.expect("GUEST-SERVING", deadline);
    let lines = vm.lines();
    let echo_json = lines
        .iter()
        .find_map(|l| l.strip_prefix("GUEST-JSON echo "))
        .unwrap_or_else(|| vm.fail("no echo report from the guest"));
    let echo: serde_json::Value = serde_json::from_str(echo_json)
        .unwrap_or_else(|e| vm.fail(&format!("bad echo report {echo_json}: {e}")));
    assert_eq!(echo["sent"], ECHO_COUNT, "{echo}");
    assert_eq!(
        echo["received"], ECHO_COUNT,
        "every probe of the guest came back: {echo}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("GUEST-RESULT echo ok {ECHO_COUNT}/{ECHO_COUNT}"))),
        "{lines:#?}"
    );
    println!(
        "guest -> host echo: {ECHO_COUNT}/{ECHO_COUNT} replies of {} bytes, RTT min/avg/p50/max = {:.3}/{:.3}/{:.3}/{:.3} ms",
        echo["size"],
        echo["rtt_ms"]["min"].as_f64().unwrap(),
        echo["rtt_ms"]["avg"].as_f64().unwrap(),
        echo["rtt_ms"]["p50"].as_f64().unwrap(),
        echo["rtt_ms"]["max"].as_f64().unwrap()
    );
    let guest_perf: Vec<PerfRow> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("GUEST-PERF-CSV "))
        .filter_map(PerfRow::parse)
        .collect();
    check_perf("guest -> host", &guest_perf).unwrap_or_else(|e| vm.fail(&e));
    let counters = host.client().list_ipcps().unwrap()[0].counters.clone();
    assert!(
        counters["alloc_requests_in"] >= 2,
        "the guest's echo and perf flows reached the host: {counters:?}"
    );
    println!("{serving}");
}

/// Sends SDUs of 1 byte to 64 KiB to the guest's echo server through `c`
/// and checks each comes back intact; prints the RTTs.
fn check_host_to_guest_echo(vm: &Vm, c: &mut Client) {
    let flow = c
        .allocate(
            &name("host-app"),
            &name("vm-echo"),
            Some(DIF),
            &QosSpec::default(),
        )
        .unwrap_or_else(|e| vm.fail(&format!("cannot allocate a flow to vm-echo: {e}")));
    assert_eq!(flow.info().dif, DIF);
    let mut buf = vec![0u8; 70_000];
    let mut rtts = Vec::new();
    let sizes = [1usize, 64, 1000, 4092, 4093, 9000, 32_768, 65_536];
    for round in 0..10u8 {
        for (k, &size) in sizes.iter().enumerate() {
            let sdu: Vec<u8> = (0..size)
                .map(|i| (i as u8) ^ round.wrapping_mul(31) ^ (k as u8))
                .collect();
            let t0 = Instant::now();
            flow.write(&sdu).unwrap();
            let n = flow
                .read_timeout(&mut buf, T)
                .unwrap()
                .unwrap_or_else(|| vm.fail(&format!("no echo of {size} bytes from the guest")));
            if size == 1000 {
                rtts.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            assert!(
                buf[..n] == sdu[..],
                "round {round}: the {size}-byte SDU came back as {n} different bytes"
            );
        }
    }
    let flows = c.list_flows().unwrap();
    let f = flows
        .iter()
        .find(|f| f.info.remote == name("vm-echo"))
        .unwrap_or_else(|| panic!("the host lists the flow to vm-echo: {flows:?}"));
    assert_eq!(f.counters.sdus_out, 10 * sizes.len() as u64, "{f:?}");
    assert_eq!(f.counters.sdus_in, 10 * sizes.len() as u64, "{f:?}");
    rtts.sort_by(f64::total_cmp);
    println!(
        "host -> guest echo: {} SDUs of 1 B to 64 KiB echoed intact; 1000-byte RTT min/avg/p50/max = {:.3}/{:.3}/{:.3}/{:.3} ms",
        f.counters.sdus_in,
        rtts[0],
        rtts.iter().sum::<f64>() / rtts.len() as f64,
        rtts[rtts.len() / 2],
        rtts[rtts.len() - 1]
    );
    flow.deallocate();
}

/// Runs `rina-perf client` on the host against the guest's perf server.
fn check_host_to_guest_perf(vm: &Vm, bin: &Path, host: &Daemon) {
    let out = Command::new(bin.join("rina-perf"))
        .args([
            "client",
            "--dif",
            DIF,
            "--dst",
            "vm-perf",
            "--duration-s",
            "2",
            "--sweep",
            PERF_SIZES,
            "--csv",
            "--socket",
        ])
        .arg(&host.socket)
        .stdin(Stdio::null())
        .output()
        .expect("run rina-perf client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rina-perf client to the guest failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let host_perf: Vec<PerfRow> = stdout.lines().filter_map(PerfRow::parse).collect();
    check_perf("host -> guest", &host_perf).unwrap_or_else(|e| vm.fail(&e));
}

/// Waits for the guest to power off and checks its console shows no failure.
fn check_guest_powers_off(vm: &mut Vm, deadline: Instant) {
    vm.expect("GUEST-DONE", deadline);
    vm.wait_exit(deadline);
    let lines = vm.lines();
    assert!(
        !lines.iter().any(|l| l.starts_with("GUEST-FAIL")),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("serve timeout")),
        "{lines:#?}"
    );
}

/// Waits for the host to see the guest gone, checks its counters and
/// prints `rinactl ipcps` and QEMU's run time.
fn check_host_sees_guest_gone(vm: &Vm, bin: &Path, host: &Daemon, accel: &str) {
    wait_for("the host to see the guest gone", T, || {
        host.counter("peer_up") == 0
    });
    let counters = host.client().list_ipcps().unwrap()[0].counters.clone();
    assert_eq!(counters["peer_losses"], 1, "{counters:?}");
    for k in [
        "rx_ring_errors",
        "tx_ring_errors",
        "rx_malformed",
        "doorbell",
        "bell_wakeups",
    ] {
        assert_eq!(counters[k], 0, "{k}: {counters:?}");
    }
    assert!(counters["alloc_requests_in"] >= 2, "{counters:?}");
    let rinactl = Command::new(bin.join("rinactl"))
        .arg("--socket")
        .arg(&host.socket)
        .arg("ipcps")
        .output()
        .expect("run rinactl");
    println!(
        "host `rinactl ipcps` after the run:\n{}",
        String::from_utf8_lossy(&rinactl.stdout)
    );
    println!(
        "QEMU ({accel}) ran {:.1} s from start to power-off",
        vm.started.elapsed().as_secs_f64()
    );
}

/// One row of `rina-perf client --csv`.
#[derive(Debug)]
struct PerfRow {
    size: u64,
    sent: u64,
    recv: u64,
    rx_mbps: f64,
}

impl PerfRow {
    /// `size,sent_sdus,recv_sdus,loss_pct,tx_mbps,rx_mbps,rx_sdus_per_s`.
    fn parse(line: &str) -> Option<PerfRow> {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != 7 {
            return None;
        }
        Some(PerfRow {
            size: f[0].parse().ok()?,
            sent: f[1].parse().ok()?,
            recv: f[2].parse().ok()?,
            rx_mbps: f[5].parse().ok()?,
        })
    }
}

/// Checks a perf run: one test per size of [`PERF_SIZES`], each with SDUs
/// delivered and none lost; prints the figures.
fn check_perf(what: &str, rows: &[PerfRow]) -> Result<(), String> {
    let sizes: Vec<u64> = PERF_SIZES.split(',').map(|s| s.parse().unwrap()).collect();
    if rows.iter().map(|r| r.size).collect::<Vec<_>>() != sizes {
        return Err(format!(
            "{what}: not one perf test per size of {PERF_SIZES}: {rows:?}"
        ));
    }
    for r in rows {
        // Flows over shim-hv are lossless (back-pressure end to end).
        if r.recv == 0 || r.recv != r.sent {
            return Err(format!("{what}: SDUs lost or none delivered: {r:?}"));
        }
        println!(
            "{what} perf: {}-byte SDUs, {} sent, {} delivered, goodput {:.1} Mb/s",
            r.size, r.sent, r.recv, r.rx_mbps
        );
    }
    Ok(())
}

/// The kernel and initramfs of the guest.
struct Image {
    kernel: PathBuf,
    initrd: PathBuf,
}

/// Builds the guest with `tests/qemu/build-guest.sh` (the kernel and busybox
/// are cached in `<target>/qemu-guest/`). `Err` when the environment
/// cannot (the script exits 3); a broken script fails the test.
fn build_guest(bin: &Path) -> Result<Image, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/qemu/build-guest.sh");
    let cache = bin.parent().expect("target dir").join("qemu-guest");
    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .arg("--bin-dir")
        .arg(bin)
        .arg("--cache")
        .arg(&cache)
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => {}
        Some(3) => return Err(stderr.trim().to_string()),
        _ => panic!("build-guest.sh failed ({}): {stdout}{stderr}", out.status),
    }
    let get = |k: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("build-guest.sh printed no {k}: {stdout}"))
    };
    println!(
        "guest image built in {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        stderr.lines().last().unwrap_or("")
    );
    Ok(Image {
        kernel: get("KERNEL="),
        initrd: get("INITRD="),
    })
}

/// Boots the guest: with KVM when asked or usable, else (or when a KVM
/// guest does not reach `/init` in [`KVM_BOOT`]) with TCG.
fn boot(qemu: &Path, image: &Image, shm: &Path, deadline: Instant) -> (Vm, &'static str) {
    let want = std::env::var("RINA_QEMU_ACCEL").unwrap_or_else(|_| "auto".into());
    let kvm_ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    match want.as_str() {
        "tcg" => (Vm::start(qemu, image, shm, "tcg"), "tcg"),
        "kvm" => (Vm::start(qemu, image, shm, "kvm"), "kvm"),
        _ if !kvm_ok => {
            println!("/dev/kvm is not usable: TCG");
            (Vm::start(qemu, image, shm, "tcg"), "tcg")
        }
        _ => {
            let mut vm = Vm::start(qemu, image, shm, "kvm");
            if vm
                .wait_line("GUEST-BOOT", Instant::now() + KVM_BOOT)
                .is_some()
            {
                return (vm, "kvm");
            }
            println!(
                "KVM did not boot the guest within {KVM_BOOT:?} (its serial output: {:?}); falling back to TCG",
                vm.lines()
            );
            drop(vm);
            assert!(Instant::now() < deadline);
            (Vm::start(qemu, image, shm, "tcg"), "tcg")
        }
    }
}

/// A running QEMU, killed on drop, and the lines of its serial console.
struct Vm {
    child: Child,
    started: Instant,
    rx: Receiver<(Instant, String)>,
    /// Every line so far, with when it came.
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Vm {
    fn start(qemu: &Path, image: &Image, shm: &Path, accel: &str) -> Vm {
        let mut cmd = Command::new(qemu);
        cmd.args(["-M", "q35", "-accel", accel, "-m", "256", "-smp", "1"]);
        if accel == "tcg" {
            cmd.args(["-cpu", "max"]);
        }
        cmd.args(["-nographic", "-no-reboot", "-nic", "none", "-kernel"])
            .arg(&image.kernel)
            .arg("-initrd")
            .arg(&image.initrd)
            .args([
                "-append",
                &format!(
                    "console=ttyS0 quiet panic=-1 rina.dif={DIF} rina.echo_count={ECHO_COUNT} rina.perf_s=2 rina.perf_sizes={PERF_SIZES} rina.serve_s=60"
                ),
                "-object",
                &format!(
                    "memory-backend-file,id=hv0,share=on,mem-path={},size=16M",
                    shm.display()
                ),
                "-device",
                "ivshmem-plain,memdev=hv0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().expect("spawn qemu-system-x86_64");
        let (tx, rx) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(out);
                let mut raw = Vec::new();
                while r.read_until(b'\n', &mut raw).is_ok_and(|n| n > 0) {
                    let line = String::from_utf8_lossy(&raw).trim_end().to_string();
                    raw.clear();
                    // The firmware's escape sequences may precede a line.
                    let line = match line.find("GUEST-") {
                        Some(i) => line[i..].to_string(),
                        None => line,
                    };
                    let now = Instant::now();
                    seen.lock().unwrap().push((now, line.clone()));
                    if tx.send((now, line)).is_err() {
                        break;
                    }
                }
            });
        }
        Vm {
            child,
            started,
            rx,
            seen,
        }
    }

    /// The next line starting with `prefix` (a `GUEST-FAIL` line, QEMU
    /// exiting or the deadline fail the test).
    fn expect(&mut self, prefix: &str, deadline: Instant) -> String {
        match self.wait_line(prefix, deadline) {
            Some(l) => l,
            None => self.fail(&format!("no {prefix} line from the guest")),
        }
    }

    fn wait_line(&mut self, prefix: &str, deadline: Instant) -> Option<String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((_, l)) => {
                    if l.starts_with("GUEST-FAIL") {
                        self.fail(&l);
                    }
                    if l.starts_with(prefix) {
                        return Some(l);
                    }
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    return None
                }
            }
        }
    }

    /// When `line` came, since QEMU started.
    fn at(&self, line: &str) -> Duration {
        let seen = self.seen.lock().unwrap();
        let t = seen
            .iter()
            .find(|(_, l)| l == line)
            .map_or(Instant::now(), |(t, _)| *t);
        t - self.started
    }

    fn lines(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }

    fn wait_exit(&mut self, deadline: Instant) {
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "qemu exited with {st}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.fail("QEMU did not exit after the guest powered off");
    }

    /// Fails the test with the serial console so far.
    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what} ({:.1} s after QEMU started); serial console:\n{}",
            self.started.elapsed().as_secs_f64(),
            self.lines().join("\n")
        )
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed on drop.
struct Proc(Child);

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        Proc(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn a server"),
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The shared-memory file (in /dev/shm when there is one), removed on drop
/// with the doorbell socket next to it.
struct ShmFile(PathBuf);

impl ShmFile {
    fn new() -> ShmFile {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            temp_dir("qemu-shm")
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        ShmFile(dir.join(format!("rina-hv-qemu-{}-{nanos}", std::process::id())))
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let mut bell = self.0.clone().into_os_string();
        bell.push(".bell");
        let _ = std::fs::remove_file(bell);
    }
}

fn find_in_path(exe: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(exe))
        .find(|p| p.is_file())
}

/// Where the tools are: next to `rinad`, built first if this test runs
/// alone (`cargo test -p rinad` does not build other packages' binaries).
fn tool_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_rinad"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let tools = ["rina-echo", "rina-perf", "rinactl"];
    if tools.iter().any(|t| !dir.join(t).exists()) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "rina-tools"]);
        for t in tools {
            cmd.args(["--bin", t]);
        }
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("run cargo").success(),
            "building the tools"
        );
    }
    dir
}
