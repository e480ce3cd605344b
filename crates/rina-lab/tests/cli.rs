//! The `rina-lab` command line: `check` prints what it derived and names
//! the line of a broken file, `run` refuses a bogus backend before starting
//! anything, `plot` and `show` work from a run folder's `run.json`.

use rina_lab::results::{FlowRecord, RunOutput, Sample};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rina-lab"))
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/lab")
        .join(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn check_prints_the_derived_bootstrap_and_enrollment_order() {
    let o = bin()
        .arg("check")
        .arg(example("line-3.toml"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    // b has two neighbours: it bootstraps `net`, a and c enroll through it.
    assert!(out.contains("bootstrap: b"), "{out}");
    assert!(out.contains("enrollment: b, a (via b), c (via b)"), "{out}");
    assert!(out.contains("adjacencies: 2"), "{out}");
    // Flows per class: two echo probes, one tgen, one perf.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.contains(&vec!["echo", "echo", "2"]), "{out}");
    assert!(rows.contains(&vec!["cbr-2M", "tgen", "1"]), "{out}");
    assert!(out.contains("over 1 normal DIF"), "{out}");
    // The simulator would run it on the stack.
    assert!(out.contains("on --backend sim, engine: protocol"), "{out}");
}

#[test]
fn check_checks_every_variant() {
    let o = bin()
        .arg("check")
        .arg(example("home-isp.toml"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    for v in ["rlim: ok", "qta: ok", "ds: ok"] {
        assert!(out.contains(v), "{v}: {out}");
    }
}

#[test]
fn broken_file_exits_2_naming_the_line() {
    let d = tmp("broken");
    let f = d.join("broken.toml");
    std::fs::write(
        &f,
        "nodes = [\"a\", \"b\"]\n[experiment]\nname = \"x\"\nduration = \"1s\"\n\
         [[link]]\nbetween = [\"a\", \"zz\"]\n",
    )
    .unwrap();
    for cmd in ["check", "run"] {
        let o = bin().arg(cmd).arg(&f).arg("--help").output().unwrap();
        assert!(o.status.success(), "{cmd} --help");
        let o = bin().arg(cmd).arg(&f).current_dir(&d).output().unwrap();
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("line 6") && err.contains("unknown node `zz`"),
            "{err}"
        );
    }
    // Nothing was started, so nothing was written.
    assert!(!d.join("results").exists());
}

#[test]
fn unknown_backend_and_variant_fail_before_anything_starts() {
    let d = tmp("bogus");
    let out = d.join("run");
    let o = bin()
        .args(["run", "--backend", "bogus", "--out"])
        .arg(&out)
        .arg(example("line-3.toml"))
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no backend `bogus`") && err.contains("local"),
        "{err}"
    );
    assert!(!out.exists());

    let o = bin()
        .args(["run", "--backend", "sim", "--variant", "nope", "--out"])
        .arg(&out)
        .arg(example("home-isp.toml"))
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no variant `nope`") && err.contains("rlim"),
        "{err}"
    );
    assert!(!out.exists());
    // A file without variants says so.
    let o = bin()
        .args(["check", "--variant", "nope"])
        .arg(example("line-3.toml"))
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("it has none"), "{err}");

    let o = bin()
        .args(["run", "--duration", "soon"])
        .arg(example("line-3.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

fn synthetic(variant: &str, scale: f64) -> RunOutput {
    let flow = |class: &str, avg: f64| FlowRecord {
        flow: format!("t0.{class}.a>b"),
        kind: "tgen".into(),
        class: class.into(),
        sent: 1000,
        received: 990,
        delay_min_ms: Some(avg / 2.0),
        delay_avg_ms: Some(avg),
        delay_max_ms: Some(avg * 4.0),
        ..Default::default()
    };
    RunOutput {
        backend: "sim".into(),
        experiment: "synthetic".into(),
        variant: Some(variant.into()),
        duration_s: 5.0,
        wall_time_s: 1.0,
        flows: vec![flow("Gold", scale), flow("BE", 10.0 * scale)],
        samples: (1..200)
            .flat_map(|i| {
                let x = i as f64 / 100.0;
                [
                    Sample {
                        class: "Gold".into(),
                        delay_ms: x * scale,
                    },
                    Sample {
                        class: "BE".into(),
                        delay_ms: 10.0 * x * scale,
                    },
                ]
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn plot_and_show_work_from_run_json() {
    let d = tmp("replot");
    synthetic("spn", 5.0).write(&d.join("spn")).unwrap();
    synthetic("spn+mr", 1.0).write(&d.join("spn+mr")).unwrap();

    // The folder of a run with variants stands for its variants.
    let o = bin().arg("plot").arg(&d).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    for v in ["spn", "spn+mr"] {
        let png = std::fs::read(d.join(v).join("plots/delay_cdf.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        assert!(d.join(v).join("plots/delay_cdf.svg").is_file());
    }
    let cmp = std::fs::read_to_string(d.join("plots/compare_delay.svg")).unwrap();
    assert!(cmp.contains("spn+mr") && cmp.contains("Gold"));
    assert!(d.join("plots/compare_delay_cdf.png").is_file());

    // `<run>/*`, as the docs write it, also names what `run` writes beside
    // the variants (the file's copy, the comparison plots): left out.
    std::fs::write(d.join("synthetic.toml"), "nodes = []\n").unwrap();
    let mut glob: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    glob.sort();
    assert_eq!(glob.len(), 4, "{glob:?}");
    let o = bin().arg("plot").args(&glob).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("comparison plots"), "{out}");
    let o = bin().arg("show").args(&glob).output().unwrap();
    assert!(o.status.success(), "{}", text(&o).1);

    let o = bin().arg("show").arg(d.join("spn")).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("synthetic [spn] on sim"), "{out}");
    let gold = out.lines().find(|l| l.starts_with("Gold")).unwrap();
    assert!(gold.contains("5.000"), "{gold}");

    let o = bin().args(["show", "--json"]).arg(&d).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[1]["variant"], "spn+mr");
    assert_eq!(v[1]["summary"][1]["class"], "BE");

    let o = bin().arg("show").arg(d.join("nothing")).output().unwrap();
    assert_eq!(o.status.code(), Some(1));

    // A folder holding runs of two experiments is not one run's variants:
    // refused, and nothing in it redrawn.
    let mixed = tmp("mixed");
    synthetic("spn", 1.0).write(&mixed.join("one")).unwrap();
    let mut other = synthetic("spn", 1.0);
    other.experiment = "another".into();
    other.write(&mixed.join("two")).unwrap();
    let o = bin().arg("plot").arg(&mixed).output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("runs of 2 experiments (another, synthetic)"),
        "{err}"
    );
    assert!(!mixed.join("one/plots").exists(), "a run was redrawn");

    // No paper's figures for this experiment: said so, with the ones there are.
    let o = bin().arg("report").arg(d.join("spn")).output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no reference for experiment `synthetic`")
            && err.contains("metro-37")
            && err.contains("--reference"),
        "{err}"
    );
}

/// Needs the `sim` backend.
#[test]
fn run_on_sim_writes_the_run_folder() {
    let d = tmp("run-sim");
    let out = d.join("run");
    let o = bin()
        .args([
            "run",
            "--backend",
            "sim",
            "--duration",
            "1s",
            "--json",
            "--out",
        ])
        .arg(&out)
        .arg(example("line-3.toml"))
        .output()
        .unwrap();
    let (stdout, err) = text(&o);
    assert!(o.status.success(), "{stdout}\n{err}");
    for f in [
        "line-3.toml",
        "experiment.json",
        "run.json",
        "flows.csv",
        "summary.txt",
        "plots/delay_cdf.png",
        "plots/delay_cdf.svg",
        "plots/rtt_hops.svg",
        "plots/goodput_sdu.svg",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    assert!(out.join("logs").is_dir());
    let exp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("experiment.json")).unwrap()).unwrap();
    assert_eq!(exp["name"], "line-3");
    assert_eq!(exp["nodes"].as_array().unwrap().len(), 3);
    // --json: the outcome on stdout, one run, its classes.
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
    let classes: Vec<&str> = v["runs"][0]["summary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["echo", "cbr-2M", "over 1 normal DIF"]);
    let back = RunOutput::read(&out).unwrap();
    assert_eq!(back.backend, "sim");
    assert!(back.duration_s <= 1.0 + 1e-9, "{}", back.duration_s);
}

#[test]
fn generate_docs_writes_a_page_per_subcommand_and_completions() {
    let d = tmp("docs");
    let o = bin().arg("--generate-docs").arg(&d).output().unwrap();
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for f in [
        "man/man1/rina-lab.1",
        "man/man1/rina-lab-run.1",
        "man/man1/rina-lab-check.1",
        "completions/rina-lab.bash",
        "completions/_rina-lab",
        "completions/rina-lab.fish",
    ] {
        assert!(d.join(f).is_file(), "no {f}");
    }
    let page = std::fs::read_to_string(d.join("man/man1/rina-lab-run.1")).unwrap();
    assert!(page.contains("backend"), "{page}");
}

#[test]
fn run_on_ssh_needs_an_inventory_that_places_every_node() {
    let run = |args: &[&str]| {
        let o = bin()
            .arg("run")
            .arg(example("line-3.toml"))
            .args(args)
            .output()
            .unwrap();
        let (_, err) = text(&o);
        (o.status.code(), err)
    };
    let (code, err) = run(&["--backend", "ssh"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("needs --inventory FILE"), "{err}");
    let dir = tmp("ssh-inventory");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[host]]\nname = 1\n").unwrap();
    let (code, err) = run(&["--inventory", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("for the ssh backend, not local"), "{err}");
    let (code, err) = run(&["--backend", "ssh", "--inventory", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--inventory:"), "{err}");
    // A node on no host: refused before any host is contacted (the
    // address is one nobody answers at).
    let partial = dir.join("partial.toml");
    std::fs::write(
        &partial,
        "[[host]]\nname = \"h\"\naddress = \"192.0.2.1\"\nnodes = [\"a\", \"b\"]\n",
    )
    .unwrap();
    let out = dir.join("out");
    let (code, err) = run(&[
        "--backend",
        "ssh",
        "--inventory",
        partial.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--no-plots",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("node `c` is on no host"), "{err}");
}

/// Runs scripts/rina-lab-inventory.py for line-3 with `hosts` (`--eth`);
/// `None` if this machine has no python3 with tomllib (3.11+) or tomli.
fn inventory_script(name: &str, hosts: &str) -> Option<Output> {
    inventory_script_for(name, &example("line-3.toml"), hosts)
}

/// As `inventory_script`, for the experiment file `experiment`.
fn inventory_script_for(name: &str, experiment: &Path, hosts: &str) -> Option<Output> {
    let has_toml = Command::new("python3")
        .args([
            "-c",
            "try:\n import tomllib\nexcept ImportError:\n import tomli",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_toml {
        println!("skipped: no python3 with tomllib or tomli");
        return None;
    }
    let dir = tmp(name);
    let list = dir.join("hosts.txt");
    std::fs::write(&list, hosts).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/rina-lab-inventory.py");
    Some(
        Command::new("python3")
            .arg(script)
            .arg(experiment)
            .arg(&list)
            .arg("--eth")
            .output()
            .unwrap(),
    )
}

#[test]
fn inventory_script_places_links_on_the_interfaces_given() {
    let hosts = "a h1 ip=10.0.0.1 a--b=eth1\nb h2 port=2222 a--b=eth1 b--c=eth2\nc h3 b--c=eth1\n";
    let Some(o) = inventory_script("inv-ok", hosts) else {
        return;
    };
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("port = 2222\n"), "{out}");
    assert!(
        out.contains("[link.\"a--b\"]\neth = { \"a\" = \"eth1\", \"b\" = \"eth1\" }"),
        "{out}"
    );
    assert!(
        out.contains("[link.\"b--c\"]\neth = { \"b\" = \"eth2\", \"c\" = \"eth1\" }"),
        "{out}"
    );
}

/// A typo in a host line would leave a link on shim-udp over the control
/// network without a word (no link load, so no calibration): refused.
#[test]
fn inventory_script_refuses_what_would_silently_leave_a_link_on_shim_udp() {
    for (hosts, want) in [
        // The link is b--c, not c--b.
        (
            "a h1\nb h2 b--c=eth2\nc h3 c--b=eth1\n",
            "hosts.txt:3: `c--b` is neither ip, port, user nor a link",
        ),
        (
            "a h1\nb h2 b--c=eth2\nc h3\n",
            "link b--c: an interface for b but none for c",
        ),
        (
            "a h1 b--c=eth1\nb h2\nc h3\n",
            "link `b--c` is between b and c, not a",
        ),
        ("a h1 port=22x\nb h2\nc h3\n", "port `22x` is not a number"),
        ("a h1 eth1\nb h2\nc h3\n", "`eth1` is not KEY=VALUE"),
        // The second line for a node was taken, the first dropped.
        (
            "a h1\nb h2\nc h3\na h4\n",
            "hosts.txt:4: node `a` already given on line 1",
        ),
        (
            "a h1 port=99999\nb h2\nc h3\n",
            "hosts.txt:1: port 99999 is not between 1 and 65535",
        ),
        (
            "a h1 port=0\nb h2\nc h3\n",
            "hosts.txt:1: port 0 is not between 1 and 65535",
        ),
        ("a h1 port=22 port=23\nb h2\nc h3\n", "`port` given twice"),
    ] {
        let Some(o) = inventory_script("inv-bad", hosts) else {
            return;
        };
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{hosts:?} accepted: {out}");
        assert!(
            err.contains(want.trim_start_matches("h3.txt")),
            "{hosts:?}: {err}"
        );
        assert!(!err.contains("Traceback"), "{hosts:?}: {err}");
    }
}

/// A broken experiment file, or a missing one, is one line naming the
/// file (and the link), not a Python traceback.
#[test]
fn inventory_script_names_what_is_wrong_with_the_experiment_file() {
    let d = tmp("inv-exp");
    let hosts = "a h1\nb h2\n";
    for (i, (toml, want)) in [
        ("nodes = [\"a\", \"b\"\n", "not valid TOML"),
        (
            "nodes = [\"a\", \"b\"]\n[[link]]\nrate = \"1Mbps\"\n",
            "[[link]] #1: no `between`",
        ),
        (
            "nodes = [\"a\", \"b\"]\n[[link]]\nbetween = [\"a\"]\n",
            "[[link]] #1: `between` must name two nodes",
        ),
        (
            "nodes = [\"a\", \"b\"]\n[[link]]\nbetween = [\"a\", \"b\", \"a\"]\n",
            "[[link]] #1: `between` must name two nodes",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let exp = d.join(format!("exp{i}.toml"));
        std::fs::write(&exp, toml).unwrap();
        let Some(o) = inventory_script_for("inv-exp-hosts", &exp, hosts) else {
            return;
        };
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{toml:?} accepted: {out}");
        assert!(
            err.contains(&format!("exp{i}.toml: {want}")),
            "{toml:?}: {err}"
        );
        assert!(!err.contains("Traceback"), "{toml:?}: {err}");
    }
    let Some(o) = inventory_script_for("inv-exp-hosts", &d.join("none.toml"), hosts) else {
        return;
    };
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("none.toml: No such file"), "{err}");
    assert!(!err.contains("Traceback"), "{err}");
}

#[test]
fn a_dilation_or_scale_out_of_range_is_refused_before_anything_starts() {
    // `--dilate 1e-30` panicked converting the dilated times.
    let d = tmp("dilate");
    let out = d.join("run");
    for (args, why) in [
        (["--dilate", "1e-30"], "--dilate 1e-30 is not between 0.01"),
        (["--dilate", "0.001"], "--dilate 0.001 is not between 0.01"),
        (["--dilate", "2"], "--dilate 2 is not between 0.01"),
        (
            ["--scale", "1e-300"],
            "--scale 1e-300 is not between 0.001 and 1000",
        ),
        (
            ["--scale", "1e6"],
            "--scale 1e6 is not between 0.001 and 1000",
        ),
    ] {
        let o = bin()
            .args(["run", "--backend", "sim", "--out"])
            .arg(&out)
            .args(args)
            .arg(example("line-3.toml"))
            .output()
            .unwrap();
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!out.exists());
    }
}
