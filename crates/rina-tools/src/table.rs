//! Aligned text tables, and the tables `rinactl` and `rina-demo` print.

use rina::{DifInfo, FlowStats, IpcpInfo, NameInfo};
use std::fmt::Write;

/// A table of text cells printed with aligned columns.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    /// A table with these column titles, all left-aligned (see [`Table::numeric`]).
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            right: vec![false; header.len()],
        }
    }

    /// Right-aligns the columns at these indices (numbers).
    pub fn numeric(mut self, cols: &[usize]) -> Table {
        for &c in cols {
            if let Some(r) = self.right.get_mut(c) {
                *r = true;
            }
        }
        self
    }

    /// Appends a row; missing cells are empty, extra ones are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True if there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Renders the table; every line ends with a newline.
    pub fn render(&self) -> String {
        let mut w: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.header).chain(&self.rows) {
            let mut s = String::new();
            for (i, c) in line.iter().enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = w[i] - c.chars().count();
                if self.right[i] {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if i + 1 < line.len() {
                        s.push_str(&" ".repeat(pad));
                    }
                }
            }
            let _ = writeln!(out, "{}", s.trim_end());
        }
        out
    }
}

/// The IPCP table: name, kind, DIF, address, flows, names (those the
/// daemon listed, and how many more `rinactl names` shows), counters.
pub fn ipcps(list: &[IpcpInfo]) -> Table {
    let mut t = Table::new(&[
        "NAME", "KIND", "DIF", "ADDRESS", "FLOWS", "NAMES", "COUNTERS",
    ])
    .numeric(&[4]);
    for i in list {
        let names: Vec<String> = i.names.iter().map(|n| n.to_string()).collect();
        let mut names = names.join(",");
        match i.names_more {
            0 => {}
            more if names.is_empty() => names = format!("{more} names; see rinactl names"),
            more => names += &format!(" and {more} more; see rinactl names"),
        }
        let counters: Vec<String> = i.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
        t.row(vec![
            i.name.clone(),
            i.kind.clone(),
            i.dif.clone(),
            i.address.clone(),
            i.flows.to_string(),
            dash(names),
            dash(counters.join(" ")),
        ]);
    }
    t
}

/// The DIF table: name, kind, IPCPs.
pub fn difs(list: &[DifInfo]) -> Table {
    let mut t = Table::new(&["NAME", "KIND", "IPCPS"]);
    for d in list {
        t.row(vec![
            d.name.clone(),
            d.kind.clone(),
            dash(d.ipcps.join(",")),
        ]);
    }
    t
}

/// The registered-name table: name, DIF, IPCP, and whether the daemon
/// accepts the name's flow requests itself (a registration with `accept`).
pub fn names(list: &[NameInfo]) -> Table {
    let mut t = Table::new(&["NAME", "DIF", "IPCP", "DAEMON_ACCEPTS"]);
    for n in list {
        let accepts = if n.accepts { "yes" } else { "no" };
        t.row(vec![
            n.name.to_string(),
            n.dif.clone(),
            n.ipcp.clone(),
            accepts.into(),
        ]);
    }
    t
}

/// The flow table: port, DIF, IPCP, names, max SDU and counters (`-` for
/// a direct flow, whose SDUs the daemon does not see, and for a flow its
/// peer ended, whose counters went with it; the remote name of such a
/// flow says how many SDUs its application has still to read, and the
/// local name of a flow in a bundle, which).
pub fn flows(list: &[FlowStats]) -> Table {
    let mut t = Table::new(&[
        "PORT",
        "DIF",
        "IPCP",
        "LOCAL",
        "REMOTE",
        "MAX_SDU",
        "SDUS_IN",
        "BYTES_IN",
        "SDUS_OUT",
        "BYTES_OUT",
        "DROPS_IN",
        "DROPS_OUT",
    ])
    .numeric(&[0, 5, 6, 7, 8, 9, 10, 11]);
    for f in list {
        let c = &f.counters;
        let mut row = vec![
            f.info.port.to_string(),
            f.info.dif.clone(),
            f.ipcp.clone(),
            match f.info.bundle {
                Some(b) => format!("{} (bundle {b})", f.info.local),
                None => f.info.local.to_string(),
            },
            match f.held_after_end {
                Some(n) => format!("{} (ended, {n} SDUs to read)", f.info.remote),
                None => f.info.remote.to_string(),
            },
            f.info.max_sdu.to_string(),
        ];
        let counts = [
            c.sdus_in,
            c.bytes_in,
            c.sdus_out,
            c.bytes_out,
            c.drops_in,
            c.drops_out,
        ];
        let unseen = f.info.direct || f.held_after_end.is_some();
        row.extend(counts.iter().map(|n| match unseen {
            true => "-".to_string(),
            false => n.to_string(),
        }));
        t.row(row);
    }
    t
}

/// The scheduler table of `rinactl sched`: one row per queue of every N-1
/// port (IPCP, policy, port, neighbour, queue and its counters).
pub fn sched(list: &[rina::SchedulerInfo]) -> Table {
    let mut t = Table::new(&[
        "IPCP", "POLICY", "PORT", "NEIGHBOR", "QUEUE", "QUEUED", "SENT", "DROPPED", "MAX_OCC",
    ])
    .numeric(&[2, 5, 6, 7, 8]);
    for s in list {
        if s.ports.is_empty() {
            t.row(vec![s.ipcp.clone(), s.policy.clone(), "-".into()]);
        }
        for p in &s.ports {
            for q in &p.queues {
                t.row(vec![
                    s.ipcp.clone(),
                    s.policy.clone(),
                    p.port.to_string(),
                    dash(p.neighbor.clone().unwrap_or_default()),
                    q.queue.clone(),
                    q.queued.to_string(),
                    q.sent.to_string(),
                    q.dropped.to_string(),
                    q.max_occupancy.to_string(),
                ]);
            }
        }
    }
    t
}

fn dash(s: String) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

/// The RIB table: name, class, instance, value, owner.
pub fn rib(list: &[rina::RibObjectInfo]) -> Table {
    let mut t = Table::new(&["NAME", "CLASS", "INSTANCE", "VALUE", "OWNER"]).numeric(&[2]);
    for o in list {
        t.row(vec![
            o.name.clone(),
            o.class.clone(),
            o.instance.to_string(),
            dash(o.value.clone()),
            o.owner.clone(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let mut t = Table::new(&["A", "NUM", "C"]).numeric(&[1]);
        t.row(vec!["long-name".into(), "5".into(), "x".into()]);
        t.row(vec!["b".into(), "12345".into()]);
        assert_eq!(
            t.render(),
            "A            NUM  C\nlong-name      5  x\nb          12345\n"
        );
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn ipcp_table_lists_counters() {
        let i = IpcpInfo {
            name: "a.udp".into(),
            kind: "shim-udp".into(),
            dif: "udp.net".into(),
            address: "127.0.0.1:7001".into(),
            flows: 2,
            names: vec!["echo".parse().expect("name")],
            names_more: 0,
            counters: [("rx".to_string(), 3u64), ("tx".to_string(), 4)].into(),
        };
        let s = ipcps(std::slice::from_ref(&i)).render();
        assert!(s.contains("rx=3 tx=4"), "{s}");
        assert!(s.contains("echo"), "{s}");
        assert!(!s.contains("more"), "{s}");
        // Names the listing leaves out are counted, not hidden.
        let s = ipcps(&[IpcpInfo {
            names_more: 1234,
            ..i
        }])
        .render();
        assert!(s.contains("echo and 1234 more; see rinactl names"), "{s}");
    }

    #[test]
    fn name_table_says_whether_the_daemon_accepts() {
        let n = |name: &str, accepts| NameInfo {
            name: name.parse().expect("name"),
            dif: "net".into(),
            ipcp: "a.net".into(),
            accepts,
        };
        let s = names(&[n("srv", true), n("echo", false)]).render();
        let rows: Vec<Vec<&str>> = s.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[0], ["NAME", "DIF", "IPCP", "DAEMON_ACCEPTS"], "{s}");
        assert_eq!(rows[1], ["srv", "net", "a.net", "yes"], "{s}");
        assert_eq!(rows[2], ["echo", "net", "a.net", "no"], "{s}");
    }

    #[test]
    fn flow_table_shows_a_flow_its_peer_ended_with_what_is_left_to_read() {
        let f = |port, held_after_end| FlowStats {
            info: rina::FlowInfo {
                port,
                dif: "net".into(),
                local: "a".parse().expect("name"),
                remote: "b".parse().expect("name"),
                qos: Default::default(),
                max_sdu: 1400,
                direct: false,
                bundle: (port == 3).then_some(9),
            },
            ipcp: "a.net".into(),
            counters: rina::FlowCounters {
                sdus_in: 7,
                ..Default::default()
            },
            held_after_end,
        };
        let s = flows(&[f(1, None), f(2, Some(42)), f(3, None)]).render();
        let rows: Vec<&str> = s.lines().collect();
        let open: Vec<&str> = rows[1].split_whitespace().collect();
        assert_eq!(open[4..7], ["b", "1400", "7"], "{s}");
        assert!(rows[2].contains("b (ended, 42 SDUs to read)"), "{s}");
        assert!(!rows[2].contains(" 7 "), "counters of an ended flow: {s}");
        assert!(rows[2].trim_end().ends_with('-'), "{s}");
        assert!(rows[3].contains("a (bundle 9)"), "{s}");
        assert!(!rows[1].contains("bundle"), "{s}");
    }
}
