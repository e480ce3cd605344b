//! The experiment file: what it derives, and errors that name the line.

#[path = "real_common/mod.rs"]
mod common;

use rina_lab::resolve::{load, Dest, Lower, Over};
use std::time::Duration;

fn example(name: &str) -> String {
    let p = format!("{}/../../examples/lab/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[test]
fn line_3_resolves_with_derived_bootstrap_and_order() {
    let e = load(&example("line-3.toml"), None).unwrap();
    assert_eq!(e.nodes, ["a", "b", "c"]);
    assert_eq!(e.links.len(), 2);
    assert_eq!(e.links[0].name, "a--b");
    let d = &e.difs[0];
    assert_eq!(d.over, vec![Lower::Links]);
    assert_eq!(d.adjacencies.len(), 2);
    assert!(d
        .adjacencies
        .iter()
        .all(|a| matches!(a.over, Over::Link(_))));
    // b has two neighbours: it bootstraps, a and c enroll through it.
    assert_eq!(e.nodes[d.bootstrap], "b");
    assert_eq!(d.enrollment_order.len(), 3);
    assert_eq!(d.enrolls_via[&0], 1);
    // echo from a and b to the app at c; tgen a->c; perf a->c.
    assert_eq!(e.flows.len(), 4);
    assert!(matches!(e.flows[0].to, Dest::App(0)));
}

fn err_of(text: &str) -> String {
    load(text, None).unwrap_err().to_string()
}

const HEAD: &str = "nodes = [\"a\", \"b\"]\n[experiment]\nname = \"x\"\nduration = \"1s\"\n";

#[test]
fn nodes_written_inside_experiment_is_explained() {
    let e = err_of("[experiment]\nname = \"x\"\nduration = \"1s\"\nnodes = [\"a\"]\n");
    assert!(
        e.starts_with("line 4,") && e.contains("before any [table]"),
        "{e}"
    );
}

#[test]
fn unknown_node_in_a_link_names_its_line() {
    let t = format!("{HEAD}[[link]]\nbetween = [\"a\", \"zz\"]\n");
    let e = err_of(&t);
    assert!(e.starts_with("line 6,"), "{e}");
    assert!(e.contains("unknown node `zz`"), "{e}");
}

#[test]
fn syntax_and_type_errors_name_the_line() {
    let e = err_of(&format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\nrate = \"fast\"\n"
    ));
    assert!(e.starts_with("line 7,"), "{e}");
    assert!(e.contains("`fast` is not a rate"), "{e}");
    let e = err_of(&format!("{HEAD}[[link]\n"));
    assert!(e.starts_with("line 5,"), "{e}");
    let e = err_of(&format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\ncolour = 3\n"
    ));
    assert!(e.starts_with("line 7,") && e.contains("colour"), "{e}");
}

#[test]
fn disconnected_dif_and_bad_cube_mapping_are_reported() {
    let t = format!("{HEAD}[[dif]]\nname = \"n\"\nmembers = [\"a\", \"b\"]\nover = [\"links\"]\n");
    let e = err_of(&t);
    assert!(
        e.starts_with("line 6,") && e.contains("cannot reach"),
        "{e}"
    );
    let t = format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"low\"\nmembers = [\"*\"]\nover = [\"links\"]\n\
         [[dif.cube]]\nname = \"A1\"\n[[dif]]\nname = \"up\"\nmembers = [\"*\"]\nover = [\"low\"]\n\
         [[dif.cube]]\nname = \"Gold\"\nmaps_to = {{ low = \"B9\" }}\n"
    );
    let e = err_of(&t);
    assert!(
        e.starts_with("line 19,") && e.contains("`B9`") && e.contains("`A1`"),
        "{e}"
    );
}

#[test]
fn variant_names_that_cannot_be_their_own_run_folder_are_refused() {
    // Each variant runs into `<run>/<name>/`, the comparison plots into
    // `<run>/plots/`: a repeated name would overwrite a variant's results.
    let base = format!("{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n");
    let e = err_of(&format!(
        "{base}[[variant]]\nname = \"v\"\n[[variant]]\nname = \"v\"\n"
    ));
    assert!(
        e.starts_with("line 10,") && e.contains("variant `v` is declared twice"),
        "{e}"
    );
    for bad in ["plots", "../up", "a/b", ""] {
        let e = err_of(&format!("{base}[[variant]]\nname = \"{bad}\"\n"));
        assert!(
            e.starts_with("line 8,") && e.contains("variant name"),
            "{bad}: {e}"
        );
    }
    let ok = format!("{base}[[variant]]\nname = \"v-1\"\n[[variant]]\nname = \"v-2\"\n");
    assert!(load(&ok, Some("v-2")).is_ok());
}

#[test]
fn a_max_pdu_no_member_accepts_is_refused_at_its_dif() {
    // Before, `max_pdu = 20` passed `check` and failed only when the run
    // started the IPCPs, with no line.
    let dif = |m: u32| {
        format!(
            "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
             over = [\"links\"]\nmax_pdu = {m}\n"
        )
    };
    let e = err_of(&dif(20));
    assert!(
        e.starts_with("line 8,") && e.contains("`max_pdu`") && e.contains("20"),
        "{e}"
    );
    assert!(err_of(&dif(1 << 30)).contains("`max_pdu`"));
    assert_eq!(load(&dif(1000), None).unwrap().difs[0].max_pdu, Some(1000));
}

#[test]
fn an_adjacency_no_lower_dif_joins_is_refused_not_left_out() {
    // Three nodes in a line; `net` over the links. Before, an `adjacency`
    // over links was dropped unread (even with an unknown node), and a
    // pair no lower DIF has both of was left out without a word.
    let line = "nodes = [\"a\", \"b\", \"c\"]\n[experiment]\nname = \"x\"\nduration = \"1s\"\n\
                [[link]]\nbetween = [\"a\", \"b\"]\n[[link]]\nbetween = [\"b\", \"c\"]\n\
                [[dif]]\nname = \"net\"\nmembers = [\"*\"]\nover = [\"links\"]\n";
    let e = err_of(&format!("{line}adjacency = [[\"a\", \"c\"]]\n"));
    assert!(
        e.starts_with("line 13,")
            && e.contains("adjacency `a`-`c`")
            && e.contains("over lower DIFs"),
        "{e}"
    );
    let e = err_of(&format!("{line}adjacency = [[\"a\", \"zz\"]]\n"));
    assert!(e.contains("unknown node `zz`"), "{e}");
    // `up` over `low` (a and b only): a pair with c is joined by nothing.
    let stack = format!(
        "{line}[[dif]]\nname = \"low\"\nmembers = [\"a\", \"b\"]\nover = [\"links\"]\n\
         [[dif]]\nname = \"up\"\nmembers = [\"a\", \"b\", \"c\"]\nover = [\"low\", \"net\"]\n"
    );
    let ok = load(
        &format!("{stack}adjacency = [[\"a\", \"b\"], [\"b\", \"c\"]]\n"),
        None,
    )
    .unwrap();
    assert_eq!(ok.difs.last().unwrap().adjacencies.len(), 2);
    let e = err_of(&stack.replace("over = [\"low\", \"net\"]", "over = [\"low\"]").replace(
        "members = [\"a\", \"b\", \"c\"]\nover = [\"low\"]",
        "members = [\"a\", \"b\", \"c\"]\nover = [\"low\", \"links\"]\nadjacency = [[\"a\", \"b\"], [\"b\", \"c\"]]",
    ));
    assert!(e.contains("adjacency `b`-`c`"), "{e}");
}

#[test]
fn an_event_key_its_action_does_not_take_is_refused() {
    // `node` on a link-down was ignored without a word.
    let t = format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[event]]\nat = \"0.5s\"\naction = \"link-down\"\n\
         link = \"a--b\"\nnode = \"b\"\n"
    );
    let e = err_of(&t);
    assert!(
        e.starts_with("line 11,") && e.contains("`node` does not belong") && e.contains("`link`"),
        "{e}"
    );
    assert!(load(&t.replace("node = \"b\"\n", ""), None).is_ok());
}

#[test]
fn traffic_from_a_node_to_itself_says_so() {
    // It said "give `pairs`, or `from` with `to` or `app`", which it had.
    let t = format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
         over = [\"links\"]\n[[traffic]]\nkind = \"echo\"\ndif = \"n\"\nfrom = [\"a\"]\nto = \"a\"\n"
    );
    let e = err_of(&t);
    assert!(
        e.starts_with("line 11,") && e.contains("every `from` node is where it would go"),
        "{e}"
    );
}

#[test]
fn an_echo_size_below_a_probe_header_is_refused() {
    // Accepted before: rina-echo refused it on real backends at run time,
    // the simulator sent 16 bytes all the same.
    let t = |size: u32| {
        format!(
            "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
             over = [\"links\"]\n[[traffic]]\nkind = \"echo\"\ndif = \"n\"\nfrom = [\"a\"]\nto = \"b\"\n\
             size = {size}\n"
        )
    };
    let e = err_of(&t(15));
    assert!(
        e.starts_with("line 11,") && e.contains("at least 16 bytes"),
        "{e}"
    );
    assert!(load(&t(16), None).is_ok());
}

#[test]
fn on_and_off_of_a_profile_without_periods_are_refused() {
    // `on` and `off` of a CBR, Poisson or varying-rate class were dropped:
    // the flows ran as plain CBR, and nothing said so.
    let t = |profile: &str| {
        format!(
            "{HEAD}[[profile]]\nname = \"p\"\nprofile = \"{profile}\"\non = \"2s\"\noff = \"1s\"\n"
        )
    };
    let e = err_of(&t("cbr"));
    assert!(
        e.starts_with("line 5,")
            && e.contains("profile `p`: profile cbr has no ON and OFF periods, so on and off"),
        "{e}"
    );
    assert!(err_of(&t("p2p")).contains("profile p2p has no ON and OFF periods"));
    assert!(load(&t("on-off"), None).is_ok());
    assert!(load(&t("voice"), None).is_ok());
}

#[test]
fn traffic_past_the_end_of_the_experiment_says_so() {
    // A `stop` after the end was cut to it without a word (an event there
    // is refused), and a `start` at or after the end said only "traffic
    // starts after it stops".
    let t = |times: &str| {
        format!(
            "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
             over = [\"links\"]\n[[traffic]]\nkind = \"echo\"\ndif = \"n\"\nfrom = [\"a\"]\nto = \"b\"\n\
             {times}\n"
        )
    };
    let e = err_of(&t("stop = \"40s\""));
    assert!(
        e.starts_with("line 11,")
            && e.contains("traffic stops at 40s, after the end of the experiment (1s)"),
        "{e}"
    );
    let e = err_of(&t("start = \"2s\""));
    assert!(
        e.contains("traffic starts at 2s, not before it stops at 1s (the end of the experiment)"),
        "{e}"
    );
    let e = err_of(&t("start = \"500ms\"\nstop = \"200ms\""));
    assert!(
        e.contains("starts at 500ms, not before it stops at 200ms (its `stop`)"),
        "{e}"
    );
    assert!(load(&t("stop = \"1s\""), None).is_ok());
}

#[test]
fn a_zero_duration_names_its_line() {
    // It said "line 1, column 1" whatever the line.
    let e = err_of(&HEAD.replace("duration = \"1s\"", "duration = \"0s\""));
    assert!(
        e.starts_with("line 4, column 12:") && e.contains("must be above zero"),
        "{e}"
    );
}

#[test]
fn stacked_dif_maps_cubes_and_derives_adjacency_over_the_lower_dif() {
    let t = format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"up\"\nmembers = [\"*\"]\nover = [\"low\"]\n\
         [[dif.cube]]\nname = \"Gold\"\nmaps_to = {{ low = \"A2\" }}\n[[dif.cube]]\nname = \"A1\"\n\
         [[dif]]\nname = \"low\"\nmembers = [\"*\"]\nover = [\"links\"]\n\
         [[dif.cube]]\nname = \"A1\"\n[[dif.cube]]\nname = \"A2\"\n"
    );
    let e = load(&t, None).unwrap();
    // Declared upper first, resolved lower first.
    assert_eq!(e.difs[0].name, "low");
    let up = &e.difs[1];
    assert_eq!(up.adjacencies.len(), 1);
    assert_eq!(up.adjacencies[0].over, Over::Dif(0));
    assert_eq!(up.cubes[0].maps_to[&0], 2, "Gold rides on A2");
    assert_eq!(
        up.cubes[1].maps_to[&0], 1,
        "A1 rides on the lower A1 by name"
    );
}

#[test]
fn every_shipped_scenario_resolves_in_every_variant() {
    let all = common::every_example();
    assert!(all.len() >= 15, "{}", all.len());
    for (p, v, e) in all {
        assert!(!e.flows.is_empty(), "{} [{v:?}]: no traffic", p.display());
    }
}

#[test]
fn metro_37_is_the_seed_003_network() {
    let e = load(&example("metro-37.toml"), Some("spn-only-90")).unwrap();
    assert_eq!(e.nodes.len(), 37);
    let spn = &e.difs[e.dif("spn").unwrap()];
    let mr = e.dif("mr").unwrap();
    // SPN only: one mr flow per PE pair, every spn cube on A1.
    let on_mr = |e: &rina_lab::Experiment| -> Vec<u64> {
        let spn = &e.difs[e.dif("spn").unwrap()];
        spn.cubes.iter().map(|c| c.maps_to[&mr]).collect()
    };
    assert_eq!(on_mr(&e), [1, 1, 1, 1, 1]);
    assert_eq!(spn.cubes.len(), 5);
    // 75 bidirectional Table I flows and 75 echo probes (one per spn cube
    // and pair); the video streams only in video-90.
    assert_eq!(e.flows.len(), 225);
    let probes: Vec<_> = e
        .flows
        .iter()
        .filter(|f| f.kind == rina_lab::model::TrafficKind::Echo)
        .collect();
    assert_eq!(probes.len(), 75);
    for cube in 1..=5 {
        assert_eq!(
            probes.iter().filter(|f| f.cube == cube).count(),
            15,
            "{cube}"
        );
    }
    assert!(matches!(
        e.difs[mr].scheduler,
        rina_core::rmt::SchedulerConfig::Fifo(_)
    ));
    let base = load(&example("metro-37.toml"), Some("spn-mr-90")).unwrap();
    // Gold and Silver over A1, Sensitive BE over A2, Bronze over B1, BE over B2.
    assert_eq!(on_mr(&base), [1, 1, 2, 3, 4]);
    // The 5 % skip probability at mr only (§III).
    let skip = |e: &rina_lab::Experiment, d: &str| match &e.difs[e.dif(d).unwrap()].scheduler {
        rina_core::rmt::SchedulerConfig::QtaMux(q) => q.skip_probability,
        other => panic!("{d}: {other:?}"),
    };
    assert_eq!((skip(&base, "mr"), skip(&base, "spn")), (0.05, 0.0));
    assert_eq!(base.load.as_ref().unwrap().links.len(), 12);
    let video = load(&example("metro-37.toml"), Some("video-90")).unwrap();
    assert_eq!(video.flows.len(), 228);
    assert_eq!(video.load.as_ref().unwrap().without, ["HD Video Streaming"]);
    // The stack is five levels deep at the clients: link, home, video.
    assert!(e.difs.iter().position(|d| d.name == "video").unwrap() > e.dif("spn").unwrap());
}

#[test]
fn resized_lengthens_traffic_while_shortened_never_does() {
    let e = load(&example("metro-37.toml"), Some("spn-mr-90")).unwrap();
    assert_eq!(e.duration.as_secs(), 60);
    let long = e.clone().resized(std::time::Duration::from_secs(600));
    assert_eq!(long.duration.as_secs(), 600);
    // The flows run for the whole (longer) experiment; the calibration
    // keeps its own 30 s.
    assert!(long.flows.iter().all(|f| f.stop.as_secs() == 600));
    assert_eq!(long.load.as_ref().unwrap().duration.as_secs(), 30);
    let same = e.clone().shortened(std::time::Duration::from_secs(600));
    assert_eq!(same.duration.as_secs(), 60);
    let short = e.resized(std::time::Duration::from_secs(6));
    assert!(short.flows.iter().all(|f| f.stop.as_secs() == 6));
    assert_eq!(short.load.as_ref().unwrap().duration.as_secs(), 6);
}

#[test]
fn dilation_slows_every_time_of_the_traffic_and_keeps_what_it_sends() {
    use rina_tools::tgen::gen::Profile;
    let e = load(&example("metro-37.toml"), Some("spn-mr-90")).unwrap();
    let d = e.clone().dilated(0.05);
    assert_eq!(d.dilation, Some(0.05));
    assert_eq!(d.duration, e.duration * 20);
    assert_eq!(
        d.load.as_ref().unwrap().duration,
        e.load.as_ref().unwrap().duration * 20
    );
    assert_eq!(
        d.warmup, e.warmup,
        "the warm-up is for routing, not traffic"
    );
    for (a, b) in e.links.iter().zip(&d.links) {
        assert!((b.rate_bps / a.rate_bps - 0.05).abs() < 1e-9);
        assert_eq!(b.delay, a.delay * 20);
        assert_eq!(b.queue, a.queue);
    }
    let mut on_off = 0;
    for (a, b) in e.flows.iter().zip(&d.flows) {
        assert_eq!((b.start, b.stop), (a.start * 20, a.stop * 20));
        assert_eq!(b.interval, a.interval * 20);
        let (Some(pa), Some(pb)) = (&a.profile, &b.profile) else {
            continue;
        };
        // The same bytes over the dilated run: the rate times 0.05, the
        // run twenty times as long; SDU sizes unchanged.
        assert!(
            (pb.mean_rate_bps() / pa.mean_rate_bps() - 0.05).abs() < 1e-9,
            "{}",
            a.id
        );
        assert_eq!(pb.max_size(), pa.max_size());
        if let (
            Profile::OnOff { on_s, off_s, .. },
            Profile::OnOff {
                on_s: on2,
                off_s: off2,
                ..
            },
        ) = (pa, pb)
        {
            assert!((on2 / on_s - 20.0).abs() < 1e-9 && (off2 / off_s - 20.0).abs() < 1e-9);
            on_off += 1;
        }
    }
    assert!(
        on_off >= 60,
        "Online Gaming and File Sharing are ON-OFF ({on_off})"
    );
}

/// `rina-echo` sends every whole millisecond: an echo interval that
/// dilation would make fractional (3 ms at 0.4 is 7.5 ms) is rounded, so
/// the simulator does not run 7.5 ms where the real backends run 7.
#[test]
fn dilation_keeps_echo_intervals_whole_milliseconds() {
    let file = format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
         over = [\"links\"]\n[[traffic]]\nkind = \"echo\"\ndif = \"n\"\nfrom = [\"a\"]\nto = \"b\"\n\
         interval = \"3ms\"\n"
    );
    let e = load(&file, None).unwrap();
    let ms =
        |e: &rina_lab::resolve::Experiment| e.flows.iter().map(|f| f.interval).collect::<Vec<_>>();
    assert_eq!(ms(&e), [std::time::Duration::from_millis(3)]);
    assert_eq!(
        ms(&e.clone().dilated(0.4)),
        [std::time::Duration::from_millis(8)]
    );
    assert_eq!(
        ms(&e.clone().dilated(0.7)),
        [std::time::Duration::from_millis(4)]
    );
    assert_eq!(
        ms(&e.dilated(0.01)),
        [std::time::Duration::from_millis(300)]
    );
}

#[test]
fn a_bad_cube_keepalive_names_the_key_and_its_line() {
    let cube = |v: &str| {
        format!(
            "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
             over = [\"links\"]\n[[dif.cube]]\nname = \"c\"\nkeepalive = \"{v}\"\n"
        )
    };
    for (bad, why) in [
        ("0s", "not 0 ms"),
        ("5ms", "not 5 ms"),
        ("2h", "not 7200000 ms"),
        ("abc", "`abc` is not a duration"),
    ] {
        let e = err_of(&cube(bad));
        assert!(
            e.starts_with("line 13,") && e.contains("`keepalive`") && e.contains(why),
            "{bad}: {e}"
        );
    }
    let ok = load(&cube("250ms"), None).unwrap();
    assert_eq!(
        ok.difs[0].cubes[0].keepalive,
        Some(std::time::Duration::from_millis(250))
    );
}

#[test]
fn a_bad_cube_efcp_table_is_refused_naming_the_cube() {
    let cube = |reliable: bool, efcp: &str| {
        format!(
            "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
             over = [\"links\"]\n[[dif.cube]]\nname = \"c\"\nreliable = {reliable}\nefcp = {efcp}\n"
        )
    };
    // Out of range, inconsistent, or tuning what the cube does not have:
    // each was dropped silently, leaving the defaults.
    for (reliable, bad, why) in [
        (true, "{ window = 100000000 }", "window"),
        (true, "{ min_rto_ms = 2000 }", "RTO"),
        (false, "{ min_rto_ms = 5 }", "min_rto_ms would tune nothing"),
    ] {
        let e = err_of(&cube(reliable, bad));
        assert!(
            e.contains("cube `c`") && e.contains("`efcp`") && e.contains(why),
            "{bad}: {e}"
        );
    }
    let ok = load(&cube(true, "{ window = 128 }"), None).unwrap();
    assert_eq!(ok.difs[0].cubes[0].efcp.window, Some(128));
}

// Input from a file panics no tool: the audit of 7 December found these.

/// Two nodes, a link, a DIF `n` over it, then `rest`.
fn net(rest: &str) -> String {
    format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
         over = [\"links\"]\n{rest}"
    )
}

#[test]
fn a_duration_past_a_year_is_refused_naming_key_and_line() {
    // `duration = 1e20` panicked in Duration::from_secs_f64.
    for v in ["1e20", "\"1e20s\"", "31536001"] {
        let e = err_of(&HEAD.replace("\"1s\"", v));
        assert!(
            e.starts_with("line 4,")
                && e.contains("`duration`")
                && e.contains("is longer than a year"),
            "{v}: {e}"
        );
    }
    let e = err_of(&format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\ndelay = \"1e18s\"\n"
    ));
    assert!(
        e.starts_with("line 7,") && e.contains("`delay`: `1e18s` is longer than a year"),
        "{e}"
    );
}

#[test]
fn dilating_or_lengthening_the_longest_times_does_not_panic() {
    use rina_lab::resolve::MIN_DILATION;
    use std::time::Duration;
    let year = Duration::from_secs(365 * 24 * 3600);
    let t = format!("{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\ndelay = \"8760h\"\n");
    let e = load(&t, None).unwrap();
    assert_eq!(e.links[0].delay, year);
    // The slowest dilation `run --dilate` takes: a hundred years.
    assert_eq!(e.clone().dilated(MIN_DILATION).links[0].delay, year * 100);
    // Below it (the command line refuses it), a time saturates: it panicked.
    assert_eq!(e.clone().dilated(1e-30).links[0].delay, Duration::MAX);
    assert_eq!(e.dilated(0.0).links[0].delay, Duration::MAX);
    // A 1 ns experiment lengthened to a year: its 1-year perf steps
    // would be 3e16 years (it panicked); they are cut to a year.
    let t = net(
        "[[traffic]]\nkind = \"perf\"\ndif = \"n\"\npairs = [[\"a\", \"b\"]]\n\
         sdu_sizes = [100]\nper_size = \"8760h\"\n",
    )
    .replace("duration = \"1s\"", "duration = \"1ns\"");
    let long = load(&t, None).unwrap().resized(year);
    assert_eq!(long.flows[0].per_size, year);
    assert_eq!(long.flows[0].stop, year);
}

#[test]
fn a_link_or_variant_rate_outside_what_rinad_takes_is_refused() {
    // Rate 0 in a variant, or 1e-300 bit/s anywhere, panicked the local
    // backend's link emulator (a frame's time on the wire was infinite).
    for (rate, shown) in [
        ("0bps", "not 0bps"),
        ("1e-300bps", "not 1e-300bps"),
        ("999bps", "not 999bps"),
        ("2000Gbps", "not 2000Gbps"),
    ] {
        let e = err_of(&format!(
            "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\nrate = \"{rate}\"\n"
        ));
        assert!(
            e.starts_with("line 5,")
                && e.contains("link `a--b`: `rate` must be between 1kbps and 1000Gbps")
                && e.contains(shown),
            "{rate}: {e}"
        );
    }
    let v = |rate: &str| {
        net(&format!(
            "[[variant]]\nname = \"slow\"\nrate = {{ \"a--b\" = \"{rate}\" }}\n"
        ))
    };
    let e = load(&v("0bps"), Some("slow")).unwrap_err().to_string();
    assert!(
        e.starts_with("line 12,")
            && e.contains(
                "variant `slow`: link `a--b`: `rate` must be between 1kbps and 1000Gbps, not 0bps"
            ),
        "{e}"
    );
    assert_eq!(
        load(&v("1kbps"), Some("slow")).unwrap().links[0].rate_bps,
        1e3
    );
    let l = format!("{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\nrate = \"1000Gbps\"\n");
    assert_eq!(load(&l, None).unwrap().links[0].rate_bps, 1e12);
}

#[test]
fn an_echo_or_profile_size_above_1_mib_is_refused() {
    // The simulator allocated the probe: 1e18 bytes aborted it.
    let echo = |size: &str| {
        net(&format!(
            "[[traffic]]\nkind = \"echo\"\ndif = \"n\"\npairs = [[\"a\", \"b\"]]\nsize = {size}\n"
        ))
    };
    for size in ["1000000000000000000", "1048577"] {
        let e = err_of(&echo(size));
        assert!(
            e.starts_with("line 11,")
                && e.contains("echo `size` must be at most 1 MiB (1048576 bytes)"),
            "{size}: {e}"
        );
    }
    assert_eq!(load(&echo("1048576"), None).unwrap().flows[0].size, 1 << 20);
    let prof =
        |size: &str| format!("{HEAD}[[profile]]\nname = \"p\"\nprofile = \"cbr\"\nsize = {size}\n");
    let e = err_of(&prof("1048577"));
    assert!(
        e.starts_with("line 5,")
            && e.contains("profile `p`: `size` 1048577 is more than 1 MiB (1048576 bytes)"),
        "{e}"
    );
    assert!(load(&prof("1048576"), None).is_ok());
}

#[test]
fn traffic_that_expands_to_too_many_flows_is_refused_naming_its_entry() {
    // 100 times the same profile and pair with count 10000: 1e8 flows,
    // memory until the allocator gave up.
    let profiles = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("[[profile]]\nname = \"{n}\"\nprofile = \"cbr\"\n"))
            .collect::<String>()
    };
    let tgen = |ps: &str, pairs: &str, count: u32| {
        format!(
            "[[traffic]]\nkind = \"tgen\"\ndif = \"n\"\nprofiles = [{ps}]\npairs = [{pairs}]\n\
             count = {count}\n"
        )
    };
    let ab = "[\"a\", \"b\"]";
    let p100 = vec!["\"p\""; 100].join(", ");
    let e = err_of(&net(&(profiles(&["p"]) + &tgen(&p100, ab, 10_000))));
    assert!(
        e.starts_with("line 17,")
            && e.contains("profile `p` is listed twice in this traffic's `profiles`"),
        "{e}"
    );
    let pairs100 = vec![ab; 100].join(", ");
    let e = err_of(&net(&(profiles(&["p"]) + &tgen("\"p\"", &pairs100, 10_000))));
    assert!(
        e.starts_with("line 18,")
            && e.contains("pair [\"a\", \"b\"] is listed twice in this traffic's `pairs`"),
        "{e}"
    );
    // Distinct, but 11 profiles x 1 pair x 10000: above the cap.
    let names: Vec<String> = (0..11).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    let e = err_of(&net(
        &(profiles(&names) + &tgen(&quoted.join(", "), ab, 10_000))
    ));
    assert!(
        e.starts_with("line 44,")
            && e.contains("this [[traffic]] (flows `t0.…`) expands to 110000 flows")
            && e.contains("at most 100000 flows"),
        "{e}"
    );
    // The cap is on the experiment: 6 x 10000 twice is 120000.
    let six = quoted[..6].join(", ");
    let t = net(&(profiles(&names) + &tgen(&six, ab, 10_000) + &tgen(&six, ab, 10_000)));
    let e = err_of(&t);
    assert!(
        e.starts_with("line 50,")
            && e.contains("(flows `t1.…`) expands to 60000 flows")
            && e.contains("with 60000 before it"),
        "{e}"
    );
    let t = net(&(profiles(&names) + &tgen(&six, ab, 10_000)));
    assert_eq!(load(&t, None).unwrap().flows.len(), 60_000);
}

/// `n` DIFs, `d{i}` over `d{i-1}` and `d0` over the links, declared last
/// first.
fn dif_chain(n: usize) -> String {
    let mut t = format!("{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n");
    for i in (0..n).rev() {
        let over = if i == 0 {
            "links".to_string()
        } else {
            format!("d{}", i - 1)
        };
        t += &format!("[[dif]]\nname = \"d{i}\"\nmembers = [\"*\"]\nover = [\"{over}\"]\n");
    }
    t
}

#[test]
fn a_long_chain_of_stacked_difs_resolves_lowest_first() {
    // The dependency order recursed once per DIF: 100,000 DIFs each over
    // the next overflowed the stack (far fewer on a test's thread).
    let n = 50_000;
    let e = load(&dif_chain(n), None).unwrap();
    assert_eq!(e.difs.len(), n);
    assert!(e
        .difs
        .iter()
        .enumerate()
        .all(|(i, d)| d.name == format!("d{i}")));
}

#[test]
fn a_dif_over_itself_is_refused_at_the_dif_the_loop_comes_back_to() {
    let t = format!(
        "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n\
         [[dif]]\nname = \"x\"\nmembers = [\"*\"]\nover = [\"y\"]\n\
         [[dif]]\nname = \"y\"\nmembers = [\"*\"]\nover = [\"links\", \"x\"]\n"
    );
    let e = err_of(&t);
    assert!(
        e.starts_with("line 8,") && e.contains("DIF `x` is (indirectly) over itself"),
        "{e}"
    );
    let e = err_of(&t.replace("[\"links\", \"x\"]", "[\"links\", \"y\"]"));
    assert!(
        e.starts_with("line 12,") && e.contains("DIF `y` is (indirectly) over itself"),
        "{e}"
    );
    let e = err_of(&t.replace("[\"links\", \"x\"]", "[\"links\", \"z\"]"));
    assert!(
        e.starts_with("line 14,") && e.contains("unknown lower DIF `z`"),
        "{e}"
    );
}

#[test]
fn a_dif_over_another_on_a_long_chain_gets_every_pair_in_order() {
    // `n` nodes on a chain, `low` over the links and `up` over `low` with
    // every pair of members adjacent: n(n-1)/2 adjacencies. Each was
    // checked against the ones before by a scan, in time n⁴ (6 s at 400
    // nodes, 112 s at 800); now a set of pairs.
    let n = 300;
    let names: Vec<String> = (0..n).map(|i| format!("\"n{i}\"")).collect();
    let mut t = format!(
        "nodes = [{}]\n[experiment]\nname = \"chain\"\nduration = \"1s\"\n",
        names.join(", ")
    );
    for i in 1..n {
        t += &format!("[[link]]\nbetween = [\"n{}\", \"n{i}\"]\n", i - 1);
    }
    t += "[[dif]]\nname = \"low\"\nmembers = [\"*\"]\nover = [\"links\"]\n\
          [[dif]]\nname = \"up\"\nmembers = [\"*\"]\nover = [\"low\"]\n";
    let e = load(&t, None).unwrap();
    let (low, up) = (&e.difs[0], &e.difs[1]);
    assert_eq!(low.adjacencies.len(), n - 1);
    // The first node of most neighbours bootstraps; the rest follow the chain.
    assert_eq!(low.bootstrap, 1);
    assert_eq!(low.enrollment_order[..4], [1, 0, 2, 3]);
    assert_eq!(low.enrolls_via[&(n - 1)], n - 2);
    assert_eq!(up.adjacencies.len(), n * (n - 1) / 2);
    assert!(up
        .adjacencies
        .iter()
        .all(|x| x.a < x.b && x.over == Over::Dif(0)));
    assert_eq!(up.bootstrap, 0);
    assert_eq!(up.enrollment_order, (0..n).collect::<Vec<_>>());
    assert!((1..n).all(|m| up.enrolls_via[&m] == 0));
}

#[test]
fn an_echo_interval_rina_echo_cannot_send_at_is_refused_naming_the_flow() {
    // Accepted before: "1ns" made the simulator run for days (and not
    // stop when asked), "1500us" ran every 1.5 ms there and every 1 ms on
    // the real backends, which send every whole `--interval-ms`.
    let t = |iv: &str| {
        format!(
            "{HEAD}[[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
             over = [\"links\"]\n[[traffic]]\nkind = \"echo\"\ndif = \"n\"\nfrom = [\"a\"]\nto = \"b\"\n\
             interval = \"{iv}\"\n"
        )
    };
    for (iv, shown) in [
        ("1ns", "1ns"),
        ("1500us", "1.5ms"),
        ("999us", "999µs"),
        ("0s", "0ns"),
    ] {
        let e = err_of(&t(iv));
        assert!(
            e.starts_with("line 11,")
                && e.contains(&format!("echo traffic `t0.echo`: `interval` {shown} is not a whole number of milliseconds from 1 ms up"))
                && e.contains("\"1ms\""),
            "{iv}: {e}"
        );
    }
    for (iv, ms) in [("1ms", 1), ("1000us", 1), ("2.5s", 2500)] {
        let e = load(&t(iv), None).unwrap();
        assert_eq!(e.flows[0].interval, Duration::from_millis(ms), "{iv}");
    }
}

#[test]
fn a_cube_loss_or_bandwidth_out_of_range_is_refused_naming_dif_cube_and_value() {
    // All passed before: -0.5 and nan became a bound of 0 ppm (no loss,
    // which meets any flow's bound), 7.0 7 000 000 ppm, inf u32::MAX ppm,
    // 1e300G u64::MAX bit/s.
    let cube = |kv: &str| net(&format!("[[dif.cube]]\nname = \"c\"\n{kv}\n"));
    for (kv, said) in [
        ("loss = -0.5", "`loss` -0.5 is not a probability in [0, 1]"),
        ("loss = nan", "`loss` NaN is not a probability in [0, 1]"),
        ("loss = 7.0", "`loss` 7 is not a probability in [0, 1]"),
        ("loss = inf", "`loss` inf is not a probability in [0, 1]"),
        (
            "bandwidth = \"1e300G\"",
            "`bandwidth` must be between 1kbps and 1000Gbps, not a rate past any number (inf)",
        ),
        (
            "bandwidth = \"1e5G\"",
            "`bandwidth` must be between 1kbps and 1000Gbps, not 100000Gbps",
        ),
        (
            "bandwidth = \"10bps\"",
            "`bandwidth` must be between 1kbps and 1000Gbps, not 10bps",
        ),
    ] {
        let e = err_of(&cube(kv));
        assert!(
            e.starts_with("line 12,") && e.contains(&format!("DIF `n`: cube `c`: {said}")),
            "{kv}: {e}"
        );
    }
    for (kv, loss, bw) in [
        ("loss = 0.0", Some(0.0), None),
        ("loss = 1.0", Some(1.0), None),
        ("loss = 0.01\nbandwidth = \"1000G\"", Some(0.01), Some(1e12)),
        ("bandwidth = \"1kbps\"", None, Some(1e3)),
    ] {
        let e = load(&cube(kv), None).unwrap();
        let c = &e.difs[0].cubes[0];
        assert_eq!((c.loss, c.bandwidth_bps), (loss, bw), "{kv}");
    }
}
