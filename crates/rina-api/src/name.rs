//! Application names as the C API writes them.
//!
//! rlite separates the four parts with `|` (`name|instance|entity|instance`,
//! trailing separators optional). This project's own syntax uses `/`; a
//! string without `|` is read that way, so both spellings work.

use rina_wire::AppName;

/// Parses a name in rlite's syntax, or in this project's if it holds no `|`.
pub fn parse(s: &str) -> Result<AppName, String> {
    if !s.contains('|') {
        return s
            .parse()
            .map_err(|e| format!("bad application name {s:?}: {e}"));
    }
    let parts: Vec<&str> = s.split('|').collect();
    if parts.len() > 4 {
        return Err(format!(
            "bad application name {s:?}: at most four |-separated parts"
        ));
    }
    if parts.iter().any(|p| p.contains('/')) {
        return Err(format!(
            "bad application name {s:?}: a part may not contain '/'"
        ));
    }
    // Rebuilt in the project's syntax so the usual checks apply.
    parts
        .join("/")
        .parse()
        .map_err(|e| format!("bad application name {s:?}: {e}"))
}

/// Writes a name in rlite's syntax, without empty trailing parts.
pub fn format(n: &AppName) -> String {
    let parts = [
        n.process_name.as_str(),
        n.process_instance.as_str(),
        n.entity_name.as_str(),
        n.entity_instance.as_str(),
    ];
    let last = parts.iter().rposition(|p| !p.is_empty()).unwrap_or(0);
    parts[..=last].join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_syntaxes_parse_to_the_same_name() {
        let a = parse("echo|1|data|7").unwrap();
        let b = parse("echo/1/data/7").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.entity_name, "data");
        assert_eq!(parse("echo|1||").unwrap(), parse("echo/1").unwrap());
        assert_eq!(
            parse("rina-echo-async:client").unwrap().process_name,
            "rina-echo-async:client"
        );
    }

    #[test]
    fn bad_names_are_refused() {
        assert!(parse("").is_err());
        assert!(parse("|x").is_err());
        assert!(parse("a|b|c|d|e").is_err());
        assert!(parse("a|b/c").is_err());
        assert!(parse("a b").is_err());
    }

    #[test]
    fn format_uses_pipes_and_drops_empty_tails() {
        assert_eq!(format(&parse("echo//data").unwrap()), "echo||data");
        assert_eq!(format(&parse("echo|1||").unwrap()), "echo|1");
        assert_eq!(format(&parse("echo").unwrap()), "echo");
    }
}
