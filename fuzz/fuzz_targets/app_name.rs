//! Application-name parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rina_wire::name::{AppName, MAX_NAME_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(n) = s.parse::<AppName>() else {
        return;
    };
    // Invariants: a valid name has a process name, its written form is no
    // longer than the input and at most MAX_NAME_LEN, and it parses back to
    // the same name.
    assert!(!n.process_name.is_empty());
    let w = n.to_string();
    assert!(w.len() <= s.len() && w.len() <= MAX_NAME_LEN);
    assert_eq!(w.parse::<AppName>().expect("a written name parses"), n);
});
