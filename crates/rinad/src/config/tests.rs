use super::*;

mod cube_mapping {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    /// Seed 003: MR DIF with A1..B2 over a shim, SPN DIF above it with
    /// Gold and Silver over A1, Sensitive BE over A2, Bronze over B1, BE
    /// over B2; `extra` is appended to the last cube.
    fn seed003(a1: &str, extra: &str) -> String {
        let mut s = String::from(
            "[system]\nname = \"a\"\n\
             [[ipcp]]\nname = \"a.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:1\"\n\
             [[ipcp]]\nname = \"a.mr\"\ntype = \"normal\"\ndif = \"mr\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.mr\"\nover = \"udp\"\n",
        );
        for (id, n, u, c) in [
            (1, "A1", 0, 0),
            (2, "A2", 0, 1),
            (3, "B1", 1, 0),
            (4, "B2", 1, 1),
        ] {
            s += &format!(
                "[[ipcp.qos_cube]]\nid = {id}\nname = \"{n}\"\nurgency = {u}\ncherish = {c}\n"
            );
        }
        s += "[[ipcp]]\nname = \"a.spn\"\ntype = \"normal\"\ndif = \"spn\"\naddress = 1\n\
              [[ipcp.neighbor]]\nname = \"b.spn\"\nover = \"mr\"\n";
        for (id, n, lower) in [
            (1, "gold", a1),
            (2, "silver", "\"A1\""),
            (3, "sensitive-be", "\"A2\""),
            (4, "bronze", "3"),
            (5, "be", "\"B2\""),
        ] {
            s += &format!(
                "[[ipcp.qos_cube]]\nid = {id}\nname = \"{n}\"\nlower = {{ mr = {lower} }}\n"
            );
        }
        s + extra
    }

    #[test]
    fn the_mapping_of_seed_003_is_expressible() {
        let cfg = parse(&seed003("\"A1\"", "")).unwrap();
        let spn = &cfg.ipcps[2];
        let mr = cfg.ipcps[1].cubes();
        let map: Vec<(String, String)> = spn
            .qos_cubes
            .iter()
            .map(|c| {
                let c = c.get_ref();
                (
                    c.name.clone(),
                    c.lower["mr"].find(&mr).unwrap().name.clone(),
                )
            })
            .collect();
        let want = [
            ("gold", "A1"),
            ("silver", "A1"),
            ("sensitive-be", "A2"),
            ("bronze", "B1"),
            ("be", "B2"),
        ];
        assert_eq!(map, want.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn a_bad_mapping_names_the_cube_and_what_the_dif_below_offers() {
        let e = parse(&seed003("\"C1\"", "")).unwrap_err().to_string();
        assert!(
            e.contains("qos_cube[0].lower.mr")
                && e.contains("QoS cube gold maps to cube \"C1\" of DIF \"mr\"")
                && e.contains("which offers A1 (1), A2 (2), B1 (3), B2 (4)"),
            "{e}"
        );
        let e = parse(&seed003("9", "")).unwrap_err().to_string();
        assert!(e.contains("cube 9 of DIF"), "{e}");
        let e = parse(&seed003("\"A1\"", "lower = { udp = \"x\" }\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no `[[ipcp.neighbor]]`") || e.contains("duplicate"),
            "{e}"
        );
    }
}

mod parsing {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    const GOOD: &str = r#"
[system]
name = "alpha"

[[ipcp]]
name = "a.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:7001"

[ipcp.directory]
"echo" = "127.0.0.1:7002"
"perf//x" = "[::1]:7003"
"#;

    #[test]
    fn only_a_regular_file_of_bounded_size_is_read() {
        let d = std::env::temp_dir().join(format!("rinad-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let good = d.join("good.toml");
        std::fs::write(&good, GOOD).unwrap();
        assert_eq!(Config::load(&good).unwrap().system.name, "alpha");
        // A device that never ends and a directory: refused, not read.
        let e = Config::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero: not a regular file"), "{e}");
        let e = Config::load(&d).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // A FIFO with no writer: refused at once (the open does not wait).
        let fifo = d.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = Config::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Too large: refused by its size, unread.
        let big = d.join("big.toml");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_CONFIG_BYTES + 1)
            .unwrap();
        let e = Config::load(&big).unwrap_err().to_string();
        assert!(e.contains("more than a configuration file may have"), "{e}");
        // The caller's own refusal, asked of the opened file.
        let e = Config::load_with(&good, |m| Err(format!("{} bytes, no", m.len())))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(&format!("good.toml: {} bytes, no", GOOD.len())),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn good_file_parses() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.system.name, "alpha");
        assert_eq!(c.ipcps.len(), 1);
        assert_eq!(c.ipcps[0].directory.len(), 2);
        assert!(c.ipcps[0].directory[&"perf//x".parse().unwrap()].is_ipv6());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let bad = GOOD.replace("bind =", "bnd =");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 9"), "{e}");
        assert!(
            e.contains("unknown field `bnd`: did you mean `bind`?"),
            "{e}"
        );
        // Nothing near: every key is listed.
        let bad = GOOD.replace("bind =", "zzzzzzz =");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains(
                "unknown field `zzzzzzz`: no key of that name; the keys are name, type, dif, bind"
            ),
            "{e}"
        );
        // In [system] too.
        let bad = GOOD.replace("name = \"alpha\"", "nmae = \"alpha\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("did you mean `name`?"), "{e}");
    }

    #[test]
    fn dif_and_ipcp_names_are_1_to_255_bytes() {
        let e = parse(&GOOD.replace("dif = \"udp\"", "dif = \"\"")).unwrap_err();
        assert!(
            e.to_string()
                .contains("key `ipcp[0].dif`: must have 1 to 255 bytes, not 0"),
            "{e}"
        );
        let long = "d".repeat(256);
        let e = parse(&GOOD.replace("dif = \"udp\"", &format!("dif = \"{long}\""))).unwrap_err();
        assert!(e.to_string().contains("not 256"), "{e}");
        let e =
            parse(&GOOD.replace("name = \"a.udp\"", &format!("name = \"{long}\""))).unwrap_err();
        assert!(
            e.to_string()
                .contains("key `ipcp[0].name`: must have 1 to 255 bytes"),
            "{e}"
        );
        let ok = "d".repeat(255);
        parse(&GOOD.replace("dif = \"udp\"", &format!("dif = \"{ok}\""))).unwrap();
    }

    #[test]
    fn bad_value_names_line() {
        let bad = GOOD.replace("127.0.0.1:7002", "nowhere");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 12"), "{e}");
        let bad = GOOD.replace("\"shim-udp\"", "\"shim-usb\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 7") && e.contains("shim-usb"), "{e}");
    }

    #[test]
    fn semantic_errors_name_key_and_line() {
        let bad = GOOD.replace("bind = \"127.0.0.1:7001\"\n", "");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 6") && e.contains("ipcp[0].bind"), "{e}");
        let bad = format!("{GOOD}\n[[ipcp]]\nname = \"a.udp\"\ntype = \"shim-udp\"\ndif = \"x\"\nbind = \"127.0.0.1:1\"\n");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 16") && e.contains("second IPCP"), "{e}");
        let bad = GOOD.replace("bind =", "max_sdu = 0\nbind =");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 9") && e.contains("max_sdu"), "{e}");
    }

    #[test]
    fn two_shim_udp_ipcps_binding_one_port_are_refused_naming_the_second() {
        let second = |bind: &str| {
            format!("{GOOD}\n[[ipcp]]\nname = \"b.udp\"\ntype = \"shim-udp\"\ndif = \"udp2\"\nbind = \"{bind}\"\n")
        };
        for bind in ["127.0.0.1:7001", "0.0.0.0:7001"] {
            let e = parse(&second(bind)).unwrap_err().to_string();
            assert!(
                e.contains("line 19")
                    && e.contains("`ipcp[1].bind`")
                    && e.contains("shim-udp IPCP a.udp (bind = 127.0.0.1:7001)"),
                "{e}"
            );
        }
        // Another port, another address or any free port: no clash.
        for bind in [
            "127.0.0.1:7002",
            "127.0.0.2:7001",
            "127.0.0.1:0",
            "[::1]:7001",
        ] {
            parse(&second(bind)).unwrap();
        }
        // At run time, against the IPCPs that run.
        let running = parse(GOOD).unwrap().ipcps;
        let e = Config::parse_ipcp(
            "ipcp create",
            "name = \"b.udp\"\ntype = \"shim-udp\"\ndif = \"u2\"\nbind = \"127.0.0.1:7001\"\n",
            &running,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 4") && e.contains("`bind`") && e.contains("a.udp"),
            "{e}"
        );
    }

    #[test]
    fn missing_system_is_refused() {
        let e = parse("[[ipcp]]\nname='x'\n").unwrap_err().to_string();
        assert!(e.contains("system") || e.contains("type"), "{e}");
    }
}

mod normal_ipcp {
    use super::*;

    const TWO: &str = r#"
[system]
name = "alpha"

[[ipcp]]
name = "a.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:7001"

[ipcp.directory]
"b.net" = "127.0.0.1:7002"

[[ipcp]]
name = "a.net"
type = "normal"
dif = "net"
address = 1
crc = true

[[ipcp.neighbor]]
name = "b.net"
over = "udp"
address = 2

[ipcp.routes]
"3" = 2

[ipcp.names]
"echo" = 3
"#;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    #[test]
    fn a_normal_ipcp_over_a_shim_parses() {
        let c = parse(TWO).unwrap();
        let n = &c.ipcps[1];
        assert_eq!(n.kind, IpcpKind::Normal);
        assert_eq!(n.address, Some(1));
        assert_eq!(n.neighbors[0].address, Some(2));
        assert_eq!(n.routes["3"], 2);
        assert_eq!(n.names[&"echo".parse().unwrap()], 3);
    }

    #[test]
    fn max_sdu_is_bounded_by_what_each_kind_carries() {
        // A normal IPCP fragments: its documented 65536 is accepted (it was
        // refused as more than a UDP datagram holds); a shim-udp's is not.
        let with = |after: &str, v: u32| TWO.replacen(after, &format!("{after}\nmax_sdu = {v}"), 1);
        parse(&with("crc = true", 65_536)).unwrap();
        let e = parse(&with("crc = true", 65_537)).unwrap_err().to_string();
        assert!(e.contains("ipcp[1].max_sdu") && e.contains("65536"), "{e}");
        let e = parse(&with("bind = \"127.0.0.1:7001\"", 65_536))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ipcp[0].max_sdu") && e.contains("65502"), "{e}");
    }

    #[test]
    fn normal_mistakes_name_key_and_line() {
        let e = parse(&TWO.replace("over = \"udp\"", "over = \"nope\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 23") && e.contains("neighbor[0].over"),
            "{e}"
        );
        // Without an address it enrolls through its neighbour...
        let c = parse(&TWO.replace("address = 1\n", "")).unwrap();
        assert_eq!(c.ipcps[1].address, None);
        // ...so it needs one.
        let lone = TWO.replace("address = 1\n", "");
        let lone = &lone[..lone.find("[[ipcp.neighbor]]").unwrap()];
        let e = parse(lone).unwrap_err().to_string();
        assert!(e.contains("ipcp[1].address") && e.contains("enroll"), "{e}");
        let e = parse(&TWO.replace("\"3\" = 2", "\"three\" = 2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("routes"), "{e}");
        let e = parse(&TWO.replace("crc = true", "crc = true\nbind = \"127.0.0.1:1\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shim-udp"), "{e}");
    }

    #[test]
    fn a_static_route_goes_through_a_neighbour() {
        let e = parse(&TWO.replace("\"3\" = 2", "\"3\" = 9"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("routes.\"3\"")
                && e.contains("next hop 9 is not a neighbour's address (the neighbours': 2)"),
            "{e}"
        );
        // A neighbour whose address is learnt at run time: nothing to check.
        parse(
            &TWO.replace("\"3\" = 2", "\"3\" = 9")
                .replace("over = \"udp\"\naddress = 2\n", "over = \"udp\"\n"),
        )
        .unwrap();
    }

    #[test]
    fn rib_readable_takes_rib_subtrees_only() {
        let with =
            |v: &str| TWO.replace("crc = true\n", &format!("crc = true\nrib_readable = {v}\n"));
        for ok in ["[]", "[\"/\"]", "[\"/ra\", \"/difm/enr\"]"] {
            parse(&with(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        // An empty string read as "everything" in the DIF's policy.
        for bad in ["[\"\"]", "[\"/ra\", \"ra\"]", "[\"/ra/\"]"] {
            let e = parse(&with(bad)).unwrap_err().to_string();
            assert!(
                e.contains("line 15:") && e.contains("`ipcp[1].rib_readable["),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn addresses_wider_than_the_difs_address_field_are_refused() {
        // Two-byte address fields: 65535 fits, 65536 would be cut short.
        parse(&TWO.replace("address = 1\n", "address = 65535\n")).unwrap();
        for (from, to, key, line) in [
            (
                "address = 1\n",
                "address = 70000\n",
                "`ipcp[1].address`",
                15,
            ),
            (
                "address = 2\n",
                "address = 65536\n",
                "`ipcp[1].neighbor[0].address`",
                23,
            ),
            (
                "\"3\" = 2",
                "\"70000\" = 2",
                "`ipcp[1].routes.\"70000\"`",
                15,
            ),
            ("\"3\" = 2", "\"3\" = 70000", "`ipcp[1].routes.\"3\"`", 15),
            (
                "\"echo\" = 3",
                "\"echo\" = 70000",
                "`ipcp[1].names.\"echo\"`",
                15,
            ),
        ] {
            let e = parse(&TWO.replace(from, to)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("line {line}:"))
                    && e.contains(key)
                    && e.contains("does not fit DIF \"net\"")
                    && e.contains("2 bytes, addresses are at most 65535"),
                "{to}: {e}"
            );
        }
        // At run time (`rinactl ipcp create`) too.
        let running = parse(TWO).unwrap().ipcps;
        let e = Config::parse_ipcp(
            "ipcp create",
            "name = \"c.net\"\ntype = \"normal\"\ndif = \"net2\"\naddress = 70000\n",
            &running,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`address`") && e.contains("at most 65535"),
            "{e}"
        );
    }

    #[test]
    fn scheduler_and_qos_cubes_parse() {
        let with = format!(
            "{TWO}\n[ipcp.scheduler]\npolicy = \"qta-mux\"\ncherish_thresholds = [100, 10]\n\
             [[ipcp.qos_cube]]\nid = 1\nname = \"voice\"\nurgency = 0\ncherish = 1\ndelay_us = 5000\n\
             [[ipcp.qos_cube]]\nid = 2\nname = \"bulk\"\nreliable = true\nurgency = 1\n\
             efcp = {{ congestion_control = \"aimd\", min_rto_ms = 5, window = 128 }}\n\
             [[ipcp.qos_cube]]\nid = 3\nname = \"vm\"\nflow_control = true\n"
        );
        let c = parse(&with).unwrap();
        let n = &c.ipcps[1];
        assert_eq!(n.scheduler_config().name(), "qta-mux");
        let cubes = n.cubes();
        assert_eq!(cubes.len(), 3);
        assert_eq!((cubes[0].urgency, cubes[0].cherish), (0, 1));
        // flow_control: a window, nothing resent.
        assert!(cubes[2].efcp.window().is_some() && cubes[2].efcp.rtx().is_none());
        assert!(cubes[0].efcp.window().is_none());
        assert_eq!(cubes[0].delay_us, Some(5000));
        assert!(cubes[1].is_reliable() && !cubes[0].is_reliable());
        // EFCP policies per cube: AIMD congestion control, RTO, window.
        let cc = cubes[1].efcp.cc().unwrap();
        assert_eq!(cc.policy, rina_core::efcp::CcPolicy::Aimd);
        assert_eq!(
            cubes[1].efcp.rtx().unwrap().min_rto,
            std::time::Duration::from_millis(5)
        );
        assert_eq!(cubes[1].efcp.window().unwrap().receiver_buffer, 128);
        // Without the tables: fifo and the default cubes.
        let c = parse(TWO).unwrap();
        assert_eq!(c.ipcps[1].scheduler_config().name(), "fifo");
        assert_eq!(c.ipcps[1].cubes().len(), 2);
    }

    #[test]
    fn a_cube_keepalive_is_read_and_range_checked() {
        let cube = |ka: &str| format!("{TWO}\n[[ipcp.qos_cube]]\nid = 1\nname = \"x\"\n{ka}");
        let c = parse(&cube("keepalive_ms = 2500\n")).unwrap();
        assert_eq!(
            c.ipcps[1].cubes()[0].keepalive,
            Some(std::time::Duration::from_millis(2500))
        );
        assert_eq!(
            parse(&cube("")).unwrap().ipcps[1].cubes()[0].keepalive,
            None
        );
        for bad in ["0", "9", "3600001"] {
            let e = parse(&cube(&format!("keepalive_ms = {bad}\n")))
                .unwrap_err()
                .to_string();
            // The cube's table, like the other cube checks.
            assert!(
                e.contains("line 32")
                    && e.contains("qos_cube[0].keepalive_ms")
                    && e.contains("10 ms to 3600 s"),
                "{bad}: {e}"
            );
        }
        let e = parse(&cube("keepalive_ms = -1\n")).unwrap_err().to_string();
        assert!(e.contains("keepalive_ms"), "{e}");
    }

    #[test]
    fn a_cubes_efcp_table_is_checked_with_the_file_naming_key_and_line() {
        // Line 32 is the cube's header, line 36 its `efcp` table.
        let cube = |kind: &str, efcp: &str| {
            format!("{TWO}\n[[ipcp.qos_cube]]\nid = 1\nname = \"x\"\n{kind}\nefcp = {{ {efcp} }}\n")
        };
        for (kind, efcp, key, why) in [
            // Out of range: refused before anything is applied.
            (
                "reliable = true",
                "window = 100000000, min_rto_ms = 5",
                "qos_cube[0].efcp.window",
                "between 1 and 1048576",
            ),
            // In range, but not together: the RTO bounds.
            (
                "reliable = true",
                "min_rto_ms = 2000",
                "qos_cube[0].efcp`",
                "min_rto <= initial_rto",
            ),
            (
                "reliable = true",
                "congestion_control = \"aimd\", min_window = 8, max_window = 4",
                "qos_cube[0].efcp`",
                "min_window <= initial_window <= max_window",
            ),
            // Keys for what the cube does not have.
            (
                "flow_control = true",
                "min_rto_ms = 50",
                "qos_cube[0].efcp.min_rto_ms",
                "has no retransmission",
            ),
            (
                "urgency = 0",
                "window = 64",
                "qos_cube[0].efcp.window",
                "has no DTCP",
            ),
        ] {
            let e = parse(&cube(kind, efcp)).unwrap_err().to_string();
            assert!(
                e.contains("line 36") && e.contains(key) && e.contains(why),
                "{efcp}: {e}"
            );
        }
        // A good table is applied whole.
        let c = parse(&cube("reliable = true", "window = 4096, min_rto_ms = 5")).unwrap();
        let efcp = &c.ipcps[1].cubes()[0].efcp;
        assert_eq!(efcp.window().unwrap().receiver_buffer, 4096);
        assert_eq!(
            efcp.rtx().unwrap().min_rto,
            std::time::Duration::from_millis(5)
        );
        // The same checks for an IPCP created at run time.
        let running = parse(TWO).unwrap().ipcps;
        let e = Config::parse_ipcp(
            "ipcp create",
            "name = \"c.net\"\ntype = \"normal\"\ndif = \"net2\"\naddress = 1\n\
             [[qos_cube]]\nid = 1\nname = \"r\"\nreliable = true\nefcp = { min_rto_ms = 2000 }\n",
            &running,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("qos_cube[0].efcp") && e.contains("min_rto"),
            "{e}"
        );
    }

    #[test]
    fn counts_that_would_make_an_ipcp_useless_are_refused_naming_key_and_line() {
        // Into the normal IPCP's own table, after `crc`; the error is on
        // the line of the last key given.
        let normal = |line: &str| TWO.replacen("crc = true\n", &format!("crc = true\n{line}\n"), 1);
        let enc = "password = \"x\"\nencryption = true";
        for (bad, key, why) in [
            ("max_flows = 0", "ipcp[1].max_flows", "at least 1"),
            (
                &format!("{enc}\nrekey_bytes = 0"),
                "ipcp[1].rekey_bytes",
                "at least 1048576",
            ),
            (
                &format!("{enc}\nrekey_bytes = 1048575"),
                "ipcp[1].rekey_bytes",
                "not 1048575",
            ),
            (
                &format!("{enc}\nrekey_seconds = 0"),
                "ipcp[1].rekey_seconds",
                "at least 1",
            ),
        ] {
            let e = parse(&normal(bad)).unwrap_err().to_string();
            let line = normal(bad)
                .lines()
                .position(|l| l == bad.lines().last().unwrap())
                .unwrap()
                + 1;
            assert!(
                e.contains(&format!("line {line}:")) && e.contains(key) && e.contains(why),
                "{bad}: {e}"
            );
        }
        // A shim's `max_flows` too.
        let e = parse(&TWO.replacen(
            "bind = \"127.0.0.1:7001\"\n",
            "bind = \"127.0.0.1:7001\"\nmax_flows = 0\n",
            1,
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 10:") && e.contains("ipcp[0].max_flows"),
            "{e}"
        );
        // The floors themselves are taken.
        let c = parse(&normal(&format!(
            "{enc}\nrekey_bytes = 1048576\nrekey_seconds = 1\nmax_flows = 1"
        )))
        .unwrap();
        assert_eq!(c.ipcps[1].normal_config().max_flows, 1);
    }

    #[test]
    fn scheduler_mistakes_name_key_and_line() {
        // Line 32 is the `[ipcp.scheduler]` header.
        let sched = |body: &str| format!("{TWO}\n[ipcp.scheduler]\n{body}");
        let e = parse(&sched("policy = \"qta-mux\"\ncherish_thresholds = [0]\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 32") && e.contains("ipcp[1].scheduler.cherish_thresholds[0]"),
            "{e}"
        );
        let e = parse(&sched("policy = \"fifo\"\nqueue_size = 3\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("queue_size"), "{e}");
        let e = parse(&sched("policy = \"wfq\"\n")).unwrap_err().to_string();
        assert!(e.contains("wfq"), "{e}");
        // A cube at cherish level 2 needs three thresholds.
        let e = parse(&format!(
            "{}[[ipcp.qos_cube]]\nid = 1\nname = \"x\"\ncherish = 2\n",
            sched("policy = \"qta-mux\"\ncherish_thresholds = [5, 5]\n")
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("scheduler.cherish_thresholds") && e.contains("level 2"),
            "{e}"
        );
        let cube = "[[ipcp.qos_cube]]\nid = 1\nname = \"x\"\n";
        let e = parse(&format!("{TWO}\n{cube}{cube}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 35") && e.contains("qos_cube[1].id"), "{e}");
        let e = parse(&GOOD_SHIM_WITH_SCHED.replace("X", "[ipcp.scheduler]\npolicy = \"fifo\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("for normal IPCPs"), "{e}");
    }

    #[test]
    fn queue_bounds_and_system_keys_are_range_checked() {
        let sched = |body: &str| format!("{TWO}\n[ipcp.scheduler]\n{body}");
        let e = parse(&sched(
            "policy = \"fifo\"\nqueue_len = 9223372036854775807\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("queue_len") && e.contains("out of range"), "{e}");
        let with_system =
            |line: &str| TWO.replacen("[system]\n", &format!("[system]\n{line}\n"), 1);
        let c = parse(&with_system(
            "socket_mode = \"0660\"\nsocket_group = \"rina\"",
        ))
        .unwrap();
        assert_eq!(c.system.socket_mode(), 0o660);
        assert_eq!(
            parse(&with_system("socket_mode = 0o600"))
                .unwrap()
                .system
                .socket_mode(),
            0o600
        );
        for (bad, key) in [
            ("socket_mode = \"rw\"", "system.socket_mode"),
            ("socket_mode = 0o7777", "system.socket_mode"),
            ("max_conns_per_user = 0", "system.max_conns_per_user"),
            ("max_flows_per_user = 0", "system.max_flows_per_user"),
            ("idle_timeout_ms = 0", "system.idle_timeout_ms"),
            ("busy_poll_us = 1000001", "system.busy_poll_us"),
        ] {
            let e = parse(&with_system(bad)).unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
        let poll = |line: &str| parse(&with_system(line)).unwrap().system.busy_poll();
        assert_eq!(poll(""), None, "off by default");
        assert_eq!(poll("busy_poll_us = 0"), None, "0 is off");
        assert_eq!(
            poll("busy_poll_us = 2000"),
            Some(std::time::Duration::from_micros(2000))
        );
        let c = parse(TWO).unwrap();
        assert_eq!(c.system.socket_mode(), DEFAULT_SOCKET_MODE);
        assert_eq!(c.system.conns_per_user(), DEFAULT_CONNS_PER_USER);
    }

    const GOOD_SHIM_WITH_SCHED: &str = "[system]\nname = \"a\"\n[[ipcp]]\nname = \"u\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:1\"\nX\n";
}

mod shim_udp_keepalive {
    use super::*;

    const UDP: &str = "[system]\nname = \"a\"\n[[ipcp]]\nname = \"u\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:1\"\nX\n";

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    /// `keepalive_ms` of a shim-udp: 0 turns the check off; otherwise
    /// 100 ms to an hour, refused where it is written; only for shim-udp.
    #[test]
    fn keepalive_is_off_or_within_range_and_only_for_shim_udp() {
        for ok in [0, 100, 10_000, 3_600_000] {
            let c = parse(&UDP.replace('X', &format!("keepalive_ms = {ok}"))).unwrap();
            let got = c.ipcps[0].keepalive_ms.as_ref().map(|k| *k.get_ref());
            assert_eq!(got, Some(ok));
        }
        for bad in [1, 99, 3_600_001] {
            let e = parse(&UDP.replace('X', &format!("keepalive_ms = {bad}")))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("line 8") && e.contains("ipcp[0].keepalive_ms") && e.contains("0 (off)"),
                "{e}"
            );
        }
        let hv = "[system]\nname = \"a\"\n[[ipcp]]\nname = \"h\"\ntype = \"shim-hv\"\ndif = \"hv\"\npath = \"/dev/shm/x\"\nside = \"host\"\nkeepalive_ms = 1000\n";
        let e = parse(hv).unwrap_err().to_string();
        assert!(e.contains("is for shim-udp"), "{e}");
    }
}

mod shim_eth_ipcp {
    use super::*;

    const ETH: &str = r#"
[system]
name = "alpha"

[[ipcp]]
name = "a.10"
type = "shim-eth"
dif = "10"
interface = "eth1"

[[ipcp]]
name = "a.lan"
type = "shim-eth"
dif = "lan"
interface = "eth1"
vlan = 20
"#;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    #[test]
    fn vlan_from_key_or_dif_name_or_untagged() {
        let c = parse(ETH).unwrap();
        assert_eq!(c.ipcps[0].kind, IpcpKind::ShimEth);
        assert_eq!(c.ipcps[0].shim_eth_vlan(), Some(10));
        assert_eq!(c.ipcps[1].shim_eth_vlan(), Some(20));
        let u = parse(&ETH.replace("vlan = 20", "untagged = true")).unwrap();
        assert_eq!(u.ipcps[1].shim_eth_vlan(), None);
    }

    /// Frames wait out `tx_delay_us` in memory: a delay of hours would
    /// hold every frame sent meanwhile. At most a second, refused where
    /// it is written.
    #[test]
    fn a_tx_delay_above_one_second_is_refused_with_key_and_line() {
        let ok = parse(&ETH.replace("vlan = 20", "vlan = 20\ntx_delay_us = 1000000")).unwrap();
        assert_eq!(
            ok.ipcps[1].tx_delay_us.as_ref().map(|d| *d.get_ref()),
            Some(1_000_000)
        );
        let e = parse(&ETH.replace("vlan = 20", "vlan = 20\ntx_delay_us = 86400000000"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 17") && e.contains("ipcp[1].tx_delay_us") && e.contains("at most"),
            "{e}"
        );
    }

    #[test]
    fn shim_eth_mistakes_name_key_and_line() {
        let e = parse(&ETH.replace("vlan = 20", "vlan = 4095"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 16") && e.contains("ipcp[1].vlan"), "{e}");
        let e = parse(&ETH.replace("vlan = 20", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 12") && e.contains("VLAN id"), "{e}");
        let e = parse(&ETH.replace("vlan = 20", "vlan = 20\nuntagged = true"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exclude each other"), "{e}");
        let e = parse(&ETH.replacen("interface = \"eth1\"\n", "", 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 6") && e.contains("ipcp[0].interface"),
            "{e}"
        );
        let e = parse(&ETH.replacen("dif = \"10\"", "dif = \"10\"\nmax_sdu = 100", 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("MTU"), "{e}");
        let e = parse(&ETH.replace("vlan = 20", "vlan = 20\nbogus = 1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 17") && e.contains("bogus"), "{e}");
    }
}

mod shim_hv_ipcp {
    use super::*;

    const HV: &str = r#"[system]
name = "h"

[[ipcp]]
name = "h.hv"
type = "shim-hv"
dif = "hv0"
path = "/dev/shm/x"
side = "guest"
vmpi_id = 4
"#;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    #[test]
    fn shim_hv_keys_parse_and_mistakes_name_key_and_line() {
        let c = parse(HV).unwrap();
        assert_eq!(c.ipcps[0].kind, IpcpKind::ShimHv);
        assert_eq!(c.ipcps[0].side, Some(HvSide::Guest));
        assert_eq!(c.ipcps[0].vmpi_id, Some(4));
        assert_eq!(c.ipcps[0].credit, None);
        let c = parse(&format!("{HV}credit = false\n")).unwrap();
        assert_eq!(c.ipcps[0].credit, Some(false));
        let e = parse(&HV.replacen("side = \"guest\"\n", "", 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 5") && e.contains("ipcp[0].path/side"),
            "{e}"
        );
        let e = parse(&HV.replacen("\"guest\"", "\"vm\"", 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("side"), "{e}");
        let e = parse(&HV.replacen("shim-hv", "shim-udp", 1).replacen(
            "path = \"/dev/shm/x\"\n",
            "bind = \"127.0.0.1:1\"\npath = \"/dev/shm/x\"\n",
            1,
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("are for shim-hv IPCPs"), "{e}");
    }
}

mod runtime_changes {
    use super::*;

    fn running() -> Vec<IpcpConfig> {
        let text = "[system]\nname = \"s\"\n[[ipcp]]\nname = \"s.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n";
        Config::parse(Path::new("t.toml"), text).unwrap().ipcps
    }

    #[test]
    fn an_ipcp_given_at_run_time_is_checked_against_the_running_ones() {
        let r = running();
        // A member waiting for `rinactl ipcp enroll`: no address, no neighbour.
        let ok = Config::parse_ipcp(
            "c",
            "name = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\n",
            &r,
        );
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(ok.unwrap().raw["dif"].as_str(), Some("net"));
        let e = Config::parse_ipcp(
            "c",
            "name = \"s.udp\"\ntype = \"shim-udp\"\ndif = \"u2\"\nbind = \"127.0.0.1:0\"\n",
            &r,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 1") && e.contains("`name`") && e.contains("runs already"),
            "{e}"
        );
        let text = "name = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\n[[neighbor]]\nname = \"t.net\"\nover = \"eth\"\n";
        let e = Config::parse_ipcp("c", text, &r).unwrap_err().to_string();
        assert!(
            e.contains("line 6") && e.contains("neighbor[0].over"),
            "{e}"
        );
        let e = Config::parse_ipcp(
            "c",
            "name = \"x\"\ntype = \"normal\"\ndif = \"net\"\nadress = 3\n",
            &r,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 4") && e.contains("adress"), "{e}");
    }
}

mod stacking {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    /// A shim and normal DIFs `top` over `net` over the shim, the upper
    /// one first in the file; `net_over` is the DIF under `net`.
    fn stack(net_over: &str) -> String {
        format!(
            "[system]\nname = \"a\"\n\
             [[ipcp]]\nname = \"a.top\"\ntype = \"normal\"\ndif = \"top\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.top\"\nover = \"net\"\n\
             [[ipcp]]\nname = \"a.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.net\"\nover = \"{net_over}\"\n\
             [[ipcp]]\nname = \"a.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n"
        )
    }

    #[test]
    fn ipcps_are_created_shims_first_then_each_normal_after_the_difs_below() {
        let cfg = parse(&stack("udp")).unwrap();
        let names: Vec<&str> = cfg
            .creation_order()
            .into_iter()
            .map(|i| cfg.ipcps[i].name.get_ref().as_str())
            .collect();
        assert_eq!(names, ["a.udp", "a.net", "a.top"]);
    }

    #[test]
    fn a_stacking_loop_is_refused_naming_the_ipcps_and_a_neighbour_line() {
        let text = stack("top");
        let e = parse(&text).unwrap_err().to_string();
        let line = text.lines().position(|l| l == "over = \"net\"").unwrap() + 1;
        assert_eq!(
            e,
            format!(
                "t.toml: line {line}: key `ipcp[0].neighbor[0].over`: normal IPCPs a.top, a.net \
                 are stacked on each other in a loop: a.top reaches neighbour b.top over DIF \"net\", \
                 a.net reaches neighbour b.net over DIF \"top\"; no DIF of the loop can be created first"
            )
        );
        // An IPCP that only rests on the loop is not named as part of it.
        let text = format!(
            "{text}[[ipcp]]\nname = \"a.up\"\ntype = \"normal\"\ndif = \"up\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.up\"\nover = \"net\"\n"
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.contains("normal IPCPs a.top, a.net are") && !e.contains("a.up"),
            "{e}"
        );
    }

    #[test]
    fn enrollment_keys_and_ipcp_names_are_checked_with_the_file() {
        let with = |extra: &str| {
            stack("udp").replacen("address = 1\n", &format!("address = 1\n{extra}"), 1)
        };
        let key = "11".repeat(32);
        parse(&with(&format!(
            "key = \"{key}\"\ntrusted_keys = [\"{key}\"]\n"
        )))
        .unwrap();
        let e = parse(&with("key = \"abc\"\n")).unwrap_err().to_string();
        assert!(
            e.contains("line 4") && e.contains("`ipcp[0].key`") && e.contains("64 hex digits"),
            "{e}"
        );
        let e = parse(&with(&format!(
            "key = \"{key}\"\ntrusted_keys = [\"{key}\", \"zz\"]\n"
        )))
        .unwrap_err()
        .to_string();
        assert!(e.contains("`ipcp[0].trusted_keys[1]`"), "{e}");
        let e = parse(&with(&format!("trusted_keys = [\"{key}\"]\n")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`ipcp[0].trusted_keys`") && e.contains("needs `key`"),
            "{e}"
        );
        let e = parse(&stack("udp").replace("\"a.top\"", "\"a top\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`ipcp[0].name`") && e.contains("application name"),
            "{e}"
        );
    }
}
