//! Body of the `rinad_config` fuzz target (`fuzz/`, cargo-fuzz, nightly):
//! arbitrary bytes as the daemon's configuration file and as one
//! `[[ipcp]]` table given at run time (`rinactl ipcp create`). It lives
//! here, on stable, so the crate's tests run it (proptest) and it never
//! rots.

use crate::config::{Config, ConfigError};
use std::path::Path;

/// Parses `data` as a configuration file and as a run-time IPCP table (next
/// to the IPCPs the file declares, when it parses).
/// Invariants: no panic; a refusal names a line of the text, a key and a
/// reason; an accepted file has IPCPs with distinct, non-empty names.
pub fn config_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.lines().count() + 1;
    let check = |e: &ConfigError| match e {
        ConfigError::Read { .. } | ConfigError::Refused { .. } => {
            panic!("text was parsed, nothing read: {e}")
        }
        ConfigError::Syntax { message, .. } => assert!(!message.is_empty(), "{e}"),
        ConfigError::Invalid {
            line, key, message, ..
        } => {
            assert!((1..=lines).contains(line), "line {line} of {lines}: {e}");
            assert!(!key.is_empty() && !message.is_empty(), "{e}");
        }
    };
    let running = match Config::parse(Path::new("fuzz.toml"), text) {
        Ok(cfg) => {
            let mut names = std::collections::HashSet::new();
            for ip in &cfg.ipcps {
                let name = ip.name.get_ref();
                assert!(!name.is_empty(), "an IPCP without a name was accepted");
                assert!(names.insert(name.clone()), "two IPCPs named {name:?}");
            }
            cfg.ipcps
        }
        Err(e) => {
            check(&e);
            Vec::new()
        }
    };
    match Config::parse_ipcp("ipcp create", text, &running) {
        Ok(ip) => {
            let name = ip.name.get_ref();
            assert!(
                !name.is_empty(),
                "a run-time IPCP without a name was accepted"
            );
            assert!(
                running.iter().all(|o| o.name.get_ref() != name),
                "a run-time IPCP named like a running one was accepted"
            );
        }
        Err(e) => check(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Files that parse, to mutate: the repository's examples and every
    /// table and key of the module's documented example, uncommented.
    const SEEDS: [&str; 3] = [
        include_str!("../../../examples/stack-2/a.toml"),
        include_str!("../../../examples/enroll-3/b.toml"),
        include_str!("../../../fuzz/seeds/rinad_config/every-key.toml"),
    ];

    #[test]
    fn the_seeds_parse() {
        for s in SEEDS {
            if let Err(e) = Config::parse(Path::new("seed.toml"), s) {
                panic!("{e}\n{s}");
            }
            config_text(s.as_bytes());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// A seed with bytes replaced, inserted or removed.
        #[test]
        fn edited_files_keep_the_invariants(
            seed in 0..SEEDS.len(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..8),
        ) {
            let mut b = SEEDS[seed].as_bytes().to_vec();
            for (at, kind, byte) in edits {
                let i = at.index(b.len() + 1);
                match kind {
                    0 if i < b.len() => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ if i < b.len() => { b.remove(i); }
                    _ => {}
                }
            }
            config_text(&b);
        }

        #[test]
        fn any_bytes_keep_the_invariants(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            config_text(&b);
        }
    }
}
