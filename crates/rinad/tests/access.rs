//! Access rights on the control socket: what one user may do to another
//! user's names and flows, management commands, and the socket's private
//! directory. They run as root (CI does), create two test users and
//! impersonate them per thread; as anyone else they print `skipped: …`.

mod common;

use common::users::{as_user, test_user, User};
use common::{name, pair, wait_for, Daemon};
use rina::{Client, ErrorKind, Flow, QosSpec};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn users() -> Option<(User, User)> {
    Some((test_user("rinatest-a")?, test_user("rinatest-b")?))
}

/// A client of `d` connected as `u`.
fn client_as(u: User, d: &Daemon) -> Client {
    let path = d.socket.clone();
    as_user(u, move || {
        Client::connect_to(path).expect("connect as a test user")
    })
}

/// Registers `n` at `d` as `u` and echoes every flow it accepts.
fn echo_as(u: User, d: &Daemon, n: &str) {
    let mut c = client_as(u, d);
    c.register(&name(n), None).unwrap();
    std::thread::spawn(move || {
        while let Ok(Some(req)) = c.next_request_timeout(Duration::from_secs(30)) {
            let Ok(flow) = c.accept(&req) else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 2048];
                while let Ok(n) = flow.read(&mut buf) {
                    if flow.write(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

fn echoes(flow: &Flow) {
    flow.write(b"ping").unwrap();
    let mut buf = [0u8; 16];
    let n = flow.read_timeout(&mut buf, T).unwrap().expect("echo");
    assert_eq!(&buf[..n], b"ping");
}

fn denied<T: std::fmt::Debug>(what: &str, r: rina::Result<T>) -> String {
    let e = r.expect_err(what);
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{what}: {e}");
    e.message
}

#[test]
fn a_user_cannot_touch_another_users_names_and_flows() {
    let Some((a, b)) = users() else { return };
    let (alpha, beta) = pair(&["echo-a", "echo-b"]);
    echo_as(a, &beta, "echo-a");

    // User a's flow at alpha.
    let mut ca = client_as(a, &alpha);
    let fa = ca
        .allocate(&name("app-a"), &name("echo-a"), None, &QosSpec::default())
        .unwrap();
    echoes(&fa);
    let port_a = fa.info().port;

    // User b sees none of a's names or flows...
    let mut cb_beta = client_as(b, &beta);
    assert!(cb_beta.list_names().unwrap().is_empty());
    assert!(cb_beta.list_ipcps().unwrap()[0].names.is_empty());
    let mut cb = client_as(b, &alpha);
    assert!(cb.list_flows().unwrap().is_empty());
    // ...cannot deallocate a's flow, unregister or take a's name...
    let m = denied("b deallocates a's flow", cb.deallocate_port(port_a));
    assert!(
        m.contains("another user") && m.contains(&a.uid.to_string()),
        "{m}"
    );
    let m = denied(
        "b unregisters a's name",
        cb_beta.unregister(&name("echo-a"), None),
    );
    assert!(m.contains("echo-a") && m.contains("another user"), "{m}");
    let e = cb_beta.register(&name("echo-a"), None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NameInUse, "{e}");
    // ...nor read RIBs or change the system.
    let m = denied("b reads a RIB", cb.read_rib("alpha.udp", None, None));
    assert!(m.contains("management command"), "{m}");
    denied(
        "b sets a scheduler",
        cb.set_scheduler("alpha.udp", serde_json::json!({"policy": "fifo"})),
    );
    denied(
        "b adds a neighbour",
        cb.add_neighbor("alpha.udp", &name("x"), "udp", None),
    );
    denied(
        "b registers an IPCP",
        cb.register_ipcp("alpha.udp", "udp", true),
    );
    // ...nor pose as a's registered application.
    ca.register(&name("app-a"), None).unwrap();
    let m = denied(
        "b allocates from a's name",
        cb.allocate(&name("app-a"), &name("echo-a"), None, &QosSpec::default()),
    );
    assert!(m.contains("app-a"), "{m}");
    // a's flow still works.
    echoes(&fa);

    // b registers and uses its own name and flow, and sees only those.
    echo_as(b, &beta, "echo-b");
    let fb = cb
        .allocate(&name("app-b"), &name("echo-b"), None, &QosSpec::default())
        .unwrap();
    echoes(&fb);
    let mine = cb.list_flows().unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].info.port, fb.info().port);
    let names: Vec<String> = cb_beta
        .list_names()
        .unwrap()
        .iter()
        .map(|n| n.name.to_string())
        .collect();
    assert_eq!(names, ["echo-b"]);
    // A flow's descriptor tells whose flow it is to its user and to an
    // administrator only.
    assert_eq!(ca.flow_info_of(&fa).unwrap().port, port_a);
    assert_eq!(alpha.client().flow_info_of(&fa).unwrap().port, port_a);
    let e = cb.flow_info_of(&fa).unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnknownFlow, "{e}");
    assert_eq!(cb.flow_info_of(&fb).unwrap().port, fb.info().port);
    // a sees only its own flow; root, an administrator, sees both.
    let theirs = ca.list_flows().unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].info.port, port_a);
    assert_eq!(alpha.client().list_flows().unwrap().len(), 2);
    assert_eq!(beta.client().list_names().unwrap().len(), 2);

    // b deallocates its own flow through the control socket (another
    // connection of the same user); the administrator deallocates a's.
    cb.deallocate_port(fb.info().port).unwrap();
    alpha.client().deallocate_port(port_a).unwrap();
    wait_for("both flows to go", T, || {
        alpha.client().list_flows().unwrap().is_empty()
    });
    // An administrator may also unregister a user's name.
    beta.client().unregister(&name("echo-a"), None).unwrap();
    let left: Vec<String> = beta
        .client()
        .list_names()
        .unwrap()
        .iter()
        .map(|n| n.name.to_string())
        .collect();
    assert_eq!(left, ["echo-b"]);
}

#[test]
fn admin_group_members_may_manage() {
    let Some((a, _)) = users() else { return };
    // rinatest-a's own group is the admin group here.
    let cfg = "[system]\nname = \"adm\"\nadmin_group = \"rinatest-a\"\n\n[[ipcp]]\nname = \"adm.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n";
    let d = Daemon::start_with("adm", cfg);
    let mut c = client_as(a, &d);
    assert!(!c.read_rib("adm.udp", None, None).unwrap().is_empty());
}

/// Starts `rinad` as `u` with no socket path given, so it uses the
/// per-user default; returns the child and its stderr file.
fn rinad_as(u: User, dir: &std::path::Path) -> (std::process::Child, PathBuf) {
    let conf = dir.join("rinad.toml");
    std::fs::write(&conf, "[system]\nname = \"squat\"\n").unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = dir.join(format!("rinad-{}.err", u.uid));
    use std::os::unix::process::CommandExt;
    let child = Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--config")
        .arg(&conf)
        .env_remove("RINA_SOCKET")
        .env_remove("XDG_RUNTIME_DIR")
        .uid(u.uid)
        .gid(u.gid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawn rinad as a test user");
    (child, err)
}

#[test]
fn another_user_cannot_squat_the_default_socket() {
    let Some((a, b)) = users() else { return };
    let dir = common::temp_dir("squat");
    let private = PathBuf::from(format!("/tmp/rinad-{}", a.uid));
    let _ = std::fs::remove_dir_all(&private);

    // b made a's directory first: a's daemon refuses it and says why.
    std::fs::create_dir(&private).unwrap();
    std::os::unix::fs::chown(&private, Some(b.uid), Some(b.gid)).unwrap();
    let (mut child, err) = rinad_as(a, &dir);
    let mut status = None;
    wait_for("rinad to refuse the squatted directory", T, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(!status.unwrap().success());
    let msg = std::fs::read_to_string(&err).unwrap();
    assert!(
        msg.contains(&format!("belongs to uid {}", b.uid)) && msg.contains("squat"),
        "{msg}"
    );
    // Group- or world-writable is refused as well, even when a's own.
    std::os::unix::fs::chown(&private, Some(a.uid), Some(a.gid)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (mut child, err) = rinad_as(a, &dir);
    wait_for("rinad to refuse the open directory", T, || {
        child.try_wait().unwrap().is_some()
    });
    let msg = std::fs::read_to_string(&err).unwrap();
    assert!(msg.contains("private"), "{msg}");

    // Without it, a's daemon makes it private and serves a, not b.
    std::fs::remove_dir_all(&private).unwrap();
    let (mut child, _) = rinad_as(a, &dir);
    let sock = private.join("rinad.sock");
    let s = sock.clone();
    wait_for("a's rinad to answer", T, || {
        let s = s.clone();
        as_user(a, move || Client::connect_to(s).is_ok())
    });
    let md = std::fs::symlink_metadata(&private).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (a.uid, 0o700));
    let s = sock.clone();
    let e = as_user(b, move || Client::connect_to(s).unwrap_err());
    assert_ne!(e.kind, ErrorKind::DaemonNotRunning, "{e}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&private);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn socket_mode_and_group_follow_the_config() {
    let Some((a, b)) = users() else { return };
    let cfg = "[system]\nname = \"mode\"\nsocket_mode = \"0660\"\nsocket_group = \"rinatest-a\"\n";
    let d = Daemon::start_with("mode", cfg);
    let md = std::fs::metadata(&d.socket).unwrap();
    assert_eq!(md.mode() & 0o777, 0o660);
    assert_eq!(md.gid(), a.gid);
    // A member of the group connects, anybody else is turned away by the kernel.
    let s = d.socket.clone();
    as_user(a, move || Client::connect_to(s).map(drop)).expect("a connects");
    let s = d.socket.clone();
    let e = as_user(b, move || Client::connect_to(s).map(drop)).unwrap_err();
    assert!(e.message.contains("ermission denied"), "{e}");
}

#[test]
fn a_reload_applies_the_system_tables_access_keys_and_says_so() {
    let Some((a, _)) = users() else { return };
    let shim = "\n[[ipcp]]\nname = \"rl.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n";
    let with_group = format!("[system]\nname = \"rl\"\nadmin_group = \"rinatest-a\"\n{shim}");
    let d = Daemon::start_with("rl", &with_group);
    let mut before = client_as(a, &d);
    assert!(before.read_rib("rl.udp", None, None).is_ok());
    let file = d.dir.join("rinad.toml");
    let reload = || {
        let mut c = d.client();
        c.set_timeout(Some(T));
        c.reload(None)
    };
    // A group that does not exist: refused, nothing changed (the new
    // shim of the same file is not created, the group still rules).
    let shim2 = shim
        .replace("rl.udp", "rl.udp2")
        .replace("\"udp\"", "\"udp2\"");
    std::fs::write(
        &file,
        format!("[system]\nname = \"rl\"\nadmin_group = \"no-such-group-rl\"\n{shim}{shim2}"),
    )
    .unwrap();
    let e = reload().expect_err("an unknown admin_group");
    assert!(
        e.message.contains("nothing changed") && e.message.contains("no-such-group-rl"),
        "{e}"
    );
    assert_eq!(d.client().list_ipcps().unwrap().len(), 1);
    assert!(client_as(a, &d).read_rib("rl.udp", None, None).is_ok());
    // The group taken out of the file: the reload says so, and its member
    // is no administrator any more, on a new connection or an open one.
    std::fs::write(
        &file,
        format!("[system]\nname = \"rl\"\nmax_conns_per_user = 8\n{shim}"),
    )
    .unwrap();
    let changes = reload().expect("a good file");
    let all = changes.join("\n");
    assert!(
        all.contains("[system] admin_group: rinatest-a -> (none)")
            && all.contains("[system] max_conns_per_user: 128 -> 8"),
        "{all}"
    );
    denied(
        "a new connection",
        client_as(a, &d).read_rib("rl.udp", None, None),
    );
    denied("an open connection", before.read_rib("rl.udp", None, None));
    // Nothing changed: nothing reported but that.
    assert_eq!(reload().unwrap(), ["nothing changed"]);
    // The socket's mode, and a name that waits for the next start.
    std::fs::write(
        &file,
        format!("[system]\nname = \"rl2\"\nmax_conns_per_user = 8\nsocket_mode = \"0600\"\n{shim}"),
    )
    .unwrap();
    let all = reload().unwrap().join("\n");
    assert!(
        all.contains("[system] socket_mode: 0o666 -> 0o600")
            && all.contains("[system] name: rl -> rl2 (when rinad starts again)"),
        "{all}"
    );
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn only_an_administrator_may_use_the_name_of_the_systems_ipcps() {
    let Some((a, _)) = users() else { return };
    let cfg = "[system]\nname = \"ipn\"\n\n[[ipcp]]\nname = \"ipn.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n\n[[ipcp]]\nname = \"ipn.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\n[[ipcp]]\nname = \"ipn.two/1\"\ntype = \"normal\"\ndif = \"two\"\naddress = 1\n";
    let d = Daemon::start_with("ipn", cfg);
    let mut c = client_as(a, &d);
    // Registered in a DIF below, the name would take the N-1 flows peers
    // allocate to the IPCP; flows from it would reach peers as the IPCP's.
    let m = denied(
        "registering an IPCP's name",
        c.register(&name("ipn.net"), Some("udp")),
    );
    assert!(m.contains("ipn.net is the name of an IPC process"), "{m}");
    let m = denied(
        "allocating from an IPCP's name",
        c.allocate(
            &name("ipn.net"),
            &name("peer.net"),
            Some("udp"),
            &QosSpec::default(),
        ),
    );
    assert!(m.contains("ipn.net is the name of an IPC process"), "{m}");
    // An IPCP named with an instance holds its process name, with any
    // instance or none.
    for n in ["ipn.two/1", "ipn.two", "ipn.two/2"] {
        let m = denied(
            "registering an IPCP's name",
            c.register(&name(n), Some("udp")),
        );
        assert!(
            m.contains("ipn.two is the name of an IPC process"),
            "{n}: {m}"
        );
    }
    // Other names are the user's to take, and root may take this one.
    c.register(&name("mine"), Some("udp")).unwrap();
    d.client().register(&name("ipn.net"), Some("udp")).unwrap();
}

#[test]
fn a_file_an_administrator_reloaded_is_not_read_again_with_the_daemons_rights() {
    let Some((a, _)) = users() else { return };
    let start = "[system]\nname = \"rf\"\nadmin_group = \"rinatest-a\"\n";
    let d = Daemon::start_with("rf", start);
    // A file only root may read, and a directory of rinatest-a's.
    let secret = d.dir.join("secret");
    std::fs::write(&secret, "TOPSECRET root-only line\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mine = d.dir.join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::os::unix::fs::chown(&mine, Some(a.uid), Some(a.gid)).unwrap();
    let file = mine.join("x.toml");
    let path = d.socket.clone();
    let (f, s) = (file.clone(), secret.clone());
    let outcome = as_user(a, move || {
        let mut c = Client::connect_to(path).unwrap();
        std::fs::write(
            &f,
            "[system]\nname = \"rf\"\nadmin_group = \"rinatest-a\"\n",
        )
        .unwrap();
        c.reload(Some(f.to_str().unwrap()))
            .expect("a file of its own");
        let direct = c.reload(Some(s.to_str().unwrap()));
        // The same name, now a link to the root-only file, read by a
        // reload that names no file.
        std::fs::remove_file(&f).unwrap();
        std::os::unix::fs::symlink(&s, &f).unwrap();
        (direct, c.reload(None))
    });
    let e = outcome.0.expect_err("the secret itself is refused");
    assert!(e.message.contains("may not read it"), "{e}");
    // The plain reload reads the file rinad started with, not the link.
    let text = match &outcome.1 {
        Ok(v) => v.join("\n"),
        Err(e) => e.message.clone(),
    };
    assert!(!text.contains("TOPSECRET"), "{text}");
    assert_eq!(outcome.1.unwrap(), ["nothing changed"]);
}

#[test]
fn one_users_many_names_leave_the_listing_of_ipcps_whole() {
    let Some((a, b)) = users() else { return };
    let cfg = "[system]\nname = \"lst\"\n\n[[ipcp]]\nname = \"lst.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n";
    let d = Daemon::start_with("lst", cfg);
    let path = d.socket.clone();
    // 24 connections of one unprivileged user, 256 long names each: 1.5
    // MB of names, were they all listed (more than a control message).
    let (held, mine) = as_user(a, move || {
        let held: Vec<Client> = (0..24)
            .map(|k| {
                let mut c = Client::connect_to(&path).unwrap();
                for n in 0..256 {
                    let s = format!("u{k}-{n}-{}", "x".repeat(240));
                    c.register(&name(&s), Some("udp")).unwrap();
                }
                c
            })
            .collect();
        let mut c = Client::connect_to(&path).unwrap();
        (
            held,
            c.list_ipcps().map(|v| (v[0].names.len(), v[0].names_more)),
        )
    });
    let total = 24 * 256;
    // The administrator's listing: a few names and the count of the rest.
    let ipcps = d.client().list_ipcps().expect("the listing fits");
    let (listed, more) = (ipcps[0].names.len(), ipcps[0].names_more);
    assert!((1..=16).contains(&listed), "{listed} names listed");
    assert_eq!(listed as u64 + more, total);
    // Their owner's likewise; the other user's counts none of them.
    let (listed, more) = mine.expect("the owner's listing fits");
    assert_eq!(listed as u64 + more, total);
    let other = client_as(b, &d).list_ipcps().unwrap();
    assert!(other[0].names.is_empty() && other[0].names_more == 0);
    // The paged listing of names still gives every one.
    assert_eq!(d.client().list_names().unwrap().len() as u64, total);
    drop(held);
}
