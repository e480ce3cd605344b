//! Access control in a DIF: which application names may register at its
//! IPCPs and which may allocate flows to which.
//!
//! The rules are the DIF's policy, configured alike at every member (the
//! rinad TOML's `[ipcp.access]`). A member checks them where it decides:
//! at registration of a local name, when a local application asks for a
//! flow (refused at once, nothing goes on the wire), and when a request
//! arrives for a name registered here (refused with the reason in the
//! `M_CREATE_R`, so the requesting application learns why even when the
//! requester's own member has other rules). No rules (the default): all is
//! allowed.
//!
//! A pattern matches an application's process name: `*` matches any name,
//! `prefix*` any name that starts with `prefix`, anything else exactly
//! that name.

use rina_wire::AppName;

/// A pattern over application process names (see the module's doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern(String);

/// Why a pattern is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// An empty pattern (use `*` for any name).
    #[error("an empty name pattern (use \"*\" for any name)")]
    Empty,
    /// A `*` elsewhere than at the end.
    #[error("name pattern {0:?} has a '*' before its end (only a trailing '*' is a wildcard)")]
    InnerWildcard(String),
}

impl NamePattern {
    /// Parses a pattern: a process name, `prefix*` or `*`.
    pub fn new(s: &str) -> Result<NamePattern, PatternError> {
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        if s.strip_suffix('*').unwrap_or(s).contains('*') {
            return Err(PatternError::InnerWildcard(s.to_string()));
        }
        Ok(NamePattern(s.to_string()))
    }

    /// Whether `name`'s process name matches.
    pub fn matches(&self, name: &AppName) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => name.process_name.starts_with(prefix),
            None => name.process_name == self.0,
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Applications matching `from` may allocate flows to applications
/// matching `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRule {
    /// Who asks.
    pub from: NamePattern,
    /// To whom.
    pub to: NamePattern,
}

/// The access rules of a DIF.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRules {
    /// Names that may register; `None`: any.
    pub register: Option<Vec<NamePattern>>,
    /// Allowed (from, to) pairs of flows; `None`: any.
    pub allocate: Option<Vec<FlowRule>>,
}

impl AccessRules {
    /// `Err(reason)` if `name` may not register in DIF `dif`.
    pub fn check_register(&self, dif: &str, name: &AppName) -> Result<(), String> {
        match &self.register {
            Some(allowed) if !allowed.iter().any(|p| p.matches(name)) => Err(format!(
                "DIF {dif}'s access rules do not let {} register (allowed: {})",
                name.process_name,
                list(allowed.iter().map(NamePattern::as_str))
            )),
            _ => Ok(()),
        }
    }

    /// `Err(reason)` if `from` may not allocate a flow to `to` in DIF
    /// `dif`.
    pub fn check_allocate(&self, dif: &str, from: &AppName, to: &AppName) -> Result<(), String> {
        match &self.allocate {
            Some(rules)
                if !rules
                    .iter()
                    .any(|r| r.from.matches(from) && r.to.matches(to)) =>
            {
                Err(format!(
                    "DIF {dif}'s access rules do not let {} allocate flows to {}",
                    from.process_name, to.process_name
                ))
            }
            _ => Ok(()),
        }
    }
}

fn list<'a>(it: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = it.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> AppName {
        AppName::new(s).unwrap()
    }

    fn p(s: &str) -> NamePattern {
        NamePattern::new(s).unwrap()
    }

    #[test]
    fn patterns_match_exactly_by_prefix_or_anything() {
        assert!(p("echo").matches(&n("echo")));
        assert!(!p("echo").matches(&n("echo2")));
        assert!(p("perf*").matches(&n("perf-server")));
        assert!(p("perf*").matches(&n("perf")));
        assert!(!p("perf*").matches(&n("iperf")));
        assert!(p("*").matches(&n("anything")));
        assert_eq!(NamePattern::new(""), Err(PatternError::Empty));
        assert!(matches!(
            NamePattern::new("a*b"),
            Err(PatternError::InnerWildcard(_))
        ));
        // Names end in characters of more than one byte too.
        assert!(p("café").matches(&n("café")));
        assert!(p("caf\u{e9}*").matches(&n("café-2")));
        assert!(matches!(
            NamePattern::new("*é"),
            Err(PatternError::InnerWildcard(_))
        ));
    }

    #[test]
    fn no_rules_allow_everything_and_rules_name_the_refusal() {
        let open = AccessRules::default();
        assert!(open.check_register("net", &n("x")).is_ok());
        assert!(open.check_allocate("net", &n("x"), &n("y")).is_ok());
        let rules = AccessRules {
            register: Some(vec![p("echo"), p("perf*")]),
            allocate: Some(vec![FlowRule {
                from: p("client*"),
                to: p("echo"),
            }]),
        };
        assert!(rules.check_register("net", &n("perf-1")).is_ok());
        let e = rules.check_register("net", &n("rogue")).unwrap_err();
        assert!(
            e.contains("net") && e.contains("rogue") && e.contains("echo, perf*"),
            "{e}"
        );
        assert!(rules
            .check_allocate("net", &n("client-a"), &n("echo"))
            .is_ok());
        let e = rules
            .check_allocate("net", &n("client-a"), &n("perf-1"))
            .unwrap_err();
        assert!(e.contains("client-a") && e.contains("perf-1"), "{e}");
        let none = AccessRules {
            register: Some(vec![]),
            allocate: None,
        };
        assert!(none
            .check_register("net", &n("x"))
            .unwrap_err()
            .contains("allowed: none"));
    }
}
